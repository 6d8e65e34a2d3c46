// Seeded fault schedules against the real binary, checked by the history checker (history.h).
//
// Each schedule, drawn from one seed: 1-3 resources behind one enforce route (/r/{res}/), 3-5
// client threads acting as leaders whose generations overlap (an "election" every 80-250 ms hands
// a higher, or sometimes the same, generation to one of them; the others keep writing with theirs),
// a few tokenless and malformed writes, and faults:
//   stop_proxy     SIGSTOP fencegate for 400-1200 ms (longer than the drain timeout), SIGCONT
//   kill9_advance  kill -9 fencegate 0-3 ms after sending a write that advances the generation,
//                  then restart on the same port and database
//   kill9_audit    the same after sending a stale write (its audit row is being committed)
//   up_slow        upstream answers after 200-700 ms for a while (drain waits, drain timeouts)
//   up_hang        upstream hangs on half the requests for a while (drain timeout, upstream timeout)
//   up_reset       upstream resets half the connections without answering for a while
//   up_close       upstream closes half the connections without answering for a while
//   up_500         upstream answers 500 to half the requests for a while
//   client_pause   a client thread freezes before sending, inside the request head or inside the
//                  body, 300-900 ms (a paused old leader whose write arrives late)
// Afterwards the stored generations (sampled at every kill and at the end), the audit log and the
// upstream's record make a History; check() must find no violation.
//
// Environment (tests/fault/README.md):
//   FG_FAULT_SEED=N          replay one schedule
//   FG_FAULT_SCHEDULES=N     how many schedules (default: the quick profile, kQuickSchedules)
//   FG_FAULT_BASE_SEED=N     first seed of the run (default: random, printed)
//   FG_FAULT_SUMMARY=PATH    write a summary (markdown if PATH ends in .md, else JSON)
#include "tests/fault/history.h"
#include "tests/integration/harness.h"

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>

using namespace fencegate::testing;
namespace fault = fencegate::fault;

namespace {

constexpr int kQuickSchedules = 24;
constexpr int kDrainTimeoutMs = 300;
constexpr int kUpstreamTimeoutMs = 1500;

const std::vector<std::string> kFaultKinds = {"stop_proxy", "kill9_advance", "kill9_audit", "up_slow",
                                              "up_hang",    "up_reset",      "up_close",    "up_500"};

std::optional<std::uint64_t> env_u64(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::strtoull(v, nullptr, 10);
}

// What the upstream does for a while.
enum class UpMode { normal, slow, hang, reset, close, err500 };

struct PlannedFault {
  int at_ms = 0;         // from the start of traffic
  std::string kind;
  int length_ms = 0;     // pause or window length
  int delay_us = 0;      // kill -9 delay after the write is sent
};

// Everything one schedule does, drawn from its seed before it runs.
struct Plan {
  std::uint64_t seed = 0;
  int resources = 1;
  int clients = 3;
  int traffic_ms = 2000;
  double p_pause = 0;    // per request, a client flow freezes
  std::vector<PlannedFault> faults;

