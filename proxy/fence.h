// Fence: the per-resource admission decision, in memory, backed by the durable Store.
//
// Invariants, per resource r (see docs/DESIGN.md):
//   stored(r)  durable generation; never decreases.
//   seen(r)    highest generation presented in enforce mode (>= stored); seen > stored while an
//              advance is under way (or after one failed).
//   A write of generation g is admitted only while g == stored(r) == seen(r), and an advance to a
//   higher generation commits only once no admitted write of r is still in flight (drain).
// Enforce decision for generation g:
//   g <  seen                  -> stale (409), no I/O
//   g == stored == seen        -> admitted at once (fast path: one mutex, no I/O)
//   g == seen > stored         -> parked until the advance commits
//   g >  seen                  -> seen = g; parked writes of lower generations become stale;
//                                 drain in-flight writes (abort them after drain_timeout), commit
//                                 g durably, then admit the parked writes of generation g.
//   Writes forwarded under observe mode that are still in flight (a switch to enforce) are
//   waited for before any enforce write is admitted, even of the stored one: up to the observe
//   cap (upstream_timeout_ms), then aborted, so a switch to enforce waits at most that long.
// Observe mode never rejects and never drains: it reports what enforce would have decided and
// still advances the stored generation durably before the write is forwarded.
//
// Thread-safety: all methods are thread-safe. Completion callbacks run on the calling thread
// (fast path and immediate rejections), on the store thread (after a commit) or on the fence's
// timer thread; they must only post work elsewhere.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "fence_store/store.h"
#include "proxy/name_index.h"

namespace fencegate::proxy {

class Fence;
struct FenceResource;

// An admitted write's registration while its upstream exchange is in flight. Owned by the caller
// (e.g. inside a session). `abort` must be cheap and thread-safe (post a socket close); the fence
// calls it, under the resource's lock, if a newer generation's drain times out.
struct InflightNode {
  InflightNode* prev = nullptr;
  InflightNode* next = nullptr;
  std::function<void()> abort;
  FenceResource* resource = nullptr;  // set while linked
  bool observed = false;              // linked by track_observed() (observe mode)
  std::int64_t generation = 0;        // the stored generation when it was linked
  bool aborted = false;               // set by the fence before calling abort
};

enum class Verdict {
  admit,        // forward; in enforce mode the InflightNode is linked until Fence::release()
  stale,        // g < current: reject 409 (enforce) / would_reject_stale (observe, then forwarded)
  store_error,  // could not make the advance durable: 503 (enforce); observe forwards anyway
  overloaded,   // too many distinct resources in memory: 503
  unfenced,     // the resource has never been fenced and this call may not create it (a route with
                // "new_resources": "fenced_only"): 409 resource-not-fenced; nothing was created
};

struct Decision {
  Verdict verdict = Verdict::admit;
  std::int64_t current = 0;   // stored (durable) generation after the decision
  std::int64_t newest = 0;    // highest generation seen (>= current); what made a write stale
  bool observe_stale = false; // observe mode: enforce would have rejected as stale
  bool fleet_unavailable = false;  // fleet (docs/fleet.md): store_error because this replica is not a member
};

using DecisionFn = std::function<void(Decision)>;

struct ResourceView {
  std::string name;
  std::int64_t stored = 0;
  std::int64_t seen = 0;
  std::size_t inflight = 0;
  std::size_t waiting = 0;
  // >= stored. Above it: a generation forwarded in observe mode whose advance has not committed
  // yet (the store failed); it is retried about every second.
  std::int64_t owed = 0;
};

struct FenceStats {
  std::uint64_t advances = 0;
  std::uint64_t drain_waits = 0;
  std::uint64_t drain_aborts = 0;
  std::uint64_t owed_stored = 0;  // observe-mode generations stored by a retry after a failed commit
  std::uint64_t fleet_refused = 0;  // fleet: enforce writes refused because the replica was not a member
};

class Fence {
 public:
  // REQUIRES: `store` is valid while the Fence is used. At shutdown destroy the store first (its
  // destructor runs pending completions, which call back into the Fence), then the Fence.
  Fence(store::Store& store, std::chrono::milliseconds drain_timeout, std::size_t max_resources);
  ~Fence();
  Fence(const Fence&) = delete;
  Fence& operator=(const Fence&) = delete;

