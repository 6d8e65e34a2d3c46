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
    queue_.push_back({{std::move(resource), generation}, std::move(done)});
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
