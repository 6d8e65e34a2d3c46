// Internal to the config library: the settings' tables and the helpers its loaders share
// (config.cpp, config_file.cpp, env_flags.cpp, validate.cpp). Not for use outside config/.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"

namespace fencegate::config::detail {

std::string quote(std::string_view s);
std::string lower(std::string_view s);
// RFC 9110 token (header field names, methods).
bool is_token(std::string_view s);
bool is_upper_method(std::string_view s);

// Parses "host:port", "[v6]:port". With default_port, the ":port" part is optional. With
// allow_port_zero (listeners), port 0 means "any free port, chosen by the OS".
// Returns an empty string on success, else the reason.
std::string parse_endpoint(std::string_view s, Endpoint& out, int default_port = 0, bool allow_port_zero = false);

// Parses "http://host[:port][/]". Returns an empty string on success, else the reason.
std::string parse_upstream(std::string_view url, Endpoint& out);
// A route's upstream (issue 27): "http://host[:port][/]" or "https://host[:port][/]" (port 443 by
// default); *tls says which. Returns an empty string on success, else the reason.
std::string parse_route_upstream(std::string_view url, Endpoint& out, bool* tls);

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

extern const std::span<const NumField> kNumFields;

std::string range_error(const NumField& f, std::string_view got);
// Sets a numeric field; threads also accepts 0 ("hardware threads"). Returns the reason on failure.
std::string set_num(Config& c, const NumField& f, std::int64_t v, std::string_view got);
std::string set_num_text(Config& c, const NumField& f, std::string_view text);

// "" if `s` is a log level, else the reason (config.cpp).
std::string check_log_level(std::string_view s);
std::string check_header_name(std::string_view s);

struct StrField {
  const char* key;
  std::string (*set)(Config&, std::string_view);  // returns the reason on failure
  std::string (*get)(const Config&);
  const char* help;
};

extern const std::span<const StrField> kStrFields;

// "max_body_bytes" -> "--max-body-bytes"; "admin.token_file" -> "--admin-token-file".
std::string flag_of(std::string_view key);
// "max_body_bytes" -> "FENCEGATE_MAX_BODY_BYTES"; "admin.token_file" -> "FENCEGATE_ADMIN_TOKEN_FILE".
std::string env_of(std::string_view key);

// --- Sectioned settings: JSON "admin": {...} and "audit": {...}; flags --admin-*, --audit-*. ---

std::string duration_error(std::string_view got);
// "90s", "15m", "12h", "30d", or "0". Returns the reason on failure.
std::string parse_duration(std::string_view text, std::chrono::seconds& out);
std::string format_duration(std::chrono::seconds d);
std::string rows_error(std::string_view got);
std::string set_max_rows(Config& c, std::string_view text);

// What a section field accepts in JSON (flags and env always give text).
enum class JsonKind { string, integer, duration, boolean };

struct SectionField {
  const char* key;  // "admin.listen": JSON "admin": {"listen": ...}, --admin-listen, FENCEGATE_ADMIN_LISTEN
  JsonKind kind;
  std::string (*set)(Config&, std::string_view);  // from text; returns the reason on failure
  std::string (*get)(const Config&);              // for usage's defaults
  const char* arg;                                // usage's placeholder
  const char* help;
};

extern const std::span<const SectionField> kSectionFields;
extern const std::span<const char* const> kSections;  // "admin", "audit"

// 127.0.0.0/8, ::1 (and ::ffff:127.0.0.0/104), or "localhost". Other names count as non-loopback.
bool is_loopback_host(const std::string& host);
std::string mode_error(std::string_view got);

// The authority probes etcd at least every 50 ms: a window shorter than a few probes would fail
// closed with etcd healthy.
constexpr std::int64_t kMinGraceMs = 200;
std::string grace_error(std::string_view got);

// --- Shared by the loaders (config_file.cpp) ---

// Reads the JSON document into `c` without validating the whole. Returns false if the document
// could not be parsed at all (then validating would only add noise).
bool parse_json_into(Config& c, std::string_view text, std::string_view source, std::vector<std::string>& errors);

// Reads a whole file into `out`; returns an empty string on success, else the errno text.
std::string read_file(const std::string& path, std::string& out);

// The result for `c` and its errors: the config if there are none, else the errors, only the
// first one for each field path (a value both mistyped and hence missing is reported once).
LoadResult finish(Config c, std::vector<std::string> errors);

}  // namespace fencegate::config::detail
