// Hex digits: the one decoder every parser shares (chunk sizes, percent-encoding, key material).
#pragma once

namespace fencegate::common {

// The value of one hexadecimal digit (either case), or -1 if `c` is not one.
constexpr int hex_value(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace fencegate::common
