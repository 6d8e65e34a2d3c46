#include "proxy/fence.h"

#include <algorithm>

#include "common/boot_clock.h"

namespace fencegate::proxy {

namespace {
struct Waiter {
  std::int64_t g;
  InflightNode* node;
  DecisionFn done;
  std::shared_ptr<store::KeyRider> rider;  // issue 30: a key to record with the advance to g
};
}  // namespace

struct FenceResource {
  explicit FenceResource(std::string n) : name(std::move(n)) {
    head.prev = head.next = &head;
    observed_head.prev = observed_head.next = &observed_head;
  }
  const std::string name;
  std::string route;  // the route it is counted against (RouteQuota); guarded by the fence's map_mu_

  // Guarded by mu
  std::mutex mu;
  std::int64_t stored = 0;
  std::int64_t seen = 0;
  std::string seen_leader;
  std::size_t inflight = 0;  // linked nodes (admitted writes of generation == stored)
  InflightNode head;         // sentinel of the intrusive list of in-flight writes
  // Writes forwarded under observe mode and still in flight (track_observed()). After a switch
  // to enforce they may be of any generation, so no enforce write is admitted while any is.
  std::size_t observed = 0;
  InflightNode observed_head;
  std::vector<Waiter> waiting;
  bool advancing = false;   // draining or committing towards `seen`
  bool committing = false;  // a store.advance() is outstanding
  bool drain_armed = false;
  std::chrono::steady_clock::time_point drain_deadline;
  // A drain that waits for writes forwarded under observe mode aborts them at observe_deadline.
  bool observe_abort_armed = false;
  std::chrono::steady_clock::time_point observe_deadline;
  std::chrono::steady_clock::time_point drain_started;  // valid while draining
  bool draining = false;
  // Observe mode: the highest generation forwarded while its advance failed to commit (0: none
  // owed). Retried about every second until it is stored (retry_owed()), so a later switch
  // to enforce, or a restart, starts from it.
  std::int64_t owed = 0;
  std::string owed_leader;
  // Guarded by the fence's timer_mu_: on its retry list
  bool retry_queued = false;
};

struct Fence::After {
  std::vector<std::pair<DecisionFn, Decision>> calls;
  FenceResource* commit = nullptr;
  std::int64_t target = 0;
  std::string leader;
  bool drain_wait = false;
  double drained_seconds = -1;  // >= 0: a drain ended, report it
  std::vector<std::shared_ptr<store::KeyRider>> riders;  // issue 30: keys recorded with the commit
};

Fence::Fence(store::Store& store, std::chrono::milliseconds drain_timeout, std::size_t max_resources)
    : store_(store), drain_timeout_ms_(drain_timeout.count()), max_resources_(max_resources) {
  timer_ = std::thread([this] { timer_loop(); });
}

Fence::~Fence() {
  {
    std::lock_guard lk(timer_mu_);
    stopping_ = true;
  }
  timer_cv_.notify_all();
  timer_.join();
}

bool Fence::load(std::string* error) {
  std::vector<store::ResourceState> all;
  store::Status st = store::Status::OK();
  try {
    all = store_.load_all(&st);
  } catch (const std::exception& e) {
    if (error) *error = e.what();
    return false;
  }
  // A read that stopped part way (a corrupt page) would leave resources out, and a resource left
  // out starts at generation 0: tokens below its stored generation would be let through.
  if (!st.ok()) {
    if (error) *error = "reading the stored generations failed part way: " + st.message();
    return false;
  }
  std::lock_guard lk(map_mu_);
  for (auto& s : all) {
    FenceResource* slot = by_name_.find(s.resource);
    if (!slot) slot = add_locked(s.resource);
    slot->stored = slot->seen = s.generation;
  }
  return true;
}

void Fence::set_limits(std::chrono::milliseconds drain_timeout, std::size_t max_resources) {
  drain_timeout_ms_.store(drain_timeout.count(), std::memory_order_relaxed);
  max_resources_.store(max_resources, std::memory_order_relaxed);
}

void Fence::set_observe_cap(std::chrono::milliseconds cap) {
  observe_cap_ms_.store(cap.count(), std::memory_order_relaxed);
}

// REQUIRES: map_mu_ held, `resource` not held yet.
FenceResource* Fence::add_locked(const std::string& resource) {
  FenceResource* r = resources_.emplace_back(std::make_unique<FenceResource>(resource)).get();
  by_name_.insert(r);
  return r;
}

FenceResource* Fence::find_or_create(const std::string& resource, const RouteQuota* quota) {
  std::lock_guard lk(map_mu_);
  if (FenceResource* r = by_name_.find(resource)) return r;
  if (resources_.size() >= max_resources_.load(std::memory_order_relaxed)) return nullptr;
  std::size_t* held = quota ? &per_route_[std::string(quota->route)] : nullptr;
  if (held && quota->max_resources > 0 && *held >= quota->max_resources) return nullptr;
  FenceResource* r = add_locked(resource);
  if (held) {
    r->route = std::string(quota->route);
    ++*held;
  }
  return r;
}

void Fence::recount_routes(const std::function<std::string(const std::string&)>& route_of) {
  std::lock_guard lk(map_mu_);
  per_route_.clear();
  for (auto& r : resources_) {
    r->route = route_of(r->name);
    if (!r->route.empty()) ++per_route_[r->route];
  }
}

FenceResource* Fence::find_existing(const std::string& resource) {
  std::lock_guard lk(map_mu_);
  return by_name_.find(resource);
}

// REQUIRES: r->mu held. Never fenced: no generation stored, none on its way to the store.
static bool never_fenced(const FenceResource* r) { return r->stored == 0 && r->seen == 0 && r->owed == 0; }

Fence::Removal Fence::remove(const std::string& resource, std::int64_t* generation) {
  FenceResource* r = find_existing(resource);
  if (!r) return Removal::unknown;
  std::lock_guard lk(r->mu);
  if (never_fenced(r)) return Removal::unknown;
  if (r->inflight || r->observed || !r->waiting.empty() || r->advancing || r->committing || r->owed > r->stored)
    return Removal::busy;
  *generation = r->stored;
  r->stored = r->seen = 0;
  r->seen_leader.clear();
  return Removal::removed;
}

void Fence::restore(const std::string& resource, std::int64_t generation) {
  FenceResource* r = find_existing(resource);
  if (!r) return;
  std::lock_guard lk(r->mu);
  if (r->advancing || r->committing) {
    // A write began creating it again meanwhile: that advance's target is raised instead.
    r->seen = std::max(r->seen, generation);
    return;
  }
  r->stored = std::max(r->stored, generation);
  r->seen = std::max(r->seen, r->stored);
}

std::int64_t Fence::current(const std::string& resource) {
  FenceResource* r = nullptr;
  {
    std::lock_guard lk(map_mu_);
    r = by_name_.find(resource);
    if (!r) return 0;
  }
  std::lock_guard lk(r->mu);
  return r->stored;
}

std::vector<ResourceView> Fence::snapshot() {
  std::vector<FenceResource*> all;
  {
    std::lock_guard lk(map_mu_);
    all.reserve(resources_.size());
    for (auto& r : resources_) all.push_back(r.get());
  }
  std::vector<ResourceView> out;
  out.reserve(all.size());
  for (FenceResource* r : all) {
    std::lock_guard lk(r->mu);
    out.push_back(ResourceView{r->name, r->stored, r->seen, r->inflight + r->observed, r->waiting.size(),
                               std::max(r->owed, r->stored)});
  }
  std::sort(out.begin(), out.end(), [](const ResourceView& a, const ResourceView& b) { return a.name < b.name; });
  return out;
}

FenceStats Fence::stats() {
  std::lock_guard lk(stats_mu_);
  return stats_;
}

static void link(FenceResource* r, InflightNode* n, bool observed = false) {
  InflightNode& head = observed ? r->observed_head : r->head;
  n->resource = r;
  n->generation = r->stored;
  n->observed = observed;
  n->aborted = false;
  n->prev = head.prev;
  n->next = &head;
  head.prev->next = n;
  head.prev = n;
  ++(observed ? r->observed : r->inflight);
}

// REQUIRES: r->mu held. Whether nothing stands in the way of the advance under way: no write
// forwarded under observe is in flight, and, when a newer generation is to be committed, no
// admitted write of the older one either.
static bool drained(const FenceResource* r) {
  // Admitted writes count whatever their generation: one admitted at a generation that observe
  // mode has since advanced past (a switch to observe with writes in flight) is older.
  return r->observed == 0 && r->inflight == 0;
}

void Fence::track_observed(FenceResource* r, InflightNode* node) {
  if (!r) return;
  std::lock_guard lk(r->mu);
  link(r, node, /*observed=*/true);
}

bool Fence::decide_now(FenceResource* r, std::int64_t g, InflightNode* node, Decision* now, bool may_create) {
  if (!r) {
    if (!may_create) return false;  // not held: admit()/observe() decide unfenced
    *now = Decision{Verdict::overloaded, 0, 0, false};
    return true;
  }
  std::lock_guard lk(r->mu);
  if (node) {  // enforce: the same first two cases as admit()
    if (g < r->seen) {
      *now = Decision{Verdict::stale, r->stored, r->seen, false};
      return true;
    }
    if (g == r->stored && r->seen == r->stored && !r->advancing && r->observed == 0 && gate_open()) {
      link(r, node);
      *now = Decision{Verdict::admit, r->stored, r->seen, false};
      return true;
    }
    return false;
  }
  // observe: the same first two cases as observe()
  if (g < r->seen) {
    *now = Decision{Verdict::admit, r->stored, r->seen, true};
    return true;
  }
  if (g <= r->stored) {
    *now = Decision{Verdict::admit, r->stored, r->seen, false};
    return true;
  }
  return false;
}

bool Fence::admit(const std::string& resource, std::int64_t g, const std::string& leader, InflightNode* node,
                  Decision* now, DecisionFn later, bool may_create, std::shared_ptr<store::KeyRider> rider) {
  FenceResource* r = may_create ? find_or_create(resource) : find_existing(resource);
  if (!r) {
    *now = Decision{may_create ? Verdict::overloaded : Verdict::unfenced, 0, 0, false};
    return true;
  }
  After after;
  {
    std::lock_guard lk(r->mu);
    if (!may_create && never_fenced(r)) {
      *now = Decision{Verdict::unfenced, 0, 0, false};
      return true;
    }
    if (g < r->seen) {
      *now = Decision{Verdict::stale, r->stored, r->seen, false};
      return true;
    }
    if (!gate_open()) {  // fleet: not a member (docs/fleet.md)
      *now = Decision{Verdict::store_error, r->stored, r->seen, false, true};
      std::lock_guard sl(stats_mu_);
      ++stats_.fleet_refused;
      return true;
    }
    if (g == r->stored && r->seen == r->stored && !r->advancing && r->observed == 0) {  // the fast path
      link(r, node);
      *now = Decision{Verdict::admit, r->stored, r->seen, false};
      return true;
    }
    if (g > r->seen) {
      // A newer generation: writes parked for the previous target are stale now.
      r->seen = g;
      r->seen_leader = leader;
      for (auto& w : r->waiting)
        after.calls.emplace_back(std::move(w.done), Decision{Verdict::stale, r->stored, g, false});
      r->waiting.clear();
    }
    // g == seen > stored: park until the advance commits. (g == seen == stored: writes forwarded
    // under observe mode are still in flight, from before a switch to enforce: park until they end.)
    r->waiting.push_back(Waiter{g, node, std::move(later), std::move(rider)});
    if (!r->advancing) start_advance(r, after);
  }
  run(after);
  return false;
}

// REQUIRES: r->mu held, !r->advancing, r->seen > r->stored or parked writes of the stored
// generation wait for writes forwarded under observe mode.
void Fence::start_advance(FenceResource* r, After& after) {
  r->advancing = true;
  proceed(r, after);
}

// REQUIRES: r->mu held, r->advancing, !r->committing. The next step of the advance: wait (up to
// the drain timeout) while writes are in the way, then commit the newer generation, or admit the
// parked writes once it is durable.
void Fence::proceed(FenceResource* r, After& after) {
  if (!drained(r)) {
    if (r->draining) return;  // the wait is on already (or its timeout has aborted what was in the way)
    after.drain_wait = true;
    r->drain_armed = true;
    r->draining = true;
    r->drain_started = std::chrono::steady_clock::now();
    r->drain_deadline = r->drain_started + std::chrono::milliseconds(drain_timeout_ms_.load(std::memory_order_relaxed));
    r->observe_abort_armed = r->observed > 0;
    r->observe_deadline = r->drain_started + std::chrono::milliseconds(observe_cap_ms_.load(std::memory_order_relaxed));
    {
      std::lock_guard tl(timer_mu_);
      deadlines_.emplace(r->drain_deadline, r);
      if (r->observe_abort_armed) deadlines_.emplace(r->observe_deadline, r);
    }
    timer_cv_.notify_all();
    return;
  }
  r->drain_armed = false;
  r->observe_abort_armed = false;
  if (r->draining) {
    r->draining = false;
    after.drained_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - r->drain_started).count();
  }
  if (r->seen > r->stored) {
    begin_commit(r, after);
    return;
  }
  r->advancing = false;
  const bool gate = gate_open();
  for (auto& w : r->waiting) {
    if (w.g == r->stored && !gate) {  // fleet: not a member (docs/fleet.md)
      after.calls.emplace_back(std::move(w.done), Decision{Verdict::store_error, r->stored, r->seen, false, true});
    } else if (w.g == r->stored) {
      link(r, w.node);
      after.calls.emplace_back(std::move(w.done), Decision{Verdict::admit, r->stored, r->seen, false});
    } else {
      after.calls.emplace_back(std::move(w.done), Decision{Verdict::stale, r->stored, r->seen, false});
    }
  }
  r->waiting.clear();
}

