// fence_store: the durable half of the fence. The only code that touches SQLite.
//
// One Store owns one database file: generations per resource and the audit log of decisions.
// SQLite runs in WAL mode with synchronous=FULL, so a commit is fsynced before it is reported.
// Ownership is exclusive: open() takes an flock on "<db>.lock"; a second owner fails fast while
// read-only readers (sqlite3 CLI, `fencegate audit`) can still read the database.
//
// All writes run on the store's own thread. advance() and append_audit() only enqueue; the store
// thread drains everything queued into one transaction and commits once (group commit: a flood of
// rows costs one fsync per batch), then calls every completion, on the store thread. Under load
// (a commit ended with writes queued behind it) it waits at most 1 ms for the writers it expects
// before the next commit; a key's settle or release without a completion rides the next commit
// or is committed within 5 ms (issue 30, docs/idempotency.md). Completions
// must be quick and must not call back into the Store synchronously with blocking waits; post the
// result to your own executor. A failed batch fails every completion; its fire-and-forget audit
// rows are kept and written with a later batch (retried every 500 ms while idle).
//
// Thread-safety: every public method is thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace fencegate::store {

// The store's outcome: fencegate::Status (common/status.h). A failure is Status::Error(msg) with
// SQLite's reason, or the store's refusal (read-only, shutting down) in the message.
using Status = fencegate::Status;

struct ResourceState {
  std::string resource;
  std::int64_t generation = 0;       // 0: never advanced
  std::int64_t advanced_at_ms = 0;   // unix epoch milliseconds
  std::string advanced_by;           // leader identity that advanced it ("" if none given)
};

struct AuditRow {
  std::int64_t time_ms = 0;               // unix epoch milliseconds; 0 -> filled with now
  std::string resource;
  std::string decision;                   // rejected_stale, would_reject_missing, ...
  std::int64_t presented_generation = 0;  // 0: none / malformed
  std::int64_t current_generation = 0;    // stored generation at decision time
  std::string method;
  std::string target;
  std::string client;                     // client IP address (the proxy records no port)
  std::string leader;                     // Fencing-Leader header ("" if absent)
  std::string mode;                       // enforce | observe
  std::string user_agent;
  std::string traceparent;                // W3C trace context of the request ("" if none or invalid)
  std::string client_identity;            // TLS (issue 27): the verified client certificate's identity ("" none)
  std::string member;                     // fleet (issue 33): the replica's fleet member id ("" not in a fleet)
};

// Every decision an audit row can record (what the proxy writes; queries filter on these).
inline constexpr std::array<std::string_view, 18> kAuditDecisions = {
    "rejected_stale", "rejected_missing", "rejected_malformed", "would_reject_stale", "would_reject_missing",
    "would_reject_malformed",
    // authority-linked fencing (a route with an "authority")
    "rejected_not_leader", "rejected_unknown_generation", "would_reject_not_leader", "would_reject_unknown_generation",
    // a route with "new_resources": "fenced_only"; resource_deleted: DELETE /v1/resources/{id}
    "rejected_unfenced_resource", "would_reject_unfenced_resource", "resource_deleted",
    // TLS (issue 27): a route's allowed_clients refused the verified client identity
    "rejected_client_not_allowed",
    // idempotency (issue 30, docs/idempotency.md)
    "rejected_idempotency_mismatch", "rejected_idempotency_in_flight", "rejected_idempotency_unknown", "would_replay"};

struct AuditQuery {
  std::string resource, decision, leader;  // "" = any
  std::int64_t since_ms = 0, until_ms = 0; // 0 = unbounded; since inclusive, until exclusive
  std::int64_t before_id = 0;              // cursor: rows with id < before_id; 0 = newest
  std::int64_t after_id = 0;               // if > 0: rows with id > after_id, OLDEST first (follow)
  int limit = 100;
};

// Callers that still send writes without a valid token (observe-mode migration report):
// audit rows with decision rejected_missing, rejected_malformed, would_reject_missing or
// would_reject_malformed, grouped by (resource, client, user_agent, leader).
struct UnfencedGroup {
  std::string resource, client, user_agent, leader;
  std::int64_t count = 0;
  std::int64_t first_ms = 0, last_ms = 0;
};
struct AuditRecord {
  std::int64_t id = 0;
  AuditRow row;
};

