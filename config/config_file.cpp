// Reading the JSON config document (--config / FENCEGATE_CONFIG, and reloads) into a Config:
// types, unknown and duplicate keys, nesting depth; the values' own checks are validate.cpp's.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "config/fields.h"

namespace fencegate::config {

namespace detail {

namespace {

using json = nlohmann::json;

// No setting nests deeper than a few levels. A deeper document is refused as it is read: the
// paths kept per level would otherwise cost memory quadratic in the depth (a 200 KB file of
// brackets took gigabytes, enough to kill a running sidecar on reload).
constexpr std::size_t kMaxConfigDepth = 32;
struct TooDeep {};

// Reports duplicate object keys, which nlohmann would otherwise resolve silently (last wins).
class DuplicateKeyFinder {
 public:
  // *where follows the parse: the field whose value comes next (for an error in that value).
  DuplicateKeyFinder(std::vector<std::string>& errors, std::string& where) : errors_(&errors), where_(&where) {}

  bool operator()(int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start: {
        if (stack_.size() >= kMaxConfigDepth) throw TooDeep{};
        std::string path;
        if (!stack_.empty()) {
          Frame& parent = stack_.back();
          path = parent.array ? parent.path + "[" + std::to_string(parent.next_index++) + "]"
                              : join(parent.path, parent.last_key);
        }
        stack_.push_back({event == json::parse_event_t::array_start, std::move(path), {}, {}, 0});
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!stack_.empty()) stack_.pop_back();
        break;
      case json::parse_event_t::key:
        if (!stack_.empty() && parsed.is_string()) {
          Frame& top = stack_.back();
          top.last_key = parsed.get<std::string>();
          *where_ = join(top.path, top.last_key);
          if (!top.keys.insert(top.last_key).second) {
            errors_->push_back(join(top.path, top.last_key) + ": duplicate key");
          }
        }
        break;
      case json::parse_event_t::value:
        // A NUL would cut a path or a token where the C library reads it (a db path "a\u0000b"
        // opens "a"): no setting has a use for one.
        if (parsed.is_string() && parsed.get_ref<const std::string&>().find('\0') != std::string::npos &&
            !stack_.empty()) {
          const Frame& top = stack_.back();
          errors_->push_back(
              (top.array ? top.path + "[" + std::to_string(top.next_index) + "]" : join(top.path, top.last_key)) +
              ": must not contain a NUL character (\\u0000)");
        }
        if (!stack_.empty() && stack_.back().array) {
          Frame& top = stack_.back();
          ++top.next_index;
          *where_ = top.path + "[" + std::to_string(top.next_index) + "]";  // the next element
        }
        break;
    }
    return true;
  }