// REQUIRES: r->mu held, r->advancing, drained(r), !r->committing.
void Fence::begin_commit(FenceResource* r, After& after) {
  r->committing = true;
  after.commit = r;
  after.target = r->seen;
  after.leader = r->seen_leader;
  // Issue 30: the keys of writes parked for this generation are recorded in the same commit.
  if (store_.rides_keys())
    for (auto& w : r->waiting)
      if (w.rider && w.g == r->seen) {
        std::lock_guard rl(w.rider->mu);
        if (w.rider->attached) continue;
        w.rider->attached = true;
        after.riders.push_back(w.rider);
      }
}

void Fence::run(After& after) {
  if (after.drained_seconds >= 0 && drain_observer_) drain_observer_(after.drained_seconds);
  if (after.drain_wait) {
    std::lock_guard lk(stats_mu_);
    ++stats_.drain_waits;
  }
  if (after.commit) {
    FenceResource* r = after.commit;
    std::int64_t target = after.target;
    auto done = [this, r, target](const store::Status& st) { on_committed(r, target, st); };
    if (after.riders.empty()) store_.advance(r->name, target, after.leader, std::move(done));
    else store_.advance_keyed(r->name, target, after.leader, std::move(after.riders), std::move(done));
  }
  for (auto& [fn, d] : after.calls)
    if (fn) fn(d);
}

