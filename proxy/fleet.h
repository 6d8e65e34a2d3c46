// Fleet: one fence shared by several fencegate replicas on etcd (docs/fleet.md, issue 33).
//
// Fleet owns this replica's membership (an etcd lease and the key members/<member>, renewed by
// rounds of keepalive + a read of intent/ and fence/, with a deadline on the boot clock), keeps
// the local Fence current through an etcd watch of its prefix (every put of fence/ or intent/
// raises `seen`: Fence::note_remote; each renewal round's read does the same, so a watch that
// lags or breaks costs latency, never safety), and aborts the in-flight fenced exchanges once
// the deadline has passed.
// wrap() returns the Store the Fence is given: its advance() runs the etcd protocol (intent,
// acknowledgements, commit) on a thread of its own; every other call goes to the local SQLite
// store (audit, queries).
//
// Without "fleet" in the config no Fleet exists and nothing here runs.
//
// Thread-safety: member(), status_json() and render_metrics() are thread-safe. Order of use:
// wrap(), attach(), start() before traffic; stop() after the workers stopped and before the store
// and the fence are torn down.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/boot_clock.h"
#include "config/config.h"
#include "fence_store/store.h"
#include "proxy/metrics.h"

namespace fencegate::election {
class Client;
class Watch;
struct KeyValue;
struct TxnOp;
struct WatchBatch;
}  // namespace fencegate::election

namespace fencegate::proxy {

class Fence;

class Fleet {
 public:
  // The fleet thread's tick (no etcd request: it only checks whether a renewal round is due).
  static constexpr std::chrono::milliseconds kPollEvery{25};
  // The local SQLite copy of committed generations (best effort: etcd holds the fence) is written
  // by the fleet thread at most this often, the newest generation per resource: one commit for
  // many advances. Written at each advance, every replica's fsync landed on the disk just as the
  // next advance's etcd transactions needed it.
  static constexpr std::chrono::milliseconds kLocalCopyEvery{500};

  // REQUIRES: cfg.fleet.enabled() (validated). Throws std::invalid_argument naming the fleet.*
  // field if an etcd TLS file or the password file no longer loads (issue 27).
  Fleet(const config::Config& cfg);
  ~Fleet();  // stop()
  Fleet(const Fleet&) = delete;
  Fleet& operator=(const Fleet&) = delete;

  // The store for the Fence: etcd for generations, `local` for everything else.
  std::unique_ptr<store::Store> wrap(std::unique_ptr<store::Store> local);
  // Gates the fence's admission on membership and lets remote generations reach it.
  void attach(Fence& fence);
  void start();
  // Stops the threads, fails advances still running, revokes the lease (the others then need not
  // wait for this replica). Idempotent.
  void stop();

  bool member() const;
  // GET /v1/fleet
  std::string status_json() const;
  // The fencegate_fleet_* metrics.
  void render_metrics(std::string& out) const;

 private:
  friend class FleetStore;
  using Done = store::Store::Done;

