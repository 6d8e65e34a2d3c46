// The history checker must be able to fail: hand-made histories, each violating one property,
// are caught under that property's name, and the legitimate indeterminate cases (no response,
// 504 after a drain abort, a peer-aborted exchange noticed late) are not reported.
#include "tests/fault/history.h"

#include <doctest/doctest.h>

using namespace fencegate::fault;
using namespace std::chrono_literals;

namespace {

const Clock::time_point T0 = Clock::time_point{} + 1000s;
Clock::time_point at(int ms) { return T0 + std::chrono::milliseconds(ms); }

ClientOp client(std::string id, std::int64_t gen, int status, int sent, int done, std::string res = "a") {
  ClientOp c;
  c.op_id = std::move(id);
  c.resource = std::move(res);
  c.generation = gen;
  c.status = status;
  c.sent = at(sent);
  c.done = at(done);
  c.leader = "L" + std::to_string(gen);
  return c;
}

UpstreamOp up(std::string id, std::int64_t gen, int arrival, int completion, std::string outcome = "responded",
              std::string res = "a") {
  return UpstreamOp{std::move(id), std::move(res), gen, at(arrival), at(completion), std::move(outcome)};
}

AuditFact row(std::string id, std::string decision, std::int64_t presented, std::int64_t current,
              std::string res = "a") {
  return AuditFact{std::move(id), std::move(res), std::move(decision), presented, current};
}

// A history that satisfies every property: gen 1 and 2 forwarded in order, a stale gen 1 rejected
// and audited, a missing token rejected and audited, stored generation sampled at 2.
History good() {
  History h;
  h.client = {client("o1", 1, 200, 0, 20), client("o2", 2, 200, 30, 60), client("o3", 1, 409, 70, 75)};
  ClientOp none = client("o4", 0, 428, 80, 85);
  none.token = Token::missing;
  h.client.push_back(none);
  h.upstream = {up("o1", 1, 5, 15), up("o2", 2, 40, 55)};
  h.audit = {row("o3", "rejected_stale", 1, 2), row("o4", "rejected_missing", 0, 2)};
  h.stored = {StoredSample{"a", 2, 1, at(100)}};
  return h;
}

bool has(const std::vector<Violation>& v, const std::string& property) {
  for (const auto& x : v)
    if (x.property == property) return true;
  return false;
}

}  // namespace

