// LeaseKeeper against a real etcd: renewals, jeopardy strictly before the server-side expiry
// when etcd stops answering, loss when the lease is revoked behind its back.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <mutex>

#include "election_client/lease_keeper.h"
#include "tests/election/etcd_harness.h"
#include "tests/support/net_util.h"

using namespace fencegate::election;
using namespace fencegate::testing;

namespace {

// The keeper's deadlines are on the boot clock (common/boot_clock.h); times compared with them too.
using KeeperClock = LeaseKeeper::Clock;

// Records the keeper's state changes with their boot-clock times.
struct Recorder {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<LeaseKeeper::State, KeeperClock::time_point>> changes;

  LeaseKeeper::Callback callback() {
    return [this](LeaseKeeper::State s, const std::string&) {
      std::lock_guard lk(mu);
      changes.emplace_back(s, KeeperClock::now());
      cv.notify_all();
    };
  }
  // Time of the first change to `s`, waiting up to `timeout`.
  std::optional<KeeperClock::time_point> wait_for(LeaseKeeper::State s, std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu);
    std::optional<KeeperClock::time_point> at;
    cv.wait_for(lk, timeout, [&] {
      for (auto& [st, t] : changes)
        if (st == s) {
          at = t;
          return true;
        }
      return false;
    });
    return at;
  }
};

// A TCP forwarder on 127.0.0.1 in front of `target_port`; after hold() it keeps every connection
// open and passes nothing either way: an etcd member behind a blackholed link, or hung.
class Blackhole {
 public:
  explicit Blackhole(std::uint16_t target_port) : target_(target_port) {
    fd_ = listen_loopback(&port_, 16).release();
    REQUIRE(fd_ >= 0);
    accepter_ = std::thread([this] { accept_loop(); });
  }
  ~Blackhole() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    accepter_.join();
    for (auto& t : pumps_) t.join();
  }
  void hold() { held_ = true; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  void accept_loop() {
    for (;;) {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      const int u = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(target_);
      if (::connect(u, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(c);
        ::close(u);
        continue;
      }
      pumps_.emplace_back([this, c, u] { pump(c, u); });
    }
  }
  void pump(int a, int b) {
    pollfd fds[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    char buf[16384];
    while (!stop_) {
      if (held_) {
        std::this_thread::sleep_for(20ms);
        continue;
      }
      if (::poll(fds, 2, 50) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
        if (n <= 0 || ::send(fds[1 - i].fd, buf, static_cast<std::size_t>(n), MSG_NOSIGNAL) != n) {
          ::close(a);
          ::close(b);
          return;
        }
      }
    }
    ::close(a);
    ::close(b);
  }

  std::uint16_t target_, port_ = 0;
  int fd_ = -1;
  std::atomic<bool> held_{false}, stop_{false};
  std::thread accepter_;
  std::vector<std::thread> pumps_;  // only the accepter adds, before the destructor joins it
};

}  // namespace

TEST_CASE("lease keeper: a member that hangs costs one short attempt, not the lease") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  const std::string url = etcd.url();
  Blackhole first(static_cast<std::uint16_t>(std::stoi(url.substr(url.rfind(':') + 1))));
  Recorder rec;
  LeaseKeeper::Options o;
  o.client = client_options(etcd);  // request timeout 3 s
  o.client.endpoints = {first.url(), url};
  o.ttl_seconds = 3;  // renewals every 1 s, deadline 2.4 s after each is sent
  LeaseKeeper k(o, rec.callback());
  REQUIRE(k.start().ok());  // granted through the first endpoint
  first.hold();             // which now hangs, connection open
  // The next renewal hangs there; given all the time to the deadline it would cost the lease.
  // Cut short (TTL/6), it fails over to the second endpoint in time.
  const auto until = Clock::now() + 4s;
  bool always_valid = true;
  while (Clock::now() < until) {
    always_valid = always_valid && k.valid();
    std::this_thread::sleep_for(20ms);
  }
  CHECK(always_valid);
  CHECK_FALSE(rec.wait_for(LeaseKeeper::State::jeopardy, 0ms).has_value());
  CHECK(k.renewals() >= 2);
  CHECK(k.state() == LeaseKeeper::State::active);
  k.stop();
}

