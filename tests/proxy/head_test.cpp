// Tests for the strict request-head scanner and the framing checks. Anything that a lenient parser
// downstream could read differently must be refused here (bad), never passed on: request smuggling
// past the proxy is a write that bypasses the fence.
#include "proxy/head.h"

#include <doctest/doctest.h>

#include <string>

using namespace fencegate::proxy;

namespace {

constexpr std::size_t kMax = 8192;

HeadScan scan(std::string_view data, RequestHead* out = nullptr, std::size_t max = kMax) {
  RequestHead ignored;
  return scan_request_head(data, max, out ? out : &ignored);
}

// Scans `data`, requires a complete head, and returns the framing verdict.
Framing framing_of(const std::string& data) {
  RequestHead h;
  HeadScan s = scan(data, &h);
  INFO("reason: " << s.reason);
  REQUIRE(s.status == HeadStatus::complete);
  return check_framing(h);
}

// A string from a literal that may contain NUL bytes (without the terminating NUL).
template <std::size_t N>
std::string bytes(const char (&s)[N]) {
  return std::string(s, N - 1);
}

void check_bad(const std::string& data) {
  CAPTURE(data);
  HeadScan s = scan(data);
  CHECK(s.status == HeadStatus::bad);
  CHECK_FALSE(s.reason.empty());
}

}  // namespace

TEST_CASE("scan_request_head: a complete simple GET") {
  const std::string head =
      "GET /tenants/a/x?y=1 HTTP/1.1\r\n"
      "Host: example.com\r\n"
      "Fencing-Token:   42 \t\r\n"
      "X-Empty:\r\n"
      "X-Inner: a  b\r\n"
      "\r\n";
  const std::string data = head + "BODYBYTES";
  RequestHead h;
  HeadScan s = scan(data, &h);
  REQUIRE(s.status == HeadStatus::complete);
  CHECK(s.length == head.size());
  CHECK(s.reason.empty());
  CHECK(h.method == "GET");
  CHECK(h.target == "/tenants/a/x?y=1");
  CHECK(h.version == 11);
  REQUIRE(h.fields.size() == 4);
  CHECK(h.fields[0].name == "Host");
  CHECK(h.fields[0].value == "example.com");
  CHECK(h.fields[1].name == "Fencing-Token");
  CHECK(h.fields[1].value == "42");  // OWS on both sides trimmed
  CHECK(h.fields[2].name == "X-Empty");
  CHECK(h.fields[2].value == "");
  CHECK(h.fields[3].value == "a  b");  // inner whitespace kept

  std::string_view first;
  CHECK(h.count("fencing-token", &first) == 1);
  CHECK(first == "42");
  CHECK(h.count("HOST") == 1);
  CHECK(h.count("Content-Length") == 0);
}

TEST_CASE("scan_request_head: HTTP/1.0 and no header fields") {
  RequestHead h;
  HeadScan s = scan("POST /x HTTP/1.0\r\n\r\n", &h);
  REQUIRE(s.status == HeadStatus::complete);
  CHECK(s.length == 20);
  CHECK(h.method == "POST");
  CHECK(h.version == 10);
  CHECK(h.fields.empty());
}

TEST_CASE("scan_request_head: incomplete heads") {
  CHECK(scan("").status == HeadStatus::incomplete);
  CHECK(scan("GET / HT").status == HeadStatus::incomplete);
  CHECK(scan("GET / HTTP/1.1\r").status == HeadStatus::incomplete);
  CHECK(scan("GET / HTTP/1.1\r\n").status == HeadStatus::incomplete);
  CHECK(scan("GET / HTTP/1.1\r\nHost: a\r\n").status == HeadStatus::incomplete);
  CHECK(scan("GET / HTTP/1.1\r\nHost: a\r\n\r").status == HeadStatus::incomplete);
}

