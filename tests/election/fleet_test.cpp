// Fleet (docs/fleet.md, issue 33) end to end: a real etcd (one member), three `fencegate serve`
// replicas with "fleet" in their config, one recording upstream. Checks guarantees 1-5 at the
// upstream's own record.
#include <doctest/doctest.h>

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <thread>
#include <nlohmann/json.hpp>

#include "fence_store/store.h"
#include "tests/election/fleet_harness.h"
#include "tests/support/http_client.h"
#include "tests/support/upstream.h"

using namespace fencegate::testing;
using fencegate::election::Client;
using fencegate::election::KeyValue;
using json = nlohmann::json;

namespace {

constexpr int kTtlMs = kFleetTtlMs;

Replica& rs_at(std::int64_t g, Replica& a, Replica& b, Replica& c) { return g % 3 == 0 ? a : g % 3 == 1 ? b : c; }

std::string problem_type(const ReadResult& r) {
  json j = json::parse(r.response.body, nullptr, false);
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "";
}

// Tokens of the requests the upstream received, in order of receipt.
std::vector<std::int64_t> tokens(const RecordingUpstream& up) {
  std::vector<std::int64_t> out;
  for (const auto& r : up.requests()) out.push_back(r.fencing_token().value_or(-1));
  return out;
}

// Guarantee 3 at the upstream: no request of a lower generation arrives after one of a higher.
void check_monotonic(const RecordingUpstream& up) {
  std::int64_t high = 0;
  for (const auto& r : up.requests()) {
    const std::int64_t g = r.fencing_token().value_or(0);
    CHECK_MESSAGE(g >= high, "generation ", g, " reached the upstream after generation ", high);
    high = std::max(high, g);
  }
}

std::int64_t etcd_fence(const EtcdServer& etcd, const std::string& fleet) {
  Client c(client_options(etcd));
  std::vector<KeyValue> kvs;
  if (!c.range("fencegate/fleet/" + fleet + "/fence/ledger", "", &kvs).ok() || kvs.empty()) return 0;
  return std::stoll(kvs[0].value.substr(0, 20));
}

}  // namespace