  // A config reload: drains started from now on wait up to `drain_timeout`; new resources are
  // made up to `max_resources` (those already held stay, if there are more).
  void set_limits(std::chrono::milliseconds drain_timeout, std::size_t max_resources);
  // How long a drain waits for writes forwarded under observe mode (a switch to enforce) before
  // it aborts them: the config's upstream_timeout_ms (set at start and by a reload).
  void set_observe_cap(std::chrono::milliseconds cap);

  // Loads stored generations from the store. Returns false (and *error) if it cannot.
  bool load(std::string* error);

  // Enforce-mode admission of a write of generation g to `resource`. If the decision can be made
  // without waiting (fast path, stale, overloaded) it is stored in *now and true is returned;
  // otherwise `later` is called exactly once when it is made. On admit, `node` is linked and the
  // caller must call release(node) when the upstream exchange is over (or fails).
  // `may_create` false (a fenced_only route's write): a resource that has never been fenced
  // (none held, or held with no generation: stored == seen == 0) is neither created in memory
  // nor advanced; the decision is unfenced.
  // Issue 30: `rider` (a keyed write's key) is recorded in flight in the same store commit as the
  // advance this write waits for, when there is one and the store can (rider->attached is then
  // set before `later` runs); a write not admitted must Store::abandon() an attached rider.
  bool admit(const std::string& resource, std::int64_t g, const std::string& leader, InflightNode* node, Decision* now,
             DecisionFn later, bool may_create = true, std::shared_ptr<store::KeyRider> rider = nullptr);

  // The decision of admit() (node given: enforce) or observe() (node null) when it can be made
  // without waiting: stale, the fast path (g is the stored generation; enforce links the node),
  // overloaded. Returns true with *now set; false when that call would have to wait (an advance
  // is due or under way), and then nothing has changed. Allocates nothing.
  bool decide_now(const std::string& resource, std::int64_t g, InflightNode* node, Decision* now) {
    return decide_now(find_or_create(resource), g, node, now);
  }
  // The same for a resource found before (find()); nullptr decides overloaded.
  // `may_create` false: nullptr is a resource not held (found with find(name, false)), whose
  // decision has to be made by admit() or observe() (false is returned), not overloaded.
  bool decide_now(FenceResource* r, std::int64_t g, InflightNode* node, Decision* now, bool may_create = true);
  // The resource's state, made on first use (unless `may_create` is false); nullptr iff over
  // max_resources (or not held and not to be made). Never freed while the Fence lives, so
  // callers may keep the pointer.
  FenceResource* find(const std::string& resource, bool may_create = true) {
    return may_create ? find_or_create(resource) : find_existing(resource);
  }
  // The same, for a write of a route with its own cap: a resource is created only while fewer
  // than `max_resources` (0: no cap of its own) of the route's resources are held, and is counted
  // as the route's. `route` names the route (its prefix).
  struct RouteQuota {
    std::string_view route;
    std::size_t max_resources = 0;
  };
  FenceResource* find(const std::string& resource, bool may_create, const RouteQuota& quota) {
    return may_create ? find_or_create(resource, &quota) : find_existing(resource);
  }
  // Counts the resources held per route afresh, at start and after a reload (routes may have
  // changed): `route_of` names the route that owns a resource ("" for none).
  void recount_routes(const std::function<std::string(const std::string&)>& route_of);

  // REQUIRES: node was linked by admit() or track_observed(). Safe to call more than once.
  void release(InflightNode* node);

  // Whether an advance to a newer generation is waiting for this admitted (enforce) write: its
  // drain timeout, not the caller, should end it then.
  bool holds_advance(InflightNode* node);

