// ChunkDecoder (proxy/framing.h) and scan_response_head (proxy/head.h): the parsers the relay
// trusts for request bodies and upstream responses.
#include <doctest/doctest.h>

#include <string>

#include "proxy/framing.h"
#include "proxy/head.h"

using namespace fencegate::proxy;

namespace {

struct Decoded {
  std::string body;
  std::size_t consumed = 0;
  bool done = false, failed = false, too_large = false;
  std::string error;
};

// Feeds `in` in pieces of `step` bytes (0: all at once), as the relay does with reads.
Decoded decode(std::string_view in, std::size_t step = 0, std::uint64_t max_body = UINT64_MAX,
               std::size_t max_meta = 16 * 1024) {
  ChunkDecoder d(max_body, max_meta);
  Decoded r;
  std::size_t pos = 0;
  while (pos < in.size() && !d.done() && !d.failed()) {
    std::string_view piece = in.substr(pos, step ? step : in.size());
    std::size_t used = 0;
    while (used < piece.size() && !d.done() && !d.failed()) {
      std::string_view data;
      std::size_t n = d.feed(piece.substr(used), &data);
      r.body += data;
      used += n;
      if (n == 0) break;
    }
    pos += used;
    if (used < piece.size()) break;
  }
  r.consumed = pos;
  r.done = d.done();
  r.failed = d.failed();
  r.too_large = d.too_large();
  r.error = d.error();
  return r;
}

}  // namespace

TEST_CASE("chunked: bodies decode the same whatever the read boundaries") {
  const std::string wire = "5\r\nhello\r\n1a\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\n\r\n";
  for (std::size_t step : {0, 1, 2, 3, 7, 16}) {
    CAPTURE(step);
    Decoded r = decode(wire, step);
    CHECK(r.done);
    CHECK_FALSE(r.failed);
    CHECK(r.body == "helloabcdefghijklmnopqrstuvwxyz");
    CHECK(r.consumed == wire.size());
  }
}

TEST_CASE("chunked: stops at the end of the body, leaving a pipelined request unread") {
  const std::string body = "3\r\nabc\r\n0\r\n\r\n";
  Decoded r = decode(body + "GET / HTTP/1.1\r\n\r\n");
  CHECK(r.done);
  CHECK(r.body == "abc");
  CHECK(r.consumed == body.size());
}

TEST_CASE("chunked: extensions and trailers are accepted and not part of the body") {
  Decoded r = decode("3;name=value;x=\"q s\"\r\nabc\r\n2 ;ext\r\nde\r\n0\r\nX-Trailer: t\r\nDigest: a=b\r\n\r\n");
  CHECK(r.done);
  CHECK(r.body == "abcde");
  CHECK(decode("A\r\n0123456789\r\n0\r\n\r\n").body == "0123456789");  // upper-case hex
}

