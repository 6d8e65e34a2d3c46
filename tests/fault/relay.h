// A userspace TCP relay for fault tests: listens on an IPv4 address, forwards every connection
// to 127.0.0.1:<target>, and can delay, hold or drop what passes through. These machines have no
// netem; this is how the partition tests slow down or stall one client's path to etcd or to the
// proxy, without touching anything but that path.
//
// Modes (per relay, both directions, every connection):
//   pass        each chunk is delivered `delay` after it was read (0 = at once), in order
//   hold        nothing is delivered; everything read is kept and delivered, in order, on pass()
//               -- a stalled path whose bytes arrive late (the "delayed write" of a paused leader);
//               hold_requests() holds only the client -> target direction (answers to requests
//               already delivered still come back)
//   drop        everything read is discarded (a black hole); connections that lost bytes are
//               closed on the next pass(), since their streams are torn
// A relay starts in pass with no delay. reset_all() closes every open connection.
// set_eof_delay(d): a peer's close (FIN) is passed on only `d` after the bytes before it -- a late
// request whose client has already gone is then still answered, as if its FIN came later still.
//
// Four threads per connection (a reader and a writer each way) and one acceptor: only for tests.
// Header-only because tests/CMakeLists.txt compiles tests/fault/*_test.cpp alone.
//
// Thread-safety: every public method is thread-safe.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

namespace fencegate::testing {

class Relay {
 public:
  enum class Mode { pass, hold, drop };

