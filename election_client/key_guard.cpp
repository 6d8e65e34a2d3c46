// KeyGuard: the leader key's watch and probe that end a term the lease does not (see key_guard.h).
#include "election_client/key_guard.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "common/log.h"

namespace fencegate::election {

using namespace std::chrono_literals;

// The probe has its own client and state and is not joined: a read stuck on a silent member
// must not hold up the end of a term (the process may exit while it waits).
struct KeyGuard::Probe {
  Probe(ClientOptions o, LeaderKey k) : client(std::move(o)), leader(std::move(k)) {}
  void stop() {
    {
      std::lock_guard lk(mu);
      stopping = true;
    }
    cv.notify_all();
  }
  void loop(std::chrono::milliseconds every) {
    std::unique_lock lk(mu);
    while (!stopping && !gone) {
      cv.wait_for(lk, every, [this] { return stopping; });
      if (stopping) return;
      lk.unlock();
      std::vector<KeyValue> kvs;
      const bool absent =
          client.range(leader.key, "", &kvs).ok() && (kvs.empty() || kvs.front().create_revision != leader.rev);
      lk.lock();
      if (absent && !stopping) {
        gone = true;
        log::warn("a read of the leader key finds it gone (its watch did not report it)", {log::kv("key", leader.key)});
      }
    }
  }
  Client client;
  const LeaderKey leader;
  std::atomic<bool> gone{false};
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;  // guarded by mu
};

KeyGuard::KeyGuard(ClientOptions options, Client& client, LeaderKey leader, std::chrono::milliseconds probe_every)
    : options_(std::move(options)), client_(client), leader_(std::move(leader)) {
  watch_from(leader_.rev + 1);
  ClientOptions po = options_;
  po.request_timeout = std::max<std::chrono::milliseconds>(probe_every * 2, 1000ms);
  probe_ = std::make_shared<Probe>(po, leader_);
  std::thread([p = probe_, probe_every] { p->loop(probe_every); }).detach();
}

KeyGuard::~KeyGuard() {
  stopping_ = true;
  probe_->stop();
  watch_.reset();
}

bool KeyGuard::gone() {
  if (std::int64_t r = restart_from_.exchange(0); r > 0 && !gone_) watch_from(r);
  return gone_.load() || probe_->gone.load();
}

void KeyGuard::watch_from(std::int64_t revision) {
  watch_.reset();  // the previous watch has returned (compacted): this joins at once
  Watch::Options wo;
  wo.client = options_;
  wo.prefix = leader_.key;
  wo.start_revision = revision;
  watch_ = std::make_unique<Watch>(
      wo,
      [this](const WatchBatch& b) {
        for (const auto& e : b.events)  // the prefix also covers longer keys: only ours counts
          if (e.kv.key == leader_.key &&
              (e.type == WatchEvent::Type::del || (e.kv.create_revision != 0 && e.kv.create_revision != leader_.rev)))
            gone_ = true;
      },
      [this](Watch::State s, std::int64_t, const Status&) {
        if (s == Watch::State::compacted) recheck();
      });
  watch_->start();
}

void KeyGuard::recheck() {
  while (!stopping_) {
    std::vector<KeyValue> kvs;
    ResponseHeader h;
    if (client_.range(leader_.key, "", &kvs, &h).ok()) {
      if (kvs.empty() || kvs.front().create_revision != leader_.rev) gone_ = true;
      else restart_from_ = h.revision + 1;
      return;
    }
    for (int i = 0; i < 25 && !stopping_; ++i) std::this_thread::sleep_for(20ms);
  }
}

}  // namespace fencegate::election
