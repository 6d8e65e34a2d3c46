// Parsing ambiguity is a hole in the fence: malformed framing gets 400 and a closed connection,
// and nothing of it (nor anything pipelined after it) reaches the upstream. Limits: 431, 413,
// 408, connection count; CONNECT and Upgrade get 501.
#include "tests/integration/harness.h"

using namespace fencegate::testing;

namespace {

struct Bad {
  std::string name;
  std::string bytes;
};

// A request head with a valid token (so it would be forwarded if it parsed), then `rest`.
std::string head(const std::string& extra_headers, const std::string& method = "POST", const std::string& target = "/x") {
  return method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Token: 1\r\n" + extra_headers;
}

const std::string kSmuggled = "POST /smuggled HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Token: 1\r\nContent-Length: 0\r\n\r\n";

ProxySpec spec_for(const RecordingUpstream& up, std::vector<std::string> args = {}) {
  ProxySpec s;
  s.upstream = up.url();
  s.args = std::move(args);
  return s;
}

// After each case: the proxy must still run. If it died, say so and start it again, so the
// remaining cases still report their own results.
void check_survived(Proxy& px) {
  auto st = px.process().wait_for(100ms);  // a crash while finishing the exchange shows up here
  if (!st) return;
  CHECK_MESSAGE(false, "fencegate died after this request: ", st->describe(), "\n", px.log(4096));
  REQUIRE_MESSAGE(px.start(), "restart failed\n", px.log_for_failure());
}

// Sends a valid write and checks it is the only thing the upstream ever saw.
void check_only_control_reached(Proxy& px, RecordingUpstream& up) {
  auto ok = request(px.port(), "POST", "/control", token(1));
  INFO("control request: ", describe(ok));
  CHECK(is_2xx(ok));
  auto reqs = up.requests();
  std::string seen;
  for (const auto& r : reqs) seen += r.method + " " + r.target + "\n" + r.raw_head;
  INFO("upstream saw:\n", seen);
  REQUIRE(reqs.size() == 1);
  CHECK(reqs[0].target == "/control");
}

}  // namespace

