// `fencegate audit` end to end: the real binary against a database written through Store::open.
// Filters, table and --json output, RFC 3339 and relative times, exit codes, and --follow seeing a
// row committed by a writer that opened the store after the CLI started (the CLI holds no lock).
#include <doctest/doctest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <csignal>
#include <future>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fence_store/store.h"
#include "tests/support/process.h"

using namespace fencegate::testing;
using namespace std::chrono_literals;
namespace store = fencegate::store;

namespace {

const std::string kBinary = FENCEGATE_BINARY;

// 2025-03-01T10:00:00Z: far from now, so relative --since never reaches these rows.
constexpr std::int64_t kBase = 1740823200000;

std::int64_t wall_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

std::unique_ptr<store::Store> open_store(const std::string& db) {
  std::string err;
  auto s = store::Store::open(db, &err);
  INFO(err);
  REQUIRE(s != nullptr);
  return s;
}

store::AuditRow arow(std::string resource, std::string decision, std::string leader, std::int64_t time_ms,
                     std::string target = "/x") {
  store::AuditRow r;
  r.time_ms = time_ms;
  r.resource = std::move(resource);
  r.decision = std::move(decision);
  r.presented_generation = r.decision == "rejected_stale" ? 3 : 0;
  r.current_generation = 5;
  r.method = "PUT";
  r.target = std::move(target);
  r.client = "10.0.0.7";
  r.leader = std::move(leader);
  r.mode = r.decision.rfind("would_", 0) == 0 ? "observe" : "enforce";
  r.user_agent = "test";
  return r;
}

void append_sync(store::Store& s, store::AuditRow row) {
  std::promise<store::Status> p;
  auto f = p.get_future();
  s.append_audit(std::move(row), [&p](store::Status st) { p.set_value(st); });
  auto st = f.get();
  INFO(st.message());
  REQUIRE(st.ok());
}

// A database with five rows (ids 1..5), closed again before the CLI runs.
void seed(const std::string& db) {
  auto s = open_store(db);
  const std::int64_t now = wall_ms();
  append_sync(*s, arow("orders", "rejected_stale", "L1", kBase, "/orders/1"));                  // id 1
  append_sync(*s, arow("orders", "would_reject_missing", "", kBase + 5 * 60'000, "/orders/2"));  // id 2
  append_sync(*s, arow("users", "rejected_stale", "L2", kBase + 10 * 60'000, "/users/1"));      // id 3
  append_sync(*s, arow("users", "rejected_missing", "", now - 3 * 3'600'000, "/users/old"));    // id 4
  append_sync(*s, arow("orders", "rejected_malformed", "L1", now - 10 * 60'000, "/orders/new"));  // id 5
}

CommandResult audit(std::vector<std::string> args) {
  args.insert(args.begin(), {kBinary, "audit"});
  auto r = run_command(args, 20s);
  REQUIRE_FALSE(r.timed_out);
  return r;
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) out.push_back(l);
  return out;
}

// Top-level keys of a flat JSON object line, in order (values here never contain `":`).
std::vector<std::string> json_keys(const std::string& line) {
  std::vector<std::string> keys;
  static const std::regex key(R"re([{,]"([a-z_]+)":)re");
  for (auto it = std::sregex_iterator(line.begin(), line.end(), key); it != std::sregex_iterator(); ++it)
    keys.push_back((*it)[1]);
  return keys;
}

std::string json_field(const std::string& line, const std::string& k) {
  std::smatch m;
  std::regex re("\"" + k + R"re(":("[^"]*"|-?[0-9]+|null))re");
  if (!std::regex_search(line, m, re)) return "<missing>";
  std::string v = m[1];
  return v.size() >= 2 && v.front() == '"' ? v.substr(1, v.size() - 2) : v;
}

std::vector<std::string> targets(const std::string& json_out) {
  std::vector<std::string> t;
  for (const auto& l : lines(json_out)) t.push_back(json_field(l, "target"));
  return t;
}

template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return pred();
}

}  // namespace

TEST_SUITE("audit_cli") {

TEST_CASE("audit: table by default, newest first, with every column") {
  TempDir t;
  seed(t.file("fence.db"));
  auto r = audit({"--db", t.file("fence.db")});
  INFO(r.err);
  CHECK(r.code() == 0);
  auto ls = lines(r.out);
  REQUIRE(ls.size() == 6);
  CHECK(std::regex_search(ls[0], std::regex(
      "^TIME +RESOURCE +DECISION +PRESENTED +CURRENT +METHOD +TARGET +CLIENT +LEADER +MODE$")));
  CHECK(ls[1].find("/orders/new") != std::string::npos);
  CHECK(ls[5].find("/orders/1") != std::string::npos);
  CHECK(std::regex_search(ls[5], std::regex(
      "^2025-03-01T10:00:00\\.000Z +orders +rejected_stale +3 +5 +PUT +/orders/1 +10\\.0\\.0\\.7 +L1 +enforce$")));
  // Presented 0 and an empty leader show as "-".
  CHECK(std::regex_search(
      ls[4], std::regex("would_reject_missing +- +5 +PUT +/orders/2 +10\\.0\\.0\\.7 +- +observe$")));
  CHECK(r.err.empty());
}

TEST_CASE("audit: --json lines carry exactly the documented keys") {
  TempDir t;
  seed(t.file("fence.db"));
  auto r = audit({"--db", t.file("fence.db"), "--json"});
  INFO(r.err);
  CHECK(r.code() == 0);
  auto ls = lines(r.out);
  REQUIRE(ls.size() == 5);
  const std::vector<std::string> want = {"id",     "time",   "resource", "decision", "presented_generation",
                                         "current_generation", "method", "target", "client", "leader", "mode",
                                         "user_agent", "traceparent", "client_identity", "member"};
  for (const auto& l : ls) {
    INFO(l);
    CHECK(l.front() == '{');
    CHECK(l.back() == '}');
    CHECK(json_keys(l) == want);
  }
  const auto& oldest = ls[4];
  CHECK(json_field(oldest, "id") == "1");
  CHECK(json_field(oldest, "time") == "2025-03-01T10:00:00.000Z");
  CHECK(json_field(oldest, "resource") == "orders");
  CHECK(json_field(oldest, "decision") == "rejected_stale");
  CHECK(json_field(oldest, "presented_generation") == "3");
  CHECK(json_field(oldest, "current_generation") == "5");
  CHECK(json_field(oldest, "method") == "PUT");
  CHECK(json_field(oldest, "target") == "/orders/1");
  CHECK(json_field(oldest, "client") == "10.0.0.7");
  CHECK(json_field(oldest, "leader") == "L1");
  CHECK(json_field(oldest, "mode") == "enforce");
  CHECK(json_field(ls[3], "presented_generation") == "null");  // as GET /v1/audit has it
  CHECK(json_field(oldest, "user_agent") == "test");
  CHECK(json_field(ls[3], "leader") == "");
}

TEST_CASE("audit: filters, times and limit") {
  TempDir t;
  const std::string db = t.file("fence.db");
  seed(db);
  auto q = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), {"--db", db, "--json"});
    auto r = audit(extra);
    INFO(r.err);
    CHECK(r.code() == 0);
    return targets(r.out);
  };
  using V = std::vector<std::string>;
  CHECK(q({"--resource", "users"}) == V{"/users/old", "/users/1"});
  CHECK(q({"--decision", "rejected_stale"}) == V{"/users/1", "/orders/1"});
  CHECK(q({"--leader", "L1"}) == V{"/orders/new", "/orders/1"});
  CHECK(q({"--resource=orders", "--leader=L1", "--decision=rejected_stale"}) == V{"/orders/1"});
  CHECK(q({"--limit", "2"}) == V{"/orders/new", "/users/old"});
  // RFC 3339: since inclusive, until exclusive; offsets and fractions.
  CHECK(q({"--since", "2025-03-01T10:05:00Z", "--until", "2025-03-01T10:10:00Z"}) == V{"/orders/2"});
  CHECK(q({"--since", "2025-03-01T12:05:00+02:00", "--until", "2025-03-01T10:10:00.001Z"}) ==
        V{"/users/1", "/orders/2"});
  CHECK(q({"--since", "2025-03-01T10:00:00.001Z", "--until", "2025-03-01T10:05:00.001Z"}) == V{"/orders/2"});
  // Relative times count back from now.
  CHECK(q({"--since", "-1h"}) == V{"/orders/new"});
  CHECK(q({"--since", "-30m"}) == V{"/orders/new"});
  CHECK(q({"--since", "-4h"}) == V{"/orders/new", "/users/old"});
  CHECK(q({"--since", "-240m", "--until", "-1h"}) == V{"/users/old"});
  CHECK(q({"--since", "-7d", "--resource", "users"}) == V{"/users/old"});
  CHECK(q({"--since", "-36000s", "--until", "-5m"}).size() == 2);
}

TEST_CASE("audit: nothing matching is success; quiet with --json, a note on stderr for the table") {
  TempDir t;
  const std::string db = t.file("fence.db");
  seed(db);
  auto r = audit({"--db", db, "--resource", "nobody", "--json"});
  CHECK(r.code() == 0);
  CHECK(r.out.empty());
  CHECK(r.err.empty());
  r = audit({"--db", db, "--resource", "nobody"});
  CHECK(r.code() == 0);
  CHECK(r.out.empty());
  CHECK(r.err.find("no matching audit rows") != std::string::npos);

  // An empty (fresh) database too.
  { auto s = open_store(t.file("empty.db")); }
  r = audit({"--db", t.file("empty.db"), "--json"});
  CHECK(r.code() == 0);
  CHECK(r.out.empty());
}

TEST_CASE("audit: bad arguments exit 2 naming the flag; an unreadable database exits 1 naming it") {
  TempDir t;
  const std::string db = t.file("fence.db");
  seed(db);
  struct Bad {
    std::vector<std::string> args;
    std::string mention;
  };
  const std::vector<Bad> bad = {
      {{}, "--db"},
      {{"--db"}, "--db"},
      {{"--db", db, "--since", "yesterday"}, "--since"},
      {{"--db", db, "--until", "2025-02-30T00:00:00Z"}, "--until"},
      {{"--db", db, "--since", "2025-03-01T10:00:00"}, "--since"},  // no offset
      {{"--db", db, "--since", "-5y"}, "--since"},
      {{"--db", db, "--since", "-1h", "--until", "-2h"}, "--since"},
      {{"--db", db, "--limit", "0"}, "--limit"},
      {{"--db", db, "--limit", "ten"}, "--limit"},
      {{"--db", db, "--decision", "rejected"}, "--decision"},
      {{"--db", db, "--frobnicate"}, "--frobnicate"},
      {{"--db", db, "--json=yes"}, "--json"},
      {{"--db", db, "stray"}, "stray"},
  };
  for (const auto& b : bad) {
    auto r = audit(b.args);
    std::string joined;
    for (const auto& a : b.args) joined += a + " ";
    INFO("args: " << joined << "\nstderr: " << r.err);
    CHECK(r.code() == 2);
    CHECK(r.out.empty());
    CHECK(r.err.find(b.mention) != std::string::npos);
  }

  const std::string missing = t.file("missing.db");
  auto r = audit({"--db", missing});
  CHECK(r.code() == 1);
  CHECK(r.err.find(missing) != std::string::npos);
  write_file(t.file("junk.db"), std::string(4096, 'x'));
  r = audit({"--db", t.file("junk.db")});
  CHECK(r.code() == 1);
  CHECK(r.err.find(t.file("junk.db")) != std::string::npos);

  auto h = audit({"--help"});
  CHECK(h.code() == 0);
  CHECK(h.out.find("--follow") != std::string::npos);
  auto top = run_command({kBinary, "--help"});
  CHECK(top.out.find("fencegate audit") != std::string::npos);
}

TEST_CASE("audit --follow prints the backlog oldest first, then rows committed later; SIGTERM exits 0") {
  TempDir t;
  const std::string db = t.file("fence.db");
  seed(db);
  ProcessOptions po;
  po.log_path = t.file("follow.log");
  auto p = Process::start(
      {kBinary, "audit", "--db", db, "--json", "--follow", "--resource", "orders", "--limit", "2"}, po);
  REQUIRE(eventually([&] { return lines(p.log()).size() >= 2; }));
  CHECK(targets(p.log()) == std::vector<std::string>{"/orders/2", "/orders/new"});

  // A writer takes the store while the CLI follows: the CLI holds no lock.
  {
    auto s = open_store(db);
    append_sync(*s, arow("users", "rejected_stale", "L9", wall_ms(), "/users/filtered-out"));
    append_sync(*s, arow("orders", "rejected_stale", "L9", wall_ms(), "/orders/live-1"));
    REQUIRE(eventually([&] { return lines(p.log()).size() >= 3; }));
    append_sync(*s, arow("orders", "would_reject_missing", "", wall_ms(), "/orders/live-2"));
    REQUIRE(eventually([&] { return lines(p.log()).size() >= 4; }));
  }
  // And after the writer has gone again.
  {
    auto s = open_store(db);
    append_sync(*s, arow("orders", "rejected_stale", "L9", wall_ms(), "/orders/live-3"));
  }
  REQUIRE(eventually([&] { return lines(p.log()).size() >= 5; }));
  std::this_thread::sleep_for(400ms);  // one more poll: nothing printed twice
  const std::vector<std::string> want = {"/orders/2", "/orders/new", "/orders/live-1", "/orders/live-2",
                                         "/orders/live-3"};
  CHECK(targets(p.log()) == want);
  for (const auto& l : lines(p.log())) CHECK(json_keys(l).size() == 15);  // with "member" (issue 33)

  CHECK(p.running());
  p.kill(SIGTERM);
  auto st = p.wait_for(5s);
  REQUIRE(st.has_value());
  INFO(st->describe() << "\n" << p.log());
  CHECK(st->exited);
  CHECK(st->code == 0);
}

TEST_CASE("audit --follow on an empty database, in table mode; SIGINT exits 0") {
  TempDir t;
  const std::string db = t.file("fence.db");
  { auto s = open_store(db); }
  ProcessOptions po;
  po.log_path = t.file("follow.log");
  auto p = Process::start({kBinary, "audit", "--db", db, "--follow"}, po);
  REQUIRE(eventually([&] { return p.log().find("TIME") != std::string::npos; }));
  {
    auto s = open_store(db);
    append_sync(*s, arow("orders", "rejected_stale", "L1", kBase, "/orders/first"));
    append_sync(*s, arow("orders", "rejected_stale", "L1", kBase, "/orders/second"));
  }
  REQUIRE(eventually([&] { return p.log().find("/orders/second") != std::string::npos; }));
  const std::string log = p.log();
  CHECK(log.find("/orders/first") < log.find("/orders/second"));
  CHECK(log.find("no matching audit rows yet") != std::string::npos);

  p.kill(SIGINT);
  auto st = p.wait_for(5s);
  REQUIRE(st.has_value());
  INFO(st->describe() << "\n" << p.log());
  CHECK(st->exited);
  CHECK(st->code == 0);
}

TEST_CASE("audit: --follow with an --until in the past ends by itself") {
  TempDir t;
  seed(t.file("fence.db"));
  const auto t0 = std::chrono::steady_clock::now();
  auto r = audit({"--db", t.file("fence.db"), "--json", "--follow", "--until", "-1m"});
  INFO(r.err);
  CHECK(r.code() == 0);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);  // one poll, not forever
}

}  // TEST_SUITE