  // Binds listen_host:0 and starts accepting. Throws std::runtime_error if it cannot bind.
  Relay(const std::string& listen_host, std::uint16_t target_port, std::string name = "relay")
      : host_(listen_host), target_port_(target_port), name_(std::move(name)) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error("relay socket: " + std::string(std::strerror(errno)));
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    if (::inet_pton(AF_INET, listen_host.c_str(), &a.sin_addr) != 1) {
      ::close(fd);
      throw std::runtime_error("relay: not an IPv4 address: " + listen_host);
    }
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 128) != 0) {
      const std::string e = std::strerror(errno);
      ::close(fd);
      throw std::runtime_error("relay bind " + listen_host + ": " + e);
    }
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    listener_ = fd;
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~Relay() { stop(); }
  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  const std::string& host() const { return host_; }
  std::uint16_t port() const { return port_; }
  std::string address() const { return host_ + ":" + std::to_string(port_); }
  std::string url() const { return "http://" + address(); }
  const std::string& name() const { return name_; }

  void set_delay(std::chrono::milliseconds d) {
    std::lock_guard<std::mutex> l(mu_);
    delay_ = d;
    cv_.notify_all();
  }
  void set_eof_delay(std::chrono::milliseconds d) {
    std::lock_guard<std::mutex> l(mu_);
    eof_delay_ = d;
  }
  void hold() { set_mode(Mode::hold); }
  void hold_requests() {
    std::lock_guard<std::mutex> l(mu_);
    hold_up_ = true;
    cv_.notify_all();
  }
  void drop() { set_mode(Mode::drop); }
  // Back to delivering (with the current delay). Held bytes go out in order; connections that
  // lost bytes while dropping are closed.
  void pass() { set_mode(Mode::pass); }
  Mode mode() const {
    std::lock_guard<std::mutex> l(mu_);
    return mode_;
  }

  // Closes every open connection (both sides see EOF or a reset).
  void reset_all() {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& c : conns_) c->shut();
    cv_.notify_all();
  }

  std::uint64_t connections() const { return accepted_.load(); }
  std::uint64_t bytes_forwarded() const { return forwarded_.load(); }
  std::uint64_t bytes_dropped() const { return dropped_.load(); }

  // Closes the listener and every connection and joins every thread. Idempotent.
  void stop() {
    if (stopping_.exchange(true)) return;
    if (acceptor_.joinable()) acceptor_.join();
    if (listener_ >= 0) ::close(listener_);
    listener_ = -1;
    std::list<std::shared_ptr<Conn>> conns;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (auto& c : conns_) c->shut();
      conns.swap(conns_);
      cv_.notify_all();
    }
    for (auto& c : conns) c->join();
  }

 private:
  struct Chunk {
    std::chrono::steady_clock::time_point due;
    std::string data;  // empty: end of stream (shutdown the write side)
  };
  // One direction of one connection. Guarded by the relay's mu_.
  struct Pipe {
    std::deque<Chunk> queue;
    bool done = false;  // the reader ended; the writer stops once the queue is empty
  };
  struct Conn {
    int client = -1, upstream = -1;
    Pipe up, down;  // up: client -> upstream
    bool tainted = false;  // lost bytes while dropping
    std::atomic<bool> closed{false};
    std::atomic<int> finished{0};  // threads that returned
    std::thread threads[4];
    void shut() {
      if (closed.exchange(true)) return;
      ::shutdown(client, SHUT_RDWR);
      ::shutdown(upstream, SHUT_RDWR);
    }
    void join() {
      for (auto& t : threads)
        if (t.joinable()) t.join();
      ::close(client);
      ::close(upstream);
    }
  };

  void set_mode(Mode m) {
    std::lock_guard<std::mutex> l(mu_);
    if (m == Mode::pass && mode_ == Mode::drop)
      for (auto& c : conns_)
        if (c->tainted) c->shut();
    mode_ = m;
    if (m == Mode::pass) hold_up_ = false;
    cv_.notify_all();
  }

  static int connect_target(std::uint16_t port) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd);
      return -1;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
  }

  void accept_loop() {
    while (!stopping_) {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) {
        reap_finished();
        continue;
      }
      int cfd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (cfd < 0) continue;
      int ufd = connect_target(target_port_);
      if (ufd < 0) {
        // The target is down (etcd restarting): the client sees a reset, as it would directly.
        linger lg{1, 0};
        ::setsockopt(cfd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        ::close(cfd);
        continue;
      }
      int one = 1;
      ::setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      ++accepted_;
      auto c = std::make_shared<Conn>();
      c->client = cfd;
      c->upstream = ufd;
      std::lock_guard<std::mutex> l(mu_);
      conns_.push_back(c);
      Conn* raw = c.get();
      c->threads[0] = std::thread([this, raw] { read_loop(raw, raw->client, &raw->up); ++raw->finished; });
      c->threads[1] = std::thread([this, raw] { write_loop(raw, raw->upstream, &raw->up); ++raw->finished; });
      c->threads[2] = std::thread([this, raw] { read_loop(raw, raw->upstream, &raw->down); ++raw->finished; });
      c->threads[3] = std::thread([this, raw] { write_loop(raw, raw->client, &raw->down); ++raw->finished; });
    }
  }

  // Joins connections whose four threads have all finished.
  void reap_finished() {
    std::list<std::shared_ptr<Conn>> done;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (auto it = conns_.begin(); it != conns_.end();) {
        if ((*it)->finished.load() == 4) {
          done.push_back(*it);
          it = conns_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& c : done) c->join();
  }

  void read_loop(Conn* c, int from, Pipe* pipe) {
    char buf[16384];
    for (;;) {
      ssize_t n = ::recv(from, buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      std::lock_guard<std::mutex> l(mu_);
      if (n <= 0) {
        // EOF (or an error): pass the end on after what is queued.
        if (n < 0) c->shut();
        pipe->queue.push_back({std::chrono::steady_clock::now() + delay_, {}});
        pipe->done = true;
        cv_.notify_all();
        return;
      }
      if (mode_ == Mode::drop) {
        c->tainted = true;
        dropped_ += static_cast<std::uint64_t>(n);
        continue;
      }
      pipe->queue.push_back({std::chrono::steady_clock::now() + delay_, std::string(buf, static_cast<std::size_t>(n))});
      cv_.notify_all();
    }
  }

  void write_loop(Conn* c, int to, Pipe* pipe) {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      if (c->closed) return;
      if (pipe->queue.empty() || mode_ != Mode::pass || (hold_up_ && pipe == &c->up)) {
        if (pipe->done && pipe->queue.empty()) return;
        cv_.wait_for(l, std::chrono::milliseconds(100));
        continue;
      }
      auto due = pipe->queue.front().due;
      if (std::chrono::steady_clock::now() < due) {
        cv_.wait_until(l, due);
        continue;
      }
      if (pipe->queue.front().data.empty() && eof_delay_ > std::chrono::milliseconds(0)) {
        // Pass the close on only eof_delay_ after what came before it.
        const auto at = std::chrono::steady_clock::now() + eof_delay_;
        while (!c->closed && std::chrono::steady_clock::now() < at) cv_.wait_until(l, at);
        if (c->closed) return;
      }
      Chunk ch = std::move(pipe->queue.front());
      pipe->queue.pop_front();
      l.unlock();
      bool ok = true;
      if (ch.data.empty()) {
        ::shutdown(to, SHUT_WR);
      } else {
        std::size_t off = 0;
        while (off < ch.data.size()) {
          ssize_t n = ::send(to, ch.data.data() + off, ch.data.size() - off, MSG_NOSIGNAL);
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) {
            ok = false;
            break;
          }
          off += static_cast<std::size_t>(n);
        }
        forwarded_ += off;
      }
      l.lock();
      if (!ok) c->shut();
      if (ch.data.empty()) {
        // This direction is finished; once both are, the connection is.
        if (c->up.done && c->down.done && c->up.queue.empty() && c->down.queue.empty()) c->shut();
        cv_.notify_all();
        return;
      }
    }
  }

  // Constant after construction
  const std::string host_;
  const std::uint16_t target_port_;
  const std::string name_;
  std::uint16_t port_ = 0;
  int listener_ = -1;

  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> accepted_{0}, forwarded_{0}, dropped_{0};
  std::thread acceptor_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_
  Mode mode_ = Mode::pass;
  std::chrono::milliseconds delay_{0};
  std::chrono::milliseconds eof_delay_{0};
  bool hold_up_ = false;  // hold_requests()
  std::list<std::shared_ptr<Conn>> conns_;
};

}  // namespace fencegate::testing
