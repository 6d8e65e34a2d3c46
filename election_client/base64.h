// Standard base64 (RFC 4648, with padding), as etcd's JSON gateway encodes bytes fields.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace fencegate::election {

std::string base64_encode(std::string_view in);
// nullopt if `in` is not valid base64.
std::optional<std::string> base64_decode(std::string_view in);

// The end of the range holding every key that starts with `prefix` (prefix with its last byte
// incremented, trailing 0xff bytes dropped; "\0" = to the end of the keyspace if none is left).
std::string prefix_range_end(std::string_view prefix);

}  // namespace fencegate::election
