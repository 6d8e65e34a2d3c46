// `fencegate serve`'s flags and FENCEGATE_* environment, over the config file's values
// (load_serve), and the warnings for FENCEGATE_* names no setting reads.
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include <unistd.h>  // environ

#include "common/flags.h"
#include "config/config.h"
#include "config/fields.h"

namespace fencegate::config {

using namespace detail;

namespace {

const char* process_env(const char* name) { return std::getenv(name); }

// Every flag `fencegate serve` takes, by canonical name ("--threads").
std::set<std::string> serve_flags() {
  std::set<std::string> known = {"--config",         "--upstream",           "--resource",          "--mode",
                                 "--authority-etcd", "--authority-election", "--authority-grace-ms"};
  // TLS to the upstream (issue 27): the flag-only route's https:// settings.
  for (const char* f :
       {"--upstream-ca", "--upstream-cert", "--upstream-key", "--upstream-server-name", "--upstream-verify"})
    known.insert(f);
  for (const NumField& f : kNumFields) known.insert(flag_of(f.key));
  for (const StrField& f : kStrFields) known.insert(flag_of(f.key));
  for (const SectionField& f : kSectionFields) known.insert(flag_of(f.key));
  return known;
}

// Every FENCEGATE_* variable `fencegate serve` reads: one per flag ("--admin-listen" ->
// FENCEGATE_ADMIN_LISTEN, as env_of spells a key's).
std::set<std::string> serve_env_names() {
  std::set<std::string> out;
  for (const std::string& flag : serve_flags()) {
    std::string key = flag.substr(2);
    std::replace(key.begin(), key.end(), '-', '_');
    out.insert(env_of(key));
  }
  return out;
}

// Levenshtein distance, giving up (returning limit + 1) once it must exceed `limit`.
std::size_t edit_distance(std::string_view a, std::string_view b, std::size_t limit) {
  if ((a.size() > b.size() ? a.size() - b.size() : b.size() - a.size()) > limit) return limit + 1;
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    std::size_t row_min = cur[0];
    for (std::size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      row_min = std::min(row_min, cur[j]);
    }
    if (row_min > limit) return limit + 1;
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

std::vector<std::string> unknown_env_warnings(const std::vector<std::string>& present) {
  static const std::set<std::string> known = serve_env_names();
  std::vector<std::string> out;
  for (const std::string& name : present) {
    if (name.rfind("FENCEGATE_", 0) != 0 || known.contains(name)) continue;
    std::string w = name + ": unknown environment variable, ignored";
    std::string best;
    std::size_t best_d = 3;
    for (const std::string& k : known) {
      const std::size_t d = edit_distance(name, k, 2);
      if (d < best_d) {
        best_d = d;
        best = k;
      }
    }
    if (!best.empty()) w += " (did you mean " + best + "?)";
    out.push_back(std::move(w));
  }
  return out;
}

LoadResult load_serve(const std::vector<std::string>& args, EnvLookup env) {
  std::vector<std::string> warnings;
  if (env == nullptr) {
    env = process_env;
    std::vector<std::string> present;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
      std::string_view kv(*e);
      if (kv.rfind("FENCEGATE_", 0) == 0) present.emplace_back(kv.substr(0, kv.find('=')));
    }
    warnings = unknown_env_warnings(present);
  }
  std::vector<std::string> errors;

  // 1. Flags, by canonical name ("--threads" -> "10"); the last occurrence wins. A value that
  // starts with "--" is taken for the next flag ("--db --threads 2": --db has no value).
  const std::set<std::string> known = serve_flags();
  std::vector<flags::Flag> known_flags;
  known_flags.reserve(known.size());
  for (const std::string& name : known) known_flags.push_back({name});
  flags::Rules rules;
  rules.value_may_start_with_dashes = false;
  std::map<std::string, std::string> flag_values;
  for (const flags::Item& item : flags::parse(args, known_flags, rules).items) {
    switch (item.kind) {
      case flags::Kind::help: {
        LoadResult r;
        r.help = true;
        return r;
      }
      case flags::Kind::not_a_flag:
        if (item.arg == "--") {  // a lone "--" reads as a flag with no name
          errors.push_back("--: unknown flag (see --help)");
        } else {
          errors.push_back("unexpected argument " + quote(item.arg) + " (flags look like --name value)");
        }
        break;
      case flags::Kind::unknown_flag:
      case flags::Kind::value_on_boolean:  // serve has no boolean flags
        errors.push_back(item.name + ": unknown flag (see --help)");
        break;
      case flags::Kind::missing_value: errors.push_back(item.name + ": missing value"); break;
      case flags::Kind::flag:
        if (item.inline_value && item.value.empty()) {
          errors.push_back(item.name + ": missing value");  // "--db=" (while "--db ''" is a value)
        } else {
          flag_values[item.name] = item.value;
        }
        break;
    }
  }

  // 2. Sources for one setting: the flag if given, else the environment variable if non-empty.
  struct Given {
    std::string source;  // "--threads" or "FENCEGATE_THREADS"
    std::string value;
  };
  auto env_value = [&](std::string_view key) -> std::optional<Given> {
    std::string var = env_of(key);
    const char* v = env(var.c_str());
    if (v == nullptr || *v == '\0') return std::nullopt;
    return Given{var, v};
  };
  auto flag_value = [&](std::string_view key) -> std::optional<Given> {
    std::string flag = flag_of(key);
    auto it = flag_values.find(flag);
    if (it == flag_values.end()) return std::nullopt;
    return Given{flag, it->second};
  };
  auto chosen = [&](std::string_view key) {
    auto f = flag_value(key);
    return f ? f : env_value(key);
  };

  // 3. The file, if any.
  Config c;
  c.args = args;
  auto config_file = chosen("config");
  bool parsed = true;
  if (config_file) {
    c.config_file = config_file->value;
    std::string text;
    if (config_file->value.empty()) {
      errors.push_back(config_file->source + ": must name a config file (got \"\")");
      parsed = false;
    } else if (std::string err = read_file(config_file->value, text); !err.empty()) {
      errors.push_back(config_file->value + ": cannot read (" + err + ")");
      parsed = false;
    } else {
      parsed = parse_json_into(c, text, config_file->value, errors);
    }
  }

  // 4. Environment, then flags, over the file's values. Each error names where the value came from.
  std::map<std::string, Given> applied;  // section field -> the env/flag whose value it holds
  for (int pass = 0; pass < 2; ++pass) {
    auto get = [&](std::string_view key) { return pass == 0 ? env_value(key) : flag_value(key); };
    for (const NumField& f : kNumFields) {
      if (auto g = get(f.key)) {
        if (auto e = set_num_text(c, f, g->value); !e.empty()) errors.push_back(g->source + ": " + e);
      }
    }
    for (const StrField& f : kStrFields) {
      if (auto g = get(f.key)) {
        if (auto e = f.set(c, g->value); !e.empty()) errors.push_back(g->source + ": " + e);
      }
    }
    for (const SectionField& f : kSectionFields) {
      if (auto g = get(f.key)) {
        if (auto e = f.set(c, g->value); !e.empty()) {
          errors.push_back(g->source + ": " + e);
        } else {
          applied[f.key] = *g;
        }
      }
    }
  }

  // 5. Routes: from the file, or the single catch-all route of the flag-only form.
  auto upstream = chosen("upstream");
  auto mode = chosen("mode");
  auto resource = chosen("resource");
  auto auth_etcd = chosen("authority_etcd");
  auto auth_election = chosen("authority_election");
  auto auth_grace = chosen("authority_grace_ms");
  // TLS to the upstream (issue 27): the flag-only route's upstream_* settings.
  const std::pair<const char*, std::string Route::*> up_tls_keys[] = {{"upstream_ca", &Route::upstream_ca},
                                                                      {"upstream_cert", &Route::upstream_cert},
                                                                      {"upstream_key", &Route::upstream_key},
                                                                      {"upstream_server_name",
                                                                       &Route::upstream_server_name}};
  std::map<std::string, Given> up_tls;  // "upstream_ca" -> its flag or variable
  for (const auto& [key, _] : up_tls_keys)
    if (auto g = chosen(key)) up_tls[key] = *g;
  if (auto g = chosen("upstream_verify")) up_tls["upstream_verify"] = *g;
  if (config_file) {
    for (const auto& [key, g] : up_tls)
      errors.push_back(g.source + ": cannot be combined with " + config_file->source +
                       " (each route in the config file sets its own " + key + ")");
    if (upstream) {
      errors.push_back(upstream->source + ": cannot be combined with " + config_file->source +
                       " (routes, and their upstreams, come from the config file)");
    }
    for (const auto& g : {mode, resource}) {
      if (g) {
        errors.push_back(g->source + ": cannot be combined with " + config_file->source +
                         " (each route in the config file sets its own mode and resource)");
      }
    }
    for (const auto& g : {auth_etcd, auth_election, auth_grace}) {
      if (g) {
        errors.push_back(g->source + ": cannot be combined with " + config_file->source +
                         " (each route in the config file sets its own \"authority\")");
      }
    }
  } else if (!upstream) {
    errors.push_back("no upstream: give --upstream URL or --config FILE");
    parsed = false;  // nothing to route to; validation would only repeat that
  } else {
    Route r;
    r.prefix = "/";
    r.upstream = upstream->value;
    if (resource) r.resource = resource->value;
    if (mode) {
      if (auto m = parse_mode(mode->value)) {
        r.mode = *m;
      } else {
        errors.push_back(mode->source + ": " + mode_error(mode->value));
      }
    }
    if (auth_etcd || auth_election || auth_grace) {
      if (!auth_etcd) {
        errors.push_back((auth_election ? auth_election : auth_grace)->source + ": needs " + flag_of("authority_etcd") +
                         " too (or " + env_of("authority_etcd") + ")");
      } else if (!auth_election) {
        errors.push_back(auth_etcd->source + ": needs " + flag_of("authority_election") + " too (or " +
                         env_of("authority_election") + ")");
      } else {
        Authority a;
        std::string_view csv = auth_etcd->value;
        while (true) {
          std::size_t comma = csv.find(',');
          std::string_view one = csv.substr(0, comma);
          while (!one.empty() && one.front() == ' ') one.remove_prefix(1);
          while (!one.empty() && one.back() == ' ') one.remove_suffix(1);
          if (!one.empty()) a.etcd.emplace_back(one);
          if (comma == std::string_view::npos) break;
          csv.remove_prefix(comma + 1);
        }
        a.election = auth_election->value;
        if (auth_grace) {
          std::int64_t v = -1;
          const std::string& t = auth_grace->value;
          auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
          if (t.empty() || ec != std::errc() || ptr != t.data() + t.size() || v < 0 || v > kMaxMs) {
            errors.push_back(auth_grace->source + ": " + grace_error(quote(t)));
          } else {
            a.grace = std::chrono::milliseconds(v);
          }
        }
        r.authority = std::move(a);
      }
    }
    for (const auto& [key, member] : up_tls_keys)  // TLS to the upstream (issue 27)
      if (auto it = up_tls.find(key); it != up_tls.end()) r.*member = it->second.value;
    if (auto it = up_tls.find("upstream_verify"); it != up_tls.end()) {
      const std::string& v = it->second.value;
      if (v == "true" || v == "false") r.upstream_verify = v == "true";
      else errors.push_back(it->second.source + ": must be true or false (got " + quote(v) + ")");
    }
    c.routes.push_back(std::move(r));
  }

  if (parsed) {
    std::size_t before = errors.size();
    validate(c, errors);
    // validate() names admin.* fields by their JSON path; name the flag or variable that set them.
    for (std::size_t i = before; i < errors.size(); ++i) {
      for (const auto& [key, given] : applied) {
        std::string prefix = key + ": ";
        if (errors[i].rfind(prefix, 0) != 0) continue;
        std::string rest = errors[i].substr(prefix.size());
        if (key == "admin.listen") {
          // "... requires admin.token_file": suggest the same kind of setting as was used.
          const std::string tf = "admin.token_file";
          std::string how = given.source.rfind("--", 0) == 0 ? flag_of(tf) : env_of(tf);
          if (auto p = rest.rfind(tf); p != std::string::npos && p + tf.size() == rest.size()) {
            rest = rest.substr(0, p) + how;
          }
        }
        errors[i] = given.source + ": " + rest;
      }
    }
    if (!config_file) {
      // The flag-only route's fields came from a flag or env variable: name that, not routes[0].
      for (std::size_t i = before; i < errors.size(); ++i) {
        for (const auto& [field, given] :
             {std::pair{"routes[0].upstream: ", upstream}, std::pair{"routes[0].resource: ", resource},
              std::pair{"routes[0].authority.etcd", auth_etcd},
              std::pair{"routes[0].authority.election: ", auth_election},
              std::pair{"routes[0].authority.grace_ms: ", auth_grace},
              // TLS to the upstream (issue 27)
              std::pair{"routes[0].upstream_ca: ", chosen("upstream_ca")},
              std::pair{"routes[0].upstream_cert: ", chosen("upstream_cert")},
              std::pair{"routes[0].upstream_key: ", chosen("upstream_key")},
              std::pair{"routes[0].upstream_server_name: ", chosen("upstream_server_name")},
              std::pair{"routes[0].upstream_verify: ", chosen("upstream_verify")}}) {
          std::string_view f = field;
          if (given && errors[i].rfind(f, 0) == 0) {
            // "routes[0].authority.etcd[1]: ..." -> "--authority-etcd: ..." (the message quotes the URL).
            std::string rest = errors[i].substr(f.size());
            if (rest.rfind(": ", 0) == 0) rest = rest.substr(2);
            if (rest.rfind('[', 0) == 0 && rest.find("]: ") != std::string::npos)
              rest = rest.substr(rest.find("]: ") + 3);
            errors[i] = given->source + ": " + rest;
          }
        }
      }
    }
  }
  LoadResult r = finish(std::move(c), std::move(errors));
  r.warnings = std::move(warnings);
  return r;
}

}  // namespace fencegate::config
