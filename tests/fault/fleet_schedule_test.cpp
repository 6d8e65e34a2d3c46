// Randomized fault schedules for the fleet (issue 33, docs/fleet.md), checked by the history
// checker (history.h) at the upstream's own record.
//
// One real three-member etcd cluster on loopback and three `fencegate serve` replicas (fleet "fs",
// ttl_ms 2000) in front of one recording upstream, started once per run. Every replica reaches
// each etcd member through a TCP relay the test controls (relay.h), so its etcd traffic can be
// stalled or cut while clients still reach it. Each schedule, drawn from one seed, uses resources
// of its own ("s<seed>-r<i>"), so several schedules run on the same cluster one after another and
// each is checked alone: 3-4 client threads acting as leaders of several generations (an
// "election" every 80-250 ms), each request sent to a random replica, and one fault of:
//   stop_held_up       a replica holds a write of the current generation in flight (the upstream
//                      answers it 200-800 ms later), is SIGSTOPped for TTL + 0.7-1.1 s, SIGCONT
//   stop_held_body     the same, the write's body half sent: the rest arrives while it is stopped
//                      (after SIGCONT it must not pass it on: the relay's membership check)
//   kill9_before       a replica killed -9 0-2 ms after another replica was sent an advancing
//                      write (before its intent, mostly), restarted
//   kill9_after        the same, once that advance's intent is in etcd
//   kill9_advancer     the advancing replica itself killed -9 once its intent is in etcd
//   etcd_member        an etcd member (not the leader) killed -9, restarted 300-800 ms later
//   etcd_leader        the etcd leader killed -9, restarted 300-800 ms later
//   partition_long     a replica's etcd traffic dropped for TTL + 0.5-0.9 s (clients still reach it)
//   partition_short    a replica's etcd traffic held for 300-900 ms, then delivered
// Properties 1-5 of history.h must hold per resource: audit rows are read from every replica's
// store, stored generations are etcd's fence/ keys sampled after each fault and at the end.
//
// Environment (tests/fault/README.md):
//   FG_FAULT_FLEET_SCHEDULES=N  how many schedules (else FG_FAULT_SCHEDULES, else kQuickSchedules)
//   FG_FAULT_SEED=N             replay one schedule
//   FG_FAULT_BASE_SEED=N        first seed of the run (default: random, printed)
//   FG_FAULT_FLEET_SUMMARY=PATH write a markdown summary of the run
#include <doctest/doctest.h>
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <sstream>

#include "tests/election/fleet_harness.h"
#include "fence_store/store.h"
#include "tests/fault/history.h"
#include "tests/fault/relay.h"
#include "tests/support/upstream.h"

using namespace fencegate::testing;
namespace fault = fencegate::fault;
using json = nlohmann::json;

namespace {

// CI's default. Measured ~2 s per schedule on the shared 2-core machine (see tests/fault/README.md).
constexpr int kQuickSchedules = 50;
constexpr int kDrainTimeoutMs = 400;
constexpr int kReplicas = 3;
const char* const kFleet = "fs";

const std::vector<std::string> kKinds = {"stop_held_up", "stop_held_body", "kill9_before",
                                         "kill9_after",  "kill9_advancer", "etcd_member",
                                         "etcd_leader",  "partition_long", "partition_short"};

std::optional<std::uint64_t> env_u64(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::strtoull(v, nullptr, 10);
}

struct Plan {
  std::uint64_t seed = 0;
  int resources = 1, clients = 3, traffic_ms = 1000;
  std::string kind;
  int at_ms = 0, length_ms = 0, delay_us = 0, replica = 0, other = 1;