 private:
  struct Frame {
    bool array;
    std::string path;
    std::set<std::string> keys;
    std::string last_key;
    std::size_t next_index;
  };
  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }
  std::vector<std::string>* errors_;
  std::string* where_;
  std::vector<Frame> stack_;
};

std::string got(const json& j) { return j.dump(); }

bool get_string(const json& j, const std::string& path, std::string& out, std::vector<std::string>& errors) {
  if (!j.is_string()) {
    errors.push_back(path + ": must be a string (got " + got(j) + ")");
    return false;
  }
  out = j.get<std::string>();
  return true;
}

// "authority": {"etcd": ["http://..."], "election": "...", "grace_ms": N}. Values are checked by
// validate(); here only their JSON types.
Authority parse_authority(const json& j, const std::string& path, std::vector<std::string>& errors) {
  Authority a;
  if (!j.is_object()) {
    errors.push_back(path + ": must be an object {\"etcd\": [URL, ...], \"election\": NAME} (got " + got(j) + ")");
    return a;
  }
  bool has_etcd = false, has_election = false;
  for (const auto& [key, v] : j.items()) {
    std::string fp = path + "." + key;
    if (key == "etcd") {
      has_etcd = true;
      if (v.is_string()) {
        a.etcd.push_back(v.get<std::string>());
      } else if (!v.is_array()) {
        errors.push_back(fp + ": must be an array of etcd URLs such as \"http://127.0.0.1:2379\" (got " + got(v) + ")");
      } else {
        for (std::size_t i = 0; i < v.size(); ++i) {
          std::string s;
          if (get_string(v[i], fp + "[" + std::to_string(i) + "]", s, errors)) a.etcd.push_back(s);
        }
        if (v.empty()) errors.push_back(fp + ": must list at least one etcd URL");
      }
    } else if (key == "coordinator") {  // issue 31: etcd://, zk:// or redis:// (checked by validate())
      has_etcd = true;
      get_string(v, fp, a.coordinator, errors);
    } else if (key == "auth_file") {  // issue 31
      get_string(v, fp, a.auth_file, errors);
    } else if (key == "poll_ms") {  // issue 31: Redis's safety-net poll while notifications carry the view
      if (v.is_number_integer() && v.get<std::int64_t>() >= 50 && v.get<std::int64_t>() <= 600000)
        a.poll = std::chrono::milliseconds(v.get<std::int64_t>());
      else errors.push_back(fp + ": must be an integer from 50 to 600000 (got " + got(v) + ")");
    } else if (key == "cacert" || key == "cert" || key == "key" || key == "user" || key == "password_file") {
      // issue 27 (tls-ctl): etcd over https and etcd users (checked by validate())
      get_string(v, fp,
                 key == "cacert" ? a.cacert
                 : key == "cert" ? a.cert
                 : key == "key"  ? a.key
                 : key == "user" ? a.user
                                 : a.password_file,
                 errors);
    } else if (key == "election") {
      has_election = true;
      get_string(v, fp, a.election, errors);
    } else if (key == "grace_ms") {
      if (v.is_number_integer() && !v.is_number_unsigned() && v.get<std::int64_t>() >= 0 &&
          v.get<std::int64_t>() <= kMaxMs) {
        a.grace = std::chrono::milliseconds(v.get<std::int64_t>());
      } else if (v.is_number_unsigned() && v.get<std::uint64_t>() <= static_cast<std::uint64_t>(kMaxMs)) {
        a.grace = std::chrono::milliseconds(v.get<std::uint64_t>());
      } else {
        errors.push_back(fp + ": " + grace_error(got(v)));
      }
    } else {
      errors.push_back(fp + ": unknown key");
    }
  }
  if (!has_etcd) errors.push_back(path + ".etcd: required");  // or "coordinator" (issue 31)
  if (!has_election) errors.push_back(path + ".election: required");
  return a;
}

// Issue 30 (idempotency): "idempotency": {"header", "required", "retention", "max_body_bytes",
// "max_keys", "methods", "scope", "on_unknown", "release_statuses", "unknown_statuses"}; {} turns it on with the
// defaults. Types and values are checked here; that the methods are fenced on the route, in validate.cpp.
Idempotency parse_idempotency(const json& j, const std::string& path, std::vector<std::string>& errors) {
  Idempotency d;
  if (!j.is_object()) {
    errors.push_back(path + ": must be an object such as {} or {\"required\": true} (got " + got(j) + ")");
    return d;
  }
  auto count = [&](const json& v, const std::string& fp, std::uint64_t lo, std::uint64_t hi, std::uint64_t& out) {
    if (v.is_number_unsigned() && v.get<std::uint64_t>() >= lo && v.get<std::uint64_t>() <= hi) {
      out = v.get<std::uint64_t>();
      return;
    }
    errors.push_back(fp + ": must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi) + " (got " +
                     got(v) + ")");
  };
  for (const auto& [key, v] : j.items()) {
    const std::string fp = path + "." + key;
    std::string s;
    if (key == "header") {
      if (get_string(v, fp, s, errors)) {
        const bool token = !s.empty() && s.size() <= 64 && std::all_of(s.begin(), s.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("!#$%&'*+-.^_`|~", c);
        });
        if (!token)
          errors.push_back(fp + ": must be an HTTP field name such as \"Idempotency-Key\" (got " + got(v) + ")");
        else d.header = s;
      }
    } else if (key == "required") {
      if (v.is_boolean()) d.required = v.get<bool>();
      else errors.push_back(fp + ": must be true or false (got " + got(v) + ")");
    } else if (key == "retention") {
      std::chrono::seconds r{0};
      if (get_string(v, fp, s, errors)) {
        if (auto e = parse_duration(s, r); !e.empty()) errors.push_back(fp + ": " + e);
        else if (r.count() == 0)
          errors.push_back(fp + ": must be longer than 0: a key must be kept to dedupe (got \"0\")");
        else d.retention = r;
      }
    } else if (key == "max_body_bytes") {
      count(v, fp, 0, Idempotency::kMaxBodyLimit, d.max_body_bytes);
    } else if (key == "max_keys") {
      count(v, fp, 1, 1000000000, d.max_keys);
    } else if (key == "methods") {
      if (!v.is_array() || v.empty()) {
        errors.push_back(fp + ": must be a non-empty array of method names such as [\"POST\"] (got " + got(v) + ")");
        continue;
      }
      for (std::size_t i = 0; i < v.size(); ++i)
        if (get_string(v[i], fp + "[" + std::to_string(i) + "]", s, errors)) d.methods.push_back(s);
    } else if (key == "scope") {
      if (get_string(v, fp, s, errors)) {
        if (s == "resource" || s == "client") d.scope_client = s == "client";
        else errors.push_back(fp + ": must be \"resource\" or \"client\" (got \"" + s + "\")");
      }
    } else if (key == "on_unknown") {
      if (get_string(v, fp, s, errors)) {
        if (s == "refuse" || s == "forward") d.forward_unknown = s == "forward";
        else errors.push_back(fp + ": must be \"refuse\" or \"forward\" (got \"" + s + "\")");
      }
    } else if (key == "release_statuses" || key == "unknown_statuses") {
      std::vector<int>& out = key == "release_statuses" ? d.release_statuses : d.unknown_statuses;
      if (!v.is_array()) {
        errors.push_back(fp + ": must be an array of HTTP status codes such as [502, 504] (got " + got(v) + ")");
        continue;
      }
      out.clear();
      for (std::size_t i = 0; i < v.size(); ++i) {
        const json& e = v[i];
        if (e.is_number_integer() && e.get<std::int64_t>() >= 100 && e.get<std::int64_t>() <= 599)
          out.push_back(e.get<int>());
        else
          errors.push_back(fp + "[" + std::to_string(i) + "]: must be an HTTP status code from 100 to 599 (got " +
                           got(e) + ")");
      }
    } else {
      errors.push_back(fp + ": unknown key");
    }
  }
  for (int s : d.release_statuses)
    if (std::find(d.unknown_statuses.begin(), d.unknown_statuses.end(), s) != d.unknown_statuses.end())
      errors.push_back(path + ".unknown_statuses: " + std::to_string(s) +
                       " is also in release_statuses (a status either releases the key or leaves its outcome "
                       "unknown, not both)");
  return d;
}

Route parse_route(const json& j, const std::string& path, std::vector<std::string>& errors) {
  Route r;
  if (!j.is_object()) {
    errors.push_back(path + ": must be an object (got " + got(j) + ")");
    return r;
  }
  for (const auto& [key, v] : j.items()) {
    std::string fp = path + "." + key;
    std::string s;
    if (key == "prefix") {
      get_string(v, fp, r.prefix, errors);
    } else if (key == "upstream") {
      get_string(v, fp, r.upstream, errors);
    } else if (key == "resource") {
      get_string(v, fp, r.resource, errors);
    } else if (key == "mode") {
      if (get_string(v, fp, s, errors)) {
        if (auto m = parse_mode(s)) {
          r.mode = *m;
        } else {
          errors.push_back(fp + ": " + mode_error(s));
        }
      }
    } else if (key == "write_methods") {
      if (!v.is_array()) {
        errors.push_back(fp + ": must be an array of method names (got " + got(v) + ")");
        continue;
      }
      r.write_methods.clear();
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (get_string(v[i], fp + "[" + std::to_string(i) + "]", s, errors)) r.write_methods.push_back(s);
      }
    } else if (key == "fence_reads") {
      if (v.is_boolean()) {
        r.fence_reads = v.get<bool>();
      } else {
        errors.push_back(fp + ": must be true or false (got " + got(v) + ")");
      }
    } else if (key == "authority") {
      r.authority = parse_authority(v, fp, errors);
    } else if (key == "max_resources") {
      if (v.is_number_unsigned() && v.get<std::uint64_t>() <= 100'000'000) {
        r.max_resources = static_cast<std::size_t>(v.get<std::uint64_t>());
      } else {
        errors.push_back(fp + ": must be a whole number from 0 (no route limit) to 100000000 (got " + got(v) + ")");
      }
    } else if (key == "allowed_clients") {  // TLS (issue 27)
      if (!v.is_array()) {
        errors.push_back(fp + ": must be an array of client identities (got " + got(v) + ")");
        continue;
      }
      r.allowed_clients.clear();
      for (std::size_t i = 0; i < v.size(); ++i)
        if (get_string(v[i], fp + "[" + std::to_string(i) + "]", s, errors)) r.allowed_clients.push_back(s);
    } else if (key == "upstream_ca" || key == "upstream_cert" || key == "upstream_key" ||
               key == "upstream_server_name") {  // TLS to the upstream (issue 27)
      get_string(v, fp,
                 key == "upstream_ca"     ? r.upstream_ca
                 : key == "upstream_cert" ? r.upstream_cert
                 : key == "upstream_key"  ? r.upstream_key
                                          : r.upstream_server_name,
                 errors);
    } else if (key == "upstream_verify") {  // TLS to the upstream (issue 27)
      if (v.is_boolean()) r.upstream_verify = v.get<bool>();
      else errors.push_back(fp + ": must be true or false (got " + got(v) + ")");
    } else if (key == "idempotency") {  // issue 30
      r.idempotency = parse_idempotency(v, fp, errors);
    } else if (key == "new_resources") {
      if (get_string(v, fp, s, errors)) {
        if (s == "on_write" || s == "fenced_only") r.fenced_only = s == "fenced_only";
        else errors.push_back(fp + ": must be \"on_write\" or \"fenced_only\" (got \"" + s + "\")");
      }
    } else {
      errors.push_back(fp + ": unknown key");
    }
  }
  return r;
}