  // Observe mode: registers a write about to be forwarded (whatever its token) until release().
  // Nothing waits for it in observe mode; but no enforce write is admitted, and no advance
  // committed, while such a write is still in flight (a switch to enforce): the first enforce
  // decision waits for them, up to the observe cap (set_observe_cap), then aborts them: observe
  // mode stops nothing by itself, but a write that trickles its body cannot hold the switch to
  // enforce for longer than upstream_timeout_ms. No-op for nullptr (a resource over
  // max_resources, untracked).
  void track_observed(FenceResource* r, InflightNode* node);

  // Observe mode: never rejects and never drains. A higher generation is stored durably before
  // the decision (so switching to enforce later starts from it). Same now/later contract as admit.
  // `may_create`: as for admit() (observe mode then neither creates nor stores anything).
  bool observe(const std::string& resource, std::int64_t g, const std::string& leader, Decision* now, DecisionFn later,
               bool may_create = true);

  // Shutdown, before the store drains: stops the retries of owed observe-mode generations (see
  // ResourceView::owed) and queues one last attempt for each, which the store's drain commits.
  void settle_owed();
  // Resources still owing a generation (owed > stored), e.g. after settle_owed() and the drain.
  std::vector<ResourceView> owed();

  // Shutdown: forgets every parked decision callback (without calling it) and every in-flight
  // registration, so the owners of those callbacks and nodes (sessions on io_contexts being torn
  // down) can be destroyed in any order; later release() calls are no-ops.
  // REQUIRES: no further admit()/observe() calls and no store completions still to come.
  void shutdown();

  // DELETE /v1/resources/{id}: forgets a resource's generation in memory, so that it is as if it
  // had never been fenced (older generations are admitted again; a fenced_only route's writes are
  // refused until it is fenced anew). The caller then removes it from the store durably, and calls
  // restore() if that fails. Refused (busy) while anything is under way for it: a write in flight
  // (admitted, or forwarded under observe), a write parked, an advance, or an observe-mode
  // generation still owed to the store; nothing changes then. The resource's slot in memory is
  // kept (callers keep pointers to it) until the process restarts.
  enum class Removal { removed, unknown, busy };
  Removal remove(const std::string& resource, std::int64_t* generation);
  // Undoes remove() after the store failed to remove the row: the generation is held again
  // (never lowering one a write has set since).
  void restore(const std::string& resource, std::int64_t generation);

  // Current stored generation of a resource (0 if unknown), for responses that made no decision.
  std::int64_t current(const std::string& resource);

  FenceStats stats();

  // Every resource the fence holds, sorted by name (for the admin API and metrics).
  std::vector<ResourceView> snapshot();

  // --- Fleet (docs/fleet.md): entry points used by proxy/fleet.cpp only. ---
  // The membership gate: from now on an enforce write is admitted (and a parked one released)
  // only while BootClock::now_ns() < *deadline_ns, decided under the resource's lock; otherwise it
  // is decided store_error with fleet_unavailable set. REQUIRES: set before traffic; *deadline_ns
  // outlives the Fence.
  void set_gate(const std::atomic<std::int64_t>* deadline_ns) { gate_ = deadline_ns; }
  // Another replica's intent, or a committed generation read from etcd: acts like a write of g
  // with nothing parked (lower parked writes become stale, older in-flight writes are drained or
  // aborted after drain_timeout, then the store's advance(g) runs). No-op if g < seen, if
  // g <= stored, or while an advance is under way; g == seen > stored restarts a failed advance.
  void note_remote(const std::string& resource, std::int64_t g);
  // Another replica's intent of g (issue 33's fast acknowledgement). If no advance of the resource
  // is under way here, nothing is parked and no write is in flight (enforce or observe), raises
  // seen to g (from now on nothing below g is admitted) without starting an advance and returns
  // true: this replica may acknowledge g at once. Otherwise does what note_remote does (the drain,
  // then the store's advance) and returns false. Also false, with no effect, if g < seen or
  // g <= stored.
  bool note_intent(const std::string& resource, std::int64_t g);
  // A generation g committed in etcd (a put of fence/<r> the watch delivered). If no advance is
  // under way, nothing is parked and no write is in flight, stored and seen become at least g at
  // once (no store call: the caller keeps the local copy) and true is returned; otherwise does
  // what note_remote does and returns false. False with no effect if g <= stored.
  bool note_committed(const std::string& resource, std::int64_t g);
  // Calls abort on every in-flight enforce write not yet aborted (membership lapsed). Returns
  // how many it aborted.
  std::size_t abort_inflight();
  // The relay asks this right before it sends request bytes upstream (proxy/relay.cpp): false iff
  // `n` is a linked enforce write and this replica is not a member now. Closes the window in which
  // a replica resumed after SIGSTOP (its lease gone) passes on bytes of a write it admitted before
  // the stop, before its fleet thread has run to abort it. Thread-safe (a clock read).
  bool fleet_allows_send(const InflightNode& n) const { return n.resource == nullptr || n.observed || gate_open(); }
  // True iff n's sends depend on the fleet's membership (fleet_allows_send can say no).
  bool fleet_gated(const InflightNode& n) const { return gate_ != nullptr && n.resource != nullptr && !n.observed; }