  std::string prefix() const { return "s" + std::to_string(seed) + "-"; }
  std::string describe() const {
    std::ostringstream o;
    o << "seed " << seed << ": " << resources << " resource(s), " << clients << " clients, " << traffic_ms
      << " ms of traffic, fault " << kind << " at +" << at_ms << "ms on replica " << replica << " (other " << other
      << ")";
    if (length_ms) o << " for " << length_ms << "ms";
    if (delay_us) o << " after " << delay_us << "us";
    return o.str();
  }
};

Plan make_plan(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Plan p;
  p.seed = seed;
  p.resources = pick(1, 2);
  p.clients = pick(3, 4);
  p.traffic_ms = pick(800, 1100);
  p.kind = kKinds[std::size_t(pick(0, int(kKinds.size()) - 1))];
  p.at_ms = pick(150, 500);
  p.replica = pick(0, kReplicas - 1);
  p.other = (p.replica + pick(1, kReplicas - 1)) % kReplicas;
  if (p.kind.starts_with("stop_held")) p.length_ms = kFleetTtlMs + pick(700, 1100);
  if (p.kind == "partition_long") p.length_ms = kFleetTtlMs + pick(500, 900);
  if (p.kind == "partition_short") p.length_ms = pick(300, 900);
  if (p.kind.starts_with("etcd_")) p.length_ms = pick(300, 800);
  if (p.kind == "kill9_before") p.delay_us = pick(0, 2000);
  if (p.kind.starts_with("stop_held")) p.delay_us = pick(200, 800) * 1000;  // the upstream's answer
  return p;
}

struct Totals {
  int schedules = 0, failed = 0;
  std::int64_t client_ops = 0, upstream_requests = 0, restarts = 0;
  std::map<std::string, std::int64_t> faults, statuses, violations;
  std::vector<std::uint64_t> failing_seeds;
  std::uint64_t base_seed = 0;
  double seconds = 0;
};

// The cluster, the replicas and the upstream: started once, shared by the schedules of a run.
class Fleet {
 public:
  Fleet() : up_([this](const RecordedRequest& r) { return on_upstream(r); }) {}
  ~Fleet() {
    for (auto& r : replicas_)
      if (r) r->signal(SIGCONT);
  }

  bool start(std::string* why) {
    if (!etcd_.start()) {
      *why = "etcd cluster did not start: " + etcd_.log(0);
      return false;
    }
    json routes =
        json::array({{{"prefix", "/r/{res}/"}, {"upstream", up_.url()}, {"resource", "{res}"}, {"mode", "enforce"}}});
    json extra = {{"drain_timeout_ms", kDrainTimeoutMs},
                  {"upstream_timeout_ms", 3000},
                  {"upstream_connect_timeout_ms", 500},
                  {"header_timeout_ms", 8000},
                  {"body_timeout_ms", 8000}};
    for (int i = 0; i < kReplicas; ++i) {
      std::vector<std::string> urls;
      for (int e = 0; e < EtcdCluster::kSize; ++e) {
        relays_[i].push_back(std::make_unique<Relay>("127.0.0.1", etcd_.client_port(e),
                                                     "replica" + std::to_string(i) + "-etcd" + std::to_string(e)));
        urls.push_back(relays_[i].back()->url());
      }
      replicas_[i] = std::make_unique<Replica>(urls, kFleet, "m" + std::to_string(i), routes, extra);
      if (!replicas_[i]->start()) {
        *why = "replica " + std::to_string(i) + " did not start: " + replicas_[i]->log();
        return false;
      }
    }
    return true;
  }

  Replica& replica(int i) { return *replicas_[i]; }
  EtcdCluster& etcd() { return etcd_; }
  RecordingUpstream& upstream() { return up_; }
  void relays(int i, Relay::Mode m) {
    for (auto& r : relays_[i]) {
      if (m == Relay::Mode::pass) r->pass();
      if (m == Relay::Mode::hold) r->hold();
      if (m == Relay::Mode::drop) {
        r->drop();
        r->reset_all();  // connections open now see nothing more (their requests time out)
      }
    }
  }