  std::string describe() const {
    std::ostringstream o;
    o << "seed " << seed << ": " << resources << " resource(s), " << clients << " clients, " << traffic_ms
      << " ms of traffic, client pause p=" << p_pause << ", faults:";
    for (const auto& f : faults) {
      o << " [+" << f.at_ms << "ms " << f.kind;
      if (f.length_ms) o << " " << f.length_ms << "ms";
      if (f.kind.starts_with("kill9")) o << " after " << f.delay_us << "us";
      o << "]";
    }
    return o.str();
  }
};

Plan make_plan(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Plan p;
  p.seed = seed;
  p.resources = pick(1, 3);
  p.clients = pick(3, 5);
  p.traffic_ms = pick(1500, 2500);
  p.p_pause = pick(0, 1) ? 0.04 : 0.0;
  int n = pick(1, 3);
  for (int i = 0; i < n; ++i) {
    PlannedFault f;
    f.kind = kFaultKinds[std::size_t(pick(0, int(kFaultKinds.size()) - 1))];
    f.at_ms = pick(150, p.traffic_ms - 300);
    if (f.kind == "stop_proxy") f.length_ms = pick(400, 1200);
    if (f.kind.starts_with("up_")) f.length_ms = pick(300, 800);
    if (f.kind.starts_with("kill9")) f.delay_us = pick(0, 3000);
    p.faults.push_back(f);
  }
  std::sort(p.faults.begin(), p.faults.end(), [](const auto& a, const auto& b) { return a.at_ms < b.at_ms; });
  return p;
}

// Totals over a run, for the summary.
struct Totals {
  int schedules = 0, failed_schedules = 0;
  std::int64_t client_ops = 0, upstream_requests = 0, upstream_parse_errors = 0, restarts = 0;
  std::map<std::string, std::int64_t> faults, statuses, violations;
  std::vector<std::uint64_t> failing_seeds;
  std::uint64_t base_seed = 0;
  double seconds = 0;
};

// One schedule's run: the proxy, the upstream, the clients and the recorder.
class Run {
 public:
  explicit Run(const Plan& plan) : plan_(plan), up_([this](const RecordedRequest& r) { return on_upstream(r); }) {
    json c = config_with_routes({route("/r/{res}/", up_.url(), "{res}", "enforce")});
    c["drain_timeout_ms"] = kDrainTimeoutMs;
    c["upstream_timeout_ms"] = kUpstreamTimeoutMs;
    c["upstream_connect_timeout_ms"] = 500;
    c["header_timeout_ms"] = 3000;
    c["body_timeout_ms"] = 3000;
    ProxySpec spec;
    spec.config = c;
    px_ = std::make_unique<Proxy>(spec);
    for (int t = 0; t < plan.clients; ++t) belief_.push_back(std::make_unique<std::atomic<std::int64_t>>(1));
  }

  // Runs the schedule and returns its history. harness_error is set if the harness itself failed
  // (could not start or restart the proxy): that is not a contract violation.
  fault::History execute(Totals& totals, std::string* harness_error) {
    if (!px_->start()) {
      *harness_error = "fencegate did not start";
      return {};
    }
    epoch_ = 1;
    t0_ = Clock::now();
    std::vector<std::thread> clients;
    for (int t = 0; t < plan_.clients; ++t) clients.emplace_back([this, t] { client_loop(t); });

    std::mt19937_64 rng(plan_.seed ^ 0x5eedULL);
    auto next_election = t0_ + std::chrono::milliseconds(std::uniform_int_distribution<int>(80, 250)(rng));
    std::size_t next_fault = 0;
    const auto end = t0_ + std::chrono::milliseconds(plan_.traffic_ms);
    while (Clock::now() < end && harness_error->empty()) {
      auto now = Clock::now();
      if (now >= next_election) {
        elect(rng);
        next_election = now + std::chrono::milliseconds(std::uniform_int_distribution<int>(80, 250)(rng));
      }
      if (next_fault < plan_.faults.size() && now >= t0_ + std::chrono::milliseconds(plan_.faults[next_fault].at_ms)) {
        inject(plan_.faults[next_fault], harness_error);
        ++next_fault;
      }
      if (mode_.load() != UpMode::normal && now >= mode_until_.load()) set_mode(UpMode::normal, "upstream normal again");
      if (!px_->running() && harness_error->empty()) unexpected_exit_ = "fencegate exited on its own: " + exit_text();
      std::this_thread::sleep_for(5ms);
    }
    set_mode(UpMode::normal, "upstream normal again");
    stop_.store(true);
    for (auto& th : clients) th.join();

    // Stop cleanly and take the last sample.
    if (px_->running()) {
      auto st = px_->stop();
      event("SIGTERM fencegate (end of schedule)");
      if (!(st.exited && st.code == 0)) unexpected_exit_ = "fencegate did not exit cleanly on SIGTERM: " + st.describe();
    }
    sample();
    up_.stop();
    totals.restarts += epoch_ - 1;
    return collect(totals);
  }

