// The Fence's entry points for the fleet (docs/fleet.md): the membership gate, note_remote (a
// remote intent or commit acts like a write with nothing parked), abort_inflight.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <mutex>

#include "common/boot_clock.h"
#include "proxy/fence.h"

using namespace fencegate::proxy;
using fencegate::store::Status;
using namespace std::chrono_literals;

namespace {

// Advances wait until the test completes them (as in fence_test.cpp's ManualStore, trimmed).
class HeldStore final : public fencegate::store::Store {
 public:
  std::vector<fencegate::store::ResourceState> load_all(Status* status) override {
    if (status) *status = Status::OK();
    return {};
  }
  void advance(std::string resource, std::int64_t generation, std::string, Done done) override {
    std::lock_guard lk(mu_);
    queue_.emplace_back(std::make_pair(std::move(resource), generation), std::move(done));
  }
  void append_audit(fencegate::store::AuditRow, Done done) override {
    if (done) done(Status::OK());
  }
  std::vector<fencegate::store::AuditRecord> query_audit(const fencegate::store::AuditQuery&, Status*) override {
    return {};
  }
  std::vector<fencegate::store::UnfencedGroup> query_unfenced(const std::string&, std::int64_t, int, Status*) override {
    return {};
  }
  void set_retention(std::int64_t, std::uint64_t) override {}
  void set_commit_observer(CommitObserver) override {}
  std::size_t queue_depth() const override {
    std::lock_guard lk(mu_);
    return queue_.size();
  }
  std::int64_t front_generation() const {
    std::lock_guard lk(mu_);
    return queue_.empty() ? 0 : queue_.front().first.second;
  }
  void complete(bool ok = true) {
    std::pair<std::pair<std::string, std::int64_t>, Done> item;
    {
      std::lock_guard lk(mu_);
      REQUIRE(!queue_.empty());
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    item.second(ok ? Status::OK() : Status::Error("fleet-unavailable (test)"));
  }

 private:
  mutable std::mutex mu_;
  std::deque<std::pair<std::pair<std::string, std::int64_t>, Done>> queue_;
};

std::int64_t in_ns(std::chrono::milliseconds d) {
  return fencegate::BootClock::now_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

bool decide(Fence& f, std::int64_t g, InflightNode* n, Decision* d) {
  return f.admit("r", g, "", n, d, [](Decision) {});
}

}  // namespace

TEST_CASE("fence (fleet): past the membership deadline enforce writes are refused fleet_unavailable, not linked") {
  HeldStore s;
  Fence f(s, 10s, 100);
  std::atomic<std::int64_t> deadline{in_ns(60s)};
  f.set_gate(&deadline);
  InflightNode n1;
  Decision d;
  CHECK_FALSE(decide(f, 3, &n1, &d));  // an advance
  s.complete();
  CHECK(n1.resource != nullptr);
  f.release(&n1);
  InflightNode n2;
  CHECK(f.decide_now("r", 3, &n2, &d));  // the fast path while a member
  CHECK(d.verdict == Verdict::admit);
  f.release(&n2);

  deadline = in_ns(-1ms);  // lapsed
  InflightNode n3;
  CHECK_FALSE(f.decide_now("r", 3, &n3, &d));  // no fast path
  CHECK(decide(f, 3, &n3, &d));
  CHECK(d.verdict == Verdict::store_error);
  CHECK(d.fleet_unavailable);
  CHECK(n3.resource == nullptr);
  CHECK(decide(f, 2, &n3, &d));  // stale stays stale (refusing is always safe)
  CHECK(d.verdict == Verdict::stale);
  CHECK(f.stats().fleet_refused == 1);
}

TEST_CASE("fence (fleet): note_remote drains older in-flight writes, makes parked ones stale, then advances") {
  HeldStore s;
  Fence f(s, 10s, 100);
  InflightNode old;
  Decision d;
  CHECK_FALSE(decide(f, 1, &old, &d));
  s.complete();
  REQUIRE(old.resource != nullptr);

  f.note_remote("r", 4);  // another replica's intent for 4
  InflightNode n;
  CHECK(decide(f, 1, &n, &d));  // refused at once, while the drain runs
  CHECK(d.verdict == Verdict::stale);
  CHECK(s.queue_depth() == 0);  // nothing acknowledged while generation 1 is in flight here
  f.release(&old);
  REQUIRE(s.queue_depth() == 1);  // drained: the store's advance(4) acknowledges and waits
  CHECK(s.front_generation() == 4);
  s.complete(false);  // e.g. not a member: it failed
  CHECK(f.current("r") == 1);
  f.note_remote("r", 4);  // the intent is still there: tried again
  REQUIRE(s.queue_depth() == 1);
  s.complete();
  CHECK(f.current("r") == 4);
  CHECK(f.decide_now("r", 4, &n, &d));
  CHECK(d.verdict == Verdict::admit);
  f.release(&n);
  f.note_remote("r", 3);  // lower: no-op
  f.note_remote("r", 4);  // committed already: no-op
  CHECK(s.queue_depth() == 0);
}

TEST_CASE("fence (fleet): abort_inflight aborts every in-flight enforce write once") {
  HeldStore s;
  Fence f(s, 10s, 100);
  InflightNode a, b;
  int aborts = 0;
  a.abort = b.abort = [&] { ++aborts; };
  Decision d;
  CHECK_FALSE(decide(f, 2, &a, &d));
  s.complete();
  CHECK(f.decide_now("r", 2, &b, &d));
  CHECK(f.abort_inflight() == 2);
  CHECK(aborts == 2);
  CHECK(f.abort_inflight() == 0);  // already aborted
  f.release(&a);
  f.release(&b);
}

// Issue 33: the fast acknowledgement's entry points.
TEST_CASE(
    "fence (fleet): note_intent with nothing in flight raises seen at once, no advance; with a write in flight "
    "it is note_remote") {
  HeldStore s;
  Fence f(s, 10s, 100);
  InflightNode n;
  Decision d;
  CHECK_FALSE(decide(f, 1, &n, &d));
  s.complete();
  REQUIRE(n.resource != nullptr);
  f.release(&n);

  CHECK(f.note_intent("r", 4));  // nothing in flight: the caller may acknowledge 4 now
  CHECK(s.queue_depth() == 0);   // no advance started, nothing to drain
  CHECK(decide(f, 1, &n, &d));   // below 4: refused from now on
  CHECK(d.verdict == Verdict::stale);
  CHECK(f.current("r") == 1);    // not committed yet
  CHECK_FALSE(f.note_intent("r", 3));  // lower: no effect
  CHECK(f.note_intent("r", 4));        // the same again (a retry): still true
  // A write of 4 here parks and starts the slow path (it waits for the commit, or takes over).
  InflightNode w4;
  CHECK_FALSE(decide(f, 4, &w4, &d));
  REQUIRE(s.queue_depth() == 1);
  CHECK(s.front_generation() == 4);
  CHECK_FALSE(f.note_intent("r", 5));  // an advance is under way: slow path, seen raised
  CHECK(decide(f, 4, &n, &d));
  CHECK(d.verdict == Verdict::stale);
  s.complete();  // 4 committed; 5 follows
  REQUIRE(s.queue_depth() == 1);
  CHECK(s.front_generation() == 5);
  s.complete();
  CHECK(f.current("r") == 5);

  // A write in flight: no fast acknowledgement; the drain runs first, then the store's advance.
  InflightNode busy;
  CHECK(f.decide_now("r", 5, &busy, &d));
  REQUIRE(d.verdict == Verdict::admit);
  CHECK_FALSE(f.note_intent("r", 6));
  CHECK(decide(f, 5, &n, &d));
  CHECK(d.verdict == Verdict::stale);
  CHECK(s.queue_depth() == 0);
  f.release(&busy);
  REQUIRE(s.queue_depth() == 1);
  CHECK(s.front_generation() == 6);
  s.complete();
  CHECK(f.current("r") == 6);
}

TEST_CASE("fence (fleet): note_committed takes a commit at once when nothing is in the way, else as note_remote") {
  HeldStore s;
  Fence f(s, 10s, 100);
  Decision d;
  CHECK(f.note_intent("r", 2));
  CHECK(f.note_committed("r", 2));  // the commit of the acknowledged intent: stored at once
  CHECK(s.queue_depth() == 0);
  CHECK(f.current("r") == 2);
  InflightNode n;
  CHECK(f.decide_now("r", 2, &n, &d));
  CHECK(d.verdict == Verdict::admit);
  CHECK_FALSE(f.note_committed("r", 2));  // old news

  // A write in flight: the commit of 3 drains it first (slow path), then reads it through the store.
  CHECK_FALSE(f.note_committed("r", 3));
  InflightNode m;
  CHECK(decide(f, 2, &m, &d));
  CHECK(d.verdict == Verdict::stale);
  CHECK(s.queue_depth() == 0);
  f.release(&n);
  REQUIRE(s.queue_depth() == 1);
  s.complete();
  CHECK(f.current("r") == 3);
  CHECK(f.note_committed("r", 5));  // straight to a higher committed generation
  CHECK(f.current("r") == 5);
  CHECK(f.stats().advances == 3);  // 2 and 5 taken at once, 3 through the store
}
