// Authority-linked fencing end to end: a real etcd, the real `fencegate serve` with a route whose
// "authority" names an etcd election, a recording upstream, and leaders elected through the
// election client (as `fencegate elect` does).
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <optional>

#include "election_client/lease_keeper.h"
#include "tests/election/etcd_harness.h"
#include "tests/support/http_client.h"
#include "tests/support/upstream.h"

using namespace fencegate::testing;
using fencegate::election::Client;
using fencegate::election::KeyValue;
using fencegate::election::LeaderKey;
using fencegate::election::LeaseGrant;
using fencegate::election::LeaseKeeper;
using json = nlohmann::json;

namespace {

constexpr std::int64_t kForged = 9223372036854775807;

// `fencegate serve` with one route "/" -> upstream, resource "ledger", authority = the election.
class AuthProxy {
 public:
  AuthProxy(const EtcdServer& etcd, const std::string& upstream, const std::string& election, int grace_ms,
            const std::string& mode = "enforce")
      : dir_(std::make_unique<TempDir>("fencegate-authority")), port_(free_port()), admin_port_(free_port()) {
    while (admin_port_ == port_) admin_port_ = free_port();
    json authority = {{"etcd", {etcd.url()}}, {"election", election}};
    if (grace_ms) authority["grace_ms"] = grace_ms;
    json c = {{"listen", "127.0.0.1:" + std::to_string(port_)},
              {"db", db()},
              {"threads", 2},
              {"admin", {{"listen", "127.0.0.1:" + std::to_string(admin_port_)}}},
              {"routes", {{{"prefix", "/"}, {"upstream", upstream}, {"resource", "ledger"}, {"mode", mode},
                           {"authority", authority}}}}};
    write_file(dir_->file("fencegate.json"), c.dump(2));
  }
  // With the given routes instead (each may carry its own "authority").
  AuthProxy(json routes)
      : dir_(std::make_unique<TempDir>("fencegate-authority")), port_(free_port()), admin_port_(free_port()) {
    while (admin_port_ == port_) admin_port_ = free_port();
    json c = {{"listen", "127.0.0.1:" + std::to_string(port_)},
              {"db", db()},
              {"threads", 2},
              {"admin", {{"listen", "127.0.0.1:" + std::to_string(admin_port_)}}},
              {"routes", std::move(routes)}};
    write_file(dir_->file("fencegate.json"), c.dump(2));
  }

  bool start() {
    ProcessOptions o;
    o.log_path = dir_->file("fencegate.log");
    process_ = std::make_unique<Process>(
        Process::start({kFencegate, "serve", "--config", dir_->file("fencegate.json")}, o));
    return process_->wait_for_port(port_, 15s) && process_->wait_for_port(admin_port_, 15s);
  }
  void stop() {
    if (process_) process_->stop(5s);
  }

  std::uint16_t port() const { return port_; }
  std::uint16_t admin_port() const { return admin_port_; }
  std::string db() const { return dir_->file("fence.db"); }
  std::string log() const { return "fencegate log:\n" + read_file(dir_->file("fencegate.log"), 16 * 1024); }
  bool log_has(const std::string& text) const {
    return read_file(dir_->file("fencegate.log")).find(text) != std::string::npos;
  }

  ReadResult write(std::int64_t g, const std::string& leader = "", std::chrono::milliseconds timeout = 10s) const {
    Headers h{{"Fencing-Token", std::to_string(g)}};
    if (!leader.empty()) h.emplace_back("Fencing-Leader", leader);
    return request(port_, "POST", "/ledger/charge", h, "{\"amount\": 1}", timeout);
  }
  // Stored generation of "ledger" (or `resource`) from GET /v1/resources/{id}; 0 if unknown.
  std::int64_t generation(const std::string& resource = "ledger") const {
    auto r = request(admin_port_, "GET", "/v1/resources/" + resource, {}, {}, 5s);
    if (r.code() != 200) return 0;
    json j = json::parse(r.response.body, nullptr, false);
    return j.is_object() && j.contains("generation") ? j["generation"].get<std::int64_t>() : 0;
  }
  json audit(const std::string& decision) const {
    auto r = request(admin_port_, "GET", "/v1/audit?decision=" + decision, {}, {}, 5s);
    json j = json::parse(r.response.body, nullptr, false);
    return j.is_object() && j.contains("rows") ? j["rows"] : json::array();
  }
  std::string metrics() const { return request(admin_port_, "GET", "/metrics", {}, {}, 5s).response.body; }

