// Logging: one JSON object per line on stderr, with ts (UTC, ms), level, msg and fields. The one
// logger of every fencegate command (serve, elect, leader, audit).
// Thread-safe; never blocks the caller on a slow reader (see log.cpp: lines may be queued, and
// beyond 4 MiB queued dropped and counted).
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace fencegate::log {

enum class Level { debug = 0, info = 1, warn = 2, error = 3 };

void set_level(Level l);
// The one log-level parser: "debug", "info", "warn" or "error". Returns true iff `s` is one of
// them (then *out is set).
bool parse_level(std::string_view s, Level* out);
bool enabled(Level l);

struct Field {
  std::string_view key;
  std::string value;  // already JSON-encoded if raw, else a string (see below)
  bool raw = false;   // true: value is emitted as is (numbers, booleans)
};
inline Field kv(std::string_view k, std::string_view v) { return {k, std::string(v), false}; }
inline Field kv(std::string_view k, const std::string& v) { return {k, v, false}; }
inline Field kv(std::string_view k, const char* v) { return {k, std::string(v), false}; }
inline Field kv(std::string_view k, bool b) { return {k, b ? "true" : "false", true}; }
template <class N>
Field kv(std::string_view k, N n) requires(std::is_arithmetic_v<N> && !std::is_same_v<N, bool>)
{
  return {k, std::to_string(n), true};
}

void write(Level l, std::string_view msg, std::initializer_list<Field> fields = {});

inline void info(std::string_view m, std::initializer_list<Field> f = {}) { write(Level::info, m, f); }
inline void warn(std::string_view m, std::initializer_list<Field> f = {}) { write(Level::warn, m, f); }
inline void error(std::string_view m, std::initializer_list<Field> f = {}) { write(Level::error, m, f); }
inline void debug(std::string_view m, std::initializer_list<Field> f = {}) {
  if (enabled(Level::debug)) write(Level::debug, m, f);
}

}  // namespace fencegate::log