TEST_SUITE("framing") {

TEST_CASE("framing: ambiguous or malformed requests get 400, the connection is closed, nothing forwarded") {
  RecordingUpstream up;
  Proxy px(spec_for(up));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  const std::vector<Bad> cases{
      {"Content-Length and Transfer-Encoding",
       head("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n") + "5\r\nhello\r\n0\r\n\r\n"},
      {"Transfer-Encoding and Content-Length (other order)",
       head("Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n") + "5\r\nhello\r\n0\r\n\r\n"},
      {"two different Content-Length", head("Content-Length: 5\r\nContent-Length: 6\r\n\r\n") + "hello!"},
      {"Content-Length list with different values", head("Content-Length: 5, 6\r\n\r\n") + "hello!"},
      {"Content-Length +5", head("Content-Length: +5\r\n\r\n") + "hello"},
      {"Content-Length -1", head("Content-Length: -1\r\n\r\n")},
      {"Content-Length 0x5", head("Content-Length: 0x5\r\n\r\n") + "hello"},
      {"Content-Length not a number", head("Content-Length: five\r\n\r\n") + "hello"},
      {"Transfer-Encoding gzip, chunked", head("Transfer-Encoding: gzip, chunked\r\n\r\n") + "0\r\n\r\n"},
      {"Transfer-Encoding chunked, gzip", head("Transfer-Encoding: chunked, gzip\r\n\r\n") + "0\r\n\r\n"},
      {"Transfer-Encoding chunked twice",
       head("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n") + "0\r\n\r\n"},
      {"Transfer-Encoding chunked, chunked", head("Transfer-Encoding: chunked, chunked\r\n\r\n") + "0\r\n\r\n"},
      {"Transfer-Encoding identity", head("Transfer-Encoding: identity\r\n\r\n") + "0\r\n\r\n"},
      {"Transfer-Encoding xchunked", head("Transfer-Encoding: xchunked\r\n\r\n") + "0\r\n\r\n"},
      {"Fencing_Token beside Fencing-Token (CGI-style servers join them)",
       head("Fencing_Token: 0\r\nContent-Length: 0\r\n\r\n")},
      {"Fencing_Leader", head("Fencing_Leader: other\r\nContent-Length: 0\r\n\r\n")},
      {"X_Forwarded_For", head("X_Forwarded_For: 10.0.0.1\r\nContent-Length: 0\r\n\r\n")},
      {"obs-fold header line", head("X-Folded: a\r\n  continued\r\nContent-Length: 0\r\n\r\n")},
      {"obs-fold with tab", head("X-Folded: a\r\n\tcontinued\r\nContent-Length: 0\r\n\r\n")},
      {"bare LF line endings",
       "POST /x HTTP/1.1\nHost: 127.0.0.1\nFencing-Token: 1\nContent-Length: 0\n\n"},
      {"NUL in a header value", head(std::string("X-Nul: a") + '\0' + "b\r\nContent-Length: 0\r\n\r\n")},
      {"CR inside a header value", head("X-Cr: a\rb\r\nContent-Length: 0\r\n\r\n")},
      {"space before the colon", head("X-Name : v\r\nContent-Length: 0\r\n\r\n")},
      {"space inside a header name", head("X Name: v\r\nContent-Length: 0\r\n\r\n")},
      {"empty header name", head(": v\r\nContent-Length: 0\r\n\r\n")},
      {"invalid character in a header name", head("X-N\"ame: v\r\nContent-Length: 0\r\n\r\n")},
      {"malformed chunk size", head("Transfer-Encoding: chunked\r\n\r\n") + "zz\r\nhello\r\n0\r\n\r\n"},
      {"pipelined request after CL+TE",
       head("Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n") + "0\r\n\r\n" + kSmuggled},
      {"pipelined request after duplicate Content-Length",
       head("Content-Length: 0\r\nContent-Length: 92\r\n\r\n") + kSmuggled},
      {"pipelined request after obs-fold", head("X-F: a\r\n b\r\nContent-Length: 0\r\n\r\n") + kSmuggled},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    HttpClient client;
    auto r = send_raw(client, px.port(), c.bytes, 10s);
    INFO(describe(r));
    CHECK(r.ok());
    CHECK(r.code() == 400);
    CHECK_MESSAGE(client.wait_closed(5s), "connection not closed after 400");
    CHECK(up.count() == 0);
    check_survived(px);
  }
  // A chunk-size error is found mid-body; the upstream must not get a complete request either way.
  check_only_control_reached(px, up);
}

TEST_CASE("framing: a Host whose port is not a number in 1..65535 gets 400, nothing forwarded") {
  RecordingUpstream up;
  Proxy px(spec_for(up));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  for (const char* host : {"127.0.0.1:0", "127.0.0.1:99999", "127.0.0.1:65536", "[::1]:0", "127.0.0.1:8o"}) {
    CAPTURE(host);
    HttpClient client;
    auto r = send_raw(client, px.port(),
                      std::string("POST /x HTTP/1.1\r\nHost: ") + host + "\r\nFencing-Token: 1\r\nContent-Length: 0\r\n\r\n",
                      10s);
    INFO(describe(r));
    CHECK(r.ok());
    CHECK(r.code() == 400);
    CHECK(up.count() == 0);
  }
  // An empty port after ':' is allowed (RFC 3986 3.2.3), as are ports in range.
  HttpClient client;
  auto ok = send_raw(client, px.port(),
                     "POST /y HTTP/1.1\r\nHost: 127.0.0.1:\r\nFencing-Token: 1\r\nContent-Length: 0\r\n\r\n", 10s);
  INFO(describe(ok));
  CHECK(ok.code() == 200);
  auto in_range = request(px.port(), "POST", "/z", token(1));
  CHECK(is_2xx(in_range));
}

TEST_CASE("framing: a bad request on a keep-alive connection stops that connection") {
  RecordingUpstream up;
  Proxy px(spec_for(up));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  HttpClient c;
  REQUIRE(c.connect(px.port()));
  REQUIRE(is_2xx(c.request("POST", "/first", token(1))));
  REQUIRE(c.send(head("Content-Length: 1\r\nContent-Length: 2\r\n\r\n") + "ab" + kSmuggled));
  auto r = c.read_response();
  INFO(describe(r));
  REQUIRE(r.ok());
  CHECK(r.response.status == 400);
  CHECK(c.wait_closed(5s));
  auto reqs = up.requests();
  REQUIRE(reqs.size() == 1);
  CHECK(reqs[0].target == "/first");
}

TEST_CASE("framing: empty lines before a request line are ignored, and not forwarded") {
  RecordingUpstream up;
  Proxy px(spec_for(up));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  HttpClient c;
  REQUIRE(c.connect(px.port()));
  // One CRLF before the first request, and the stray CRLF some clients send after a body.
  REQUIRE(c.send("\r\nPOST /a HTTP/1.1\r\nHost: a\r\nFencing-Token: 1\r\nContent-Length: 2\r\n\r\nab\r\n"
                 "\r\nPOST /b HTTP/1.1\r\nHost: a\r\nFencing-Token: 1\r\nContent-Length: 2\r\n\r\ncd"));
  for (int i = 0; i < 2; ++i) {
    auto r = c.read_response();
    INFO(describe(r));
    REQUIRE(r.ok());
    CHECK(r.response.status == 200);
  }
  auto reqs = up.requests();
  REQUIRE(reqs.size() == 2);
  CHECK(reqs[0].target == "/a");
  CHECK(reqs[0].body == "ab");
  CHECK(reqs[1].target == "/b");
  CHECK(reqs[1].body == "cd");
  // A line that is not empty is still a bad request line.
  HttpClient d;
  REQUIRE(d.connect(px.port()));
  REQUIRE(d.send(" \r\nGET /c HTTP/1.1\r\nHost: a\r\n\r\n"));
  auto r = d.read_response();
  REQUIRE(r.ok());
  CHECK(r.response.status == 400);
  CHECK(up.requests().size() == 2);
}

TEST_CASE("framing: oversized header 431, over-long request line 414, oversized body 413, slow header 408") {
  RecordingUpstream up;
  Proxy px(spec_for(up, {"--max-header-bytes", "4096", "--max-body-bytes", "1000", "--header-timeout-ms", "500"}));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);

  SUBCASE("431") {
    HttpClient c;
    auto r = send_raw(c, px.port(), head("X-Big: " + std::string(8000, 'a') + "\r\nContent-Length: 0\r\n\r\n"));
    INFO(describe(r));
    REQUIRE(r.ok());
    CHECK(r.response.status == 431);
    check_survived(px);
    // Many small headers adding up over the limit count too.
    std::string many;
    for (int i = 0; i < 200; ++i) many += "X-H" + std::to_string(i) + ": " + std::string(30, 'b') + "\r\n";
    HttpClient c2;
    auto r2 = send_raw(c2, px.port(), head(many + "Content-Length: 0\r\n\r\n"));
    INFO(describe(r2));
    REQUIRE(r2.ok());
    CHECK(r2.response.status == 431);
    // A request line that alone is over the limit: the target is too long (414), same closing.
    HttpClient c3;
    auto r3 = send_raw(c3, px.port(), "GET /" + std::string(8000, 'p') + " HTTP/1.1\r\nHost: x\r\n\r\n");
    INFO(describe(r3));
    REQUIRE(r3.ok());
    CHECK(r3.response.status == 414);
    CHECK(c3.wait_closed(2s));
    CHECK(up.count() == 0);
  }
  SUBCASE("413 on a declared Content-Length") {
    HttpClient c;
    // Only the head: the proxy must decide without the body.
    auto r = send_raw(c, px.port(), head("Content-Length: 5000\r\n\r\n"));
    INFO(describe(r));
    REQUIRE(r.ok());
    CHECK(r.response.status == 413);
    // A fenced write: the refusal still names the fence (nothing stored yet: generation 0).
    CHECK(r.response.header("Fencing-Generation") == "0");
    CHECK(body_json(r).value("resource", "") == "default");
  }
  SUBCASE("413 on a chunked body that grows over the limit") {
    HttpClient c;
    std::string body = chunked(std::string(1500, 'c'), 500);
    auto r = send_raw(c, px.port(), head("Transfer-Encoding: chunked\r\n\r\n") + body);
    INFO(describe(r));
    REQUIRE(r.ok());
    CHECK(r.response.status == 413);
    CHECK(r.response.header("Fencing-Generation") == "1");  // admitted (advanced to 1), then refused
    CHECK(body_json(r).value("presented_generation", 0) == 1);
  }
  SUBCASE("408 when the head does not arrive in time") {
    HttpClient c;
    REQUIRE(c.connect(px.port()));
    REQUIRE(c.send("POST /slow HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-To"));
    auto t0 = Clock::now();
    auto r = c.read_response(10s);
    INFO(describe(r));
    REQUIRE(r.ok());
    CHECK(r.response.status == 408);
    CHECK(ms_between(t0, Clock::now()) >= 300);
    CHECK(c.wait_closed(5s));
  }
  SUBCASE("a body within the limit passes") {
    CHECK(is_2xx(request(px.port(), "POST", "/ok", token(1), std::string(1000, 'd'))));
    REQUIRE(up.count() == 1);
    CHECK(up.requests()[0].body.size() == 1000);
    return;
  }
  auto reqs = up.requests();
  for (const auto& q : reqs) INFO("upstream saw: ", q.target);
  CHECK(up.count() == 0);
}

