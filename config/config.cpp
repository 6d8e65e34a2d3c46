// The settings of `fencegate serve`: one table row per setting (shared by the JSON, environment
// and flag loaders and the usage text), the value parsers they use, and the help text. Loading:
// config_file.cpp (the JSON document), env_flags.cpp (flags and FENCEGATE_* environment);
// checking: validate.cpp.
#include "config/config.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <sstream>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "common/log.h"
#include "config/fields.h"

namespace fencegate::config {

namespace detail {

std::string quote(std::string_view s) { return "\"" + std::string(s) + "\""; }

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// RFC 9110 token (header field names, methods).
bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
    if (!ok || c == '\0') return false;
  }
  return true;
}

bool is_upper_method(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= 'A' && c <= 'Z'; });
}

// Parses "host:port", "[v6]:port". With default_port, the ":port" part is optional. With
// allow_port_zero (listeners), port 0 means "any free port, chosen by the OS".
// Returns an empty string on success, else the reason.
std::string parse_endpoint(std::string_view s, Endpoint& out, int default_port, bool allow_port_zero) {
  const std::string expected = default_port ? "expected \"host[:port]\"" : "expected \"host:port\"";
  std::string host;
  std::string_view rest;
  if (!s.empty() && s[0] == '[') {
    std::size_t close = s.find(']');
    if (close == std::string_view::npos || close == 1) return expected + " (got " + quote(s) + ")";
    host = std::string(s.substr(1, close - 1));
    for (char c : host) {
      bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == ':' || c == '.';
      if (!ok) return "bad IPv6 address " + quote(host);
    }
    rest = s.substr(close + 1);
  } else {
    std::size_t colon = s.rfind(':');
    host = std::string(s.substr(0, colon));
    rest = colon == std::string_view::npos ? std::string_view() : s.substr(colon);
    if (host.empty() || host.find(':') != std::string::npos) {
      return expected + " (got " + quote(s) + ")";
    }
    for (char c : host) {
      bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
                c == '_';
      if (!ok) return "bad host name " + quote(host);
    }
  }
  int port = default_port;
  if (!rest.empty()) {
    if (rest[0] != ':') return expected + " (got " + quote(s) + ")";
    std::string_view digits = rest.substr(1);
    auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
    if (digits.empty() || digits.size() > 5 || ec != std::errc() || ptr != digits.data() + digits.size() ||
        port < (allow_port_zero ? 0 : 1) || port > 65535) {
      return allow_port_zero ? "port must be between 0 and 65535, 0 meaning any free port (got " + quote(digits) + ")"
                             : "port must be between 1 and 65535 (got " + quote(digits) + ")";
    }
  } else if (default_port == 0) {
    return expected + " (got " + quote(s) + ")";
  }
  out.host = std::move(host);
  out.port = static_cast<std::uint16_t>(port);
  return {};
}

// Parses "http://host[:port][/]". Returns an empty string on success, else the reason.
std::string parse_upstream(std::string_view url, Endpoint& out) {
  std::string l = lower(url);
  if (l.rfind("https://", 0) == 0) return "only http:// upstreams are supported (got " + quote(url) + ")";
  if (l.rfind("http://", 0) != 0) return "expected \"http://host[:port]\" (got " + quote(url) + ")";
  std::string_view rest = url.substr(7);
  if (rest.find('@') != std::string_view::npos) return "userinfo (\"user@\") is not allowed";
  if (rest.find_first_of("?#") != std::string_view::npos) {
    return "a query or fragment is not allowed (got " + quote(url) + ")";
  }
  std::size_t slash = rest.find('/');
  if (slash != std::string_view::npos && slash + 1 != rest.size()) {
    return "a path is not supported; requests are forwarded with their own path (got " + quote(url) + ")";
  }
  return parse_endpoint(rest.substr(0, slash), out, 80);
}

// TLS to the upstream (issue 27): https:// as http://, with 443 for the default port.
std::string parse_route_upstream(std::string_view url, Endpoint& out, bool* tls) {
  *tls = lower(url).rfind("https://", 0) == 0;
  if (!*tls) return parse_upstream(url, out);
  const std::string rest(url.substr(8));
  std::string e = parse_upstream("http://" + rest, out);
  if (!e.empty()) {
    if (auto at = e.find("http://" + rest); at != std::string::npos) e.replace(at, 7 + rest.size(), url);
    return e;
  }
  const std::string authority = rest.substr(0, rest.find('/'));
  const auto colon = authority.rfind(':');
  if (colon == std::string::npos || authority.back() == ']' || authority.find(']', colon) != std::string::npos)
    out.port = 443;  // no port given
  return {};
}

// --- Field tables: one row per scalar setting, shared by the JSON, env and flag loaders. ---