 private:
  std::unique_ptr<TempDir> dir_;
  std::uint16_t port_, admin_port_;
  std::unique_ptr<Process> process_;
};

json problem_of(const ReadResult& r) { return json::parse(r.response.body, nullptr, false); }

std::string type_of(const ReadResult& r) {
  json j = problem_of(r);
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "";
}

// The live election keys under "<election>/".
std::vector<KeyValue> candidates(Client& c, const std::string& election) {
  std::vector<KeyValue> kvs;
  c.range(election + "/", election + "0", &kvs);  // '0' follows '/'
  return kvs;
}

std::int64_t ms_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

}  // namespace

TEST_CASE("authority: a new leader is fenced in before it writes; candidates, former leaders and forged tokens get 409") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  RecordingUpstream upstream;
  AuthProxy proxy(etcd, upstream.url(), "billing", 0);
  INFO(proxy.log());
  REQUIRE(proxy.start());
  Client c(client_options(etcd));

  // A is elected; the proxy fences A's generation in before A writes anything.
  LeaseGrant la, lb;
  REQUIRE(c.grant(10, &la).ok());
  REQUIRE(c.grant(10, &lb).ok());
  LeaderKey a;
  REQUIRE(c.campaign("billing", la.id, "worker-a", &a).ok());
  CHECK(eventually([&] { return proxy.generation() == a.rev; }, 10s));
  auto r = proxy.write(a.rev, "worker-a");
  CHECK_MESSAGE(r.code() == 200, describe(r));

  // B campaigns and waits in line: its key exists, but it has no authority yet.
  LeaderKey b;
  std::atomic<bool> b_done{false};
  std::thread b_campaign([&] {
    Client cb(client_options(etcd));
    cb.campaign("billing", lb.id, "worker-b", &b);
    b_done = true;
  });
  std::int64_t b_rev = 0;
  REQUIRE(eventually(
      [&] {
        for (const auto& kv : candidates(c, "billing"))
          if (kv.lease == lb.id) b_rev = kv.create_revision;
        return b_rev != 0;
      },
      10s));
  CHECK(b_rev > a.rev);
  CHECK_FALSE(b_done.load());
  // The proxy learns of B's key from its etcd watch, which may lag this test's own range by a few
  // milliseconds; until then B's token is one it has never seen: unknown-generation, also a 409.
  int unknown_before_seen = 0;
  CHECK(eventually(
      [&] {
        r = proxy.write(b_rev, "worker-b");
        const bool unseen = r.code() == 409 && type_of(r) == "urn:fencegate:problem:unknown-generation";
        unknown_before_seen += unseen;
        return !unseen;
      },
      10s));
  CHECK_MESSAGE(r.code() == 409, describe(r));
  CHECK(type_of(r) == "urn:fencegate:problem:not-leader");
  CHECK(proxy.generation() == a.rev);

  // A forged (huge) token: rejected, audited, and the fence is not poisoned.
  r = proxy.write(kForged, "mallory");
  CHECK_MESSAGE(r.code() == 409, describe(r));
  CHECK(type_of(r) == "urn:fencegate:problem:unknown-generation");
  CHECK(problem_of(r)["presented_generation"] == kForged);
  CHECK(proxy.generation() == a.rev);
  r = proxy.write(a.rev, "worker-a");  // A still leads and still writes
  CHECK_MESSAGE(r.code() == 200, describe(r));

  // A resigns; B wins. Before B writes anything, the proxy has fenced B's generation in and A is stale.
  REQUIRE(c.resign(a, 3s).ok());
  b_campaign.join();
  REQUIRE(b_done.load());
  CHECK(b.rev == b_rev);
  CHECK(eventually([&] { return proxy.generation() == b.rev; }, 10s));
  const std::size_t forwarded_before = upstream.count();
  r = proxy.write(a.rev, "worker-a");
  CHECK_MESSAGE(r.code() == 409, describe(r));
  CHECK(type_of(r) == "urn:fencegate:problem:stale-generation");
  CHECK(problem_of(r)["current_generation"] == b.rev);
  CHECK(r.response.header("Fencing-Generation") == std::to_string(b.rev));
  CHECK(upstream.count() == forwarded_before);
  r = proxy.write(b.rev, "worker-b");
  CHECK_MESSAGE(r.code() == 200, describe(r));

  // B's lease is revoked and no successor exists: B's generation no longer leads.
  REQUIRE(c.revoke(lb.id, 3s).ok());
  CHECK(eventually([&] { return proxy.write(b.rev, "worker-b").code() == 409; }, 10s));
  r = proxy.write(b.rev, "worker-b");
  CHECK(type_of(r) == "urn:fencegate:problem:not-leader");
  CHECK(proxy.generation() == b.rev);

  // Audit rows and metrics name the new decisions; `fencegate audit` accepts them.
  json stale = proxy.audit("rejected_stale");
  REQUIRE(stale.size() == 1);
  CHECK(stale[0]["presented_generation"] == a.rev);
  CHECK(stale[0]["current_generation"] == b.rev);
  json not_leader = proxy.audit("rejected_not_leader");
  CHECK(not_leader.size() >= 2);
  json unknown = proxy.audit("rejected_unknown_generation");  // newest first: the forged one
  REQUIRE(unknown.size() == 1u + unknown_before_seen);
  CHECK(unknown[0]["presented_generation"] == kForged);
  CHECK(unknown[0]["leader"] == "mallory");
  const std::string m = proxy.metrics();
  CHECK(m.find("fencegate_requests_total{resource=\"ledger\",decision=\"rejected_unknown_generation\"} " +
               std::to_string(1 + unknown_before_seen) + "\n") != std::string::npos);
  auto cli = run_command({kFencegate, "audit", "--db", proxy.db(), "--decision", "rejected_unknown_generation", "--json"}, 10s);
  CHECK_MESSAGE(cli.code() == 0, cli.err);
  CHECK(cli.out.find("9223372036854775807") != std::string::npos);
  proxy.stop();
}