// ---- Idempotency keys (issue 30, docs/idempotency.md) ----
// One row per (resource, scope, key): recorded in flight before the write is forwarded, then
// completed with the response, marked unknown (it reached the upstream, no complete answer came
// back) or released (deleted: it never reached the upstream, or the upstream said it did not act).
enum class KeyState { in_flight = 0, completed = 1, unknown = 2 };
std::string_view to_string(KeyState s);  // "in_flight" | "completed" | "unknown"

struct KeyRecord {
  std::string resource;
  std::string scope;  // "" (scope "resource") or the client identity (scope "client")
  std::string key;    // the operation ID as the client sent it, unescaped
  KeyState state = KeyState::in_flight;
  std::string fingerprint;         // hex SHA-256 of method, target and the body's SHA-256
  std::int64_t generation = 0;     // the generation of the write that recorded it
  int status = 0;                  // completed: the response status
  std::string headers;             // completed: the body-describing fields, "Name: value\r\n" each
  std::string body;                // completed: the body, if kept
  bool body_kept = true;           // false: larger than max_body_bytes, status only
  std::int64_t created_ms = 0, expires_ms = 0;  // unix epoch milliseconds
  std::int64_t row = 0;  // key_settle: the row key_begin recorded (KeyBeginResult::row), 0 if not known
};

enum class KeyBegin { started, exists, limit };
struct KeyBeginResult {
  Status status = Status::OK();  // not OK: nothing recorded (the write must not be forwarded)
  KeyBegin outcome = KeyBegin::started;
  KeyRecord existing;            // outcome exists: the row found
  std::int64_t row = 0;          // outcome started: the row recorded (for KeyRecord::row)
};

// A key to record in flight in the same transaction (one commit, one fsync) as a fence advance
// (Store::advance_keyed): a keyed write that advances the generation pays one commit, not two.
struct KeyRider {
  KeyRecord rec;
  std::uint64_t max_keys = 0;
  std::mutex mu;
  // Guarded by mu.
  bool attached = false;   // handed to the store with an advance (Fence, under the resource's lock)
  bool committed = false;  // the advance's batch ended: `result` is final (store thread)
  bool abandoned = false;  // the write was not admitted: a key the batch started is released
  KeyBeginResult result;
};

class Store {
 public:
  using Done = std::function<void(Status)>;

  // Opens (creating if needed) and migrates the database, takes ownership and starts the store
  // thread. Returns nullptr and sets *error (a sentence for the operator) on failure, e.g.
  // "database ./fence.db is already owned by another fencegate (lock file ./fence.db.lock is held)".
  static std::unique_ptr<Store> open(const std::string& given, std::string* error);

  // Opens read-only, without taking ownership (for audit queries while a sidecar runs).
  // The returned Store supports only the read methods below; writes complete with an error.
  // `snapshot_ok`: a reader that may not create the -shm file may read a database that no
  // writer has open (no -wal) as an immutable snapshot; not for a reader that waits for new
  // rows (a sidecar started later would write them where an immutable reader never looks).
  static std::unique_ptr<Store> open_readonly(const std::string& path, std::string* error, bool snapshot_ok = true);

  virtual ~Store() = default;  // stops the thread after committing what was queued

  // Every resource with its state, as of now (reads the database). A read that fails part way
  // (a corrupt page) sets *status: the rows before it are no picture of the fence.
  virtual std::vector<ResourceState> load_all(Status* status = nullptr) = 0;

  // Durably sets generation(resource) = max(stored, generation) with advanced_at/by updated when it
  // rises; never lowers it. `done` runs on the store thread after the commit (or its failure).
  virtual void advance(std::string resource, std::int64_t generation, std::string leader, Done done) = 0;

