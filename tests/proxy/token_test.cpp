// Tests for parse_token: the one definition of a well-formed fencing token (canonical decimal in
// 1..2^63-1). Every form a lenient parser might accept is refused here, because a token read
// differently by the proxy and by the resource is a hole in the fence.
#include "proxy/token.h"

#include <doctest/doctest.h>

#include <string>

using fencegate::proxy::parse_token;

TEST_CASE("parse_token accepts canonical decimals in 1..2^63-1") {
  CHECK(parse_token("1") == 1);
  CHECK(parse_token("42") == 42);
  CHECK(parse_token("1000000") == 1000000);
  CHECK(parse_token("9223372036854775807") == INT64_MAX);
  CHECK(parse_token("9223372036854775806") == INT64_MAX - 1);
}

TEST_CASE("parse_token rejects everything that is not a canonical token") {
  const char* bad[] = {
      "",                      // empty
      "0",                     // out of range: generations start at 1
      "00",                    // leading zero
      "05",                    // leading zero
      "+5",                    // sign
      "-5",                    // sign
      "0x10",                  // hex
      "1 2",                   // space inside
      " 5",                    // untrimmed (the caller trims OWS; a space left here is not a digit)
      "5 ",                    //
      "5,6",                   // a list
      "9223372036854775808",   // 2^63: overflow by one
      "18446744073709551615",  // 2^64-1
      "18446744073709551616",  // 2^64: would wrap an unsigned accumulator to 0
      "99999999999999999999",  // 20 digits
      "1e3",                   // exponent
      "5.0",                   // decimal point
      "\xEF\xBC\x95",          // U+FF15 FULLWIDTH DIGIT FIVE
      "\xD9\xA5",              // U+0665 ARABIC-INDIC DIGIT FIVE
      "5\t",                   // trailing tab
      "\t5",                   // leading tab
      "5\r\n",                 // line end
  };
  for (const char* v : bad) {
    CAPTURE(std::string(v));
    CHECK_FALSE(parse_token(v).has_value());
  }
}

TEST_CASE("parse_token does not stop at an embedded NUL") {
  // A string_view may carry bytes after a NUL; "5\0" must not be read as 5.
  CHECK_FALSE(parse_token(std::string_view("5\0", 2)).has_value());
  CHECK_FALSE(parse_token(std::string_view("\0" "5", 2)).has_value());
}