void Fence::on_committed(FenceResource* r, std::int64_t target, const store::Status& st) {
  After after;
  {
    std::lock_guard lk(r->mu);
    r->committing = false;
    if (!st.ok()) {
      // Fail closed: nothing parked is forwarded; `stored` stays as it was.
      r->advancing = false;
      const bool lapsed = !gate_open();
      for (auto& w : r->waiting)
        after.calls.emplace_back(std::move(w.done), Decision{Verdict::store_error, r->stored, r->seen, false, lapsed});
      r->waiting.clear();
    } else {
      r->stored = std::max(r->stored, target);
      {
        std::lock_guard sl(stats_mu_);
        ++stats_.advances;
      }
      // A newer generation that arrived while committing is committed next (nothing was
      // admitted meanwhile, so no admitted write is in the way); writes forwarded under observe
      // mode meanwhile are waited for before anything is admitted.
      proceed(r, after);
    }
  }
  run(after);
}

void Fence::shutdown() {
  std::vector<FenceResource*> all;
  {
    std::lock_guard lk(map_mu_);
    for (auto& r : resources_) all.push_back(r.get());
  }
  for (FenceResource* r : all) {
    std::vector<Waiter> dropped;
    {
      std::lock_guard lk(r->mu);
      dropped.swap(r->waiting);
      for (InflightNode* h : {&r->head, &r->observed_head}) {
        for (InflightNode* n = h->next; n != h;) {
          InflightNode* next = n->next;
          n->prev = n->next = nullptr;
          n->resource = nullptr;
          n = next;
        }
        h->prev = h->next = h;
      }
      r->inflight = 0;
      r->observed = 0;
      r->drain_armed = false;
      r->observe_abort_armed = false;
    }
    // `dropped` (and the callbacks' captured state) is destroyed here, outside the lock.
  }
  std::lock_guard tl(timer_mu_);
  deadlines_.clear();
}

