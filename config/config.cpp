#include "config/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>  // environ

#include <nlohmann/json.hpp>

#include "common/log.h"
#include "config/router.h"

namespace fencegate::config {

namespace {

using json = nlohmann::json;

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
std::string parse_endpoint(std::string_view s, Endpoint& out, int default_port = 0,
                           bool allow_port_zero = false) {
  const std::string expected = default_port ? "expected \"host[:port]\"" : "expected \"host:port\"";
  std::string host;
  std::string_view rest;
  if (!s.empty() && s[0] == '[') {
    std::size_t close = s.find(']');
    if (close == std::string_view::npos || close == 1) return expected + " (got " + quote(s) + ")";
    host = std::string(s.substr(1, close - 1));
    for (char c : host) {
      bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') ||
                c == ':' || c == '.';
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
      bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '-' || c == '_';
      if (!ok) return "bad host name " + quote(host);
    }
  }
  int port = default_port;
  if (!rest.empty()) {
    if (rest[0] != ':') return expected + " (got " + quote(s) + ")";
    std::string_view digits = rest.substr(1);
    auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), port);
    if (digits.empty() || digits.size() > 5 || ec != std::errc() ||
        ptr != digits.data() + digits.size() || port < (allow_port_zero ? 0 : 1) || port > 65535) {
      return allow_port_zero
                 ? "port must be between 0 and 65535, 0 meaning any free port (got " + quote(digits) + ")"
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

// --- Field tables: one row per scalar setting, shared by the JSON, env and flag loaders. ---

struct NumField {
  const char* key;  // JSON key; flag is "--" + key with '-' for '_'; env is FENCEGATE_ + KEY
  std::int64_t min;
  std::int64_t max;
  std::int64_t (*get)(const Config&);
  void (*set)(Config&, std::int64_t);
  const char* help;
};

constexpr std::int64_t kMaxMs = 86'400'000;

#define FG_SIZE_FIELD(name, lo, hi, help)                                                 \
  NumField {                                                                              \
    #name, lo, hi, [](const Config& c) { return static_cast<std::int64_t>(c.name); },     \
        [](Config& c, std::int64_t v) { c.name = static_cast<decltype(c.name)>(v); }, help \
  }
#define FG_MS_FIELD(name, help)                                                                   \
  NumField {                                                                                      \
    #name "_ms", 1, kMaxMs, [](const Config& c) { return static_cast<std::int64_t>(c.name.count()); }, \
        [](Config& c, std::int64_t v) { c.name = std::chrono::milliseconds(v); }, help            \
  }

const NumField kNumFields[] = {
    FG_SIZE_FIELD(threads, 1, 256, "I/O threads; 0 means one per hardware thread"),
    FG_SIZE_FIELD(max_connections, 1, 1'000'000, "concurrent client connections"),
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

struct StrField {
  const char* key;
  std::string (*set)(Config&, std::string_view);  // returns the reason on failure
  std::string (*get)(const Config&);
  const char* help;
};

const StrField kStrFields[] = {
    {"listen",
     [](Config& c, std::string_view v) { return parse_endpoint(v, c.listen, 0, true); },
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

constexpr std::int64_t kMaxAgeLimit = 36500LL * 86400;  // 100 years; keeps time arithmetic safe

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

// What a section field accepts in JSON (flags and env always give text).
enum class JsonKind { string, integer, duration };

struct SectionField {
  const char* key;  // "admin.listen": JSON "admin": {"listen": ...}, --admin-listen, FENCEGATE_ADMIN_LISTEN
  JsonKind kind;
  std::string (*set)(Config&, std::string_view);  // from text; returns the reason on failure
  std::string (*get)(const Config&);              // for usage's defaults
  const char* arg;                                // usage's placeholder
  const char* help;
};

const SectionField kSectionFields[] = {
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
     "admin API bearer token, trimmed; re-read on reload"},
    {"audit.max_age", JsonKind::duration,
     [](Config& c, std::string_view v) { return parse_duration(v, c.audit.max_age); },
     [](const Config& c) { return format_duration(c.audit.max_age); }, "AGE",
     "prune older audit rows: 90s, 15m, 12h, 30d; 0 = never"},
    {"audit.max_rows", JsonKind::integer, set_max_rows,
     [](const Config& c) { return std::to_string(c.audit.max_rows); }, "N",
     "keep at most N newest audit rows; 0 = unlimited"},
};

const char* const kSections[] = {"admin", "audit"};

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

std::string mode_error(std::string_view got) {
  return "must be one of enforce, observe, off (got " + quote(got) + ")";
}

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
        if (parsed.is_string() && parsed.get_ref<const std::string&>().find('\0') != std::string::npos && !stack_.empty()) {
          const Frame& top = stack_.back();
          errors_->push_back((top.array ? top.path + "[" + std::to_string(top.next_index) + "]" : join(top.path, top.last_key)) +
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

bool get_string(const json& j, const std::string& path, std::string& out,
                std::vector<std::string>& errors) {
  if (!j.is_string()) {
    errors.push_back(path + ": must be a string (got " + got(j) + ")");
    return false;
  }
  out = j.get<std::string>();
  return true;
}

// The authority probes etcd at least every 50 ms: a window shorter than a few probes would fail
// closed with etcd healthy.
constexpr std::int64_t kMinGraceMs = 200;

std::string grace_error(std::string_view got) {
  return "must be 0 (the leader's lease TTL) or an integer between " + std::to_string(kMinGraceMs) + " and " +
         std::to_string(kMaxMs) + " (milliseconds; shorter windows would fail closed with etcd healthy) (got " +
         std::string(got) + ")";
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
  if (!has_etcd) errors.push_back(path + ".etcd: required");
  if (!has_election) errors.push_back(path + ".election: required");
  return a;
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
    } else {
      errors.push_back(fp + ": unknown key");
    }
  }
  return r;
}

// Reads one "admin"/"audit" object into `c`.
void parse_section(Config& c, const std::string& section, const json& j, std::vector<std::string>& errors) {
  if (!j.is_object()) {
    errors.push_back(section + ": must be an object (got " + got(j) + ")");
    return;
  }
  for (const auto& [key, v] : j.items()) {
    std::string path = section + "." + key;
    auto f = std::find_if(std::begin(kSectionFields), std::end(kSectionFields),
                          [&](const SectionField& sf) { return path == sf.key; });
    if (f == std::end(kSectionFields)) {
      errors.push_back(path + ": unknown key");
      continue;
    }
    std::string text;
    switch (f->kind) {
      case JsonKind::string:
        if (!get_string(v, path, text, errors)) continue;
        break;
      case JsonKind::integer:
        if (!v.is_number_integer() || (v.is_number_unsigned() ? v.get<std::uint64_t>() > INT64_MAX
                                                               : v.get<std::int64_t>() < 0)) {
          errors.push_back(path + ": " + rows_error(got(v)));
          continue;
        }
        text = got(v);
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

// Reads the JSON document into `c` without validating the whole. Returns false if the document
// could not be parsed at all (then validating would only add noise).
bool parse_json_into(Config& c, std::string_view text, std::string_view source,
                     std::vector<std::string>& errors) {
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
    errors.push_back(std::string(source) + ": invalid JSON (byte " + std::to_string(e.byte) +
                     "): " + what);
    return false;
  } catch (const json::exception& e) {
    // e.g. a number out of range (1e400): still a bad file, never a crash (a reload must survive it).
    std::string what = e.what();
    if (auto p = what.find("] "); what.rfind("[json.exception.", 0) == 0 && p != std::string::npos) {
      what = what.substr(p + 2);
    }
    errors.push_back(std::string(source) + ": invalid JSON" + (where.empty() ? std::string() : " in " + where) + ": " + what);
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
    auto num = std::find_if(std::begin(kNumFields), std::end(kNumFields),
                            [&](const NumField& f) { return key == f.key; });
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
    auto str = std::find_if(std::begin(kStrFields), std::end(kStrFields),
                            [&](const StrField& f) { return key == f.key; });
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

const char* process_env(const char* name) { return std::getenv(name); }

// Reads a whole file; returns an empty string on success, else the errno text.
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

}  // namespace

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

namespace {

// Checks (and normalises) an authority; errors are named under `path` ("routes[0].authority").
void check_authority(Authority& a, const std::string& path, std::vector<std::string>& errors) {
  if (a.etcd.empty()) errors.push_back(path + ".etcd: must list at least one etcd URL");
  std::vector<std::string> norm;
  for (std::size_t i = 0; i < a.etcd.size(); ++i) {
    Endpoint ep;
    if (auto e = parse_upstream(a.etcd[i], ep); !e.empty()) {
      errors.push_back(path + ".etcd[" + std::to_string(i) + "]: must be an etcd client URL \"http://host:port\" (got " +
                       quote(a.etcd[i]) + ")");
      continue;
    }
    std::string u = "http://" + ep.to_string();
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

}  // namespace

void validate(Config& c, std::vector<std::string>& errors) {
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
    if (std::string err = read_file(c.admin.token_file, text); !err.empty()) {
      errors.push_back("admin.token_file: cannot read " + c.admin.token_file + ": " + err);
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
      } else {
        c.admin.token = std::move(token);
      }
    }
  } else if (!c.admin.listen.host.empty() && c.admin.token.empty() &&
             !is_loopback_host(c.admin.listen.host)) {
    // (A Config built in code may set admin.token directly; the loaders only fill it from the file.)
    errors.push_back("admin.listen: binding the admin API to a non-loopback address (" +
                     c.admin.listen.host + ") requires admin.token_file");
  }
  auto wildcard = [](const std::string& h) { return h == "0.0.0.0" || h == "::" || h == "[::]"; };
  if (!c.listen.host.empty() && c.listen.port != 0 && c.admin.listen.port == c.listen.port &&
      (lower(c.admin.listen.host) == lower(c.listen.host) || wildcard(c.listen.host) || wildcard(c.admin.listen.host))) {
    if (lower(c.admin.listen.host) == lower(c.listen.host))
      errors.push_back("admin.listen: must differ from listen (both are " + quote(c.listen.to_string()) + ")");
    else
      errors.push_back("admin.listen: must differ from listen (" + quote(c.admin.listen.to_string()) + " and " +
                       quote(c.listen.to_string()) + ": a wildcard address takes port " + std::to_string(c.listen.port) +
                       " on every address)");
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
        errors.push_back(name + ".prefix: same as routes[" + std::to_string(it->second) +
                         "].prefix (" + quote(c.routes[it->second].prefix) + ")");
      }
    }
    if (r.upstream.empty()) {
      errors.push_back(name + ".upstream: required");
    } else if (auto e = parse_upstream(r.upstream, r.upstream_addr); !e.empty()) {
      errors.push_back(name + ".upstream: " + e);
    }
    if (r.write_methods.empty()) {
      errors.push_back(name + ".write_methods: must list at least one method");
    }
    for (std::size_t m = 0; m < r.write_methods.size(); ++m) {
      if (!is_upper_method(r.write_methods[m])) {
        errors.push_back(name + ".write_methods[" + std::to_string(m) +
                         "]: must be an upper-case HTTP method such as \"POST\" (got " +
                         quote(r.write_methods[m]) + ")");
      }
    }
    if (r.authority) check_authority(*r.authority, name + ".authority", errors);
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
      auto endpoints = [](const Route& r) { return std::set<std::string>(r.authority->etcd.begin(), r.authority->etcd.end()); };
      const bool same_authority =
          ri.authority ? (rj.authority && ri.authority->election == rj.authority->election && endpoints(ri) == endpoints(rj))
                       : !rj.authority;
      if ((ri.mode == rj.mode && same_authority) || !resource_templates_overlap(ri.resource, rj.resource)) continue;
      // "/tenants/{t}/" -> "tenant-{t}" beside "/tenants/acme/" -> "tenant-acme": every path that
      // would give the template route that name goes to the literal one (one tenant migrated to
      // enforce, or to its own election, ahead of the others).
      if (literal_route_takes_resource(ri, rj) || literal_route_takes_resource(rj, ri)) continue;
      const std::string both = "its resource " + quote(rj.resource) + " can be the resource " + quote(ri.resource) +
                               " of routes[" + std::to_string(i) + "] (" + quote(ri.prefix) + ")";
      if (ri.mode != rj.mode)
        errors.push_back("routes[" + std::to_string(j) + "].mode: " + std::string(to_string(rj.mode)) + ", but " + both +
                         ", which is " + std::string(to_string(ri.mode)) +
                         "d; a resource is fenced in one mode: give both routes the same mode, or different resources");
      else
        errors.push_back("routes[" + std::to_string(j) + "].authority: " + authority_of(rj) + ", but " + both +
                         ", fenced under " + authority_of(ri) +
                         "; a resource has one authority: give both routes the same one, or different resources");
      break;
    }
  }
}

std::string Authority::id() const {
  std::string s = "etcd=";
  for (std::size_t i = 0; i < etcd.size(); ++i) s += (i ? "," : "") + etcd[i];
  s += " election=" + quote(election) + " grace_ms=" + std::to_string(grace.count());
  return s;
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
    if (!a.count(prefix)) check(("routes[prefix " + quote(prefix) + "].authority").c_str(), "none", id);
  return errors;
}

LoadResult load_json(std::string_view json_text, std::string_view source) {
  Config c;
  std::vector<std::string> errors;
  if (parse_json_into(c, json_text, source, errors)) validate(c, errors);
  return finish(std::move(c), std::move(errors));
}

namespace {

// Every flag `fencegate serve` takes, by canonical name ("--threads").
std::set<std::string> serve_flags() {
  std::set<std::string> known = {"--config", "--upstream", "--resource", "--mode", "--authority-etcd",
                                 "--authority-election", "--authority-grace-ms"};
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
    if (name.rfind("FENCEGATE_", 0) != 0 || known.count(name)) continue;
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

  // 1. Flags, by canonical name ("--threads" -> "10"); the last occurrence wins.
  const std::set<std::string> known = serve_flags();
  std::map<std::string, std::string> flags;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") {
      LoadResult r;
      r.help = true;
      return r;
    }
    if (a.rfind("--", 0) != 0) {
      errors.push_back("unexpected argument " + quote(a) + " (flags look like --name value)");
      continue;
    }
    std::size_t eq = a.find('=');
    std::string name = a.substr(0, eq);
    if (!known.count(name)) {
      errors.push_back(name + ": unknown flag (see --help)");
      continue;
    }
    if (eq != std::string::npos && eq + 1 < a.size()) {
      flags[name] = a.substr(eq + 1);
    } else if (eq != std::string::npos) {
      errors.push_back(name + ": missing value");
    } else if (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
      flags[name] = args[++i];
    } else {
      errors.push_back(name + ": missing value");
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
    auto it = flags.find(flag);
    if (it == flags.end()) return std::nullopt;
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
  if (config_file) {
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
        errors.push_back((auth_election ? auth_election : auth_grace)->source + ": needs " +
                         flag_of("authority_etcd") + " too (or " + env_of("authority_etcd") + ")");
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
        for (const auto& [field, given] : {std::pair{"routes[0].upstream: ", upstream},
                                           std::pair{"routes[0].resource: ", resource},
                                           std::pair{"routes[0].authority.etcd", auth_etcd},
                                           std::pair{"routes[0].authority.election: ", auth_election},
                                           std::pair{"routes[0].authority.grace_ms: ", auth_grace}}) {
          std::string_view f = field;
          if (given && errors[i].rfind(f, 0) == 0) {
            // "routes[0].authority.etcd[1]: ..." -> "--authority-etcd: ..." (the message quotes the URL).
            std::string rest = errors[i].substr(f.size());
            if (rest.rfind(": ", 0) == 0) rest = rest.substr(2);
            if (rest.rfind("[", 0) == 0 && rest.find("]: ") != std::string::npos) rest = rest.substr(rest.find("]: ") + 3);
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
       "  --upstream URL         flag-only form: one route \"/\" to http://host[:port]\n"
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
       "  (--upstream, --resource, --mode and --authority-* cannot be combined with --config: the\n"
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
    line(flag_of(f.key) + " N", std::string(f.help) + "; " + std::to_string(f.min) + ".." + std::to_string(f.max),
         def, env_of(f.key));
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
       "\"authority\"}.\n"
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
