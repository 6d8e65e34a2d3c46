// Internal to fence_store/: the writes of the idempotency key table (issue 30), run by the owning
// store's thread inside its batch transactions, and the per-resource counts of keys and of the
// response bytes kept for replay, published for any thread. The owning store prepares and
// finalizes the seven statements with the rest of its own (see store.cpp's start()).
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "fence_store/database.h"
#include "fence_store/reader.h"
#include "fence_store/replay_cache.h"
#include "fence_store/store.h"

namespace fencegate::store::detail {

class KeyTable {
 public:
  KeyTable(sqlite3* db, ReplayCache& cache) : db_(db), cache_(cache) {}

  // Prepared by the owning store (parameters: see store.cpp's statement list).
  sqlite3_stmt* select = nullptr;
  sqlite3_stmt* insert = nullptr;
  sqlite3_stmt* settle = nullptr;
  sqlite3_stmt* remove = nullptr;
  sqlite3_stmt* prune_expired = nullptr;
  sqlite3_stmt* insert_new = nullptr;  // a key never seen: no lookup first (nothing on a conflict)
  sqlite3_stmt* settle_row = nullptr;  // settle, by the row id begin() recorded

  // Counts the keys per resource again from the table (at start, after a failed batch).
  // Returns "" or SQLite's error. Store thread (or before it starts).
  std::string recount() {
    sqlite3_stmt* st = nullptr;
    if (sqlite3_prepare_v2(db_,
                           "SELECT resource, count(*), coalesce(sum(length(body) + length(headers)), 0)"
                           " FROM idempotency GROUP BY resource",
                           -1, &st, nullptr) != SQLITE_OK)
      return sqlite3_errmsg(db_);
    counts_.clear();
    bytes_.clear();
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
      counts_[col_text(st, 0)] = sqlite3_column_int64(st, 1);
      if (const std::int64_t b = sqlite3_column_int64(st, 2); b > 0) bytes_[col_text(st, 0)] = b;
    }
    sqlite3_finalize(st);
    if (rc != SQLITE_DONE) return sqlite3_errmsg(db_);
    publish();
    return {};
  }

  // Makes the store thread's counts visible to counts() and bytes().
  void publish() {
    std::lock_guard lk(published_mu_);
    published_counts_ = counts_;
    published_bytes_ = bytes_;
  }
  std::vector<std::pair<std::string, std::int64_t>> counts() const {
    std::lock_guard lk(published_mu_);
    return {published_counts_.begin(), published_counts_.end()};
  }
  std::vector<std::pair<std::string, std::int64_t>> bytes() const {
    std::lock_guard lk(published_mu_);
    return {published_bytes_.begin(), published_bytes_.end()};
  }

  // key_begin's work on (rec, max_keys), its outcome in `result`. Returns false on an SQLite error.
  bool begin(const KeyRecord& rec, std::uint64_t max_keys, KeyBeginResult& result, std::int64_t now, std::string* err) {
    // A key never seen (unique keys, the common case) is inserted in one step; a conflict (a
    // known key, live or expired) inserts nothing and goes the way below. At the limit, first
    // the lookup: an expired row is replaced, not refused.
    if (const auto c = counts_.find(rec.resource);
        c == counts_.end() || static_cast<std::uint64_t>(c->second) < max_keys) {
      bind_new(insert_new, rec);
      const bool ok = step(insert_new, err);
      sqlite3_clear_bindings(insert_new);
      if (!ok) return false;
      if (sqlite3_changes64(db_) > 0) {
        ++counts_[rec.resource];
        result.existing = KeyRecord{};
        result.row = sqlite3_last_insert_rowid(db_);
        result.outcome = KeyBegin::started;
        return true;
      }
    }
    bind_key(select, rec);
    int rc = sqlite3_step(select);
    bool live = false, expired_row = false;
    if (rc == SQLITE_ROW) {
      read_key_row(select, &result.existing);
      result.existing.body.assign(static_cast<const char*>(sqlite3_column_blob(select, 12)),
                                  static_cast<std::size_t>(sqlite3_column_bytes(select, 12)));
      live = result.existing.expires_ms > now;
      expired_row = !live;
      rc = SQLITE_DONE;
    }
    if (rc != SQLITE_DONE) *err = sqlite3_errmsg(db_);
    sqlite3_reset(select);
    sqlite3_clear_bindings(select);
    if (rc != SQLITE_DONE) return false;
    if (live) {
      result.outcome = KeyBegin::exists;
      cache_.put(result.existing);  // completed rows only: durable already
      return true;
    }
    if (expired_row)  // replaced below: its kept response goes
      add_bytes(rec.resource, -static_cast<std::int64_t>(result.existing.body.size() + result.existing.headers.size()));
    result.existing = KeyRecord{};
    std::int64_t& n = counts_[rec.resource];
    if (!expired_row && static_cast<std::uint64_t>(n) >= max_keys) {
      result.outcome = KeyBegin::limit;
      return true;
    }
    bind_new(insert, rec);
    const bool ok = step(insert, err);
    sqlite3_clear_bindings(insert);
    if (ok && !expired_row) ++n;
    result.row = ok ? sqlite3_last_insert_rowid(db_) : 0;
    result.outcome = KeyBegin::started;
    return ok;
  }

