// An upstream that answers before the request body is all there (an early 413 or 401 from a
// server that stops reading it): the client gets that answer, not a 502 or 504 about the send.
// An interim 100 Continue sent before the upstream reads the body is not taken for the answer.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>

#include "tests/integration/harness.h"

using namespace fencegate::testing;

namespace {

constexpr std::string_view kEarly =
    "HTTP/1.1 413 Payload Too Large\r\nContent-Length: 8\r\nConnection: close\r\n\r\ntoo big\n";

enum class After { close_at_once, hold_unread, interim_then_read, success_then_read };

// Serves one connection at a time. Reads the request head, then, per `after`: answers kEarly and
// closes with the body unread (the kernel resets the connection); answers kEarly and keeps the
// connection open without reading for 4 s; or sends "100 Continue", waits 300 ms, reads the whole
// Content-Length body and answers 200 with the byte count.
class EarlyUpstream {
 public:
  explicit EarlyUpstream(After after) : after_(after) {
    listener_ = listen_loopback(&port_);
    REQUIRE(listener_.valid());
    thread_ = std::thread([this] { loop(); });
  }
  ~EarlyUpstream() {
    stop_ = true;
    ::shutdown(listener_.get(), SHUT_RDWR);
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::size_t body_bytes_read() const { return body_read_.load(); }

 private:
  void loop() {
    while (!stop_) {
      Fd c(::accept(listener_.get(), nullptr, nullptr));
      if (!c.valid()) return;
      std::string buf;
      while (buf.find("\r\n\r\n") == std::string::npos)
        if (read_some(c.get(), buf, 5s) != IoStatus::data) break;
      const std::size_t head_end = buf.find("\r\n\r\n");
      if (head_end == std::string::npos) continue;
      if (after_ == After::interim_then_read || after_ == After::success_then_read) {
        // success_then_read: a streaming upstream that starts its 200 before reading the body.
        if (after_ == After::interim_then_read) write_all(c.get(), "HTTP/1.1 100 Continue\r\n\r\n");
        else write_all(c.get(), "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n");
        std::this_thread::sleep_for(300ms);
        std::string lower = to_lower(buf.substr(0, head_end));
        std::size_t p = lower.find("content-length:");
        std::size_t want = p == std::string::npos ? 0 : std::stoul(lower.substr(p + 15));
        std::size_t have = buf.size() - head_end - 4;
        std::string more;
        while (have < want) {
          more.clear();
          if (read_some(c.get(), more, 5s) != IoStatus::data) break;
          have += more.size();
        }
        body_read_ = have;
        std::string n = std::to_string(have);
        if (after_ == After::success_then_read) {
          char size[32];
          std::snprintf(size, sizeof size, "%zx\r\n", n.size());
          write_all(c.get(), size + n + "\r\n0\r\n\r\n");
        } else {
          write_all(c.get(), "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(n.size()) + "\r\n\r\n" + n);
        }
        continue;  // the proxy may keep the connection; the next accept waits for another
      }
      write_all(c.get(), kEarly);
      if (after_ == After::hold_unread) {
        for (int i = 0; i < 40 && !stop_; ++i) std::this_thread::sleep_for(100ms);
      }
    }
  }

  After after_;
  std::uint16_t port_ = 0;
  Fd listener_;
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> body_read_{0};
  std::thread thread_;
};

struct Upload {
  std::string raw;  // everything the proxy sent back, until it closed or 15 s passed
  std::size_t sent = 0;
  int status() const { return raw.rfind("HTTP/1.1 ", 0) == 0 ? std::atoi(raw.c_str() + 9) : 0; }
  std::string body() const {
    std::size_t e = raw.find("\r\n\r\n");
    return e == std::string::npos ? std::string() : raw.substr(e + 4);
  }
  std::string head() const { return to_lower(raw.substr(0, raw.find("\r\n\r\n"))); }
};

// Sends `head` and then `body_bytes` of body ('x'; chunked in 64 KiB chunks when `chunked`) as
// fast as the proxy takes them, reading whatever comes back meanwhile; stops sending when a
// response starts or the send fails, then reads until the proxy closes.
Upload upload(std::uint16_t port, const std::string& head, std::size_t body_bytes, bool chunked) {
  Upload u;
  Fd fd = connect_loopback(port, 5s);
  REQUIRE(fd.valid());
  REQUIRE(write_all(fd.get(), head));
  const std::string piece(65536, 'x');
  std::string framed = chunked ? "10000\r\n" + piece + "\r\n" : piece;
  bool sending = true;
  std::size_t off = 0;  // into the current piece
  const auto deadline = Clock::now() + 15s;
  while (Clock::now() < deadline) {
    if (sending && u.sent >= body_bytes) {
      if (chunked) write_all(fd.get(), "0\r\n\r\n");
      sending = false;
    }
    pollfd p{fd.get(), static_cast<short>(POLLIN | (sending ? POLLOUT : 0)), 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      char b[65536];
      ssize_t n = ::recv(fd.get(), b, sizeof b, 0);
      if (n <= 0) break;  // closed (or reset) by the proxy
      u.raw.append(b, static_cast<std::size_t>(n));
      sending = false;
      continue;
    }
    if (sending && (p.revents & POLLOUT)) {
      ssize_t n = ::send(fd.get(), framed.data() + off, framed.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno != EAGAIN) {
        sending = false;
        continue;
      }
      if (n > 0) off += static_cast<std::size_t>(n);
      if (off == framed.size()) {
        off = 0;
        u.sent += piece.size();
      }
    }
  }
  return u;
}

std::string upload_head(std::size_t body_bytes, bool chunked, bool close = false) {
  return "POST /w HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Token: 1\r\n" + std::string(close ? "Connection: close\r\n" : "") +
         (chunked ? std::string("Transfer-Encoding: chunked\r\n")
                  : "Content-Length: " + std::to_string(body_bytes) + "\r\n") +
         "\r\n";
}

}  // namespace

TEST_SUITE("early_answer") {

TEST_CASE("an upstream that answers 413 after the head and closes: the client gets its 413") {
  EarlyUpstream up(After::close_at_once);
  ProxySpec spec;
  spec.upstream = up.url();
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  for (bool chunked : {false, true}) {
    CAPTURE(chunked);
    const std::size_t size = 64u << 20;
    Upload u = upload(px.port(), upload_head(size, chunked), size, chunked);
    INFO("response: ", u.raw.substr(0, 400));
    CHECK(u.status() == 413);
    CHECK(u.body() == "too big\n");
    CHECK(u.head().find("fencing-generation: 1\r\n") != std::string::npos);
    CHECK(u.head().find("connection: close") != std::string::npos);  // the rest of the body is not read
    CHECK(u.sent < size);
  }
  // The proxy is fine afterwards: the next upload gets the same answer.
  Upload again = upload(px.port(), upload_head(1 << 20, false), 1 << 20, false);
  CHECK(again.status() == 413);
}

TEST_CASE("an upstream that answers 413 and stops reading without closing: the client gets its 413 at once") {
  EarlyUpstream up(After::hold_unread);
  ProxySpec spec;
  spec.upstream = up.url();
  spec.args = {"--upstream-timeout-ms", "20000"};
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  const std::size_t size = 256u << 20;  // far more than the socket buffers hold
  auto t0 = Clock::now();
  Upload u = upload(px.port(), upload_head(size, false), size, false);
  INFO("response: ", u.raw.substr(0, 400));
  CHECK(u.status() == 413);
  CHECK(u.body() == "too big\n");
  CHECK(u.head().find("fencing-generation: 1\r\n") != std::string::npos);
  CHECK(Clock::now() - t0 < 10s);  // not the 20 s upstream timeout, nor the upstream's 4 s hold
  CHECK(u.sent < size);
}

TEST_CASE("an interim 100 Continue before the upstream reads the body is not taken for its answer") {
  EarlyUpstream up(After::interim_then_read);
  ProxySpec spec;
  spec.upstream = up.url();
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  const std::size_t size = 32u << 20;  // the sends block while the upstream waits
  Upload u = upload(px.port(), upload_head(size, false, true), size, false);
  INFO("response: ", u.raw.substr(0, 400));
  CHECK(u.status() == 200);
  CHECK(u.body() == std::to_string(size));
  CHECK(up.body_bytes_read() == size);
}

TEST_CASE("an upstream that starts a 200 before it has read the body still gets the whole body") {
  EarlyUpstream up(After::success_then_read);
  ProxySpec spec;
  spec.upstream = up.url();
  spec.args = {"--upstream-timeout-ms", "20000"};
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  const std::size_t size = 32u << 20;  // the sends block while the upstream waits
  const auto t0 = Clock::now();
  Upload u = upload(px.port(), upload_head(size, false, true), size, false);
  INFO("response: ", u.raw.substr(0, 400));
  CHECK(u.status() == 200);
  CHECK(up.body_bytes_read() == size);  // not cut off at the first answer bytes
  CHECK(u.raw.find(std::to_string(size)) != std::string::npos);
  CHECK(Clock::now() - t0 < 10s);
}

}  // TEST_SUITE
