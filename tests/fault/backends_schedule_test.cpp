// The fault schedules against every coordinator (issue 31): seeded randomized schedules where two
// or three `fencegate elect` workers on etcd, ZooKeeper or Redis write through a real `fencegate
// serve` (its route optionally linked to the election as its authority) while the schedule
// SIGSTOPs the leader past its lease/session, kill -9s a leader's elect, or restarts the
// coordination server. The history goes through the history checker (tests/fault/history.h:
// forwarded generations never go backwards, no overlap of a lower generation after a higher one
// started, ...) plus the election checks: every activation has its own, rising token; a deposed
// leader's command writes nothing after its successor started unless it was paused, and then its
// late writes are refused 409; a stopped or killed leader's command is gone.
//
// Topology (no namespaces: every fault here is a process fault):
//
//   fencegate elect --coordinator URL --fence <admin>/v1/resources/ledger -- <this binary, writer>
//        |                                                  |
//   etcd / ZooKeeper / Redis (127.0.0.1)              fencegate serve --> RecordingUpstream
//
// The workers' command is this binary in writer mode (FG_PW_LOG, see partition_test.cpp's end).
// FG_FAULT_SEED replays a run; FG_FAULT_BACKENDS_SCHEDULES (per backend, default 2),
// FG_FAULT_BACKENDS_FAULTS (default 2; the deck of three kinds covers each over two schedules), FG_FAULT_BACKENDS
// (etcd,zk,redis) and FG_FAULT_VERBOSE=1 are described in tests/fault/README.md.
#include <doctest/doctest.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#define kFencegate kFencegate_integration_harness
#include "tests/integration/harness.h"
#undef kFencegate
#include "tests/election/coord_harness.h"
#include "tests/fault/history.h"

namespace fencegate::testing {
namespace {

using json = nlohmann::json;
namespace fault = fencegate::fault;

const char* const kResource = "ledger";

Clock::time_point from_ns(std::int64_t ns) { return Clock::time_point(std::chrono::nanoseconds(ns)); }
std::int64_t ms_since(Clock::time_point base, Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(t - base).count();
}
std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}
std::uint64_t env_u64(const char* name, std::uint64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : dflt;
}
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream in(t.path() / "children");
    pid_t c;
    while (in >> c) out.push_back(c);
  }
  return out;
}
// Alive and not a zombie.
bool running_pid(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s;
  if (!std::getline(in, s)) return false;
  const auto close = s.rfind(')');
  return close != std::string::npos && close + 2 < s.size() && s[close + 2] != 'Z' && s[close + 2] != 'X';
}

enum class Backend { etcd, zk, redis };
const char* to_string(Backend b) {
  switch (b) {
    case Backend::etcd: return "etcd";
    case Backend::zk: return "zk";
    case Backend::redis: return "redis";
  }
  return "?";
}

enum class Fault { sigstop, kill9, restart };
const char* to_string(Fault f) {
  switch (f) {
    case Fault::sigstop: return "sigstop";
    case Fault::kill9: return "kill9-elect";
    case Fault::restart: return "coordinator-restart";
  }
  return "?";
}

struct FaultStep {
  Fault kind;
  int duration_ms = 0;
};

struct Schedule {
  Backend backend = Backend::etcd;
  std::uint64_t seed = 0;
  int index = 0;
  int workers = 2;
  bool authority = false;
  bool notify = false;  // Redis: keyspace notifications on (the authority follows them)
  int write_interval_ms = 60;
  std::vector<FaultStep> steps;

  std::string describe() const {
    std::string s = std::string(to_string(backend)) + " schedule " + std::to_string(index) + " (seed " +
                    std::to_string(seed) + "): workers=" + std::to_string(workers) +
                    " authority=" + (authority ? "yes" : "no") +
                    (backend == Backend::redis ? std::string(" notify=") + (notify ? "yes" : "no") : "") +
                    " interval=" + std::to_string(write_interval_ms) + "ms faults:";
    for (const auto& f : steps) s += std::string(" ") + to_string(f.kind) + "(" + std::to_string(f.duration_ms) + "ms)";
    return s;
  }
};