// TLS (issue 27): "tls": {"sni": [{"names": [...], "cert": PATH, "key": PATH}, ...]}.
void parse_tls_sni(Config& c, const json& v, std::vector<std::string>& errors) {
  if (!v.is_array()) {
    errors.push_back("tls.sni: must be an array of {\"names\", \"cert\", \"key\"} objects (got " + got(v) + ")");
    return;
  }
  c.tls.sni.clear();
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string p = "tls.sni[" + std::to_string(i) + "]";
    if (!v[i].is_object()) {
      errors.push_back(p + ": must be an object (got " + got(v[i]) + ")");
      continue;
    }
    TlsSni e;
    for (const auto& [key, x] : v[i].items()) {
      std::string s;
      if (key == "names") {
        if (!x.is_array()) {
          errors.push_back(p + ".names: must be an array of server names (got " + got(x) + ")");
          continue;
        }
        for (std::size_t k = 0; k < x.size(); ++k)
          if (get_string(x[k], p + ".names[" + std::to_string(k) + "]", s, errors)) e.names.push_back(s);
      } else if (key == "cert") {
        get_string(x, p + ".cert", e.cert, errors);
      } else if (key == "key") {
        get_string(x, p + ".key", e.key, errors);
      } else {
        errors.push_back(p + "." + key + ": unknown key");
      }
    }
    c.tls.sni.push_back(std::move(e));
  }
}