  // The committed fence of `resource` in etcd (a linearizable read straight from the cluster);
  // nullopt if etcd could not be read.
  std::optional<std::int64_t> fence(const std::string& resource) {
    fencegate::election::ClientOptions o;
    o.endpoints = etcd_.urls();
    o.request_timeout = 1000ms;
    fencegate::election::Client c(o);
    std::vector<fencegate::election::KeyValue> kvs;
    if (!c.range(std::string("fencegate/fleet/") + kFleet + "/fence/" + resource, "", &kvs).ok()) return std::nullopt;
    if (kvs.empty()) return 0;
    return std::stoll(kvs[0].value.substr(0, 20));
  }
  // The member that put the intent of `resource` ("" if none).
  std::string intent_by(fencegate::election::Client& c, const std::string& resource) {
    std::vector<fencegate::election::KeyValue> kvs;
    if (!c.range(std::string("fencegate/fleet/") + kFleet + "/intent/" + resource, "", &kvs).ok() || kvs.empty())
      return "";
    return kvs[0].value.size() > 21 ? kvs[0].value.substr(21) : "";
  }

  // Back to the starting state: every replica running, not stopped, reaching etcd, a member.
  bool restore(std::string* why) {
    for (int i = 0; i < kReplicas; ++i) {
      replicas_[i]->signal(SIGCONT);
      relays(i, Relay::Mode::pass);
    }
    for (int e = 0; e < EtcdCluster::kSize; ++e)
      if (!etcd_.running(e)) etcd_.start_member(e, false);
    if (!etcd_.healthy(30s)) {
      *why = "etcd not healthy again";
      return false;
    }
    for (int i = 0; i < kReplicas; ++i) {
      if (!replicas_[i]->running() && !replicas_[i]->start()) {
        *why = "replica " + std::to_string(i) + " did not restart";
        return false;
      }
      if (!eventually([&] { return replicas_[i]->admin("/readyz").code() == 200; }, 30s)) {
        *why = "replica " + std::to_string(i) + " not a member again:\n" + replicas_[i]->log();
        return false;
      }
    }
    return true;
  }

 private:
  // Op ids "h<n>-d<ms>" are the held writes of stop_held_*: answered after <ms>; the rest after
  // 0-15 ms (sometimes 30-120).
  UpstreamAction on_upstream(const RecordedRequest& r) {
    std::string res, op;
    if (fault::parse_op_target(r.target, &res, &op) && op.starts_with("h")) {
      const auto d = op.find("-d");
      if (d != std::string::npos) return UpstreamAction::delayed(std::atoi(op.c_str() + d + 2));
    }
    std::mt19937_64 rng(std::hash<std::string>{}(r.target));
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    return UpstreamAction::delayed(pick(0, 9) == 0 ? pick(30, 120) : pick(0, 15));
  }

  EtcdCluster etcd_;
  RecordingUpstream up_;
  std::vector<std::unique_ptr<Relay>> relays_[kReplicas];
  std::unique_ptr<Replica> replicas_[kReplicas];
};

// One schedule on the shared fleet.
class Run {
 public:
  Run(Fleet& f, const Plan& p) : f_(f), plan_(p) {
    for (int t = 0; t < p.clients; ++t) belief_.push_back(std::make_unique<std::atomic<std::int64_t>>(1));
  }

  fault::History execute(Totals& totals, std::string* harness_error) {
    t0_ = Clock::now();
    std::vector<std::thread> clients;
    for (int t = 0; t < plan_.clients; ++t) clients.emplace_back([this, t] { client_loop(t); });
    std::mt19937_64 rng(plan_.seed ^ 0xf1ee7ULL);
    auto next_election = t0_ + std::chrono::milliseconds(std::uniform_int_distribution<int>(80, 250)(rng));
    bool injected = false;
    const auto end = t0_ + std::chrono::milliseconds(plan_.traffic_ms);
    while (Clock::now() < end || !injected) {
      const auto now = Clock::now();
      if (now >= next_election) {
        elect(rng);
        next_election = now + std::chrono::milliseconds(std::uniform_int_distribution<int>(80, 250)(rng));
      }
      if (!injected && now >= t0_ + std::chrono::milliseconds(plan_.at_ms)) {
        inject(harness_error);
        injected = true;
        sample();
      }
      std::this_thread::sleep_for(5ms);
    }
    stop_.store(true);
    for (auto& th : clients) th.join();
    if (harness_error->empty() && !f_.restore(harness_error)) return {};
    sample();
    return collect(totals);
  }

