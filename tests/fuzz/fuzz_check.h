// Shared helper for the libFuzzer targets: an always-on check (independent of NDEBUG) that prints
// what was violated and aborts, so libFuzzer records the input as a crash.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace fencegate::fuzz {

// Printable rendering of arbitrary bytes for failure messages.
inline std::string show(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out + "\"";
}

[[noreturn]] inline void fail(const char* file, int line, const char* cond, const std::string& detail) {
  std::fprintf(stderr, "\n==== fuzz invariant violated at %s:%d\n  check: %s\n  %s\n", file, line, cond,
               detail.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace fencegate::fuzz

// FUZZ_CHECK(cond, detail): detail is any expression convertible to std::string.
#define FUZZ_CHECK(cond, detail)                                            \
  do {                                                                      \
    if (!(cond)) ::fencegate::fuzz::fail(__FILE__, __LINE__, #cond, (detail)); \
  } while (0)