  std::string proxy_log() const { return px_->log_for_failure(); }
  const std::string& unexpected_exit() const { return unexpected_exit_; }

 private:
  // ---- the upstream ----
  UpstreamAction on_upstream(const RecordedRequest& r) {
    // Per-request decisions depend on the op id and the seed only.
    std::uint64_t h = std::hash<std::string>{}(r.target) ^ (plan_.seed * 0x9e3779b97f4a7c15ULL);
    std::mt19937_64 rng(h);
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    switch (mode_.load()) {
      case UpMode::normal: return UpstreamAction::delayed(pick(0, 9) == 0 ? pick(30, 120) : pick(0, 15));
      case UpMode::slow: return UpstreamAction::delayed(pick(200, 700));
      case UpMode::hang: return pick(0, 1) ? UpstreamAction::hang() : UpstreamAction::delayed(pick(0, 20));
      case UpMode::reset: return pick(0, 1) ? UpstreamAction::reset_connection() : UpstreamAction::delayed(pick(0, 20));
      case UpMode::close: return pick(0, 1) ? UpstreamAction::close_connection() : UpstreamAction::delayed(pick(0, 20));
      case UpMode::err500: return pick(0, 1) ? UpstreamAction::respond(500, pick(0, 20)) : UpstreamAction::delayed(pick(0, 20));
    }
    return {};
  }
  void set_mode(UpMode m, const std::string& what, int length_ms = 0) {
    if (m == UpMode::normal && mode_.load() == UpMode::normal) return;
    mode_until_.store(Clock::now() + std::chrono::milliseconds(length_ms));
    mode_.store(m);
    event(what);
  }

  // ---- the leaders ----
  void elect(std::mt19937_64& rng) {
    int t = std::uniform_int_distribution<int>(0, plan_.clients - 1)(rng);
    // Mostly a higher generation; sometimes the same one as the newest (two believers).
    std::int64_t g = top_gen_.load();
    if (std::uniform_int_distribution<int>(0, 4)(rng) != 0) {
      std::int64_t d = 1 + std::uniform_int_distribution<int>(0, 2)(rng);
      g = top_gen_.fetch_add(d) + d;
    }
    belief_[std::size_t(t)]->store(g);
  }