// etcd gives all the events of one transaction one revision: deleting every candidate key at once
// (`etcdctl del --prefix billing/`) must take all of them out of the proxy's view, not only the
// first, or a deleted key would go on leading there.
TEST_CASE("authority: keys deleted together in one revision all leave the view") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  RecordingUpstream upstream;
  AuthProxy proxy(etcd, upstream.url(), "billing", 0);
  INFO(proxy.log());
  REQUIRE(proxy.start());
  Client c(client_options(etcd));
  LeaseGrant la, lb, lc;
  REQUIRE(c.grant(30, &la).ok());
  REQUIRE(c.grant(30, &lb).ok());
  REQUIRE(c.grant(30, &lc).ok());
  LeaderKey a;
  REQUIRE(c.campaign("billing", la.id, "worker-a", &a).ok());
  CHECK(eventually([&] { return proxy.generation() == a.rev; }, 10s));
  // B waits in line behind A.
  std::thread b_campaign([&] {
    Client cb(client_options(etcd));
    LeaderKey b;
    cb.campaign("billing", lb.id, "worker-b", &b);
  });
  std::int64_t b_rev = 0;
  REQUIRE(eventually(
      [&] {
        for (const auto& kv : candidates(c, "billing"))
          if (kv.lease == lb.id) b_rev = kv.create_revision;
        return b_rev != 0;
      },
      10s));
  CHECK(eventually([&] { return type_of(proxy.write(b_rev, "worker-b")) == "urn:fencegate:problem:not-leader"; }, 10s));

  // Both keys go in one revision: no leader is left.
  std::int64_t deleted = 0;
  REQUIRE(c.delete_range("billing/", "billing0", &deleted).ok());
  CHECK(deleted == 2);
  b_campaign.join();
  CHECK(eventually([&] { return proxy.write(a.rev, "worker-a").code() == 409; }, 10s));
  auto r = proxy.write(a.rev, "worker-a");
  CHECK(type_of(r) == "urn:fencegate:problem:not-leader");
  r = proxy.write(b_rev, "worker-b");
  CHECK(type_of(r) == "urn:fencegate:problem:not-leader");
  CHECK(proxy.generation() == a.rev);  // never advanced to the deleted B

  // The next leader etcd elects is the proxy's too.
  LeaderKey cl;
  REQUIRE(c.campaign("billing", lc.id, "worker-c", &cl).ok());
  CHECK(eventually([&] { return proxy.generation() == cl.rev; }, 10s));
  r = proxy.write(cl.rev, "worker-c");
  CHECK_MESSAGE(r.code() == 200, describe(r));
  proxy.stop();
}