constexpr int kTtlS = 2;

std::vector<Schedule> make_schedules(Backend b, std::uint64_t seed, int count, int faults) {
  std::mt19937_64 rng(seed * 3 + static_cast<std::uint64_t>(b));
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<Fault> deck;
  std::vector<Schedule> out;
  for (int i = 0; i < count; ++i) {
    Schedule s;
    s.backend = b;
    s.seed = seed;
    s.index = i;
    s.workers = uni(2, 3);
    s.authority = uni(0, 1) == 1;
    s.notify = uni(0, 1) == 1;
    s.write_interval_ms = uni(30, 120);
    for (int k = 0; k < faults; ++k) {
      if (deck.empty()) {
        deck = {Fault::sigstop, Fault::kill9, Fault::restart};
        std::shuffle(deck.begin(), deck.end(), rng);
      }
      FaultStep f{deck.back()};
      deck.pop_back();
      f.duration_ms = f.kind == Fault::sigstop   ? kTtlS * 1000 + uni(500, 2000)
                      : f.kind == Fault::restart ? uni(200, kTtlS * 1000 + 1500)
                                                 : 0;
      s.steps.push_back(f);
    }
    out.push_back(s);
  }
  return out;
}

// The coordination server of one schedule.
struct Coordinator {
  Backend kind;
  bool notify = false;
  std::unique_ptr<EtcdServer> etcd;
  std::unique_ptr<ZkServer> zk;
  std::unique_ptr<RedisServer> redis;

  bool start() {
    switch (kind) {
      case Backend::etcd:
        if (!etcd) etcd = std::make_unique<EtcdServer>();
        return etcd->start();
      case Backend::zk:
        if (!zk) zk = std::make_unique<ZkServer>();
        return zk->start();
      case Backend::redis: {
        if (!redis) redis = std::make_unique<RedisServer>();
        // The generation counter must survive a restart (docs/elections.md): AOF, fsync'd at the
        // SIGTERM the restart begins with.
        std::vector<std::string> extra{"--appendonly", "yes"};
        if (notify) extra.insert(extra.end(), {"--notify-keyspace-events", "KEA"});
        return redis->start(extra);
      }
    }
    return false;
  }
  void stop() {
    if (etcd) etcd->stop();
    if (zk) zk->stop();
    if (redis) redis->stop();
  }
  std::string url() const {
    switch (kind) {
      case Backend::etcd: return "etcd://127.0.0.1:" + std::to_string(etcd->client_port());
      case Backend::zk: return zk->url();
      case Backend::redis: return redis->url();
    }
    return {};
  }
  std::string log() const {
    if (etcd) return etcd->log();
    if (zk) return zk->log();
    if (redis) return redis->log();
    return {};
  }
};

struct Activation {
  int worker = -1;
  std::int64_t token = 0;
  pid_t pid = -1;
  Clock::time_point at{}, last_send{};
};

struct Worker {
  int index = 0;
  std::string id, dir;
  std::unique_ptr<Process> elect;
  int runs = 0;
  std::vector<int> exit_codes;
  Clock::time_point restart_at{};
  bool stopped = false;
  pid_t stopped_group = -1;
  std::vector<pid_t> stopped_others;
  std::string ops_log() const { return dir + "/" + id + ".ops.jsonl"; }
  std::string elect_log(int run) const { return dir + "/" + id + ".elect." + std::to_string(run) + ".log"; }
};

class World {
 public:
  World(const Schedule& s, const std::string& dir) : s_(s), dir_(dir) {
    coord_.kind = s.backend;
    coord_.notify = s.notify;
  }
  ~World() {
    for (auto& w : workers_)
      if (w.elect) {
        if (w.stopped) continue_worker(w);
        w.elect->kill(SIGKILL);
        w.elect->wait_for(3s);
      }
    proxy_.reset();
    coord_.stop();
  }

  std::string election() const { return "fg-bs-" + std::to_string(s_.index); }

