// HARNESS SELF-TEST: checks tests/support itself (RecordingUpstream, HttpClient, Process) without
// fencegate, so a failure here is a harness bug, not a proxy bug.
#include <doctest/doctest.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include <arpa/inet.h>
#include <csignal>
#include <netinet/in.h>
#include <sys/socket.h>

#include "tests/support/http_client.h"
#include "tests/support/process.h"
#include "tests/support/upstream.h"

using namespace fencegate::testing;
using namespace std::chrono_literals;

TEST_SUITE("harness") {

TEST_CASE("harness: client talks to RecordingUpstream; requests recorded in order with headers") {
  RecordingUpstream up;
  auto r = request(up.port(), "GET", "/hello?x=1", {{"X-A", "1"}, {"X-B", "2"}, {"Fencing-Token", "42"}});
  INFO(describe(r));
  REQUIRE(r.ok());
  CHECK(r.response.status == 200);
  CHECK(r.response.header("content-type") == "application/json");
  CHECK(r.response.body.find("\"target\":\"/hello?x=1\"") != std::string::npos);
  REQUIRE(up.count() == 1);
  auto reqs = up.requests();
  CHECK(reqs[0].method == "GET");
  CHECK(reqs[0].target == "/hello?x=1");
  REQUIRE(reqs[0].headers.size() == 4);  // Host, X-A, X-B, Fencing-Token
  CHECK(reqs[0].headers[1].first == "X-A");
  CHECK(reqs[0].headers[2].first == "X-B");
  CHECK(reqs[0].fencing_token() == 42);
  CHECK(reqs[0].fencing_token_raw() == "42");
  CHECK(reqs[0].outcome == Outcome::responded);
  CHECK(reqs[0].arrival <= reqs[0].completion);
}

TEST_CASE("harness: keep-alive, pipelining, chunked and Content-Length bodies, HEAD") {
  RecordingUpstream up;
  HttpClient c;
  REQUIRE(c.connect(up.port()));
  auto r1 = c.request("POST", "/a", {}, "hello");
  REQUIRE(r1.ok());
  auto r2 = c.request("POST", "/b", {{"Transfer-Encoding", "chunked"}}, chunked("a chunked body, 29 bytes long", 4));
  REQUIRE(r2.ok());
  auto r3 = c.request("HEAD", "/c");
  REQUIRE(r3.ok());
  CHECK(r3.response.body.empty());
  CHECK(r3.response.has("Content-Length"));
  // Two requests in one write; two responses in order.
  REQUIRE(c.send(build_request("GET", "/p1") + build_request("GET", "/p2")));
  auto p1 = c.read_response();
  auto p2 = c.read_response();
  REQUIRE(p1.ok());
  REQUIRE(p2.ok());
  CHECK(p1.response.body.find("/p1") != std::string::npos);
  CHECK(p2.response.body.find("/p2") != std::string::npos);
  auto reqs = up.requests();
  REQUIRE(reqs.size() == 5);
  for (auto& q : reqs) CHECK(q.connection_id == reqs[0].connection_id);
  CHECK(reqs[0].body == "hello");
  CHECK(reqs[1].body == "a chunked body, 29 bytes long");
  CHECK(reqs[1].chunked);
  CHECK(reqs[1].raw_body == chunked("a chunked body, 29 bytes long", 4));
  CHECK(up.connections_accepted() == 1);
}

TEST_CASE("harness: hook delays, hangs, resets and closes") {
  RecordingUpstream up([](const RecordedRequest& r) {
    if (r.target == "/slow") return UpstreamAction::delayed(200);
    if (r.target == "/hang") return UpstreamAction::hang();
    if (r.target == "/reset") return UpstreamAction::reset_connection();
    if (r.target == "/close") return UpstreamAction::close_connection();
    if (r.target == "/201") {
      auto a = UpstreamAction::respond(201);
      a.headers = {{"X-Up", "yes"}};
      a.body = "created";
      return a;
    }
    return UpstreamAction{};
  });
  auto slow = request(up.port(), "GET", "/slow");
  REQUIRE(slow.ok());
  auto reqs = up.requests();
  CHECK(reqs[0].completion - reqs[0].arrival >= 190ms);

  auto created = request(up.port(), "GET", "/201");
  REQUIRE(created.ok());
  CHECK(created.response.status == 201);
  CHECK(created.response.header("x-up") == "yes");
  CHECK(created.response.body == "created");

  {
    HttpClient c;
    REQUIRE(c.connect(up.port()));
    REQUIRE(c.send(build_request("POST", "/hang", {}, "x")));
    REQUIRE(up.wait_for_count(3, 5s));
    CHECK(c.read_response(300ms).status == ReadStatus::timeout);
    c.close();
    REQUIRE(up.wait_for_outcome(2, 5s));
    CHECK(up.requests()[2].outcome == Outcome::aborted_by_peer);
  }
  auto reset = request(up.port(), "GET", "/reset", {}, {}, 5s);
  CHECK(reset.status == ReadStatus::reset);
  auto closed = request(up.port(), "GET", "/close", {}, {}, 5s);
  CHECK(closed.status == ReadStatus::closed);
  reqs = up.requests();
  REQUIRE(reqs.size() == 5);
  CHECK(reqs[3].outcome == Outcome::reset);
  CHECK(reqs[4].outcome == Outcome::closed);
}

TEST_CASE("harness: a hang ends at stop(); stop joins") {
  RecordingUpstream up([](const RecordedRequest&) { return UpstreamAction::hang(); });
  HttpClient c;
  REQUIRE(c.connect(up.port()));
  REQUIRE(c.send(build_request("GET", "/")));
  REQUIRE(up.wait_for_count(1, 5s));
  up.stop();
  CHECK(up.requests()[0].outcome == Outcome::stopped);
  CHECK(c.wait_closed(2s));
}

TEST_CASE("harness: upstream parses strictly and records nothing ambiguous") {
  RecordingUpstream up;
  HttpClient c;
  auto r = send_raw(c, up.port(),
                    "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
  REQUIRE(r.ok());
  CHECK(r.response.status == 400);
  CHECK(c.wait_closed(2s));
  CHECK(up.count() == 0);
  CHECK(up.parse_errors().size() == 1);
}

TEST_CASE("harness: chunked, interim 1xx and close-delimited responses are read") {
  std::uint16_t lport = 0;
  Fd l = listen_loopback(&lport, 1);
  REQUIRE(l.valid());
  std::thread srv([&] {
    Fd fd(::accept(l.get(), nullptr, nullptr));
    write_all(fd.get(), "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nT: 1\r\n\r\n");
    write_all(fd.get(), "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\n\r\nuntil close");
  });
  HttpClient c;
  REQUIRE(c.connect(lport));
  auto r1 = c.read_response(5s);
  auto r2 = c.read_response(5s);
  srv.join();
  REQUIRE(r1.ok());
  CHECK(r1.response.body == "abcde");
  REQUIRE(r2.ok());
  CHECK(r2.response.body == "until close");
  CHECK(c.read_response(1s).status == ReadStatus::closed);
}

TEST_CASE("harness: Process, run_command, RLIMIT_FSIZE, free_port") {
  TempDir dir;
  auto res = run_command({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"});
  CHECK(res.code() == 3);
  CHECK(res.out == "out\n");
  CHECK(res.err == "err\n");

  ProcessOptions o;
  o.log_path = dir.file("sleep.log");
  auto p = Process::start({"/bin/sleep", "30"}, o);
  CHECK(p.running());
  CHECK_FALSE(p.wait_for_port(free_port(), 300ms));
  auto st = p.stop();
  CHECK(st.signaled);
  CHECK(st.signal == SIGTERM);

  o.log_path = dir.file("fsize.log");
  o.fsize_limit = 10000;
  auto q = Process::start({"/bin/sh", "-c", "echo started; head -c 100000 /dev/zero > " + dir.file("big")}, o);
  q.wait();
  CHECK(std::filesystem::file_size(dir.file("big")) <= 10000);
  CHECK(q.log().find("started") != std::string::npos);

  auto missing = Process::start({"/nonexistent/binary"}, o);
  auto ms = missing.wait();
  CHECK(ms.exited);
  CHECK(ms.code == 127);

  CHECK(free_port() != 0);
}

}  // TEST_SUITE