  void client_loop(int t) {
    std::mt19937_64 rng(plan_.seed * 31 + std::uint64_t(t) + 1);
    auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    HttpClient c;
    int k = 0;
    while (!stop_.load()) {
      fault::ClientOp op;
      op.op_id = "c" + std::to_string(t) + "-" + std::to_string(k++);
      op.resource = "r" + std::to_string(pick(0, plan_.resources - 1));
      op.leader = "leader-" + std::to_string(t);
      Headers h{{"Fencing-Leader", op.leader}};
      if (chance(0.03)) {
        op.token = fault::Token::missing;
      } else if (chance(0.03)) {
        op.token = fault::Token::malformed;
        static const char* bad[] = {"007", "-3", "0x1f", "1,2", "", "99999999999999999999"};
        h.emplace_back("Fencing-Token", bad[pick(0, 5)]);
      } else {
        op.generation = belief_[std::size_t(t)]->load();
        if (chance(0.05)) op.generation = std::max<std::int64_t>(1, op.generation - pick(1, 3));  // a late write
        h.emplace_back("Fencing-Token", std::to_string(op.generation));
      }
      std::string body = "write " + op.op_id;
      std::string req = build_request("POST", fault::op_target(op.resource, op.op_id), h, body);
      int pause = 0, pause_where = 0;  // 0 before sending, 1 inside the head, 2 inside the body
      if (plan_.p_pause > 0 && chance(plan_.p_pause)) {
        pause = pick(300, 900);
        pause_where = pick(0, 2);
        count_fault("client_pause");
      }

      if (!c.connected() && !c.connect(px_->port(), 1s)) {
        op.sent = op.done = Clock::now();
        op.error = "connect: " + c.last_error();
        record(std::move(op));
        std::this_thread::sleep_for(std::chrono::milliseconds(pick(5, 25)));
        continue;
      }
      if (pause && pause_where == 0) {
        event(op.op_id + " client frozen " + std::to_string(pause) + "ms before sending");
        std::this_thread::sleep_for(std::chrono::milliseconds(pause));
      }
      op.sent = Clock::now();
      bool sent_ok;
      if (pause && pause_where > 0) {
        std::size_t split = pause_where == 1 ? req.find("\r\n") + 2 : req.size() - body.size() / 2;
        sent_ok = c.send(std::string_view(req).substr(0, split));
        event(op.op_id + " client frozen " + std::to_string(pause) + "ms inside its request " +
              (pause_where == 1 ? "head" : "body"));
        std::this_thread::sleep_for(std::chrono::milliseconds(pause));
        sent_ok = sent_ok && c.send(std::string_view(req).substr(split));
      } else {
        sent_ok = c.send(req);
      }
      ReadResult r;
      if (sent_ok) {
        r = c.read_response(8s);
      } else {
        r.status = ReadStatus::reset;
        r.error = "send failed";
      }
      op.done = Clock::now();
      op.status = r.code();
      if (!r.ok()) op.error = std::string(to_string(r.status)) + (r.error.empty() ? "" : ": " + r.error);
      if (!r.ok() || to_lower(r.response.header("Connection")) == "close") c.close();
      // A deposed leader sometimes rejoins at the newest generation (it is elected again, or
      // learns it): many writers on one generation keep writes in flight when the next advance
      // comes, which is what exercises the drain.
      if (op.status == 409 && chance(0.5)) {
        const std::string fg = r.response.header("Fencing-Generation");
        if (!fg.empty() && fg.find_first_not_of("0123456789") == std::string::npos && fg.size() < 18)
          belief_[std::size_t(t)]->store(std::max<std::int64_t>(belief_[std::size_t(t)]->load(), std::stoll(fg)));
      }
      record(std::move(op));
      std::this_thread::sleep_for(std::chrono::milliseconds(pick(0, 12)));
    }
  }

  // ---- faults ----
  void inject(const PlannedFault& f, std::string* harness_error) {
    count_fault(f.kind);
    if (f.kind == "stop_proxy") {
      px_->process().kill(SIGSTOP);
      event("SIGSTOP fencegate for " + std::to_string(f.length_ms) + "ms");
      std::this_thread::sleep_for(std::chrono::milliseconds(f.length_ms));
      px_->process().kill(SIGCONT);
      event("SIGCONT fencegate");
    } else if (f.kind.starts_with("kill9")) {
      // The driver's own write: a new leader's advance, or a stale write (audited rejection).
      const bool advance = f.kind == "kill9_advance";
      fault::ClientOp op;
      op.op_id = "k" + std::to_string(kills_++);
      op.resource = "r0";
      op.leader = advance ? "leader-k" : "stale-k";
      op.generation = advance ? top_gen_.fetch_add(1) + 1 : 1;
      HttpClient c;
      op.sent = Clock::now();
      if (c.connect(px_->port(), 1s) &&
          c.send(build_request("POST", fault::op_target(op.resource, op.op_id),
                               {{"Fencing-Token", std::to_string(op.generation)}, {"Fencing-Leader", op.leader}},
                               "write " + op.op_id))) {
        std::this_thread::sleep_for(std::chrono::microseconds(f.delay_us));
        px_->kill9();
        event(std::string("kill -9 fencegate (") + (advance ? "mid-advance of " : "mid-audit of ") + op.op_id + ")");
        auto r = c.read_response(2s);
        op.status = r.code();
        if (!r.ok()) op.error = std::string(to_string(r.status)) + (r.error.empty() ? "" : ": " + r.error);
      } else {
        px_->kill9();
        event("kill -9 fencegate (its write could not be sent)");
        op.error = "could not send";
      }
      op.done = Clock::now();
      record(std::move(op));
      sample();
      std::this_thread::sleep_for(std::chrono::milliseconds(f.delay_us % 150));
      if (!px_->start()) {
        *harness_error = "fencegate did not restart on port " + std::to_string(px_->port());
        return;
      }
      ++epoch_;
      event("fencegate restarted (epoch " + std::to_string(epoch_) + ")");
    } else {
      static const std::map<std::string, UpMode> modes = {{"up_slow", UpMode::slow},   {"up_hang", UpMode::hang},
                                                         {"up_reset", UpMode::reset}, {"up_close", UpMode::close},
                                                         {"up_500", UpMode::err500}};
      set_mode(modes.at(f.kind), "upstream " + f.kind.substr(3) + " for " + std::to_string(f.length_ms) + "ms",
               f.length_ms);
    }
  }

