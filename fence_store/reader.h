// Internal to fence_store/: the store's read side. One read connection with its prepared
// statements (Reader), and the SQL of the audit, unfenced-callers and idempotency-key queries
// it prepares. Used by store.cpp's owning and read-only stores; nothing outside fence_store/
// includes it.
#pragma once

#include <sqlite3.h>

#include <array>
#include <string>
#include <vector>

#include "fence_store/database.h"
#include "fence_store/store.h"

namespace fencegate::store::detail {

// ---- Audit queries: one prepared statement per combination of filters, prepared on first use. ----

constexpr unsigned kResource = 1, kDecision = 2, kLeader = 4, kSince = 8, kUntil = 16, kBefore = 32, kAfter = 64;
constexpr unsigned kFilterCount = 128;  // every combination of the filters above

// `traceparent`: whether the audit table has that column (a database no newer fencegate has
// written to yet does not: its rows read as "").
// The same for `client_identity` (TLS, issue 27) and `member` (fleet, issue 33).
inline std::string audit_query_sql(unsigned mask, bool traceparent, bool client_identity, bool member = false) {
  std::string sql =
      "SELECT id, time_ms, resource, decision, presented_generation, current_generation, method, target,"
      " client, leader, mode, user_agent, " +
      std::string(traceparent ? "traceparent" : "''") + ", " + (client_identity ? "client_identity" : "''") + ", " +
      (member ? "member" : "''") + " FROM audit WHERE 1";
  if (mask & kResource) sql += " AND resource = :resource";
  if (mask & kDecision) sql += " AND decision = :decision";
  if (mask & kLeader) sql += " AND leader = :leader";
  if (mask & kSince) sql += " AND time_ms >= :since";
  if (mask & kUntil) sql += " AND time_ms < :until";
  if (mask & kBefore) sql += " AND id < :before";
  if (mask & kAfter) sql += " AND id > :after";
  sql += (mask & kAfter) ? " ORDER BY id ASC LIMIT :limit" : " ORDER BY id DESC LIMIT :limit";
  return sql;
}

// Unfenced callers: with/without the resource and since filters (2 x 2 statements).
constexpr unsigned kUnfencedResource = 1, kUnfencedSince = 2;
constexpr unsigned kUnfencedCount = 4;

inline std::string unfenced_query_sql(unsigned mask) {
  std::string sql =
      "SELECT resource, client, user_agent, leader, count(*), min(time_ms), max(time_ms) FROM audit"
      " WHERE decision IN ('rejected_missing', 'rejected_malformed', 'would_reject_missing',"
      " 'would_reject_malformed')";
  if (mask & kUnfencedResource) sql += " AND resource = :resource";
  if (mask & kUnfencedSince) sql += " AND time_ms >= :since";
  sql +=
      " GROUP BY resource, client, user_agent, leader"
      " ORDER BY max(time_ms) DESC, resource, client, user_agent, leader LIMIT :limit";
  return sql;
}

// A page is at most 1000 rows; a caller asks for one more to learn whether another page exists.
inline int clamp_limit(int limit) { return limit < 1 ? 1 : (limit > 1001 ? 1001 : limit); }

// Issue 30: an idempotency row's columns, in the order read_key_row reads them.
#define KEY_COLUMNS                                                                                           \
  "resource, scope, key, state, fingerprint, generation, status, headers, body_kept, created_ms, expires_ms," \
  " length(body)"

inline void read_key_row(sqlite3_stmt* st, KeyRecord* r) {
  r->resource = col_text(st, 0);
  r->scope = col_text(st, 1);
  r->key = col_text(st, 2);
  const int state = sqlite3_column_int(st, 3);
  r->state = state == 1 ? KeyState::completed : state == 2 ? KeyState::unknown : KeyState::in_flight;
  r->fingerprint = col_text(st, 4);
  r->generation = sqlite3_column_int64(st, 5);
  r->status = sqlite3_column_int(st, 6);
  r->headers = col_text(st, 7);
  r->body_kept = sqlite3_column_int(st, 8) != 0;
  r->created_ms = sqlite3_column_int64(st, 9);
  r->expires_ms = sqlite3_column_int64(st, 10);
}

// One read connection and its prepared statements. Guarded by the owner's mutex.
class Reader {
 public:
  explicit Reader(sqlite3* db) : db_(db) {}
  ~Reader() {
    sqlite3_finalize(load_all_);
    for (auto* st : audit_) sqlite3_finalize(st);
    for (auto* st : unfenced_) sqlite3_finalize(st);
    for (auto* st : {key_get_, key_list_any_, key_list_one_}) sqlite3_finalize(st);
    sqlite3_close_v2(db_);
  }
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  std::vector<ResourceState> load_all(Status* status) {
    std::vector<ResourceState> out;
    if (!load_all_ && !prepare("SELECT resource, generation, advanced_at_ms, advanced_by FROM resources"
                               " ORDER BY resource",
                               &load_all_, status))
      return out;
    return rows<ResourceState>(load_all_, status, [&] {
      ResourceState s;
      s.resource = col_text(load_all_, 0);
      s.generation = sqlite3_column_int64(load_all_, 1);
      s.advanced_at_ms = sqlite3_column_int64(load_all_, 2);
      s.advanced_by = col_text(load_all_, 3);
      return s;
    });
  }