 private:
  std::string res(int i) const { return plan_.prefix() + "r" + std::to_string(i); }

  void elect(std::mt19937_64& rng) {
    const int t = std::uniform_int_distribution<int>(0, plan_.clients - 1)(rng);
    std::int64_t g = top_.load();
    if (std::uniform_int_distribution<int>(0, 4)(rng) != 0) {
      const std::int64_t d = 1 + std::uniform_int_distribution<int>(0, 1)(rng);
      g = top_.fetch_add(d) + d;
    }
    belief_[std::size_t(t)]->store(g);
  }

  // Sends one write (head and body, or the head and half the body if `half`) on `c`.
  static std::string request_text(const fault::ClientOp& op) {
    return build_request("POST", fault::op_target(op.resource, op.op_id),
                         {{"Fencing-Token", std::to_string(op.generation)}, {"Fencing-Leader", op.leader}},
                         "write " + op.op_id + " ................................................");
  }

  void client_loop(int t) {
    std::mt19937_64 rng(plan_.seed * 31 + std::uint64_t(t) + 1);
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    HttpClient conns[kReplicas];
    int k = 0;
    while (!stop_.load()) {
      fault::ClientOp op;
      op.op_id = "c" + std::to_string(t) + "-" + std::to_string(k++);
      op.resource = res(pick(0, plan_.resources - 1));
      op.leader = "leader-" + std::to_string(t);
      op.generation = belief_[std::size_t(t)]->load();
      if (pick(0, 19) == 0) op.generation = std::max<std::int64_t>(1, op.generation - pick(1, 2));  // a late write
      HttpClient& c = conns[pick(0, kReplicas - 1)];
      const int at = int(&c - conns);
      if (!c.connected() && !c.connect(f_.replica(at).port(), 1s)) {
        op.sent = op.done = Clock::now();
        op.error = "connect: " + c.last_error();
        record(std::move(op));
        std::this_thread::sleep_for(std::chrono::milliseconds(pick(5, 25)));
        continue;
      }
      op.sent = Clock::now();
      ReadResult r;
      if (c.send(request_text(op))) {
        r = c.read_response(6s);
      } else {
        r.status = ReadStatus::reset;
        r.error = "send failed";
      }
      op.done = Clock::now();
      op.status = r.code();
      if (!r.ok()) op.error = std::string(to_string(r.status)) + (r.error.empty() ? "" : ": " + r.error);
      if (!r.ok() || to_lower(r.response.header("Connection")) == "close") c.close();
      if (op.status == 409 && pick(0, 1)) {  // a deposed leader learns the newest generation
        const std::string fg = r.response.header("Fencing-Generation");
        if (!fg.empty() && fg.find_first_not_of("0123456789") == std::string::npos && fg.size() < 18)
          belief_[std::size_t(t)]->store(std::max<std::int64_t>(belief_[std::size_t(t)]->load(), std::stoll(fg)));
      }
      record(std::move(op));
      std::this_thread::sleep_for(std::chrono::milliseconds(pick(0, 10)));
    }
  }

