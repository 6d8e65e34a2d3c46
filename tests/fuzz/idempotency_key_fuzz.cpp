// Fuzz target: proxy/idempotency.h parse_key (issue 30).
//
// Properties: never crashes; an accepted key is 1..kMaxKeyBytes bytes of printable ASCII;
// serialize_key of it parses back to the same key; the accepted set agrees with an independent
// reference reading of RFC 8941's sf-string (with optional surrounding SP/HTAB).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "proxy/idempotency.h"
#include "tests/fuzz/fuzz_check.h"

using fencegate::fuzz::show;
namespace idem = fencegate::proxy::idem;

namespace {

std::optional<std::string> reference(std::string_view v) {
  std::size_t b = 0, e = v.size();
  while (b < e && (v[b] == ' ' || v[b] == '\t')) ++b;
  while (e > b && (v[e - 1] == ' ' || v[e - 1] == '\t')) --e;
  v = v.substr(b, e - b);
  if (v.size() < 2 || v.front() != '"' || v.back() != '"') return std::nullopt;
  std::string out;
  for (std::size_t i = 1; i + 1 < v.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(v[i]);
    if (c == '"') return std::nullopt;  // an unescaped quote before the end
    if (c == '\\') {
      if (i + 2 >= v.size()) return std::nullopt;  // escapes the closing quote
      const char n = v[++i];
      if (n != '"' && n != '\\') return std::nullopt;
      out += n;
      continue;
    }
    if (c < 0x20 || c > 0x7e) return std::nullopt;
    out += static_cast<char>(c);
  }
  if (out.empty() || out.size() > idem::kMaxKeyBytes) return std::nullopt;
  return out;
}

void check(std::string_view v) {
  std::string why;
  const auto got = idem::parse_key(v, &why);
  const auto want = reference(v);
  FUZZ_CHECK(got.has_value() == want.has_value(),
             "input " + show(v) +
                 (want ? " is a valid key but was refused: " + why : " is not a key but was accepted"));
  if (!got) {
    FUZZ_CHECK(!why.empty(), "input " + show(v) + " refused without a reason");
    return;
  }
  FUZZ_CHECK(*got == *want, "input " + show(v) + " parsed as " + show(*got) + ", expected " + show(*want));
  for (unsigned char c : *got) FUZZ_CHECK(c >= 0x20 && c <= 0x7e, "input " + show(v) + ": non-printable byte kept");
  const auto again = idem::parse_key(idem::serialize_key(*got));
  FUZZ_CHECK(again && *again == *got, "key " + show(*got) + " does not survive serialize_key");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view v(reinterpret_cast<const char*>(data), size);
  check(v);
  if (!v.empty() && v.back() == '\n') check(v.substr(0, v.size() - 1));
  return 0;
}