  void setup() {
    REQUIRE_MESSAGE(coord_.start(), to_string(s_.backend), " did not start:\n", coord_.log());
    std::mt19937 rng(static_cast<unsigned>(s_.seed * 31 + static_cast<std::uint64_t>(s_.index)));
    upstream_ = std::make_unique<RecordingUpstream>(
        [rng](const RecordedRequest&) mutable { return UpstreamAction::delayed(static_cast<int>(rng() % 31)); });
    admin_port_ = free_port();
    json route;
    route["prefix"] = std::string("/r/") + kResource + "/";
    route["upstream"] = upstream_->url();
    route["resource"] = kResource;
    route["mode"] = "enforce";
    if (s_.authority) route["authority"] = {{"coordinator", coord_.url()}, {"election", election()}};
    json cfg;
    cfg["routes"] = json::array({route});
    cfg["admin"] = {{"listen", "127.0.0.1:" + std::to_string(admin_port_)}};
    cfg["drain_timeout_ms"] = 3000;
    ProxySpec spec;
    spec.config = cfg;
    proxy_ = std::make_unique<Proxy>(spec);
    REQUIRE_MESSAGE(proxy_->start(), "fencegate did not start\n", proxy_->log_for_failure());
    REQUIRE(eventually([&] { return request(admin_port_, "GET", "/healthz").code() == 200; }, 10s));
    for (int i = 0; i < s_.workers; ++i) {
      Worker w;
      w.index = i;
      w.id = "w" + std::to_string(i);
      w.dir = dir_;
      workers_.push_back(std::move(w));
    }
    t0_ = Clock::now();
    event("setup done");
  }

  void start_worker(Worker& w) {
    std::vector<std::string> argv{kFencegate,
                                  "elect",
                                  "--coordinator",
                                  coord_.url(),
                                  "--election",
                                  election(),
                                  "--id",
                                  w.id,
                                  "--ttl",
                                  std::to_string(kTtlS),
                                  "--grace-ms",
                                  "500",
                                  "--fence-timeout-ms",
                                  "3000",
                                  "--fence",
                                  "http://127.0.0.1:" + std::to_string(admin_port_) + "/v1/resources/" + kResource,
                                  "--",
                                  self_exe()};
    ProcessOptions o;
    o.log_path = w.elect_log(w.runs);
    o.env = {"FG_PW_LOG=" + w.ops_log(), "FG_PW_PROXY=127.0.0.1:" + std::to_string(proxy_->port()),
             "FG_PW_INTERVAL_MS=" + std::to_string(s_.write_interval_ms), "FG_PW_TIMEOUT_MS=6000"};
    w.elect = std::make_unique<Process>(Process::start(argv, o));
    ++w.runs;
  }