TEST_CASE("framing: CONNECT and Upgrade get 501 and are not forwarded") {
  RecordingUpstream up;
  Proxy px(spec_for(up));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  const std::vector<Bad> cases{
      {"CONNECT", "CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1:443\r\n\r\n"},
      {"websocket upgrade", "GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"},
      {"h2c upgrade on a write", head("Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\nContent-Length: 0\r\n\r\n")},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    HttpClient client;
    auto r = send_raw(client, px.port(), c.bytes);
    INFO(describe(r));
    CHECK(r.ok());
    CHECK(r.code() == 501);
    check_survived(px);
  }
  check_only_control_reached(px, up);
}

TEST_CASE("framing: refusals before the fence decision still carry Fencing-Generation on a fenced route") {
  RecordingUpstream up;
  Proxy px(spec_for(up));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  REQUIRE(is_2xx(request(px.port(), "POST", "/control", token(3))));  // stored generation: 3
  const std::vector<std::pair<std::string, int>> cases{
      {head("Expect: something-else\r\nContent-Length: 0\r\n\r\n"), 417},
      {head("Connection: Upgrade\r\nUpgrade: websocket\r\nContent-Length: 0\r\n\r\n"), 501},
      {head("Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"), 400},
      {head("Connection: Fencing-Token\r\nContent-Length: 0\r\n\r\n"), 400},
  };
  for (const auto& [bytes, code] : cases) {
    CAPTURE(bytes);
    HttpClient client;
    auto r = send_raw(client, px.port(), bytes);
    INFO(describe(r));
    REQUIRE(r.ok());
    CHECK(r.code() == code);
    CHECK(r.response.header("Fencing-Generation") == "3");
    CHECK(body_json(r).value("resource", "") == "default");
  }
  // A path no route takes names no resource, so no generation either.
  HttpClient client;
  auto r = send_raw(client, px.port(), head("Content-Length: 0\r\n\r\n", "POST", "//x"));
  REQUIRE(r.ok());
  CHECK(r.code() == 400);
  CHECK_FALSE(r.response.has("Fencing-Generation"));
}

