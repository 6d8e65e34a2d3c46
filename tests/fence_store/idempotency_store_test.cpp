// Issue 30: the idempotency key table of the fence store: begin (record in flight, or find the
// live row, or refuse at the per-resource limit), settle, release, expiry in the background, and
// in-flight keys becoming unknown at the next start.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "fence_store/store.h"
#include "tests/support/store_fixture.h"

using namespace fencegate::store;
using fencegate::testing::must_open;
using fencegate::testing::StoreDir;

using namespace std::chrono_literals;

namespace {

std::int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

KeyRecord rec(const std::string& resource, const std::string& key, std::int64_t ttl_ms = 60000) {
  KeyRecord r;
  r.resource = resource;
  r.key = key;
  r.fingerprint = "fp-" + key;
  r.generation = 3;
  r.created_ms = now_ms();
  r.expires_ms = r.created_ms + ttl_ms;
  return r;
}

KeyBeginResult begin(Store& s, KeyRecord r, std::uint64_t max_keys = 100) {
  std::promise<KeyBeginResult> p;
  s.key_begin(std::move(r), max_keys, [&p](KeyBeginResult res) { p.set_value(std::move(res)); });
  return p.get_future().get();
}

Status settle(Store& s, KeyRecord r) {
  std::promise<Status> p;
  s.key_settle(std::move(r), [&p](Status st) { p.set_value(st); });
  return p.get_future().get();
}

Status release(Store& s, const std::string& resource, const std::string& key) {
  std::promise<Status> p;
  s.key_release(resource, "", key, [&p](Status st) { p.set_value(st); });
  return p.get_future().get();
}

std::int64_t count_of(const Store& s, const std::string& resource) {
  for (const auto& [r, n] : s.key_counts())
    if (r == resource) return n;
  return 0;
}

}  // namespace

TEST_CASE("idempotency store: begin records in flight once; a second begin finds the row") {
  StoreDir t;
  auto s = must_open(t.db());
  auto a = begin(*s, rec("r", "k1"));
  REQUIRE(a.status.ok());
  CHECK(a.outcome == KeyBegin::started);
  auto b = begin(*s, rec("r", "k1"));
  REQUIRE(b.status.ok());
  CHECK(b.outcome == KeyBegin::exists);
  CHECK(b.existing.state == KeyState::in_flight);
  CHECK(b.existing.fingerprint == "fp-k1");
  CHECK(b.existing.generation == 3);
  // Another resource, or another scope, is another key.
  CHECK(begin(*s, rec("other", "k1")).outcome == KeyBegin::started);
  KeyRecord scoped = rec("r", "k1");
  scoped.scope = "10.0.0.1";
  CHECK(begin(*s, scoped).outcome == KeyBegin::started);
  CHECK(count_of(*s, "r") == 2);
  CHECK(count_of(*s, "other") == 1);
}

TEST_CASE("idempotency store: settle completes with the response; release deletes") {
  StoreDir t;
  auto s = must_open(t.db());
  REQUIRE(begin(*s, rec("r", "k")).outcome == KeyBegin::started);
  KeyRecord done = rec("r", "k");
  done.state = KeyState::completed;
  done.status = 201;
  done.headers = "Content-Type: text/plain\r\n";
  done.body = std::string("body\0bytes", 10);
  REQUIRE(settle(*s, done).ok());
  auto b = begin(*s, rec("r", "k"));
  REQUIRE(b.outcome == KeyBegin::exists);
  CHECK(b.existing.state == KeyState::completed);
  CHECK(b.existing.status == 201);
  CHECK(b.existing.headers == "Content-Type: text/plain\r\n");
  CHECK(b.existing.body == std::string("body\0bytes", 10));
  KeyRecord got;
  Status st = Status::Error("unset");
  REQUIRE(s->key_get("r", "", "k", &got, &st));
  CHECK(st.ok());
  CHECK(got.state == KeyState::completed);
  CHECK(got.expires_ms > got.created_ms);
  // A settle of a row no longer in flight changes nothing.
  KeyRecord late = rec("r", "k");
  late.state = KeyState::unknown;
  REQUIRE(settle(*s, late).ok());
  REQUIRE(s->key_get("r", "", "k", &got, &st));
  CHECK(got.state == KeyState::completed);
  REQUIRE(release(*s, "r", "k").ok());
  CHECK_FALSE(s->key_get("r", "", "k", &got, &st));
  CHECK(st.ok());
  CHECK(count_of(*s, "r") == 0);
  CHECK(begin(*s, rec("r", "k")).outcome == KeyBegin::started);
}

