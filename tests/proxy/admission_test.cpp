// The fence decision as a value (proxy/admission.h): what each token, authority verdict and
// fence decision leads to, for writes and for the admin API's barriers, in both modes.
#include "proxy/admission.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "proxy/authority.h"
#include "tests/support/store_fixture.h"

using namespace fencegate::proxy;
using fencegate::config::Mode;

namespace {

// A fence over a real store, holding nothing: current() is 0 for every resource.
struct Fixture {
  fencegate::testing::StoreDir dir{"fg-admission-test"};
  std::unique_ptr<fencegate::store::Store> store = fencegate::testing::must_open(dir.db());
  Fence fence{*store, std::chrono::seconds(1), 100};
  fencegate::config::Config cfg;
  std::string resource = "orders";
  PresentedToken token;
  RequestHead head;
  std::string bytes;

  // Reads the token of a request with these extra header lines.
  void request(const std::string& fields) {
    bytes = "POST /orders HTTP/1.1\r\nHost: a\r\nUser-Agent: test\r\n" + fields + "Content-Length: 0\r\n\r\n";
    REQUIRE(scan_request_head(bytes, 8192, &head).status == HeadStatus::complete);
    read_token(head, cfg, &token);
  }
  AdmissionInput input(Mode mode, AdmissionKind kind = AdmissionKind::write) {
    AdmissionInput in;
    in.kind = kind;
    in.mode = mode;
    in.resource = &resource;
    in.token = &token;
    in.request = &head;
    in.client = "192.0.2.1";
    in.token_header = cfg.token_header;
    return in;
  }
  ~Fixture() { store->drain_and_stop(); }
};

Decision decision(Verdict v, std::int64_t current, std::int64_t newest, bool observe_stale = false) {
  Decision d;
  d.verdict = v;
  d.current = current;
  d.newest = newest;
  d.observe_stale = observe_stale;
  return d;
}

}  // namespace

TEST_CASE("admission: a valid token asks the fence; admitted at the current generation, it is forwarded") {
  Fixture f;
  f.request("Fencing-Token: 5\r\nFencing-Leader: node-a\r\n");
  REQUIRE(f.token.state == TokenState::ok);
  CHECK(f.token.generation == 5);
  CHECK(f.token.leader == "node-a");
  AdmissionInput in = f.input(Mode::enforce);
  CHECK(decide_admission(in, f.fence).step == AdmissionStep::ask_fence);
  const Decision d = decision(Verdict::admit, 5, 5);
  in.fence = &d;
  Admission a = decide_admission(in, f.fence);
  CHECK(a.step == AdmissionStep::forward);
  CHECK(a.generation == 5);
  CHECK_FALSE(a.outcome);
  CHECK_FALSE(a.audit);
  CHECK(a.observe.empty());
}

TEST_CASE("admission: a stale generation is refused with 409 and a durable audit row") {
  Fixture f;
  f.request("Fencing-Token: 5\r\nFencing-Leader: node-a\r\n");
  AdmissionInput in = f.input(Mode::enforce);
  const Decision d = decision(Verdict::stale, 7, 8);
  in.fence = &d;
  Admission a = decide_admission(in, f.fence);
  REQUIRE(a.step == AdmissionStep::refuse);
  CHECK(a.refusal.status == 409);
  CHECK(a.refusal.type == "stale-generation");
  CHECK(a.refusal.resource == "orders");
  CHECK(a.refusal.presented == 5);
  CHECK(a.refusal.current == 8);
  CHECK(a.generation == 8);  // the generation that superseded it
  CHECK(a.outcome == Outcome::rejected_stale);
  REQUIRE(a.audit);
  CHECK(a.audit_durable);
  CHECK(a.audit->decision == "rejected_stale");
  CHECK(a.audit->presented_generation == 5);
  CHECK(a.audit->current_generation == 8);
  CHECK(a.audit->mode == "enforce");
  CHECK(a.audit->leader == "node-a");
  CHECK(a.audit->client == "192.0.2.1");
  CHECK(a.audit->method == "POST");
  CHECK(a.audit->user_agent == "test");

  SUBCASE("an audit row that cannot be made durable fails closed with 503") {
    audit_failed(a, fencegate::store::Status::Error("disk full"));
    CHECK(a.step == AdmissionStep::refuse);
    CHECK(a.refusal.status == 503);
    CHECK(a.refusal.type == "store-unavailable");
    CHECK(a.refusal.detail.find("disk full") != std::string::npos);
    CHECK(a.refusal.presented == 5);
    CHECK(a.outcome == Outcome::store_error);
  }
}

