// Time arguments and formatting shared by the admin API and the audit CLI.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace fencegate::proxy {

// RFC 3339 UTC with milliseconds, e.g. "2026-11-29T10:00:00.123Z".
std::string format_rfc3339_ms(std::int64_t unix_ms);

// Parses an RFC 3339 timestamp ("2026-11-29T10:00:00Z", fractional seconds and "+02:00" offsets
// allowed), a relative time before `now_ms` ("-90s", "-15m", "-1h", "-7d"), or plain unix
// milliseconds. Returns true iff valid.
bool parse_time_arg(std::string_view s, std::int64_t now_ms, std::int64_t* out_ms);

std::int64_t now_unix_ms();

}  // namespace fencegate::proxy
