// fence_store implementation: SQLite (WAL, synchronous=FULL), one writer thread with group commit,
// a separate read connection for queries, flock-based ownership. The database file itself
// (opening, schema, the ownership lock, probes) is database.cpp's.
#include "fence_store/store.h"
#include "fence_store/store_testing.h"
#include "fence_store/database.h"
#include "fence_store/reader.h"
#include "fence_store/replay_cache.h"
#include "fence_store/key_table.h"
#include "fence_store/file_id.h"
#include "common/file_checks.h"
#include "common/wake_batch.h"

#include <sqlite3.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <climits>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <unordered_map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

namespace fencegate::store {
using namespace detail;
namespace {

// Retention: the store thread prunes about every second when idle, and after commits at most every
// kPruneMinGap (so a steady write load does not pay an extra transaction per batch).
constexpr std::chrono::milliseconds kPruneIdleInterval{1000};
constexpr std::chrono::milliseconds kPruneMinGap{200};
// Issue 29: a backlog of rows older than max_age (retention first set on a large log, or lowered)
// is deleted a chunk at a time with a rest of kPruneBacklogRest x the chunk's own CPU time after each,
// so the store thread takes at most a quarter of a core for it: on a host where it shares a core
// with the I/O threads it would otherwise take half of that core for minutes. Rows over max_rows
// are deleted without a rest (that bound is what caps the disk). Writes still go first.
constexpr int kPruneBacklogRest = 3;
constexpr int kPruneYieldSteps = 2000;  // SQLite VM steps between offers of the core (YieldingSteps)
// Issue 30: group commit under load. When a batch ends with writes already queued behind it, the
// store is what the writers wait for; the next batch then waits, at most kGatherMax, for the
// writers expected soon (the most seen waiting or in flight lately; see gather()), so that one
// fsync serves more of them. Idle or lightly loaded: no wait at all.
constexpr std::chrono::microseconds kGatherMax{1000};
constexpr std::size_t kGatherItems = 256;
constexpr int kGatherProbation = 64;  // gathers without waiting for keys in flight, after such a wait timed out
// Issue 30: what nobody waits for (a key's outcome or release without a completion) rides the
// next commit, or is committed within kLazyWithin: it does not cost a commit of its own.
constexpr std::chrono::milliseconds kLazyWithin{5};

std::int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

// ---- The owning store: lock file, writer thread, reader. ----

class OwnedStore final : public TestableStore {
 public:
  OwnedStore(std::string path, int lock_fd, int db_lock_fd, sqlite3* wdb, sqlite3* rdb)
      : path_(std::move(path)),
        lock_fd_(lock_fd),
        db_lock_fd_(db_lock_fd),
        wdb_(wdb),
        reader_(std::make_unique<Reader>(rdb)) {}

