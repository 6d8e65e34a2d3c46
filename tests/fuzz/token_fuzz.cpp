// Fuzz target: proxy/token.h parse_token.
//
// Properties: never crashes; the accepted set is exactly the canonical decimals 1..2^63-1 (checked
// against an independent string-only definition); an accepted value prints back as the input.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "proxy/token.h"
#include "tests/fuzz/fuzz_check.h"

using fencegate::fuzz::show;

namespace {

// Canonical decimal in 1..9223372036854775807, decided on the characters alone (no arithmetic).
bool reference_is_token(std::string_view v) {
  static constexpr std::string_view kMax = "9223372036854775807";
  if (v.empty() || v.size() > kMax.size()) return false;
  if (v[0] < '1' || v[0] > '9') return false;
  for (char c : v)
    if (c < '0' || c > '9') return false;
  return v.size() < kMax.size() || v <= kMax;  // same length: lexicographic order is numeric order
}

void check(std::string_view v) {
  const auto got = fencegate::proxy::parse_token(v);
  const bool want = reference_is_token(v);
  FUZZ_CHECK(got.has_value() == want,
             "input " + show(v) + (want ? " is a canonical token but was refused" : " is not a token but was accepted"));
  if (got) {
    FUZZ_CHECK(*got >= 1, "input " + show(v) + " accepted as " + std::to_string(*got));
    FUZZ_CHECK(std::to_string(*got) == v, "input " + show(v) + " accepted as " + std::to_string(*got));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view v(reinterpret_cast<const char*>(data), size);
  check(v);
  // A trailing newline is how seed files and hand-written reproducers usually end; also check the
  // input without it, so text seeds exercise the accepting path.
  if (!v.empty() && v.back() == '\n') check(v.substr(0, v.size() - 1));
  return 0;
}