TEST_SUITE("history checker") {

TEST_CASE("history checker: a history that keeps the contract has no violations") {
  auto v = check(good());
  INFO(describe(v));
  CHECK(v.empty());
}

TEST_CASE("history checker: op targets round-trip") {
  std::string r, id;
  CHECK(parse_op_target(op_target("res-1", "s3-c2-17"), &r, &id));
  CHECK(r == "res-1");
  CHECK(id == "s3-c2-17");
  CHECK_FALSE(parse_op_target("/other/x", &r, &id));
  CHECK_FALSE(parse_op_target("/r/a/", &r, &id));
}

TEST_CASE("history checker: 1-order: a lower generation arriving after a higher one") {
  History h = good();
  h.client.push_back(client("o5", 1, 200, 90, 99));
  h.upstream.push_back(up("o5", 1, 95, 97));  // gen 1 after gen 2
  auto v = check(h);
  INFO(describe(v));
  REQUIRE(has(v, "1-order"));
  CHECK(describe(v).find("o5") != std::string::npos);
  CHECK(describe(v).find("o2") != std::string::npos);  // the higher generation it came after
}

TEST_CASE("history checker: 2-overlap: a lower generation's exchange still running when a higher one starts") {
  History h = good();
  h.upstream[0] = up("o1", 1, 5, 45);  // completes after gen 2 arrived at 40
  auto v = check(h);
  INFO(describe(v));
  CHECK(has(v, "2-overlap"));
  CHECK_FALSE(has(v, "1-order"));

  SUBCASE("a hanging (pending) lower exchange overlaps everything after it") {
    h.upstream[0] = up("o1", 1, 5, 0, "pending");
    h.client[0].status = 0;
    CHECK(has(check(h), "2-overlap"));
  }
  SUBCASE("a peer abort noticed a little late is within the slack") {
    h.upstream[0] = up("o1", 1, 5, 45, "aborted_by_peer");  // noticed 5 ms after gen 2 arrived
    h.client[0].status = 504;
    auto v2 = check(h);
    INFO(describe(v2));
    CHECK(v2.empty());
  }
  SUBCASE("but not a peer abort noticed long after") {
    h.upstream[0] = up("o1", 1, 5, 900, "aborted_by_peer");
    h.client[0].status = 504;
    CHECK(has(check(h), "2-overlap"));
  }
  SUBCASE("equal generations may overlap") {
    h.upstream[1].generation = 1;
    h.client[1].generation = 1;
    h.stored[0].generation = 1;
    auto v2 = check(h);
    INFO(describe(v2));
    CHECK_FALSE(has(v2, "2-overlap"));
  }
}

TEST_CASE("history checker: 3-match: invented, duplicated, lost, altered and rejected-but-forwarded requests") {
  SUBCASE("the upstream received a request no client sent") {
    History h = good();
    h.upstream.push_back(up("ghost", 2, 80, 85));
    CHECK(has(check(h), "3-match"));
  }
  SUBCASE("one client request reached the upstream twice") {
    History h = good();
    h.upstream.push_back(up("o2", 2, 57, 58));
    CHECK(has(check(h), "3-match"));
  }
  SUBCASE("a 2xx the upstream never produced") {
    History h = good();
    h.upstream.erase(h.upstream.begin() + 1);
    CHECK(has(check(h), "3-match"));
  }
  SUBCASE("the upstream saw another generation than the client sent") {
    History h = good();
    h.upstream[1].generation = 3;
    h.stored[0].generation = 3;
    CHECK(has(check(h), "3-match"));
  }
  SUBCASE("a 409 that reached the upstream") {
    History h = good();
    h.client[1].status = 409;
    h.audit.push_back(row("o2", "rejected_stale", 2, 3));
    CHECK(has(check(h), "3-match"));
  }
  SUBCASE("a tokenless write forwarded") {
    History h = good();
    h.client[3].status = 200;
    h.audit.pop_back();
    h.upstream.push_back(up("o4", 0, 81, 84));
    CHECK(has(check(h), "3-match"));
  }
  SUBCASE("no response: reaching the upstream or not are both allowed") {
    History h = good();
    h.client[1].status = 0;
    h.client[1].error = "reset";
    CHECK(check(h).empty());
    h.upstream.erase(h.upstream.begin() + 1);
    h.stored[0].generation = 2;  // the advance may be durable even if the write never went out
    CHECK(check(h).empty());
  }
}

TEST_CASE("history checker: 4-audit: a rejection without its audit row, or audited and forwarded") {
  SUBCASE("409 without an audit row") {
    History h = good();
    h.audit.erase(h.audit.begin());
    auto v = check(h);
    INFO(describe(v));
    REQUIRE(has(v, "4-audit"));
    CHECK(describe(v).find("o3") != std::string::npos);
  }
  SUBCASE("409 whose audit row has another presented generation") {
    History h = good();
    h.audit[0].presented = 7;
    CHECK(has(check(h), "4-audit"));
  }
  SUBCASE("428 audited under the wrong decision") {
    History h = good();
    h.audit[1].decision = "rejected_malformed";
    CHECK(has(check(h), "4-audit"));
  }
  SUBCASE("400 for a malformed token without a row") {
    History h = good();
    ClientOp bad = client("o6", 0, 400, 90, 91);
    bad.token = Token::malformed;
    h.client.push_back(bad);
    CHECK(has(check(h), "4-audit"));
    h.audit.push_back(row("o6", "rejected_malformed", 0, 2));
    CHECK(check(h).empty());
  }
  SUBCASE("a write audited as rejected that was forwarded") {
    History h = good();
    h.audit.push_back(row("o2", "rejected_stale", 2, 3));
    CHECK(has(check(h), "4-audit"));
  }
  SUBCASE("an audit row for an op nobody sent") {
    History h = good();
    h.audit.push_back(row("ghost", "rejected_stale", 1, 2));
    CHECK(has(check(h), "4-audit"));
  }
  SUBCASE("a client without a response may or may not have its row") {
    History h = good();
    h.client[2].status = 0;
    CHECK(check(h).empty());
    h.audit.erase(h.audit.begin());
    CHECK(check(h).empty());
  }
}

TEST_CASE("history checker: 5-stored: the stored generation decreased, or is below a forwarded one") {
  SUBCASE("decreased across a restart") {
    History h = good();
    h.stored.push_back(StoredSample{"a", 1, 2, at(200)});
    auto v = check(h);
    INFO(describe(v));
    CHECK(has(v, "5-stored"));
  }
  SUBCASE("below a generation the upstream had already received") {
    History h = good();
    h.stored[0].generation = 1;
    auto v = check(h);
    INFO(describe(v));
    CHECK(has(v, "5-stored"));
  }
  SUBCASE("a sample taken before the write arrived may be lower") {
    History h = good();
    h.stored.insert(h.stored.begin(), StoredSample{"a", 1, 0, at(35)});
    CHECK(check(h).empty());
  }
}

TEST_CASE("history checker: properties are per resource") {
  History h = good();
  // Resource b runs its own generations: gen 1 after resource a's gen 2 is fine.
  h.client.push_back(client("b1", 1, 200, 90, 99, "b"));
  h.upstream.push_back(up("b1", 1, 95, 97, "responded", "b"));
  h.stored.push_back(StoredSample{"b", 1, 1, at(120)});
  auto v = check(h);
  INFO(describe(v));
  CHECK(v.empty());
}

TEST_CASE("history checker: a trace names only the ops involved and the faults meanwhile, and reports are capped") {
  History h = good();
  h.upstream[0] = up("o1", 1, 5, 45);
  h.events = {Event{at(10), "SIGSTOP fencegate"}, Event{at(500), "kill -9 fencegate"}};
  auto v = check(h);
  REQUIRE(v.size() == 1);
  const auto& t = v[0].trace;
  INFO(t);
  CHECK(t.find("o1") != std::string::npos);
  CHECK(t.find("o2") != std::string::npos);
  CHECK(t.find("o3") == std::string::npos);
  CHECK(t.find("SIGSTOP fencegate") != std::string::npos);
  CHECK(t.find("kill -9") == std::string::npos);  // outside the ops' time span

  History many = good();
  for (int i = 0; i < 10; ++i) many.upstream.push_back(up("ghost" + std::to_string(i), 2, 80 + i, 81 + i));
  Options o;
  o.max_per_kind = 2;
  auto vm = check(many, o);
  CHECK(vm.size() == 3);  // two reported, one "... and 8 more"
  CHECK(describe(vm).find("8 more") != std::string::npos);
}

}  // TEST_SUITE