  void inject(std::string* harness_error) {
    {
      std::lock_guard lk(mu_);
      ++faults_[plan_.kind];
    }
    const std::string& k = plan_.kind;
    Replica& x = f_.replica(plan_.replica);
    const std::string rx = "replica " + std::to_string(plan_.replica);
    if (k.starts_with("stop_held")) {
      stop_held(x, rx, k == "stop_held_body");
    } else if (k.starts_with("kill9")) {
      kill9(harness_error);
    } else if (k.starts_with("etcd_")) {
      int e = f_.etcd().leader();
      if (k == "etcd_member") e = (std::max(e, 0) + 1 + int(plan_.seed % 2)) % EtcdCluster::kSize;
      if (e < 0) e = 0;
      f_.etcd().kill9(e);
      event("kill -9 etcd member " + std::to_string(e) + (k == "etcd_leader" ? " (the leader)" : ""));
      std::this_thread::sleep_for(std::chrono::milliseconds(plan_.length_ms));
      f_.etcd().start_member(e, false);
      event("etcd member " + std::to_string(e) + " restarted");
    } else if (k.starts_with("partition")) {
      const bool cut = k == "partition_long";
      f_.relays(plan_.replica, cut ? Relay::Mode::drop : Relay::Mode::hold);
      event(rx + "'s etcd traffic " + (cut ? "dropped" : "held") + " for " + std::to_string(plan_.length_ms) + "ms");
      std::this_thread::sleep_for(std::chrono::milliseconds(plan_.length_ms));
      f_.relays(plan_.replica, Relay::Mode::pass);
      event(rx + "'s etcd traffic passes again");
    }
  }

  // A write of the committed generation of r0 at x, in flight (at the upstream, or its body half
  // sent), then x SIGSTOPped past its TTL; meanwhile the clients advance r0 elsewhere.
  void stop_held(Replica& x, const std::string& rx, bool body) {
    fault::ClientOp op;
    op.resource = res(0);
    op.op_id = "h0-d" + std::to_string(plan_.delay_us / 1000);
    op.leader = "held";
    op.generation = f_.fence(op.resource).value_or(0);
    if (op.generation <= 0) op.generation = top_.load();
    HttpClient c;
    op.sent = Clock::now();
    const std::string req = request_text(op);
    bool sent = c.connect(x.port(), 1s);
    if (body) {
      const std::size_t split = req.size() - 20;
      sent = sent && c.send(std::string_view(req).substr(0, split));
      std::this_thread::sleep_for(50ms);  // admitted and the head on its way upstream
      x.signal(SIGSTOP);
      event(rx + " SIGSTOP, " + op.op_id + " (g" + std::to_string(op.generation) + ") half sent");
      sent = sent && c.send(std::string_view(req).substr(split));
    } else {
      sent = sent && c.send(req);
      // until the upstream holds it (or 500 ms: then it is still at x)
      (void)eventually(
          [&] {
            for (const auto& r : f_.upstream().requests())
              if (r.target == fault::op_target(op.resource, op.op_id)) return true;
            return false;
          },
          500ms);
      x.signal(SIGSTOP);
      event(rx + " SIGSTOP, " + op.op_id + " (g" + std::to_string(op.generation) + ") in flight");
    }
    // The clients' next election advances r0 at another replica (x cannot acknowledge).
    belief_[0]->store(top_.fetch_add(1) + 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(plan_.length_ms));
    x.signal(SIGCONT);
    event(rx + " SIGCONT");
    ReadResult r;
    if (sent) r = c.read_response(4s);
    op.done = Clock::now();
    op.status = r.code();
    if (!r.ok()) op.error = std::string(to_string(r.status)) + (r.error.empty() ? "" : ": " + r.error);
    record(std::move(op));
  }

