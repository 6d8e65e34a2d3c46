// W3C traceparent validation (proxy/traceparent.h): what is kept in an audit row and what is dropped.
#include <doctest/doctest.h>

#include "proxy/traceparent.h"

using fencegate::proxy::valid_traceparent;

TEST_CASE("traceparent: valid values are kept, anything else is dropped") {
  const std::string ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  CHECK(valid_traceparent(ok) == ok);
  CHECK(valid_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00") != "");
  // A later version may append fields: the first 55 characters are kept.
  CHECK(valid_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next") ==
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
  for (const char* bad : {
           "",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",  // version 00 is exactly 55
           "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",       // later version: '-' next
           "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",        // version ff is invalid
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",        // zero trace id
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",        // zero parent id
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",        // uppercase
           "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",        // dashes misplaced
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",        // not hex
           "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
       }) {
    CAPTURE(bad);
    CHECK(valid_traceparent(bad).empty());
  }
}
