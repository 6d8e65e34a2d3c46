// Tests for fence_store: schema, advance semantics, ownership, group commit, fail-closed commits
// (injected and real EFBIG), audit queries (follow cursor, unfenced callers), retention, the commit
// observer, and durability across kill -9.
#include "fence_store/store.h"

#include "tests/support/store_fixture.h"
#include <doctest/doctest.h>
#include <poll.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>

using namespace fencegate::store;
namespace fs = std::filesystem;

namespace {

// A fresh directory for fence.db, removed at the end of the test.
struct TempDir : fencegate::testing::StoreDir {
  TempDir() : StoreDir("fg-store-test") {}
};
using fencegate::testing::must_open;

Status advance_sync(Store& s, const std::string& r, std::int64_t g, const std::string& leader) {
  std::promise<Status> p;
  auto f = p.get_future();
  s.advance(r, g, leader, [&p](Status st) { p.set_value(std::move(st)); });
  return f.get();
}

Status audit_sync(Store& s, AuditRow row) {
  std::promise<Status> p;
  auto f = p.get_future();
  s.append_audit(std::move(row), [&p](Status st) { p.set_value(std::move(st)); });
  return f.get();
}

std::map<std::string, ResourceState> by_name(const std::vector<ResourceState>& v) {
  std::map<std::string, ResourceState> m;
  for (const auto& r : v) m[r.resource] = r;
  return m;
}

// All audit rows, newest first, fetched page by page with the before_id cursor.
std::vector<AuditRecord> all_audit(Store& s, AuditQuery q = {}) {
  std::vector<AuditRecord> out;
  q.limit = 1000;
  for (;;) {
    Status st = Status::OK();
    auto page = s.query_audit(q, &st);
    REQUIRE(st.ok());
    if (page.empty()) return out;
    q.before_id = page.back().id;
    out.insert(out.end(), page.begin(), page.end());
  }
}

// PRAGMA user_version lives big-endian at offset 60 of the database header.
std::uint32_t header_user_version(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  unsigned char b[4] = {};
  f.seekg(60);
  f.read(reinterpret_cast<char*>(b), 4);
  return (std::uint32_t{b[0]} << 24) | (std::uint32_t{b[1]} << 16) | (std::uint32_t{b[2]} << 8) | b[3];
}

void set_header_user_version(const std::string& path, std::uint32_t v) {
  std::fstream f(path, std::ios::binary | std::ios::in | std::ios::out);
  unsigned char b[4] = {static_cast<unsigned char>(v >> 24), static_cast<unsigned char>(v >> 16),
                        static_cast<unsigned char>(v >> 8), static_cast<unsigned char>(v)};
  f.seekp(60);
  f.write(reinterpret_cast<char*>(b), 4);
}

AuditRow row(std::string resource, std::string decision, std::string leader = "", std::int64_t time_ms = 0) {
  AuditRow r;
  r.time_ms = time_ms;
  r.resource = std::move(resource);
  r.decision = std::move(decision);
  r.presented_generation = 3;
  r.current_generation = 5;
  r.method = "PUT";
  r.target = "/x";
  r.client = "127.0.0.1:1234";
  r.leader = std::move(leader);
  r.mode = "enforce";
  r.user_agent = "test";
  return r;
}

// AuditQuery builder (designated initializers that skip members warn under -Wextra).
struct Q : AuditQuery {
  Q& res(std::string v) {
    resource = std::move(v);
    return *this;
  }
  Q& dec(std::string v) {
    decision = std::move(v);
    return *this;
  }
  Q& lead(std::string v) {
    leader = std::move(v);
    return *this;
  }
  Q& since(std::int64_t v) {
    since_ms = v;
    return *this;
  }
  Q& until(std::int64_t v) {
    until_ms = v;
    return *this;
  }
  Q& lim(int v) {
    limit = v;
    return *this;
  }
  Q& after(std::int64_t v) {
    after_id = v;
    return *this;
  }
};

std::int64_t wall_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

TEST_CASE("a fresh database gets schema version 1 and empty tables") {
  TempDir t;
  {
    auto s = must_open(t.db());
    CHECK(s->load_all().empty());
    Status st = Status::Error("unset");
    CHECK(s->query_audit({}, &st).empty());
    CHECK(st.ok());
    CHECK(fs::exists(t.db() + ".lock"));
  }
  CHECK_FALSE(fs::exists(t.db() + "-wal"));  // clean close checkpoints the WAL into the file
  CHECK(header_user_version(t.db()) == Store::kSchemaVersion);
}

TEST_CASE("advance raises and never lowers; advanced_at/by change only when raised") {
  TempDir t;
  auto s = must_open(t.db());
  std::int64_t t0 = wall_ms();
  REQUIRE(advance_sync(*s, "orders", 5, "leader-a").ok());
  auto m = by_name(s->load_all());
  REQUIRE(m.count("orders"));
  CHECK(m["orders"].generation == 5);
  CHECK(m["orders"].advanced_by == "leader-a");
  CHECK(m["orders"].advanced_at_ms >= t0);
  const std::int64_t at = m["orders"].advanced_at_ms;

  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(advance_sync(*s, "orders", 3, "leader-b").ok());  // lower: accepted as a no-op
  CHECK(advance_sync(*s, "orders", 5, "leader-c").ok());  // equal: no-op too
  m = by_name(s->load_all());
  CHECK(m["orders"].generation == 5);
  CHECK(m["orders"].advanced_by == "leader-a");
  CHECK(m["orders"].advanced_at_ms == at);

  CHECK(advance_sync(*s, "orders", 8, "leader-d").ok());
  CHECK(advance_sync(*s, "users", 2, "").ok());
  m = by_name(s->load_all());
  CHECK(m.size() == 2);
  CHECK(m["orders"].generation == 8);
  CHECK(m["orders"].advanced_by == "leader-d");
  CHECK(m["orders"].advanced_at_ms > at);
  CHECK(m["users"].generation == 2);
  CHECK(m["users"].advanced_by == "");
}

TEST_CASE("remove deletes a resource's row durably, in order with advances; a later advance makes it anew") {
  TempDir t;
  {
    auto s = must_open(t.db());
    REQUIRE(advance_sync(*s, "tenant-a", 9223372036854775807LL, "forged").ok());
    REQUIRE(advance_sync(*s, "tenant-b", 4, "L").ok());
    std::promise<Status> p;
    auto f = p.get_future();
    s->remove("tenant-a", [&p](Status st) { p.set_value(std::move(st)); });
    REQUIRE(f.get().ok());
    auto m = by_name(s->load_all());
    CHECK_FALSE(m.count("tenant-a"));
    CHECK(m["tenant-b"].generation == 4);
    s->remove("tenant-b", {});
    s->advance("tenant-b", 2, "M", {});  // queued after the removal: a lower generation is taken again
  }
  auto s = must_open(t.db());
  auto m = by_name(s->load_all());
  CHECK_FALSE(m.count("tenant-a"));
  CHECK(m["tenant-b"].generation == 2);
}

TEST_CASE("state persists across reopen, and the destructor commits what was queued") {
  TempDir t;
  {
    auto s = must_open(t.db());
    REQUIRE(advance_sync(*s, "a", 7, "L").ok());
    for (int i = 0; i < 100; ++i) s->append_audit(row("a", "rejected_stale"), {});  // fire and forget
    s->advance("b", 4, "M", {});
  }  // destroyed with rows possibly still queued
  auto s = must_open(t.db());
  auto m = by_name(s->load_all());
  CHECK(m["a"].generation == 7);
  CHECK(m["a"].advanced_by == "L");
  CHECK(m["b"].generation == 4);
  CHECK(all_audit(*s).size() == 100);
}

TEST_CASE("open sizes the WAL for overwrites; the database and its tables are untouched by that") {
  TempDir t;
  {
    auto s = must_open(t.db());
    // 1000 pages (SQLite's checkpoint threshold) of 4 KiB frames, with nothing committed in them.
    CHECK(fs::file_size(t.db() + "-wal") >= 1000u * (4096 + 24));
    REQUIRE(advance_sync(*s, "r", 3, "a").ok());
    CHECK(fs::file_size(t.db() + "-wal") >= 1000u * (4096 + 24));  // the commit overwrote, in place
    // What a crash leaves (database and WAL as they are on disk now) recovers the commit alone.
    fs::create_directories(t.db() + ".crash");
    fs::copy_file(t.db(), t.db() + ".crash/fence.db");
    fs::copy_file(t.db() + "-wal", t.db() + ".crash/fence.db-wal");
  }
  auto c = must_open(t.db() + ".crash/fence.db");
  auto m = by_name(c->load_all());
  CHECK(m.size() == 1);
  CHECK(m["r"].generation == 3);
  CHECK(all_audit(*c).empty());
  c.reset();
  CHECK(fs::file_size(t.db()) < 64u * 1024);  // checkpointed at close: the schema and one row, no more
}

TEST_CASE("one owner at a time; read-only readers work while it runs") {
  TempDir t;
  auto first = must_open(t.db());
  REQUIRE(advance_sync(*first, "r", 3, "L").ok());

  std::string err;
  CHECK(Store::open(t.db(), &err) == nullptr);
  CHECK(err == "database " + t.db() + " is already owned by another fencegate (lock file " + t.db() + ".lock is held)");
  // The lock file deleted under a running owner (a cleanup script): the database file itself is
  // locked as well, so a second owner is still refused.
  REQUIRE(fs::remove(t.db() + ".lock"));
  CHECK(Store::open(t.db(), &err) == nullptr);
  CHECK(err.find("is already owned by another fencegate (the database file is locked") != std::string::npos);

  {
    auto ro = Store::open_readonly(t.db(), &err);
    INFO(err);
    REQUIRE(ro != nullptr);
    CHECK(by_name(ro->load_all())["r"].generation == 3);
    REQUIRE(advance_sync(*first, "r", 4, "L").ok());
    CHECK(by_name(ro->load_all())["r"].generation == 4);  // sees the owner's later commits

    // Writes on a read-only store complete at once, on the caller's thread, with an error.
    bool called = false;
    ro->advance("r", 9, "x", [&](Status st) {
      called = true;
      CHECK_FALSE(st.ok());
      CHECK(st.message().find("read-only") != std::string::npos);
    });
    CHECK(called);
    called = false;
    ro->append_audit(row("r", "d"), [&](Status st) { called = !st.ok(); });
    CHECK(called);
    ro->append_audit(row("r", "d"), {});  // no callback: must not crash
    CHECK(by_name(first->load_all())["r"].generation == 4);
  }

  first.reset();
  auto second = must_open(t.db());
  CHECK(by_name(second->load_all())["r"].generation == 4);

  second.reset();
  auto ro = Store::open_readonly(t.db(), &err);  // and with no owner at all
  INFO(err);
  REQUIRE(ro != nullptr);
  CHECK(by_name(ro->load_all())["r"].generation == 4);
}

TEST_CASE("every name of one database leads to the same owner: symlinks resolve, hard links are refused") {
  TempDir t;
  auto first = must_open(t.db());
  REQUIRE(advance_sync(*first, "r", 9, "L").ok());
  const std::string sym = t.dir + "/other-name.db";
  fs::create_symlink(t.db(), sym);
  std::string err;
  // Else a second fencegate would own the same file under its own lock and its own generations.
  CHECK(Store::open(sym, &err) == nullptr);
  CHECK(err.find("is already owned by another fencegate") != std::string::npos);
  first.reset();
  {
    auto via_link = must_open(sym);  // with no owner, the link opens the same database
    CHECK(by_name(via_link->load_all())["r"].generation == 9);
    CHECK(Store::open(t.db(), &err) == nullptr);  // and then the real name is the one taken
    CHECK(err.find("is already owned by another fencegate") != std::string::npos);
  }
  const std::string hard = t.dir + "/hard.db";
  fs::create_hard_link(t.db(), hard);
  for (const std::string& name : {t.db(), hard, sym}) {
    INFO(name);
    CHECK(Store::open(name, &err) == nullptr);
    CHECK(err == "cannot open database " + name +
                     ": the file has 2 hard links; fencegate's owner lock goes by file name, so a database "
                     "must have one name only");
  }
  fs::remove(t.dir + "/dangling.db");
  fs::create_symlink(t.dir + "/missing/x.db", t.dir + "/dangling.db");
  CHECK(Store::open(t.dir + "/dangling.db", &err) == nullptr);
  CHECK(err.find("is a symbolic link") != std::string::npos);
}

TEST_CASE("open errors are sentences naming the path") {
  TempDir t;
  std::string err;

  std::string missing = t.dir + "/nope/fence.db";
  CHECK(Store::open(missing, &err) == nullptr);
  CHECK(err == "cannot open database " + missing + ": directory " + t.dir + "/nope does not exist");

  CHECK(Store::open_readonly(t.db(), &err) == nullptr);
  CHECK(err.find(t.db()) != std::string::npos);

  std::string junk = t.dir + "/junk.db";
  {
    std::ofstream f(junk);
    for (int i = 0; i < 1000; ++i) f << "this is not a database\n";
  }
  CHECK(Store::open(junk, &err) == nullptr);
  CHECK(err.find(junk) != std::string::npos);
  CHECK(err.find("not a database") != std::string::npos);
  CHECK(Store::open_readonly(junk, &err) == nullptr);
  CHECK(err.find("not a database") != std::string::npos);

  { auto s = must_open(t.db()); }
  fs::permissions(t.db(), fs::perms::owner_read, fs::perm_options::replace);
  if (::access(t.db().c_str(), W_OK) != 0) {  // root can write anyway; then there is nothing to test
    CHECK(Store::open(t.db(), &err) == nullptr);
    CHECK(err == "cannot open database " + t.db() + " for writing: the file is not writable by this process");
  }
}

// --- Files (issue 32, findings 4 and 10): owner-only modes, no links, a safe directory ---

namespace {
unsigned mode_of(const std::string& path) {
  struct stat st {};
  REQUIRE_MESSAGE(::stat(path.c_str(), &st) == 0, path);
  return st.st_mode & 07777;
}
}  // namespace

TEST_CASE("the database, its -wal, -shm and lock file are created 0600 whatever the umask") {
  for (mode_t mask : {mode_t{0}, mode_t{022}, mode_t{0277}}) {
    INFO("umask " << std::oct << mask);
    TempDir t;
    const mode_t old = ::umask(mask);
    auto s = must_open(t.db());
    ::umask(old);
    REQUIRE(advance_sync(*s, "r", 1, "L").ok());
    REQUIRE(audit_sync(*s, row("r", "accepted")).ok());
    for (const char* suffix : {"", "-wal", "-shm", ".lock"}) CHECK_MESSAGE(mode_of(t.db() + suffix) == 0600, suffix);
  }
}

TEST_CASE("a database an older release left readable by others is tightened to 0600 when opened") {
  TempDir t;
  {
    const mode_t old = ::umask(0);
    auto s = must_open(t.db());
    ::umask(old);
    REQUIRE(advance_sync(*s, "r", 1, "L").ok());
    // As an older release left them: the database, its lock file and (still open) -wal and -shm
    for (const char* suffix : {"", "-wal", "-shm", ".lock"}) ::chmod((t.db() + suffix).c_str(), 0644);
  }
  for (const char* suffix : {"-wal", "-shm"}) {  // left by a crash: empty, as after a checkpoint
    const std::string p = t.db() + suffix;
    if (!std::filesystem::exists(p)) ::close(::open(p.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
    ::chmod(p.c_str(), 0644);
  }
  auto s = must_open(t.db());
  REQUIRE(s->load_all().at(0).generation == 1);
  for (const char* suffix : {"", "-wal", "-shm", ".lock"}) {
    if (!std::filesystem::exists(t.db() + suffix)) continue;
    CHECK_MESSAGE(mode_of(t.db() + suffix) == 0600, suffix);
  }
}

TEST_CASE("another user can open none of the store's files (and so cannot flock them)") {
  if (::geteuid() != 0) {
    MESSAGE("skipped: needs root to run a child as another user");
    return;
  }
  TempDir t;
  ::chmod(t.dir.c_str(), 0755);  // others may enter the directory (but not write to it)
  const mode_t old = ::umask(0);
  auto s = must_open(t.db());
  ::umask(old);
  REQUIRE(audit_sync(*s, row("r", "accepted")).ok());
  auto opened_by_nobody = [&](const std::string& path) {
    pid_t pid = ::fork();
    if (pid == 0) {
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
      int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) ::_exit(errno == EACCES ? 0 : 4);
      ::_exit(::flock(fd, LOCK_EX | LOCK_NB) == 0 ? 1 : 2);  // 1: it could have blocked fencegate's start
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  for (const char* suffix : {"", "-wal", "-shm", ".lock"})
    CHECK_MESSAGE(opened_by_nobody(t.db() + suffix) == 0, suffix);
  s.reset();  // a stopped sidecar: its lock file stays, for anyone who could open and flock it
  CHECK(opened_by_nobody(t.db() + ".lock") == 0);
  CHECK(must_open(t.db()) != nullptr);
}

TEST_CASE("a symbolic link planted at the lock, -wal or -shm name is refused and what it names is not created") {
  for (const char* suffix : {".lock", "-wal", "-shm"}) {
    INFO(suffix);
    for (bool existing : {false, true}) {
      TempDir t;
      if (existing) must_open(t.db());
      const std::string target = t.dir + "/attacker-chosen";
      fs::remove(t.db() + suffix);  // a stopped sidecar's lock file stays; the attacker replaces it
      fs::create_symlink(target, t.db() + suffix);
      std::string err;
      CHECK(Store::open(t.db(), &err) == nullptr);
      CHECK(err == "database " + t.db() + ": " + t.db() + suffix +
                       " is a symbolic link; fencegate does not create or open the files beside the database through "
                       "a link (remove it)");
      CHECK_FALSE(fs::exists(fs::symlink_status(target)));
      fs::remove(t.db() + suffix);
      CHECK(must_open(t.db()) != nullptr);
    }
  }
}

TEST_CASE("a database in a directory others may write to, or owned by another user, is refused") {
  TempDir t;
  ::chmod(t.dir.c_str(), 0777);
  std::string err;
  CHECK(Store::open(t.db(), &err) == nullptr);
  CHECK(err.rfind("database " + t.db() + ": its directory " + t.dir + " has mode 0777: other users may write to it",
                  0) == 0);
  CHECK_FALSE(fs::exists(t.db()));
  CHECK_FALSE(fs::exists(t.db() + ".lock"));
  ::chmod(t.dir.c_str(), 01777);  // sticky, as /tmp: allowed
  must_open(t.db());
  ::chmod(t.dir.c_str(), 0700);
  if (::geteuid() == 0) {
    REQUIRE(::chown(t.db().c_str(), 65534, 65534) == 0);
    CHECK(Store::open(t.db(), &err) == nullptr);
    CHECK(err == "database " + t.db() +
                     " is owned by uid 65534, not by the user fencegate runs as (uid 0): that user could read or "
                     "change the fence");
  }
}

TEST_CASE("a database with a newer schema version is refused") {
  TempDir t;
  { auto s = must_open(t.db()); }
  REQUIRE_FALSE(fs::exists(t.db() + "-wal"));
  set_header_user_version(t.db(), 7);
  REQUIRE(header_user_version(t.db()) == 7);

  std::string err;
  CHECK(Store::open(t.db(), &err) == nullptr);
  CHECK(err == "database " + t.db() +
                   " has schema version 7, newer than this fencegate supports (1); upgrade fencegate or "
                   "point it at another database");
  CHECK(Store::open(t.db(), &err) == nullptr);  // the failed open released the lock
  CHECK(err.find("schema version 7") != std::string::npos);
  CHECK(Store::open_readonly(t.db(), &err) == nullptr);
  CHECK(err.find("newer") != std::string::npos);
  CHECK(header_user_version(t.db()) == 7);  // and left the file alone
}

TEST_CASE("group commit: rows queued together land in one transaction") {
  TempDir t;
  auto s = must_open(t.db());

  // Hold the store thread inside a completion so everything below piles up in the queue.
  std::promise<void> entered, gate;
  auto gate_f = gate.get_future().share();
  s->advance("gate", 1, "", [&](Status) {
    entered.set_value();
    gate_f.wait();
  });
  entered.get_future().wait();
  const auto before = s->commit_count();

  std::atomic<int> ok{0}, done{0};
  std::vector<std::thread> producers;
  for (int p = 0; p < 4; ++p)
    producers.emplace_back([&, p] {
      for (int i = 0; i < 50; ++i) {
        auto r = row("res" + std::to_string(p), "rejected_stale");
        s->append_audit(std::move(r), [&](Status st) {
          if (st.ok()) ok++;
          done++;
        });
      }
    });
  for (auto& th : producers) th.join();
  CHECK(s->queue_depth() == 201);  // 200 rows + the gate item whose completion is still running

  gate.set_value();
  while (done.load() < 200) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(ok.load() == 200);
  CHECK(s->commit_count() == before + 1);  // 200 rows, one transaction, one fsync
  CHECK(all_audit(*s).size() == 200);
  while (s->queue_depth() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST_CASE("injected commit failures fail every batch, then the store recovers") {
  TempDir t;
  auto s = must_open(t.db());
  REQUIRE(advance_sync(*s, "r", 5, "a").ok());
  const auto commits = s->commit_count();

  s->inject_commit_failure(true);
  Status st = advance_sync(*s, "r", 10, "b");
  CHECK_FALSE(st.ok());
  CHECK(st.message().find("injected") != std::string::npos);
  CHECK(st.message().find(t.db()) != std::string::npos);
  s->append_audit(row("r", "fire-and-forget"), {});  // nobody to tell: kept for a later batch
  CHECK_FALSE(audit_sync(*s, row("r", "lost")).ok());   // its caller was told: not retried
  CHECK_FALSE(advance_sync(*s, "q", 1, "b").ok());
  CHECK(s->commit_count() == commits);
  CHECK(by_name(s->load_all())["r"].generation == 5);  // nothing of the failed batches landed
  CHECK(all_audit(*s).empty());

  s->inject_commit_failure(false);
  CHECK(advance_sync(*s, "r", 7, "c").ok());
  CHECK(audit_sync(*s, row("r", "kept")).ok());
  auto m = by_name(s->load_all());
  CHECK(m["r"].generation == 7);
  CHECK(m["r"].advanced_by == "c");
  CHECK(m.count("q") == 0);
  auto rows = all_audit(*s);  // newest first
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].row.decision == "kept");
  CHECK(rows[1].row.decision == "fire-and-forget");
  CHECK(s->audit_rows_dropped() == 0);
}

TEST_CASE("fire-and-forget rows of failed batches are retried while idle, and written at close") {
  TempDir t;
  {
    auto s = must_open(t.db());
    s->inject_commit_failure(true);
    for (int i = 0; i < 3; ++i) s->append_audit(row("r", "observe-" + std::to_string(i)), {});
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // their batch has failed
    CHECK(all_audit(*s).empty());
    CHECK(s->queue_depth() == 3);  // still waiting
    s->inject_commit_failure(false);
    // Nothing else is queued: the idle retry (every 500 ms) writes them.
    for (int i = 0; i < 300 && all_audit(*s).size() < 3; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    CHECK(all_audit(*s).size() == 3);
    CHECK(s->queue_depth() == 0);

    s->inject_commit_failure(true);
    s->append_audit(row("r", "at-close"), {});
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    s->inject_commit_failure(false);
    // closed before the idle retry comes round: the close tries them once more
  }
  auto s = must_open(t.db());
  auto rows = all_audit(*s);
  REQUIRE(rows.size() == 4);
  CHECK(rows[0].row.decision == "at-close");
}

TEST_CASE("a real I/O failure (RLIMIT_FSIZE exceeded) fails closed and recovers") {
  ::signal(SIGXFSZ, SIG_IGN);  // as fencegate's main does: writes get EFBIG instead of a signal
  TempDir t;
  auto s = must_open(t.db());
  REQUIRE(advance_sync(*s, "r", 5, "a").ok());
  for (int i = 0; i < 20; ++i) s->append_audit(row("r", "before"), {});
  REQUIRE(audit_sync(*s, row("r", "before")).ok());

  struct rlimit old {};
  REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
  struct rlimit small = old;
  small.rlim_cur = 1024;  // below the WAL's first frame: every commit's write fails
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  // No doctest assertions until the limit is restored: its output may go to a file.
  Status a1 = advance_sync(*s, "r", 9, "b");
  Status a2 = audit_sync(*s, row("r", "during"));
  Status a3 = advance_sync(*s, "fresh", 1, "b");
  REQUIRE(::setrlimit(RLIMIT_FSIZE, &old) == 0);

  CHECK_FALSE(a1.ok());
  CHECK_FALSE(a2.ok());
  CHECK_FALSE(a3.ok());
  MESSAGE("EFBIG commit error: " << a1.message());
  CHECK(by_name(s->load_all())["r"].generation == 5);

  CHECK(advance_sync(*s, "r", 11, "c").ok());
  CHECK(audit_sync(*s, row("r", "after")).ok());
  auto m = by_name(s->load_all());
  CHECK(m["r"].generation == 11);
  CHECK(m.count("fresh") == 0);
  auto during = all_audit(*s, Q().dec("during"));
  CHECK(during.empty());
  CHECK(all_audit(*s).size() == 22);

  s.reset();  // and it is all still there after a reopen
  s = must_open(t.db());
  CHECK(by_name(s->load_all())["r"].generation == 11);
  CHECK(all_audit(*s).size() == 22);
}

TEST_CASE("audit queries: filters, newest first, cursor pagination, limit clamp, time fill") {
  TempDir t;
  auto s = must_open(t.db());
  const std::int64_t t0 = wall_ms();
  REQUIRE(audit_sync(*s, row("x", "filled")).ok());  // time_ms 0 -> now
  const std::int64_t t1 = wall_ms();
  for (int i = 0; i < 30; ++i) {
    std::string res = i % 3 == 0 ? "a" : "b";
    std::string dec = i % 2 == 0 ? "rejected_stale" : "would_reject_missing";
    std::string leader = i % 5 == 0 ? "L5" : "";
    s->append_audit(row(res, dec, leader, 1000 + i), {});
  }
  REQUIRE(audit_sync(*s, row("z", "last", "", 5000)).ok());

  auto filled = all_audit(*s, Q().dec("filled"));
  REQUIRE(filled.size() == 1);
  CHECK(filled[0].row.time_ms >= t0);
  CHECK(filled[0].row.time_ms <= t1);

  auto all = all_audit(*s);
  REQUIRE(all.size() == 32);
  for (std::size_t i = 1; i < all.size(); ++i) CHECK(all[i - 1].id > all[i].id);
  CHECK(all[0].row.decision == "last");
  const auto& r = all[1].row;  // i == 29
  CHECK(r.resource == "b");
  CHECK(r.decision == "would_reject_missing");
  CHECK(r.presented_generation == 3);
  CHECK(r.current_generation == 5);
  CHECK(r.method == "PUT");
  CHECK(r.target == "/x");
  CHECK(r.client == "127.0.0.1:1234");
  CHECK(r.mode == "enforce");
  CHECK(r.user_agent == "test");
  CHECK(r.time_ms == 1029);

  CHECK(all_audit(*s, Q().res("a")).size() == 10);
  CHECK(all_audit(*s, Q().res("a").dec("rejected_stale")).size() == 5);
  CHECK(all_audit(*s, Q().lead("L5")).size() == 6);
  CHECK(all_audit(*s, Q().since(1010).until(1020)).size() == 10);
  CHECK(all_audit(*s, Q().since(1025)).size() == 7);  // 1025..1029, 5000, and "filled"
  CHECK(all_audit(*s, Q().until(1005)).size() == 5);
  CHECK(all_audit(*s, Q().res("nobody")).empty());

  // Cursor pagination in pages of 7 visits every row exactly once, newest first.
  std::vector<std::int64_t> ids;
  AuditQuery q;
  q.resource = "b";
  q.limit = 7;
  for (;;) {
    Status st = Status::OK();
    auto page = s->query_audit(q, &st);
    REQUIRE(st.ok());
    CHECK(page.size() <= 7);
    if (page.empty()) break;
    for (const auto& rec : page) ids.push_back(rec.id);
    q.before_id = page.back().id;
  }
  CHECK(ids.size() == 20);
  CHECK(std::set<std::int64_t>(ids.begin(), ids.end()).size() == 20);
  for (std::size_t i = 1; i < ids.size(); ++i) CHECK(ids[i - 1] > ids[i]);

  // Limits are clamped to 1..1001 (a page of 1000 and the row that says another page exists).
  Status st = Status::OK();
  CHECK(s->query_audit(Q().lim(0), &st).size() == 1);
  CHECK(s->query_audit(Q().lim(-5), &st).size() == 1);
  for (int i = 0; i < 1100; ++i) s->append_audit(row("bulk", "bulk"), {});
  REQUIRE(audit_sync(*s, row("bulk", "bulk")).ok());
  CHECK(s->query_audit(Q().lim(100000), &st).size() == 1001);
  CHECK(st.ok());
  CHECK(s->query_audit(Q().lim(100000), nullptr).size() == 1001);
}

TEST_CASE("after_id: rows after the cursor, oldest first, with filters and limit") {
  TempDir t;
  auto s = must_open(t.db());
  for (int i = 0; i < 20; ++i) s->append_audit(row(i % 2 ? "odd" : "even", "rejected_stale", "", 1000 + i), {});
  REQUIRE(audit_sync(*s, row("even", "last", "", 2000)).ok());
  auto all = all_audit(*s);
  REQUIRE(all.size() == 21);
  const std::int64_t first_id = all.back().id;

  Status st = Status::Error("unset");
  auto page = s->query_audit(Q().after(first_id).lim(5), &st);
  CHECK(st.ok());
  REQUIRE(page.size() == 5);
  for (std::size_t i = 0; i < page.size(); ++i) CHECK(page[i].id == first_id + 1 + static_cast<std::int64_t>(i));
  CHECK(page[0].row.time_ms == 1001);

  // Following with the cursor visits every later row exactly once, in id order.
  std::vector<std::int64_t> seen;
  std::int64_t cursor = first_id;
  for (;;) {
    auto p = s->query_audit(Q().after(cursor).lim(4), &st);
    REQUIRE(st.ok());
    if (p.empty()) break;
    for (const auto& r : p) seen.push_back(r.id);
    cursor = p.back().id;
  }
  REQUIRE(seen.size() == 20);
  for (std::size_t i = 1; i < seen.size(); ++i) CHECK(seen[i] == seen[i - 1] + 1);

  auto evens = s->query_audit(Q().after(first_id).res("even").lim(100), &st);
  CHECK(evens.size() == 10);  // 9 more "even" stale rows + "last"
  for (const auto& r : evens) CHECK(r.row.resource == "even");
  CHECK(evens.back().row.decision == "last");
  CHECK(s->query_audit(Q().after(first_id).since(1010).until(1015), &st).size() == 5);
  CHECK(s->query_audit(Q().after(all.front().id), &st).empty());  // nothing newer yet

  REQUIRE(audit_sync(*s, row("odd", "newer")).ok());
  auto more = s->query_audit(Q().after(all.front().id), &st);
  REQUIRE(more.size() == 1);
  CHECK(more[0].row.decision == "newer");
}

TEST_CASE("query_unfenced groups missing/malformed tokens by caller, most recently seen first") {
  TempDir t;
  auto s = must_open(t.db());
  auto caller = [](std::string res, std::string dec, std::string client, std::string ua, std::string leader,
                   std::int64_t time_ms) {
    AuditRow r = row(std::move(res), std::move(dec), std::move(leader), time_ms);
    r.client = std::move(client);
    r.user_agent = std::move(ua);
    return r;
  };
  // orders: one caller without a token in observe mode (3 rows), then enforced (1 row): one group.
  s->append_audit(caller("orders", "would_reject_missing", "10.0.0.1", "cron/1", "", 1000), {});
  s->append_audit(caller("orders", "would_reject_missing", "10.0.0.1", "cron/1", "", 1100), {});
  s->append_audit(caller("orders", "would_reject_malformed", "10.0.0.1", "cron/1", "", 1050), {});
  s->append_audit(caller("orders", "rejected_missing", "10.0.0.1", "cron/1", "", 1200), {});
  // Same IP, other user agent: its own group.
  s->append_audit(caller("orders", "rejected_malformed", "10.0.0.1", "curl/8", "", 1300), {});
  // Same caller, with a leader header: its own group.
  s->append_audit(caller("orders", "would_reject_missing", "10.0.0.1", "cron/1", "L1", 900), {});
  // Other resource.
  s->append_audit(caller("users", "rejected_missing", "10.0.0.2", "svc", "", 1500), {});
  // Not unfenced: stale tokens were fenced, just old.
  s->append_audit(caller("orders", "rejected_stale", "10.0.0.3", "svc", "", 5000), {});
  s->append_audit(caller("orders", "would_reject_stale", "10.0.0.3", "svc", "", 5000), {});
  REQUIRE(audit_sync(*s, caller("users", "something_else", "10.0.0.4", "svc", "", 6000)).ok());

  Status st = Status::Error("unset");
  auto g = s->query_unfenced("", 0, 100, &st);
  CHECK(st.ok());
  REQUIRE(g.size() == 4);
  CHECK(g[0].resource == "users");
  CHECK(g[0].client == "10.0.0.2");
  CHECK(g[0].count == 1);
  CHECK(g[1].resource == "orders");
  CHECK(g[1].user_agent == "curl/8");
  CHECK(g[1].last_ms == 1300);
  CHECK(g[2].resource == "orders");
  CHECK(g[2].client == "10.0.0.1");
  CHECK(g[2].user_agent == "cron/1");
  CHECK(g[2].leader == "");
  CHECK(g[2].count == 4);
  CHECK(g[2].first_ms == 1000);
  CHECK(g[2].last_ms == 1200);
  CHECK(g[3].leader == "L1");
  CHECK(g[3].count == 1);
  CHECK(g[3].first_ms == 900);

  auto orders = s->query_unfenced("orders", 0, 100, &st);
  REQUIRE(orders.size() == 3);
  for (const auto& x : orders) CHECK(x.resource == "orders");

  // since_ms filters rows before grouping: first_ms and count cover only the window.
  auto recent = s->query_unfenced("orders", 1100, 100, &st);
  REQUIRE(recent.size() == 2);
  CHECK(recent[0].user_agent == "curl/8");
  CHECK(recent[1].count == 2);
  CHECK(recent[1].first_ms == 1100);
  CHECK(s->query_unfenced("", 1400, 100, &st).size() == 1);
  CHECK(s->query_unfenced("nobody", 0, 100, &st).empty());
  CHECK(st.ok());

  // The limit is clamped to 1..1001.
  CHECK(s->query_unfenced("", 0, 2, &st).size() == 2);
  CHECK(s->query_unfenced("", 0, 0, &st).size() == 1);
  CHECK(s->query_unfenced("", 0, -3, nullptr).size() == 1);
  CHECK(s->query_unfenced("", 0, 1'000'000, &st).size() == 4);

  // And a read-only store answers the same.
  std::string err;
  auto ro = Store::open_readonly(t.db(), &err);
  INFO(err);
  REQUIRE(ro != nullptr);
  auto rg = ro->query_unfenced("", 0, 100, &st);
  CHECK(st.ok());
  REQUIRE(rg.size() == 4);
  CHECK(rg[2].count == 4);
}

namespace {

// Oldest and newest audit ids (0, 0 if empty), cheaply: a row or two each.
std::pair<std::int64_t, std::int64_t> id_span(Store& s) {
  Status st = Status::OK();
  auto newest = s.query_audit(Q().lim(1), &st);
  REQUIRE(st.ok());
  if (newest.empty()) return {0, 0};
  AuditQuery one;  // id 1, if it still exists
  one.before_id = 2;
  one.limit = 1;
  auto first = s.query_audit(one, &st);
  REQUIRE(st.ok());
  if (!first.empty()) return {first[0].id, newest[0].id};
  auto after1 = s.query_audit(Q().after(1).lim(1), &st);  // else the oldest id above 1
  REQUIRE(st.ok());
  REQUIRE(!after1.empty());
  return {after1[0].id, newest[0].id};
}

template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

}  // namespace

TEST_CASE("retention: max_rows keeps the newest rows, pruned in the background") {
  TempDir t;
  auto s = must_open(t.db());
  for (int i = 0; i < 1200; ++i) s->append_audit(row("r", "rejected_stale"), {});
  REQUIRE(audit_sync(*s, row("r", "rejected_stale")).ok());
  const auto [lo0, hi0] = id_span(*s);
  CHECK(hi0 - lo0 + 1 == 1201);

  s->set_retention(0, 100);
  REQUIRE(eventually([&] { return all_audit(*s).size() == 100; }));
  auto kept = all_audit(*s);
  CHECK(kept.front().id == hi0);  // the newest 100 survive
  CHECK(kept.back().id == hi0 - 99);

  // New rows push the oldest out again, after commits, without another set_retention.
  for (int i = 0; i < 50; ++i) s->append_audit(row("r", "more"), {});
  REQUIRE(audit_sync(*s, row("r", "more")).ok());
  REQUIRE(eventually([&] { return all_audit(*s).size() == 100; }));
  CHECK(all_audit(*s, Q().dec("more")).size() == 51);

  // 0 = unlimited: nothing more is deleted.
  s->set_retention(0, 0);
  for (int i = 0; i < 30; ++i) s->append_audit(row("r", "kept"), {});
  REQUIRE(audit_sync(*s, row("r", "kept")).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  CHECK(all_audit(*s).size() == 131);

  // Limits survive a reopen only as configuration does: a fresh store starts unlimited, and the row
  // count is recounted from the table when a limit is set.
  s.reset();
  s = must_open(t.db());
  CHECK(all_audit(*s).size() == 131);
  s->set_retention(0, 10);
  REQUIRE(eventually([&] { return all_audit(*s).size() == 10; }));
  CHECK(all_audit(*s).front().row.decision == "kept");
}

TEST_CASE("retention: max_age deletes old rows, also when idle") {
  TempDir t;
  auto s = must_open(t.db());
  const std::int64_t now = wall_ms();
  for (int i = 0; i < 40; ++i) s->append_audit(row("r", "ancient", "", 1000 + i), {});
  for (int i = 0; i < 5; ++i) s->append_audit(row("r", "soon_old", "", now - 60'000 + 700), {});
  REQUIRE(audit_sync(*s, row("r", "fresh")).ok());  // time_ms = now

  s->set_retention(60'000, 0);
  REQUIRE(eventually([&] { return all_audit(*s, Q().dec("ancient")).empty(); }));
  CHECK(all_audit(*s, Q().dec("fresh")).size() == 1);
  // The "soon_old" rows cross the line ~0.7 s from now with no further writes: the idle pass
  // (about every second) removes them.
  CHECK(all_audit(*s, Q().dec("soon_old")).size() == 5);
  REQUIRE(eventually([&] { return all_audit(*s, Q().dec("soon_old")).empty(); }, std::chrono::seconds(5)));
  CHECK(all_audit(*s).size() == 1);

  // Age and row limits together.
  s->set_retention(60'000, 3);
  for (int i = 0; i < 6; ++i) s->append_audit(row("r", "new"), {});
  s->append_audit(row("r", "ancient", "", 5), {});
  REQUIRE(audit_sync(*s, row("r", "new")).ok());
  REQUIRE(eventually([&] { return all_audit(*s).size() == 3; }));
  for (const auto& r : all_audit(*s)) CHECK(r.row.decision == "new");
}

TEST_CASE("retention: the default limits (90d, as serve configures them) prune older rows and keep newer ones") {
  TempDir t;
  auto s = must_open(t.db());
  const std::int64_t day = 86'400'000;
  const std::int64_t now = wall_ms();
  for (int i = 0; i < 20; ++i) s->append_audit(row("r", "older_than_90d", "", now - 91 * day), {});
  for (int i = 0; i < 5; ++i) s->append_audit(row("r", "younger_than_90d", "", now - 89 * day), {});
  REQUIRE(audit_sync(*s, row("r", "fresh")).ok());
  s->set_retention(90 * day, 10'000'000);  // config::Config{}.audit: 90d and 10,000,000 rows
  REQUIRE(eventually([&] { return all_audit(*s, Q().dec("older_than_90d")).empty(); }));
  CHECK(all_audit(*s, Q().dec("younger_than_90d")).size() == 5);
  CHECK(all_audit(*s).size() == 6);
}

TEST_CASE("retention: a big prune runs in chunks and a queued advance does not wait for all of it") {
  TempDir t;
  auto s = must_open(t.db());
  constexpr int kRows = 12 * Store::kPruneChunkRows;
  for (int i = 0; i < kRows; ++i) s->append_audit(row("r", "bulk"), {});
  REQUIRE(audit_sync(*s, row("r", "bulk")).ok());
  auto [lo, hi] = id_span(*s);
  REQUIRE(hi - lo + 1 == kRows + 1);

  s->set_retention(0, 10);
  // Wait until the first chunk is gone, then advance while the rest is still being deleted.
  REQUIRE(eventually([&] { return id_span(*s).first > lo; }));
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(advance_sync(*s, "fast", 1, "L").ok());
  const auto waited = std::chrono::steady_clock::now() - t0;
  const auto [lo1, hi1] = id_span(*s);
  MESSAGE("advance during prune took " << std::chrono::duration<double, std::milli>(waited).count() << " ms; "
                                       << (hi1 - lo1 + 1) << " rows left then");
  CHECK(hi1 - lo1 + 1 > 10);  // the prune was not finished: the advance went between chunks
  CHECK(hi1 - lo1 + 1 < kRows);
  REQUIRE(eventually([&] { return id_span(*s).first == hi - 9; }, std::chrono::seconds(60)));
  CHECK(by_name(s->load_all())["fast"].generation == 1);
}

TEST_CASE("retention: a backlog's chunks write their pages back as they go, and keep every newer row") {
  // Issue 29: a chunk's commit no longer leaves all its pages to the fdatasync that ends it (the
  // store thread would hold its core through that writeback: paced_io.cpp). Rows spread over
  // many resources, as in a real log, so a chunk dirties index pages all over the file.
  TempDir t;
  auto s = must_open(t.db());
  const std::int64_t now = wall_ms();
  constexpr int kOld = 3 * Store::kPruneChunkRows;
  for (int i = 0; i < kOld; ++i)
    s->append_audit(row("res-" + std::to_string(i * 7919 % 1000), "old", "", now - 40 * 86'400'000LL + i), {});
  for (int i = 0; i < 50; ++i) s->append_audit(row("res-" + std::to_string(i), "new"), {});
  REQUIRE(audit_sync(*s, row("r", "new")).ok());
  const std::uint64_t before = paced_writebacks();
  s->set_retention(30 * 86'400'000LL, 0);
  REQUIRE(eventually([&] { return all_audit(*s, Q().dec("old").lim(1)).empty(); }, std::chrono::seconds(60)));
  CHECK(paced_writebacks() > before);
  CHECK(all_audit(*s, Q().dec("new")).size() == 51);
  // The store still writes and reads as before afterwards.
  REQUIRE(advance_sync(*s, "after", 4, "L").ok());
  CHECK(by_name(s->load_all())["after"].generation == 4);
}

TEST_CASE("commit observer: one call per batch with its size, duration and outcome") {
  TempDir t;
  auto s = must_open(t.db());
  struct Call {
    double seconds;
    std::size_t items;
    bool ok;
  };
  std::mutex mu;
  std::vector<Call> calls;
  std::thread::id observer_thread;
  s->set_commit_observer([&](double seconds, std::size_t items, const Status& result) {
    std::lock_guard lk(mu);
    calls.push_back({seconds, items, result.ok()});
    observer_thread = std::this_thread::get_id();
  });
  auto snapshot = [&] {
    std::lock_guard lk(mu);
    return calls;
  };

  // Called before the batch's completions: visible as soon as advance_sync returns.
  REQUIRE(advance_sync(*s, "r", 1, "L").ok());
  auto c = snapshot();
  REQUIRE(c.size() == 1);
  CHECK(c[0].items == 1);
  CHECK(c[0].ok);
  CHECK(c[0].seconds >= 0.0);
  CHECK(c[0].seconds < 10.0);
  {
    std::lock_guard lk(mu);
    CHECK(observer_thread != std::this_thread::get_id());  // the store thread
  }

  // A group of items queued behind a held completion arrives as one batch.
  std::promise<void> entered, gate;
  auto gate_f = gate.get_future().share();
  s->advance("gate", 1, "", [&](Status) {
    entered.set_value();
    gate_f.wait();
  });
  entered.get_future().wait();
  for (int i = 0; i < 9; ++i) s->append_audit(row("r", "x"), {});
  std::promise<Status> last;
  s->append_audit(row("r", "x"), [&](Status st) { last.set_value(st); });
  gate.set_value();
  REQUIRE(last.get_future().get().ok());
  c = snapshot();
  REQUIRE(c.size() == 3);
  CHECK(c[1].items == 1);
  CHECK(c[2].items == 10);
  CHECK(c[2].ok);

  s->inject_commit_failure(true);
  CHECK_FALSE(advance_sync(*s, "r", 2, "L").ok());
  s->inject_commit_failure(false);
  c = snapshot();
  REQUIRE(c.size() == 4);
  CHECK_FALSE(c[3].ok);
  CHECK(c[3].items == 1);

  // A throwing observer does not hurt the store; an empty one removes it.
  s->set_commit_observer([](double, std::size_t, const Status&) { throw std::runtime_error("observer"); });
  CHECK(advance_sync(*s, "r", 3, "L").ok());
  s->set_commit_observer({});
  CHECK(advance_sync(*s, "r", 4, "L").ok());
  CHECK(snapshot().size() == 4);
  CHECK(by_name(s->load_all())["r"].generation == 4);

  // Read-only stores accept both setters and do nothing.
  std::string err;
  auto ro = Store::open_readonly(t.db(), &err);
  REQUIRE(ro != nullptr);
  ro->set_commit_observer([](double, std::size_t, const Status&) {});
  ro->set_retention(1, 1);
  CHECK(all_audit(*ro).size() == 10);
}

// ---- kill -9 ----

namespace {

// The child: advances and audits as fast as it can, reporting each OK completion on the pipe.
[[noreturn]] void crash_child(const std::string& path, int out_fd, int round) {
  std::string err;
  auto s = Store::open(path, &err);
  if (!s) ::_exit(3);
  std::int64_t base = 1;
  for (const auto& r : s->load_all()) base = std::max(base, r.generation + 1);
  auto report = [out_fd](std::string line) {
    line += '\n';
    (void)!::write(out_fd, line.data(), line.size());  // < PIPE_BUF: atomic
  };
  for (std::int64_t i = 0;; ++i) {
    std::string res = "r" + std::to_string(i % 4);
    std::int64_t gen = base + i;
    s->advance(res, gen, "child", [report, res, gen](Status st) {
      if (st.ok()) report("A " + res + " " + std::to_string(gen));
    });
    AuditRow a;
    a.resource = res;
    a.decision = "crash_test";
    a.target = "c" + std::to_string(round) + "-" + std::to_string(i);
    s->append_audit(a, [report, tag = a.target](Status st) {
      if (st.ok()) report("U " + tag);
    });
    while (s->queue_depth() > 200) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace

TEST_CASE("kill -9 at a random point loses nothing that was reported OK") {
  TempDir t;
  std::mt19937 rng(std::random_device{}());
  std::map<std::string, std::int64_t> floor;  // highest generation reported OK (or seen stored) so far
  std::size_t total_ok = 0;

  for (int round = 0; round < 6; ++round) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(fds[0]);
      crash_child(t.db(), fds[1], round);
    }
    ::close(fds[1]);

    std::string data;
    char buf[65536];
    auto read_some = [&](int timeout_ms) {
      pollfd p{fds[0], POLLIN, 0};
      if (::poll(&p, 1, timeout_ms) <= 0) return false;
      ssize_t n = ::read(fds[0], buf, sizeof buf);
      if (n <= 0) return false;
      data.append(buf, static_cast<std::size_t>(n));
      return true;
    };
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(std::uniform_int_distribution(20, 300)(rng));
    while (std::chrono::steady_clock::now() < deadline) read_some(5);
    ::kill(pid, SIGKILL);
    while (read_some(1000)) {
    }
    ::close(fds[0]);
    int wstatus = 0;
    REQUIRE(::waitpid(pid, &wstatus, 0) == pid);
    REQUIRE(WIFSIGNALED(wstatus));  // it was still running, not failed at open

    std::map<std::string, std::int64_t> reported;
    std::set<std::string> tags;
    std::istringstream in(data);
    std::string kind;
    while (in >> kind) {
      if (kind == "A") {
        std::string res;
        std::int64_t gen;
        in >> res >> gen;
        reported[res] = std::max(reported[res], gen);
      } else {
        std::string tag;
        in >> tag;
        tags.insert(tag);
      }
      ++total_ok;
    }

    auto s = must_open(t.db());
    auto stored = by_name(s->load_all());
    for (const auto& [res, gen] : reported) {
      INFO("round " << round << " resource " << res);
      CHECK(stored[res].generation >= gen);
    }
    for (const auto& [res, gen] : floor) {
      INFO("round " << round << " resource " << res);
      CHECK(stored[res].generation >= gen);  // never decreases across crashes
    }
    for (const auto& [res, st] : stored) floor[res] = st.generation;

    std::set<std::string> landed;
    for (const auto& rec : all_audit(*s, Q().dec("crash_test"))) landed.insert(rec.row.target);
    std::size_t missing = 0;
    for (const auto& tag : tags) missing += landed.count(tag) == 0;
    INFO("round " << round);
    CHECK(missing == 0);
    MESSAGE("round " << round << ": " << reported.size() << " resources, " << tags.size()
                     << " audit rows reported OK before kill");
  }
  CHECK(total_ok > 0);
}

TEST_CASE("a resources table that cannot be read to the end is an error, never a shorter list") {
  TempDir t;
  {
    auto s = must_open(t.db());
    for (int i = 0; i < 2000; ++i) {
      std::string name = "r" + std::to_string(i) + std::string(150, 'x');
      s->advance(name, 100, "L", nullptr);
    }
    REQUIRE(advance_sync(*s, "last", 100, "L").ok());
    std::vector<ResourceState> all = s->load_all();
    REQUIRE(all.size() == 2001);
  }  // closed: checkpointed into the database file
  // One page in the middle of the file zeroed (a bad sector, a torn copy).
  const auto size = fs::file_size(t.db());
  REQUIRE(size > 64u * 4096);
  {
    std::fstream f(t.db(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>((size / 4096 / 2) * 4096));
    const std::string zeros(4096, '\0');
    f.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
  }
  std::string err;
  auto s = Store::open(t.db(), &err);
  if (!s) {
    MESSAGE("open refused: ", err);
    CHECK_FALSE(err.empty());
    return;
  }
  Status st = Status::OK();
  auto all = s->load_all(&st);
  INFO("rows read: ", all.size());
  CHECK_FALSE(st.ok());  // the fence must not start from the rows before the bad page
  CHECK(st.message().find("malformed") != std::string::npos);
}