void Fence::release(InflightNode* n) {
  FenceResource* r = n->resource;
  if (!r) return;
  After after;
  {
    std::lock_guard lk(r->mu);
    if (!n->resource) return;
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = nullptr;
    n->resource = nullptr;
    --(n->observed ? r->observed : r->inflight);
    if (r->advancing && !r->committing) proceed(r, after);
  }
  run(after);
}

bool Fence::holds_advance(InflightNode* n) {
  FenceResource* r = n->resource;
  if (!r) return false;
  std::lock_guard lk(r->mu);
  // (Writes forwarded under observe mode are aborted by the observe cap, not by this.)
  return n->resource && !n->observed && r->advancing && n->generation < r->seen;
}

bool Fence::observe(const std::string& resource, std::int64_t g, const std::string& leader, Decision* now,
                    DecisionFn later, bool may_create) {
  FenceResource* r = may_create ? find_or_create(resource) : find_existing(resource);
  if (!r) {
    *now = Decision{may_create ? Verdict::overloaded : Verdict::unfenced, 0, 0, false};
    return true;
  }
  {
    std::lock_guard lk(r->mu);
    if (!may_create && never_fenced(r)) {
      *now = Decision{Verdict::unfenced, 0, 0, false};
      return true;
    }
    if (g < r->seen) {
      *now = Decision{Verdict::admit, r->stored, r->seen, true};
      return true;
    }
    if (g <= r->stored) {
      *now = Decision{Verdict::admit, r->stored, r->seen, false};
      return true;
    }
    if (g > r->seen) {
      r->seen = g;
      r->seen_leader = leader;
    }
  }
  store_.advance(r->name, g, leader, [this, r, g, leader, later = std::move(later)](const store::Status& st) {
    Decision d;
    After after;
    bool owed = false;
    {
      std::lock_guard lk(r->mu);
      if (st.ok()) r->stored = std::max(r->stored, g);
      if (r->owed <= r->stored) r->owed = 0;
      d = Decision{st.ok() ? Verdict::admit : Verdict::store_error, r->stored, r->seen, false};
      // An enforce advance waiting meanwhile (a switch from observe) may be free to go on now.
      if (st.ok() && r->advancing && !r->committing) proceed(r, after);
      // The write is forwarded all the same (observe mode stops nothing), so its generation is
      // owed to the store: without it a restart would start below a generation already let through.
      if (!st.ok() && g > r->stored && g > r->owed) {
        r->owed = g;
        r->owed_leader = leader;
      }
      owed = r->owed > r->stored;
    }
    run(after);
    if (owed) queue_retry(r);
    if (st.ok()) {
      std::lock_guard sl(stats_mu_);
      ++stats_.advances;
    }
    later(d);
  });
  return false;
}