  // key_settle's work: records the answer of `rec`; *changed says whether a row changed (the
  // caller caches it once the transaction commits). Returns false on an SQLite error.
  bool settle_key(const KeyRecord& rec, bool* changed, std::string* err) {
    sqlite3_stmt* const st = rec.row > 0 ? settle_row : settle;
    bind_key(st, rec);
    sqlite3_bind_int(st, 4, static_cast<int>(rec.state));
    sqlite3_bind_int(st, 5, rec.status);
    bind_text(st, 6, rec.headers);
    sqlite3_bind_blob(st, 7, rec.body.data(), static_cast<int>(rec.body.size()), SQLITE_STATIC);
    sqlite3_bind_int(st, 8, rec.body_kept ? 1 : 0);
    if (rec.row > 0) sqlite3_bind_int64(st, 9, rec.row);
    const bool ok = step(st, err);
    sqlite3_clear_bindings(st);
    *changed = ok && sqlite3_changes64(db_) > 0;
    if (*changed) add_bytes(rec.resource, static_cast<std::int64_t>(rec.body.size() + rec.headers.size()));
    return ok;
  }

  // key_release's work: deletes the row of `rec`. Returns false on an SQLite error.
  bool release(const KeyRecord& rec, std::string* err) {
    cache_.drop(rec.resource, rec.scope, rec.key);
    bind_key(remove, rec);
    // (A DELETE ... RETURNING makes all its changes in its first step.)
    const int rc = sqlite3_step(remove);
    const bool ok = rc == SQLITE_ROW || rc == SQLITE_DONE;
    if (rc == SQLITE_ROW) {
      add_bytes(rec.resource, -sqlite3_column_int64(remove, 0));
      drop_one(rec.resource);
    } else if (!ok) {
      *err = sqlite3_errmsg(db_);
    }
    sqlite3_reset(remove);
    sqlite3_clear_bindings(remove);
    return ok;
  }

  // Deletes at most `chunk` expired keys (autocommit). True iff more may remain.
  bool prune(std::int64_t now, int chunk) {
    sqlite3_bind_int64(prune_expired, 1, now);
    sqlite3_bind_int(prune_expired, 2, chunk);
    int rc, n = 0;
    while ((rc = sqlite3_step(prune_expired)) == SQLITE_ROW) {
      ++n;
      cache_.drop(col_text(prune_expired, 0), col_text(prune_expired, 1), col_text(prune_expired, 2));
      add_bytes(col_text(prune_expired, 0), -sqlite3_column_int64(prune_expired, 3));
      drop_one(col_text(prune_expired, 0));
    }
    sqlite3_reset(prune_expired);
    sqlite3_clear_bindings(prune_expired);
    if (rc != SQLITE_DONE) {
      (void)recount();
      return false;
    }
    if (n > 0) publish();
    return n >= chunk;
  }

 private:
  static void bind_key(sqlite3_stmt* st, const KeyRecord& r) {
    bind_text(st, 1, r.resource);
    bind_text(st, 2, r.scope);
    bind_text(st, 3, r.key);
  }
  static void bind_new(sqlite3_stmt* st, const KeyRecord& r) {  // insert, insert_new
    bind_key(st, r);
    bind_text(st, 4, r.fingerprint);
    sqlite3_bind_int64(st, 5, r.generation);
    sqlite3_bind_int64(st, 6, r.created_ms);
    sqlite3_bind_int64(st, 7, r.expires_ms);
  }
  bool step(sqlite3_stmt* st, std::string* err) {
    const int rc = sqlite3_step(st);
    const bool ok = rc == SQLITE_DONE || rc == SQLITE_ROW;
    if (!ok) *err = sqlite3_errmsg(db_);
    sqlite3_reset(st);
    return ok;
  }
  // Response bytes kept for replay: `delta` more (or fewer) for `resource`.
  void add_bytes(const std::string& resource, std::int64_t delta) {
    if (delta == 0) return;
    auto it = bytes_.try_emplace(resource, 0).first;
    it->second += delta;
    if (it->second <= 0) bytes_.erase(it);
  }
  void drop_one(const std::string& resource) {
    auto c = counts_.find(resource);
    if (c != counts_.end() && --c->second <= 0) counts_.erase(c);
  }

  sqlite3* const db_;
  ReplayCache& cache_;
  std::map<std::string, std::int64_t> counts_;  // store thread only: rows per resource
  std::map<std::string, std::int64_t> bytes_;   // store thread only: response bytes kept per resource
  mutable std::mutex published_mu_;
  std::map<std::string, std::int64_t> published_counts_;  // guarded by published_mu_
  std::map<std::string, std::int64_t> published_bytes_;   // guarded by published_mu_
};

}  // namespace fencegate::store::detail
