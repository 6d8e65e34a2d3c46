// LeaseKeeper against a real etcd: renewals, jeopardy strictly before the server-side expiry
// when etcd stops answering, loss when the lease is revoked behind its back.
#include <doctest/doctest.h>

#include <condition_variable>
#include <mutex>

#include "election_client/lease_keeper.h"
#include "tests/election/etcd_harness.h"

using namespace fencegate::election;
using namespace fencegate::testing;

namespace {

// Records the keeper's state changes with their steady-clock times.
struct Recorder {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<LeaseKeeper::State, Clock::time_point>> changes;

  LeaseKeeper::Callback callback() {
    return [this](LeaseKeeper::State s, const std::string&) {
      std::lock_guard lk(mu);
      changes.emplace_back(s, Clock::now());
      cv.notify_all();
    };
  }
  // Time of the first change to `s`, waiting up to `timeout`.
  std::optional<Clock::time_point> wait_for(LeaseKeeper::State s, std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu);
    std::optional<Clock::time_point> at;
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

}  // namespace

TEST_CASE("lease keeper: renews every TTL/3 and stays valid; margin is max(TTL/5, 500ms)") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  Recorder rec;
  LeaseKeeper::Options o;
  o.client = client_options(etcd);
  o.ttl_seconds = 2;
  LeaseKeeper k(o, rec.callback());
  const auto before = Clock::now();
  Status st = k.start();
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  CHECK(k.ttl_seconds() == 2);
  CHECK(k.margin() == 500ms);
  CHECK(k.renew_every() == 666ms);
  // deadline = send time + TTL - margin
  CHECK(k.deadline() >= before + 1500ms);
  CHECK(k.deadline() <= Clock::now() + 1500ms);
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
  const auto paused_at = Clock::now();
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