TEST_CASE("admission: a missing or malformed token gets the existing refusals in enforce mode") {
  Fixture f;
  SUBCASE("missing: 428 token-required") {
    f.request("");
    CHECK(f.token.state == TokenState::missing);
    Admission a = decide_admission(f.input(Mode::enforce), f.fence);
    REQUIRE(a.step == AdmissionStep::refuse);
    CHECK(a.refusal.status == 428);
    CHECK(a.refusal.type == "token-required");
    CHECK(a.refusal.detail.find("Fencing-Token") != std::string::npos);
    CHECK_FALSE(a.refusal.presented);
    CHECK(a.refusal.current == 0);
    CHECK(a.generation == 0);
    CHECK(a.outcome == Outcome::rejected_missing);
    REQUIRE(a.audit);
    CHECK(a.audit_durable);
    CHECK(a.audit->decision == "rejected_missing");
  }
  for (const char* fields : {"Fencing-Token: 05\r\n", "Fencing-Token: -1\r\n", "Fencing-Token: x\r\n",
                             "Fencing-Token: 1\r\nFencing-Token: 2\r\n",
                             "Fencing-Token: 1\r\nFencing-Leader: a\r\nFencing-Leader: b\r\n"}) {
    CAPTURE(fields);
    f.request(fields);
    CHECK(f.token.state == TokenState::malformed);
    CHECK_FALSE(f.token.why.empty());
    Admission a = decide_admission(f.input(Mode::enforce), f.fence);
    REQUIRE(a.step == AdmissionStep::refuse);
    CHECK(a.refusal.status == 400);
    CHECK(a.refusal.type == "malformed-token");
    CHECK(a.refusal.detail == f.token.why);
    CHECK(a.outcome == Outcome::rejected_malformed);
    REQUIRE(a.audit);
    CHECK(a.audit->decision == "rejected_malformed");
  }
  SUBCASE("a leader longer than max_leader_bytes is malformed") {
    f.cfg.max_leader_bytes = 4;
    f.request("Fencing-Token: 1\r\nFencing-Leader: abcdef\r\n");
    CHECK(f.token.state == TokenState::malformed);
    CHECK(f.token.leader == clipped("abcdef", 4));
  }
  SUBCASE("observe mode forwards it, with the would-be refusal's audit row and Fencing-Observe") {
    f.request("");
    Admission a = decide_admission(f.input(Mode::observe), f.fence);
    CHECK(a.step == AdmissionStep::forward);
    CHECK(a.observe == "would_reject_missing");
    CHECK(a.outcome == Outcome::would_reject_missing);
    REQUIRE(a.audit);
    CHECK_FALSE(a.audit_durable);
    CHECK(a.audit->decision == "would_reject_missing");
    CHECK(a.audit->mode == "observe");
  }
}

TEST_CASE("admission: observe mode admits a stale write, with the would-be audit row") {
  Fixture f;
  f.request("Fencing-Token: 3\r\n");
  AdmissionInput in = f.input(Mode::observe);
  const Decision d = decision(Verdict::admit, 7, 7, true);
  in.fence = &d;
  Admission a = decide_admission(in, f.fence);
  CHECK(a.step == AdmissionStep::forward);
  CHECK(a.generation == 7);
  CHECK(a.observe == "would_reject_stale");
  CHECK(a.outcome == Outcome::would_reject_stale);
  REQUIRE(a.audit);
  CHECK_FALSE(a.audit_durable);
  CHECK(a.audit->decision == "would_reject_stale");
  CHECK(a.audit->presented_generation == 3);
  CHECK(a.audit->current_generation == 7);
  CHECK(a.audit->mode == "observe");

  SUBCASE("a barrier in observe mode is refused instead (it forwards nothing)") {
    in.kind = AdmissionKind::barrier;
    Admission b = decide_admission(in, f.fence);
    REQUIRE(b.step == AdmissionStep::refuse);
    CHECK(b.refusal.status == 409);
    CHECK(b.refusal.type == "stale-generation");
    REQUIRE(b.audit);
    CHECK(b.audit->decision == "rejected_stale");
    CHECK(b.audit->mode == "observe");
  }
}

TEST_CASE("admission: the fence's store errors and its resource cap") {
  Fixture f;
  f.request("Fencing-Token: 3\r\n");
  for (Verdict v : {Verdict::store_error, Verdict::overloaded}) {
    const Decision d = decision(v, 2, 3);
    AdmissionInput in = f.input(Mode::enforce);
    in.fence = &d;
    Admission a = decide_admission(in, f.fence);
    REQUIRE(a.step == AdmissionStep::refuse);
    CHECK(a.refusal.status == 503);
    CHECK(a.refusal.type == (v == Verdict::store_error ? "store-unavailable" : "too-many-resources"));
    CHECK_FALSE(a.audit);
    in.mode = Mode::observe;  // observe mode forwards it all the same
    Admission o = decide_admission(in, f.fence);
    CHECK(o.step == AdmissionStep::forward);
    CHECK(o.outcome == (v == Verdict::store_error ? Outcome::store_error : Outcome::too_many_resources));
  }
}

