// Renewer: renewals on their own thread and the local deadline (see renewer.h).
#include "election_client/renewer.h"

#include <algorithm>

#include "common/log.h"

namespace fencegate::election {

using namespace std::chrono_literals;
using std::chrono::milliseconds;

milliseconds Renewer::margin_for(milliseconds ttl) { return std::min(std::max(ttl / 5, milliseconds(500)), ttl / 2); }

Renewer::Renewer(std::string what, milliseconds ttl, milliseconds every, Renew renew)
    : what_(std::move(what)), ttl_(ttl), every_(every), margin_(margin_for(ttl)), renew_(std::move(renew)) {}

Renewer::~Renewer() { stop(); }

void Renewer::start(Clock::time_point sent) {
  std::lock_guard lk(mu_);
  if (state_ != State::idle) return;
  deadline_ = sent + ttl_ - margin_;
  state_ = State::active;
  thread_ = std::thread([this] { loop(); });
}

void Renewer::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    if (state_ == State::active || state_ == State::jeopardy) state_ = State::stopped;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Renewer::mark_lost(const std::string& why) {
  {
    std::lock_guard lk(mu_);
    if (state_ == State::lost) return;
    state_ = State::lost;
  }
  log::warn("lease state", {log::kv("state", "lost"), log::kv("what", what_), log::kv("why", why)});
  cv_.notify_all();
}

bool Renewer::valid() const {
  std::lock_guard lk(mu_);
  return state_ == State::active && Clock::now() < deadline_;
}

bool Renewer::started() const {
  std::lock_guard lk(mu_);
  return state_ != State::idle;
}

Renewer::Clock::time_point Renewer::deadline() const {
  std::lock_guard lk(mu_);
  return deadline_;
}

std::string Renewer::state() const {
  std::lock_guard lk(mu_);
  switch (state_) {
    case State::idle: return "idle";
    case State::active: return Clock::now() < deadline_ ? "active" : "jeopardy";
    case State::jeopardy: return "jeopardy";
    case State::lost: return "lost";
    case State::stopped: return "stopped";
  }
  return "?";
}

void Renewer::loop() {
  Clock::time_point next = Clock::now() + every_;
  std::unique_lock lk(mu_);
  while (!stopping_ && state_ != State::lost) {
    if (state_ == State::active && Clock::now() >= deadline_) {
      state_ = State::jeopardy;
      log::warn("lease state", {log::kv("state", "jeopardy"), log::kv("what", what_),
                                log::kv("why", "no renewal evidence by the local deadline")});
    }
    if (Clock::now() < next) {
      cv_.wait_for(lk, std::min<std::chrono::nanoseconds>(wait_slice(next), wait_slice(deadline_ + 1ms) + 1ms));
      continue;
    }
    lk.unlock();
    const auto sent = Clock::now();
    std::string why;
    const Result r = renew_(&why);
    const auto answered = Clock::now();
    lk.lock();
    if (stopping_ || state_ == State::lost) break;
    switch (r) {
      case Result::renewed: {
        const auto d = sent + ttl_ - margin_;
        if (answered >= d) {
          if (state_ == State::active) {
            state_ = State::jeopardy;
            log::warn("lease state", {log::kv("state", "jeopardy"), log::kv("what", what_),
                                      log::kv("why", "a renewal answered after its own deadline")});
          }
        } else if (state_ == State::active) {
          deadline_ = std::max(deadline_, d);
        }
        next = sent + every_;
        break;
      }
      case Result::failed:
        log::debug("renewal failed", {log::kv("what", what_), log::kv("error", why)});
        next = answered + 250ms;
        break;
      case Result::lost:
        state_ = State::lost;
        log::warn("lease state", {log::kv("state", "lost"), log::kv("what", what_), log::kv("why", why)});
        break;
      case Result::gone:
        if (!gone_.exchange(true)) log::warn("leadership gone", {log::kv("what", what_), log::kv("why", why)});
        next = sent + every_;
        break;
    }
  }
}

}  // namespace fencegate::election