// Reads one "admin"/"audit"/"tls" object into `c`.
void parse_section(Config& c, const std::string& section, const json& j, std::vector<std::string>& errors) {
  if (!j.is_object()) {
    errors.push_back(section + ": must be an object (got " + got(j) + ")");
    return;
  }
  for (const auto& [key, v] : j.items()) {
    std::string path = section + "." + key;
    if (path == "tls.sni") {  // TLS (issue 27): the one array in a section
      parse_tls_sni(c, v, errors);
      continue;
    }
    if (path == "admin.tls") {  // issue 27 (tls-ctl): the one object in a section, its keys "admin.tls.*"
      parse_section(c, path, v, errors);
      continue;
    }
    auto f = std::find_if(std::begin(kSectionFields), std::end(kSectionFields),
                          [&](const SectionField& sf) { return path == sf.key; });
    if (f == std::end(kSectionFields)) {
      errors.push_back(path + ": unknown key");
      continue;
    }
    std::string text;
    switch (f->kind) {
      case JsonKind::string:
        if (path == "fleet.etcd" && v.is_array()) {  // fleet (issue 33): a list of URLs
          bool ok = !v.empty();
          for (const auto& e : v) {
            ok = ok && e.is_string() && e.get<std::string>().find(',') == std::string::npos;
            if (ok) text += (text.empty() ? "" : ",") + e.get<std::string>();
          }
          if (!ok) {
            errors.push_back(path + ": must be a non-empty array of \"http[s]://host:port\" strings (got " + got(v) +
                             ")");
            continue;
          }
          break;
        }
        if (!get_string(v, path, text, errors)) continue;
        break;
      case JsonKind::integer:
        if (!v.is_number_integer() ||
            (v.is_number_unsigned() ? v.get<std::uint64_t>() > INT64_MAX : v.get<std::int64_t>() < 0)) {
          errors.push_back(path + ": " +
                           (path == "audit.max_rows" ? rows_error(got(v)) : "must be an integer (got " + got(v) + ")"));
          continue;
        }
        text = got(v);
        break;
      case JsonKind::boolean:
        if (!v.is_boolean()) {
          errors.push_back(path + ": must be true or false (got " + got(v) + ")");
          continue;
        }
        text = v.get<bool>() ? "true" : "false";
        break;
      case JsonKind::duration:
        if (v.is_string()) {
          text = v.get<std::string>();
        } else if (v.is_number_integer() && v.get<std::int64_t>() == 0) {
          text = "0";
        } else {
          errors.push_back(path + ": " + duration_error(got(v)));
          continue;
        }
        break;
    }
    if (auto e = f->set(c, text); !e.empty()) errors.push_back(path + ": " + e);
  }
}