  // Issue 30: advance() with keys recorded in flight (as key_begin) in the same transaction.
  // Only on a store whose rides_keys() is true; each rider's result is set (and `committed`)
  // before `done` runs, and a rider already `abandoned` by then has a key it started released.
  // The default advances alone (riders' results stay unset: callers check rides_keys() first).
  virtual bool rides_keys() const { return false; }
  // (Taken by value: OwnedStore moves them into its queue.)
  virtual void advance_keyed(
      std::string resource, std::int64_t generation, std::string leader,
      std::vector<std::shared_ptr<KeyRider>> riders,  // NOLINT(performance-unnecessary-value-param)
      Done done) {
    (void)riders;
    advance(std::move(resource), generation, std::move(leader), std::move(done));
  }
  // Issue 30: a rider's write was not admitted (stale, store error): a key its advance started is
  // released, now or once the advance's batch ends. Safe to call from any thread, once.
  void abandon(const std::shared_ptr<KeyRider>& r) {
    bool release = false;
    {
      std::lock_guard lk(r->mu);
      r->abandoned = true;
      release = r->committed && r->result.status.ok() && r->result.outcome == KeyBegin::started;
    }
    if (release) key_release(r->rec.resource, r->rec.scope, r->rec.key, nullptr);
  }

  // Durably removes a resource's row (its generation): after it the resource is unknown, as if it
  // had never been fenced, and a restart does not bring it back. Queued in order with advance():
  // an advance queued later makes the row anew. `done` runs on the store thread after the commit
  // (or its failure). The default refuses at once (read-only stores, test doubles).
  virtual void remove(std::string resource, Done done) {  // NOLINT(performance-unnecessary-value-param)
    (void)resource;  // (taken by value: OwnedStore moves both into its queue)
    if (done) done(Status::Error("this store cannot remove resources"));
  }

  // Appends an audit row. If `done` is set it runs after the row's batch is durable (or failed);
  // if empty the row is written with the next batch, fire and forget.
  virtual void append_audit(AuditRow row, Done done) = 0;
  // Both write methods refuse at once, running `done` on the caller's thread with an error, on a
  // read-only store or one being destroyed.

  // Reads audit rows, newest first (by id; oldest first when q.after_id > 0). Thread-safe; uses its
  // own read connection.
  virtual std::vector<AuditRecord> query_audit(const AuditQuery& q, Status* status) = 0;

  // Callers still writing without a valid token: audit rows whose decision is rejected_missing,
  // rejected_malformed, would_reject_missing or would_reject_malformed, optionally only for
  // `resource` ("" = any) and with time_ms >= since_ms (0 = any time), grouped by (resource,
  // client, user_agent, leader), most recently seen first. limit is clamped to 1..1001.
  // Thread-safe; uses the read connection (works on read-only stores).
  virtual std::vector<UnfencedGroup> query_unfenced(const std::string& resource, std::int64_t since_ms, int limit,
                                                    Status* status) = 0;

  // Audit retention, enforced in the background by the store thread: after commits (at most a few
  // times a second) and about every second when idle, it deletes rows with time_ms older than
  // now - max_age_ms and rows beyond the newest max_rows (by id). 0 = no limit. Deletes run in
  // chunks of at most kPruneChunkRows rows, one transaction each, and queued writes go first, so an
  // advance waits behind at most one chunk. The row count may exceed max_rows briefly (< 1 s).
  // No-op on a read-only store.
  virtual void set_retention(std::int64_t max_age_ms, std::uint64_t max_rows) = 0;
  static constexpr int kPruneChunkRows = 5000;

  // Called on the store thread after each batch's transaction, before the batch's completions,
  // with the seconds the transaction took (BEGIN to COMMIT, including the fsync), the number of
  // items in the batch and how it ended (OK, or the error with SQLite's reason). Prune
  // transactions are not reported. Also called, with 0 items, by the store's health check: about
  // once a second while idle, when something is wrong (the database or its log was deleted or
  // replaced under it: then no further commits are made until a restart) or when, after a failed
  // commit, a write that changes nothing succeeds again. Must be quick and must not call into the
  // Store. An empty function removes the observer. No-op on a read-only store.
  using CommitObserver = std::function<void(double seconds, std::size_t items, const Status& result)>;
  virtual void set_commit_observer(CommitObserver observer) = 0;

  // Number of items waiting for the store thread (queued or in the batch being committed; an item
  // leaves the count once its completion has run).
  virtual std::size_t queue_depth() const = 0;

  // Fire-and-forget audit rows (append_audit without `done`) given up on: when a batch fails they
  // are kept for the next one, up to 10000; this counts those beyond that bound. Rows still kept
  // when the store closes are tried once more, then count here too if that fails.
  virtual std::uint64_t audit_rows_dropped() const { return 0; }