  // kill9_before / kill9_after: `other` is sent an advancing write, `replica` is killed;
  // kill9_advancer: `replica` is sent it and killed once its intent is in etcd.
  void kill9(std::string* harness_error) {
    const bool advancer = plan_.kind == "kill9_advancer";
    const int to = advancer ? plan_.replica : plan_.other;
    Replica& victim = f_.replica(plan_.replica);
    fault::ClientOp op;
    op.resource = res(0);
    op.op_id = "k0";
    op.leader = "leader-k";
    op.generation = top_.fetch_add(1) + 1;
    fencegate::election::ClientOptions o;
    o.endpoints = f_.etcd().urls();
    o.request_timeout = 1000ms;
    fencegate::election::Client ec(o);
    HttpClient c;
    op.sent = Clock::now();
    const bool sent = c.connect(f_.replica(to).port(), 1s) && c.send(request_text(op));
    if (plan_.kind == "kill9_before") {
      std::this_thread::sleep_for(std::chrono::microseconds(plan_.delay_us));
    } else {
      const std::string who = "m" + std::to_string(to);
      (void)eventually([&] { return f_.intent_by(ec, op.resource) == who; }, 2000ms);
    }
    victim.kill9();
    event("kill -9 replica " + std::to_string(plan_.replica) + " (" + plan_.kind + ", " + op.op_id + " g" +
          std::to_string(op.generation) + " sent to replica " + std::to_string(to) + ")");
    ReadResult r;
    if (sent) r = c.read_response(advancer ? 2s : 6s);
    op.done = Clock::now();
    op.status = r.code();
    if (!r.ok()) op.error = std::string(to_string(r.status)) + (r.error.empty() ? "" : ": " + r.error);
    record(std::move(op));
    sample();
    if (!victim.start()) {
      *harness_error = "replica " + std::to_string(plan_.replica) + " did not restart:\n" + victim.log();
      return;
    }
    ++restarts_;
    event("replica " + std::to_string(plan_.replica) + " restarted");
  }

  void record(fault::ClientOp op) {
    std::lock_guard lk(mu_);
    h_.client.push_back(std::move(op));
  }
  void event(std::string what) {
    std::lock_guard lk(mu_);
    h_.events.push_back(fault::Event{Clock::now(), std::move(what)});
  }
  void sample() {
    for (int i = 0; i < plan_.resources; ++i) {
      const auto at = Clock::now();  // before the read: whatever arrived upstream before is committed
      if (auto g = f_.fence(res(i))) {
        std::lock_guard lk(mu_);
        h_.stored.push_back(fault::StoredSample{res(i), *g, 0, at});
      }
    }
  }

  fault::History collect(Totals& totals) {
    fault::History h;
    {
      std::lock_guard lk(mu_);
      h = h_;
      for (const auto& [k, n] : faults_) totals.faults[k] += n;
    }
    const std::string p = plan_.prefix();
    for (const auto& r : f_.upstream().requests()) {
      fault::UpstreamOp u;
      if (!fault::parse_op_target(r.target, &u.resource, &u.op_id) || !u.resource.starts_with(p)) continue;
      u.generation = r.fencing_token().value_or(0);
      u.arrival = r.arrival;
      u.completion = r.completion;
      u.outcome = to_string(r.outcome);
      h.upstream.push_back(std::move(u));
    }
    for (int i = 0; i < kReplicas; ++i) {
      std::string err;
      auto s = fencegate::store::Store::open_readonly(f_.replica(i).db(), &err);
      REQUIRE_MESSAGE(s != nullptr, "open_readonly: ", err);
      for (int rr = 0; rr < plan_.resources; ++rr) {
        fencegate::store::AuditQuery q;
        q.resource = res(rr);
        q.limit = 1000;
        for (;;) {
          fencegate::store::Status st = fencegate::store::Status::OK();
          auto page = s->query_audit(q, &st);
          REQUIRE_MESSAGE(st.ok(), "query_audit: ", st.message());
          for (const auto& rec : page) {
            fault::AuditFact a;
            std::string rs;
            fault::parse_op_target(rec.row.target, &rs, &a.op_id);
            a.resource = rec.row.resource;
            a.decision = rec.row.decision;
            a.presented = rec.row.presented_generation;
            a.current = rec.row.current_generation;
            h.audit.push_back(std::move(a));
          }
          if (page.size() < std::size_t(q.limit)) break;
          q.before_id = page.back().id;
        }
      }
    }
    totals.client_ops += std::int64_t(h.client.size());
    totals.upstream_requests += std::int64_t(h.upstream.size());
    totals.restarts += restarts_;
    for (const auto& c : h.client) ++totals.statuses[c.status ? std::to_string(c.status) : "none"];
    return h;
  }

