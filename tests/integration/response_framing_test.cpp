// What the client gets back when the upstream frames its response in each way HTTP/1.1 allows
// (Content-Length, chunked with extensions and trailers, close-delimited, interim 1xx), and that
// malformed or ambiguous upstream responses become a 502 rather than a desynchronised connection.
// The upstream here is a raw socket server answering canned bytes.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>

#include "tests/integration/harness.h"
#include "tests/integration/ops_harness.h"

namespace fencegate::testing {
namespace {

// Accepts on 127.0.0.1; for each request (head, then a Content-Length or chunked body) writes
// respond(n) where n counts requests over all connections; closes the connection after the
// response when the function says so.
class RawUpstream {
 public:
  struct Answer {
    std::string bytes;
    bool close_after = false;
    std::string late{};  // written late_ms after bytes, unasked (a buggy upstream)
    int late_ms = 0;
    int late_repeat = 1;  // `late` is written this many times, late_ms apart
  };
  explicit RawUpstream(std::function<Answer(int n, const std::string& head)> respond) : respond_(std::move(respond)) {
    fd_ = listen_loopback(&port_).release();
    REQUIRE(fd_ >= 0);
    thread_ = std::thread([this] { accept_loop(); });
  }
  ~RawUpstream() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
    for (auto& t : conns_) t.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  int connections() const { return connections_.load(); }

 private:
  void accept_loop() {
    while (!stop_) {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      ++connections_;
      std::lock_guard<std::mutex> l(m_);
      conns_.emplace_back([this, c] { serve(c); });
    }
  }
  void serve(int c) {
    std::string buf;
    char tmp[16384];
    for (;;) {
      std::size_t end;
      while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
        ssize_t n = ::recv(c, tmp, sizeof tmp, 0);
        if (n <= 0) return (void)::close(c);
        buf.append(tmp, static_cast<std::size_t>(n));
      }
      std::string head = buf.substr(0, end + 4);
      std::string lower = to_lower(head);
      std::size_t need = end + 4;
      if (auto p = lower.find("content-length:"); p != std::string::npos) need += std::stoul(lower.substr(p + 15));
      bool chunked = lower.find("transfer-encoding: chunked") != std::string::npos;
      while (chunked ? buf.find("0\r\n\r\n", end + 4) == std::string::npos : buf.size() < need) {
        ssize_t n = ::recv(c, tmp, sizeof tmp, 0);
        if (n <= 0) return (void)::close(c);
        buf.append(tmp, static_cast<std::size_t>(n));
      }
      buf.erase(0, chunked ? buf.find("0\r\n\r\n", end + 4) + 5 : need);
      Answer a = respond_(count_++, head);
      if (!write_all(c, a.bytes) || a.close_after) return (void)::close(c);
      for (int i = 0; i < a.late_repeat && !a.late.empty(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(a.late_ms));
        if (!write_all(c, a.late)) return (void)::close(c);
      }
    }
  }

  std::function<Answer(int, const std::string&)> respond_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> count_{0}, connections_{0};
  std::mutex m_;
  std::vector<std::thread> conns_;
  std::thread thread_;
};

ProxySpec spec_for(const std::string& upstream) {
  ProxySpec s;
  s.upstream = upstream;
  return s;
}

}  // namespace

TEST_CASE("response framing: chunked with extensions and trailers reaches a 1.1 client as its body") {
  RawUpstream up([](int, const std::string&) {
    return RawUpstream::Answer{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Up: 1\r\n\r\n"
                               "5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"};
  });
  Proxy px(spec_for(up.url()));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  HttpClient c;
  REQUIRE(c.connect(px.port()));
  for (int i = 0; i < 3; ++i) {  // the same client connection and the same upstream connection
    auto r = c.request("GET", "/x");
    INFO(describe(r));
    REQUIRE(r.ok());
    CHECK(r.response.status == 200);
    CHECK(r.response.body == "hello world");
    CHECK(r.response.header("Transfer-Encoding") == "chunked");
    CHECK(r.response.header("X-Up") == "1");
    CHECK_FALSE(r.response.has("X-Trailer"));
  }
  CHECK(up.connections() == 1);
}

TEST_CASE("response framing: a close-delimited body under another transfer coding keeps its label") {
  RawUpstream up([](int, const std::string&) {
    return RawUpstream::Answer{"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nnot-really-gzip", true};
  });
  Proxy px(spec_for(up.url()));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  auto r = request(px.port(), "GET", "/g");
  INFO(describe(r));
  REQUIRE(r.ok());
  CHECK(r.response.header("Transfer-Encoding") == "gzip, chunked");  // not just "chunked"
  CHECK(r.response.body == "not-really-gzip");
}

