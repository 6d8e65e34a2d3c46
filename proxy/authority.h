// Authority-linked fencing: a route whose config names an etcd election ("authority") admits only
// the generation of that election's current leader, as etcd sees it, and fences a new leader in
// as soon as etcd shows it -- before the new leader writes.
//
// etcd's election keys are "<election>/<lease-hex>", each attached to its candidate's lease; the
// leader is the live key with the LOWEST create_revision, and that create_revision is the leader's
// fencing token (what `fencegate elect` puts in FENCING_TOKEN). An Authority keeps, from a range of
// the prefix (on start, every probe, and after a watch compaction) and a watch on it:
//   - the live keys (create_revision, lease, value) and so the current leader's revision;
//   - every creation revision seen under the prefix since start (for not_leader vs unknown);
//   - the leader lease's TTL as granted by etcd (/v3/lease/timetolive "grantedTTL");
//   - the latest header revision seen;
//   - liveness: the last successful contact with etcd (a range's send time, or a watch message).
// Classification of a presented generation g (check()):
//   no contact for the outage window     -> unavailable (503)
//   g == leader's create_revision        -> leader: the normal fence path decides
//   g <  leader's create_revision        -> stale (409 rejected_stale)
//   g is a key seen (gone, or waiting)   -> not_leader (409 rejected_not_leader)
//   anything else (never seen, > latest) -> unknown_generation (409 rejected_unknown_generation)
// Outage window = the leader lease's granted TTL, or grace_ms if smaller; 1 s while the TTL is
// not known (no leader, a key without a lease, TTL lookup pending). Probes run every window/3
// (at most every 50 ms, at least every second). The window is measured on CLOCK_BOOTTIME
// (common/boot_clock.h): a host suspension counts, as it does at etcd, so after a resume the
// leader's window is over rather than extended by the pause; the probe waits are at most a
// second, so the first probe after a resume comes within one.
//
// Threads: each Authority runs one loop thread (ranges, TTL lookups, probes) and one etcd watch
// thread. check() takes one mutex and reads the clock: no I/O, safe on I/O threads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/boot_clock.h"
#include "config/config.h"
#include "config/router.h"
#include "election_client/backend.h"
#include "election_client/etcd_client.h"
#include "election_client/watch.h"

namespace fencegate::proxy {

class Runtime;

enum class AuthorityVerdict {
  leader,              // g is the current leader's generation: the normal fence decision applies
  stale,               // g < the current leader's generation
  not_leader,          // g's key is gone (resigned, expired) or still waiting in line
  unknown_generation,  // g is not the creation revision of any election key seen
  unavailable,         // etcd not reached within the outage window (or never yet): 503
};
std::string_view to_string(AuthorityVerdict v);

struct AuthorityCheck {
  AuthorityVerdict verdict = AuthorityVerdict::unavailable;
  std::int64_t leader = 0;  // the current leader's generation, 0 if none
  std::string why;          // for unavailable: since when / why
};

// The election as last seen: a pure state machine (no I/O, not thread-safe; Authority locks it).
class ElectionView {
 public:
  struct Key {
    std::int64_t create_revision = 0;
    std::int64_t lease = 0;
    std::string value;
  };

  // A snapshot of every key under the prefix as of header revision `revision` (a range). Ignored
  // if the view already reflects a later revision (the watch got ahead of it).
  void resync(const std::vector<election::KeyValue>& kvs, std::int64_t revision);
  // One watch batch; events below the revision the view reflects are skipped (those at it are
  // applied: several events share a revision when one transaction made them).
  void apply(const election::WatchBatch& batch);
  // Forgets everything: etcd went back to an older state (a snapshot restore), where the keys
  // and revisions the view holds may mean something else. The next resync() starts it over.
  void reset() { *this = ElectionView(); }
  // A header revision seen anywhere (raises latest_revision()).
  void saw_revision(std::int64_t revision) {
    if (revision > latest_) latest_ = revision;
  }

  AuthorityVerdict classify(std::int64_t g) const;

  std::int64_t leader_revision() const { return leader_rev_; }
  std::int64_t leader_lease() const { return leader_lease_; }
  const std::string& leader_value() const { return leader_value_; }
  std::int64_t revision() const { return state_rev_; }  // the revision the keys reflect
  std::int64_t latest_revision() const { return latest_; }
  bool synced() const { return synced_; }
  std::size_t live_keys() const { return live_.size(); }

 private:
  void recompute_leader();

  std::map<std::string, Key> live_;  // key -> its creation revision, lease, value
  std::set<std::int64_t> seen_;      // creation revisions seen (>= the leader's, pruned below it)
  std::int64_t state_rev_ = 0;
  std::int64_t latest_ = 0;
  std::int64_t leader_rev_ = 0;
  std::int64_t leader_lease_ = 0;
  std::string leader_value_;
  bool synced_ = false;
};

class Authority {
 public:
  using Clock = BootClock;  // the window since the last contact: counts a suspended host
  // Called (on the loop or watch thread, serialised, never under the state lock) when a leader
  // with a higher generation than any announced before appears. `leader_id` is the value the
  // leader campaigned with (may be empty).
  using OnNewLeader = std::function<void(std::int64_t generation, const std::string& leader_id)>;

  Authority(config::Authority cfg, OnNewLeader on_new_leader);
  ~Authority();  // stop()
  Authority(const Authority&) = delete;
  Authority& operator=(const Authority&) = delete;

  void start();
  // Stops the watch and the loop and joins them. Idempotent.
  void stop();