void Fence::queue_retry(FenceResource* r) {
  std::lock_guard lk(timer_mu_);
  if (r->retry_queued) return;
  r->retry_queued = true;
  if (retry_list_.empty()) retry_at_ = std::chrono::steady_clock::now() + kRetryInterval;
  retry_list_.push_back(r);
  timer_cv_.notify_all();
}

void Fence::retry_owed(FenceResource* r) {
  std::int64_t g;
  std::string leader;
  {
    std::lock_guard lk(r->mu);
    if (r->owed <= r->stored) {
      r->owed = 0;
      return;
    }
    g = r->owed;
    leader = r->owed_leader;
  }
  store_.advance(r->name, g, std::move(leader), [this, r, g](const store::Status& st) {
    After after;
    bool owed = false;
    {
      std::lock_guard lk(r->mu);
      if (st.ok()) r->stored = std::max(r->stored, g);
      if (r->owed <= r->stored) r->owed = 0;
      if (st.ok() && r->advancing && !r->committing) proceed(r, after);
      owed = r->owed > r->stored;
    }
    run(after);
    if (st.ok()) {
      std::lock_guard sl(stats_mu_);
      ++stats_.advances;
      ++stats_.owed_stored;
    }
    if (owed) queue_retry(r);  // at shutdown nothing takes it off the list: owed() reports it
  });
}

