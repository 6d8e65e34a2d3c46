// Watch: follows every change under a key prefix through etcd's /v3/watch stream, on its own
// thread, and hands each event batch to a callback. Built to be reused by an authority-linked
// fence (watching an election's "<name>/" prefix): it reports when it is (re)established and
// when it is broken, resumes after a break from the revision after the last one delivered, and
// stops with State::compacted when etcd has compacted that revision away -- the owner then
// resyncs (Client::range on the prefix gives a snapshot and its header revision) and starts a
// new Watch at revision + 1.
//
// A silent etcd (SIGSTOPped, partitioned) is not detected by the stream itself unless
// idle_timeout is set; owners that need liveness should also probe (e.g. a LeaseKeeper).
//
// Thread-safety: start()/stop() from one owner thread; callbacks run on the watch thread and must
// not call stop().
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "election_client/etcd_client.h"
#include "election_client/status.h"

namespace fencegate::election {

struct WatchEvent {
  enum class Type { put, del };
  Type type = Type::put;
  KeyValue kv;  // for del: key and mod_revision (the deletion's revision)
};

struct WatchBatch {
  ResponseHeader header;
  std::vector<WatchEvent> events;
};

class Watch {
 public:
  enum class State { connecting, watching, broken, compacted, stopped };
  static const char* to_string(State s);

  struct Options {
    ClientOptions client;
    std::string prefix;                              // watches [prefix, prefix_range_end(prefix))
    std::int64_t start_revision = 0;                 // 0: from now
    bool reconnect = true;                           // after a break, resume (else stop: State::broken)
    std::chrono::milliseconds reconnect_backoff{500};
    std::chrono::milliseconds idle_timeout{0};       // 0: none (see file comment)
  };
  using OnBatch = std::function<void(const WatchBatch&)>;
  // State changes: watching (created, with the stream's header revision in `revision`), broken
  // (with why), compacted (revision = etcd's compact revision), stopped.
  using OnState = std::function<void(State, std::int64_t revision, const Status& why)>;

  Watch(Options options, OnBatch on_batch, OnState on_state = {});
  ~Watch();  // stop()
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

  void start();
  // Cancels the stream and joins. Idempotent.
  void stop();
  // The revision the next (re)connection would start from.
  std::int64_t next_revision() const { return next_revision_.load(); }

 private:
  void loop();
  // Returns false to end the stream.
  bool on_line(std::string_view line);

  // Constant after construction
  Options options_;
  OnBatch on_batch_;
  OnState on_state_;

  std::atomic<bool> stopping_{false};
  std::atomic<std::int64_t> next_revision_{0};
  // Used only on the watch thread
  bool compacted_ = false;
  std::int64_t compact_revision_ = 0;
  std::thread thread_;
};

}  // namespace fencegate::election