TEST_CASE("lease keeper: renews every TTL/3 and stays valid; margin is max(TTL/5, 500ms)") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  Recorder rec;
  LeaseKeeper::Options o;
  o.client = client_options(etcd);
  o.ttl_seconds = 2;
  LeaseKeeper k(o, rec.callback());
  const auto before = KeeperClock::now();
  Status st = k.start();
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  CHECK(k.ttl_seconds() == 2);
  CHECK(k.margin() == 500ms);
  CHECK(k.renew_every() == 666ms);
  // deadline = send time + TTL - margin
  CHECK(k.deadline() >= before + 1500ms);
  CHECK(k.deadline() <= KeeperClock::now() + 1500ms);
  CHECK(k.valid());

  const auto until = Clock::now() + 3s;
  bool always_valid = true;
  while (Clock::now() < until) {
    always_valid = always_valid && k.valid();
    std::this_thread::sleep_for(20ms);
  }
  CHECK(always_valid);
  CHECK(k.renewals() >= 3);
  CHECK(k.state() == LeaseKeeper::State::active);
  Client c(client_options(etcd));
  std::int64_t left = 0;
  REQUIRE(c.time_to_live(k.lease_id(), &left).ok());
  CHECK(left > 0);

  CHECK(k.revoke().ok());
  REQUIRE(c.time_to_live(k.lease_id(), &left).ok());
  CHECK(left == -1);
  CHECK_FALSE(k.valid());
  CHECK(rec.changes.empty());

  LeaseKeeper::Options ten = o;
  ten.ttl_seconds = 10;
  LeaseKeeper k10(ten);
  REQUIRE(k10.start().ok());
  CHECK(k10.margin() == 2000ms);
  CHECK(k10.renew_every() == 3333ms);
  k10.revoke();
}

TEST_CASE("lease keeper: jeopardy when etcd stops answering, before the server-side expiry and never after") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  Recorder rec;
  LeaseKeeper::Options o;
  o.client = client_options(etcd);
  o.ttl_seconds = 2;
  LeaseKeeper k(o, rec.callback());
  REQUIRE(k.start().ok());
  std::this_thread::sleep_for(1200ms);  // a couple of renewals
  REQUIRE(k.renewals() >= 1);

  etcd.pause();  // connections stay open, nothing answers
  const auto paused_at = KeeperClock::now();
  auto at = rec.wait_for(LeaseKeeper::State::jeopardy, 4s);
  etcd.resume();
  REQUIRE_MESSAGE(at.has_value(), "no jeopardy reported");
  const auto last_sent = k.last_renewal_sent();
  const auto deadline = k.deadline();
  CHECK(last_sent < paused_at);
  // etcd cannot expire the lease before last_sent + TTL (it received the renewal after we sent
  // it); the keeper must have given up before that, by at least most of the margin.
  const auto server_expiry_lower_bound = last_sent + 2s;
  MESSAGE("jeopardy ", std::chrono::duration_cast<std::chrono::milliseconds>(*at - last_sent).count(),
          " ms after the last renewal was sent (deadline at ",
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - last_sent).count(), " ms)");
  CHECK(*at < server_expiry_lower_bound);
  CHECK(*at >= deadline);
  CHECK(*at - deadline < 300ms);
  CHECK(deadline == last_sent + 1500ms);
  CHECK_FALSE(k.valid());
  k.stop();
}

TEST_CASE("lease keeper: lost when the lease is revoked behind its back") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  Recorder rec;
  LeaseKeeper::Options o;
  o.client = client_options(etcd);
  o.ttl_seconds = 3;
  LeaseKeeper k(o, rec.callback());
  REQUIRE(k.start().ok());
  Client c(client_options(etcd));
  REQUIRE(c.revoke(k.lease_id(), 2s).ok());
  auto at = rec.wait_for(LeaseKeeper::State::lost, 3s);
  REQUIRE(at.has_value());
  CHECK(k.state() == LeaseKeeper::State::lost);
  CHECK_FALSE(k.valid());
}

TEST_CASE("lease keeper: a dead endpoint list never yields a lease") {
  FG_REQUIRE_ETCD();
  LeaseKeeper::Options o;
  o.client.endpoints = {"http://127.0.0.1:" + std::to_string(free_port())};
  o.client.request_timeout = 1000ms;
  o.ttl_seconds = 2;
  LeaseKeeper k(o);
  Status st = k.start();
  CHECK(st.is_unavailable());
  CHECK_FALSE(k.valid());
}
