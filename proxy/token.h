// Fencing-token parsing: the one definition of a well-formed token.
//
// A token is a canonical decimal integer in 1..2^63-1: ASCII digits only, no sign, no leading zero,
// no spaces inside, no list. The caller passes the field value with HTTP's optional whitespace
// already trimmed and must itself treat several token fields as malformed.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace fencegate::proxy {

// Returns the generation iff `v` is a canonical token.
std::optional<std::int64_t> parse_token(std::string_view v);

}  // namespace fencegate::proxy
