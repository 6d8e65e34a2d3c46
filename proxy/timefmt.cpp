#include "proxy/timefmt.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <optional>

namespace fencegate::proxy {

std::int64_t now_unix_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

std::string format_rfc3339_ms(std::int64_t unix_ms) {
  std::int64_t secs = unix_ms >= 0 ? unix_ms / 1000 : (unix_ms - 999) / 1000;
  int ms = static_cast<int>(unix_ms - secs * 1000);
  std::time_t t = static_cast<std::time_t>(secs);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  return buf;
}

namespace {

// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
std::int64_t days_from_civil(std::int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const std::int64_t era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<std::int64_t>(doe) - 719468;
}

bool leap(int y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

int days_in_month(int y, int m) {
  static constexpr int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return m == 2 && leap(y) ? 29 : kDays[m - 1];
}

// Reads exactly n digits at s[*i]. Returns false if they are not there.
bool digits(std::string_view s, std::size_t* i, std::size_t n, int* out) {
  if (*i + n > s.size()) return false;
  int v = 0;
  for (std::size_t k = 0; k < n; ++k) {
    char c = s[*i + k];
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *i += n;
  *out = v;
  return true;
}

bool expect(std::string_view s, std::size_t* i, char a, char b = 0) {
  if (*i >= s.size() || (s[*i] != a && (b == 0 || s[*i] != b))) return false;
  ++*i;
  return true;
}

// RFC 3339 date-time: YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM). "t"/"z" and a space for
// "T" are accepted (RFC 3339 section 5.6 notes). Fractions beyond milliseconds are truncated.
std::optional<std::int64_t> parse_rfc3339(std::string_view s) {
  std::size_t i = 0;
  int Y = 0, M = 0, D = 0, h = 0, m = 0, sec = 0;
  if (!digits(s, &i, 4, &Y) || !expect(s, &i, '-') || !digits(s, &i, 2, &M) || !expect(s, &i, '-') ||
      !digits(s, &i, 2, &D))
    return std::nullopt;
  if (!expect(s, &i, 'T', 't') && !expect(s, &i, ' ')) return std::nullopt;
  if (!digits(s, &i, 2, &h) || !expect(s, &i, ':') || !digits(s, &i, 2, &m) || !expect(s, &i, ':') ||
      !digits(s, &i, 2, &sec))
    return std::nullopt;
  int ms = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    std::size_t start = i;
    int scale = 100;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      ms += (s[i] - '0') * scale;
      scale /= 10;
      ++i;
    }
    if (i == start) return std::nullopt;
  }
  int offset_min = 0;
  if (expect(s, &i, 'Z', 'z')) {
  } else if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
    const int sign = s[i] == '-' ? -1 : 1;
    ++i;
    int oh, om;
    if (!digits(s, &i, 2, &oh) || !expect(s, &i, ':') || !digits(s, &i, 2, &om) || oh > 23 || om > 59)
      return std::nullopt;
    offset_min = sign * (oh * 60 + om);
  } else {
    return std::nullopt;
  }
  if (i != s.size()) return std::nullopt;
  if (M < 1 || M > 12 || D < 1 || D > days_in_month(Y, M) || h > 23 || m > 59 || sec > 60) return std::nullopt;
  const std::int64_t days = days_from_civil(Y, static_cast<unsigned>(M), static_cast<unsigned>(D));
  const std::int64_t secs = days * 86400 + h * 3600 + m * 60 + sec - offset_min * 60;
  return secs * 1000 + ms;
}

// -90s, -30m, -1h, -7d: that long before `now`.
std::optional<std::int64_t> parse_relative(std::string_view s, std::int64_t now) {
  if (s.size() < 3 || s[0] != '-') return std::nullopt;
  std::int64_t unit;
  switch (s.back()) {
    case 's': unit = 1000; break;
    case 'm': unit = 60'000; break;
    case 'h': unit = 3'600'000; break;
    case 'd': unit = 86'400'000; break;
    default: return std::nullopt;
  }
  std::int64_t n = 0;
  for (char c : s.substr(1, s.size() - 2)) {
    if (c < '0' || c > '9') return std::nullopt;
    if (n > 1'000'000'000) return std::nullopt;  // > 30 years in seconds: nonsense
    n = n * 10 + (c - '0');
  }
  return now - n * unit;
}

}  // namespace

bool parse_time_arg(std::string_view s, std::int64_t now_ms, std::int64_t* out_ms) {
  if (s.empty()) return false;
  std::optional<std::int64_t> t;
  if (s[0] == '-') {
    t = parse_relative(s, now_ms);
  } else if (s.find_first_not_of("0123456789") == std::string_view::npos) {
    if (s.size() > 15) return false;  // unix milliseconds
    std::int64_t n = 0;
    for (char c : s) n = n * 10 + (c - '0');
    t = n;
  } else {
    t = parse_rfc3339(s);
  }
  if (!t) return false;
  *out_ms = *t;
  return true;
}

}  // namespace fencegate::proxy