#define FG_SIZE_FIELD(name, lo, hi, help)                                                  \
  NumField {                                                                               \
    #name, lo, hi, [](const Config& c) { return static_cast<std::int64_t>(c.name); },      \
        [](Config& c, std::int64_t v) { c.name = static_cast<decltype(c.name)>(v); }, help \
  }
#define FG_MS_FIELD(name, help)                                                                        \
  NumField {                                                                                           \
    #name "_ms", 1, kMaxMs, [](const Config& c) { return static_cast<std::int64_t>(c.name.count()); }, \
        [](Config& c, std::int64_t v) { c.name = std::chrono::milliseconds(v); }, help                 \
  }

namespace {
const NumField kNumFieldRows[] = {
    FG_SIZE_FIELD(threads, 1, 256, "I/O threads; 0 means one per hardware thread"),
    FG_SIZE_FIELD(max_connections, 1, 1'000'000, "concurrent client connections"),
    FG_SIZE_FIELD(max_connections_per_client, 0, 1'000'000,
                  "client connections per client address; more are closed at accept; 0: no limit"),
    FG_SIZE_FIELD(max_header_bytes, 1024, 1024 * 1024, "request line + headers; over -> 431"),
    FG_SIZE_FIELD(max_body_bytes, 1, INT64_MAX, "request body; over -> 413"),
    FG_SIZE_FIELD(max_resources, 1, 100'000'000, "distinct fenced resources held in memory"),
    FG_SIZE_FIELD(max_leader_bytes, 1, 4096, "longest accepted leader header value"),
    FG_SIZE_FIELD(upstream_idle_per_thread, 0, 100'000, "pooled idle upstream connections per thread"),
    FG_MS_FIELD(header_timeout, "time to receive a request head; over -> 408"),
    FG_MS_FIELD(idle_timeout, "keep-alive idle time between requests"),
    FG_MS_FIELD(body_timeout, "time without request body progress"),
    FG_MS_FIELD(upstream_connect_timeout, "upstream connect; over -> 502"),
    FG_MS_FIELD(upstream_timeout, "time without upstream progress; over -> 504"),
    FG_MS_FIELD(drain_timeout, "newer generation waits for older in-flight writes, then aborts them (504)"),
};
}  // namespace

#undef FG_SIZE_FIELD
#undef FG_MS_FIELD

std::string range_error(const NumField& f, std::string_view got) {
  // A bad value is quoted, but not a megabyte of it.
  std::string shown = got.size() > 64 ? std::string(got.substr(0, 64)) + "..." : std::string(got);
  if (std::strcmp(f.key, "threads") == 0)
    return "must be 0 (one per hardware thread) or an integer between " + std::to_string(f.min) + " and " +
           std::to_string(f.max) + " (got " + shown + ")";
  return "must be an integer between " + std::to_string(f.min) + " and " + std::to_string(f.max) + " (got " + shown +
         ")";
}

// Sets a numeric field; threads also accepts 0 ("hardware threads"). Returns the reason on failure.
std::string set_num(Config& c, const NumField& f, std::int64_t v, std::string_view got) {
  bool auto_threads = std::strcmp(f.key, "threads") == 0 && v == 0;
  if (!auto_threads && (v < f.min || v > f.max)) return range_error(f, got);
  f.set(c, v);
  return {};
}

std::string set_num_text(Config& c, const NumField& f, std::string_view text) {
  std::int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
    return range_error(f, quote(text));
  }
  return set_num(c, f, v, text);
}

std::string check_log_level(std::string_view s) {
  if (log::Level level; log::parse_level(s, &level)) return {};
  return "must be one of debug, info, warn, error (got " + quote(s) + ")";
}

std::string check_header_name(std::string_view s) {
  if (!is_token(s) || s.size() > 256) return "must be a valid HTTP header name (got " + quote(s) + ")";
  // Fields the proxy frames, routes or strips itself: a token there would be read from (or lost
  // with) something else. "_" reads as "-" on CGI-style stacks.
  std::string l = lower(s);
  std::replace(l.begin(), l.end(), '_', '-');
  for (const char* reserved : {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "te",
                               "trailer", "upgrade", "expect", "proxy-connection", "x-forwarded-for", "forwarded"})
    if (l == reserved) return "must not be " + quote(s) + ", a field the proxy itself frames, routes or rewrites";
  return {};
}