TEST_CASE("chunked: ambiguous or broken framing is refused") {
  struct Case {
    const char* name;
    std::string wire;
  } cases[] = {
      {"non-hex size", "zz\r\nhello\r\n0\r\n\r\n"},
      {"empty size", "\r\nhello\r\n0\r\n\r\n"},
      {"signed size", "+5\r\nhello\r\n0\r\n\r\n"},
      {"0x prefix", "0x5\r\nhello\r\n0\r\n\r\n"},
      {"17 hex digits", "00000000000000005\r\nhello\r\n0\r\n\r\n"},
      {"2^64 overflow", "10000000000000000\r\n"},
      {"space inside the size", "1 0\r\n"},
      {"whitespace before CRLF", "5 \r\nhello\r\n0\r\n\r\n"},
      {"bare LF after the size", "5\nhello\r\n0\r\n\r\n"},
      {"bare CR after the size", "5\rhello\r\n0\r\n\r\n"},
      {"data longer than its size", "3\r\nhello\r\n0\r\n\r\n"},
      {"bare LF after data", "5\r\nhello\n0\r\n\r\n"},
      {"control byte in an extension", std::string("5;a\x01\r\nhello\r\n0\r\n\r\n")},
      {"NUL in an extension", std::string("5;a\0b\r\nhello\r\n0\r\n\r\n", 20)},
      {"LF inside an extension", "5;a\nb\r\nhello\r\n0\r\n\r\n"},
      {"trailer with space before colon", "0\r\nX-T : v\r\n\r\n"},
      {"trailer without colon", "0\r\nbogus\r\n\r\n"},
      {"trailer folded", "0\r\nX-T: a\r\n b\r\n\r\n"},
      {"control byte in a trailer", "0\r\nX-T: a\x7f\r\n\r\n"},
      {"bare LF ending the trailers", "0\r\n\n"},
      {"bare LF after last chunk", "0\n\r\n"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    for (std::size_t step : {0, 1}) {
      Decoded r = decode(c.wire, step);
      CHECK(r.failed);
      CHECK_FALSE(r.done);
      CHECK_FALSE(r.too_large);
      CHECK(!r.error.empty());
    }
  }
}

TEST_CASE("chunked: the body limit counts declared sizes, before the data arrives") {
  Decoded r = decode("8\r\n12345678\r\n0\r\n\r\n", 0, 8);
  CHECK(r.done);
  r = decode("5\r\nhello\r\n4\r\n", 0, 8);
  CHECK(r.failed);
  CHECK(r.too_large);
  CHECK(r.body == "hello");
  r = decode("ffffffffffffffff\r\n", 0, 1ull << 30);
  CHECK(r.too_large);
}

TEST_CASE("chunked: the metadata limit is per chunk line and for all trailers") {
  std::string many;
  for (int i = 0; i < 5000; ++i) many += "1;e=abc\r\nx\r\n";  // far more than 64 bytes of lines in all
  many += "0\r\n\r\n";
  Decoded r = decode(many, 0, UINT64_MAX, 64);
  CHECK(r.done);
  CHECK(r.body.size() == 5000);
  CHECK(decode("1;" + std::string(100, 'e') + "\r\nx\r\n0\r\n\r\n", 0, UINT64_MAX, 64).failed);
  std::string trailers = "0\r\n";
  for (int i = 0; i < 10; ++i) trailers += "X-T: 0123456789\r\n";
  CHECK(decode(trailers + "\r\n", 0, UINT64_MAX, 64).failed);
}

TEST_CASE("chunk headers are lower-case hex without padding") {
  std::string s;
  append_chunk_header(s, 0);
  append_chunk_header(s, 10);
  append_chunk_header(s, 16384);
  CHECK(s == "0\r\na\r\n4000\r\n");
}

TEST_CASE("response heads: status, version and fields") {
  ResponseHead h;
  std::string wire = "HTTP/1.1 201 Created\r\nContent-Length: 3\r\nX-A:  b \r\n\r\nabc";
  HeadScan s = scan_response_head(wire, 1024, &h);
  REQUIRE(s.status == HeadStatus::complete);
  CHECK(s.length == wire.size() - 3);
  CHECK(h.version == 11);
  CHECK(h.status == 201);
  std::string_view v;
  CHECK(h.count("content-length", &v) == 1);
  CHECK(v == "3");
  CHECK(h.count("X-A", &v) == 1);
  CHECK(v == "b");
  CHECK(scan_response_head("HTTP/1.0 204\r\n\r\n", 1024, &h).status == HeadStatus::complete);
  CHECK(h.version == 10);
  CHECK(h.status == 204);
  CHECK(scan_response_head("HTTP/1.1 200 OK\r\nA: b\r\n", 1024, &h).status == HeadStatus::incomplete);
  CHECK(scan_response_head("HTTP/1.1 200 OK\r\nA: " + std::string(100, 'x'), 64, &h).status == HeadStatus::too_large);
}

TEST_CASE("response heads: malformed ones are refused") {
  for (const char* bad : {"HTTP/2 200 OK\r\n\r\n", "HTTP/1.1 20 OK\r\n\r\n", "HTTP/1.1 2000 OK\r\n\r\n",
                          "HTTP/1.1 099 Low\r\n\r\n", "HTTP/1.1 abc OK\r\n\r\n", "ICY 200 OK\r\n\r\n",
                          "HTTP/1.1 200 OK\r\n folded: x\r\n\r\n", "HTTP/1.1 200 OK\r\nA : b\r\n\r\n",
                          "HTTP/1.1 200 OK\r\nA: b\nC: d\r\n\r\n", "HTTP/1.1 200 OK\r\nNoColon\r\n\r\n"}) {
    CAPTURE(bad);
    CHECK(scan_response_head(bad, 1024, nullptr).status == HeadStatus::bad);
  }
}