  // Thread-safe, no I/O: one mutex and a clock read.
  AuthorityCheck check(std::int64_t g) const;

  // check(), but a refusal that the watch may simply not have caught up with yet (not_leader,
  // unknown_generation: a leader elected moments ago, or just after an etcd restart) is checked
  // against etcd first: one range read of the election, then check() again. Blocks for up to a
  // request timeout; for the activation barrier, not for the data path. If etcd cannot be asked,
  // the verdict is `unavailable` (503: the barrier retries), not a refusal.
  AuthorityCheck confirm(std::int64_t g);

  const config::Authority& config() const { return cfg_; }

  // How the authority's view of etcd stands: in sync, reachable within the leader's lease window,
  // and the leader it knows.
  struct Health {
    bool synced = false;
    bool available = false;
    std::int64_t leader = 0;
    std::int64_t leader_lease = 0;
    std::int64_t leader_ttl_ms = 0;  // 0: unknown
    std::int64_t revision = 0;
    std::int64_t latest_revision = 0;
    std::int64_t ms_since_contact = -1;  // -1: never
    std::int64_t window_ms = 0;
  };
  Health health() const;

 private:
  void loop();
  // A ZooKeeper or Redis authority (config "coordinator"): no watch, a snapshot of the election
  // (every candidate node and its czxid; the lock's holder and generation) every probe.
  void polled_loop();
  bool resync_polled();
  bool polled() const { return observer_ != nullptr; }
  bool resync() { return polled() ? resync_polled() : resync(*client_); }
  bool resync(election::Client& client);  // range the prefix; returns true iff etcd answered
  void fetch_ttl();
  void start_watch_locked_out(std::int64_t from);
  void on_batch(const election::WatchBatch& b);
  void on_watch_state(election::Watch::State s, std::int64_t revision, const election::Status& why);
  // REQUIRES: mu_ held.
  std::chrono::milliseconds window_locked() const;
  void after_change_locked();  // leader bookkeeping after the view changed; REQUIRES mu_ held
  void announce();             // calls on_new_leader_ if a newer leader is pending; NOT under mu_

  // Constant after construction
  const config::Authority cfg_;
  const std::string prefix_;
  const OnNewLeader on_new_leader_;
  election::ClientOptions client_options_;
  std::unique_ptr<election::Client> client_;  // etcd only
  std::unique_ptr<election::Backend> backend_;   // ZooKeeper, Redis (issue 31)
  std::unique_ptr<election::Observer> observer_;  // Guarded by observer_mu_ (used by the loop and confirm())
  std::mutex observer_mu_;
  std::int64_t polls_ = 0;  // Guarded by mu_: the view's revision for polled snapshots
  // issue 31: Redis keyspace notifications (election::ChangeFeed) on their own thread: a notice
  // makes the loop take a snapshot at once; a pong that follows no unsnapshotted notice counts as
  // contact from the moment its ping was sent (the poll then only backs it up, every poll_ms).
  void feed_loop();
  std::thread feed_thread_;
  bool feed_active_ = false;          // Guarded by mu_
  std::int64_t notices_ = 0;          // Guarded by mu_: notices received (and subscriptions made)
  std::int64_t notices_synced_ = 0;   // Guarded by mu_: notices_ when the last applied snapshot was sent
  bool kick_ = false;                 // Guarded by mu_: take a snapshot now

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_
  ElectionView view_;
  Clock::time_point last_contact_{};
  bool contacted_ = false;
  std::int64_t ttl_lease_ = 0;    // the lease whose TTL ttl_ms_ is
  std::int64_t ttl_ms_ = 0;       // granted TTL of ttl_lease_, 0 = unknown
  bool compacted_ = false;
  bool restart_watch_ = false;  // etcd went back: the watch starts over from the new revision
  bool stopping_ = false;
  bool available_logged_ = true;  // last availability logged (to log transitions once)
  std::int64_t pending_announce_ = 0;
  std::string pending_leader_id_;

  std::mutex announce_mu_;         // serialises on_new_leader_ calls
  std::int64_t announced_ = 0;     // Guarded by announce_mu_

  std::unique_ptr<election::Watch> watch_;  // owned by the loop thread
  std::thread thread_;
};

// Every authority of the running config, and the proactive advance of their routes' resources.
//
// A new leader's generation is fenced into each route that names the authority (mode enforce:
// Fence::admit + release, i.e. drain and durable commit exactly like POST /v1/resources/{id}/fence;
// mode observe: Fence::observe; mode off: nothing): a route whose resource template has no
// captures -> that resource; with captures -> every resource the fence currently holds whose name
// matches the template.
class Authorities {
 public:
  explicit Authorities(Runtime& rt);
  ~Authorities();  // stop()

  // Creates and starts one Authority per distinct authority in cfg's routes.
  void start(const config::Config& cfg);
  void stop();
  bool empty() const { return by_prefix_.empty(); }

  // The authority of the route with this prefix; nullptr if none. Thread-safe after start().
  Authority* for_route(const config::Route& r) const {
    if (!r.authority) return nullptr;
    auto it = by_prefix_.find(r.prefix);
    return it == by_prefix_.end() ? nullptr : it->second;
  }

 private:
  void advance(const config::Authority& a, std::int64_t generation, const std::string& leader_id);

  Runtime& rt_;
  std::vector<std::unique_ptr<Authority>> all_;
  std::unordered_map<std::string, Authority*> by_prefix_;  // constant after start()
};

using config::resource_matches_template;  // config/router.h

}  // namespace fencegate::proxy