  std::vector<AuditRecord> query_audit(const AuditQuery& q, Status* status) {
    std::vector<AuditRecord> out;
    unsigned mask = (q.resource.empty() ? 0u : kResource) | (q.decision.empty() ? 0u : kDecision) |
                    (q.leader.empty() ? 0u : kLeader) | (q.since_ms == 0 ? 0u : kSince) |
                    (q.until_ms == 0 ? 0u : kUntil) | (q.before_id == 0 ? 0u : kBefore) |
                    (q.after_id > 0 ? kAfter : 0u);
    sqlite3_stmt*& st = audit_[mask];
    if (!st && !prepare(audit_query_sql(mask, has_column(db_, "audit", "traceparent"),
                                        has_column(db_, "audit", "client_identity"), has_column(db_, "audit", "member"))
                            .c_str(),
                        &st, status))
      return out;
    auto idx = [&](const char* name) { return sqlite3_bind_parameter_index(st, name); };
    if (mask & kResource) bind_text(st, idx(":resource"), q.resource);
    if (mask & kDecision) bind_text(st, idx(":decision"), q.decision);
    if (mask & kLeader) bind_text(st, idx(":leader"), q.leader);
    if (mask & kSince) sqlite3_bind_int64(st, idx(":since"), q.since_ms);
    if (mask & kUntil) sqlite3_bind_int64(st, idx(":until"), q.until_ms);
    if (mask & kBefore) sqlite3_bind_int64(st, idx(":before"), q.before_id);
    if (mask & kAfter) sqlite3_bind_int64(st, idx(":after"), q.after_id);
    const int limit = clamp_limit(q.limit);
    sqlite3_bind_int(st, idx(":limit"), limit);
    return rows<AuditRecord>(st, status, [&] {
      AuditRecord r;
      r.id = sqlite3_column_int64(st, 0);
      r.row.time_ms = sqlite3_column_int64(st, 1);
      r.row.resource = col_text(st, 2);
      r.row.decision = col_text(st, 3);
      r.row.presented_generation = sqlite3_column_int64(st, 4);
      r.row.current_generation = sqlite3_column_int64(st, 5);
      r.row.method = col_text(st, 6);
      r.row.target = col_text(st, 7);
      r.row.client = col_text(st, 8);
      r.row.leader = col_text(st, 9);
      r.row.mode = col_text(st, 10);
      r.row.user_agent = col_text(st, 11);
      r.row.traceparent = col_text(st, 12);
      r.row.client_identity = col_text(st, 13);
      r.row.member = col_text(st, 14);  // fleet (issue 33)
      return r;
    });
  }

