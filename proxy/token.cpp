#include "proxy/token.h"

namespace fencegate::proxy {

std::optional<std::int64_t> parse_token(std::string_view v) {
  // 2^63-1 has 19 digits; anything longer overflows.
  if (v.empty() || v.size() > 19 || v[0] == '0') return std::nullopt;
  std::uint64_t n = 0;
  for (char c : v) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + static_cast<std::uint64_t>(c - '0');  // cannot wrap: at most 19 digits
  }
  if (n > static_cast<std::uint64_t>(INT64_MAX)) return std::nullopt;
  return static_cast<std::int64_t>(n);
}

}  // namespace fencegate::proxy