  Fleet& f_;
  const Plan& plan_;
  Clock::time_point t0_{};
  int restarts_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<std::int64_t> top_{1};
  std::vector<std::unique_ptr<std::atomic<std::int64_t>>> belief_;
  std::mutex mu_;
  fault::History h_;  // Guarded by mu_
  std::map<std::string, int> faults_;
};

std::string summary_markdown(const Totals& t) {
  std::ostringstream o;
  std::int64_t nviol = 0;
  for (const auto& [k, n] : t.violations) nviol += n;
  o << "| figure | value |\n|---|---|\n";
  o << "| base seed | " << t.base_seed << " |\n| schedules | " << t.schedules << " |\n";
  o << "| schedules with a violation or harness error | " << t.failed << " |\n";
  o << "| wall time | " << int(t.seconds) << " s |\n| client requests | " << t.client_ops << " |\n";
  o << "| upstream requests | " << t.upstream_requests << " |\n| replica restarts (kill -9) | " << t.restarts
    << " |\n| violations | " << nviol << " |\n\n| fault | count |\n|---|---|\n";
  for (const auto& [k, n] : t.faults) o << "| " << k << " | " << n << " |\n";
  o << "\n| client status | count |\n|---|---|\n";
  for (const auto& [k, n] : t.statuses) o << "| " << k << " | " << n << " |\n";
  if (!t.failing_seeds.empty()) {
    o << "\nFailing seeds:";
    for (auto s : t.failing_seeds) o << " " << s;
    o << "\n";
  }
  return o.str();
}

}  // namespace

TEST_SUITE("fleet schedules") {
  TEST_CASE("fleet schedules: randomized faults over three replicas and a three-member etcd keep guarantees 1-3") {
    FG_REQUIRE_ETCD();
    Fleet fleet;
    std::string why;
    REQUIRE_MESSAGE(fleet.start(&why), why);
    Totals totals;
    const auto start = Clock::now();
    std::vector<std::uint64_t> seeds;
    if (auto s = env_u64("FG_FAULT_SEED")) {
      seeds.push_back(*s);
      totals.base_seed = *s;
    } else {
      const int n =
          int(env_u64("FG_FAULT_FLEET_SCHEDULES").value_or(env_u64("FG_FAULT_SCHEDULES").value_or(kQuickSchedules)));
      totals.base_seed = env_u64("FG_FAULT_BASE_SEED").value_or(std::uint64_t(std::random_device{}()) % 1000000000ULL);
      for (int i = 0; i < n; ++i) seeds.push_back(totals.base_seed + std::uint64_t(i));
    }
    MESSAGE("fleet schedules: ", seeds.size(), " schedule(s) from seed ", totals.base_seed,
            " (replay one: FG_FAULT_SEED=<seed>)");
    const bool verbose = std::getenv("FG_FAULT_VERBOSE") != nullptr;
    for (auto seed : seeds) {
      const Plan plan = make_plan(seed);
      Run run(fleet, plan);
      std::string harness_error;
      const auto t = Clock::now();
      fault::History h = run.execute(totals, &harness_error);
      ++totals.schedules;
      std::vector<fault::Violation> v;
      if (harness_error.empty()) v = fault::check(h);
      for (const auto& x : v) ++totals.violations[x.property];
      const bool ok = v.empty() && harness_error.empty();
      if (verbose || !ok) {
        const std::string line =
            plan.describe() + (ok ? " -> ok " : " -> FAILED ") +
            std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count()) + " ms";
        MESSAGE(line);
      }
      if (!ok) {
        ++totals.failed;
        totals.failing_seeds.push_back(seed);
        FAIL_CHECK("schedule failed: ", plan.describe(), "\nreplay: FG_FAULT_SEED=", seed,
                   " <build>/tests/test_fault -tc='fleet schedules*'\n",
                   harness_error.empty() ? "" : "harness error: " + harness_error + "\n", fault::describe(v), "\n",
                   fleet.replica(plan.replica).log());
        if (!harness_error.empty()) break;  // the shared fleet is in an unknown state
      }
    }
    totals.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    MESSAGE("fleet schedules: ", totals.schedules, " schedules, ", totals.client_ops, " client requests, ",
            totals.upstream_requests, " upstream requests, ", totals.restarts, " restarts, ", totals.failed,
            " failed, ", int(totals.seconds), " s");
    if (const char* path = std::getenv("FG_FAULT_FLEET_SUMMARY"); path && *path)
      write_file(path, summary_markdown(totals));
    CHECK(totals.failed == 0);
  // The recorder recorded a run worth checking: writes forwarded, stale ones refused.
    CHECK(totals.upstream_requests > 0);
    CHECK(totals.statuses["200"] > 0);
    if (seeds.size() >= 5) CHECK(totals.statuses["409"] > 0);
  }

}  // TEST_SUITE

