// JSON string writing (see json.h): an ASCII fast path, UTF-8 validation per the Unicode
// well-formed byte sequence table, and U+FFFD for each maximal ill-formed subpart.
#include "common/json.h"

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace fencegate::json {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

// Returns true iff byte `c` can be copied as is when it stands alone (printable ASCII other
// than the two characters JSON reserves).
constexpr bool plain_ascii(unsigned char c) { return c >= 0x20 && c < 0x80 && c != '"' && c != '\\'; }

// The length of the well-formed UTF-8 sequence at s[i] (lead byte >= 0x80), or, if it is
// ill-formed, 0 with *bad set to the length of its maximal subpart (>= 1), which becomes one
// U+FFFD. From the Unicode Standard's table 3-7 (well-formed UTF-8 byte sequences).
std::size_t utf8_sequence(std::string_view s, std::size_t i, std::size_t* bad) {
  const auto lead = static_cast<unsigned char>(s[i]);
  std::size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    len = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    len = 3;
    if (lead == 0xE0) lo = 0xA0;       // no overlongs
    else if (lead == 0xED) hi = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    len = 4;
    if (lead == 0xF0) lo = 0x90;       // no overlongs
    else if (lead == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    *bad = 1;  // a continuation byte, C0/C1 (always overlong) or F5..FF
    return 0;
  }
  for (std::size_t k = 1; k < len; ++k) {
    if (i + k >= s.size()) {
      *bad = k;  // truncated: the valid prefix is one maximal subpart
      return 0;
    }
    const auto c = static_cast<unsigned char>(s[i + k]);
    if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) {
      *bad = k;
      return 0;
    }
  }
  return len;
}

// Returns true iff none of the eight bytes at p needs a look of its own: no byte below 0x20, none
// >= 0x80, no '"' and no '\\' (SWAR: a byte below n sets its high bit in x - n*0x01..., and so
// does a zero byte of x ^ c*0x01... for a byte equal to c). Log lines are mostly such blocks.
inline bool plain_block(const char* p) {
  constexpr std::uint64_t kOnes = 0x0101010101010101ULL, kHigh = 0x8080808080808080ULL;
  std::uint64_t x;
  std::memcpy(&x, p, 8);
  const std::uint64_t quote = x ^ (kOnes * '"');
  const std::uint64_t backslash = x ^ (kOnes * '\\');
  const std::uint64_t special = (x - kOnes * 0x20) | (quote - kOnes) | (backslash - kOnes);
  return (((special & ~x) | x) & kHigh) == 0;
}

void append_escape(std::string& out, unsigned char c) {
  switch (c) {
    case '"': out += "\\\""; return;
    case '\\': out += "\\\\"; return;
    case '\n': out += "\\n"; return;
    case '\r': out += "\\r"; return;
    case '\t': out += "\\t"; return;
    case '\b': out += "\\b"; return;
    case '\f': out += "\\f"; return;
    default: {
      static constexpr char kHex[] = "0123456789abcdef";
      const char esc[6] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 0xF]};
      out.append(esc, sizeof esc);
    }
  }
}

}  // namespace

void append_string(std::string& out, std::string_view s) {
  out += '"';
  std::size_t run = 0;  // start of the bytes not yet appended; all of them copy as they are
  std::size_t i = 0;
  while (i < s.size()) {
    if (s.size() - i >= 8 && plain_block(s.data() + i)) {
      i += 8;
      continue;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (plain_ascii(c)) {
      ++i;
      continue;
    }
    if (c >= 0x80) {
      std::size_t bad = 0;
      if (std::size_t len = utf8_sequence(s, i, &bad)) {
        i += len;  // well-formed: stays in the run
        continue;
      }
      out.append(s.data() + run, i - run);
      out += kReplacement;
      i += bad;
      run = i;
      continue;
    }
    out.append(s.data() + run, i - run);
    append_escape(out, c);
    run = ++i;
  }
  out.append(s.data() + run, s.size() - run);
  out += '"';
}

std::string quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  append_string(out, s);
  return out;
}

}  // namespace fencegate::json
