#include "election_client/lease_keeper.h"

#include <algorithm>

namespace fencegate::election {

using namespace std::chrono_literals;
using std::chrono::milliseconds;

const char* LeaseKeeper::to_string(State s) {
  switch (s) {
    case State::idle: return "idle";
    case State::active: return "active";
    case State::jeopardy: return "jeopardy";
    case State::lost: return "lost";
    case State::stopped: return "stopped";
  }
  return "?";
}

LeaseKeeper::LeaseKeeper(Options options, Callback on_change)
    : options_(std::move(options)), on_change_(std::move(on_change)), client_(options_.client) {}

LeaseKeeper::~LeaseKeeper() { stop(); }

milliseconds LeaseKeeper::margin() const {
  std::int64_t ttl = std::max<std::int64_t>(ttl_.load(), options_.ttl_seconds);
  milliseconds t(ttl * 1000);
  if (options_.margin.count() > 0) return std::min(options_.margin, t / 2);
  return std::max(t / 5, milliseconds(500));
}

milliseconds LeaseKeeper::renew_every() const {
  std::int64_t ttl = ttl_.load() > 0 ? ttl_.load() : options_.ttl_seconds;
  if (options_.renew_every.count() > 0) return options_.renew_every;
  return milliseconds(ttl * 1000) / 3;
}

LeaseKeeper::Clock::time_point LeaseKeeper::deadline() const {
  std::lock_guard lk(mu_);
  return deadline_;
}

LeaseKeeper::Clock::time_point LeaseKeeper::last_renewal_sent() const {
  std::lock_guard lk(mu_);
  return sent_;
}

LeaseKeeper::State LeaseKeeper::state() const {
  std::lock_guard lk(mu_);
  return state_;
}

bool LeaseKeeper::valid() const {
  std::lock_guard lk(mu_);
  return state_ == State::active && Clock::now() < deadline_;
}

Status LeaseKeeper::start() {
  const auto sent = Clock::now();
  LeaseGrant g;
  // A grant that takes most of the TTL arrives in jeopardy: the deadline counts from its sending.
  // So it gets a third of the TTL (at least 500 ms), shared among the endpoints like any call.
  const auto budget = std::min(options_.client.request_timeout,
                               std::max(milliseconds(options_.ttl_seconds * 1000 / 3), milliseconds(500)));
  Status st = client_.grant(options_.ttl_seconds, &g, budget);
  if (!st.ok()) return st;
  lease_id_ = g.id;
  ttl_ = g.ttl;
  {
    std::lock_guard lk(mu_);
    sent_ = sent;
    deadline_ = sent + milliseconds(g.ttl * 1000) - margin();
    state_ = State::active;  // the loop reports jeopardy at once if the grant came back too late
  }
  thread_ = std::thread([this] { loop(); });
  return Status::OK();
}

void LeaseKeeper::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lk(mu_);
  if (state_ != State::idle) state_ = State::stopped;
}

Status LeaseKeeper::revoke(milliseconds timeout) {
  stop();
  if (lease_id_.load() == 0) return Status::OK();
  return client_.revoke(lease_id_.load(), timeout);
}

void LeaseKeeper::loop() {
  std::unique_lock lk(mu_);
  auto change = [&](State s, const std::string& why) {
    if (state_ == s) return;
    state_ = s;
    if (on_change_) {
      lk.unlock();
      on_change_(s, why);
      lk.lock();
    }
  };
  Clock::time_point next_renew = sent_ + renew_every();
  while (!stopping_) {
    auto now = Clock::now();
    if (state_ == State::active && now >= deadline_) {
      change(State::jeopardy, "no renewal evidence before the lease deadline");
      continue;
    }
    Clock::time_point wake = next_renew;
    if (state_ == State::active) wake = std::min(wake, deadline_);
    if (now < wake) {
      // Bounded: the condition variable's timer is monotonic and would sleep through a suspension.
      cv_.wait_for(lk, wait_slice(wake));
      continue;
    }
    // Renew. While active, give up on this request by the deadline so jeopardy is reported on time,
    // and after half a renewal period at most: a member that hangs (a blackholed link, a stalled
    // disk) must leave time to retry on the next endpoint before the deadline, or one bad member
    // of a healthy cluster would cost the leadership.
    milliseconds timeout = std::min(client_.options().request_timeout, std::max(renew_every() / 2, milliseconds(250)));
    if (state_ == State::active)
      timeout = std::min(timeout, std::chrono::duration_cast<milliseconds>(deadline_ - now) + 1ms);
    timeout = std::max(timeout, milliseconds(100));
    const std::int64_t id = lease_id_.load();
    lk.unlock();
    const auto sent = Clock::now();
    std::int64_t ttl = 0;
    Status st = client_.keepalive(id, &ttl, timeout);
    lk.lock();
    if (stopping_) break;
    if (st.ok() && ttl > 0) {
      ++renewals_;
      ttl_ = ttl;
      const auto d = sent + milliseconds(ttl * 1000) - margin();
      sent_ = sent;
      deadline_ = std::max(deadline_, d);
      next_renew = sent + renew_every();
      if (Clock::now() >= d) change(State::jeopardy, "renewal evidence arrived after its deadline (process paused?)");
      else if (state_ == State::jeopardy) change(State::active, "renewed");
    } else if (st.ok()) {
      change(State::lost, "etcd says the lease is gone (keepalive without TTL)");
      break;
    } else {
      next_renew = Clock::now() + options_.retry_every;
    }
  }
}

}  // namespace fencegate::election