TEST_CASE("fleet: a newer generation at one replica is the fence of all three, committed once in etcd") {
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  RecordingUpstream up;
  Replica a(etcd, up.url(), "f1", "a"), b(etcd, up.url(), "f1", "b"), c(etcd, up.url(), "f1", "c");
  REQUIRE_MESSAGE(a.start(), a.log());
  REQUIRE_MESSAGE(b.start(), b.log());
  REQUIRE_MESSAGE(c.start(), c.log());

  auto r = a.write(1);
  REQUIRE_MESSAGE(r.code() == 200, describe(r), a.log());
  CHECK(etcd_fence(etcd, "f1") == 1);
  r = b.write(2);
  REQUIRE_MESSAGE(r.code() == 200, describe(r), b.log());
  CHECK(etcd_fence(etcd, "f1") == 2);
  // Guarantee 1: at once, at every replica (the commit waited for their acknowledgements).
  for (Replica* x : {&a, &b, &c}) {
    auto s = x->write(1);
    CHECK_MESSAGE(s.code() == 409, describe(s));
    CHECK(problem_type(s).find("stale-generation") != std::string::npos);
  }
  // Audit rows carry the replica's member id: in /v1/audit and in `fencegate audit --json`.
  for (Replica* x : {&a, &b, &c}) {
    const std::string id = x == &a ? "a" : x == &b ? "b" : "c";
    REQUIRE(eventually(
        [&] { return x->admin("/v1/audit?decision=rejected_stale").response.body.find("rows") != std::string::npos; },
        5s));
    json rows = json::parse(x->admin("/v1/audit?decision=rejected_stale").response.body, nullptr, false);
    REQUIRE(rows.is_object());
    REQUIRE(rows["rows"].size() == 1);
    CHECK(rows["rows"][0]["member"] == id);
    auto cli = run_command({kFencegate, "audit", "--db", x->db(), "--json", "--decision", "rejected_stale"}, 20s);
    CHECK(cli.code() == 0);
    json line = json::parse(cli.out, nullptr, false);
    REQUIRE_MESSAGE(line.is_object(), cli.out, cli.err);
    CHECK(line["member"] == id);
  }
  // Guarantee 5: the current generation at A and C without an advance of their own.
  const double a_adv = a.metric("fencegate_fleet_advance_seconds_count");
  const double c_adv = c.metric("fencegate_fleet_advance_seconds_count");
  CHECK(a.write(2).code() == 200);
  CHECK(c.write(2).code() == 200);
  CHECK(a.metric("fencegate_fleet_advance_seconds_count") == a_adv);
  CHECK(c.metric("fencegate_fleet_advance_seconds_count") == c_adv);
  CHECK(b.metric("fencegate_fleet_advance_seconds_count") == 1);
  CHECK(a.metric("fencegate_fleet_member") == 1);
  // C had nothing in flight: it acknowledged the intents straight from its watch (issue 33).
  CHECK(c.metric("fencegate_fleet_fast_acks_total") >= 1);
  // A and B each knew from their intent's own read and their watch that the others had
  // acknowledged: their commits made no read of acks/ (docs/fleet.md, step 5).
  CHECK(a.metric("fencegate_fleet_commits_total{path=\"watch\"}") == 1);
  CHECK(b.metric("fencegate_fleet_commits_total{path=\"watch\"}") == 1);
  CHECK(b.metric("fencegate_fleet_commits_total{path=\"read\"}") == 0);
  CHECK(tokens(up) == std::vector<std::int64_t>{1, 2, 2, 2});
  check_monotonic(up);

  // GET /v1/fleet (its members list follows members/ through the watch)
  ReadResult f;
  CHECK(eventually(
      [&] {
        f = a.admin("/v1/fleet");
        return f.code() == 200 && json::parse(f.response.body, nullptr, false)["members"].size() == 3;
      },
      3s));
  REQUIRE(f.code() == 200);
  json j = json::parse(f.response.body, nullptr, false);
  REQUIRE(j.is_object());
  CHECK(j["name"] == "f1");
  CHECK(j["member"] == "a");
  CHECK(j["state"] == "member");
  REQUIRE(j["members"].is_array());
  CHECK(j["members"].size() == 3);
  for (const auto& m : j["members"]) {
    CHECK(m["lease_ttl_ms"] == kTtlMs);
    CHECK(m["last_seen"].is_string());
  }

  // Guarantee 5's watch: the others learn an intent from etcd's watch stream and acknowledge at
  // once, not at their next renewal round (every ttl/3 = 667 ms): the median of five advances
  // stays well under that.
  std::vector<std::int64_t> ms;
  for (std::int64_t g = 3; g <= 7; ++g) {
    const auto t0 = Clock::now();
    CHECK(rs_at(g, a, b, c).write(g).code() == 200);
    ms.push_back(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  INFO("advance times (ms), sorted: ", ms[0], " ", ms[1], " ", ms[2], " ", ms[3], " ", ms[4]);
  CHECK(ms[2] < 250);

  // Each replica's SQLite file keeps a copy of the committed generations (etcd holds the fence;
  // the copy is written within Fleet::kLocalCopyEvery, not at each advance), and a graceful stop
  // writes what it had not yet.
  auto local_generation = [](const Replica& x) -> std::int64_t {
    std::string err;
    auto s = fencegate::store::Store::open_readonly(x.db(), &err);
    if (!s) return -1;
    for (const auto& st : s->load_all())
      if (st.resource == "ledger") return st.generation;
    return 0;
  };
  for (Replica* x : {&a, &b, &c})
    CHECK_MESSAGE(eventually([&] { return local_generation(*x) == 7; }, 5s), "local copy: ", local_generation(*x));
  REQUIRE(a.write(8).code() == 200);
  CHECK(a.stop() == 0);
  CHECK(local_generation(a) == 8);
}

TEST_CASE("fleet: an advance at one replica waits for an older write in flight at another (drain across replicas)") {
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  RecordingUpstream up([](const RecordedRequest& rq) {
    return rq.fencing_token() == 1 ? UpstreamAction::delayed(1500) : UpstreamAction::respond();
  });
  Replica a(etcd, up.url(), "f2", "a"), b(etcd, up.url(), "f2", "b");
  REQUIRE_MESSAGE(a.start(), a.log());
  REQUIRE_MESSAGE(b.start(), b.log());
  REQUIRE(a.write(1).code() == 200);  // the fence at 1 (1.5 s)
  auto slow = std::async(std::launch::async, [&] { return a.write(1); });
  REQUIRE(up.wait_for_count(2, 10s));  // A's second g=1 write is upstream, its answer delayed
  auto r = b.write(2);
  CHECK_MESSAGE(r.code() == 200, describe(r), b.log());
  CHECK(slow.get().code() == 200);  // finished within drain_timeout: not aborted
  auto reqs = up.requests();
  REQUIRE(reqs.size() == 3);
  CHECK(reqs[2].fencing_token() == 2);
  // B's write arrived only after A's g=1 exchange had ended.
  CHECK(reqs[1].outcome == Outcome::responded);
  CHECK(reqs[2].arrival >= reqs[1].completion);
  check_monotonic(up);
}

TEST_CASE(
    "fleet: a replica SIGSTOPped past its TTL with an older write in flight blocks nobody and lets nothing old "
    "through") {
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  RecordingUpstream up([](const RecordedRequest& rq) {
    return rq.fencing_token() == 1 && rq.target == "/ledger/hang" ? UpstreamAction::hang() : UpstreamAction::respond();
  });
  Replica a(etcd, up.url(), "f3", "a"), b(etcd, up.url(), "f3", "b"), c(etcd, up.url(), "f3", "c");
  REQUIRE_MESSAGE(a.start(), a.log());
  REQUIRE_MESSAGE(b.start(), b.log());
  REQUIRE_MESSAGE(c.start(), c.log());
  REQUIRE(a.write(1).code() == 200);
  auto held = std::async(std::launch::async, [&] {
    return request(a.port(), "POST", "/ledger/hang", {{"Fencing-Token", "1"}}, "{}", 30s);
  });
  REQUIRE(up.wait_for_count(2, 10s));
  a.signal(SIGSTOP);
  const auto t0 = Clock::now();
  auto r = b.write(2, 20s);
  const auto took = Clock::now() - t0;
  CHECK_MESSAGE(r.code() == 200, describe(r), b.log());
  // Without A's acknowledgement: once its lease expired (TTL + etcd's lease check granularity).
  CHECK(took < std::chrono::milliseconds(kTtlMs + 3000));
  CHECK(b.metric("fencegate_fleet_acks_waited_total") >= 1);
  a.signal(SIGCONT);
  // The held exchange is aborted (A is no member when it resumes), never completed after g=2.
  auto h = held.get();
  CHECK(h.code() != 200);
  // A serves again once it is a member, with the fleet's fence: g=1 refused, g=2 admitted.
  CHECK(eventually([&] { return a.admin("/readyz").code() == 200; }, 15s));
  CHECK(a.write(1).code() == 409);
  CHECK(a.write(2).code() == 200);
  CHECK(a.metric("fencegate_fleet_unavailable_total") >= 1);
  check_monotonic(up);
  // Only the first g=1 write, the held one (received before A stopped) and the g=2 writes.
  CHECK(tokens(up) == std::vector<std::int64_t>{1, 1, 2, 2});
}

TEST_CASE("fleet: with etcd unreachable a replica answers 503 fleet-unavailable within its TTL, then serves again") {
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  RecordingUpstream up;
  Replica a(etcd, up.url(), "f4", "a");
  REQUIRE_MESSAGE(a.start(), a.log());
  REQUIRE(a.write(3).code() == 200);
  etcd.pause();
  const auto t0 = Clock::now();
  CHECK(eventually([&] { return a.admin("/readyz").code() == 503; }, std::chrono::milliseconds(kTtlMs + 2000)));
  CHECK(Clock::now() - t0 < std::chrono::milliseconds(kTtlMs + 500));
  auto r = a.write(3);
  CHECK(r.code() == 503);
  CHECK(problem_type(r).find("fleet-unavailable") != std::string::npos);
  auto f = a.admin("/v1/fleet");
  CHECK(json::parse(f.response.body, nullptr, false)["state"] == "unavailable");
  CHECK(a.metric("fencegate_fleet_member") == 0);
  etcd.resume();
  CHECK_MESSAGE(eventually([&] { return a.admin("/readyz").code() == 200; }, 15s), a.log());
  CHECK(a.write(3).code() == 200);
  CHECK(a.write(2).code() == 409);
  CHECK(tokens(up) == std::vector<std::int64_t>{3, 3});
}

TEST_CASE("fleet: a replica killed -9 with an older write in flight blocks an advance at most about its TTL") {
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  RecordingUpstream up([](const RecordedRequest& rq) {
    return rq.target == "/ledger/hang" ? UpstreamAction::hang() : UpstreamAction::respond();
  });
  Replica a(etcd, up.url(), "f5", "a"), b(etcd, up.url(), "f5", "b");
  REQUIRE_MESSAGE(a.start(), a.log());
  REQUIRE_MESSAGE(b.start(), b.log());
  REQUIRE(a.write(1).code() == 200);
  auto held = std::async(std::launch::async, [&] {
    return request(a.port(), "POST", "/ledger/hang", {{"Fencing-Token", "1"}}, "{}", 20s);
  });
  REQUIRE(up.wait_for_count(2, 10s));
  a.signal(SIGKILL);
  const auto t0 = Clock::now();
  auto r = b.write(2, 20s);
  CHECK_MESSAGE(r.code() == 200, describe(r), b.log());
  CHECK(Clock::now() - t0 < std::chrono::milliseconds(kTtlMs + 3000));
  CHECK(b.write(1).code() == 409);
  (void)held.get();
  check_monotonic(up);
  CHECK(etcd_fence(etcd, "f5") == 2);
}

TEST_CASE("fleet: the advancing replica killed after its intent: nothing of it forwarded, the fleet completes it") {
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  RecordingUpstream up([](const RecordedRequest& rq) {
    return rq.target == "/ledger/hang" ? UpstreamAction::hang() : UpstreamAction::respond();
  });
  Replica a(etcd, up.url(), "f6", "a"), b(etcd, up.url(), "f6", "b"), c(etcd, up.url(), "f6", "c");
  REQUIRE_MESSAGE(a.start(), a.log());
  REQUIRE_MESSAGE(b.start(), b.log());
  REQUIRE_MESSAGE(c.start(), c.log());
  REQUIRE(a.write(1).code() == 200);
  // A holds a g=1 write upstream and is paused: B's advance to 2 puts its intent and waits.
  auto held = std::async(std::launch::async, [&] {
    return request(a.port(), "POST", "/ledger/hang", {{"Fencing-Token", "1"}}, "{}", 30s);
  });
  REQUIRE(up.wait_for_count(2, 10s));
  a.signal(SIGSTOP);
  auto bw = std::async(std::launch::async, [&] { return b.write(2, 20s); });
  Client cl(client_options(etcd));
  REQUIRE(eventually(
      [&] {
        std::vector<KeyValue> kvs;
        return cl.range("fencegate/fleet/f6/intent/ledger", "", &kvs).ok() && !kvs.empty();
      },
      5s));
  // ... and C has acknowledged it (C reads intents by polling: until then it may still admit g=1,
  // which the intent's commit would have to wait for).
  REQUIRE(eventually(
      [&] {
        std::vector<KeyValue> kvs;
        return cl.range("fencegate/fleet/f6/acks/ledger/00000000000000000002/c", "", &kvs).ok() && !kvs.empty();
      },
      5s));
  b.signal(SIGKILL);  // the advancer dies after its intent, before its commit
  CHECK(bw.get().code() != 200);
  CHECK(etcd_fence(etcd, "f6") == 1);
  // C saw the intent: it refuses g=1 (as a single sidecar keeps a generation it has seen).
  CHECK(c.write(1).code() == 409);
  // A write of 2 at C completes the advance once B's intent and A's membership have gone.
  auto r = c.write(2, 20s);
  CHECK_MESSAGE(r.code() == 200, describe(r), c.log());
  CHECK(etcd_fence(etcd, "f6") == 2);
  a.signal(SIGCONT);
  (void)held.get();
  CHECK(eventually([&] { return a.admin("/readyz").code() == 200; }, 15s));
  CHECK(a.write(1).code() == 409);
  check_monotonic(up);
  CHECK(tokens(up) == std::vector<std::int64_t>{1, 1, 2});
}

TEST_CASE(
    "fleet: on a three-member etcd, the etcd leader killed and a member restarted: no stale write, no reordering") {
  EtcdCluster etcd;
  REQUIRE_MESSAGE(etcd.start(), etcd.log(0));
  RecordingUpstream up;
  Replica a(etcd.urls(), up.url(), "f7", "a"), b(etcd.urls(), up.url(), "f7", "b"), c(etcd.urls(), up.url(), "f7", "c");
  REQUIRE_MESSAGE(a.start(), a.log());
  REQUIRE_MESSAGE(b.start(), b.log());
  REQUIRE_MESSAGE(c.start(), c.log());
  Replica* rs[] = {&a, &b, &c};
  int stale_admitted = 0;
  int killed = -1;
  for (std::int64_t g = 1; g <= 6; ++g) {
    if (g == 3) {  // the etcd leader dies
      killed = etcd.leader();
      REQUIRE(killed >= 0);
      etcd.kill9(killed);
    }
    if (g == 5) {  // and comes back with its data
      etcd.start_member(killed, false);
      CHECK(etcd.healthy(20s));
    }
    Replica& at = *rs[g % 3];
    // 503 (fleet-unavailable while a lapse lasts) may come; retry until admitted.
    CHECK_MESSAGE(eventually([&] { return at.write(g, 10s).code() == 200; }, 30s), at.log());
    for (Replica* x : rs) {
      auto s = x->write(g - 1, 10s);
      if (g > 1 && s.code() == 200) ++stale_admitted;
      if (g > 1) CHECK_MESSAGE((s.code() == 409 || s.code() == 503), describe(s));
    }
  }
  CHECK(stale_admitted == 0);
  check_monotonic(up);
  std::vector<std::int64_t> got = tokens(up);
  CHECK(got == std::vector<std::int64_t>{1, 2, 3, 4, 5, 6});
}

TEST_CASE(
    "fleet: concurrent writers of several generations spread over three replicas: the upstream never sees a generation "
    "go back") {
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  RecordingUpstream up([](const RecordedRequest&) { return UpstreamAction::delayed(20); });
  Replica a(etcd, up.url(), "f8", "a"), b(etcd, up.url(), "f8", "b"), c(etcd, up.url(), "f8", "c");
  REQUIRE_MESSAGE(a.start(), a.log());
  REQUIRE_MESSAGE(b.start(), b.log());
  REQUIRE_MESSAGE(c.start(), c.log());
  Replica* rs[] = {&a, &b, &c};
  std::atomic<int> ok{0}, refused{0}, other{0};
  std::vector<std::thread> writers;
  writers.reserve(3);
  for (int t = 0; t < 3; ++t) {
    writers.emplace_back([&, t] {
      std::uint32_t seed = 7919u * static_cast<std::uint32_t>(t + 1);
      for (int i = 0; i < 12; ++i) {
        seed = seed * 1103515245u + 12345u;
        // Generations rise over time with some older ones mixed in (a writer that lags).
        const std::int64_t g = 1 + i / 2 + static_cast<std::int64_t>((seed >> 16) % 3);
        const int code = rs[(seed >> 8) % 3]->write(g).code();
        (code == 200 ? ok : code == 409 ? refused : other)++;
      }
    });
  }
  for (auto& w : writers) w.join();
  CHECK(ok > 0);
  CHECK(other == 0);  // no 503 or 504 with every replica healthy and the drain timeout far away
  check_monotonic(up);
  // Every generation that reached the upstream is at most the fence etcd holds now.
  const std::int64_t fence = etcd_fence(etcd, "f8");
  for (std::int64_t g : tokens(up)) CHECK(g <= fence);
  INFO("admitted ", ok.load(), ", refused ", refused.load());
}

// Issue 33: the admin API's fence endpoint, `fencegate elect --fence` naming any replica, and observe
// mode work in a fleet as on one sidecar.
TEST_CASE("fleet: the fence endpoint and elect --fence at one replica fence all three; observe mode refuses nothing") {
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  RecordingUpstream up;
  const json routes =
      json::array({{{"prefix", "/shadow"}, {"upstream", up.url()}, {"resource", "shadow"}, {"mode", "observe"}},
                   {{"prefix", "/"}, {"upstream", up.url()}, {"resource", "ledger"}, {"mode", "enforce"}}});
  const json extra = {{"drain_timeout_ms", 8000}};
  Replica a({etcd.url()}, "f9", "a", routes, extra), b({etcd.url()}, "f9", "b", routes, extra),
      c({etcd.url()}, "f9", "c", routes, extra);
  REQUIRE_MESSAGE(a.start(), a.log());
  REQUIRE_MESSAGE(b.start(), b.log());
  REQUIRE_MESSAGE(c.start(), c.log());

  // The activation barrier's call at A: the generation is committed in etcd, nothing is forwarded,
  // and B and C refuse anything older at once.
  auto f = request(a.admin_port(), "POST", "/v1/resources/ledger/fence", {{"Fencing-Token", "5"}},
                   json{{"generation", 5}, {"leader", "worker-a"}}.dump(), 15s);
  REQUIRE_MESSAGE(f.code() == 200, describe(f), a.log());
  CHECK(json::parse(f.response.body, nullptr, false).value("generation", 0) == 5);
  CHECK(etcd_fence(etcd, "f9") == 5);
  CHECK(up.requests().empty());
  for (Replica* x : {&b, &c}) {
    auto s = x->write(4);
    CHECK_MESSAGE(s.code() == 409, describe(s));
    CHECK(problem_type(s).find("stale-generation") != std::string::npos);
  }
  CHECK(c.write(5).code() == 200);

  // fencegate elect: wins the election, fences the ledger through replica B (any replica), then
  // runs its command, which writes with its token through replica C.
  auto e = run_command({kFencegate, "elect", "--etcd", etcd.url(), "--election", "ledger-leader", "--id", "worker-b",
                        "--ttl", "3", "--fence",
                        "http://127.0.0.1:" + std::to_string(b.admin_port()) + "/v1/resources/ledger", "--", "/bin/sh",
                        "-c", "echo token=$FENCING_TOKEN"},
                       30s);
  REQUIRE_MESSAGE(e.code() == 0, e.out, e.err, b.log());
  const auto at = e.out.find("token=");
  REQUIRE(at != std::string::npos);
  const std::int64_t t = std::stoll(e.out.substr(at + 6));
  REQUIRE(t > 5);  // the leader key's revision: every earlier fleet write took revisions too
  CHECK(etcd_fence(etcd, "f9") == t);
  CHECK(a.write(t - 1).code() == 409);  // at once, at a replica the fence call did not go to
  auto w = c.write(t);
  CHECK_MESSAGE(w.code() == 200, describe(w));

  // Observe mode: a newer generation is committed in the fleet, an older one is forwarded anyway
  // (and audited as a would-be rejection where it arrived).
  REQUIRE(request(a.port(), "POST", "/shadow/x", {{"Fencing-Token", "7"}}, "{}", 15s).code() == 200);
  auto old = request(b.port(), "POST", "/shadow/x", {{"Fencing-Token", "6"}}, "{}", 15s);
  CHECK_MESSAGE(old.code() == 200, describe(old));
  CHECK(eventually(
      [&] {
        return b.admin("/v1/audit?decision=would_reject_stale").response.body.find("\"shadow\"") != std::string::npos;
      },
      5s));
  std::vector<std::int64_t> shadow;
  for (const auto& r : up.requests())
    if (r.target == "/shadow/x") shadow.push_back(r.fencing_token().value_or(-1));
  CHECK(shadow == std::vector<std::int64_t>{7, 6});
}

// Issue 33: a route linked to an election in a fleet: every replica follows the election and
// advances the resource when a leader appears (concurrently: the protocol lets one commit); the new
// leader's generation is the fleet's before it writes, and the old leader is refused everywhere.
TEST_CASE(
    "fleet: authority-linked routes: a new leader is fenced in at every replica, the old one refused everywhere") {
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  RecordingUpstream up;
  const json routes = json::array({{{"prefix", "/"},
                                    {"upstream", up.url()},
                                    {"resource", "ledger"},
                                    {"mode", "enforce"},
                                    {"authority", {{"etcd", {etcd.url()}}, {"election", "billing"}}}}});
  const json extra = {{"drain_timeout_ms", 8000}};
  Replica a({etcd.url()}, "f10", "a", routes, extra), b({etcd.url()}, "f10", "b", routes, extra),
      c({etcd.url()}, "f10", "c", routes, extra);
  REQUIRE_MESSAGE(a.start(), a.log());
  REQUIRE_MESSAGE(b.start(), b.log());
  REQUIRE_MESSAGE(c.start(), c.log());
  Client cl(client_options(etcd));
  fencegate::election::LeaseGrant la, lb;
  REQUIRE(cl.grant(10, &la).ok());
  REQUIRE(cl.grant(10, &lb).ok());
  auto write = [](const Replica& x, std::int64_t g, const std::string& leader) {
    return request(x.port(), "POST", "/ledger/charge",
                   {{"Fencing-Token", std::to_string(g)}, {"Fencing-Leader", leader}}, "{}", 15s);
  };

  fencegate::election::LeaderKey ka;
  REQUIRE(cl.campaign("billing", la.id, "worker-a", &ka).ok());
  // Fenced in by the replicas themselves, before the leader writes anything.
  REQUIRE_MESSAGE(eventually([&] { return etcd_fence(etcd, "f10") == ka.rev; }, 10s), a.log(), b.log());
  CHECK(up.requests().empty());
  for (const Replica* x : {&a, &b, &c}) {
    auto r = write(*x, ka.rev, "worker-a");
    CHECK_MESSAGE(r.code() == 200, describe(r));
  }

  // A resigns, B is elected: B's generation is the fleet's; A's token is refused at every replica.
  REQUIRE(cl.resign(ka, 2s).ok());
  fencegate::election::LeaderKey kb;
  REQUIRE(cl.campaign("billing", lb.id, "worker-b", &kb).ok());
  REQUIRE(eventually([&] { return etcd_fence(etcd, "f10") == kb.rev; }, 10s));
  for (const Replica* x : {&a, &b, &c}) {
    auto r = write(*x, ka.rev, "worker-a");
    CHECK_MESSAGE(r.code() == 409, describe(r));
  }
  auto r = write(b, kb.rev, "worker-b");
  CHECK_MESSAGE(r.code() == 200, describe(r));
  CHECK(tokens(up) == std::vector<std::int64_t>{ka.rev, ka.rev, ka.rev, kb.rev});
}
