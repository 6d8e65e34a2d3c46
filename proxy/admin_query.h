// The admin API's query strings: percent-decoding, the parameters (a repeated one is refused),
// and typed parameters (integers in a range, times). No I/O.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace fencegate::proxy {

// Percent-decodes `s` ('+' is a space); *ok false on a bad escape.
std::string pct_decode(std::string_view s, bool* ok);

// Query parameters; one given more than once is refused (*error set, empty result).
std::map<std::string, std::string> parse_query(std::string_view q, std::string* error);

// The parameter `key` as an integer in lo..hi (digits only), into *out; absent or empty: true,
// *out unchanged. False with *err set if it is not one.
bool parse_int_param(const std::map<std::string, std::string>& q, const char* key, std::int64_t lo, std::int64_t hi,
                     std::int64_t* out, std::string* err);

// The parameter `key` as a time (RFC 3339, relative, or unix milliseconds) in unix ms, as above.
bool parse_time_param(const std::map<std::string, std::string>& q, const char* key, std::int64_t* out,
                      std::string* err);

// The parameter's value ("" if absent).
std::string param(const std::map<std::string, std::string>& q, const char* key);

}  // namespace fencegate::proxy