  void loop();
  void guard_loop();
  bool join();
  bool renew();
  bool poll();
  void start_watch();  // (re)starts the watch of prefix_ from now
  void on_watch(const election::WatchBatch& b);
  void on_intent(const std::string& r, std::int64_t x, const std::string& who);
  void on_committed(const std::string& r, std::int64_t g, const std::string& who);
  void advance(std::string resource, std::int64_t w, std::string leader, Done done);
  store::Status run_advance(const std::string& r, std::int64_t w);
  // Waits for the acknowledgements of intent X (ours, at mod_revision I), then commits it.
  // True iff committed.
  // An advance's acknowledgements as the watch delivers them (docs/fleet.md, step 5), registered
  // before its intent transaction is sent so that no event of it is missed; guarded by mu_.
  struct AckWait {
    std::string acks, intent;                 // the keys acks/r/<x>/ (a prefix) and intent/r
    std::map<std::string, std::int64_t> put;  // member -> the lease of its ack put seen
    std::map<std::string, std::int64_t> gone;  // member -> the revision its member key was deleted at
    // member -> the revision and lease of the newest put of its member key (a restarted member
    // that joined again while its old lease lived: its acknowledgement must be on the new lease)
    std::map<std::string, std::pair<std::int64_t, std::int64_t>> relet;
    std::int64_t intent_rev = 0;              // the newest revision of a change of intent/r seen
  };
  struct AckWaitScope;  // registers an AckWait for its life
  // `at_intent` (optional): members/ and acks/r/x/ as the intent transaction itself read them.
  bool wait_and_commit(const std::string& r, std::int64_t x, std::int64_t intent_mod, std::int64_t fence_mod,
                       BootClock::time_point give_up, std::chrono::steady_clock::time_point started,
                       const AckWait* aw = nullptr,
                       const std::vector<std::vector<election::KeyValue>>* at_intent = nullptr,
                       const char* step1 = "read");
  // The commit without a read (step 5 from the intent's own read and the watch). Returns 1
  // committed, 0 not (the read path takes over), -1 stopping or no longer a member.
  int commit_from_watch(const std::string& r, std::int64_t x, std::int64_t intent_mod, std::int64_t fence_mod,
                        BootClock::time_point give_up, const AckWait& aw,
                        const std::vector<std::vector<election::KeyValue>>& at_intent,
                        std::chrono::steady_clock::time_point* acks_done, std::vector<std::string>* counted);
  // Step 6's operations: put fence/r = x, delete intent/r and the acknowledgements of x.
  std::vector<election::TxnOp> commit_ops(const std::string& r, std::int64_t x) const;
  // `step1`: how step 1 knew fence/ and intent/ ("read", "watch", or "stale": the watch's view
  // failed the intent's compares, then a read).
  void record_commit(const std::string& r, std::int64_t x, std::chrono::steady_clock::time_point started,
                     std::chrono::steady_clock::time_point acks_done, const char* step1);
  bool put_ack(const std::string& r, std::int64_t x);
  void copy_local(const std::string& r, std::int64_t g, std::string by);  // queued for flush_local
  void flush_local();  // the queued local copies, one store batch
  bool sleep_for(std::chrono::milliseconds d);  // false if stopping
  // Until a watch event after `since` (events()), or d; false if stopping.
  bool wait_event(std::uint64_t since, std::chrono::milliseconds d);
  std::uint64_t events() const;

  std::string key(std::string_view kind, std::string_view rest) const;
  std::string ack_key(const std::string& r, std::int64_t x, std::string_view member) const;

  // Constant after construction
  const std::string prefix_;  // fencegate/fleet/<name>/
  const std::string name_, member_;
  const std::chrono::milliseconds ttl_, margin_, drain_timeout_;
  std::unique_ptr<election::Client> client_;
  std::unique_ptr<election::Watch> watch_;    // the fleet thread's only
  std::atomic<bool> watch_dead_{false};
  std::atomic<bool> members_dirty_{
      false};  // the watch saw members/ change       // it stopped (compacted): the fleet thread restarts it
  Fence* fence_ = nullptr;
  store::Store* local_ = nullptr;  // owned by the FleetStore

  std::atomic<std::int64_t> deadline_ns_{0};  // BootClock; member iff now < deadline
  std::atomic<std::int64_t> lease_{0};
  std::atomic<bool> stopping_{false};
  std::atomic<std::uint64_t> acks_waited_{0}, unavailable_{0}, fast_acks_{0};
  std::atomic<std::uint64_t> watch_commits_{0}, read_commits_{0};  // this replica's commits, by how step 5 ended
  Histogram advance_seconds_{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  struct MemberView {
    std::string member;
    std::int64_t ttl_ms = 0, last_seen_ms = 0;
  };
  std::vector<MemberView> members_;  // Guarded by mu_: from the last read of members/
  int advances_running_ = 0;         // Guarded by mu_
  // Guarded by mu_: intents acknowledged by on_intent and not yet seen committed (resource ->
  // generation); the renewal round hands those still open to the slow path.
  std::map<std::string, std::int64_t> acked_;
  std::uint64_t watch_events_ = 0;   // Guarded by mu_: watch batches received
  std::vector<AckWait*> ack_waits_;  // Guarded by mu_: the advances waiting for acknowledgements
  // Guarded by mu_: per resource, fence/r as the last commit the watch delivered left it (that
  // commit deleted intent/r; a put of intent/r since drops the entry). Step 1 then needs no read:
  // the intent transaction's compares check that both are still so.
  struct LastCommit {
    std::int64_t generation = 0, mod_revision = 0;
  };
  std::map<std::string, LastCommit> last_commit_;
  // When the last intent transaction of this replica returned (for the advance's time split).
  std::atomic<std::chrono::steady_clock::time_point> intent_done_{};
  // The local copies not yet written (resource -> generation, advanced_by).
  std::mutex local_mu_;
  std::map<std::string, std::pair<std::int64_t, std::string>> local_pending_;  // Guarded by local_mu_
  std::thread loop_, guard_;
};

}  // namespace fencegate::proxy