void Fence::settle_owed() {
  std::lock_guard rl(retry_mu_);
  retries_stopped_ = true;
  std::vector<FenceResource*> all;
  {
    std::lock_guard lk(map_mu_);
    for (auto& r : resources_) all.push_back(r.get());
  }
  for (FenceResource* r : all) retry_owed(r);
}

std::vector<ResourceView> Fence::owed() {
  std::vector<ResourceView> out;
  for (const ResourceView& v : snapshot())
    if (v.owed > v.stored) out.push_back(v);
  return out;
}

void Fence::timer_loop() {
  std::unique_lock lk(timer_mu_);
  while (!stopping_) {
    const auto now = std::chrono::steady_clock::now();
    if (!retry_list_.empty() && now >= retry_at_) {
      std::vector<FenceResource*> due;
      due.swap(retry_list_);
      for (FenceResource* r : due) r->retry_queued = false;
      lk.unlock();
      {
        // Not once settle_owed() ran: the store may be going away.
        std::lock_guard rl(retry_mu_);
        if (!retries_stopped_)
          for (FenceResource* r : due) retry_owed(r);
      }
      lk.lock();
      continue;
    }
    if (deadlines_.empty() || now < deadlines_.begin()->first) {
      auto until = deadlines_.empty() ? std::chrono::steady_clock::time_point::max() : deadlines_.begin()->first;
      if (!retry_list_.empty()) until = std::min(until, retry_at_);
      if (until == std::chrono::steady_clock::time_point::max()) timer_cv_.wait(lk);
      else timer_cv_.wait_until(lk, until);
      continue;
    }
    FenceResource* r = deadlines_.begin()->second;
    deadlines_.erase(deadlines_.begin());
    lk.unlock();
    std::uint64_t aborted = 0;
    After after;
    {
      std::lock_guard rl(r->mu);
      if (r->advancing && !r->committing && r->drain_armed && drained(r)) {
        proceed(r, after);  // what was in the way went without a release (a commit made by observe)
      } else {
        const auto now = std::chrono::steady_clock::now();
        if (r->advancing && !r->committing && r->drain_armed && !drained(r) && now >= r->drain_deadline) {
          r->drain_armed = false;
          // Abort every admitted exchange of an older generation; each releases its node once
          // its socket is closed, and the last release goes on with the advance. Writes of the
          // generation the advance is for are waited for.
          for (InflightNode* n = r->head.next; n != &r->head; n = n->next) {
            if (n->aborted || n->generation >= r->seen) continue;
            n->aborted = true;
            ++aborted;
            if (n->abort) n->abort();
          }
        }
        // Writes forwarded under observe mode (from before a switch to enforce) are waited for
        // up to the observe cap, then aborted the same way: a client trickling its body makes
        // progress, but cannot hold the switch for longer than upstream_timeout_ms.
        if (r->advancing && !r->committing && r->observe_abort_armed && r->observed > 0 && now >= r->observe_deadline) {
          r->observe_abort_armed = false;
          for (InflightNode* n = r->observed_head.next; n != &r->observed_head; n = n->next) {
            if (n->aborted) continue;
            n->aborted = true;
            ++aborted;
            if (n->abort) n->abort();
          }
        }
      }
    }
    run(after);
    if (aborted) {
      std::lock_guard sl(stats_mu_);
      stats_.drain_aborts += aborted;
    }
    lk.lock();
  }
}