TEST_CASE("framing: the connection limit holds extra connections off") {
  RecordingUpstream up;
  Proxy px(spec_for(up, {"--max-connections", "4"}));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  std::vector<HttpClient> held(4);
  for (auto& c : held) {
    REQUIRE(c.connect(px.port()));
    REQUIRE(is_2xx(c.request("GET", "/held")));
  }
  // A fifth connection is not served while four are open (refused, closed, or left waiting).
  HttpClient extra;
  if (extra.connect(px.port(), 2s)) {
    extra.send(build_request("GET", "/extra"));
    auto r = extra.read_response(1500ms);
    INFO(describe(r));
    CHECK_FALSE(is_2xx(r));
  }
  held.clear();
  // Once they are gone, new connections are served again.
  ReadResult again;
  for (int i = 0; i < 50 && !is_2xx(again); ++i) {
    again = request(px.port(), "GET", "/again", {}, {}, 3s);
    if (!is_2xx(again)) std::this_thread::sleep_for(100ms);
  }
  INFO(describe(again));
  CHECK(is_2xx(again));
}

TEST_CASE("framing: an idle keep-alive connection is closed after the idle timeout") {
  RecordingUpstream up;
  Proxy px(spec_for(up, {"--idle-timeout-ms", "500"}));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  HttpClient c;
  REQUIRE(c.connect(px.port()));
  REQUIRE(is_2xx(c.request("GET", "/a")));
  CHECK(c.wait_closed(5s));
}

}  // TEST_SUITE