// Guarantee 4 for a partition: the replica's etcd traffic goes through relays the test controls;
// clients still reach it.
TEST_CASE(
    "fleet partition: a replica cut off from etcd but not from clients answers 503 within its TTL, "
    "lets nothing old through, and serves again once it is a member") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  RecordingUpstream up([](const RecordedRequest& rq) {
    return rq.target.ends_with("/hang") ? UpstreamAction::hang() : UpstreamAction::respond();
  });
  Relay relay("127.0.0.1", etcd.client_port(), "a-etcd");
  Replica a({relay.url()}, up.url(), "fp", "a", 8000), b({etcd.url()}, up.url(), "fp", "b", 8000);
  REQUIRE_MESSAGE(a.start(), a.log());
  REQUIRE_MESSAGE(b.start(), b.log());
  REQUIRE(a.write(1).code() == 200);
  // A holds a g=1 exchange upstream (the upstream never answers it).
  auto held = std::async(std::launch::async, [&] {
    return request(a.port(), "POST", "/ledger/hang", {{"Fencing-Token", "1"}}, "{}", 30s);
  });
  REQUIRE(up.wait_for_count(2, 10s));
  relay.drop();
  relay.reset_all();
  const auto t0 = Clock::now();
  // 503 fleet-unavailable within the TTL (its deadline is TTL - margin after its last good round).
  REQUIRE(eventually([&] { return a.admin("/readyz").code() == 503; }, std::chrono::milliseconds(kFleetTtlMs + 1000)));
  CHECK(Clock::now() - t0 < std::chrono::milliseconds(kFleetTtlMs));
  auto r = a.write(1, 3s);
  CHECK(r.code() == 503);
  CHECK(r.response.body.find("fleet-unavailable") != std::string::npos);
  CHECK(a.metric("fencegate_fleet_member") == 0);
  // The held exchange was aborted by A itself (it still runs, only etcd is out of reach).
  auto h = held.get();
  CHECK(h.code() != 200);
  // B advances once A's lease is gone; A's g=1 exchange had ended before g=2 reached the upstream.
  auto w2 = b.write(2, 20s);
  CHECK_MESSAGE(w2.code() == 200, describe(w2), b.log());
  // While partitioned, A forwards nothing: neither the old generation nor the new.
  CHECK(a.write(1, 3s).code() == 503);
  CHECK(a.write(2, 3s).code() == 503);
  relay.pass();
  CHECK_MESSAGE(eventually([&] { return a.admin("/readyz").code() == 200; }, 15s), a.log());
  CHECK(a.write(1).code() == 409);
  CHECK(a.write(2).code() == 200);
  auto reqs = up.requests();
  REQUIRE(reqs.size() == 4);
  std::vector<std::int64_t> got;
  for (const auto& q : reqs) got.push_back(q.fencing_token().value_or(-1));
  CHECK(got == std::vector<std::int64_t>{1, 1, 2, 2});
  CHECK(reqs[1].outcome == Outcome::aborted_by_peer);
  CHECK(reqs[1].completion <= reqs[2].arrival);
}