TEST_CASE("response framing: a response without a Date gets one; an upstream's own Date is kept") {
  RawUpstream up([](int, const std::string& head) {
    if (head.find("/dated") != std::string::npos)
      return RawUpstream::Answer{"HTTP/1.1 200 OK\r\nDate: Tue, 01 Dec 2026 00:00:00 GMT\r\nContent-Length: 1\r\n\r\nd"};
    return RawUpstream::Answer{"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nu"};
  });
  Proxy px(spec_for(up.url()));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  auto r = request(px.port(), "GET", "/undated");
  REQUIRE(r.ok());
  CHECK(r.response.headers_named("Date").size() == 1);
  CHECK(r.response.header("Date").size() == 29);  // IMF-fixdate
  r = request(px.port(), "GET", "/dated");
  REQUIRE(r.ok());
  CHECK(r.response.headers_named("Date") == std::vector<std::string>{"Tue, 01 Dec 2026 00:00:00 GMT"});
}

TEST_CASE("response framing: an obsolete Transfer-Encoding: identity is not passed on as a coding") {
  RawUpstream up([](int, const std::string&) {
    return RawUpstream::Answer{"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\nplain", true};
  });
  Proxy px(spec_for(up.url()));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  auto r = request(px.port(), "GET", "/i");
  INFO(describe(r));
  REQUIRE(r.ok());
  CHECK(r.response.header("Transfer-Encoding") == "chunked");  // not "identity, chunked"
  CHECK(r.response.body == "plain");
}

TEST_CASE("response framing: a close-delimited body is chunked for 1.1 clients and closes for 1.0") {
  RawUpstream up([](int, const std::string&) {
    return RawUpstream::Answer{"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n" + std::string(40000, 'z'),
                               true};
  });
  Proxy px(spec_for(up.url()));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  HttpClient c;
  REQUIRE(c.connect(px.port()));
  for (int i = 0; i < 2; ++i) {
    auto r = c.request("GET", "/x");
    INFO(describe(r));
    REQUIRE(r.ok());
    CHECK(r.response.body == std::string(40000, 'z'));
    CHECK(r.response.header("Transfer-Encoding") == "chunked");
  }
  HttpClient c10;
  auto r = send_raw(c10, px.port(), "GET /x HTTP/1.0\r\n\r\n");
  INFO(describe(r));
  REQUIRE(r.ok());
  CHECK(r.response.body == std::string(40000, 'z'));
  CHECK_FALSE(r.response.has("Transfer-Encoding"));
  CHECK(c10.wait_closed());
}