// --- Fleet (docs/fleet.md) ---

bool Fence::gate_open() const {
  return gate_ == nullptr || BootClock::now_ns() < gate_->load(std::memory_order_acquire);
}

void Fence::raise_seen(FenceResource* r, std::int64_t g, After& after) {
  r->seen = g;
  r->seen_leader.clear();
  for (auto& w : r->waiting) after.calls.emplace_back(std::move(w.done), Decision{Verdict::stale, r->stored, g, false});
  r->waiting.clear();
}

void Fence::note_remote(const std::string& resource, std::int64_t g) {
  FenceResource* r = find_or_create(resource);
  if (!r) return;  // over max_resources: its writes are refused (overloaded) anyway
  After after;
  {
    std::lock_guard lk(r->mu);
    if (g < r->seen || g <= r->stored) return;
    if (g > r->seen) raise_seen(r, g, after);
    // Also when g == seen: an advance to it that failed (e.g. while not a member) is tried again,
    // so the intent still waiting for this replica's acknowledgement gets it.
    if (!r->advancing) start_advance(r, after);
  }
  run(after);
}

bool Fence::note_intent(const std::string& resource, std::int64_t g) {
  FenceResource* r = find_or_create(resource);
  if (!r) return false;
  After after;
  bool clear = false;
  {
    std::lock_guard lk(r->mu);
    if (g < r->seen || g <= r->stored) return false;
    clear = !r->advancing && !r->committing && r->waiting.empty() && drained(r);
    if (g > r->seen) raise_seen(r, g, after);
    // Nothing in the way: seen alone makes the acknowledgement true (docs/fleet.md, guarantee 3).
    if (!clear && !r->advancing) start_advance(r, after);
  }
  run(after);
  return clear;
}

bool Fence::note_committed(const std::string& resource, std::int64_t g) {
  FenceResource* r = find_or_create(resource);
  if (!r) return false;
  After after;
  {
    std::lock_guard lk(r->mu);
    if (g <= r->stored) return false;
    if (!r->advancing && !r->committing && r->waiting.empty() && drained(r)) {
      r->stored = g;
      if (g > r->seen) {
        r->seen = g;
        r->seen_leader.clear();
      }
      std::lock_guard sl(stats_mu_);
      ++stats_.advances;
      return true;
    }
    if (g < r->seen) return false;  // an advance to a higher one is under way: it reads this too
    if (g > r->seen) raise_seen(r, g, after);
    if (!r->advancing) start_advance(r, after);
  }
  run(after);
  return false;
}

std::size_t Fence::abort_inflight() {
  std::vector<FenceResource*> all;
  {
    std::lock_guard lk(map_mu_);
    for (auto& r : resources_) all.push_back(r.get());
  }
  std::size_t aborted = 0;
  for (FenceResource* r : all) {
    std::lock_guard lk(r->mu);
    for (InflightNode* n = r->head.next; n != &r->head; n = n->next) {
      if (n->aborted) continue;
      n->aborted = true;
      ++aborted;
      if (n->abort) n->abort();
    }
  }
  return aborted;
}

}  // namespace fencegate::proxy