TEST_CASE("idempotency store: the answer goes into the row its begin recorded, and no other") {
  StoreDir t;
  auto s = must_open(t.db());
  auto a = begin(*s, rec("r", "a"));
  auto b = begin(*s, rec("r", "b"));
  REQUIRE(a.outcome == KeyBegin::started);
  REQUIRE(b.outcome == KeyBegin::started);
  CHECK(a.row > 0);
  CHECK(b.row > 0);
  CHECK(a.row != b.row);
  // Key "a" settled with the row of "b" (a row id reused by another key): nothing changes.
  KeyRecord wrong = rec("r", "a");
  wrong.row = b.row;
  wrong.state = KeyState::completed;
  wrong.status = 500;
  REQUIRE(settle(*s, wrong).ok());
  KeyRecord got;
  REQUIRE(s->key_get("r", "", "a", &got, nullptr));
  CHECK(got.state == KeyState::in_flight);
  REQUIRE(s->key_get("r", "", "b", &got, nullptr));
  CHECK(got.state == KeyState::in_flight);
  // With its own row, and without one (a key found rather than begun here), the answer lands.
  KeyRecord done = rec("r", "a");
  done.row = a.row;
  done.state = KeyState::completed;
  done.status = 201;
  done.body = "a-body";
  REQUIRE(settle(*s, done).ok());
  KeyRecord other = rec("r", "b");
  other.state = KeyState::unknown;
  other.status = 502;
  REQUIRE(settle(*s, other).ok());
  REQUIRE(s->key_get("r", "", "a", &got, nullptr));
  CHECK(got.state == KeyState::completed);
  CHECK(got.status == 201);
  REQUIRE(s->key_get("r", "", "b", &got, nullptr));
  CHECK(got.state == KeyState::unknown);
  // Released and begun again: a new row; the old row's answer does not land in it.
  REQUIRE(release(*s, "r", "a").ok());
  auto again = begin(*s, rec("r", "a"));
  REQUIRE(again.outcome == KeyBegin::started);
  KeyRecord stale = rec("r", "a");
  stale.row = a.row;
  stale.state = KeyState::completed;
  stale.status = 200;
  REQUIRE(settle(*s, stale).ok());
  REQUIRE(s->key_get("r", "", "a", &got, nullptr));
  CHECK(got.state == (again.row == a.row ? KeyState::completed : KeyState::in_flight));
  CHECK(count_of(*s, "r") == 2);
}

TEST_CASE("idempotency store: at the limit an expired key is still taken over, a new one refused") {
  StoreDir t;
  auto s = must_open(t.db());
  // (Checked well within the first background removal, kPruneIdleInterval after the start.)
  REQUIRE(begin(*s, rec("r", "old", 100), 2).outcome == KeyBegin::started);
  REQUIRE(begin(*s, rec("r", "live"), 2).outcome == KeyBegin::started);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(begin(*s, rec("r", "new"), 2).outcome == KeyBegin::limit);
  auto old = begin(*s, rec("r", "old", 60000), 2);
  CHECK(old.outcome == KeyBegin::started);
  CHECK(old.row > 0);
  CHECK(count_of(*s, "r") == 2);
  CHECK(begin(*s, rec("r", "live"), 2).outcome == KeyBegin::exists);
}

TEST_CASE("idempotency store: the per-resource limit refuses new keys, evicting nothing") {
  StoreDir t;
  auto s = must_open(t.db());
  CHECK(begin(*s, rec("r", "a"), 2).outcome == KeyBegin::started);
  CHECK(begin(*s, rec("r", "b"), 2).outcome == KeyBegin::started);
  CHECK(begin(*s, rec("r", "c"), 2).outcome == KeyBegin::limit);
  CHECK(begin(*s, rec("r", "a"), 2).outcome == KeyBegin::exists);  // an existing key is still found
  CHECK(begin(*s, rec("q", "c"), 2).outcome == KeyBegin::started);  // per resource
  KeyRecord got;
  CHECK(s->key_get("r", "", "a", &got, nullptr));
  CHECK(s->key_get("r", "", "b", &got, nullptr));
  CHECK_FALSE(s->key_get("r", "", "c", &got, nullptr));
}

