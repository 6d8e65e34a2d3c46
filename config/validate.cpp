// Checking a fully built Config: every error names the field and why, so one run shows them all
// (validate), and what a reload may not change (reload_incompatibilities).
#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/file_checks.h"
#include "config/config.h"
#include "config/fields.h"
#include "config/router.h"

namespace fencegate::config {

using namespace detail;
using json = nlohmann::json;

namespace {

// issue 31: the hiredis the election client is built with (its version macros only).
#if __has_include(<hiredis/hiredis.h>)
#include <hiredis/hiredis.h>
const std::string kHiredisVersion = std::to_string(HIREDIS_MAJOR) + "." + std::to_string(HIREDIS_MINOR);
#else
const std::string kHiredisVersion = "none";
#endif

// issue 31: "coordinator": etcd://h:p[,h:p] becomes the etcd list; zk://h:p[,h:p][/chroot] and
// redis://h:p[/db] stay as given (election_client/backend.h parses them again at start).
bool check_coordinator(Authority& a, const std::string& path, std::vector<std::string>& errors) {
  const std::string fp = path + ".coordinator";
  if (!a.etcd.empty()) {
    errors.push_back(fp + ": give either \"etcd\" or \"coordinator\", not both");
    return false;
  }
  const auto sep = a.coordinator.find("://");
  const std::string scheme = sep == std::string::npos ? "" : a.coordinator.substr(0, sep);
  std::string rest = sep == std::string::npos ? "" : a.coordinator.substr(sep + 3);
  std::string path_part;
  if (auto slash = rest.find('/'); slash != std::string::npos) {
    path_part = rest.substr(slash);
    rest = rest.substr(0, slash);
  }
  std::vector<std::string> hosts;
  for (std::size_t at = 0;;) {
    auto comma = rest.find(',', at);
    hosts.push_back(rest.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  if (scheme == "rediss") {  // issue 31: hiredis 0.14 (Debian bookworm) has no TLS
    errors.push_back(fp + ": rediss:// needs hiredis with TLS (1.0+); this build has " + kHiredisVersion);
    return false;
  }
  bool ok = scheme == "etcd" || scheme == "zk" || scheme == "redis";
  for (const auto& h : hosts) {
    Endpoint ep;
    ok = ok && !h.empty() && parse_upstream("http://" + h, ep).empty();
  }
  if (scheme == "etcd" && !path_part.empty()) ok = false;
  if (scheme == "redis" &&
      (hosts.size() != 1 || (path_part.size() > 1 && !std::all_of(path_part.begin() + 1, path_part.end(), ::isdigit))))
    ok = false;
  if (scheme == "zk" && path_part.find("//") != std::string::npos) ok = false;
  if (!ok) {
    errors.push_back(fp +
                     ": must be etcd://host:port[,host:port], zk://host:port[,host:port][/chroot] or "
                     "redis://host:port[/db] (got " +
                     quote(a.coordinator) + ")");
    return false;
  }
  if (!a.auth_file.empty()) {
    std::string secret;
    if (scheme == "etcd") {
      errors.push_back(path + ".auth_file: only for a zk:// or redis:// coordinator");
    } else if (auto e = files::read_secret_file(a.auth_file, &secret); !e.empty()) {
      errors.push_back(path + ".auth_file: " + e);
    } else if (scheme == "zk" && secret.find(':') == std::string::npos) {
      errors.push_back(path + ".auth_file: " + a.auth_file + " must hold user:password (ZooKeeper digest auth)");
    }
  }
  if (a.poll.count() > 0 && scheme == "zk")  // issue 31
    errors.push_back(path + ".poll_ms: only for a redis:// coordinator");
  if (scheme == "etcd") {
    // issue 27 (tls-ctl): with TLS files an etcd:// coordinator is reached over https
    const bool tls = !a.cacert.empty() || !a.cert.empty() || !a.key.empty();
    for (const auto& h : hosts) a.etcd.push_back((tls ? "https://" : "http://") + h);
    a.coordinator.clear();
  }
  return true;
}

// Issue 30: ASCII case-insensitive equality of field names.
bool iequals_ascii(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// Checks (and normalises) an authority; errors are named under `path` ("routes[0].authority").
void check_authority(Authority& a, const std::string& path, std::vector<std::string>& errors) {
  if (!a.coordinator.empty() && !check_coordinator(a, path, errors)) return;
  if (a.coordinator.empty() && !a.auth_file.empty())
    errors.push_back(path + ".auth_file: only for a zk:// or redis:// coordinator");
  if (a.coordinator.empty() && a.poll.count() > 0)  // issue 31
    errors.push_back(path + ".poll_ms: only for a redis:// coordinator");
  if (a.etcd.empty() && a.coordinator.empty()) errors.push_back(path + ".etcd: must list at least one etcd URL");
  std::vector<std::string> norm;
  for (std::size_t i = 0; i < a.etcd.size(); ++i) {
    Endpoint ep;
    // issue 27 (tls-ctl): https:// etcd endpoints
    const bool https = a.etcd[i].rfind("https://", 0) == 0;
    if (auto e = parse_upstream(https ? "http://" + a.etcd[i].substr(8) : a.etcd[i], ep); !e.empty()) {
      errors.push_back(path + ".etcd[" + std::to_string(i) +
                       "]: must be an etcd client URL \"http://host:port\" or \"https://host:port\" (got " +
                       quote(a.etcd[i]) + ")");
      continue;
    }
    std::string u = (https ? "https://" : "http://") + ep.to_string();
    if (std::find(norm.begin(), norm.end(), u) != norm.end()) {
      errors.push_back(path + ".etcd[" + std::to_string(i) + "]: listed twice (" + quote(a.etcd[i]) + ")");
      continue;
    }
    norm.push_back(std::move(u));
  }
  a.etcd = std::move(norm);
  bool printable = std::all_of(a.election.begin(), a.election.end(), [](char ch) {
    auto u = static_cast<unsigned char>(ch);
    return u > 0x20 && u < 0x7f;
  });
  if (a.election.empty()) {
    errors.push_back(path + ".election: must not be empty");
  } else if (!printable || a.election.size() > 256) {
    errors.push_back(path + ".election: must be 1..256 printable ASCII characters without spaces (got " +
                     quote(a.election) + ")");
  }
  if (a.grace.count() < 0 || a.grace.count() > kMaxMs || (a.grace.count() > 0 && a.grace.count() < kMinGraceMs))
    errors.push_back(path + ".grace_ms: " + grace_error(std::to_string(a.grace.count())));
}

// TLS (issue 27): a file the TLS context will load must be there and readable now, so that a
// start fails with exit 2 naming it. (Whether a key matches its certificate is checked where the
// context is built, proxy/tls_context.cpp, with the same exit code.)
void check_readable(const std::string& field, const std::string& path, std::vector<std::string>& errors) {
  if (path.empty()) {
    errors.push_back(field + ": required");
    return;
  }
  std::string text;
  if (auto e = read_file(path, text); !e.empty()) errors.push_back(field + ": cannot read " + path + ": " + e);
  else if (text.empty()) errors.push_back(field + ": " + path + " is empty");
}

// Issue 27 (tls-ctl): etcd TLS files and user, of an authority (`path` "routes[i].authority") or
// of the fleet ("fleet"); `E` has the fields cacert, cert, key, user, password_file and etcd.
template <class E>
void check_etcd_tls(const E& a, const std::string& path, std::vector<std::string>& errors) {
  const bool tls = !a.cacert.empty() || !a.cert.empty() || !a.key.empty();
  bool https = false;
  for (const auto& e : a.etcd) https = https || e.rfind("https://", 0) == 0;
  if (tls && !https) errors.push_back(path + ".cacert: TLS files need https:// etcd endpoints");
  if (!a.cacert.empty()) check_readable(path + ".cacert", a.cacert, errors);
  if (!a.cert.empty() || !a.key.empty()) {
    check_readable(path + ".cert", a.cert, errors);
    check_readable(path + ".key", a.key, errors);
  }
  if (!a.password_file.empty() && a.user.empty()) errors.push_back(path + ".user: required with password_file");
  if (!a.user.empty()) {
    if (a.user.size() > 256 || a.user.find_first_of("\r\n") != std::string::npos)
      errors.push_back(path + ".user: at most 256 bytes on one line");
    std::string secret;
    if (!a.password_file.empty()) {
      if (auto e = files::read_secret_trimmed(a.password_file, &secret); !e.empty())
        errors.push_back(path + ".password_file: " + e);
      else if (secret.empty()) errors.push_back(path + ".password_file: " + a.password_file + " is empty");
    } else if (const char* env = std::getenv("FENCEGATE_ETCD_PASSWORD"); !env || !*env) {
      errors.push_back(path + ".password_file: required with user (or set FENCEGATE_ETCD_PASSWORD)");
    }
  }
}

// Issue 27 (tls-ctl): an authority's etcd TLS files and user; the admin listener's TLS.
void check_authority_tls(const Authority& a, const std::string& path, std::vector<std::string>& errors) {
  const bool tls = !a.cacert.empty() || !a.cert.empty() || !a.key.empty();
  if (!tls && a.user.empty() && a.password_file.empty()) return;
  if (!a.coordinator.empty()) {
    errors.push_back(path + ": cacert, cert, key, user and password_file are only for an etcd authority");
    return;
  }
  check_etcd_tls(a, path, errors);
}

void check_admin_tls(const Config& c, std::vector<std::string>& errors) {
  const Tls& t = c.admin.tls;
  if (!t.enabled()) {
    if (!t.client_ca.empty() || t.client_auth != ClientAuth::none)
      errors.push_back("admin.tls.cert: required when other admin.tls settings are given");
    return;
  }
  check_readable("admin.tls.cert", t.cert, errors);
  check_readable("admin.tls.key", t.key, errors);
  if (!t.client_ca.empty()) check_readable("admin.tls.client_ca", t.client_ca, errors);
  if (t.client_auth != ClientAuth::none && t.client_ca.empty())
    errors.push_back("admin.tls.client_ca: required when admin.tls.client_auth is optional or required");
}

void check_tls(const Config& c, std::vector<std::string>& errors) {
  check_admin_tls(c, errors);  // issue 27 (tls-ctl)
  if (!c.tls.enabled()) {
    if (!c.tls.client_ca.empty() || c.tls.client_auth != ClientAuth::none || !c.tls.sni.empty())
      errors.push_back("tls.cert: required when other tls settings are given");
  } else {
    check_readable("tls.cert", c.tls.cert, errors);
    check_readable("tls.key", c.tls.key, errors);
    if (!c.tls.client_ca.empty()) check_readable("tls.client_ca", c.tls.client_ca, errors);
    if (c.tls.client_auth != ClientAuth::none && c.tls.client_ca.empty())
      errors.push_back("tls.client_ca: required when tls.client_auth is optional or required");
    for (std::size_t i = 0; i < c.tls.sni.size(); ++i) {
      const TlsSni& e = c.tls.sni[i];
      const std::string p = "tls.sni[" + std::to_string(i) + "]";
      if (e.names.empty()) errors.push_back(p + ".names: must list at least one server name");
      for (const std::string& n : e.names)
        if (n.empty() || n.size() > 253 || n.find_first_of(" \t\r\n/") != std::string::npos)
          errors.push_back(p + ".names: not a server name (got " + quote(n) + ")");
      check_readable(p + ".cert", e.cert, errors);
      check_readable(p + ".key", e.key, errors);
    }
  }
  if (c.client_identity_header.empty() || lower(c.client_identity_header) == lower(c.token_header) ||
      lower(c.client_identity_header) == lower(c.leader_header))
    errors.push_back("client_identity_header: must differ from token_header and leader_header (got " +
                     quote(c.client_identity_header) + ")");
  for (std::size_t i = 0; i < c.routes.size(); ++i) {
    const Route& r = c.routes[i];
    const std::string p = "routes[" + std::to_string(i) + "].allowed_clients";
    if (r.allowed_clients.empty()) continue;
    if (!c.tls.enabled() || c.tls.client_auth == ClientAuth::none)
      errors.push_back(p +
                       ": needs tls with client_auth \"optional\" or \"required\" (without a verified client "
                       "certificate no request has an identity)");
    for (std::size_t k = 0; k < r.allowed_clients.size(); ++k) {
      const std::string& a = r.allowed_clients[k];
      const auto star = a.find('*');
      const bool printable = std::all_of(a.begin(), a.end(), [](char ch) {
        auto u = static_cast<unsigned char>(ch);
        return u > 0x20 && u < 0x7f;
      });
      if (a.empty() || a == "*" || !printable || (star != std::string::npos && star != a.size() - 1))
        errors.push_back(p + "[" + std::to_string(k) +
                         "]: an identity is printable ASCII without spaces, with at most a trailing \"*\" after a "
                         "prefix (got " +
                         quote(a) + ")");
    }
  }
}

// TLS to the upstream (issue 27): the upstream_* settings belong to an https:// upstream, and the
// files they name must be there now (whether they parse, and a key matches its certificate, is
// checked where the context is built, proxy/tls_upstream.cpp, with the same exit code).
void check_upstream_tls(const Route& r, const std::string& name, std::vector<std::string>& errors) {
  const std::pair<const char*, const std::string*> files[] = {{"upstream_ca", &r.upstream_ca},
                                                              {"upstream_cert", &r.upstream_cert},
                                                              {"upstream_key", &r.upstream_key}};
  if (!r.upstream_tls) {
    if (r.upstream.empty()) return;
    for (const auto& [key, v] : files)
      if (!v->empty())
        errors.push_back(name + "." + key + ": only for an https:// upstream (got " + quote(r.upstream) + ")");
    if (!r.upstream_server_name.empty())
      errors.push_back(name + ".upstream_server_name: only for an https:// upstream (got " + quote(r.upstream) + ")");
    if (!r.upstream_verify)
      errors.push_back(name + ".upstream_verify: only for an https:// upstream (got " + quote(r.upstream) + ")");
    return;
  }
  for (const auto& [key, v] : files)
    if (!v->empty()) check_readable(name + "." + key, *v, errors);
  if (r.upstream_cert.empty() != r.upstream_key.empty())
    errors.push_back(name + (r.upstream_cert.empty() ? ".upstream_cert" : ".upstream_key") +
                     ": upstream_cert and upstream_key go together (a client certificate and its private key)");
  const std::string& sn = r.upstream_server_name;
  if (!sn.empty() && (sn.size() > 253 || sn.find_first_of(" \t\r\n/:@[]") != std::string::npos ||
                      !std::all_of(sn.begin(), sn.end(), [](char ch) {
                        auto u = static_cast<unsigned char>(ch);
                        return u > 0x20 && u < 0x7f;
                      })))
    errors.push_back(name + ".upstream_server_name: not a host name (got " + quote(sn) + ")");
}

}  // namespace

void validate(Config& c, std::vector<std::string>& errors) {
  check_tls(c, errors);  // TLS (issue 27)
  // Port 0 is allowed for both listeners: the OS picks a free port and the process logs it.
  if (c.listen.host.empty()) {
    errors.push_back("listen: expected \"host:port\" (got " + quote(c.listen.to_string()) + ")");
  }
  if (c.admin.listen.host.empty()) {
    errors.push_back("admin.listen: expected \"host:port\" (got " + quote(c.admin.listen.to_string()) + ")");
  }
  if (!c.admin.token_file.empty()) {
    // The token itself never appears in a message.
    std::string text;
    c.admin.token.clear();
    // Only its owner may read or write it (docs/security.md); the message names the file and mode.
    if (std::string err = files::read_secret_file(c.admin.token_file, &text); !err.empty()) {
      errors.push_back("admin.token_file: " + err);
    } else {
      const char* ws = " \t\r\n\f\v";
      std::size_t b = text.find_first_not_of(ws);
      std::size_t e = text.find_last_not_of(ws);
      std::string token = b == std::string::npos ? std::string() : text.substr(b, e - b + 1);
      bool clean = std::all_of(token.begin(), token.end(), [](char ch) {
        auto u = static_cast<unsigned char>(ch);
        return u > 0x20 && u != 0x7f;
      });
      if (token.empty()) {
        errors.push_back("admin.token_file: " + c.admin.token_file + " is empty");
      } else if (!clean) {
        errors.push_back("admin.token_file: " + c.admin.token_file +
                         " must hold a single token (it has whitespace or control characters inside)");
      } else if (token.size() < files::kMinTokenBytes) {
        errors.push_back("admin.token_file: the token in " + c.admin.token_file + " has " +
                         std::to_string(token.size()) + " bytes; at least " + std::to_string(files::kMinTokenBytes) +
                         " are required (e.g. openssl rand -hex 32)");
      } else {
        c.admin.token = std::move(token);
      }
    }
  } else if (!c.admin.listen.host.empty() && c.admin.token.empty() && !is_loopback_host(c.admin.listen.host)) {
    // (A Config built in code may set admin.token directly; the loaders only fill it from the file.)
    errors.push_back("admin.listen: binding the admin API to a non-loopback address (" + c.admin.listen.host +
                     ") requires admin.token_file");
  }
  auto wildcard = [](const std::string& h) { return h == "0.0.0.0" || h == "::" || h == "[::]"; };
  if (!c.listen.host.empty() && c.listen.port != 0 && c.admin.listen.port == c.listen.port &&
      (lower(c.admin.listen.host) == lower(c.listen.host) || wildcard(c.listen.host) ||
       wildcard(c.admin.listen.host))) {
    if (lower(c.admin.listen.host) == lower(c.listen.host))
      errors.push_back("admin.listen: must differ from listen (both are " + quote(c.listen.to_string()) + ")");
    else
      errors.push_back("admin.listen: must differ from listen (" + quote(c.admin.listen.to_string()) + " and " +
                       quote(c.listen.to_string()) + ": a wildcard address takes port " +
                       std::to_string(c.listen.port) + " on every address)");
  }
  // Fleet (issue 33, docs/fleet.md): all of etcd, name and member, or none.
  if (c.fleet.enabled() || !c.fleet.name.empty() || !c.fleet.member.empty()) {
    if (!c.fleet.enabled()) errors.push_back("fleet.etcd: required when fleet.name or fleet.member is set");
    if (c.fleet.name.empty()) errors.push_back("fleet.name: required in a fleet");
    if (c.fleet.member.empty()) errors.push_back("fleet.member: required in a fleet");
    check_etcd_tls(c.fleet, "fleet", errors);  // issue 27: https and etcd users
  } else if (!c.fleet.cacert.empty() || !c.fleet.cert.empty() || !c.fleet.key.empty() || !c.fleet.user.empty() ||
             !c.fleet.password_file.empty()) {
    errors.push_back("fleet.etcd: required when other fleet settings are given");
  }
  if (c.db.empty()) errors.push_back("db: must not be empty");
  // A newline or other control character in the path (a stray "\n" from a secret or a heredoc)
  // would open a different, empty store: every stored generation silently gone.
  if (std::any_of(c.db.begin(), c.db.end(), [](char ch) {
        auto u = static_cast<unsigned char>(ch);
        return u < 0x20 || u == 0x7f;
      })) {
    errors.push_back("db: must not contain control characters such as a newline (got " +
                     json(c.db).dump(-1, ' ', false, json::error_handler_t::replace) + ")");
  }
  if (!c.db.empty() && (c.db.front() == ' ' || c.db.back() == ' ')) {
    errors.push_back("db: must not start or end with a space (got " + quote(c.db) + ")");
  } else if (!c.db.empty()) {
    // Another local user must not be able to read, replace or plant files beside the store
    // (docs/security.md); the store checks this again when it opens.
    std::string real;
    if (auto e = files::check_db_location(c.db, &real); !e.empty()) errors.push_back("db: " + e);
  }
  if (c.threads == 0) c.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (const NumField& f : kNumFields) {
    std::int64_t v = f.get(c);
    // Unsigned fields wrap a negative input to a huge value; show what was stored.
    if (v < f.min || v > f.max) errors.push_back(std::string(f.key) + ": " + range_error(f, std::to_string(v)));
  }
  if (auto e = check_header_name(c.token_header); !e.empty()) errors.push_back("token_header: " + e);
  if (auto e = check_header_name(c.leader_header); !e.empty()) errors.push_back("leader_header: " + e);
  if (lower(c.token_header) == lower(c.leader_header)) {
    errors.push_back("leader_header: must differ from token_header (both are " + quote(c.leader_header) + ")");
  }
  if (auto e = check_log_level(c.log_level); !e.empty()) errors.push_back("log_level: " + e);

  if (c.routes.empty()) errors.push_back("routes: at least one route is required");
  std::map<std::string, std::size_t> seen;  // prefix with capture names erased -> route index
  for (std::size_t i = 0; i < c.routes.size(); ++i) {
    Route& r = c.routes[i];
    std::string name = "routes[" + std::to_string(i) + "]";
    if (r.prefix.empty()) {
      errors.push_back(name + ".prefix: required");
    } else if (r.prefix[0] != '/') {
      errors.push_back(name + ".prefix: must start with \"/\" (got " + quote(r.prefix) + ")");
    } else if (auto e = check_route_template(r); !e.empty()) {
      errors.push_back(name + "." + e);
    } else {
      std::string shape;
      for (std::size_t p = 0; p < r.prefix.size(); ++p) {
        if (r.prefix[p] == '{') {
          shape += "{}";
          p = r.prefix.find('}', p);
        } else {
          shape += r.prefix[p];
        }
      }
      auto [it, fresh] = seen.emplace(shape, i);
      if (!fresh) {
        errors.push_back(name + ".prefix: same as routes[" + std::to_string(it->second) + "].prefix (" +
                         quote(c.routes[it->second].prefix) + ")");
      }
    }
    if (r.upstream.empty()) {
      errors.push_back(name + ".upstream: required");
    } else if (auto e = parse_route_upstream(r.upstream, r.upstream_addr, &r.upstream_tls); !e.empty()) {
      errors.push_back(name + ".upstream: " + e);
    }
    check_upstream_tls(r, name, errors);  // TLS to the upstream (issue 27)
    if (r.write_methods.empty()) {
      errors.push_back(name + ".write_methods: must list at least one method");
    }
    for (std::size_t m = 0; m < r.write_methods.size(); ++m) {
      if (!is_upper_method(r.write_methods[m])) {
        errors.push_back(name + ".write_methods[" + std::to_string(m) +
                         "]: must be an upper-case HTTP method such as \"POST\" (got " + quote(r.write_methods[m]) +
                         ")");
      }
    }
    if (r.authority) check_authority(*r.authority, name + ".authority", errors);
    if (r.authority) check_authority_tls(*r.authority, name + ".authority", errors);  // issue 27 (tls-ctl)
    // Issue 30 (idempotency): keys are looked at only for writes the fence admits, so each keyed
    // method must be fenced on the route, and the key's header is not one of the fence's own.
    if (r.idempotency) {
      const Idempotency& d = *r.idempotency;
      for (std::size_t m = 0; m < d.methods.size(); ++m) {
        const std::string mp = name + ".idempotency.methods[" + std::to_string(m) + "]";
        if (!is_upper_method(d.methods[m]))
          errors.push_back(mp + ": must be an upper-case HTTP method such as \"POST\" (got " + quote(d.methods[m]) +
                           ")");
        else if (!r.is_fenced(d.methods[m]))
          errors.push_back(mp + ": " + quote(d.methods[m]) +
                           " is not fenced on this route (write_methods): keys are looked at only for fenced writes");
      }
      if (iequals_ascii(d.header, c.token_header) || iequals_ascii(d.header, c.leader_header) ||
          iequals_ascii(d.header, "Content-Length") || iequals_ascii(d.header, "Transfer-Encoding") ||
          iequals_ascii(d.header, "Host"))
        errors.push_back(
            name + ".idempotency.header: " + quote(d.header) +
            " is a field fencegate reads for another purpose; use another name such as \"Idempotency-Key\"");
      if (r.mode == Mode::off)
        errors.push_back(name + ".idempotency: the route's mode is off (nothing is fenced, so nothing is keyed)");
    }
  }
  // A resource has one mode and one authority. If an observe route can name a resource an
  // enforce route fences, the observe route forwards the stale writes the enforce route
  // refuses, to the same resource. If routes with different authorities (or one with none) can
  // name it, a token valid on one route advances the fence past the other election's leader: a
  // forged 2^63-1 through a plain route locks an election's resource for good. (Off routes
  // never touch the fence: their resource name is unused.)
  auto authority_of = [](const Route& r) {
    if (!r.authority) return std::string("no election");
    std::string etcd;
    for (const auto& e : r.authority->etcd) etcd += (etcd.empty() ? "" : ",") + e;
    if (!r.authority->coordinator.empty()) etcd = r.authority->coordinator;  // issue 31
    return "election " + quote(r.authority->election) + " at " + etcd;
  };
  for (std::size_t j = 0; j < c.routes.size(); ++j) {
    const Route& rj = c.routes[j];
    if (rj.mode == Mode::off || !check_route_template(rj).empty()) continue;
    for (std::size_t i = 0; i < j; ++i) {
      const Route& ri = c.routes[i];
      if (ri.mode == Mode::off || !check_route_template(ri).empty()) continue;
      // The same election through the same endpoints is one authority, whatever the order of the
      // endpoints or the grace.
      auto endpoints = [](const Route& r) {
        auto set = std::set<std::string>(r.authority->etcd.begin(), r.authority->etcd.end());
        if (!r.authority->coordinator.empty()) set.insert(r.authority->coordinator);  // issue 31
        return set;
      };
      const bool same_authority = ri.authority ? (rj.authority && ri.authority->election == rj.authority->election &&
                                                  endpoints(ri) == endpoints(rj))
                                               : !rj.authority;
      if ((ri.mode == rj.mode && same_authority) || !resource_templates_overlap(ri.resource, rj.resource)) continue;
      // "/tenants/{t}/" -> "tenant-{t}" beside "/tenants/acme/" -> "tenant-acme": every path that
      // would give the template route that name goes to the literal one (one tenant migrated to
      // enforce, or to its own election, ahead of the others).
      if (literal_route_takes_resource(ri, rj) || literal_route_takes_resource(rj, ri)) continue;
      const std::string both = "its resource " + quote(rj.resource) + " can be the resource " + quote(ri.resource) +
                               " of routes[" + std::to_string(i) + "] (" + quote(ri.prefix) + ")";
      if (ri.mode != rj.mode)
        errors.push_back("routes[" + std::to_string(j) + "].mode: " + std::string(to_string(rj.mode)) + ", but " +
                         both + ", which is " + std::string(to_string(ri.mode)) +
                         "d; a resource is fenced in one mode: give both routes the same mode, or different resources");
      else
        errors.push_back("routes[" + std::to_string(j) + "].authority: " + authority_of(rj) + ", but " + both +
                         ", fenced under " + authority_of(ri) +
                         "; a resource has one authority: give both routes the same one, or different resources");
      break;
    }
  }
}

std::vector<std::string> reload_incompatibilities(const Config& current, const Config& next) {
  std::vector<std::string> errors;
  auto check = [&](const char* field, const std::string& a, const std::string& b) {
    if (a != b) errors.push_back(std::string(field) + ": changing it needs a restart (" + a + " -> " + b + ")");
  };
  check("listen", current.listen.to_string(), next.listen.to_string());
  check("db", current.db, next.db);
  check("threads", std::to_string(current.threads), std::to_string(next.threads));
  check("admin.listen", current.admin.listen.to_string(), next.admin.listen.to_string());
  // TLS (issue 27): the data listener's terminator starts with the process (certificates reload).
  check("tls", current.tls.enabled() ? "on" : "off", next.tls.enabled() ? "on" : "off");
  // Issue 27 (tls-ctl): so does the admin listener's TLS (its certificates reload).
  check("admin.tls", current.admin.tls.enabled() ? "on" : "off", next.admin.tls.enabled() ? "on" : "off");
  // Fleet (issue 33): its membership runs from the start of the process.
  auto fleet_text = [](const Config& c) {
    const auto& f = c.fleet;
    std::string t = f.name + "/" + f.member + "/" + std::to_string(f.ttl.count());
    for (const auto& e : f.etcd) t += " " + e;
    for (const std::string* s : {&f.cacert, &f.cert, &f.key, &f.user, &f.password_file}) t += " " + quote(*s);
    return c.fleet.enabled() ? t : std::string("none");
  };
  check("fleet", fleet_text(current), fleet_text(next));
  // Authorities run their own etcd watches, started with the process: which routes have which
  // authority may not change on reload (routes without one may come and go).
  auto authorities = [](const Config& c) {
    std::map<std::string, std::string> m;  // route prefix -> authority id
    for (const auto& r : c.routes)
      if (r.authority) m[r.prefix] = r.authority->id();
    return m;
  };
  auto a = authorities(current), b = authorities(next);
  for (const auto& [prefix, id] : a) {
    auto it = b.find(prefix);
    check(("routes[prefix " + quote(prefix) + "].authority").c_str(), id, it == b.end() ? "none" : it->second);
  }
  for (const auto& [prefix, id] : b)
    if (!a.contains(prefix)) check(("routes[prefix " + quote(prefix) + "].authority").c_str(), "none", id);
  return errors;
}

}  // namespace fencegate::config