// etcd brought back to an older state on the same address (a snapshot restore, here an empty
// one): the revisions the proxy's view and watch hold mean nothing there. The view starts over,
// so the former leader, whose key the restored etcd does not have, is refused.
TEST_CASE("authority: etcd that went back to an older state is followed, not frozen on what it forgot") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  RecordingUpstream upstream;
  AuthProxy proxy(etcd, upstream.url(), "billing", 0);
  INFO(proxy.log());
  REQUIRE(proxy.start());
  {
    Client c(client_options(etcd));
    for (int i = 0; i < 20; ++i) REQUIRE(c.put("other/k" + std::to_string(i), "v").ok());  // revisions up
    LeaseGrant la;
    REQUIRE(c.grant(30, &la).ok());
    LeaderKey a;
    REQUIRE(c.campaign("billing", la.id, "worker-a", &a).ok());
    CHECK(eventually([&] { return proxy.generation() == a.rev; }, 10s));
    REQUIRE(proxy.write(a.rev, "worker-a").code() == 200);

    etcd.wipe();
    REQUIRE(etcd.start());
    // A's key is not in this etcd: its token is refused, as is any generation below the fence.
    CHECK(eventually([&] { return proxy.write(a.rev, "worker-a").code() == 409; }, 15s));
    const std::string t = type_of(proxy.write(a.rev, "worker-a"));
    CHECK((t == "urn:fencegate:problem:not-leader" || t == "urn:fencegate:problem:unknown-generation"));
    CHECK(proxy.log_has("revision went backwards"));
  }
  proxy.stop();
}

// Barrier calls with tokens the view refuses are confirmed with etcd first; with etcd hung each
// waits out a request timeout. They must not hold up health probes or the leader's own barrier.
TEST_CASE("authority: barriers that wait on a hung etcd hold up neither probes nor the leader's barrier") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  RecordingUpstream upstream;
  AuthProxy proxy(etcd, upstream.url(), "billing", 0);
  INFO(proxy.log());
  REQUIRE(proxy.start());
  Client c(client_options(etcd));
  LeaseGrant la;
  REQUIRE(c.grant(30, &la).ok());
  LeaderKey a;
  REQUIRE(c.campaign("billing", la.id, "worker-a", &a).ok());
  CHECK(eventually([&] { return proxy.generation() == a.rev; }, 10s));
  etcd.pause();  // within the leader's 30 s window: the view still answers, etcd does not
  std::vector<std::thread> strays;
  for (int i = 1; i <= 4; ++i)
    strays.emplace_back([&, i] {
      request(proxy.admin_port(), "POST", "/v1/resources/ledger/fence", {{"Fencing-Token", std::to_string(a.rev + 100 + i)}},
              {}, 20s);
    });
  std::this_thread::sleep_for(200ms);
  auto t0 = Clock::now();
  auto leader = request(proxy.admin_port(), "POST", "/v1/resources/ledger/fence",
                        {{"Fencing-Token", std::to_string(a.rev)}}, {}, 20s);
  const auto leader_ms = ms_since(t0);
  t0 = Clock::now();
  auto health = request(proxy.admin_port(), "GET", "/healthz", {}, {}, 20s);
  const auto health_ms = ms_since(t0);
  etcd.resume();
  for (auto& t : strays) t.join();
  CHECK_MESSAGE(leader.code() == 200, describe(leader));
  CHECK(leader_ms < 700);
  CHECK(health.code() == 200);
  CHECK(health_ms < 700);
  proxy.stop();
}