  // Called (on whichever thread ends the drain) with how long each drain waited.
  // REQUIRES: set before traffic starts.
  void set_drain_observer(std::function<void(double seconds)> obs) { drain_observer_ = std::move(obs); }

 private:
  // nullptr iff over the cap (or over the route's, when a quota is given)
  FenceResource* find_or_create(const std::string& resource, const RouteQuota* quota = nullptr);
  FenceResource* find_existing(const std::string& resource);   // nullptr iff not held
  FenceResource* add_locked(const std::string& resource);
  struct After;  // work to run once a resource's lock is released
  void start_advance(FenceResource* r, After& after);
  // Fleet: raises r's seen to g (> seen) for a generation seen elsewhere, forgetting its leader;
  // writes waiting for the fence are refused as stale. r->mu held.
  void raise_seen(FenceResource* r, std::int64_t g, After& after);
  void proceed(FenceResource* r, After& after);
  void begin_commit(FenceResource* r, After& after);
  void run(After& after);
  void on_committed(FenceResource* r, std::int64_t target, const store::Status& st);
  void timer_loop();
  void queue_retry(FenceResource* r);
  void retry_owed(FenceResource* r);

  // Constant after construction
  store::Store& store_;
  // Set at construction and by set_limits (a reload)
  std::atomic<std::chrono::milliseconds::rep> drain_timeout_ms_;
  std::atomic<std::chrono::milliseconds::rep> observe_cap_ms_{30000};
  std::atomic<std::size_t> max_resources_;

  // Guarded by map_mu_
  std::mutex map_mu_;
  // Every resource ever held (never erased: remove() clears one's state), and the index by name
  // that the data path looks them up in.
  std::vector<std::unique_ptr<FenceResource>> resources_;
  NameIndex<FenceResource> by_name_;
  std::unordered_map<std::string, std::size_t> per_route_;  // resources held per route (guarded by map_mu_)

  // Guarded by timer_mu_: drain deadlines
  std::mutex timer_mu_;
  std::condition_variable timer_cv_;
  std::multimap<std::chrono::steady_clock::time_point, FenceResource*> deadlines_;
  bool stopping_ = false;
  static constexpr std::chrono::seconds kRetryInterval{1};
  std::vector<FenceResource*> retry_list_;           // owed generations to retry (FenceResource::retry_queued)
  std::chrono::steady_clock::time_point retry_at_;  // when, if retry_list_ is not empty
  // Held while retries are issued; settle_owed() sets retries_stopped_ under it, so no retry
  // reaches the store after the shutdown's last attempt. Taken before timer_mu_, never after.
  std::mutex retry_mu_;
  bool retries_stopped_ = false;
  std::thread timer_;

  std::function<void(double)> drain_observer_;  // constant once traffic starts
  const std::atomic<std::int64_t>* gate_ = nullptr;  // fleet membership deadline; constant once traffic starts
  bool gate_open() const;

  // Guarded by stats_mu_
  std::mutex stats_mu_;
  FenceStats stats_;
};

}  // namespace fencegate::proxy