namespace {
const StrField kStrFieldRows[] = {
    {"listen", [](Config& c, std::string_view v) { return parse_endpoint(v, c.listen, 0, true); },
     [](const Config& c) { return c.listen.to_string(); },
     "address to listen on, host:port; port 0 = any free port (in the \"listening\" log line, level info)"},
    {"db",
     [](Config& c, std::string_view v) -> std::string {
       if (v.empty()) return "must not be empty";
       c.db = v;
       return {};
     },
     [](const Config& c) { return c.db; }, "SQLite fence store path"},
    {"token_header",
     [](Config& c, std::string_view v) -> std::string {
       if (auto e = check_header_name(v); !e.empty()) return e;
       c.token_header = v;
       return {};
     },
     [](const Config& c) { return c.token_header; }, "request header carrying the fencing token"},
    {"leader_header",
     [](Config& c, std::string_view v) -> std::string {
       if (auto e = check_header_name(v); !e.empty()) return e;
       c.leader_header = v;
       return {};
     },
     [](const Config& c) { return c.leader_header; }, "request header naming the leader"},
    // TLS (issue 27): the header carrying the verified client identity to the upstream.
    {"client_identity_header",
     [](Config& c, std::string_view v) -> std::string {
       if (auto e = check_header_name(v); !e.empty()) return e;
       c.client_identity_header = v;
       return {};
     },
     [](const Config& c) { return c.client_identity_header; },
     "request header carrying the verified TLS client identity to the upstream (a client's own is dropped)"},
    {"log_level",
     [](Config& c, std::string_view v) -> std::string {
       if (auto e = check_log_level(v); !e.empty()) return e;
       c.log_level = v;
       return {};
     },
     [](const Config& c) { return c.log_level; }, "debug, info, warn or error"},
    {"io_uring",
     [](Config& c, std::string_view v) -> std::string {
       if (v != "auto" && v != "off") return "must be auto or off (got " + quote(v) + ")";
       c.io_uring = v == "auto";
       return {};
     },
     [](const Config& c) { return std::string(c.io_uring ? "auto" : "off"); },
     "auto: send each reactor pass's writes in one io_uring submission where available; off: one sendmsg each"},
};
}  // namespace

// "max_body_bytes" -> "--max-body-bytes"; "admin.token_file" -> "--admin-token-file".
std::string flag_of(std::string_view key) {
  std::string f = "--" + std::string(key);
  std::replace(f.begin(), f.end(), '_', '-');
  std::replace(f.begin(), f.end(), '.', '-');
  return f;
}

// "max_body_bytes" -> "FENCEGATE_MAX_BODY_BYTES"; "admin.token_file" -> "FENCEGATE_ADMIN_TOKEN_FILE".
std::string env_of(std::string_view key) {
  std::string e = "FENCEGATE_" + std::string(key);
  for (char& c : e) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
    if (c == '.') c = '_';
  }
  return e;
}

// --- Sectioned settings: JSON "admin": {...} and "audit": {...}; flags --admin-*, --audit-*. ---

namespace {
constexpr std::int64_t kMaxAgeLimit = 36500LL * 86400;  // 100 years; keeps time arithmetic safe

}  // namespace

std::string duration_error(std::string_view got) {
  return "must be a duration such as \"90s\", \"15m\", \"12h\" or \"30d\", or 0 for unlimited (got " +
         std::string(got) + ")";
}

// "90s", "15m", "12h", "30d", or "0". Returns the reason on failure.
std::string parse_duration(std::string_view text, std::chrono::seconds& out) {
  if (text == "0") {
    out = std::chrono::seconds(0);
    return {};
  }
  if (text.size() < 2) return duration_error(quote(text));
  std::int64_t unit = 0;
  switch (text.back()) {
    case 's': unit = 1; break;
    case 'm': unit = 60; break;
    case 'h': unit = 3600; break;
    case 'd': unit = 86400; break;
    default: return duration_error(quote(text));
  }
  std::string_view digits = text.substr(0, text.size() - 1);
  std::int64_t n = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
  if (ec == std::errc::result_out_of_range) {
    return "must be at most 36500d (got " + quote(text) + ")";
  }
  if (ec != std::errc() || ptr != digits.data() + digits.size() || n < 0) {
    return duration_error(quote(text));
  }
  if (n > kMaxAgeLimit / unit) return "must be at most 36500d (got " + quote(text) + ")";
  out = std::chrono::seconds(n * unit);
  return {};
}

std::string format_duration(std::chrono::seconds d) {
  std::int64_t s = d.count();
  if (s == 0) return "0";
  if (s % 86400 == 0) return std::to_string(s / 86400) + "d";
  if (s % 3600 == 0) return std::to_string(s / 3600) + "h";
  if (s % 60 == 0) return std::to_string(s / 60) + "m";
  return std::to_string(s) + "s";
}

std::string rows_error(std::string_view got) {
  return "must be an integer between 0 and " + std::to_string(INT64_MAX) + ", 0 for unlimited (got " +
         std::string(got) + ")";
}

