// A fenced write whose request body breaks off (the client stalls or goes, a chunk is malformed)
// has already reached the upstream in part, and an upstream that applies a body as it reads it
// (an ingest endpoint, one record per line) is still working on that part when the proxy gives
// up on the client. The write stays in flight for the fence until the upstream is done with it:
// a newer generation's write is not forwarded before that.
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <thread>

#include "tests/integration/harness.h"
#include "tests/integration/ops_harness.h"

using namespace fencegate::testing;

namespace {

// One thread per connection. A complete request gets 200 at once (keep-alive). A request whose
// body ends early (EOF) is "still being applied" for kApplyMs after the EOF, then the connection
// closes: that moment is `done`.
class IngestUpstream {
 public:
  static constexpr int kApplyMs = 700;
  struct Seen {
    std::string token;
    Clock::time_point arrival;
    Clock::time_point done;
    bool complete = false;
  };

  IngestUpstream() {
    listener_ = listen_loopback(&port_);
    REQUIRE(listener_.valid());
    accept_ = std::thread([this] {
      for (;;) {
        int c = ::accept(listener_.get(), nullptr, nullptr);
        if (c < 0) return;
        std::lock_guard lk(mu_);
        conns_.emplace_back([this, c] { serve(Fd(c)); });
      }
    });
  }
  ~IngestUpstream() {
    ::shutdown(listener_.get(), SHUT_RDWR);
    accept_.join();
    stop_ = true;
    std::vector<std::thread> conns;
    {
      std::lock_guard lk(mu_);
      conns.swap(conns_);
    }
    for (auto& t : conns) t.join();  // (without mu_: a connection may still be recording)
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<Seen> seen() const {
    std::lock_guard lk(mu_);
    return seen_;
  }

 private:
  void serve(Fd c) {
    std::string buf;
    while (!stop_) {
      while (buf.find("\r\n\r\n") == std::string::npos && !stop_) {
        IoStatus s = read_some(c.get(), buf, 200ms);
        if (s == IoStatus::eof || s == IoStatus::error) return;
      }
      const std::size_t head_end = buf.find("\r\n\r\n");
      if (head_end == std::string::npos) return;
      Seen r;
      r.arrival = Clock::now();
      const std::string head = to_lower(buf.substr(0, head_end));
      std::size_t p = head.find("fencing-token:");
      if (p != std::string::npos) r.token = std::string(trim_ows(head.substr(p + 14, head.find("\r\n", p) - p - 14)));
      const bool chunked = head.find("transfer-encoding: chunked") != std::string::npos;
      p = head.find("content-length:");
      const std::size_t want = p == std::string::npos ? 0 : std::stoul(head.substr(p + 15));
      buf.erase(0, head_end + 4);
      // Reads the body; a chunked one counts as complete at its last chunk ("0\r\n\r\n").
      bool eof = false;
      auto complete = [&] { return chunked ? buf.find("0\r\n\r\n") != std::string::npos : buf.size() >= want; };
      while (!complete() && !stop_) {
        IoStatus s = read_some(c.get(), buf, 200ms);
        if (s == IoStatus::eof || s == IoStatus::error) {
          eof = true;
          break;
        }
      }
      if (eof) {
        std::this_thread::sleep_for(std::chrono::milliseconds(kApplyMs));  // applying what it read
        r.done = Clock::now();
        std::lock_guard lk(mu_);
        seen_.push_back(r);
        return;
      }
      buf.erase(0, chunked ? buf.find("0\r\n\r\n") + 5 : want);
      r.complete = true;
      r.done = Clock::now();
      {
        std::lock_guard lk(mu_);
        seen_.push_back(r);
      }
      if (!write_all(c.get(), "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")) return;
    }
  }

  std::uint16_t port_ = 0;
  Fd listener_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::vector<Seen> seen_;
  std::vector<std::thread> conns_;
  std::thread accept_;
};

enum class Break { stall, vanish, bad_chunk };

std::string hex(std::size_t n) {
  char b[32];
  std::snprintf(b, sizeof b, "%zx", n);
  return b;
}

void check_newer_waits(Break how) {
  IngestUpstream up;
  ProxySpec spec;
  spec.upstream = up.url();
  spec.args = {"--body-timeout-ms", "300", "--drain-timeout-ms", "8000"};
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);