// Routes of different elections (or of none) that can name one resource are refused by config
// validation (tests/config: "routes that can name one resource must agree on its mode and
// authority"), but for a literal route that takes all of one of a template's names.
TEST_CASE("authority: a new leader's advance leaves a tenant that a literal route takes alone") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  RecordingUpstream upstream;
  // tenant-acme is the literal route's (no election): billing's leaders must not advance it.
  AuthProxy proxy(json::array(
      {{{"prefix", "/tenants/{tenant}/"}, {"upstream", upstream.url()}, {"resource", "tenant-{tenant}"},
        {"authority", {{"etcd", {etcd.url()}}, {"election", "billing"}}}},
       {{"prefix", "/tenants/acme/"}, {"upstream", upstream.url()}, {"resource", "tenant-acme"}}}));
  INFO(proxy.log());
  REQUIRE(proxy.start());
  auto write = [&](const std::string& tenant, std::int64_t g) {
    return request(proxy.port(), "POST", "/tenants/" + tenant + "/x", {{"Fencing-Token", std::to_string(g)}}, "{}", 10s);
  };
  CHECK(write("acme", 1).code() == 200);  // a plain fence: generation 1
  Client c(client_options(etcd));
  LeaseGrant l1, l2;
  REQUIRE(c.grant(10, &l1).ok());
  REQUIRE(c.grant(10, &l2).ok());
  LeaderKey b1, b2;
  REQUIRE(c.campaign("billing", l1.id, "bill-1", &b1).ok());
  REQUIRE(eventually([&] { return write("globex", b1.rev).code() == 200; }, 10s));
  REQUIRE(c.resign(b1, 3s).ok());
  REQUIRE(c.campaign("billing", l2.id, "bill-2", &b2).ok());
  CHECK(eventually([&] { return proxy.generation("tenant-globex") == b2.rev; }, 10s));  // advanced ahead
  CHECK(proxy.generation("tenant-acme") == 1);  // left alone
  CHECK(write("acme", 1).code() == 200);
  // Its own barrier is not billing's to refuse either.
  auto f = request(proxy.admin_port(), "POST", "/v1/resources/tenant-acme/fence", {{"Content-Type", "application/json"}},
                   R"({"generation": 2})", 10s);
  INFO(describe(f));
  CHECK(f.code() == 200);
  CHECK(proxy.generation("tenant-acme") == 2);
  proxy.stop();
}

TEST_CASE("authority: observe mode marks what enforce would reject and never advances to a forged token") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  RecordingUpstream upstream;
  AuthProxy proxy(etcd, upstream.url(), "jobs", 1000, "observe");
  INFO(proxy.log());
  REQUIRE(proxy.start());
  Client c(client_options(etcd));
  LeaseGrant la;
  REQUIRE(c.grant(10, &la).ok());
  LeaderKey a;
  REQUIRE(c.campaign("jobs", la.id, "worker-a", &a).ok());
  CHECK(eventually([&] { return proxy.generation() == a.rev; }, 10s));
  auto r = proxy.write(kForged);
  CHECK_MESSAGE(r.code() == 200, describe(r));
  CHECK(r.response.header("Fencing-Observe") == "would_reject_unknown_generation");
  CHECK(proxy.generation() == a.rev);
  CHECK(eventually([&] { return proxy.audit("would_reject_unknown_generation").size() == 1; }, 5s));
  r = proxy.write(a.rev);
  CHECK_MESSAGE(r.code() == 200, describe(r));
  CHECK_FALSE(r.response.has("Fencing-Observe"));

  // etcd out of reach past the leader's window: still forwarded (observe), but no token that no
  // election confirms goes into the fence, or it would refuse every real leader after the switch.
  etcd.pause();
  std::this_thread::sleep_for(1500ms);  // past the window (grace_ms 1000)
  bool forwarded_unconfirmed = false;
  for (int i = 0; i < 80 && !forwarded_unconfirmed; ++i) {
    r = proxy.write(kForged);
    CHECK_MESSAGE(r.code() == 200, describe(r));
    forwarded_unconfirmed = r.response.header("Fencing-Observe").empty();  // no election said no either
    if (!forwarded_unconfirmed) std::this_thread::sleep_for(200ms);
  }
  etcd.resume();
  CHECK(forwarded_unconfirmed);
  CHECK(proxy.generation() == a.rev);
  proxy.stop();
}

