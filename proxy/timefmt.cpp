#include "proxy/timefmt.h"

#include <chrono>
#include <cstdio>
#include <ctime>

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

bool digits(std::string_view s, std::size_t pos, std::size_t n, int* out) {
  if (pos + n > s.size()) return false;
  int v = 0;
  for (std::size_t i = pos; i < pos + n; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  *out = v;
  return true;
}

// Days since 1970-01-01 of a civil date (proleptic Gregorian).
std::int64_t days_from_civil(std::int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const std::int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<std::int64_t>(doe) - 719468;
}

}  // namespace

bool parse_time_arg(std::string_view s, std::int64_t now_ms, std::int64_t* out_ms) {
  if (s.empty()) return false;
  if (s[0] == '-') {  // relative
    if (s.size() < 3) return false;
    char unit = s.back();
    std::int64_t mult = unit == 's' ? 1000 : unit == 'm' ? 60000 : unit == 'h' ? 3600000 : unit == 'd' ? 86400000 : 0;
    if (!mult) return false;
    std::int64_t n = 0;
    for (char c : s.substr(1, s.size() - 2)) {
      if (c < '0' || c > '9' || n > 1'000'000'000) return false;
      n = n * 10 + (c - '0');
    }
    *out_ms = now_ms - n * mult;
    return true;
  }
  bool all_digits = true;
  for (char c : s) all_digits = all_digits && c >= '0' && c <= '9';
  if (all_digits) {
    if (s.size() > 15) return false;
    std::int64_t n = 0;
    for (char c : s) n = n * 10 + (c - '0');
    *out_ms = n;
    return true;
  }
  int y, mo, d, h, mi, sec;
  if (!digits(s, 0, 4, &y) || s.size() < 20 || s[4] != '-' || !digits(s, 5, 2, &mo) || s[7] != '-' ||
      !digits(s, 8, 2, &d) || (s[10] != 'T' && s[10] != 't' && s[10] != ' ') || !digits(s, 11, 2, &h) ||
      s[13] != ':' || !digits(s, 14, 2, &mi) || s[16] != ':' || !digits(s, 17, 2, &sec))
    return false;
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60) return false;
  std::size_t pos = 19;
  int ms = 0;
  if (pos < s.size() && s[pos] == '.') {
    ++pos;
    int nd = 0;
    while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9') {
      if (nd < 3) ms = ms * 10 + (s[pos] - '0');
      ++nd;
      ++pos;
    }
    if (nd == 0) return false;
    for (int i = nd; i < 3; ++i) ms *= 10;
  }
  std::int64_t offset_min = 0;
  if (pos < s.size() && (s[pos] == 'Z' || s[pos] == 'z')) {
    ++pos;
  } else if (pos < s.size() && (s[pos] == '+' || s[pos] == '-')) {
    int oh, om;
    if (!digits(s, pos + 1, 2, &oh) || pos + 3 >= s.size() || s[pos + 3] != ':' || !digits(s, pos + 4, 2, &om))
      return false;
    offset_min = (oh * 60 + om) * (s[pos] == '-' ? -1 : 1);
    pos += 6;
  } else {
    return false;
  }
  if (pos != s.size()) return false;
  std::int64_t days = days_from_civil(y, static_cast<unsigned>(mo), static_cast<unsigned>(d));
  std::int64_t secs = days * 86400 + h * 3600 + mi * 60 + sec - offset_min * 60;
  *out_ms = secs * 1000 + ms;
  return true;
}

}  // namespace fencegate::proxy
