// Fuzz target: proxy/timefmt.h parse_time_arg and format_rfc3339_ms.
//
// Properties: never crashes (UBSan aborts on overflow); unix milliseconds and relative times give
// the value an independent computation gives; an RFC 3339 input is accepted iff an independent
// parser (glibc timegm for the arithmetic) accepts it, with the same value; and for every accepted
// time in years 0000..9999 (what RFC 3339 can express), format_rfc3339_ms gives a valid RFC 3339
// string that parses back to the same millisecond and formats to itself.
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>

#include "proxy/timefmt.h"
#include "tests/fuzz/fuzz_check.h"

using fencegate::fuzz::show;
using fencegate::proxy::format_rfc3339_ms;
using fencegate::proxy::parse_time_arg;

namespace {

constexpr std::int64_t kNow = 1'795'000'000'123;  // fixed "now": 2026-11-18T...
constexpr std::int64_t kMinMs = -62'167'219'200'000;  // 0000-01-01T00:00:00.000Z
constexpr std::int64_t kMaxMs = 253'402'300'799'999;  // 9999-12-31T23:59:59.999Z

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// n digits at s[i] (no sign, no spaces).
std::optional<int> num(std::string_view s, std::size_t i, std::size_t n) {
  if (i + n > s.size()) return std::nullopt;
  int v = 0;
  for (std::size_t k = 0; k < n; ++k) {
    if (!is_digit(s[i + k])) return std::nullopt;
    v = v * 10 + (s[i + k] - '0');
  }
  return v;
}

// Independent RFC 3339 reader: fixed positions, fields range-checked, arithmetic by timegm().
// Accepts what timefmt.h documents: 'T', 't' or ' ' between date and time, 'Z'/'z' or +hh:mm /
// -hh:mm, any number of fraction digits (truncated to ms), second 60.
std::optional<std::int64_t> reference_rfc3339(std::string_view s) {
  if (s.size() < 20) return std::nullopt;
  auto Y = num(s, 0, 4), M = num(s, 5, 2), D = num(s, 8, 2), h = num(s, 11, 2), m = num(s, 14, 2), sec = num(s, 17, 2);
  if (!Y || !M || !D || !h || !m || !sec) return std::nullopt;
  if (s[4] != '-' || s[7] != '-' || (s[10] != 'T' && s[10] != 't' && s[10] != ' ') || s[13] != ':' || s[16] != ':')
    return std::nullopt;
  std::size_t i = 19;
  int ms = 0;
  if (s[i] == '.') {
    std::size_t j = i + 1;
    while (j < s.size() && is_digit(s[j])) ++j;
    if (j == i + 1) return std::nullopt;
    std::string frac(s.substr(i + 1, j - i - 1));
    frac.resize(3, '0');
    ms = std::stoi(frac.substr(0, 3));
    i = j;
  }
  int offset_min = 0;
  std::string_view zone = s.substr(i);
  if (zone == "Z" || zone == "z") {
  } else if (zone.size() == 6 && (zone[0] == '+' || zone[0] == '-') && zone[3] == ':') {
    auto oh = num(zone, 1, 2), om = num(zone, 4, 2);
    if (!oh || !om || *oh > 23 || *om > 59) return std::nullopt;
    offset_min = (zone[0] == '-' ? -1 : 1) * (*oh * 60 + *om);
  } else {
    return std::nullopt;
  }
  static const int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (*Y % 4 == 0 && *Y % 100 != 0) || *Y % 400 == 0;
  if (*M < 1 || *M > 12 || *D < 1) return std::nullopt;
  if (*D > kDays[*M - 1] + (*M == 2 && leap ? 1 : 0)) return std::nullopt;
  if (*h > 23 || *m > 59 || *sec > 60) return std::nullopt;
  std::tm tm{};
  tm.tm_year = *Y - 1900;
  tm.tm_mon = *M - 1;
  tm.tm_mday = *D;
  tm.tm_hour = *h;
  tm.tm_min = *m;
  tm.tm_sec = *sec;  // 60 rolls over into the next minute, as in the product
  const std::time_t t = timegm(&tm);
  return (static_cast<std::int64_t>(t) - offset_min * 60) * 1000 + ms;
}

// "YYYY-MM-DDTHH:MM:SS.mmmZ" exactly, as format_rfc3339_ms documents.
bool formatted_shape(std::string_view f) {
  static constexpr std::string_view kShape = "dddd-dd-ddTdd:dd:dd.dddZ";
  if (f.size() != kShape.size()) return false;
  for (std::size_t i = 0; i < f.size(); ++i)
    if (kShape[i] == 'd' ? !is_digit(f[i]) : f[i] != kShape[i]) return false;
  return true;
}

void check_round_trip(std::string_view s, std::int64_t ms) {
  const std::string f = format_rfc3339_ms(ms);
  if (ms < kMinMs || ms > kMaxMs) return;  // not expressible in RFC 3339 (4-digit years)
  const std::string in = "input " + show(s) + " -> " + std::to_string(ms) + " ms -> " + show(f);
  FUZZ_CHECK(formatted_shape(f), "formatted time is not RFC 3339 with ms; " + in);
  std::int64_t back = 0;
  FUZZ_CHECK(parse_time_arg(f, kNow, &back), "formatted time does not parse; " + in);
  FUZZ_CHECK(back == ms, "formatted time parses to " + std::to_string(back) + "; " + in);
  FUZZ_CHECK(format_rfc3339_ms(back) == f, "format is not stable; " + in);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view s(reinterpret_cast<const char*>(data), size);
  if (!s.empty() && s.back() == '\n') s.remove_suffix(1);  // text seeds end in a newline

  std::int64_t ms = 0x5eed;
  const bool ok = parse_time_arg(s, kNow, &ms);
  if (!ok) FUZZ_CHECK(ms == 0x5eed, "output written for refused input " + show(s));

  const std::string in = "input " + show(s) + (ok ? " -> " + std::to_string(ms) : std::string(" refused"));
  if (!s.empty() && s.find_first_not_of("0123456789") == std::string_view::npos) {
    // Unix milliseconds, at most 15 digits.
    FUZZ_CHECK(ok == (s.size() <= 15), in);
    if (ok) FUZZ_CHECK(ms == std::stoll(std::string(s)), in);
  } else if (!s.empty() && s[0] == '-') {
    // Relative: -<n>(s|m|h|d). The product refuses magnitudes past about 10^10 (nonsense, and it
    // keeps n * unit far from overflow): exactly, it refuses when the digits but the last exceed 10^9.
    const std::string_view digits = s.size() >= 3 ? s.substr(1, s.size() - 2) : std::string_view();
    const char unit = s.back();
    const bool shape = s.size() >= 3 && digits.find_first_not_of("0123456789") == std::string_view::npos &&
                       (unit == 's' || unit == 'm' || unit == 'h' || unit == 'd');
    std::int64_t head = 0;  // value of all digits but the last, saturated
    if (shape)
      for (char c : digits.substr(0, digits.size() - 1))
        head = head > 100'000'000'000 ? head : head * 10 + (c - '0');
    const bool want = shape && head <= 1'000'000'000;
    FUZZ_CHECK(ok == want, std::string(want ? "relative time refused" : "relative time accepted") + "; " + in);
    if (ok) {
      const std::int64_t n = head * 10 + (digits.back() - '0');
      const std::int64_t u = unit == 's' ? 1000 : unit == 'm' ? 60'000 : unit == 'h' ? 3'600'000 : 86'400'000;
      FUZZ_CHECK(ms == kNow - n * u, "expected " + std::to_string(kNow - n * u) + "; " + in);
    }
  } else {
    const auto ref = reference_rfc3339(s);
    FUZZ_CHECK(ok == ref.has_value(),
               std::string(ok ? "accepted" : "refused") + " but the reference RFC 3339 reader " +
                   (ref ? "accepts it as " + std::to_string(*ref) : std::string("refuses it")) + "; " + in);
    if (ok) FUZZ_CHECK(ms == *ref, "reference reads " + std::to_string(*ref) + "; " + in);
  }
  if (ok) check_round_trip(s, ms);
  return 0;
}
