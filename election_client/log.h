// A tiny JSON-lines logger for `fencegate elect` / `fencegate leader`: one object per line on
// stderr with ts (UTC, ms), level, msg and fields -- the same shape as proxy/log.h, kept local so
// election_client does not depend on the proxy.
//
// Thread-safe (one write(2) per line).
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>

namespace fencegate::election::log {

enum class Level { debug = 0, info = 1, warn = 2, error = 3 };
void set_level(Level l);

struct Field {
  std::string_view key;
  std::string value;
  bool raw = false;  // emitted as is (numbers, booleans)
};
inline Field kv(std::string_view k, std::string_view v) { return {k, std::string(v), false}; }
inline Field kv(std::string_view k, const std::string& v) { return {k, v, false}; }
inline Field kv(std::string_view k, const char* v) { return {k, std::string(v), false}; }
inline Field kv(std::string_view k, bool b) { return {k, b ? "true" : "false", true}; }
template <class N>
Field kv(std::string_view k, N n) requires(std::is_arithmetic_v<N> && !std::is_same_v<N, bool>) {
  return {k, std::to_string(n), true};
}

void write(Level l, std::string_view msg, std::initializer_list<Field> fields = {});
inline void debug(std::string_view m, std::initializer_list<Field> f = {}) { write(Level::debug, m, f); }
inline void info(std::string_view m, std::initializer_list<Field> f = {}) { write(Level::info, m, f); }
inline void warn(std::string_view m, std::initializer_list<Field> f = {}) { write(Level::warn, m, f); }
inline void error(std::string_view m, std::initializer_list<Field> f = {}) { write(Level::error, m, f); }

std::string json_quote(std::string_view s);

}  // namespace fencegate::election::log