TEST_CASE("authority: with etcd down the leader is accepted for at most its lease TTL (or grace_ms), then 503; etcd back -> service resumes") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  RecordingUpstream upstream;
  AuthProxy graced(etcd, upstream.url(), "billing", 1500);  // window = min(TTL 3 s, 1.5 s)
  AuthProxy ttl(etcd, upstream.url(), "billing", 0);        // window = the lease TTL, 3 s
  INFO(graced.log());
  INFO(ttl.log());
  REQUIRE(graced.start());
  REQUIRE(ttl.start());

  LeaseKeeper::Options ko;
  ko.client = client_options(etcd);
  ko.client.request_timeout = 1000ms;
  ko.ttl_seconds = 3;
  LeaseKeeper keeper(ko);
  REQUIRE(keeper.start().ok());
  REQUIRE(keeper.ttl_seconds() == 3);
  Client c(client_options(etcd));
  LeaderKey a;
  REQUIRE(c.campaign("billing", keeper.lease_id(), "worker-a", &a).ok());
  REQUIRE(eventually([&] { return graced.write(a.rev).code() == 200 && ttl.write(a.rev).code() == 200; }, 10s));
  // Both have looked the leader's lease TTL up (until then their window is 1 s).
  REQUIRE(eventually([&] { return graced.log_has("\"granted_ttl_s\":3") && ttl.log_has("\"granted_ttl_s\":3"); }, 10s));

  // etcd goes away. Every write accepted afterwards was decided within the window of the last
  // contact, which was before etcd died: its send time is before stop + window.
  etcd.stop();
  const auto stopped = Clock::now();
  struct Seen {
    std::int64_t last_ok_sent = -1;  // ms after stop
    std::int64_t first_503 = -1;
    std::string other;
  };
  Seen sg, st;
  while (ms_since(stopped) < 7000 && (sg.first_503 < 0 || st.first_503 < 0)) {
    for (auto [px, s] : {std::pair{&graced, &sg}, std::pair{&ttl, &st}}) {
      if (s->first_503 >= 0) continue;
      const std::int64_t sent = ms_since(stopped);
      auto r = px->write(a.rev, "", 3s);
      if (r.code() == 200) {
        s->last_ok_sent = sent;
      } else if (r.code() == 503) {
        s->first_503 = ms_since(stopped);
        CHECK(type_of(r) == "urn:fencegate:problem:authority-unavailable");
        CHECK(r.response.header("Content-Type").rfind("application/problem+json", 0) == 0);
      } else {
        s->other += describe(r) + "\n";
      }
    }
    std::this_thread::sleep_for(50ms);
  }
  INFO("graced: last 200 sent at +", sg.last_ok_sent, " ms, first 503 at +", sg.first_503, " ms; ", sg.other);
  INFO("ttl: last 200 sent at +", st.last_ok_sent, " ms, first 503 at +", st.first_503, " ms; ", st.other);
  MESSAGE("graced: last 200 sent at +", sg.last_ok_sent, " ms, first 503 at +", sg.first_503, " ms; ttl: last 200 sent at +",
          st.last_ok_sent, " ms, first 503 at +", st.first_503, " ms");
  CHECK(sg.other.empty());
  CHECK(st.other.empty());
  REQUIRE(sg.first_503 >= 0);
  REQUIRE(st.first_503 >= 0);
  CHECK(sg.last_ok_sent < 1500);
  CHECK(st.last_ok_sent < 3000);
  CHECK(sg.first_503 < 1500 + 1000);
  CHECK(st.first_503 < 3000 + 1000);
  // The grace shortened the window below the TTL: the TTL-bound proxy still accepted after the
  // graced one had failed closed (its last contact was at most TTL/3 = 1 s before the stop).
  CHECK(st.last_ok_sent > sg.first_503);
  CHECK(graced.metrics().find("decision=\"authority_unavailable\"") != std::string::npos);

  // etcd comes back (its restart renews the lease): both proxies resync and accept the leader again.
  FG_START_ETCD(etcd);
  CHECK(eventually([&] { return graced.write(a.rev).code() == 200; }, 15s));
  CHECK(eventually([&] { return ttl.write(a.rev).code() == 200; }, 15s));
  CHECK(graced.generation() == a.rev);

  // And the watch works again: the leader's lease revoked -> its generation no longer leads.
  REQUIRE(keeper.revoke(3s).ok());
  CHECK(eventually([&] { return graced.write(a.rev).code() == 409 && ttl.write(a.rev).code() == 409; }, 10s));
  CHECK(type_of(graced.write(a.rev)) == "urn:fencegate:problem:not-leader");
  graced.stop();
  ttl.stop();
}