// Keeps only the first error for each field path ("routes[0].prefix: ..."), so a value that is
// both mistyped and hence missing is reported once.
void dedupe(std::vector<std::string>& errors) {
  std::set<std::string> seen;
  std::vector<std::string> out;
  for (auto& e : errors) {
    std::string field = e.substr(0, e.find(": "));
    if (seen.insert(field).second) out.push_back(std::move(e));
  }
  errors = std::move(out);
}

}  // namespace

bool parse_json_into(Config& c, std::string_view text, std::string_view source, std::vector<std::string>& errors) {
  json doc;
  std::vector<std::string> dup_errors;
  std::string where;  // the field being parsed
  try {
    doc = json::parse(text.begin(), text.end(), DuplicateKeyFinder(dup_errors, where));
  } catch (const TooDeep&) {
    errors.push_back(std::string(source) + ": " + (where.empty() ? std::string("the document") : where) +
                     ": nested more than " + std::to_string(kMaxConfigDepth) +
                     " levels deep (no setting nests more than a few)");
    return false;
  } catch (const json::parse_error& e) {
    std::string what = e.what();
    if (auto p = what.find("] "); what.rfind("[json.exception.", 0) == 0 && p != std::string::npos) {
      what = what.substr(p + 2);
    }
    errors.push_back(std::string(source) + ": invalid JSON (byte " + std::to_string(e.byte) + "): " + what);
    return false;
  } catch (const json::exception& e) {
    // e.g. a number out of range (1e400): still a bad file, never a crash (a reload must survive it).
    std::string what = e.what();
    if (auto p = what.find("] "); what.rfind("[json.exception.", 0) == 0 && p != std::string::npos) {
      what = what.substr(p + 2);
    }
    errors.push_back(std::string(source) + ": invalid JSON" + (where.empty() ? std::string() : " in " + where) + ": " +
                     what);
    return false;
  }
  if (!doc.is_object()) {
    errors.push_back(std::string(source) + ": must be a JSON object (got " + std::string(doc.type_name()) + ")");
    return false;
  }
  errors.insert(errors.end(), dup_errors.begin(), dup_errors.end());

  for (const auto& [key, v] : doc.items()) {
    if (key == "routes") {
      if (!v.is_array()) {
        errors.push_back("routes: must be an array of route objects (got " + got(v) + ")");
        continue;
      }
      for (std::size_t i = 0; i < v.size(); ++i) {
        c.routes.push_back(parse_route(v[i], "routes[" + std::to_string(i) + "]", errors));
      }
      continue;
    }
    if (std::find(std::begin(kSections), std::end(kSections), key) != std::end(kSections)) {
      parse_section(c, key, v, errors);
      continue;
    }
    auto num =
        std::find_if(std::begin(kNumFields), std::end(kNumFields), [&](const NumField& f) { return key == f.key; });
    if (num != std::end(kNumFields)) {
      std::string err;
      if (v.is_number_integer() && !(v.is_number_unsigned() && v.get<std::uint64_t>() > INT64_MAX)) {
        err = set_num(c, *num, v.get<std::int64_t>(), got(v));
      } else {
        err = range_error(*num, got(v));
      }
      if (!err.empty()) errors.push_back(key + ": " + err);
      continue;
    }
    auto str =
        std::find_if(std::begin(kStrFields), std::end(kStrFields), [&](const StrField& f) { return key == f.key; });
    if (str != std::end(kStrFields)) {
      std::string s;
      if (get_string(v, key, s, errors)) {
        if (auto err = str->set(c, s); !err.empty()) errors.push_back(key + ": " + err);
      }
      continue;
    }
    errors.push_back(key + ": unknown key");
  }
  return true;
}

LoadResult finish(Config c, std::vector<std::string> errors) {
  LoadResult r;
  dedupe(errors);
  if (errors.empty()) {
    r.config = std::move(c);
  } else {
    r.errors = std::move(errors);
  }
  return r;
}

std::string read_file(const std::string& path, std::string& out) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return std::strerror(errno);
  char buf[8192];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  std::string err = std::ferror(f) ? std::strerror(errno) : "";
  std::fclose(f);
  return err;
}

}  // namespace detail

LoadResult load_json(std::string_view json_text, std::string_view source) {
  using namespace detail;
  Config c;
  std::vector<std::string> errors;
  if (parse_json_into(c, json_text, source, errors)) validate(c, errors);
  return finish(std::move(c), std::move(errors));
}

}  // namespace fencegate::config