// After a clean stop SQLite removes the -wal but leaves the file in WAL mode, where a reader
// must create the -shm: an operator who may read fence.db but not write its directory (or a copy
// on a read-only volume) could not read the audit log. Run as `nobody` (root reads anything).
TEST_CASE("audit: a stopped sidecar's database is readable by a user who cannot write its directory") {
  if (::geteuid() != 0 || ::access("/usr/sbin/runuser", X_OK) != 0) {
    MESSAGE("skipped: needs root and runuser to run the CLI as another user");
    return;
  }
  TempDir dir("fencegate-audit-ro");
  const std::string db = dir.file("fence.db");
  seed(db);
  REQUIRE_FALSE(std::filesystem::exists(db + "-wal"));  // closed cleanly
  const std::string bin = dir.file("fencegate");
  std::filesystem::copy_file(kBinary, bin);  // somewhere `nobody` can run it from
  std::filesystem::permissions(dir.path(), std::filesystem::perms(0755));
  std::filesystem::permissions(db, std::filesystem::perms(0644));
  std::filesystem::permissions(bin, std::filesystem::perms(0755));
  auto r = run_command({"/usr/sbin/runuser", "-u", "nobody", "--", bin, "audit", "--db", db, "--json"}, 20s);
  INFO(r.err);
  CHECK(r.code() == 0);
  CHECK(lines(r.out).size() == 5);
  CHECK_FALSE(std::filesystem::exists(db + "-shm"));  // nothing was created
}