TEST_CASE("admission: a fenced_only route's write to a never-fenced resource: 409 resource-not-fenced") {
  Fixture f;
  f.request("Fencing-Token: 9223372036854775807\r\n");
  AdmissionInput in = f.input(Mode::enforce);
  CHECK(may_create_resource(in));  // on_write: today's behaviour
  in.fenced_only = true;
  CHECK_FALSE(may_create_resource(in));
  AdmissionInput barrier = f.input(Mode::enforce, AdmissionKind::barrier);
  barrier.fenced_only = true;
  CHECK(may_create_resource(barrier));  // the admin fence endpoint creates
  AuthorityCheck leads;
  leads.verdict = AuthorityVerdict::leader;
  in.authority = &leads;
  CHECK(may_create_resource(in));  // so does a generation the election authority confirms
  in.authority = nullptr;
  const Decision d = decision(Verdict::unfenced, 0, 0);
  in.fence = &d;
  Admission a = decide_admission(in, f.fence);
  REQUIRE(a.step == AdmissionStep::refuse);
  CHECK(a.refusal.status == 409);
  CHECK(a.refusal.type == "resource-not-fenced");
  CHECK(a.outcome == Outcome::rejected_unfenced_resource);
  REQUIRE(a.audit);
  CHECK(a.audit->decision == "rejected_unfenced_resource");
  CHECK(a.audit->presented_generation == 9223372036854775807LL);
  CHECK(a.audit_durable);
  // Observe: forwarded as what enforce would refuse, with its would-be row (and nothing created).
  in.mode = Mode::observe;
  Admission o = decide_admission(in, f.fence);
  CHECK(o.step == AdmissionStep::forward);
  CHECK(o.outcome == Outcome::would_reject_unfenced_resource);
  REQUIRE(o.audit);
  CHECK(o.audit->decision == "would_reject_unfenced_resource");
  CHECK(o.observe == "would_reject_unfenced_resource");
  const auto& known = fencegate::store::kAuditDecisions;
  for (std::string_view dn : {"rejected_unfenced_resource", "would_reject_unfenced_resource", "resource_deleted"})
    CHECK(std::find(known.begin(), known.end(), dn) != known.end());
}

TEST_CASE("admission: an election authority's verdict decides before the fence") {
  Fixture f;
  f.request("Fencing-Token: 4\r\n");
  AuthorityCheck ac;
  AdmissionInput in = f.input(Mode::enforce);
  in.authority = &ac;
  in.election = "orders-election";

  ac.verdict = AuthorityVerdict::leader;
  CHECK(decide_admission(in, f.fence).step == AdmissionStep::ask_fence);

  ac.verdict = AuthorityVerdict::stale;
  ac.leader = 9;
  Admission a = decide_admission(in, f.fence);
  REQUIRE(a.step == AdmissionStep::refuse);
  CHECK(a.refusal.status == 409);
  CHECK(a.refusal.type == "stale-generation");
  CHECK(a.refusal.current == 9);
  CHECK(a.refusal.detail.find("orders-election") != std::string::npos);
  REQUIRE(a.audit);
  CHECK(a.audit->decision == "rejected_stale");

  ac.verdict = AuthorityVerdict::not_leader;
  a = decide_admission(in, f.fence);
  CHECK(a.refusal.type == "not-leader");
  CHECK(a.outcome == Outcome::rejected_not_leader);

  in.kind = AdmissionKind::barrier;  // a barrier refused by its authority advanced nothing: no row
  a = decide_admission(in, f.fence);
  CHECK(a.step == AdmissionStep::refuse);
  CHECK(a.refusal.type == "not-leader");
  CHECK_FALSE(a.audit);

  ac.verdict = AuthorityVerdict::unavailable;
  ac.why = "etcd unreachable";
  a = decide_admission(in, f.fence);
  CHECK(a.refusal.status == 503);
  CHECK(a.refusal.type == "authority-unavailable");
  in.kind = AdmissionKind::write;
  in.mode = Mode::observe;  // observe: forwarded, the fence left alone
  a = decide_admission(in, f.fence);
  CHECK(a.step == AdmissionStep::forward);
  CHECK(a.generation == 0);
  CHECK_FALSE(a.audit);
}
