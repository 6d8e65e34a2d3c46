// Tests for valid_forwarded: the RFC 7239 syntax a client's Forwarded value must have to be
// passed upstream (issue 32, finding 5: an unterminated quote swallowed fencegate's own element).
#include "proxy/forwarded.h"

#include <doctest/doctest.h>

using fencegate::proxy::valid_forwarded;

TEST_CASE("valid_forwarded accepts RFC 7239 values") {
  for (const char* ok :
       {"for=192.0.2.60", "for=192.0.2.60;proto=http;by=203.0.113.43", "for=\"[2001:db8:cafe::17]:4711\"",
        "for=192.0.2.43, for=198.51.100.17", "for=a,for=b", "for=_hidden;by=_x", "for=\"a\\\"b\"", "for=\"x y\"",
        "for=a;;by=b", "for=a, , for=b", "For=unknown"}) {
    INFO(ok);
    CHECK(valid_forwarded(ok));
  }
}

TEST_CASE("valid_forwarded refuses what is not RFC 7239 syntax") {
  for (const char* bad :
       {"", " ", "for=\"x", "for=\"x, for=127.0.0.1", "for", "for=", "=x", "for x", "for=a b", "for=a ;by=b",
        "for=\"a\\", "for=a=b", "for=[::1]", "for=\"a\"b", "hello world", ",", "for=a;by"}) {
    INFO(bad);
    CHECK_FALSE(valid_forwarded(bad));
  }
}