// Parked connections: a keep-alive connection idle past the hot window (~50 ms) leaves the
// Asio reactor for the worker's parked set; the next request must find it again, whatever
// state the client leaves it in.
TEST_SUITE("framing") {

TEST_CASE("framing: a parked keep-alive connection serves its next requests, split or pipelined") {
  RecordingUpstream up;
  Proxy px(spec_for(up));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  HttpClient c;
  REQUIRE(c.connect(px.port()));
  REQUIRE(is_2xx(c.request("POST", "/p0", token(1), "zero")));
  for (int i = 1; i <= 3; ++i) {
    std::this_thread::sleep_for(200ms);  // parked by now
    auto r = c.request("POST", "/p" + std::to_string(i), token(1), "body");
    INFO(describe(r));
    CHECK(is_2xx(r));
  }
  // A head that arrives in two pieces, the first one after the connection parked.
  std::this_thread::sleep_for(200ms);
  const std::string req = build_request("POST", "/split", token(1), "split");
  REQUIRE(c.send(req.substr(0, 10)));
  std::this_thread::sleep_for(200ms);
  REQUIRE(c.send(req.substr(10)));
  auto split = c.read_response(5s);
  INFO(describe(split));
  CHECK(is_2xx(split));
  // Two pipelined requests that wake a parked connection together.
  std::this_thread::sleep_for(200ms);
  REQUIRE(c.send(build_request("POST", "/pipe1", token(1), "a") + build_request("POST", "/pipe2", token(1), "b")));
  auto r1 = c.read_response(5s), r2 = c.read_response(5s);
  INFO(describe(r1), " / ", describe(r2));
  CHECK(is_2xx(r1));
  CHECK(is_2xx(r2));
  std::vector<std::string> targets;
  for (const auto& rec : up.requests()) targets.push_back(rec.target);
  CHECK(targets == std::vector<std::string>{"/p0", "/p1", "/p2", "/p3", "/split", "/pipe1", "/pipe2"});
}

TEST_CASE("framing: hundreds of connections going idle together all park and are all served again") {
  RecordingUpstream up;
  Proxy px(spec_for(up));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  // Hundreds of connections go idle within one hot window and park together (the worker's
  // parked set wakes many at once). The cap on connections waiting hot (4096 per worker) is
  // not reached here; that branch only changes when a connection parks, not how.
  constexpr int kConns = 700;
  std::vector<HttpClient> cs(kConns);
  int first_ok = 0, second_ok = 0;
  for (auto& c : cs) {
    if (!c.connect(px.port())) break;
    first_ok += is_2xx(c.request("GET", "/first"));
  }
  CHECK(first_ok == kConns);
  for (auto& c : cs) second_ok += c.connected() && is_2xx(c.request("GET", "/second", {}, {}, 5s));
  CHECK(second_ok == kConns);
  // Clients that close while parked release their connection slots.
  cs.clear();
  std::this_thread::sleep_for(300ms);
  auto after = request(px.port(), "GET", "/after");
  INFO(describe(after));
  CHECK(is_2xx(after));
}

TEST_CASE("framing: a connection that closes while parked is closed by the proxy too") {
  RecordingUpstream up;
  Proxy px(spec_for(up, {"--max-connections", "3"}));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  // Fill all three slots with parked connections, then close them: had the proxy kept them,
  // no new connection would get a slot.
  for (int round = 0; round < 3; ++round) {
    std::vector<HttpClient> cs(3);
    for (auto& c : cs) {
      REQUIRE(c.connect(px.port()));
      REQUIRE(is_2xx(c.request("GET", "/fill")));
    }
    std::this_thread::sleep_for(150ms);  // parked
    cs.clear();
    std::this_thread::sleep_for(150ms);
  }
  auto r = request(px.port(), "GET", "/last");
  INFO(describe(r));
  CHECK(is_2xx(r));
}


// A client that writes its whole body before it reads (Python's http.client, so requests and
// urllib3): refused early, with most of the body unread, it must still get the answer. Closing at
// once with unread bytes would reset the connection, and it would see a broken pipe instead.
TEST_CASE("framing: a refused request's unread body is drained before the close, so the client reads the answer") {
  RecordingUpstream up;
  ProxySpec spec;
  spec.upstream = up.url();
  spec.args = {"--max-body-bytes", "1048576"};
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  REQUIRE(is_2xx(request(px.port(), "POST", "/a", token(5))));
  const std::string body(4 << 20, 'x');
  for (auto [tok, size, want] : {std::tuple{1, std::size_t(1000000), 409}, std::tuple{5, body.size(), 413}}) {
    CAPTURE(want);
    HttpClient c;
    REQUIRE(c.connect(px.port()));
    const std::string req = "POST /b HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Token: " + std::to_string(tok) +
                            "\r\nContent-Length: " + std::to_string(size) + "\r\n\r\n" + body.substr(0, size);
    CHECK(c.send(req));  // all of it, before reading anything
    auto r = c.read_response(5s);
    INFO(describe(r));
    REQUIRE(r.ok());
    CHECK(r.response.status == want);
  }
  CHECK(up.count() == 1);
}

}  // TEST_SUITE
