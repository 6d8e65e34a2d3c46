// Renewer: the lease-safety rule for the ZooKeeper and Redis backends (the etcd backend has its
// LeaseKeeper), on its own thread.
//
//   deadline = boot-clock time the last answered renewal was SENT + TTL - margin
//   margin   = max(TTL/5, 500 ms), at most TTL/2
//
// A "renewal" is whatever proves the coordinator still holds our session or lock at the moment
// the request was sent (ZooKeeper: any answered request on the session -- the server counts the
// session's timeout from the last request it heard; Redis: PEXPIRE of our own lock). Renewals go
// out every `every`, retried every 250 ms after a failure. No evidence by the deadline, or an
// answer that arrives after its own deadline (paused mid-request), is jeopardy; the renew
// function saying the session or lock is gone is loss; saying our node/lock was removed while the
// session lives is `gone`. valid() reads the clock itself (a process resumed after SIGSTOP sees
// the deadline passed at once). Waits are cut into kMaxBootClockWait slices (common/boot_clock.h).
//
// Thread-safety: every public method is thread-safe. `renew` runs on the renewer's thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "common/boot_clock.h"

namespace fencegate::election {

class Renewer {
 public:
  using Clock = BootClock;
  enum class Result { renewed, failed, lost, gone };
  // Called on the renewer's thread; *why explains failed/lost/gone (logs).
  using Renew = std::function<Result(std::string* why)>;

  Renewer(std::string what, std::chrono::milliseconds ttl, std::chrono::milliseconds every, Renew renew);
  ~Renewer();  // stop()
  Renewer(const Renewer&) = delete;
  Renewer& operator=(const Renewer&) = delete;

  // Starts renewing; the first deadline counts from `sent` (when the session/lock request went out).
  void start(Clock::time_point sent);
  void stop();
  // The session/lock is gone (e.g. ZooKeeper's session-expired event): final.
  void mark_lost(const std::string& why);

  bool valid() const;
  bool started() const;
  bool gone() const { return gone_.load(); }
  Clock::time_point deadline() const;
  std::chrono::milliseconds margin() const { return margin_; }
  std::chrono::milliseconds ttl() const { return ttl_; }
  std::string state() const;

  static std::chrono::milliseconds margin_for(std::chrono::milliseconds ttl);

 private:
  void loop();

  // Constant after construction
  const std::string what_;
  const std::chrono::milliseconds ttl_, every_, margin_;
  const Renew renew_;

  std::atomic<bool> gone_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_
  enum class State { idle, active, jeopardy, lost, stopped } state_ = State::idle;
  Clock::time_point deadline_{};
  bool stopping_ = false;

  std::thread thread_;
};

}  // namespace fencegate::election
