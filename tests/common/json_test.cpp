// Tests for common/json.h: the JSON string writer (escapes, UTF-8 pass-through, U+FFFD for
// ill-formed UTF-8 per maximal subpart, and valid JSON for any input).
#include "common/json.h"

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>

using fencegate::json::append_string;
using fencegate::json::quote;

namespace {

const std::string R = "\xEF\xBF\xBD";  // U+FFFD

std::string q(const std::string& inner) { return "\"" + inner + "\""; }

// What a strict JSON parser reads back from quote(s).
std::string parsed(const std::string& s) { return nlohmann::json::parse(quote(s)).get<std::string>(); }

}  // namespace

TEST_CASE("json: plain ASCII is copied as is") {
  CHECK(quote("") == q(""));
  CHECK(quote("hello, world /a?b=c&d") == q("hello, world /a?b=c&d"));
  CHECK(quote("~\x7f") == q("~\x7f"));  // DEL needs no escape in JSON
}

TEST_CASE("json: quotes, backslashes and control characters are escaped") {
  CHECK(quote("a\"b\\c") == q("a\\\"b\\\\c"));
  CHECK(quote("\n\r\t\b\f") == q("\\n\\r\\t\\b\\f"));
  CHECK(quote(std::string("\0\x01\x1b\x1f", 4)) == q("\\u0000\\u0001\\u001b\\u001f"));
  CHECK(parsed(std::string("x\0y\x1f\"\\", 6)) == std::string("x\0y\x1f\"\\", 6));
}

TEST_CASE("json: append_string appends to what is there") {
  std::string out = "{\"k\":";
  append_string(out, "v\xC3\xA9");
  out += '}';
  CHECK(out == "{\"k\":\"v\xC3\xA9\"}");
  CHECK(nlohmann::json::parse(out)["k"] == "v\xC3\xA9");
}

TEST_CASE("json: valid UTF-8 passes through unchanged") {
  for (const std::string s : {
           "billing-\xC3\xA9",                  // é (the example: not \u00c3\u00a9)
           "\xE2\x82\xAC 5",                    // €
           "\xF0\x9F\x98\x80",                  // U+1F600
           "\xE2\x80\xA8\xE2\x80\xA9",          // U+2028, U+2029 stay raw
           "\xC2\x80", "\xDF\xBF",              // U+0080, U+07FF
           "\xE0\xA0\x80", "\xEF\xBF\xBF",      // U+0800, U+FFFF
           "\xED\x9F\xBF", "\xEE\x80\x80",      // U+D7FF, U+E000 (either side of the surrogates)
           "\xF0\x90\x80\x80", "\xF4\x8F\xBF\xBF",  // U+10000, U+10FFFF
           "\xEF\xBF\xBD",                      // U+FFFD itself
       }) {
    CAPTURE(s);
    CHECK(quote(s) == q(s));
    CHECK(parsed(s) == s);
  }
  CHECK(quote("\xC3\xA9\"\n") == q("\xC3\xA9\\\"\\n"));
}

TEST_CASE("json: ill-formed UTF-8 becomes one U+FFFD per maximal subpart") {
  CHECK(quote("\x80") == q(R));                        // stray continuation byte
  CHECK(quote("\xBF\x80") == q(R + R));                // two of them
  CHECK(quote("\xFF") == q(R));                        // never a UTF-8 byte
  CHECK(quote("a\xFE" "b") == q("a" + R + "b"));
  CHECK(quote("\xC0\xAF") == q(R + R));                // overlong '/': C0 is no lead byte
  CHECK(quote("\xC1\xBF") == q(R + R));
  CHECK(quote("\xE0\x80\xAF") == q(R + R + R));        // overlong 3-byte form
  CHECK(quote("\xF0\x80\x80\xAF") == q(R + R + R + R));  // overlong 4-byte form
  CHECK(quote("\xED\xA0\x80") == q(R + R + R));        // surrogate U+D800
  CHECK(quote("\xED\xBF\xBF") == q(R + R + R));        // surrogate U+DFFF
  CHECK(quote("\xF4\x90\x80\x80") == q(R + R + R + R));  // U+110000
  CHECK(quote("\xF5\x80\x80\x80") == q(R + R + R + R));  // F5 is no lead byte
  // Truncated sequences: the valid prefix is one maximal subpart.
  CHECK(quote("\xC3") == q(R));
  CHECK(quote("\xE2\x82") == q(R));
  CHECK(quote("\xF0\x9F\x98") == q(R));
  CHECK(quote("\xE2\x82" "A") == q(R + "A"));
  CHECK(quote("\xF0\x9F\x98\xC3\xA9") == q(R + "\xC3\xA9"));
  CHECK(quote("\xC3\"") == q(R + "\\\""));
  // The Unicode Standard's own example (section 3.9, table 3-8).
  CHECK(quote("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64") ==
        q("a" + R + R + R + "b" + R + "c" + R + R + "d"));
}

TEST_CASE("json: any bytes give valid JSON, and valid UTF-8 reads back the same") {
  std::mt19937 rng(26);
  for (int n = 0; n < 20000; ++n) {
    std::string s(rng() % 40, '\0');
    for (auto& c : s) {
      switch (n % 3) {
        case 0: c = static_cast<char>(rng() % 256); break;
        case 1: c = static_cast<char>(0x70 + rng() % 0x90); break;              // mostly >= 0x80
        default: c = static_cast<char>(rng() % 16 ? 0x20 + rng() % 0x5f : rng() % 256);  // mostly ASCII
      }
    }
    std::string j = quote(s);
    CAPTURE(s);
    auto v = nlohmann::json::parse(j, nullptr, /*allow_exceptions=*/false);
    REQUIRE(v.is_string());
    // Writing what was read back changes nothing more: the first pass made it valid UTF-8.
    CHECK(quote(v.get<std::string>()) == j);
  }
}

TEST_CASE("json: a byte that needs a look is found at every offset of a long string") {
  // Long plain runs go eight bytes at a time; each of these must still be seen wherever it sits.
  const std::string plain = "abcdefghijklmnopqrstuvwxyz0123456789ABCD";  // 40 bytes
  const std::pair<std::string, std::string> cases[] = {
      {"\"", "\\\""}, {"\\", "\\\\"}, {"\n", "\\n"},          {std::string(1, '\0'), "\\u0000"},
      {"\x1f", "\\u001f"}, {"\xFF", R},  {"\xC3\xA9", "\xC3\xA9"}, {"\xC3", R},
      {" ", " "},        {"!", "!"},    {"[", "["},               {"]", "]"},  // neighbours of '"', '\\'
  };
  for (const auto& [in, out] : cases) {
    for (std::size_t at = 0; at <= plain.size(); ++at) {
      CAPTURE(in);
      CAPTURE(at);
      CHECK(quote(plain.substr(0, at) + in + plain.substr(at)) == q(plain.substr(0, at) + out + plain.substr(at)));
    }
  }
}