  // A service manager: restarts an elect 300 ms after it exits.
  void supervise() {
    for (auto& w : workers_) {
      if (w.stopped || !w.elect) continue;
      if (w.restart_at != Clock::time_point{}) {
        if (Clock::now() >= w.restart_at) {
          w.restart_at = {};
          start_worker(w);
        }
        continue;
      }
      if (!w.elect->running()) {
        auto st = w.elect->exit_status();
        const int code = st && st->exited ? st->code : (st && st->signaled ? 128 + st->signal : -1);
        w.exit_codes.push_back(code);
        event(w.id + " elect exited " + std::to_string(code));
        w.restart_at = Clock::now() + 300ms;
      }
    }
  }
  void run_for(std::chrono::milliseconds d) {
    const auto until = Clock::now() + d;
    while (Clock::now() < until) {
      supervise();
      std::this_thread::sleep_for(20ms);
    }
  }
  bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
    const auto until = Clock::now() + timeout;
    for (;;) {
      supervise();
      if (pred()) return true;
      if (Clock::now() >= until) return false;
      std::this_thread::sleep_for(50ms);
    }
  }
  void event(const std::string& what) {
    events_.push_back({Clock::now(), what});
    trace_ += "  +" + std::to_string(ms_since(t0_, Clock::now())) + "ms " + what + "\n";
  }

  // The leader per the coordinator (`fencegate leader`): worker index and token, or -1.
  std::pair<int, std::int64_t> leader() {
    auto r = run_command({kFencegate, "leader", "--coordinator", coord_.url(), "--election", election(), "--timeout-ms",
                          "1000"},
                         5s);
    if (r.code() != 0) return {-1, 0};
    json j = json::parse(r.out, nullptr, false);
    if (!j.is_object()) return {-1, 0};
    for (auto& w : workers_)
      if (w.id == j.value("leader", "")) return {w.index, j.value("token", std::int64_t{0})};
    return {-1, 0};
  }

  std::vector<Activation> activations() const {
    std::vector<Activation> out;
    for (const auto& w : workers_) {
      std::ifstream in(w.ops_log());
      std::string line;
      std::map<pid_t, std::size_t> by_pid;
      while (std::getline(in, line)) {
        json j = json::parse(line, nullptr, false);
        if (!j.is_object()) continue;
        const std::string ev = j.value("ev", "");
        const pid_t pid = j.value("pid", -1);
        if (ev == "activate") {
          Activation a;
          a.worker = w.index;
          a.token = j.value("token", std::int64_t{0});
          a.pid = pid;
          a.at = a.last_send = from_ns(j.value("t", std::int64_t{0}));
          by_pid[pid] = out.size();
          out.push_back(a);
        } else if (ev == "send" && by_pid.count(pid)) {
          out[by_pid[pid]].last_send = from_ns(j.value("t", std::int64_t{0}));
        }
      }
    }
    std::sort(out.begin(), out.end(), [](const Activation& a, const Activation& b) { return a.at < b.at; });
    return out;
  }

  std::optional<Activation> running_leader(std::chrono::milliseconds timeout) {
    std::optional<Activation> found;
    wait_until(
        [&] {
          auto [wi, token] = leader();
          if (wi < 0) return false;
          for (const auto& a : activations())
            if (a.worker == wi && a.token == token && running_pid(a.pid)) {
              found = a;
              return true;
            }
          return false;
        },
        timeout);
    return found;
  }

  struct WriterOp {
    std::string op;
    Clock::time_point sent{};
    bool answered = false;
    int status = 0;
  };
  std::vector<WriterOp> writer_ops(int worker, pid_t pid) const {
    std::vector<WriterOp> out;
    std::ifstream in(workers_[static_cast<std::size_t>(worker)].ops_log());
    std::string line;
    while (std::getline(in, line)) {
      json j = json::parse(line, nullptr, false);
      if (!j.is_object() || j.value("pid", -1) != pid) continue;
      const std::string ev = j.value("ev", "");
      if (ev == "send") out.push_back({j.value("op", ""), from_ns(j.value("t", std::int64_t{0}))});
      else if (ev == "done" && !out.empty() && out.back().op == j.value("op", "")) {
        out.back().answered = true;
        out.back().status = j.value("status", 0);
      }
    }
    return out;
  }

  std::vector<fault::ClientOp> client_ops(Clock::time_point end) const {
    std::vector<fault::ClientOp> out = probes_;
    for (const auto& w : workers_) {
      std::ifstream in(w.ops_log());
      std::string line;
      std::map<std::string, std::size_t> by_op;
      while (std::getline(in, line)) {
        json j = json::parse(line, nullptr, false);
        if (!j.is_object()) continue;
        const std::string ev = j.value("ev", "");
        if (ev == "send") {
          fault::ClientOp c;
          c.op_id = j.value("op", "");
          c.resource = kResource;
          c.leader = w.id;
          c.generation = j.value("token", std::int64_t{0});
          c.sent = from_ns(j.value("t", std::int64_t{0}));
          c.done = end;
          c.error = "no answer logged (writer stopped)";
          by_op[c.op_id] = out.size();
          out.push_back(c);
        } else if (ev == "done" && by_op.count(j.value("op", ""))) {
          auto& c = out[by_op[j.value("op", "")]];
          c.status = j.value("status", 0);
          c.error = j.value("err", "");
          c.done = from_ns(j.value("t", std::int64_t{0}));
        }
      }
    }
    return out;
  }

  // The test itself writes with a deposed leader's token: must be refused 409 (recorded as a
  // client op of the history, so the checker matches its audit row and sees it never forwarded).
  int probe(std::int64_t token) {
    fault::ClientOp c;
    c.op_id = "probe-" + std::to_string(probes_.size());
    c.resource = kResource;
    c.leader = "probe";
    c.generation = token;
    c.sent = Clock::now();
    auto r = request(proxy_->port(), "POST", fault::op_target(kResource, c.op_id),
                     {{"Fencing-Token", std::to_string(token)}}, "{}", 6s);
    c.done = Clock::now();
    c.status = r.code() > 0 ? r.code() : 0;
    probes_.push_back(c);
    return c.status;
  }

  fault::History history(Clock::time_point end) {
    fault::History h;
    h.client = client_ops(end);
    for (const auto& r : upstream_->requests()) {
      fault::UpstreamOp u;
      std::string res;
      if (!fault::parse_op_target(r.target, &res, &u.op_id)) u.op_id.clear();
      u.resource = res.empty() ? kResource : res;
      u.generation = r.fencing_token().value_or(0);
      u.arrival = r.arrival;
      u.completion = r.completion;
      u.outcome = to_string(r.outcome);
      h.upstream.push_back(u);
    }
    for (const auto& row : read_audit(proxy_->db())) {
      fault::AuditFact a;
      std::string res;
      fault::parse_op_target(row.target, &res, &a.op_id);
      a.resource = row.resource;
      a.decision = row.decision;
      a.presented = row.presented_generation;
      a.current = row.current_generation;
      h.audit.push_back(a);
    }
    h.stored = stored_;
    for (const auto& e : events_) h.events.push_back({e.at, e.what});
    return h;
  }

  void sample_stored() {
    for (const auto& r : read_resources(proxy_->db()))
      stored_.push_back(fault::StoredSample{r.resource, r.generation, 1, Clock::now()});
  }

  void continue_worker(Worker& w, std::chrono::milliseconds between = 0ms) {
    if (w.stopped_group > 0) ::kill(-w.stopped_group, SIGCONT);
    if (between > 0ms) std::this_thread::sleep_for(between);
    if (w.elect) w.elect->kill(SIGCONT);
    for (pid_t p : w.stopped_others) ::kill(p, SIGCONT);
    w.stopped = false;
    w.stopped_group = -1;
    w.stopped_others.clear();
  }

  void stop_workers() {
    for (auto& w : workers_) {
      if (w.stopped) continue_worker(w);
      w.restart_at = {};
      if (w.elect && w.elect->running()) w.elect->kill(SIGTERM);
    }
    for (auto& w : workers_)
      if (w.elect && !w.elect->wait_for(5s)) {
        w.elect->kill(SIGKILL);
        w.elect->wait();
      }
  }

  std::string logs() const {
    std::string s = "--- schedule trace:\n" + trace_;
    for (const auto& w : workers_)
      for (int r = 0; r < w.runs; ++r)
        s += "--- " + w.id + " elect run " + std::to_string(r) + " (last 3 KiB):\n" + read_file(w.elect_log(r), 3072);
    if (proxy_) s += "--- fencegate (last 6 KiB):\n" + proxy_->log(6144);
    s += std::string("--- ") + to_string(s_.backend) + ":\n" + coord_.log();
    return s;
  }

  const Schedule& s_;
  std::string dir_;
  Coordinator coord_;
  std::unique_ptr<RecordingUpstream> upstream_;
  std::unique_ptr<Proxy> proxy_;
  std::uint16_t admin_port_ = 0;
  std::vector<Worker> workers_;
  std::vector<fault::ClientOp> probes_;
  std::vector<fault::Event> events_;
  std::vector<fault::StoredSample> stored_;
  std::string trace_;
  Clock::time_point t0_ = Clock::now();
};