  std::string exit_text() {
    auto s = px_->process().exit_status();
    return s ? s->describe() : "unknown";
  }

  // ---- the recorder ----
  void record(fault::ClientOp op) {
    std::lock_guard lk(mu_);
    h_.client.push_back(std::move(op));
  }
  void event(std::string what) {
    std::lock_guard lk(mu_);
    h_.events.push_back(fault::Event{Clock::now(), std::move(what)});
  }
  void count_fault(const std::string& kind) {
    std::lock_guard lk(mu_);
    ++faults_[kind];
  }
  void sample() {
    auto at = Clock::now();
    auto rows = read_resources(px_->db());
    std::lock_guard lk(mu_);
    for (const auto& r : rows) h_.stored.push_back(fault::StoredSample{r.resource, r.generation, epoch_, at});
  }

  fault::History collect(Totals& totals) {
    fault::History h;
    {
      std::lock_guard lk(mu_);
      h = h_;
      for (const auto& [k, n] : faults_) totals.faults[k] += n;
    }
    for (const auto& r : up_.requests()) {
      fault::UpstreamOp u;
      if (!fault::parse_op_target(r.target, &u.resource, &u.op_id)) u.resource = r.target;
      u.generation = r.fencing_token().value_or(0);
      u.arrival = r.arrival;
      u.completion = r.completion;
      u.outcome = to_string(r.outcome);
      h.upstream.push_back(std::move(u));
    }
    for (const auto& row : read_audit(px_->db())) {
      fault::AuditFact a;
      std::string res;
      fault::parse_op_target(row.target, &res, &a.op_id);
      a.resource = row.resource;
      a.decision = row.decision;
      a.presented = row.presented_generation;
      a.current = row.current_generation;
      h.audit.push_back(std::move(a));
    }
    totals.client_ops += std::int64_t(h.client.size());
    totals.upstream_requests += std::int64_t(h.upstream.size());
    totals.upstream_parse_errors += std::int64_t(up_.parse_errors().size());
    for (const auto& c : h.client) ++totals.statuses[c.status ? std::to_string(c.status) : "none"];
    return h;
  }

  const Plan& plan_;
  RecordingUpstream up_;
  std::unique_ptr<Proxy> px_;
  Clock::time_point t0_{};
  int epoch_ = 0;
  int kills_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<UpMode> mode_{UpMode::normal};
  std::atomic<Clock::time_point> mode_until_{Clock::time_point{}};
  std::atomic<std::int64_t> top_gen_{1};
  std::vector<std::unique_ptr<std::atomic<std::int64_t>>> belief_;  // each client's generation
  std::string unexpected_exit_;