  HttpClient old_client;
  REQUIRE(old_client.connect(px.port()));
  const std::string records = "{\"rec\":1}\n{\"rec\":2}\n{\"rec\":3}\n";
  if (how == Break::bad_chunk) {
    REQUIRE(old_client.send("POST /ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Token: 1\r\n"
                            "Transfer-Encoding: chunked\r\n\r\n" +
                            hex(records.size()) + "\r\n" +
                            records + "\r\n"));
  } else {
    REQUIRE(old_client.send("POST /ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Token: 1\r\nContent-Length: 100000\r\n\r\n" +
                            records));
  }
  std::this_thread::sleep_for(150ms);  // head and records are upstream
  if (how == Break::bad_chunk) REQUIRE(old_client.send("zz\r\n"));
  if (how == Break::vanish) old_client.close();
  if (how != Break::vanish) {
    auto o = old_client.read_response(3s);
    INFO("gen1: ", describe(o));
    REQUIRE(o.ok());
    CHECK(o.response.status == (how == Break::stall ? 408 : 400));
  }
  const auto t0 = Clock::now();
  auto n = timed_request(px.port(), "POST", "/ingest", token(2));
  INFO("gen2: ", describe(n.result));
  CHECK(is_2xx(n.result));
  CHECK(ms_between(t0, Clock::now()) < 5000);  // the upstream's close ends the wait, not the drain timeout
  REQUIRE(eventually([&] { return up.seen().size() == 2; }, 3s));  // gen1 is recorded when applied
  auto s = up.seen();
  auto gen1 = s[0].token == "1" ? s[0] : s[1];
  auto gen2 = s[0].token == "1" ? s[1] : s[0];
  CHECK(gen1.token == "1");
  CHECK_FALSE(gen1.complete);
  CHECK(gen2.token == "2");
  CHECK(gen2.complete);
  INFO("gen2 arrived ", ms_between(gen1.done, gen2.arrival), " ms after the upstream was done with gen1");
  CHECK(gen1.done <= gen2.arrival);
}

// Newer writes park behind gen1 (in flight at the upstream) and their clients close while they
// wait: after part of a Content-Length body, after part of a chunked body, after sending more
// (not all) of the body while waiting, after half of a body larger than the proxy reads ahead,
// and (a half-close) after the whole request. When the drain ends, the four cut-off writes are dropped,
// never sent late and incomplete to the upstream; the whole one is forwarded and answered.
void check_abandoned_parked_writes() {
  IngestUpstream up;
  ProxySpec spec;
  spec.upstream = up.url();
  spec.args = {"--body-timeout-ms", "5000", "--drain-timeout-ms", "8000"};
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);

  HttpClient old_client;
  REQUIRE(old_client.connect(px.port()));
  REQUIRE(old_client.send("POST /ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Token: 1\r\nContent-Length: 100000\r\n\r\n"
                          "{\"rec\":1}\n"));
  std::this_thread::sleep_for(150ms);  // gen1 is at the upstream, in flight

  HttpClient cut_cl, cut_chunked, cut_more, cut_big, whole;
  REQUIRE(cut_cl.connect(px.port()));
  REQUIRE(cut_chunked.connect(px.port()));
  REQUIRE(cut_more.connect(px.port()));
  REQUIRE(cut_big.connect(px.port()));
  REQUIRE(whole.connect(px.port()));
  REQUIRE(cut_more.send("POST /ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Token: 2\r\nContent-Length: 100\r\n\r\n0123456789"));
  // More than the proxy reads ahead of a decision: the rest of what was sent waits in the kernel.
  REQUIRE(cut_big.send("POST /ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Token: 2\r\nContent-Length: 200000\r\n\r\n" +
                       std::string(100000, 'b')));
  REQUIRE(cut_cl.send("POST /ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Token: 2\r\nContent-Length: 10\r\n\r\nabcd"));
  REQUIRE(cut_chunked.send("POST /ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Token: 2\r\n"
                           "Transfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n"));
  REQUIRE(whole.send("POST /ingest HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Token: 2\r\nContent-Length: 4\r\n\r\nabcd"));
  std::this_thread::sleep_for(200ms);  // all are parked behind gen1
  REQUIRE(cut_more.send(std::string(20, 'm')));  // more of the body while it waits, but not all
  std::this_thread::sleep_for(50ms);
  cut_cl.close();
  cut_chunked.close();
  cut_more.close();
  cut_big.close();
  whole.shutdown_write();
  std::this_thread::sleep_for(200ms);
  old_client.close();  // gen1's body ends: the upstream applies it, then the drain ends

  auto w = whole.read_response(8s);
  INFO("whole: ", describe(w));
  REQUIRE(w.ok());
  CHECK(w.response.status == 200);
  std::this_thread::sleep_for(std::chrono::milliseconds(IngestUpstream::kApplyMs + 800));
  auto s = up.seen();
  int gen2 = 0;
  for (const auto& r : s) {
    CAPTURE(r.token);
    CAPTURE(r.complete);
    if (r.token == "2") {
      ++gen2;
      CHECK(r.complete);  // a cut-off request never reaches the upstream
    }
  }
  CHECK(gen2 == 1);
  CHECK(s.size() == 2);
}

}  // namespace

TEST_SUITE("ordering") {

TEST_CASE("ordering: writes whose clients closed mid-body while parked behind a drain are dropped, not sent late") {
  check_abandoned_parked_writes();
}


TEST_CASE("ordering: an older write whose client stalls mid-body (408) is waited for while the upstream applies what it got") {
  check_newer_waits(Break::stall);
}

TEST_CASE("ordering: an older write whose client goes mid-body is waited for while the upstream applies what it got") {
  check_newer_waits(Break::vanish);
}

TEST_CASE("ordering: an older write with a malformed chunk (400) is waited for while the upstream applies what it got") {
  check_newer_waits(Break::bad_chunk);
}

}  // TEST_SUITE