TEST_CASE("idempotency store: expired keys are removed in the background and may be used again") {
  StoreDir t;
  auto s = must_open(t.db());
  REQUIRE(begin(*s, rec("r", "old", 200)).outcome == KeyBegin::started);
  REQUIRE(begin(*s, rec("r", "live")).outcome == KeyBegin::started);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // Expired but not yet removed: a begin takes it over as new.
  CHECK(begin(*s, rec("r", "old", 200)).outcome == KeyBegin::started);
  KeyRecord got;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (s->key_get("r", "", "old", &got, nullptr) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(s->key_get("r", "", "old", &got, nullptr));
  CHECK(s->key_get("r", "", "live", &got, nullptr));
  CHECK(count_of(*s, "r") == 1);
}

TEST_CASE("idempotency store: keys survive a restart; keys in flight become unknown") {
  StoreDir t;
  {
    auto s = must_open(t.db());
    REQUIRE(begin(*s, rec("r", "done")).outcome == KeyBegin::started);
    KeyRecord d = rec("r", "done");
    d.state = KeyState::completed;
    d.status = 200;
    REQUIRE(settle(*s, d).ok());
    REQUIRE(begin(*s, rec("r", "flying")).outcome == KeyBegin::started);
  }
  auto s = must_open(t.db());
  KeyRecord got;
  REQUIRE(s->key_get("r", "", "done", &got, nullptr));
  CHECK(got.state == KeyState::completed);
  REQUIRE(s->key_get("r", "", "flying", &got, nullptr));
  CHECK(got.state == KeyState::unknown);
  CHECK(count_of(*s, "r") == 2);
  Status st = Status::Error("unset");
  auto all = s->key_list("", "", "", 10, &st);
  CHECK(st.ok());
  REQUIRE(all.size() == 2);
  CHECK(all[0].key == "done");
  CHECK(all[1].key == "flying");
  s.reset();
  // Read-only readers (fencegate keys) see them too.
  std::string err;
  auto ro = Store::open_readonly(t.db(), &err);
  REQUIRE(ro);
  CHECK(ro->key_list("r", "", "", 10, &st).size() == 2);
  CHECK(ro->key_get("r", "", "done", &got, &st));
}

TEST_CASE("idempotency store: a failed commit records nothing and says so") {
  StoreDir t;
  auto s = must_open(t.db());
  s->inject_commit_failure(true);
  auto a = begin(*s, rec("r", "k"));
  CHECK_FALSE(a.status.ok());
  s->inject_commit_failure(false);
  KeyRecord got;
  CHECK_FALSE(s->key_get("r", "", "k", &got, nullptr));
  CHECK(count_of(*s, "r") == 0);
  CHECK(begin(*s, rec("r", "k")).outcome == KeyBegin::started);
}

TEST_CASE("idempotency store: completed keys are answered from memory until released or expired") {
  StoreDir t;
  auto s = must_open(t.db());
  KeyRecord got;
  REQUIRE(begin(*s, rec("r", "k")).outcome == KeyBegin::started);
  CHECK_FALSE(s->key_cached("r", "", "k", &got));  // in flight: not cached
  KeyRecord done = rec("r", "k", 400);
  done.state = KeyState::completed;
  done.status = 201;
  done.body = "b";
  REQUIRE(settle(*s, done).ok());
  REQUIRE(s->key_cached("r", "", "k", &got));
  CHECK(got.status == 201);
  CHECK(got.body == "b");
  CHECK(got.fingerprint == "fp-k");
  REQUIRE(release(*s, "r", "k").ok());
  CHECK_FALSE(s->key_cached("r", "", "k", &got));
  // Expired: not answered from memory.
  REQUIRE(begin(*s, rec("r", "e", 200)).outcome == KeyBegin::started);
  KeyRecord e = rec("r", "e", 200);
  e.state = KeyState::completed;
  e.status = 200;
  REQUIRE(settle(*s, e).ok());
  CHECK(s->key_cached("r", "", "e", &got));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK_FALSE(s->key_cached("r", "", "e", &got));
  // A failed settle caches nothing.
  REQUIRE(begin(*s, rec("r", "f")).outcome == KeyBegin::started);
  s->inject_commit_failure(true);
  KeyRecord f = rec("r", "f");
  f.state = KeyState::completed;
  CHECK_FALSE(settle(*s, f).ok());
  s->inject_commit_failure(false);
  CHECK_FALSE(s->key_cached("r", "", "f", &got));
}

namespace {
std::shared_ptr<KeyRider> rider(KeyRecord r, std::uint64_t max_keys = 100) {
  auto k = std::make_shared<KeyRider>();
  k->rec = std::move(r);
  k->max_keys = max_keys;
  return k;
}
Status advance_keyed(Store& s, std::int64_t g, std::vector<std::shared_ptr<KeyRider>> riders) {
  std::promise<Status> p;
  s.advance_keyed("r", g, "leader", std::move(riders), [&p](Status st) { p.set_value(st); });
  return p.get_future().get();
}
std::int64_t bytes_of(const Store& s, const std::string& resource) {
  for (const auto& [r, n] : s.key_bytes())
    if (r == resource) return n;
  return 0;
}
}  // namespace

TEST_CASE("idempotency store: keys ride in the transaction of a fence advance (one commit)") {
  StoreDir t;
  auto s = must_open(t.db());
  REQUIRE(s->rides_keys());
  REQUIRE(begin(*s, rec("r", "old")).outcome == KeyBegin::started);
  const auto commits = s->commit_count();
  auto a = rider(rec("r", "a")), b = rider(rec("r", "old")), abandoned = rider(rec("r", "gone"));
  s->abandon(abandoned);  // not admitted before its batch ends: released after it
  REQUIRE(advance_keyed(*s, 7, {a, b, abandoned}).ok());
  CHECK(s->commit_count() == commits + 1);  // the advance and its keys: one commit
  CHECK(a->committed);
  CHECK(a->result.status.ok());
  CHECK(a->result.outcome == KeyBegin::started);
  CHECK(b->result.outcome == KeyBegin::exists);
  auto all = s->load_all();
  REQUIRE(all.size() == 1);
  CHECK(all[0].generation == 7);
  KeyRecord got;
  CHECK(s->key_get("r", "", "a", &got, nullptr));
  CHECK(got.state == KeyState::in_flight);
  // The abandoned rider's key is released by a later commit.
  bool gone = false;
  for (int i = 0; i < 200 && !gone; ++i) {
    gone = !s->key_get("r", "", "gone", &got, nullptr);
    if (!gone) std::this_thread::sleep_for(10ms);
  }
  CHECK(gone);
  // Abandoned after its batch: released at once.
  s->abandon(a);
  for (int i = 0; i < 200 && s->key_get("r", "", "a", &got, nullptr); ++i) std::this_thread::sleep_for(10ms);
  CHECK_FALSE(s->key_get("r", "", "a", &got, nullptr));
  // A failed commit fails its riders; nothing of them is kept.
  s->inject_commit_failure(true);
  auto c = rider(rec("r", "c"));
  CHECK_FALSE(advance_keyed(*s, 8, {c}).ok());
  CHECK_FALSE(c->result.status.ok());
  s->inject_commit_failure(false);
  CHECK_FALSE(s->key_get("r", "", "c", &got, nullptr));
}

TEST_CASE("idempotency store: the bytes kept for replay per resource") {
  StoreDir t;
  auto s = must_open(t.db());
  REQUIRE(begin(*s, rec("r", "k")).outcome == KeyBegin::started);
  CHECK(bytes_of(*s, "r") == 0);
  KeyRecord done = rec("r", "k");
  done.state = KeyState::completed;
  done.status = 201;
  done.headers = "Content-Type: text/plain\r\n";  // 26
  done.body = "0123456789";
  REQUIRE(settle(*s, done).ok());
  CHECK(bytes_of(*s, "r") == 36);
  REQUIRE(release(*s, "r", "k").ok());
  CHECK(bytes_of(*s, "r") == 0);
  CHECK(s->key_bytes().empty());
}

// Issue 30: a key's outcome (or release) that nobody waits for costs no commit of its own: it rides
// the next write's commit, or is committed on its own within a few milliseconds (not at the store's
// idle tick, a second later), and it is never committed after a write queued behind it.
TEST_CASE("idempotency store: an outcome nobody waits for rides the next commit, or goes soon") {
  StoreDir t;
  auto s = must_open(t.db());
  REQUIRE(begin(*s, rec("r", "a")).outcome == KeyBegin::started);
  REQUIRE(begin(*s, rec("r", "b")).outcome == KeyBegin::started);
  KeyRecord done = rec("r", "a");
  done.state = KeyState::completed;
  done.status = 201;
  done.body = "made";

  // Alone: committed on its own, soon (the store is idle: its idle tick is a second).
  const auto commits = s->commit_count();
  const auto t0 = std::chrono::steady_clock::now();
  s->key_settle(done, nullptr);
  KeyRecord got;
  // (The commit is counted just after it is visible to a reader: wait for both.)
  while (std::chrono::steady_clock::now() - t0 < 2s &&
         !(s->key_get("r", "", "a", &got, nullptr) && got.state == KeyState::completed && s->commit_count() > commits))
    std::this_thread::sleep_for(1ms);
  CHECK(got.state == KeyState::completed);
  CHECK(std::chrono::steady_clock::now() - t0 < 500ms);
  CHECK(s->commit_count() == commits + 1);

  // Followed by a write someone waits for: durable by the time that write is.
  done.key = "b";
  s->key_settle(done, nullptr);
  s->key_release("r", "", "a", nullptr);
  REQUIRE(begin(*s, rec("r", "c")).outcome == KeyBegin::started);
  REQUIRE(s->key_get("r", "", "b", &got, nullptr));
  CHECK(got.state == KeyState::completed);
  CHECK(got.status == 201);
  CHECK_FALSE(s->key_get("r", "", "a", &got, nullptr));

  // And at close: nothing queued is lost.
  done.key = "c";
  s->key_settle(done, nullptr);
  s.reset();
  auto again = must_open(t.db());
  REQUIRE(again->key_get("r", "", "c", &got, nullptr));
  CHECK(got.state == KeyState::completed);
}

// Issue 30: kThreads writers, each kEach keyed writes one after another: begin (waits for the
// key's commit), `upstream` (the answer's time), settle (rides a later commit). Returns the store
// commits they took; every key must have started.
namespace {

constexpr int kThreads = 16, kEach = 40;
std::uint64_t commits_of_writers(Store& s, const std::string& prefix, std::chrono::microseconds upstream) {
  const auto c0 = s.commit_count();
  std::vector<std::thread> ts;
  ts.reserve(kThreads);
  std::atomic<int> started{0};
  for (int w = 0; w < kThreads; ++w)
    ts.emplace_back([&, w] {
      for (int i = 0; i < kEach; ++i) {
        KeyRecord r = rec("r", prefix + std::to_string(w) + "-" + std::to_string(i));
        if (begin(s, r, 100000).outcome == KeyBegin::started) started.fetch_add(1);
        if (upstream.count() > 0) std::this_thread::sleep_for(upstream);
        r.state = KeyState::completed;
        r.status = 200;
        s.key_settle(r, nullptr);  // rides a later commit
      }
    });
  for (auto& th : ts) th.join();
  CHECK(started.load() == kThreads * kEach);
  return s.commit_count() - c0;
}

}  // namespace

// Issue 30: under load the store gathers writers into larger commits (at most 1 ms), but a lone
// writer is never held back: one after another, each write is its own commit, as before.
TEST_CASE("idempotency store: many concurrent writers share commits; a lone writer commits each write") {
  StoreDir t;
  auto s = must_open(t.db());
  const auto c0 = s->commit_count();
  for (int i = 0; i < 20; ++i) REQUIRE(begin(*s, rec("r", "solo-" + std::to_string(i))).outcome == KeyBegin::started);
  CHECK(s->commit_count() == c0 + 20);

  const auto commits = commits_of_writers(*s, "w", 0us);
  MESSAGE("commits for ", kThreads * kEach, " keyed writes of ", kThreads, " writers: ", commits);
  CHECK(commits < static_cast<std::uint64_t>(kThreads * kEach) / 4);
}

// Issue 30: a keyed write in flight upstream usually comes back as the next request's key within
// about a commit; under load the store waits for those too (at most 1 ms, and not again for a
// while after such a wait timed out). Writers that spend time upstream still share commits. (How
// many they share depends on timing: 54-79 commits here on a quiet machine, 91-97 before the
// store waited for keys in flight, 105-125 with a CI run beside it; the bench measures the gain.)
TEST_CASE("idempotency store: writers whose keys come back at once share commits with the ones in flight") {
  StoreDir t;
  auto s = must_open(t.db());
  const auto commits = commits_of_writers(*s, "back-", 200us);
  MESSAGE("commits for ", kThreads * kEach, " keyed writes of ", kThreads, " writers with 200 us upstreams: ", commits);
  CHECK(commits < static_cast<std::uint64_t>(kThreads * kEach) / 4);
}