  // Prepares the writer's statements and starts the thread. Returns "" or an error.
  std::string start() {
    const char* sqls[] = {
        "BEGIN IMMEDIATE", "COMMIT", "ROLLBACK",
        ("INSERT INTO resources(resource, generation, advanced_at_ms, advanced_by) VALUES(?1, ?2, ?3, ?4)"
         " ON CONFLICT(resource) DO UPDATE SET generation = excluded.generation,"
         " advanced_at_ms = excluded.advanced_at_ms, advanced_by = excluded.advanced_by"
         " WHERE excluded.generation > resources.generation"),
        ("INSERT INTO audit(time_ms, resource, decision, presented_generation, current_generation, method,"
         " target, client, leader, mode, user_agent, traceparent, client_identity, member)"
         " VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"),
        // Retention: each runs in autocommit mode, one chunk per transaction. A DELETE that matches
        // nothing writes no WAL frame, so an idle check costs an index probe and no fsync.
        "DELETE FROM audit WHERE id IN (SELECT id FROM audit WHERE time_ms < ?1 ORDER BY time_ms LIMIT ?2)",
        "DELETE FROM audit WHERE id IN (SELECT id FROM audit ORDER BY id LIMIT ?1)", "SELECT count(*) FROM audit",
        "DELETE FROM resources WHERE resource = ?1",
        // Issue 30: idempotency keys.
        ("SELECT " KEY_COLUMNS ", body FROM idempotency WHERE resource = ?1 AND scope = ?2 AND key = ?3"),
        ("INSERT OR REPLACE INTO idempotency(resource, scope, key, state, fingerprint, generation, status, headers,"
         " body, body_kept, created_ms, expires_ms) VALUES(?1, ?2, ?3, 0, ?4, ?5, 0, '', x'', 1, ?6, ?7)"),
        ("UPDATE idempotency SET state = ?4, status = ?5, headers = ?6, body = ?7, body_kept = ?8"
         " WHERE resource = ?1 AND scope = ?2 AND key = ?3 AND state IN (0, 2)"),
        ("DELETE FROM idempotency WHERE resource = ?1 AND scope = ?2 AND key = ?3"
         " RETURNING length(body) + length(headers)"),
        ("DELETE FROM idempotency WHERE id IN (SELECT id FROM idempotency WHERE expires_ms <= ?1"
         " ORDER BY expires_ms LIMIT ?2) RETURNING resource, scope, key, length(body) + length(headers)"),
        // The common cases in one step each: a key never seen (no lookup first; a conflict falls
        // back to select + insert), and the answer of a key begun here (found by its row id, the
        // key's columns checked too: a row id reused by another key matches nothing).
        ("INSERT INTO idempotency(resource, scope, key, state, fingerprint, generation, status, headers, body,"
         " body_kept, created_ms, expires_ms) VALUES(?1, ?2, ?3, 0, ?4, ?5, 0, '', x'', 1, ?6, ?7)"
         " ON CONFLICT(resource, scope, key) DO NOTHING"),
        ("UPDATE idempotency SET state = ?4, status = ?5, headers = ?6, body = ?7, body_kept = ?8"
         " WHERE id = ?9 AND resource = ?1 AND scope = ?2 AND key = ?3 AND state IN (0, 2)")};
    sqlite3_stmt** outs[] = {&begin_,           &commit_,
                             &rollback_,        &upsert_,
                             &insert_audit_,    &prune_age_,
                             &prune_oldest_,    &count_audit_,
                             &delete_resource_, &keys_.select,
                             &keys_.insert,     &keys_.settle,
                             &keys_.remove,     &keys_.prune_expired,
                             &keys_.insert_new, &keys_.settle_row};
    static_assert(std::size(sqls) == std::size(outs), "one statement per slot, in the same order");
    for (std::size_t i = 0; i < std::size(sqls); ++i)
      if (sqlite3_prepare_v3(wdb_, sqls[i], -1, SQLITE_PREPARE_PERSISTENT, outs[i], nullptr) != SQLITE_OK)
        return "cannot prepare statements on database " + path_ + ": " + sqlite3_errmsg(wdb_);
    // Issue 30: a key still in flight was recorded by a process that died between forwarding its
    // write and recording the answer: whether the upstream applied it cannot be known.
    if (auto e = exec(wdb_, "UPDATE idempotency SET state = 2 WHERE state = 0"); !e.empty())
      return "cannot mark in-flight idempotency keys unknown on database " + path_ + ": " + e;
    if (auto e = keys_.recount(); !e.empty()) return "cannot count idempotency keys on database " + path_ + ": " + e;
    if (file_id(-1, path_ + "-wal", &wal_id_)) wal_known_ = true;
    thread_ = std::thread([this] { run(); });
    return {};
  }