// What the history checker does not know about: elections (as partition_test.cpp's).
void check_elections(const std::vector<Activation>& acts, const std::set<pid_t>& paused, const fault::History& h,
                     Clock::time_point t0, std::vector<std::string>* failures) {
  std::set<std::int64_t> tokens;
  for (const auto& a : acts)
    if (!tokens.insert(a.token).second) failures->push_back("two activations with token " + std::to_string(a.token));
  for (std::size_t i = 1; i < acts.size(); ++i)
    if (acts[i].token <= acts[i - 1].token)
      failures->push_back("activation order: w" + std::to_string(acts[i].worker) + " token " +
                          std::to_string(acts[i].token) + " started at +" + std::to_string(ms_since(t0, acts[i].at)) +
                          "ms after token " + std::to_string(acts[i - 1].token));
  for (const auto& a : acts)
    for (const auto& b : acts)
      if (b.token > a.token && !paused.count(a.pid) && a.last_send > b.at)
        failures->push_back("overlapping leaders: token " + std::to_string(a.token) + " sent a write at +" +
                            std::to_string(ms_since(t0, a.last_send)) + "ms, after token " + std::to_string(b.token) +
                            " started at +" + std::to_string(ms_since(t0, b.at)) + "ms");
  for (const auto& u : h.upstream)
    for (const auto& b : acts)
      if (u.generation < b.token && u.arrival > b.at) {
        failures->push_back("stale write forwarded after the fence: op " + u.op_id + " generation " +
                            std::to_string(u.generation) + " after token " + std::to_string(b.token) + " started");
        break;
      }
}