  std::mutex mu_;
  // Guarded by mu_
  fault::History h_;
  std::map<std::string, int> faults_;
};

std::string summary_markdown(const Totals& t) {
  std::ostringstream o;
  std::int64_t nfaults = 0, nviol = 0;
  for (const auto& [k, n] : t.faults) nfaults += n;
  for (const auto& [k, n] : t.violations) nviol += n;
  o << "# Fault schedules: last run\n\n";
  o << "| figure | value |\n|---|---|\n";
  o << "| base seed | " << t.base_seed << " |\n";
  o << "| schedules | " << t.schedules << " |\n";
  o << "| schedules with a violation or harness error | " << t.failed_schedules << " |\n";
  o << "| wall time | " << int(t.seconds) << " s |\n";
  o << "| client requests | " << t.client_ops << " |\n";
  o << "| upstream requests | " << t.upstream_requests << " |\n";
  o << "| upstream: connections closed inside a request | " << t.upstream_parse_errors << " |\n";
  o << "| fencegate restarts (after kill -9) | " << t.restarts << " |\n";
  o << "| faults injected | " << nfaults << " |\n";
  o << "| violations | " << nviol << " |\n\n";
  o << "Faults by kind:\n\n| fault | count |\n|---|---|\n";
  for (const auto& [k, n] : t.faults) o << "| " << k << " | " << n << " |\n";
  o << "\nClient responses by status (none = no response: reset, refused, proxy killed):\n\n| status | count |\n|---|---|\n";
  for (const auto& [k, n] : t.statuses) o << "| " << k << " | " << n << " |\n";
  o << "\nViolations by property:\n\n";
  if (t.violations.empty()) o << "none\n";
  for (const auto& [k, n] : t.violations) o << "- " << k << ": " << n << "\n";
  if (!t.failing_seeds.empty()) {
    o << "\nFailing seeds (replay: `FG_FAULT_SEED=<seed> build-fault/tests/test_fault -tc='fault schedules*'`):";
    for (auto s : t.failing_seeds) o << " " << s;
    o << "\n";
  }
  return o.str();
}

std::string summary_json(const Totals& t) {
  json j;
  j["base_seed"] = t.base_seed;
  j["schedules"] = t.schedules;
  j["failed_schedules"] = t.failed_schedules;
  j["seconds"] = t.seconds;
  j["client_requests"] = t.client_ops;
  j["upstream_requests"] = t.upstream_requests;
  j["upstream_parse_errors"] = t.upstream_parse_errors;
  j["restarts"] = t.restarts;
  j["faults"] = t.faults;
  j["statuses"] = t.statuses;
  j["violations"] = t.violations;
  j["failing_seeds"] = t.failing_seeds;
  return j.dump(2) + "\n";
}

// Runs one schedule; returns false (after reporting) if it broke the contract.
bool run_schedule(std::uint64_t seed, Totals& totals) {
  Plan plan = make_plan(seed);
  Run run(plan);
  std::string harness_error;
  fault::History h = run.execute(totals, &harness_error);
  ++totals.schedules;
  std::vector<fault::Violation> v;
  if (harness_error.empty()) v = fault::check(h);
  for (const auto& x : v) ++totals.violations[x.property];
  if (!run.unexpected_exit().empty()) ++totals.violations["proxy-exit"];
  const bool ok = v.empty() && harness_error.empty() && run.unexpected_exit().empty();
  if (!ok) {
    ++totals.failed_schedules;
    totals.failing_seeds.push_back(seed);
    std::string why = harness_error.empty() ? "" : "harness error: " + harness_error + "\n";
    if (!run.unexpected_exit().empty()) why += run.unexpected_exit() + "\n";
    FAIL_CHECK("schedule failed: ", plan.describe(), "\nreplay: FG_FAULT_SEED=", seed,
               " <build>/tests/test_fault -tc='fault schedules*'\n", why, fault::describe(v), "\n",
               run.proxy_log());
  }
  return ok;
}

}  // namespace