  void drain_and_stop() override {
    {
      std::lock_guard lk(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (!thread_.joinable()) return;
    thread_.join();
    // Files deleted since the last check (an `rm fence.db*` just before a stop) are put back now,
    // while the connection still sees them: closing would drop the log into the deleted file.
    (void)check_files();  // the store thread is gone: its state is this thread's now
  }

  ~OwnedStore() override {
    drain_and_stop();
    // The reader first: the last connection to close checkpoints and removes the WAL, and only a
    // read-write connection can do that.
    reader_.reset();
    for (auto* st : {begin_, commit_, rollback_, upsert_, insert_audit_, prune_age_, prune_oldest_, count_audit_,
                     delete_resource_, keys_.select, keys_.insert, keys_.settle, keys_.remove, keys_.prune_expired,
                     keys_.insert_new, keys_.settle_row})
      sqlite3_finalize(st);
    sqlite3_close_v2(wdb_);
    ::close(db_lock_fd_);  // release ownership only after every connection is closed
    ::close(lock_fd_);
  }

  std::vector<ResourceState> load_all(Status* status) override {
    std::lock_guard lk(read_mu_);
    return reader_->load_all(status);
  }

  void advance(std::string resource, std::int64_t generation, std::string leader, Done done) override {
    Item it;
    it.kind = Item::kAdvance;
    it.resource = std::move(resource);
    it.generation = generation;
    it.leader = std::move(leader);
    it.done = std::move(done);
    enqueue(std::move(it));
  }

  bool rides_keys() const override { return true; }
  void advance_keyed(std::string resource, std::int64_t generation, std::string leader,
                     std::vector<std::shared_ptr<KeyRider>> riders, Done done) override {
    Item it;
    it.kind = Item::kAdvance;
    it.resource = std::move(resource);
    it.generation = generation;
    it.leader = std::move(leader);
    it.done = std::move(done);
    it.riders = std::move(riders);
    enqueue(std::move(it));
  }

  void remove(std::string resource, Done done) override {
    Item it;
    it.kind = Item::kRemove;
    it.resource = std::move(resource);
    it.done = std::move(done);
    enqueue(std::move(it));
  }

  void append_audit(AuditRow row, Done done) override {
    if (row.time_ms == 0) row.time_ms = now_ms();
    Item it;
    it.kind = Item::kAudit;
    it.row = std::move(row);
    it.done = std::move(done);
    enqueue(std::move(it));
  }

  std::vector<AuditRecord> query_audit(const AuditQuery& q, Status* status) override {
    std::lock_guard lk(read_mu_);
    return reader_->query_audit(q, status);
  }

  std::vector<UnfencedGroup> query_unfenced(const std::string& resource, std::int64_t since_ms, int limit,
                                            Status* status) override {
    std::lock_guard lk(read_mu_);
    return reader_->query_unfenced(resource, since_ms, limit, status);
  }

  void set_retention(std::int64_t max_age_ms, std::uint64_t max_rows) override {
    {
      std::lock_guard lk(mu_);
      max_age_ms_ = max_age_ms < 0 ? 0 : max_age_ms;
      max_rows_ = max_rows;
      retention_changed_ = true;
    }
    cv_.notify_one();
  }

  void set_commit_observer(CommitObserver observer) override {
    auto p = observer ? std::make_shared<const CommitObserver>(std::move(observer)) : nullptr;
    std::lock_guard lk(observer_mu_);
    observer_ = std::move(p);
  }

  // Issue 30: idempotency keys.
  void key_begin(KeyRecord rec, std::uint64_t max_keys, KeyDone done) override {
    Item it;
    it.kind = Item::kKeyBegin;
    it.key = std::make_unique<KeyItem>();
    it.key->rec = std::move(rec);
    it.key->max_keys = max_keys;
    it.key->done = std::move(done);
    enqueue(std::move(it));
  }
  void key_settle(KeyRecord rec, Done done) override {
    Item it;
    it.kind = Item::kKeySettle;
    it.key = std::make_unique<KeyItem>();
    it.key->rec = std::move(rec);
    it.done = std::move(done);
    enqueue(std::move(it));
  }
  void key_release(std::string resource, std::string scope, std::string key, Done done) override {
    Item it;
    it.kind = Item::kKeyRelease;
    it.key = std::make_unique<KeyItem>();
    it.key->rec.resource = std::move(resource);
    it.key->rec.scope = std::move(scope);
    it.key->rec.key = std::move(key);
    it.done = std::move(done);
    enqueue(std::move(it));
  }
  bool key_get(const std::string& resource, const std::string& scope, const std::string& key, KeyRecord* out,
               Status* status) override {
    std::lock_guard lk(read_mu_);
    return reader_->key_get(resource, scope, key, out, status);
  }
  std::vector<KeyRecord> key_list(const std::string& resource, const std::string& after_resource,
                                  const std::string& after_key, int limit, Status* status) override {
    std::lock_guard lk(read_mu_);
    return reader_->key_list(resource, after_resource, after_key, limit, status);
  }
  bool key_cached(const std::string& resource, const std::string& scope, const std::string& key,
                  KeyRecord* out) override {
    std::shared_ptr<const KeyRecord> r = cache_.get(resource, scope, key);
    if (!r || r->expires_ms <= now_ms()) return false;
    *out = *r;
    return true;
  }
  std::vector<std::pair<std::string, std::int64_t>> key_counts() const override { return keys_.counts(); }
  std::vector<std::pair<std::string, std::int64_t>> key_bytes() const override { return keys_.bytes(); }

  std::size_t queue_depth() const override { return pending_.load(std::memory_order_relaxed); }
  std::uint64_t audit_rows_dropped() const override { return dropped_rows_.load(std::memory_order_relaxed); }
  void inject_commit_failure(bool on) override { inject_failure_.store(on); }
  std::uint64_t commit_count() const override { return commits_.load(); }

 private:
  // Issue 30: what a key item carries (kept out of line: most items are advances and audit rows).
  struct KeyItem {
    KeyRecord rec;
    std::uint64_t max_keys = 0;
    KeyDone done;                    // key_begin's
    KeyBeginResult result;           // key_begin's, set by commit()
    bool changed = false;            // key_settle's: it changed the row (cached once committed)
  };
  struct Item {
    enum Kind { kAdvance, kAudit, kRemove, kKeyBegin, kKeySettle, kKeyRelease } kind = kAdvance;
    std::string resource;  // advance, remove
    std::int64_t generation = 0;
    std::string leader;
    AuditRow row;  // audit
    Done done;
    std::unique_ptr<KeyItem> key;  // key_begin, key_settle, key_release
    std::vector<std::shared_ptr<KeyRider>> riders;  // advance_keyed: keys begun in the same transaction
  };

  // Issue 30: one key item inside the batch's transaction. Returns false on an SQLite error.
  bool commit_key(Item& it, std::int64_t now, std::string* err) {
    KeyItem& k = *it.key;
    if (it.kind == Item::kKeyBegin) return keys_.begin(k.rec, k.max_keys, k.result, now, err);
    if (it.kind == Item::kKeySettle) return keys_.settle_key(k.rec, &k.changed, err);
    return keys_.release(k.rec, err);
  }

  void enqueue(Item it) {
    bool queued = false;
    {
      std::lock_guard lk(mu_);
      if (!stopping_) {
        const bool ends_key = it.kind == Item::kKeySettle || it.kind == Item::kKeyRelease;
        const bool lazy = ends_key && !it.done;
        if (ends_key && unsettled_ > 0) --unsettled_;
        eager_ += !lazy;
        queue_.push_back(std::move(it));
        pending_.fetch_add(1, std::memory_order_relaxed);
        // Nobody to wake for a lazy item (unless it is the first: then the idle store thread
        // starts its kLazyWithin), or for one a gathering store thread does not want yet.
        if (lazy ? queue_.size() > 1 || gather_wanted_ > 0 : gather_wanted_ > 0 && eager_ < gather_wanted_) return;
        queued = true;
      }
    }
    // Notified after the lock is released: woken while the caller still held it, the store
    // thread (often on the same core as the caller) would block on the lock at once and then
    // wait for a second wake-up, which the scheduler may serve only at its next tick (4 ms).
    if (queued) {
      cv_.notify_one();
      return;
    }
    // NOLINTNEXTLINE(bugprone-use-after-move): `it` was moved from only when it was queued
    if (it.done) it.done(Status::Error("store for database " + path_ + " is shutting down"));
  }

  // The store thread. Queued items always go first: retention deletes run one chunk at a time,
  // only when the queue is empty, so a write waits behind at most one chunk.
  void run() {
    using Clock = std::chrono::steady_clock;
    std::vector<Item> batch;
    Retention retention;
    bool last_try = false;        // stopping: the rows in retry_ had their last attempt
    bool prune_more = false;      // the last chunk may have left more to delete
    bool prune_now = false;       // retention was just set
    auto last_prune = Clock::now() - kPruneIdleInterval;
    auto prune_rested = Clock::now();  // issue 29: no chunk of a backlog before this
    bool keys_more = false;  // issue 30: the last chunk of expired keys may have left more
    auto last_key_prune = Clock::now();
    for (;;) {
      {
        std::unique_lock lk(mu_);
        auto wake = [&] { return stopping_ || eager_ > 0 || retention_changed_; };
        auto any = [&] { return wake() || !queue_.empty(); };  // a lazy item too (kLazyWithin)
        if (!prune_more && !keys_more && !any()) {
          if (!retry_.empty())  // rows of a failed batch: try them again soon, even if idle
            cv_.wait_for(lk, kRetryInterval, any);
          else  // retention, and the health check, also run when idle
            cv_.wait_for(lk, std::min<std::chrono::milliseconds>(kPruneIdleInterval, kHealthInterval), any);
        } else if (prune_more && !keys_more && retry_.empty() && !any()) {
          cv_.wait_until(lk, prune_rested, any);  // issue 29: the backlog's rest
        }
        // Only lazy items: they ride the next write's commit, or go within kLazyWithin.
        if (!wake() && !queue_.empty()) cv_.wait_for(lk, kLazyWithin, wake);
        if (queue_.empty() && stopping_) {  // stopping and drained: rows still to retry get one last try
          if (retry_.empty() || last_try) {
            dropped_rows_.fetch_add(retry_.size(), std::memory_order_relaxed);
            return;
          }
          last_try = true;
        }
        if (busy_ && !stopping_ && eager_ > 0) gather(lk);
        eager_ = 0;
        batch.swap(queue_);                        // both keep their capacity: no reallocation per batch
        if (!retry_.empty()) {
          batch.insert(batch.begin(), std::make_move_iterator(retry_.begin()), std::make_move_iterator(retry_.end()));
          retry_.clear();
        }
        retention = Retention{max_age_ms_, max_rows_};
        if (retention_changed_) prune_now = true;
        retention_changed_ = false;
      }
      if (!batch.empty()) {
        run_batch(batch);
        std::lock_guard lk(mu_);
        busy_ = eager_ > 0;
      } else health_tick();
      // Issue 30: expired idempotency keys, one small chunk at a time, when no write waits.
      if (keys_more || Clock::now() - last_key_prune >= kPruneIdleInterval) {
        bool idle;
        {
          std::lock_guard lk(mu_);
          idle = queue_.empty() && !stopping_;
        }
        if (idle && !files_lost_) {
          keys_more = keys_.prune(now_ms(), kKeyPruneChunkRows);
          last_key_prune = Clock::now();
        }
      }
      if (retention.max_age_ms <= 0 && retention.max_rows == 0) {
        prune_more = prune_now = false;
        continue;
      }
      const auto now = Clock::now();
      if (!prune_more && !prune_now && now - last_prune < kPruneMinGap) continue;
      if (prune_more && !prune_now && now < prune_rested) continue;
      {
        std::lock_guard lk(mu_);
        if (stopping_) continue;  // drain and exit; no pruning on the way out
        if (!queue_.empty()) {    // writes first; come back for the prune
          prune_more = true;
          continue;
        }
      }
      const auto cpu0 = thread_cpu();
      prune_more = prune_chunk(retention);
      prune_now = false;
      last_prune = now;
      // The row bound caps the disk a flood of refusals can fill: its excess goes at full speed.
      // Otherwise the rest is reckoned from the chunk's CPU time, not its wall time: a chunk that
      // gave the core away (YieldingSteps) took longer without costing more.
      const bool over_rows =
          retention.max_rows > 0 && (audit_rows_ < 0 || static_cast<std::uint64_t>(audit_rows_) > retention.max_rows);
      prune_rested = over_rows ? Clock::now() : Clock::now() + (thread_cpu() - cpu0) * kPruneBacklogRest;
    }
  }

  // Issue 30: the store was the bottleneck for the last batch (busy_): wait, at most kGatherMax,
  // until as many writes are queued as are expected (the most seen lately, waiting or in flight
  // upstream). Keys in flight upstream come back as the next requests' keys within about a commit
  // when the upstream answers fast (keyed POSTs at full load: 26 writes per commit instead of 11,
  // about 5 µs less CPU per keyed request); so they are waited for too, until such a wait times out.
  // Then they are left out (they come back later than one commit) for kGatherProbation gathers. A
  // miscount only shortens or lengthens this bounded wait; it never holds a write longer than
  // kGatherMax.
  void gather(std::unique_lock<std::mutex>& lk) {
    const std::size_t seen = eager_ + unsettled_;
    expected_ = std::max(expected_ > 0 ? expected_ - 1 : 0, seen);
    const bool in_flight_too = in_flight_left_out_ == 0;
    if (!in_flight_too) --in_flight_left_out_;
    const std::size_t away = in_flight_too ? 0 : unsettled_;
    const std::size_t want = std::min(kGatherItems, expected_ > away ? expected_ - away : 0);
    if (eager_ >= want) return;
    gather_wanted_ = want;
    // Fewer came than expected: expect what came (a burst that is over is not waited for again).
    if (!cv_.wait_for(lk, kGatherMax, [&] { return stopping_ || eager_ >= gather_wanted_; })) {
      if (in_flight_too && unsettled_ > 0)  // the keys in flight did not come back in time
        in_flight_left_out_ = kGatherProbation;
      expected_ = eager_ + unsettled_;
    }
    gather_wanted_ = 0;
  }

  // Commits one batch, reports it to the observer, then runs its completions.
  void run_batch(std::vector<Item>& batch) {
    const auto t0 = std::chrono::steady_clock::now();
    Status s = commit(batch);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    failing_ = !s.ok();
    last_health_ = std::chrono::steady_clock::now();  // a commit is as good as a check
    if (s.ok()) {
      commits_.fetch_add(1);
      if (audit_rows_ >= 0)
        for (const auto& it : batch) audit_rows_ += it.kind == Item::kAudit;
    } else {
      audit_rows_ = -1;  // a failed COMMIT may or may not have landed: recount before the next prune
    }
    bool keys_touched = false;  // issue 30
    for (const auto& it : batch)
      keys_touched = keys_touched || !it.riders.empty() || (it.key && (it.kind != Item::kKeySettle || it.key->changed));
    if (keys_touched) {
      if (!s.ok()) (void)keys_.recount();
      else keys_.publish();
    }
    if (s.ok()) {  // (a settle's record is not needed after this: it goes to the cache whole)
      for (auto& it : batch)
        if (it.kind == Item::kKeySettle && it.key->changed) cache_.put(std::move(it.key->rec));
    } else {
      cache_.clear();  // rows cached during the failed batch may not be in the database
    }
    std::shared_ptr<const CommitObserver> obs;
    {
      std::lock_guard lk(observer_mu_);
      obs = observer_;
    }
    if (obs) {
      try {
        (*obs)(seconds, batch.size(), s);
      } catch (...) {
        // An observer must not kill the store thread either.
      }
    }
    if (s.ok()) {  // issue 30: keys now in flight upstream, counted before anyone can settle them
      std::size_t begun = 0;
      for (const auto& it : batch) {
        if (it.kind == Item::kKeyBegin && it.key->result.status.ok() && it.key->result.outcome == KeyBegin::started)
          ++begun;
        for (const auto& r : it.riders) {
          std::lock_guard lk(r->mu);
          begun += r->result.status.ok() && r->result.outcome == KeyBegin::started;
        }
      }
      if (begun > 0) {
        std::lock_guard lk(mu_);
        unsettled_ += begun;
      }
    }
    std::size_t kept = 0;
    const WakeBatch wakes;  // the completions' wake-ups of the I/O threads, sent together at the end
    for (auto& it : batch) {
      for (auto& r : it.riders) {  // issue 30: before the advance's completion runs
        bool release = false;
        {
          std::lock_guard lk(r->mu);
          if (!s.ok()) r->result = KeyBeginResult{s, KeyBegin::started, {}};
          r->committed = true;
          release = r->abandoned && s.ok() && r->result.outcome == KeyBegin::started;
        }
        if (release) key_release(r->rec.resource, r->rec.scope, r->rec.key, nullptr);
      }
      if (it.kind == Item::kKeyBegin) {  // issue 30
        KeyItem& k = *it.key;
        if (!s.ok()) k.result = KeyBeginResult{s, KeyBegin::started, {}};
        try {
          if (k.done) k.done(std::move(k.result));
        } catch (...) {
        }
        continue;
      }
      if (!it.done) {
        // Fire-and-forget rows (observe mode's would-be rejections: their writes went through)
        // have nobody to tell; they stay queued for the next batch instead of being lost, up to a
        // bound, so a store that stays broken cannot take all memory.
        if (!s.ok() && it.kind == Item::kAudit) {
          if (retry_.size() < kMaxRetryRows) {
            retry_.push_back(std::move(it));
            ++kept;
          } else {
            dropped_rows_.fetch_add(1, std::memory_order_relaxed);
          }
        }
        continue;
      }
      try {
        it.done(s);
      } catch (...) {
        // A throwing completion must not kill the store thread.
      }
    }
    pending_.fetch_sub(batch.size() - kept, std::memory_order_relaxed);  // kept rows are still waiting
    batch.clear();
  }

  struct Retention {
    std::int64_t max_age_ms = 0;
    std::uint64_t max_rows = 0;
  };

  // Deletes at most one chunk (kPruneChunkRows) of audit rows that retention no longer keeps, in
  // one autocommit statement. Returns true iff more may remain. Errors are retried next time.
  bool prune_chunk(const Retention& r) {
    const YieldingSteps yielding(wdb_, kPruneYieldSteps);  // issue 29: a chunk shares the core
    if (r.max_age_ms > 0) {
      sqlite3_bind_int64(prune_age_, 1, now_ms() - r.max_age_ms);
      sqlite3_bind_int(prune_age_, 2, kPruneChunkRows);
      std::string err;
      bool ok = step(prune_age_, &err);
      sqlite3_clear_bindings(prune_age_);
      if (!ok) {
        audit_rows_ = -1;
        return false;
      }
      const auto n = sqlite3_changes64(wdb_);
      if (audit_rows_ >= 0) audit_rows_ -= n;
      if (n >= kPruneChunkRows) return true;
    }
    if (r.max_rows > 0) {
      if (audit_rows_ < 0 && !count_rows()) return false;
      const auto keep = static_cast<std::int64_t>(std::min<std::uint64_t>(r.max_rows, INT64_MAX));
      const std::int64_t excess = audit_rows_ - keep;
      if (excess <= 0) return false;
      const std::int64_t chunk = std::min<std::int64_t>(excess, kPruneChunkRows);
      sqlite3_bind_int64(prune_oldest_, 1, chunk);
      std::string err;
      bool ok = step(prune_oldest_, &err);
      sqlite3_clear_bindings(prune_oldest_);
      if (!ok) {
        audit_rows_ = -1;
        return false;
      }
      audit_rows_ -= sqlite3_changes64(wdb_);
      return excess > chunk;
    }
    return false;
  }

  // Counts the audit rows (once, or after a failure left the count uncertain). Returns true iff ok.
  bool count_rows() {
    int rc = sqlite3_step(count_audit_);
    if (rc == SQLITE_ROW) audit_rows_ = sqlite3_column_int64(count_audit_, 0);
    sqlite3_reset(count_audit_);
    return rc == SQLITE_ROW;
  }

  // Runs `st` to completion. Returns false on error (message in *err).
  bool step(sqlite3_stmt* st, std::string* err) {
    int rc = sqlite3_step(st);
    bool ok = rc == SQLITE_DONE || rc == SQLITE_ROW;
    if (!ok) *err = sqlite3_errmsg(wdb_);
    sqlite3_reset(st);
    return ok;
  }

  // One transaction for the whole batch.
  Status commit(std::vector<Item>& batch) {
    if (Status f = check_files(); !f.ok()) return f;
    std::string err;
    if (!step(begin_, &err)) return Status::Error("store commit failed on " + path_ + ": " + err);
    const std::int64_t now = now_ms();
    bool ok = true;
    for (auto& it : batch) {
      if (it.key) {  // issue 30
        ok = commit_key(it, now, &err);
        if (!ok) break;
        continue;
      }
      sqlite3_stmt* st;
      if (it.kind == Item::kAdvance) {
        st = upsert_;
        bind_text(st, 1, it.resource);
        sqlite3_bind_int64(st, 2, it.generation);
        sqlite3_bind_int64(st, 3, now);
        bind_text(st, 4, it.leader);
      } else if (it.kind == Item::kRemove) {
        st = delete_resource_;
        bind_text(st, 1, it.resource);
      } else {
        st = insert_audit_;
        const AuditRow& r = it.row;
        sqlite3_bind_int64(st, 1, r.time_ms);
        bind_text(st, 2, r.resource);
        bind_text(st, 3, r.decision);
        sqlite3_bind_int64(st, 4, r.presented_generation);
        sqlite3_bind_int64(st, 5, r.current_generation);
        bind_text(st, 6, r.method);
        bind_text(st, 7, r.target);
        bind_text(st, 8, r.client);
        bind_text(st, 9, r.leader);
        bind_text(st, 10, r.mode);
        bind_text(st, 11, r.user_agent);
        bind_text(st, 12, r.traceparent);
        bind_text(st, 13, r.client_identity);
        bind_text(st, 14, r.member);  // fleet (issue 33)
      }
      ok = step(st, &err);
      sqlite3_clear_bindings(st);
      if (!ok) break;
      for (auto& r : it.riders) {  // issue 30: keys begun with this advance, in its transaction
        ok = keys_.begin(r->rec, r->max_keys, r->result, now, &err);
        if (!ok) break;
      }
      if (!ok) break;
    }
    if (ok && inject_failure_.load()) {
      ok = false;
      err = "disk I/O error (injected commit failure)";
    }
    if (ok) ok = step(commit_, &err);
    if (ok) return Status::OK();
    // A failed COMMIT may leave the transaction open; roll back so the next batch starts clean.
    if (!sqlite3_get_autocommit(wdb_)) {
      std::string ignored;
      step(rollback_, &ignored);
    }
    return Status::Error("store commit failed on " + path_ + ": " + err);
  }

  // Whether the database and its write-ahead log are still the files at their paths. Deleted or
  // replaced while open (a cleanup script, an operator), commits would go on into files a
  // restart never reads: the fence would start from 0. On the first sign, what the connection
  // still sees is put back where a restart reads it (a complete copy of a deleted database, or
  // a checkpoint of a deleted log into the database), and no further commit is made until a
  // restart: fenced writes that need one fail closed. Store thread only.
  Status check_files() {
    if (files_lost_) return Status::Error(lost_why_);
    FileId a, b, w;
    const bool db_ok = file_id(db_lock_fd_, "", &a) && a.nlink > 0 && file_id(-1, path_, &b) && a == b;
    const std::string wal = path_ + "-wal";
    bool wal_ok = true;
    if (file_id(-1, wal, &w)) {
      if (!wal_known_) {
        wal_known_ = true;
        wal_id_ = w;
      }
      wal_ok = w == wal_id_;
    } else {
      wal_ok = !wal_known_;
    }
    if (db_ok && wal_ok) return Status::OK();
    files_lost_ = true;
    std::string rescue;
    if (!db_ok) {
      struct stat now {};
      if (::stat(path_.c_str(), &now) != 0 && errno == ENOENT) {
        std::string quoted;
        for (char c : path_) quoted += c == '\'' ? std::string("''") : std::string(1, c);
        const std::string e = exec(wdb_, ("VACUUM INTO '" + quoted + "'").c_str());
        rescue = e.empty() ? "a complete copy of it was written back to " + path_
                           : "writing a copy back to " + path_ + " failed (" + e + ")";
      } else {
        rescue = "another file is at " + path_ + " now and was left alone";
      }
    } else {
      const std::string e = exec(wdb_, "PRAGMA wal_checkpoint(TRUNCATE)");
      rescue =
          e.empty() ? "its commits were checkpointed into " + path_ : "checkpointing its commits failed (" + e + ")";
    }
    lost_why_ = (db_ok ? "write-ahead log " + wal : "database file " + path_) +
                " was deleted or replaced while fencegate had it open; " + rescue +
                "; no further commits until fencegate is restarted";
    return Status::Error(lost_why_);
  }

  // Idle: checks the files, and after a failed commit tries a write that changes nothing, so
  // that health (readiness) follows the store without waiting for a fenced write to commit.
  void health_tick() {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_health_ < kHealthInterval) return;
    last_health_ = now;
    Status s = check_files();
    if (s.ok() && failing_) {
      std::string e = write_probe(wdb_);
      if (e.empty()) e = room_probe(wdb_, kRoomProbePages);  // room for an advance, not only one page
      if (!e.empty()) s = Status::Error("store commit failed on " + path_ + ": " + e);
    }
    if (s.ok() && !failing_) return;  // healthy and known to be
    failing_ = !s.ok();
    std::shared_ptr<const CommitObserver> obs;
    {
      std::lock_guard lk(observer_mu_);
      obs = observer_;
    }
    if (obs) {
      try {
        (*obs)(0.0, 0, s);  // no rows: a check, not a commit
      } catch (...) {
      }
    }
  }

  static constexpr std::chrono::milliseconds kHealthInterval{1000};
  static constexpr int kRoomProbePages = 16;  // WAL frames a batch of new resources may need
  bool failing_ = false;     // the last commit or check failed (store thread only)
  bool files_lost_ = false;  // check_files() found them gone: no more commits (store thread only)
  std::string lost_why_;
  bool wal_known_ = false;
  FileId wal_id_;
  std::chrono::steady_clock::time_point last_health_{};

  // Fire-and-forget audit rows whose batch failed, for the next one (store thread only).
  static constexpr std::size_t kMaxRetryRows = 10000;
  static constexpr std::chrono::milliseconds kRetryInterval{500};
  std::vector<Item> retry_;
  std::atomic<std::uint64_t> dropped_rows_{0};

  // Constant after construction
  const std::string path_;
  const int lock_fd_;
  const int db_lock_fd_;
  sqlite3* const wdb_;  // used only by the store thread after start()
  sqlite3_stmt* begin_ = nullptr;
  sqlite3_stmt* commit_ = nullptr;
  sqlite3_stmt* rollback_ = nullptr;
  sqlite3_stmt* upsert_ = nullptr;
  sqlite3_stmt* insert_audit_ = nullptr;
  sqlite3_stmt* prune_age_ = nullptr;
  sqlite3_stmt* prune_oldest_ = nullptr;
  sqlite3_stmt* count_audit_ = nullptr;
  sqlite3_stmt* delete_resource_ = nullptr;
  // Issue 30: idempotency keys
  ReplayCache cache_;  // completed keys, for replays (key_cached)
  KeyTable keys_{wdb_, cache_};  // the idempotency table's writes (store thread), its counts (any thread)
  std::thread thread_;

  // Used only by the store thread: rows in the audit table, -1 = unknown (counted on demand).
  std::int64_t audit_rows_ = -1;

  // Guarded by read_mu_
  std::mutex read_mu_;
  std::unique_ptr<Reader> reader_;

  // Guarded by mu_
  std::mutex mu_;
  std::condition_variable cv_;
  // Issue 30: group commit under load (kGatherMax). Guarded by mu_.
  std::size_t eager_ = 0;          // queued items that are not lazy (kLazyWithin)
  std::size_t gather_wanted_ = 0;  // > 0: the store thread gathers until eager_ reaches it
  bool busy_ = false;              // the last batch ended with eager items queued behind it
  std::size_t expected_ = 0;       // the most writers seen waiting or in flight lately (decays)
  int in_flight_left_out_ = 0;     // gathers still to come that leave the keys in flight out
  std::size_t unsettled_ = 0;      // keys begun and not yet settled or released: in flight upstream
  std::vector<Item> queue_;
  bool stopping_ = false;
  std::int64_t max_age_ms_ = 0;  // retention; 0 = no limit
  std::uint64_t max_rows_ = 0;
  bool retention_changed_ = false;

  // Guarded by observer_mu_
  std::mutex observer_mu_;
  std::shared_ptr<const CommitObserver> observer_;

  std::atomic<std::size_t> pending_{0};
  std::atomic<std::uint64_t> commits_{0};
  std::atomic<bool> inject_failure_{false};
};

}  // namespace

std::unique_ptr<Store> Store::open(const std::string& given, std::string* error) {
  std::string ignored;
  if (!error) error = &ignored;
  std::string path;
  if (auto e = owned_name(given, &path); !e.empty()) {
    *error = e;
    return nullptr;
  }
  // Another local user must not be able to read, replace or plant files beside the database
  // (docs/security.md). `fencegate serve` checks this in its configuration too (exit 2); this is
  // the store's own guard for every other caller.
  {
    std::string real;
    if (auto e = files::check_db_location(given, &real); !e.empty()) {
      *error = e;
      return nullptr;
    }
  }
  // A log without its database holds commits of a database that is gone (deleted while running,
  // or a bad restore): SQLite would discard it and start an empty fence, generation 0 everywhere.
  {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 && errno == ENOENT && ::stat((path + "-wal").c_str(), &st) == 0) {
      *error = "database " + path + " does not exist but its write-ahead log " + path +
               "-wal does: it holds commits of a database that is gone. Restore the database (see docs/operations.md, "
               "Backups and a damaged database), or remove the -wal file deliberately to start an empty fence";
      return nullptr;
    }
  }
  int db_fd = -1;
  int fd = take_lock(path, error, &db_fd);
  if (fd < 0) return nullptr;
  auto unlock = [&] {
    ::close(db_fd);
    ::close(fd);
  };
  sqlite3* wdb = open_db(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, error);
  if (!wdb) {
    unlock();
    return nullptr;
  }
  if (auto e = prepare_writer(wdb, path); !e.empty()) {
    *error = e;
    sqlite3_close_v2(wdb);
    unlock();
    return nullptr;
  }
  // One real commit before serving: a database whose log or shared-memory file cannot be written
  // (permissions, a full disk) would otherwise report ready and fail every commit.
  if (auto e = write_probe(wdb); !e.empty()) {
    *error = "cannot commit to database " + path + ": " + e;
    sqlite3_close_v2(wdb);
    unlock();
    return nullptr;
  }
  sqlite3* rdb = open_db(path, SQLITE_OPEN_READONLY, error);
  if (!rdb) {
    sqlite3_close_v2(wdb);
    unlock();
    return nullptr;
  }
  // From here the store owns both fds and both connections.
  auto store = std::make_unique<OwnedStore>(path, fd, db_fd, wdb, rdb);
  if (auto e = store->start(); !e.empty()) {
    *error = e;
    return nullptr;
  }
  return store;
}

std::unique_ptr<TestableStore> open_testable(const std::string& path, std::string* error) {
  // Store::open's store is always an OwnedStore.
  return std::unique_ptr<TestableStore>(static_cast<OwnedStore*>(Store::open(path, error).release()));
}

}  // namespace fencegate::store