TEST_CASE("scan_request_head: too_large") {
  const std::string head = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";  // 27 bytes
  REQUIRE(head.size() == 27);
  SUBCASE("no end yet and the buffer already holds max bytes") {
    std::string partial = "GET / HTTP/1.1\r\nX: " + std::string(100, 'a');
    CHECK(scan(partial, nullptr, 64).status == HeadStatus::too_large);
    CHECK(scan(partial.substr(0, 64), nullptr, 64).status == HeadStatus::too_large);
    CHECK(scan(partial.substr(0, 63), nullptr, 64).status == HeadStatus::incomplete);
  }
  SUBCASE("a complete head longer than max") {
    CHECK(scan(head, nullptr, 26).status == HeadStatus::too_large);
    CHECK(scan(head, nullptr, 20).status == HeadStatus::too_large);
  }
  SUBCASE("a head of exactly max bytes is complete") {
    HeadScan s = scan(head, nullptr, 27);
    CHECK(s.status == HeadStatus::complete);
    CHECK(s.length == 27);
    // Body bytes after the head do not count against the limit.
    CHECK(scan(head + std::string(100, 'b'), nullptr, 27).status == HeadStatus::complete);
  }
}

TEST_CASE("scan_request_head: malformed heads are bad") {
  SUBCASE("obsolete line folding") {
    check_bad("GET / HTTP/1.1\r\nHost: a\r\nX-A: one\r\n two\r\n\r\n");
    check_bad("GET / HTTP/1.1\r\nHost: a\r\nX-A: one\r\n\ttwo\r\n\r\n");
    check_bad("GET / HTTP/1.1\r\n Host: a\r\n\r\n");
  }
  SUBCASE("bare LF") {
    check_bad("GET / HTTP/1.1\r\nHost: a\nX-A: b\r\n\r\n");
    check_bad("GET / HTTP/1.1\nHost: a\r\n\r\n");
    check_bad("GET / HTTP/1.1\r\nHost: a\n\r\n\r\n");
    // Not complete yet, but hopeless already: no more bytes can make it valid.
    check_bad("GET / HTTP/1.1\nHost: a\r\n");
    check_bad("GET / HTTP/1.1\r\nHost: a\n\n");
  }
  SUBCASE("bare CR") {
    check_bad("GET / HTTP/1.1\r\nHost: a\rX-A: b\r\n\r\n");
    check_bad("GET / HTTP/1.1\r\nHost: a\r\r\n\r\n");
    check_bad("GET / HTTP/1.1\rHost: a\r\n\r\n");
    check_bad("GET / HTTP/1.1\r\nHost: a\rX");  // incomplete but hopeless
  }
  SUBCASE("NUL") {
    check_bad(bytes("GET / HTTP/1.1\r\nHost: a\r\nX-A: b\0c\r\n\r\n"));
    check_bad(bytes("GET / HTTP/1.1\r\nHost: a\0"));  // incomplete but hopeless
    check_bad(bytes("GET /\0 HTTP/1.1\r\nHost: a\r\n\r\n"));
  }
  SUBCASE("whitespace before the colon") {
    check_bad("GET / HTTP/1.1\r\nHost : a\r\n\r\n");
    check_bad("GET / HTTP/1.1\r\nHost\t: a\r\n\r\n");
    check_bad("GET / HTTP/1.1\r\nHost: a\r\nContent-Length : 5\r\n\r\n");
  }
  SUBCASE("empty field name or no colon") {
    check_bad("GET / HTTP/1.1\r\nHost: a\r\n: b\r\n\r\n");
    check_bad("GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n");
  }
  SUBCASE("invalid character in a field name") {
    check_bad("GET / HTTP/1.1\r\nHo\"st: a\r\n\r\n");
    check_bad("GET / HTTP/1.1\r\nX(A): a\r\nHost: a\r\n\r\n");
    check_bad("GET / HTTP/1.1\r\nX/A: a\r\nHost: a\r\n\r\n");
    check_bad("GET / HTTP/1.1\r\nX\x80" "A: a\r\nHost: a\r\n\r\n");
  }
  SUBCASE("control character in a field value") {
    check_bad("GET / HTTP/1.1\r\nHost: a\x01" "b\r\n\r\n");
    check_bad("GET / HTTP/1.1\r\nHost: a\x7f\r\n\r\n");
    check_bad("GET / HTTP/1.1\r\nHost: a\r\nX-A: \x1b[0m\r\n\r\n");
  }
  SUBCASE("bad HTTP version") {
    check_bad("GET / HTTP/2.0\r\nHost: a\r\n\r\n");
    check_bad("GET / HTTP/1.1x\r\nHost: a\r\n\r\n");
    check_bad("GET / http/1.1\r\nHost: a\r\n\r\n");
    check_bad("GET / HTTP/1.2\r\nHost: a\r\n\r\n");
    check_bad("GET / HTTP/0.9\r\nHost: a\r\n\r\n");
    check_bad("GET / HTTP/1.1 \r\nHost: a\r\n\r\n");
    check_bad("GET / \r\nHost: a\r\n\r\n");
  }
  SUBCASE("malformed request line") {
    check_bad("GET HTTP/1.1\r\nHost: a\r\n\r\n");  // missing target
    check_bad("GET  / HTTP/1.1\r\nHost: a\r\n\r\n");  // two spaces
    check_bad(" GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    check_bad("GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n");
    check_bad("G(T / HTTP/1.1\r\nHost: a\r\n\r\n");    // method is a token
    check_bad("GET /a b HTTP/1.1\r\nHost: a\r\n\r\n");  // space in target
    check_bad("GET /\x7f HTTP/1.1\r\nHost: a\r\n\r\n");
    check_bad("GET /\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n");  // raw non-ASCII in target
  }
  SUBCASE("leading empty line") {
    check_bad("\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n");
  }
}

TEST_CASE("scan_request_head: absolute-form passes the scan (routing refuses it later)") {
  RequestHead h;
  HeadScan s = scan("GET http://example.com/x HTTP/1.1\r\nHost: example.com\r\n\r\n", &h);
  REQUIRE(s.status == HeadStatus::complete);
  CHECK(h.target == "http://example.com/x");
}

TEST_CASE("scan_request_head: obs-text (bytes >= 0x80) in a field value is allowed") {
  RequestHead h;
  HeadScan s = scan("GET / HTTP/1.1\r\nHost: a\r\nX-Name: caf\xc3\xa9\r\n\r\n", &h);
  REQUIRE(s.status == HeadStatus::complete);
  CHECK(h.fields[1].value == "caf\xc3\xa9");
}

TEST_CASE("head_prefix_hopeless") {
  CHECK_FALSE(head_prefix_hopeless("", 0));
  CHECK_FALSE(head_prefix_hopeless("GET / HTTP/1.1\r", 0));
  CHECK_FALSE(head_prefix_hopeless("GET / HTTP/1.1\r\nHost: a\r\n", 0));
  CHECK_FALSE(head_prefix_hopeless("GET / HTTP/1.1\r\nHost: a\r\n\r\n", 0));
  CHECK(head_prefix_hopeless("GET / HTTP/1.1\n", 0));
  CHECK(head_prefix_hopeless("\n", 0));
  CHECK(head_prefix_hopeless("GET / HTTP/1.1\rX", 0));
  CHECK(head_prefix_hopeless("\r\r", 0));
  CHECK(head_prefix_hopeless(std::string_view("GET \0", 5), 0));

  SUBCASE("judges only bytes from `from` on, looking back one byte across the boundary") {
    const std::string_view bare_lf_early = "GET /\n HTTP/1.1\r\n";
    CHECK(head_prefix_hopeless(bare_lf_early, 0));
    CHECK_FALSE(head_prefix_hopeless(bare_lf_early, 7));
    // A CR at the end of the previous chunk and an LF at `from`: a proper CRLF.
    const std::string_view split_crlf = "GET / HTTP/1.1\r\nHost: a\r\n";
    CHECK_FALSE(head_prefix_hopeless(split_crlf, 15));
    // A CR at the end of the previous chunk and something else at `from`: a bare CR.
    const std::string_view split_bare_cr = "GET / HTTP/1.1\rH";
    CHECK(head_prefix_hopeless(split_bare_cr, 15));
    // LF at `from` with no CR before it.
    const std::string_view split_bare_lf = "GET / HTTP/1.1\n";
    CHECK(head_prefix_hopeless(split_bare_lf, 14));
  }
}

TEST_CASE("check_framing: accepted framings") {
  SUBCASE("Content-Length") {
    Framing f = framing_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n\r\n");
    CHECK(f.ok);
    CHECK(f.reason.empty());
    REQUIRE(f.content_length.has_value());
    CHECK(*f.content_length == 12);
    CHECK_FALSE(f.chunked);
  }
  SUBCASE("Content-Length 0 and the largest 19-digit value") {
    Framing f = framing_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n");
    CHECK(f.ok);
    CHECK(f.content_length == std::optional<std::uint64_t>(0));
    f = framing_of("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9999999999999999999\r\n\r\n");
    CHECK(f.ok);
    CHECK(f.content_length == std::optional<std::uint64_t>(9999999999999999999ull));
  }
  SUBCASE("chunked, case-insensitive") {
    Framing f = framing_of("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n");
    CHECK(f.ok);
    CHECK(f.chunked);
    CHECK_FALSE(f.content_length.has_value());
    f = framing_of("POST / HTTP/1.1\r\nHost: a\r\ntransfer-encoding: Chunked\r\n\r\n");
    CHECK(f.ok);
    CHECK(f.chunked);
    f = framing_of("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: CHUNKED \r\n\r\n");
    CHECK(f.ok);
    CHECK(f.chunked);
  }
  SUBCASE("no body framing at all") {
    Framing f = framing_of("GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    CHECK(f.ok);
    CHECK_FALSE(f.chunked);
    CHECK_FALSE(f.content_length.has_value());
  }
  SUBCASE("HTTP/1.0 without Host") {
    Framing f = framing_of("POST / HTTP/1.0\r\nContent-Length: 3\r\n\r\n");
    CHECK(f.ok);
    CHECK(f.content_length == std::optional<std::uint64_t>(3));
  }
  SUBCASE("HTTP/1.0 with one Host") {
    CHECK(framing_of("GET / HTTP/1.0\r\nHost: a\r\n\r\n").ok);
  }
  SUBCASE("host header name is case-insensitive") {
    CHECK(framing_of("GET / HTTP/1.1\r\nhOsT: a\r\n\r\n").ok);
  }
}

TEST_CASE("check_framing: Host values that are host[:port] are accepted") {
  for (const char* host : {"a", "example.com", "example.com:8080", "127.0.0.1:1", "[::1]", "[::1]:8443",
                           "[fe80::1%25eth0]", "xn--bcher-kva.example", "a_b.local", "a:", ""}) {
    CAPTURE(host);
    CHECK(framing_of(std::string("GET / HTTP/1.1\r\nHost: ") + host + "\r\n\r\n").ok);
  }
  CHECK(framing_of("GET / HTTP/1.0\r\n\r\n").ok);  // HTTP/1.0 may omit it
}

TEST_CASE("check_framing: a Host port must be a number in 1..65535") {
  for (const char* host : {"a:1", "a:80", "a:65535", "a:00080", "[::1]:65535", "a:"}) {
    CAPTURE(host);
    CHECK(framing_of(std::string("GET / HTTP/1.1\r\nHost: ") + host + "\r\n\r\n").ok);
  }
  for (const char* host : {"a:0", "a:00000", "a:65536", "a:99999", "[::1]:0", "[::1]:99999", "a:-1", "a:+80",
                           "a:8o", "127.0.0.1:0"}) {
    CAPTURE(host);
    const Framing f = framing_of(std::string("GET / HTTP/1.1\r\nHost: ") + host + "\r\n\r\n");
    CHECK_FALSE(f.ok);
    CHECK(f.reason.find("Host") != std::string::npos);
  }
}

TEST_CASE("check_framing: refused framings") {
  const char* bad[] = {
      // CL and TE together, in either order
      "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
      // two Content-Length fields, even equal
      "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\ncontent-length: 6\r\n\r\n",
      // list-valued, signed, empty, non-decimal, overflowing Content-Length
      "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5,5\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -5\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: \r\n\r\n",
      "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x10\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1 2\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551616\r\n\r\n",
      // transfer codings other than a single chunked
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \r\n\r\n",
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked;x=1\r\n\r\n",
      // TE twice (even chunked twice)
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
      // TE in HTTP/1.0
      "POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
      // Host missing in 1.1, or repeated
      "POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n",
      "GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n",
      // Host values that are not host[:port]: a virtual-host router may read them another way
      "GET / HTTP/1.1\r\nHost: evil.example/p?q\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: a b\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: user@a\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: <x>\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: [::1\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: []\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: [::1]x\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: a:8x\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: a:1:2\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: a:123456\r\n\r\n",
      "GET / HTTP/1.0\r\nHost: a\"b\r\n\r\n",
      // framing fields spelled with '_' (CGI-style servers read them as the real ones)
      "POST / HTTP/1.1\r\nHost: a\r\nTransfer_Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: a\r\ncontent_length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: a\r\nContent_Length: 5\r\n\r\n",
  };
  for (const char* data : bad) {
    CAPTURE(std::string(data));
    Framing f = framing_of(data);
    CHECK_FALSE(f.ok);
    CHECK_FALSE(f.reason.empty());
  }
}

TEST_CASE("iequals and is_tchar") {
  CHECK(iequals("Content-Length", "content-LENGTH"));
  CHECK_FALSE(iequals("Host", "Hosts"));
  CHECK_FALSE(iequals("a", "b"));
  CHECK(iequals("", ""));
  // Only ASCII letters fold: '@' (0x40) and '`' (0x60) differ by 32 but are not letters.
  CHECK_FALSE(iequals("@", "`"));
  CHECK_FALSE(iequals("[", "{"));
  CHECK(is_tchar('a'));
  CHECK(is_tchar('~'));
  CHECK(is_tchar('!'));
  CHECK_FALSE(is_tchar(' '));
  CHECK_FALSE(is_tchar(':'));
  CHECK_FALSE(is_tchar('"'));
  CHECK_FALSE(is_tchar('('));
  CHECK_FALSE(is_tchar(0x80));
  CHECK_FALSE(is_tchar(0));
}

// The relay decides what to strip, restate or refuse by these kinds alone, so a field the
// classifier misses is a field the relay passes through untouched.
TEST_CASE("classify_field: every special field in any letter case, and near misses stay other") {
  struct Case {
    const char* name;
    FieldKind kind;
  };
  const Case cases[] = {
      {"Host", FieldKind::host},
      {"hOST", FieldKind::host},
      {"Content-Length", FieldKind::content_length},
      {"CONTENT-LENGTH", FieldKind::content_length},
      {"Transfer-Encoding", FieldKind::transfer_encoding},
      {"transfer-encoding", FieldKind::transfer_encoding},
      {"Content_Length", FieldKind::framing_alias},
      {"content_length", FieldKind::framing_alias},
      {"Transfer_Encoding", FieldKind::framing_alias},
      {"TRANSFER_ENCODING", FieldKind::framing_alias},
      {"Fencing_Token", FieldKind::framing_alias},
      {"fencing_leader", FieldKind::framing_alias},
      {"X_Forwarded_For", FieldKind::framing_alias},
      {"X-Forwarded_For", FieldKind::framing_alias},
      {"Connection", FieldKind::connection},
      {"Upgrade", FieldKind::upgrade},
      {"Keep-Alive", FieldKind::hop_by_hop},
      {"Proxy-Connection", FieldKind::hop_by_hop},
      {"te", FieldKind::hop_by_hop},
      {"Trailer", FieldKind::hop_by_hop},
      {"Proxy-Authenticate", FieldKind::hop_by_hop},
      {"Proxy-Authorization", FieldKind::hop_by_hop},
      {"Expect", FieldKind::expect},
      {"x-forwarded-for", FieldKind::x_forwarded_for},
      {"Forwarded", FieldKind::forwarded},
      {"User-Agent", FieldKind::user_agent},
      {"Fencing-Generation", FieldKind::fencing_generation},
      {"fencing-observe", FieldKind::fencing_observe},
      {"Fencing-Token", FieldKind::fencing_token},
      {"FENCING-TOKEN", FieldKind::fencing_token},
      {"fencing-leader", FieldKind::fencing_leader},
      // Near misses.
      {"Content-Lengt", FieldKind::other},
      {"Content-Length2", FieldKind::other},
      {"Content+Length", FieldKind::other},
      {"Content_Type", FieldKind::other},
      {"Transfer-Encodinh", FieldKind::other},
      {"Hos", FieldKind::other},
      {"X-Forwarded-Host", FieldKind::other},
      {"Fencing-Tokens", FieldKind::other},
      {"Content-L@ngth", FieldKind::other},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    CHECK(classify_field(c.name) == c.kind);
  }
  // The scanner records each field's kind and the set of kinds present.
  RequestHead h;
  HeadScan s = scan("POST / HTTP/1.1\r\nHost: a\r\nconnection: close\r\nX-A: 1\r\nContent-Length: 0\r\n\r\n", &h);
  REQUIRE(s.status == HeadStatus::complete);
  REQUIRE(h.fields.size() == 4);
  CHECK(h.fields[0].kind == FieldKind::host);
  CHECK(h.fields[1].kind == FieldKind::connection);
  CHECK(h.fields[2].kind == FieldKind::other);
  CHECK(h.fields[3].kind == FieldKind::content_length);
  CHECK(h.has(FieldKind::connection));
  CHECK(h.has(FieldKind::content_length));
  CHECK_FALSE(h.has(FieldKind::transfer_encoding));
  CHECK_FALSE(h.has(FieldKind::upgrade));
}

// Field values are checked eight bytes at a time; a bad byte must be found at every offset of
// a block and in the tail, and the bytes a value may hold must pass wherever they are.
TEST_CASE("scan_request_head: a control byte anywhere in a field value is refused") {
  for (std::size_t len : {1u, 7u, 8u, 9u, 15u, 16u, 17u, 31u}) {
    for (std::size_t at = 0; at < len; ++at) {
      for (int bad : {0x01, 0x08, 0x0b, 0x1f, 0x7f}) {
        std::string value(len, 'v');
        value[at] = static_cast<char>(bad);
        RequestHead h;
        HeadScan s = scan("GET / HTTP/1.1\r\nHost: a\r\nX-V: " + value + "\r\n\r\n", &h);
        INFO("len ", len, " at ", at, " byte ", int(bad));
        CHECK(s.status == HeadStatus::bad);
      }
      for (int good : {0x09, 0x20, 0x7e, 0x80, 0xff}) {
        std::string value(len, 'v');
        value[at] = static_cast<char>(good);
        RequestHead h;
        HeadScan s = scan("GET / HTTP/1.1\r\nHost: a\r\nX-V: x" + value + "x\r\n\r\n", &h);
        INFO("len ", len, " at ", at, " byte ", int(good));
        CHECK(s.status == HeadStatus::complete);
      }
    }
  }
}