TEST_SUITE("fault schedules") {

TEST_CASE("fault schedules: seeded randomized schedules keep the fencing contract") {
  Totals totals;
  const auto start = Clock::now();
  std::vector<std::uint64_t> seeds;
  if (auto s = env_u64("FG_FAULT_SEED")) {
    seeds.push_back(*s);
    totals.base_seed = *s;
  } else {
    const int n = int(env_u64("FG_FAULT_SCHEDULES").value_or(kQuickSchedules));
    totals.base_seed = env_u64("FG_FAULT_BASE_SEED").value_or((std::uint64_t(std::random_device{}()) << 20) % 1000000000000ULL);
    for (int i = 0; i < n; ++i) seeds.push_back(totals.base_seed + std::uint64_t(i));
  }
  MESSAGE("fault schedules: ", seeds.size(), " schedule(s) from seed ", totals.base_seed,
          " (replay one: FG_FAULT_SEED=<seed>)");
  const bool verbose = std::getenv("FG_FAULT_VERBOSE") != nullptr;
  for (auto seed : seeds) {
    bool ok = run_schedule(seed, totals);
    if (verbose || seeds.size() == 1) {
      const std::string line = make_plan(seed).describe() + (ok ? " -> ok" : " -> FAILED");
      MESSAGE(line);
    }
  }
  totals.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  MESSAGE("fault schedules: ", totals.schedules, " schedules, ", totals.client_ops, " client requests, ",
          totals.upstream_requests, " upstream requests, ", totals.restarts, " restarts, ",
          totals.failed_schedules, " failed, ", int(totals.seconds), " s");
  if (const char* path = std::getenv("FG_FAULT_SUMMARY"); path && *path) {
    std::string p = path;
    write_file(p, p.ends_with(".md") ? summary_markdown(totals) : summary_json(totals));
  }
  CHECK(totals.failed_schedules == 0);
}

TEST_CASE("fault schedules: a tampered recording of a real run is caught (the pipeline can fail)") {
  // One real schedule without faults, recorded exactly as above; then each tampering must be
  // reported under its property. Guards against a recorder that silently records nothing useful.
  Totals totals;
  Plan plan = make_plan(7);
  plan.faults.clear();
  plan.p_pause = 0;
  plan.traffic_ms = 1200;
  Run run(plan);
  std::string harness_error;
  fault::History h = run.execute(totals, &harness_error);
  INFO(run.proxy_log());
  REQUIRE(harness_error.empty());
  auto clean = fault::check(h);
  REQUIRE_MESSAGE(clean.empty(), fault::describe(clean));

  const fault::ClientOp* rejected = nullptr;
  std::size_t ok2xx = 0;
  for (const auto& c : h.client) {
    if (c.status == 409 && !rejected) rejected = &c;
    ok2xx += c.status >= 200 && c.status < 300;
  }
  REQUIRE(rejected != nullptr);
  REQUIRE(ok2xx >= 10);
  auto has = [](const std::vector<fault::Violation>& v, const std::string& p) {
    return std::any_of(v.begin(), v.end(), [&](const auto& x) { return x.property == p; });
  };
  {
    fault::History t = h;  // lose the 409's audit row
    std::erase_if(t.audit, [&](const auto& a) { return a.op_id == rejected->op_id; });
    CHECK(has(fault::check(t), "4-audit"));
  }
  {
    fault::History t = h;  // a forwarded write vanishes from the upstream's record
    std::erase_if(t.upstream, [&](const auto& u) { return u.op_id == t.upstream.front().op_id; });
    CHECK(has(fault::check(t), "3-match"));
  }
  {
    fault::History t = h;  // the upstream receives one write twice
    t.upstream.push_back(t.upstream.back());
    CHECK(has(fault::check(t), "3-match"));
  }
  {
    fault::History t = h;  // the last forwarded write of r0 arrives with a lower generation
    fault::UpstreamOp late = t.upstream.back();
    late.op_id = "forged";
    late.generation = 1;
    late.arrival = late.completion = late.completion + 1ms;
    t.upstream.push_back(late);
    CHECK(has(fault::check(t), "1-order"));
  }
  {
    fault::History t = h;  // the stored generation went back to 1 after the run
    REQUIRE_FALSE(t.stored.empty());
    t.stored.push_back(t.stored.back());
    t.stored.back().generation = 0;
    t.stored.back().at = t.stored.back().at + 1ms;
    CHECK(has(fault::check(t), "5-stored"));
  }
}

}  // TEST_SUITE
