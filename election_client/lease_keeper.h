// LeaseKeeper: grants an etcd lease and keeps it alive from its own thread, and says -- from the
// boot clock, not from what it last heard -- whether the lease may still be relied on.
//
// Deadline (the lease-safety rule):
//   deadline = (boot-clock time when the grant or the last successful renewal was SENT) + TTL - margin
// The clock is CLOCK_BOOTTIME (common/boot_clock.h): it counts a host suspension, as etcd does;
// the monotonic clock would not, and the lease would look valid after a resume.
// etcd measures expiry from when it *received* the request, which is later, so the server-side
// expiry is never before sent + TTL; the margin absorbs clock-rate differences and etcd's own
// lease-checking granularity. Default margin: max(TTL/5, 500 ms) (TTL 2 s -> 0.5 s, 10 s -> 2 s).
// Renewals go out every TTL/3 (first one TTL/3 after the grant was sent), retried every 250 ms
// after a failure; each renewal request's timeout is clipped so the keeper thread is free again
// by the deadline. Renewals use one persistent connection (one request per renewal).
//
// States: active -> jeopardy when the deadline passes without renewal evidence (or a renewal's
// evidence arrives already past its own deadline, e.g. after a SIGSTOP); jeopardy -> active if a
// later renewal succeeds in time; -> lost when etcd says the lease is gone (keepalive without
// TTL). lost and stopped are final. valid() reads the clock itself, so a process resumed after a
// pause (SIGSTOP, or a suspended host) sees the lease as invalid at once, before the keeper thread
// has even run. The keeper thread waits at most kMaxBootClockWait at a time, so after a resume it
// notices jeopardy and renews within that, not after the wait it had left before the suspension.
//
// Thread-safety: all public methods are thread-safe. The callback runs on the keeper thread and
// must not call stop() or revoke().
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/boot_clock.h"
#include "election_client/etcd_client.h"
#include "election_client/status.h"

namespace fencegate::election {

class LeaseKeeper {
 public:
  using Clock = BootClock;  // every deadline below: counts a suspended host
  enum class State { idle, active, jeopardy, lost, stopped };
  static const char* to_string(State s);

  struct Options {
    ClientOptions client;
    std::int64_t ttl_seconds = 10;                     // requested TTL (etcd's minimum is 2)
    std::chrono::milliseconds margin{0};               // 0: max(TTL/5, 500 ms)
    std::chrono::milliseconds renew_every{0};          // 0: TTL/3
    std::chrono::milliseconds retry_every{250};        // after a failed renewal
  };
  using Callback = std::function<void(State state, const std::string& why)>;

  LeaseKeeper(Options options, Callback on_change = {});
  ~LeaseKeeper();  // stop()
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  // Grants the lease (blocking, up to the client's request timeout) and starts renewing.
  // REQUIRES: called once.
  Status start();
  // Stops renewing and joins the thread (the lease then runs out at etcd). Idempotent.
  void stop();
  // stop(), then revokes the lease at etcd (best effort within `timeout`).
  Status revoke(std::chrono::milliseconds timeout = std::chrono::milliseconds(2000));

  std::int64_t lease_id() const { return lease_id_.load(); }
  std::int64_t ttl_seconds() const { return ttl_.load(); }  // as granted
  std::chrono::milliseconds margin() const;
  std::chrono::milliseconds renew_every() const;
  Clock::time_point deadline() const;
  // Send time of the grant or the last successful renewal.
  Clock::time_point last_renewal_sent() const;
  State state() const;
  // Returns true iff the state is active and now < deadline(). Reads the boot clock.
  bool valid() const;
  std::uint64_t renewals() const { return renewals_.load(); }

 private:
  void loop();
  void set_state(State s, const std::string& why);  // REQUIRES: mu_ held by caller? no: takes mu_

  // Constant after construction
  Options options_;
  Callback on_change_;
  Client client_;

  std::atomic<std::int64_t> lease_id_{0};
  std::atomic<std::int64_t> ttl_{0};
  std::atomic<std::uint64_t> renewals_{0};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_
  State state_ = State::idle;
  Clock::time_point deadline_{};
  Clock::time_point sent_{};
  bool stopping_ = false;

  std::thread thread_;
};

}  // namespace fencegate::election