  std::vector<UnfencedGroup> query_unfenced(const std::string& resource, std::int64_t since_ms, int limit,
                                            Status* status) {
    std::vector<UnfencedGroup> out;
    unsigned mask = (resource.empty() ? 0u : kUnfencedResource) | (since_ms == 0 ? 0u : kUnfencedSince);
    sqlite3_stmt*& st = unfenced_[mask];
    if (!st && !prepare(unfenced_query_sql(mask).c_str(), &st, status)) return out;
    auto idx = [&](const char* name) { return sqlite3_bind_parameter_index(st, name); };
    if (mask & kUnfencedResource) bind_text(st, idx(":resource"), resource);
    if (mask & kUnfencedSince) sqlite3_bind_int64(st, idx(":since"), since_ms);
    sqlite3_bind_int(st, idx(":limit"), clamp_limit(limit));
    return rows<UnfencedGroup>(st, status, [&] {
      UnfencedGroup g;
      g.resource = col_text(st, 0);
      g.client = col_text(st, 1);
      g.user_agent = col_text(st, 2);
      g.leader = col_text(st, 3);
      g.count = sqlite3_column_int64(st, 4);
      g.first_ms = sqlite3_column_int64(st, 5);
      g.last_ms = sqlite3_column_int64(st, 6);
      return g;
    });
  }

  // Issue 30: idempotency keys.
  bool key_get(const std::string& resource, const std::string& scope, const std::string& key, KeyRecord* out,
               Status* status) {
    if (!key_get_ &&
        !prepare("SELECT " KEY_COLUMNS ", body FROM idempotency WHERE resource = ?1 AND scope = ?2 AND key = ?3",
                 &key_get_, status))
      return false;
    bind_text(key_get_, 1, resource);
    bind_text(key_get_, 2, scope);
    bind_text(key_get_, 3, key);
    int rc = sqlite3_step(key_get_);
    const bool found = rc == SQLITE_ROW;
    if (found) {
      read_key_row(key_get_, out);
      out->body.assign(static_cast<const char*>(sqlite3_column_blob(key_get_, 12)),
                       static_cast<std::size_t>(sqlite3_column_bytes(key_get_, 12)));
      rc = SQLITE_DONE;
    }
    finish(key_get_, rc, status);
    return found;
  }

  std::vector<KeyRecord> key_list(const std::string& resource, const std::string& after_resource,
                                  const std::string& after_key, int limit, Status* status) {
    std::vector<KeyRecord> out;
    sqlite3_stmt*& st = resource.empty() ? key_list_any_ : key_list_one_;
    const char* sql = resource.empty() ? "SELECT " KEY_COLUMNS
                                         " FROM idempotency WHERE (resource, key) > (?2, ?3)"
                                         " ORDER BY resource, key LIMIT ?4"
                                       : "SELECT " KEY_COLUMNS
                                         " FROM idempotency WHERE resource = ?1 AND key > ?3"
                                         " ORDER BY resource, key LIMIT ?4";
    if (!st && !prepare(sql, &st, status)) return out;
    if (!resource.empty()) bind_text(st, 1, resource);
    bind_text(st, 2, after_resource);
    bind_text(st, 3, after_key);
    sqlite3_bind_int(st, 4, clamp_limit(limit));
    return rows<KeyRecord>(st, status, [&] {
      KeyRecord r;
      read_key_row(st, &r);
      return r;
    });
  }

 private:
  // Steps `st` to its end, each row made into a T by `read` (which reads the current row of
  // `st`); *status says how the query ended.
  template <class T, class Read>
  std::vector<T> rows(sqlite3_stmt* st, Status* status, Read read) {
    std::vector<T> out;
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) out.push_back(read());
    finish(st, rc, status);
    return out;
  }

  bool prepare(const char* sql, sqlite3_stmt** st, Status* status) {
    if (sqlite3_prepare_v3(db_, sql, -1, SQLITE_PREPARE_PERSISTENT, st, nullptr) == SQLITE_OK) return true;
    *st = nullptr;
    if (status) *status = Status::Error(std::string("audit/resources query failed: ") + sqlite3_errmsg(db_));
    return false;
  }
  void finish(sqlite3_stmt* st, int rc, Status* status) {
    if (status)
      *status = rc == SQLITE_DONE ? Status::OK() : Status::Error(std::string("query failed: ") + sqlite3_errmsg(db_));
    sqlite3_reset(st);
    sqlite3_clear_bindings(st);
  }

  sqlite3* const db_;
  sqlite3_stmt* load_all_ = nullptr;
  std::array<sqlite3_stmt*, kFilterCount> audit_{};
  std::array<sqlite3_stmt*, kUnfencedCount> unfenced_{};
  sqlite3_stmt* key_get_ = nullptr;
  sqlite3_stmt* key_list_any_ = nullptr;
  sqlite3_stmt* key_list_one_ = nullptr;
};

}  // namespace fencegate::store::detail