  // Commits what is queued (the last try of kept rows included) and stops the store thread; later
  // writes fail. The destructor does it too; calling it first lets the caller read
  // audit_rows_dropped() once nothing can change it. Idempotent.
  virtual void drain_and_stop() {}

  // Number of batches (transactions, one fsync each) committed successfully so far. For metrics
  // (fencegate_store_commits_total) and group-commit tests. Read-only stores report 0.
  virtual std::uint64_t commit_count() const { return 0; }

  // ---- Idempotency keys (issue 30). Writes go through the store thread's group commit. ----
  // Records `rec` in flight unless a live (unexpired) row with its (resource, scope, key) exists
  // (outcome exists, with that row; nothing written) or the resource holds max_keys live keys
  // (outcome limit). `done` runs on the store thread once the row is durable (or failed). The
  // default refuses (read-only stores, test doubles).
  using KeyDone = std::function<void(KeyBeginResult)>;
  // NOLINTNEXTLINE(performance-unnecessary-value-param): taken by value, OwnedStore moves it
  virtual void key_begin(KeyRecord rec, std::uint64_t max_keys, KeyDone done) {
    (void)rec;
    (void)max_keys;
    KeyBeginResult r;
    r.status = Status::Error("this store does not keep idempotency keys");
    if (done) done(std::move(r));
  }
  // Sets the row's state to `rec.state` (completed: with status, headers, body) if it is in
  // flight or unknown (a retry forwarded under "on_unknown": "forward"); a completed row stays as
  // it is. `done` may be empty.
  virtual void key_settle(KeyRecord rec, Done done) {  // NOLINT(performance-unnecessary-value-param)
    (void)rec;
    if (done) done(Status::Error("this store does not keep idempotency keys"));
  }
  // A completed, unexpired key from the store's memory (no database read, no store thread): the
  // keys completed or found completed since start, up to a bound. False if not there (it may
  // still be in the database: key_begin finds it). Thread-safe; for replays on the data path.
  virtual bool key_cached(const std::string& resource, const std::string& scope, const std::string& key,
                          KeyRecord* out) {
    (void)resource, (void)scope, (void)key, (void)out;
    return false;
  }
  // Deletes the row (released; or cleared by an operator). `done` may be empty.
  virtual void key_release(std::string resource, std::string scope, std::string key, Done done) {  // NOLINT
    (void)resource, (void)scope, (void)key;
    if (done) done(Status::Error("this store does not keep idempotency keys"));
  }
  // The row, read on the read connection (expired rows not yet removed are reported too, with
  // their expires_ms). found=false if none.
  virtual bool key_get(const std::string& resource, const std::string& scope, const std::string& key, KeyRecord* out,
                       Status* status) {
    (void)resource, (void)scope, (void)key, (void)out;
    if (status) *status = Status::Error("this store does not keep idempotency keys");
    return false;
  }
  // Rows (without bodies) of `resource` ("" = any), by resource and key, after (resource, key)
  // `after_resource`/`after_key` ("" = from the start), at most `limit` (clamped to 1..1001).
  virtual std::vector<KeyRecord> key_list(const std::string& resource, const std::string& after_resource,
                                          const std::string& after_key, int limit, Status* status) {
    (void)resource, (void)after_resource, (void)after_key, (void)limit;
    if (status) *status = Status::Error("this store does not keep idempotency keys");
    return {};
  }
  // Live keys per resource as the store thread counts them (for the fencegate_idempotency_keys
  // gauge); empty on a read-only store.
  virtual std::vector<std::pair<std::string, std::int64_t>> key_counts() const { return {}; }
  // Response bytes (bodies and their describing fields) kept for replay per resource, as the
  // store thread counts them (the fencegate_idempotency_bytes gauge); empty on a read-only store.
  virtual std::vector<std::pair<std::string, std::int64_t>> key_bytes() const { return {}; }
  // Expired keys are deleted in the background by the store thread in chunks of this many rows.
  static constexpr int kKeyPruneChunkRows = 500;

  static constexpr int kSchemaVersion = 1;
};

}  // namespace fencegate::store