std::string set_max_rows(Config& c, std::string_view text) {
  std::uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() ||
      v > static_cast<std::uint64_t>(INT64_MAX)) {
    return rows_error(quote(text));
  }
  c.audit.max_rows = v;
  return {};
}

namespace {
// An integer section setting between lo and hi. Returns the reason on failure.
std::string parse_section_int(std::string_view text, std::int64_t lo, std::int64_t hi, std::int64_t& out) {
  std::int64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || v < lo || v > hi)
    return "must be an integer between " + std::to_string(lo) + " and " + std::to_string(hi) + " (got " +
           quote(text.substr(0, 64)) + ")";
  out = v;
  return {};
}

#define FG_ADMIN_MS_FIELD(name, help)                                                    \
  SectionField {                                                                         \
    "admin." #name "_ms", JsonKind::integer,                                             \
        [](Config& c, std::string_view v) {                                              \
          std::int64_t ms = 0;                                                           \
          std::string err = parse_section_int(v, 1, kMaxMs, ms);                         \
          if (err.empty()) c.admin.name = std::chrono::milliseconds(ms);                 \
          return err;                                                                    \
        },                                                                               \
        [](const Config& c) { return std::to_string(c.admin.name.count()); }, "MS", help \
  }
#define FG_ADMIN_COUNT_FIELD(name, lo, help)                                    \
  SectionField {                                                                \
    "admin." #name, JsonKind::integer,                                          \
        [](Config& c, std::string_view v) {                                     \
          std::int64_t n = 0;                                                   \
          std::string err = parse_section_int(v, lo, 100'000, n);               \
          if (err.empty()) c.admin.name = static_cast<std::size_t>(n);          \
          return err;                                                           \
        },                                                                      \
        [](const Config& c) { return std::to_string(c.admin.name); }, "N", help \
  }

// Fleet (issue 27): a non-empty string setting of the fleet's etcd security (paths, the user).
#define FG_FLEET_STRING_FIELD(name, meta, help)                                                               \
  SectionField {                                                                                              \
    "fleet." #name, JsonKind::string,                                                                         \
        [](Config& c, std::string_view v) -> std::string {                                                    \
          if (v.empty()) return "must not be empty";                                                          \
          c.fleet.name = v;                                                                                   \
          return {};                                                                                          \
        },                                                                                                    \
        [](const Config& c) { return c.fleet.name.empty() ? std::string("none") : c.fleet.name; }, meta, help \
  }

// Fleet (issue 33): "name" and "member" are 1-64 of [A-Za-z0-9._-] (they are parts of etcd keys).
std::string set_fleet_id(std::string& out, std::string_view v) {
  if (v.empty() || v.size() > 64 || !std::all_of(v.begin(), v.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-';
      }))
    return "must be 1 to 64 characters of A-Z a-z 0-9 . _ - (got " + quote(v) + ")";
  out = std::string(v);
  return {};
}
// Fleet (issue 33): comma-separated http:// or https://host:port URLs (the JSON array is joined
// first). https (issue 27) takes fleet.cacert / cert / key.
std::string set_fleet_etcd(Config& c, std::string_view v) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= v.size()) {
    std::size_t comma = v.find(',', start);
    std::string_view item = v.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    const std::size_t scheme = item.starts_with("https://") ? 8 : item.starts_with("http://") ? 7 : 0;
    const std::size_t len =
        item.size() > scheme && item.back() == '/' ? item.size() - scheme - 1 : std::string_view::npos;
    Endpoint ep;
    if (scheme == 0 || item.size() > 512 || !parse_endpoint(item.substr(scheme, len), ep).empty())
      return "each endpoint must be http://host:port or https://host:port (got " + quote(item) + ")";
    out.emplace_back(item.back() == '/' ? item.substr(0, item.size() - 1) : item);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  c.fleet.etcd = std::move(out);
  return {};
}

const SectionField kSectionFieldRows[] = {
    {"admin.listen", JsonKind::string,
     [](Config& c, std::string_view v) { return parse_endpoint(v, c.admin.listen, 0, true); },
     [](const Config& c) { return quote(c.admin.listen.to_string()); }, "HOST:PORT",
     "admin API address; off loopback needs a token file"},
    {"admin.token_file", JsonKind::string,
     [](Config& c, std::string_view v) -> std::string {
       if (v.empty()) return "must not be empty";
       c.admin.token_file = v;
       return {};
     },
     [](const Config&) -> std::string { return "none"; }, "FILE",
     "admin API bearer token (16+ bytes; file mode 0600 or stricter), trimmed; re-read on reload"},
    FG_ADMIN_MS_FIELD(header_timeout, "admin API: total time for one request's head and body"),
    FG_ADMIN_MS_FIELD(write_timeout, "admin API: time to write one answer; over -> connection closed"),
    FG_ADMIN_COUNT_FIELD(max_connections, 1, "admin API connections; at the cap the longest-idle one is closed"),
    FG_ADMIN_COUNT_FIELD(max_connections_per_client, 1, "admin API connections per client address"),
    {"audit.max_age", JsonKind::duration,
     [](Config& c, std::string_view v) { return parse_duration(v, c.audit.max_age); },
     [](const Config& c) { return format_duration(c.audit.max_age); }, "AGE",
     "prune older audit rows: 90s, 15m, 12h, 30d; 0 = never"},
    {"audit.max_rows", JsonKind::integer, set_max_rows,
     [](const Config& c) { return std::to_string(c.audit.max_rows); }, "N",
     "keep at most N newest audit rows; 0 = unlimited"},
    // TLS on the data listener (issue 27, docs/tls.md).
    {"tls.cert", JsonKind::string,
     [](Config& c, std::string_view v) -> std::string {
       if (v.empty()) return "must not be empty";
       c.tls.cert = v;
       return {};
     },
     [](const Config&) -> std::string { return "none"; }, "FILE",
     "data listener TLS certificate chain (PEM); with tls.key the port speaks only TLS (docs/tls.md)"},
    {"tls.key", JsonKind::string,
     [](Config& c, std::string_view v) -> std::string {
       if (v.empty()) return "must not be empty";
       c.tls.key = v;
       return {};
     },
     [](const Config&) -> std::string { return "none"; }, "FILE", "private key of tls.cert (PEM)"},
    {"tls.client_ca", JsonKind::string,
     [](Config& c, std::string_view v) -> std::string {
       if (v.empty()) return "must not be empty";
       c.tls.client_ca = v;
       return {};
     },
     [](const Config&) -> std::string { return "none"; }, "FILE", "CA bundle (PEM) client certificates must chain to"},
    {"tls.client_auth", JsonKind::string,
     [](Config& c, std::string_view v) -> std::string {
       if (v == "none") c.tls.client_auth = ClientAuth::none;
       else if (v == "optional") c.tls.client_auth = ClientAuth::optional;
       else if (v == "required") c.tls.client_auth = ClientAuth::required;
       else return "must be one of none, optional, required (got " + quote(v) + ")";
       return {};
     },
     [](const Config& c) -> std::string {
       return c.tls.client_auth == ClientAuth::none       ? "none"
              : c.tls.client_auth == ClientAuth::optional ? "optional"
                                                          : "required";
     },
     "MODE", "client certificates: none | optional | required (needs tls.client_ca)"},
    {"tls.min_version", JsonKind::string,
     [](Config& c, std::string_view v) -> std::string {
       if (v != "1.2" && v != "1.3") return "must be \"1.2\" or \"1.3\" (got " + quote(v) + ")";
       c.tls.min_version = v;
       return {};
     },
     [](const Config& c) { return c.tls.min_version; }, "1.2|1.3", "lowest TLS version accepted"},
    {"tls.session_resumption", JsonKind::boolean,
     [](Config& c, std::string_view v) -> std::string {
       if (v != "true" && v != "false") return "must be true or false (got " + quote(v) + ")";
       c.tls.session_resumption = v == "true";
       return {};
     },
     [](const Config& c) -> std::string { return c.tls.session_resumption ? "true" : "false"; }, "true|false",
     "session tickets (a key per start or reload) and the session cache; false: every connection a full handshake"},
    // Issue 27 (tls-ctl): TLS on the admin listener, the keys of the top-level tls.
    {"admin.tls.cert", JsonKind::string,
     [](Config& c, std::string_view v) -> std::string {
       if (v.empty()) return "must not be empty";
       c.admin.tls.cert = v;
       return {};
     },
     [](const Config&) -> std::string { return "none"; }, "FILE",
     "admin API TLS certificate chain (PEM); with admin.tls.key the admin port speaks only TLS"},
    {"admin.tls.key", JsonKind::string,
     [](Config& c, std::string_view v) -> std::string {
       if (v.empty()) return "must not be empty";
       c.admin.tls.key = v;
       return {};
     },
     [](const Config&) -> std::string { return "none"; }, "FILE", "private key of admin.tls.cert (PEM)"},
    {"admin.tls.client_ca", JsonKind::string,
     [](Config& c, std::string_view v) -> std::string {
       if (v.empty()) return "must not be empty";
       c.admin.tls.client_ca = v;
       return {};
     },
     [](const Config&) -> std::string { return "none"; }, "FILE",
     "CA bundle (PEM) admin API client certificates must chain to"},
    {"admin.tls.client_auth", JsonKind::string,
     [](Config& c, std::string_view v) -> std::string {
       if (v == "none") c.admin.tls.client_auth = ClientAuth::none;
       else if (v == "optional") c.admin.tls.client_auth = ClientAuth::optional;
       else if (v == "required") c.admin.tls.client_auth = ClientAuth::required;
       else return "must be one of none, optional, required (got " + quote(v) + ")";
       return {};
     },
     [](const Config& c) -> std::string {
       return c.admin.tls.client_auth == ClientAuth::none       ? "none"
              : c.admin.tls.client_auth == ClientAuth::optional ? "optional"
                                                                : "required";
     },
     "MODE", "admin API client certificates: none | optional | required (needs admin.tls.client_ca)"},
    {"admin.tls.min_version", JsonKind::string,
     [](Config& c, std::string_view v) -> std::string {
       if (v != "1.2" && v != "1.3") return "must be \"1.2\" or \"1.3\" (got " + quote(v) + ")";
       c.admin.tls.min_version = v;
       return {};
     },
     [](const Config& c) { return c.admin.tls.min_version; }, "1.2|1.3", "admin API: lowest TLS version accepted"},
    // Fleet (issue 33, docs/fleet.md)
    {"fleet.etcd", JsonKind::string, set_fleet_etcd,
     [](const Config& c) -> std::string {
       std::string out;
       for (const auto& e : c.fleet.etcd) out += (out.empty() ? "" : ",") + e;
       return out.empty() ? "none" : out;
     },
     "URLS",
     "fleet: etcd endpoints, http://host:port or https://host:port, comma separated (JSON: an array); enables the "
     "fleet"},
    {"fleet.name", JsonKind::string, [](Config& c, std::string_view v) { return set_fleet_id(c.fleet.name, v); },
     [](const Config& c) { return c.fleet.name.empty() ? std::string("none") : c.fleet.name; }, "NAME",
     "fleet: the fleet's name (keys under fencegate/fleet/NAME/)"},
    {"fleet.member", JsonKind::string, [](Config& c, std::string_view v) { return set_fleet_id(c.fleet.member, v); },
     [](const Config& c) { return c.fleet.member.empty() ? std::string("none") : c.fleet.member; }, "ID",
     "fleet: this replica's member id, unique in the fleet"},
    {"fleet.ttl_ms", JsonKind::integer,
     [](Config& c, std::string_view v) {
       std::int64_t ms = 0;
       std::string err = parse_section_int(v, 2000, 600'000, ms);
       if (err.empty()) c.fleet.ttl = std::chrono::milliseconds(ms);
       return err;
     },
     [](const Config& c) { return std::to_string(c.fleet.ttl.count()); }, "MS",
     "fleet: membership lease TTL in ms (2000..600000)"},
    // Issue 27: the fleet's etcd over https and etcd users (the keys of a route authority).
    FG_FLEET_STRING_FIELD(cacert, "FILE", "fleet: CA bundle (PEM) etcd's https certificate must chain to"),
    FG_FLEET_STRING_FIELD(cert, "FILE", "fleet: client certificate (PEM) for an etcd with --client-cert-auth"),
    FG_FLEET_STRING_FIELD(key, "FILE", "fleet: private key of fleet.cert (PEM)"),
    FG_FLEET_STRING_FIELD(user, "NAME",
                          "fleet: etcd user (password from fleet.password_file or FENCEGATE_ETCD_PASSWORD)"),
    FG_FLEET_STRING_FIELD(password_file, "FILE",
                          "fleet: file holding fleet.user's etcd password (mode 0600 or stricter)"),
};

#undef FG_ADMIN_MS_FIELD
#undef FG_ADMIN_COUNT_FIELD
#undef FG_FLEET_STRING_FIELD

const char* const kSectionNames[] = {"admin", "audit", "tls", "fleet"};

}  // namespace

const std::span<const NumField> kNumFields(kNumFieldRows);
const std::span<const StrField> kStrFields(kStrFieldRows);
const std::span<const SectionField> kSectionFields(kSectionFieldRows);
const std::span<const char* const> kSections(kSectionNames);

// 127.0.0.0/8, ::1 (and ::ffff:127.0.0.0/104), or "localhost". Other names count as non-loopback.
bool is_loopback_host(const std::string& host) {
  std::string h = lower(host);
  if (h == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, h.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, h.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

std::string mode_error(std::string_view got) { return "must be one of enforce, observe, off (got " + quote(got) + ")"; }

std::string grace_error(std::string_view got) {
  return "must be 0 (the leader's lease TTL) or an integer between " + std::to_string(kMinGraceMs) + " and " +
         std::to_string(kMaxMs) + " (milliseconds; shorter windows would fail closed with etcd healthy) (got " +
         std::string(got) + ")";
}

}  // namespace detail

using namespace detail;

std::string_view to_string(Mode m) {
  switch (m) {
    case Mode::enforce: return "enforce";
    case Mode::observe: return "observe";
    case Mode::off: return "off";
  }
  return "?";
}

std::optional<Mode> parse_mode(std::string_view s) {
  if (s == "enforce") return Mode::enforce;
  if (s == "observe") return Mode::observe;
  if (s == "off") return Mode::off;
  return std::nullopt;
}

std::string Endpoint::to_string() const {
  std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return h + ":" + std::to_string(port);
}

// TLS (issue 27): an empty identity (no verified client certificate) matches nothing.
bool client_allowed(const std::vector<std::string>& patterns, std::string_view identity) {
  if (identity.empty()) return false;
  for (const std::string& p : patterns) {
    if (!p.empty() && p.back() == '*') {
      if (identity.starts_with(std::string_view(p).substr(0, p.size() - 1))) return true;
    } else if (identity == p) {
      return true;
    }
  }
  return false;
}

// Issue 30 (idempotency): the methods a route keys by operation ID.
bool Route::is_keyed(std::string_view method) const {
  if (!idempotency || mode == Mode::off) return false;
  if (idempotency->methods.empty()) return is_fenced(method);
  for (const auto& m : idempotency->methods)
    if (m == method) return is_fenced(method);
  return false;
}

bool Route::is_fenced(std::string_view method) const {
  if (fence_reads) return true;
  // Case-insensitive on purpose: methods are case-sensitive on the wire, but some upstreams
  // compare them without case, and "post" must not slip past the fence as a read there.
  auto same = [&](const std::string& m) {
    if (m.size() != method.size()) return false;
    for (std::size_t i = 0; i < m.size(); ++i)
      if (std::tolower(static_cast<unsigned char>(m[i])) != std::tolower(static_cast<unsigned char>(method[i])))
        return false;
    return true;
  };
  return std::any_of(write_methods.begin(), write_methods.end(), same);
}

std::string Authority::id() const {
  std::string s = "etcd=";
  for (std::size_t i = 0; i < etcd.size(); ++i) s += (i ? "," : "") + etcd[i];
  if (!coordinator.empty()) s += " coordinator=" + coordinator;  // issue 31
  if (!auth_file.empty()) s += " auth_file=" + quote(auth_file);
  if (poll.count() > 0) s += " poll_ms=" + std::to_string(poll.count());  // issue 31
  // Issue 27 (tls-ctl): etcd TLS files and user.
  if (!cacert.empty()) s += " cacert=" + quote(cacert);
  if (!cert.empty()) s += " cert=" + quote(cert);
  if (!key.empty()) s += " key=" + quote(key);
  if (!user.empty()) s += " user=" + quote(user);
  if (!password_file.empty()) s += " password_file=" + quote(password_file);
  s += " election=" + quote(election) + " grace_ms=" + std::to_string(grace.count());
  return s;
}

std::string serve_usage() {
  const Config d;
  std::ostringstream o;
  o << "Usage: fencegate serve [--config FILE | --upstream URL] [flags]\n"
       "\n"
       "Runs the fencing proxy. Settings come from (highest first) flags, FENCEGATE_* environment\n"
       "variables, the JSON config file, and built-in defaults. Flags take \"--flag value\" or\n"
       "\"--flag=value\".\n"
       "\n"
       "Routing:\n"
       "  --config FILE          JSON config file with routes and settings      env FENCEGATE_CONFIG\n"
       "  --upstream URL         flag-only form: one route \"/\" to http://host[:port] or\n"
       "                         https://host[:port] (port 443 by default)\n"
       "                                                                        env FENCEGATE_UPSTREAM\n"
       "  --resource NAME        resource fenced by that route (default \"default\")\n"
       "                                                                        env FENCEGATE_RESOURCE\n"
       "  --mode MODE            enforce, observe or off (default enforce)      env FENCEGATE_MODE\n"
       "  --authority-etcd URLS  flag-only form: comma-separated etcd endpoints (http://host:port)\n"
       "                         whose election decides who may write (authority-linked fencing)\n"
       "                                                                        env FENCEGATE_AUTHORITY_ETCD\n"
       "  --authority-election NAME  the election's name (its keys are NAME/<lease>); both or neither\n"
       "                                                                        env FENCEGATE_AUTHORITY_ELECTION\n"
       "  --authority-grace-ms N while etcd is unreachable, accept the leader for at most N ms\n"
       "                         (if below its lease TTL; default 0 = the TTL), then 503\n"
       "                                                                        env FENCEGATE_AUTHORITY_GRACE_MS\n"
       // TLS to the upstream (issue 27)
       "  --upstream-ca FILE     https upstream: PEM CAs to verify it with (default: the system's)\n"
       "                                                                        env FENCEGATE_UPSTREAM_CA\n"
       "  --upstream-cert FILE   https upstream: client certificate chain (PEM), with --upstream-key\n"
       "                                                                        env FENCEGATE_UPSTREAM_CERT\n"
       "  --upstream-key FILE    https upstream: the client certificate's private key (PEM)\n"
       "                                                                        env FENCEGATE_UPSTREAM_KEY\n"
       "  --upstream-server-name NAME  https upstream: name sent (SNI) and checked (default: its host)\n"
       "                                                                        env FENCEGATE_UPSTREAM_SERVER_NAME\n"
       "  --upstream-verify true|false  https upstream: verify its certificate (default true; false\n"
       "                         logs a warning at start)                       env FENCEGATE_UPSTREAM_VERIFY\n"
       "  (--upstream, --resource, --mode, --authority-* and --upstream-* cannot be combined with --config: the\n"
       "   file's routes set them.)\n"
       "\n"
       "Settings (each also a JSON key of the same name with '_' for '-'):\n";
  auto line = [&](const std::string& flag_arg, const std::string& help, const std::string& def,
                  const std::string& env) {
    o << "  " << flag_arg;
    if (flag_arg.size() < 34) o << std::string(34 - flag_arg.size(), ' ');
    o << help << " (default " << def << ")\n" << std::string(36, ' ') << "env " << env << "\n";
  };
  for (const StrField& f : kStrFields) {
    line(flag_of(f.key) + " VALUE", f.help, quote(f.get(d)), env_of(f.key));
  }
  for (const NumField& f : kNumFields) {
    std::string def = std::to_string(f.get(d));
    if (std::strcmp(f.key, "threads") == 0) def = "0";
    line(flag_of(f.key) + " N", std::string(f.help) + "; " + std::to_string(f.min) + ".." + std::to_string(f.max), def,
         env_of(f.key));
  }
  o << "\n"
       "Admin API and audit retention (JSON: \"admin\": {\"listen\", \"token_file\"},\n"
       "\"audit\": {\"max_age\", \"max_rows\"}):\n";
  for (const SectionField& f : kSectionFields) {
    line(flag_of(f.key) + " " + f.arg, f.help, f.get(d), env_of(f.key));
  }
  o << "\n"
       "  -h, --help                        show this help\n"
       "\n"
       "JSON config file: an object with the keys above (listen, db, threads, ...) and \"routes\",\n"
       "an array of {\"prefix\", \"upstream\", \"resource\", \"mode\", \"write_methods\", \"fence_reads\",\n"
       "\"authority\"}; an https:// upstream also takes \"upstream_ca\", \"upstream_cert\", \"upstream_key\",\n"
       "\"upstream_server_name\" and \"upstream_verify\" (docs/tls.md).\n"
       "prefix and upstream are required; resource defaults to \"default\", mode to \"enforce\",\n"
       "write_methods to [\"POST\",\"PUT\",\"PATCH\",\"DELETE\"], fence_reads to false. A prefix may\n"
       "capture whole path segments, e.g. \"/tenants/{tenant}/\" with resource \"tenant-{tenant}\";\n"
       "the longest matching prefix wins. Unknown keys are errors, also inside \"admin\", \"audit\"\n"
       "and \"authority\".\n"
       "\"authority\": {\"etcd\": [\"http://127.0.0.1:2379\"], \"election\": \"billing\", \"grace_ms\": 0}\n"
       "admits only the generation of the election's current leader key (its create_revision):\n"
       "other generations get 409 (rejected_stale, rejected_not_leader,\n"
       "rejected_unknown_generation); a new leader's generation is fenced in as soon as etcd\n"
       "shows it; with etcd unreachable the leader is accepted for at most its lease TTL (or\n"
       "grace_ms if smaller) since the last contact, then writes get 503. Changing authorities\n"
       "needs a restart.\n"
       "  {\"listen\": \"0.0.0.0:8080\", \"db\": \"/var/lib/fencegate/fence.db\",\n"
       "   \"admin\": {\"listen\": \"0.0.0.0:9901\", \"token_file\": \"/etc/fencegate/admin.token\"},\n"
       "   \"audit\": {\"max_age\": \"30d\", \"max_rows\": 1000000},\n"
       "   \"routes\": [{\"prefix\": \"/tenants/{tenant}/\", \"upstream\": \"http://127.0.0.1:9000\",\n"
       "                \"resource\": \"tenant-{tenant}\"}]}\n";
  return o.str();
}

}  // namespace fencegate::config