struct Result {
  std::vector<fault::Violation> violations;
  std::vector<std::string> failures;
  std::size_t ops = 0, accepted = 0, rejected = 0, activations = 0, late_refused = 0, probes_refused = 0;
  std::map<int, int> exits;
  std::string logs;
};

Result run_schedule(const Schedule& s) {
  Result res;
  TempDir dir("fencegate-bsched");
  World w(s, dir.path());
  w.setup();
  std::set<pid_t> paused;
  const auto bound = std::chrono::milliseconds(4 * kTtlS * 1000 + 12000);
  for (auto& wk : w.workers_) {
    w.start_worker(wk);
    w.run_for(150ms);
  }
  if (auto first = w.running_leader(20s)) {
    w.event("w" + std::to_string(first->worker) + " leads with token " + std::to_string(first->token));
    w.run_for(500ms);
  } else {
    res.failures.push_back("no leader started its command within 20 s of the start");
  }
  auto accepted_after = [&](Clock::time_point t) {
    for (const auto& c : w.client_ops(Clock::now()))
      if (c.sent > t && c.status >= 200 && c.status < 300) return true;
    return false;
  };

  for (std::size_t k = 0; k < s.steps.size() && res.failures.empty(); ++k) {
    const FaultStep& f = s.steps[k];
    auto cur = w.running_leader(bound);
    if (!cur) {
      res.failures.push_back(std::string("no running leader before ") + to_string(f.kind));
      break;
    }
    Worker& lw = w.workers_[static_cast<std::size_t>(cur->worker)];
    const std::size_t exits_before = lw.exit_codes.size();
    const std::string who = lw.id + " (token " + std::to_string(cur->token) + ")";
    auto successor_started = [&] {
      for (const auto& a : w.activations())
        if (a.token > cur->token) return true;
      return false;
    };
    Clock::time_point resumed_at{};
    switch (f.kind) {
      case Fault::sigstop:
        w.event("SIGSTOP " + who + ": elect, its command and its guardian");
        ::kill(-cur->pid, SIGSTOP);
        lw.elect->kill(SIGSTOP);
        for (pid_t p : children_of(lw.elect->pid()))
          if (p != cur->pid && ::kill(p, SIGSTOP) == 0) lw.stopped_others.push_back(p);
        lw.stopped = true;
        lw.stopped_group = cur->pid;
        paused.insert(cur->pid);
        w.run_for(std::chrono::milliseconds(f.duration_ms));
        resumed_at = Clock::now();
        w.event("SIGCONT " + lw.id + "'s command, 400 ms later its elect");
        w.continue_worker(lw, 400ms);
        break;
      case Fault::kill9:
        w.event("kill -9 " + who + "'s elect");
        lw.elect->kill(SIGKILL);
        break;
      case Fault::restart:
        w.event(std::string("stop ") + to_string(s.backend));
        w.coord_.stop();
        w.run_for(std::chrono::milliseconds(f.duration_ms));
        w.event(std::string("start ") + to_string(s.backend));
        if (!w.coord_.start()) res.failures.push_back(std::string(to_string(s.backend)) + " did not restart");
        w.event(std::string(to_string(s.backend)) + " serving");
        break;
    }
    const auto healed = Clock::now();
    if (!w.wait_until([&] { return accepted_after(healed); }, bound))
      res.failures.push_back(std::string("liveness: no accepted write within ") + std::to_string(bound.count()) +
                             " ms after " + to_string(f.kind));
    w.event(std::string("recovered from ") + to_string(f.kind) + " in " +
            std::to_string(ms_since(healed, Clock::now())) + " ms");
    if (f.kind != Fault::restart) {
      if (!w.wait_until(successor_started, 5s))
        res.failures.push_back(std::string("after ") + to_string(f.kind) + " of " + who +
                               " no command with a higher token started");
      if (!w.wait_until([&] { return lw.exit_codes.size() > exits_before; }, 5s)) {
        res.failures.push_back(std::string("after ") + to_string(f.kind) + " " + who + "'s elect did not exit");
      } else {
        const int want = f.kind == Fault::sigstop ? 75 : 128 + SIGKILL;
        if (lw.exit_codes[exits_before] != want)
          res.failures.push_back(std::string("after ") + to_string(f.kind) + " " + who + "'s elect exited " +
                                 std::to_string(lw.exit_codes[exits_before]) + ", not " + std::to_string(want));
      }
      // Its command is stopped (by elect, its guardian or the parent-death signal).
      if (!w.wait_until([&] { return !running_pid(cur->pid); }, 3s))
        res.failures.push_back(std::string("after ") + to_string(f.kind) + " " + who + "'s command (pid " +
                               std::to_string(cur->pid) + ") still runs");
      // And its token is refused at the resource.
      const int st = w.probe(cur->token);
      w.event("write with " + who + "'s token: " + std::to_string(st));
      if (st != 409) res.failures.push_back("a write with the deposed " + who + "'s token got " + std::to_string(st));
      else ++res.probes_refused;
    }
    if (f.kind == Fault::sigstop) {
      int late = 0;
      std::string what;
      for (const auto& o : w.writer_ops(cur->worker, cur->pid))
        if (o.sent > resumed_at) {
          ++late;
          if (o.answered && o.status == 409) ++res.late_refused;
          else if (o.answered && o.status >= 200 && o.status < 300)
            res.failures.push_back("sigstop: " + who + "'s late write " + o.op + " was accepted");
          what += " " + o.op + ":" + (o.answered ? std::to_string(o.status) : std::string("no answer"));
        }
      w.event(lw.id + "'s command sent " + std::to_string(late) + " write(s) after SIGCONT:" + what);
    }
    w.sample_stored();
    w.run_for(300ms);
  }

  w.event("stopping workers");
  for (const auto& wk : w.workers_)
    for (int c : wk.exit_codes) ++res.exits[c];
  w.stop_workers();
  w.run_for(300ms);
  w.sample_stored();
  fault::History h = w.history(Clock::now());
  res.violations = fault::check(h);
  const auto acts = w.activations();
  res.activations = acts.size();
  check_elections(acts, paused, h, w.t0_, &res.failures);
  for (const auto& c : h.client) {
    ++res.ops;
    if (c.status >= 200 && c.status < 300) ++res.accepted;
    else if (c.status == 409) ++res.rejected;
  }
  if (res.accepted == 0) res.failures.push_back("no write was accepted at all");
  res.logs = !res.violations.empty() || !res.failures.empty() ? w.logs() : "--- schedule trace:\n" + w.trace_;
  return res;
}

