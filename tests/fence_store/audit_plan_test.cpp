// Issue 29 (flat as the work grows): the two audit queries an operator runs on a large log -- the
// newest rows of one resource, and the unfenced-callers report over a recent window -- must be
// answered from an index, not by scanning the audit table (10 million rows: bench/run.sh --parts
// scale). Checked with EXPLAIN QUERY PLAN on the very SQL the store prepares (reader.h), on a
// database the store created, and on an older database the store migrates.
#include <sqlite3.h>

#include "fence_store/reader.h"
#include "tests/support/store_fixture.h"
#include <doctest/doctest.h>

#include <string>

using namespace fencegate::store;

namespace {

// The plan's detail lines, one per line ("SEARCH audit USING INDEX ... (resource=?)").
std::string plan_of(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  const std::string explain = "EXPLAIN QUERY PLAN " + sql;
  INFO(sql);
  REQUIRE(sqlite3_prepare_v2(db, explain.c_str(), -1, &st, nullptr) == SQLITE_OK);
  std::string out;
  while (sqlite3_step(st) == SQLITE_ROW) out += detail::col_text(st, 3) + "\n";
  sqlite3_finalize(st);
  sqlite3_close_v2(db);
  return out;
}

bool has_index(const std::string& path, const char* name) {
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) == SQLITE_OK);
  std::int64_t n = 0;
  std::string msg;
  const std::string sql =
      std::string("SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND name = '") + name + "'";
  CHECK(detail::query_int(db, sql.c_str(), &n, &msg));
  sqlite3_close_v2(db);
  return n == 1;
}

void check_plans(const std::string& path) {
  // GET /v1/audit?resource=R&limit=100: the newest rows of one resource.
  const std::string newest = plan_of(path, detail::audit_query_sql(detail::kResource, true, true));
  INFO(newest);
  CHECK(newest.find("audit_resource_id (resource=?)") != std::string::npos);
  CHECK(newest.find("SCAN") == std::string::npos);
  CHECK(newest.find("TEMP B-TREE") == std::string::npos);  // read in id order, stops after the limit

  // GET /v1/audit/unfenced?since=-1h: only the window's unfenced rows are visited.
  const std::string unfenced = plan_of(path, detail::unfenced_query_sql(detail::kUnfencedSince));
  INFO(unfenced);
  CHECK(unfenced.find("audit_decision_time (decision=? AND time_ms>?)") != std::string::npos);
  CHECK(unfenced.find("SCAN audit") == std::string::npos);
}

}  // namespace

TEST_CASE("audit at scale: the newest rows of a resource and the unfenced report of a window use an index") {
  fencegate::testing::StoreDir t("fg-audit-plan");
  { auto s = fencegate::testing::must_open(t.db()); }
  CHECK(has_index(t.db(), "audit_decision_time"));
  check_plans(t.db());
}

TEST_CASE("audit at scale: a database from before the window index gets it when opened for writing") {
  fencegate::testing::StoreDir t("fg-audit-plan");
  { auto s = fencegate::testing::must_open(t.db()); }
  {
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open_v2(t.db().c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) == SQLITE_OK);
    CHECK(detail::exec(db, "DROP INDEX audit_decision_time").empty());
    sqlite3_close_v2(db);
  }
  REQUIRE_FALSE(has_index(t.db(), "audit_decision_time"));
  // Without it the report walks every unfenced row ever kept (decision=? only).
  CHECK(plan_of(t.db(), detail::unfenced_query_sql(detail::kUnfencedSince)).find("time_ms>?") == std::string::npos);
  { auto s = fencegate::testing::must_open(t.db()); }
  CHECK(has_index(t.db(), "audit_decision_time"));
  check_plans(t.db());
}