TEST_CASE("request framing: an HTTP/1.0 request without Host goes upstream as HTTP/1.1 with the upstream's") {
  std::mutex m;
  std::vector<std::string> heads;
  RawUpstream up([&](int, const std::string& head) {
    std::lock_guard l(m);
    heads.push_back(head);
    return RawUpstream::Answer{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"};
  });
  Proxy px(spec_for(up.url()));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  const std::string authority = up.url().substr(7);  // "127.0.0.1:PORT"
  HttpClient a, b;
  REQUIRE(send_raw(a, px.port(), "GET /x HTTP/1.0\r\n\r\n").ok());
  REQUIRE(send_raw(b, px.port(), "GET /y HTTP/1.0\r\nHost: app.example\r\n\r\n").ok());
  std::lock_guard l(m);
  REQUIRE(heads.size() == 2);
  CHECK(heads[0].rfind("GET /x HTTP/1.1\r\n", 0) == 0);
  CHECK(heads[0].find("\r\nHost: " + authority + "\r\n") != std::string::npos);
  CHECK(heads[1].find("\r\nHost: app.example\r\n") != std::string::npos);  // the client's, once
  CHECK(heads[1].find("Host: " + authority) == std::string::npos);
}

TEST_CASE("response framing: a chunked body reaches a 1.0 client decoded, then the connection closes") {
  RawUpstream up([](int, const std::string&) {
    return RawUpstream::Answer{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"};
  });
  Proxy px(spec_for(up.url()));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  HttpClient c;
  auto r = send_raw(c, px.port(), "GET /x HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  INFO(describe(r));
  REQUIRE(r.ok());
  CHECK(r.response.version == "HTTP/1.0");
  CHECK(r.response.body == "abc");
  CHECK(r.response.header("Connection") == "close");
  CHECK(c.wait_closed());
}

TEST_CASE("response framing: interim 1xx answers reach 1.1 clients (not 100 Continue, not 1.0 clients)") {
  RawUpstream up([](int, const std::string&) {
    return RawUpstream::Answer{"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n"
                               "Connection: close\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"};
  });
  Proxy px(spec_for(up.url()));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  HttpClient c;
  REQUIRE(c.connect(px.port()));
  REQUIRE(c.send(build_request("GET", "/p")));
  REQUIRE(c.wait_closed(300ms) == false);  // (reads what has come so far)
  std::string seen = c.pending();
  auto r = c.read_response();
  INFO(describe(r), " raw: ", seen);
  REQUIRE(r.ok());
  CHECK(r.response.status == 200);  // the reader skips interim answers
  CHECK(seen.rfind("HTTP/1.1 103 Early Hints\r\n", 0) == 0);  // first, and no 100 before it
  CHECK(seen.find("Link: </s.css>; rel=preload\r\n") != std::string::npos);
  CHECK(seen.find("100 Continue") == std::string::npos);
  CHECK(seen.substr(0, seen.find("\r\n\r\n")).find("Connection") == std::string::npos);  // hop-by-hop stays
  // An HTTP/1.0 client cannot take interim answers (RFC 9110 15.2): it gets the final one only.
  HttpClient c10;
  auto r10 = send_raw(c10, px.port(), "GET /p HTTP/1.0\r\nHost: x\r\n\r\n");
  REQUIRE(r10.ok());
  CHECK(r10.response.status == 200);
  CHECK(r10.response.version == "HTTP/1.0");
}

TEST_CASE("response framing: interim 100 responses are dropped, HEAD and 204/304 carry no body") {
  RawUpstream up([](int, const std::string& head) {
    if (head.rfind("HEAD", 0) == 0)
      return RawUpstream::Answer{"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"};
    if (head.find("/nc") != std::string::npos)  // a (wrong) Content-Length on a 204 is not relayed
      return RawUpstream::Answer{"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n"};
    return RawUpstream::Answer{"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n"
                               "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"};
  });
  Proxy px(spec_for(up.url()));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  HttpClient c;
  REQUIRE(c.connect(px.port()));
  auto r = c.request("POST", "/w", token(1), "x");
  INFO(describe(r));
  REQUIRE(r.ok());
  CHECK(r.response.status == 201);
  CHECK(r.response.body == "ok");
  REQUIRE(c.send(build_request("HEAD", "/h")));
  r = c.read_response(10s, /*expect_no_body=*/true);
  REQUIRE(r.ok());
  CHECK(r.response.status == 200);
  CHECK(r.response.header("Content-Length") == "100");
  r = c.request("GET", "/nc");
  REQUIRE(r.ok());
  CHECK(r.response.status == 204);
  CHECK_FALSE(r.response.has("Content-Length"));
  r = c.request("POST", "/w", token(1), "y");  // the connection is still in step
  REQUIRE(r.ok());
  CHECK(r.response.status == 201);
  CHECK(c.stays_silent(100ms));
}

TEST_CASE("response framing: the proxy's own fence headers replace an upstream's, hop-by-hop fields go") {
  RawUpstream up([](int, const std::string&) {
    return RawUpstream::Answer{"HTTP/1.1 200 OK\r\nConnection: X-Secret\r\nX-Secret: s\r\nKeep-Alive: timeout=5\r\n"
                               "Fencing-Generation: 999\r\nContent-Length: 2\r\n\r\nok"};
  });
  Proxy px(spec_for(up.url()));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  auto r = request(px.port(), "POST", "/w", token(7), "x");
  INFO(describe(r));
  REQUIRE(r.ok());
  CHECK(r.response.status == 200);
  CHECK(r.response.headers_named("Fencing-Generation") == std::vector<std::string>{"7"});
  CHECK_FALSE(r.response.has("X-Secret"));
  CHECK_FALSE(r.response.has("Keep-Alive"));
}

TEST_CASE("response framing: malformed or conflicting upstream framing is a 502, not a desync") {
  struct Case {
    const char* name;
    std::string bytes;
  } cases[] = {
      {"conflicting Content-Length", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc"},
      {"list Content-Length", "HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nab"},
      {"signed Content-Length", "HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nab"},
      {"bad status line", "HTTP/1.1 2xx OK\r\nContent-Length: 0\r\n\r\n"},
      {"folded header", "HTTP/1.1 200 OK\r\nX: a\r\n b\r\nContent-Length: 0\r\n\r\n"},
      {"bare LF", "HTTP/1.1 200 OK\nContent-Length: 0\n\n"},
      {"not HTTP", "SSH-2.0-OpenSSH\r\n\r\n"},
      {"switching protocols", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n"},
  };
  for (const auto& k : cases) {
    CAPTURE(k.name);
    RawUpstream up([&](int, const std::string&) { return RawUpstream::Answer{k.bytes, true}; });
    Proxy px(spec_for(up.url()));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    auto r = request(px.port(), "POST", "/w", token(1), "x");
    check_problem(r, 502, std::nullopt, std::nullopt, std::nullopt, false);
  }
  // Identical duplicates are one length (RFC 9110 8.6).
  RawUpstream up([](int, const std::string&) {
    return RawUpstream::Answer{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok"};
  });
  Proxy px(spec_for(up.url()));
  FG_START(px);
  auto r = request(px.port(), "GET", "/x");
  REQUIRE(r.ok());
  CHECK(r.response.body == "ok");
  CHECK(r.response.headers_named("Content-Length").size() == 1);
}

TEST_CASE("response framing: a broken chunked body is a 502 if nothing was sent yet, else a cut, never a short 200") {
  RawUpstream up([](int, const std::string& head) {
    // /early: the bad chunk line arrives with the head; /late: after a good chunk went out.
    if (head.find(" /early ") != std::string::npos)
      return RawUpstream::Answer{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", true};
    RawUpstream::Answer a{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"};
    a.late = "zz\r\n";
    a.late_ms = 100;
    return a;
  });
  Proxy px(spec_for(up.url()));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  auto early = request(px.port(), "GET", "/early");
  INFO(describe(early));
  REQUIRE(early.ok());
  CHECK(early.code() == 502);
  auto late = request(px.port(), "GET", "/late");
  CHECK_FALSE(late.ok());  // the client sees the body end without its last chunk
}

TEST_CASE("response framing: large bodies stream through in both directions") {
  const std::string big(3 * 1024 * 1024 + 17, 'b');
  RawUpstream up([&](int, const std::string&) {
    return RawUpstream::Answer{"HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(big.size()) + "\r\n\r\n" + big};
  });
  Proxy px(spec_for(up.url()));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  HttpClient c;
  REQUIRE(c.connect(px.port()));
  auto r = c.request("POST", "/w", token(1, {{"Transfer-Encoding", "chunked"}}), chunked(big, 100000), 30s);
  INFO(describe(r).substr(0, 300));
  REQUIRE(r.ok());
  CHECK(r.response.body.size() == big.size());
  CHECK(r.response.body == big);
}


TEST_CASE("response framing: bytes an upstream sends after a response never become another request's answer") {
  // Each exchange's answer names its own target; after the first one and after a HEAD, the
  // upstream sends more, unasked and a little later (a second response; a body after HEAD).
  RawUpstream up([](int n, const std::string& head) {
    const std::string target = head.substr(head.find(' ') + 1, head.find(' ', head.find(' ') + 1) - head.find(' ') - 1);
    RawUpstream::Answer a{"HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(target.size()) + "\r\n\r\n" + target};
    if (head.rfind("HEAD", 0) == 0) a.bytes = "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n";
    if (n == 0) a.late = "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL";
    if (head.rfind("HEAD", 0) == 0) a.late = "body";
    a.late_ms = 20;
    return a;
  });
  ProxySpec spec = spec_for(up.url());
  spec.args = {"--threads", "1"};  // one worker: one pool, so the connection is reused
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  auto first = request(px.port(), "POST", "/first", token(5));
  REQUIRE(first.code() == 200);
  CHECK(first.response.body == "/first");
  std::this_thread::sleep_for(60ms);  // the unasked response is waiting in the pooled connection
  auto second = request(px.port(), "POST", "/second", token(5));
  INFO(describe(second));
  CHECK(second.code() == 200);
  CHECK(second.response.body == "/second");
  auto h = request(px.port(), "HEAD", "/h");
  CHECK(h.code() == 200);
  std::this_thread::sleep_for(60ms);  // "body" after the HEAD answer is waiting now
  auto third = request(px.port(), "POST", "/third", token(5));
  INFO(describe(third));
  CHECK(third.code() == 200);
  CHECK(third.response.body == "/third");
}


// An upstream that fails after its response head went out (a body cut short, broken chunked
// framing) or switches protocols unasked is an upstream error in the metrics like any other.
TEST_CASE("response framing: failures after the response head count as upstream_error") {
  RawUpstream up([](int, const std::string& head) {
    if (head.find("/trunc") != std::string::npos)
      return RawUpstream::Answer{"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc", true};
    if (head.find("/badchunk") != std::string::npos)
      return RawUpstream::Answer{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", false, "zz\r\n", 100};
    if (head.find("/switch") != std::string::npos)
      return RawUpstream::Answer{"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n", true};
    return RawUpstream::Answer{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"};
  });
  Proxy px(spec_for(up.url()));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  FG_ADMIN_PORT(admin, px);
  auto errors = [&] {
    return sample(parse_prometheus(metrics_text(admin)), "fencegate_requests_total",
                  {{"resource", "default"}, {"decision", "upstream_error"}})
        .value_or(0);
  };
  REQUIRE(is_2xx(request(px.port(), "POST", "/ok", token(5))));
  CHECK(errors() == 0);
  double before = 0;
  for (const char* target : {"/trunc", "/badchunk", "/switch"}) {
    CAPTURE(target);
    auto r = request(px.port(), "POST", target, token(5), "x", 5s);
    INFO(describe(r));
    CHECK_FALSE((is_2xx(r) && r.response.body.size() == 100));  // never a complete-looking answer
    CHECK(eventually([&] { return errors() == before + 1; }, 3s));
    before = errors();
  }
}

// An upstream that streams its answer (the head at once, a byte every 200 ms for 1.6 s) to a client that
// leaves meanwhile: the write is in flight until the upstream has finished it, so a newer
// generation reaches the upstream only after that.
TEST_CASE("response framing: a streamed answer whose client left still holds a newer generation until it ends") {
  std::mutex m;
  Clock::time_point first_at{}, second_at{};
  RawUpstream up([&](int n, const std::string&) {
    std::lock_guard l(m);
    if (n == 0) {
      first_at = Clock::now();
      return RawUpstream::Answer{"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nabc", false, "d", 200, 8};
    }
    second_at = Clock::now();
    return RawUpstream::Answer{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"};
  });
  ProxySpec spec = spec_for(up.url());
  spec.args = {"--drain-timeout-ms", "10000"};
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  {
    HttpClient old_client;
    REQUIRE(old_client.connect(px.port()));
    REQUIRE(old_client.send("POST /gen1 HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Token: 1\r\nContent-Length: 1\r\n\r\nx"));
    std::this_thread::sleep_for(300ms);
    old_client.close();  // gone, with the head and 3 bytes relayed
  }
  std::this_thread::sleep_for(300ms);
  auto r = request(px.port(), "POST", "/gen2", token(2), "y", 10s);
  INFO(describe(r));
  CHECK(is_2xx(r));
  std::lock_guard l(m);
  CHECK(ms_between(first_at, second_at) >= 1300);
}

// A pooled connection that the upstream closes as the next request arrives (a keep-alive
// timeout racing the reuse): a bodiless GET is sent again, once, on a new connection; a write is
// not (it may not be safe to repeat), its client gets the 502.
TEST_CASE("upstream pool: a GET on a pooled connection closed under it is retried once; a write is not") {
  std::atomic<int> seen_c{0};
  RawUpstream up([&](int n, const std::string& head) {
    if (head.find("/c ") != std::string::npos) ++seen_c;
    if (n == 1 || n == 3) return RawUpstream::Answer{"", true};  // closes without an answer
    return RawUpstream::Answer{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"};
  });
  Proxy px(spec_for(up.url()));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  HttpClient c;
  REQUIRE(c.connect(px.port()));
  REQUIRE(c.request("GET", "/a").code() == 200);  // n=0; its connection goes to the pool
  auto b = c.request("GET", "/b");                 // n=1 closes; retried as n=2 on a new connection
  INFO(describe(b));
  CHECK(b.code() == 200);
  CHECK(up.connections() == 2);
  HttpClient w;
  REQUIRE(w.connect(px.port()));
  auto r = w.request("POST", "/c", token(1), "x");  // n=3 closes: not sent again
  INFO(describe(r));
  CHECK(r.code() == 502);
  CHECK(seen_c == 1);
}

// A route whose write_methods name GET makes a GET a write: it is never sent twice.
TEST_CASE("upstream pool: a GET that the route counts as a write is not retried") {
  std::atomic<int> seen{0};
  RawUpstream up([&](int n, const std::string&) {
    ++seen;
    if (n == 1) return RawUpstream::Answer{"", true};  // applied, then closed without an answer
    return RawUpstream::Answer{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"};
  });
  json r = route("/", up.url(), "r", "enforce");
  r["write_methods"] = json::array({"GET", "POST"});
  ProxySpec spec;
  spec.config = config_with_routes({r});
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  HttpClient c;
  REQUIRE(c.connect(px.port()));
  REQUIRE(c.request("GET", "/a", token(5)).code() == 200);
  auto b = c.request("GET", "/b", token(5));
  INFO(describe(b));
  CHECK(b.code() == 502);
  CHECK(seen == 2);  // /b reached the upstream once
}

}  // namespace fencegate::testing