bool backend_available(Backend b) {
  switch (b) {
    case Backend::etcd:
      if (etcd_available()) return true;
      MESSAGE("SKIPPED: /usr/bin/etcd is not installed (apt-get install etcd-server)");
      return false;
    case Backend::zk:
      if (zk_available()) return true;
      MESSAGE("SKIPPED: the ZooKeeper server is not installed (apt-get install zookeeper default-jre)");
      return false;
    case Backend::redis:
      if (redis_available()) return true;
      MESSAGE("SKIPPED: redis-server is not installed (apt-get install redis-server)");
      return false;
  }
  return false;
}

void run_backend(Backend b) {
  if (const char* only = std::getenv("FG_FAULT_BACKENDS");
      only && *only &&
      ("," + std::string(only) + ",").find("," + std::string(to_string(b)) + ",") == std::string::npos) {
    MESSAGE("SKIPPED: FG_FAULT_BACKENDS=", only);
    return;
  }
  if (!backend_available(b)) return;
  std::uint64_t seed = env_u64("FG_FAULT_SEED", 0);
  if (seed == 0) seed = std::random_device{}() | 1;
  // CI: two schedules of two faults per backend (the deck of three kinds covers each at least once).
  const int count = static_cast<int>(env_u64("FG_FAULT_BACKENDS_SCHEDULES", 2));
  const int faults = static_cast<int>(env_u64("FG_FAULT_BACKENDS_FAULTS", 2));
  const auto t = Clock::now();
  int failed = 0;
  for (const auto& s : make_schedules(b, seed, count, faults)) {
    const auto ts = Clock::now();
    Result r = run_schedule(s);
    std::string exits;
    for (const auto& [c, n] : r.exits) exits += " " + std::to_string(c) + "x" + std::to_string(n);
    MESSAGE(s.describe(), " -- ", ms_since(ts, Clock::now()), " ms; ops=", r.ops, " accepted=", r.accepted,
            " 409=", r.rejected, " activations=", r.activations, " late writes refused=", r.late_refused,
            " deposed tokens refused=", r.probes_refused, " elect exits:", exits);
    if (std::getenv("FG_FAULT_VERBOSE")) MESSAGE(r.logs);
    INFO(s.describe());
    INFO("replay: FG_FAULT_SEED=", s.seed, " FG_FAULT_BACKENDS_SCHEDULES=", s.index + 1,
         " FG_FAULT_BACKENDS=", std::string(to_string(b)), " test_fault -tc='backends schedule*'");
    std::string failures;
    for (const auto& f : r.failures) failures += "  " + f + "\n";
    CHECK_MESSAGE(r.violations.empty(), "history checker:\n", fault::describe(r.violations), "\n", r.logs);
    CHECK_MESSAGE(r.failures.empty(), "elections:\n", failures, "\n", r.logs);
    if (!r.violations.empty() || !r.failures.empty()) ++failed;
  }
  MESSAGE(std::string(to_string(b)), " schedules (FG_FAULT_SEED=", seed, "): ", count, " in ",
          ms_since(t, Clock::now()), " ms, ", failed, " failed");
}

}  // namespace
}  // namespace fencegate::testing

using namespace fencegate::testing;

TEST_CASE(
    "backends schedule: etcd -- seeded SIGSTOPs, kill -9s and restarts against elect workers; the history "
    "keeps the contract") {
  run_backend(Backend::etcd);
}

TEST_CASE(
    "backends schedule: ZooKeeper -- seeded SIGSTOPs, kill -9s and restarts against elect workers; the "
    "history keeps the contract") {
  run_backend(Backend::zk);
}

TEST_CASE(
    "backends schedule: Redis -- seeded SIGSTOPs, kill -9s and restarts against elect workers; the history "
    "keeps the contract") {
  run_backend(Backend::redis);
}
