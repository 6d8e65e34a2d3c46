// `fencegate elect` / `fencegate leader` over ZooKeeper and Redis (election_client/backend.h):
// the real binary against a real server started here, a real `fencegate serve` in front of a
// recording upstream as the fenced resource.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>

#include "election_client/backend.h"
#include "election_client/guardian.h"
#include "tests/election/coord_harness.h"
#include "tests/support/http_client.h"
#include "tests/support/net_util.h"
#include "tests/support/upstream.h"

using namespace fencegate::testing;
using json = nlohmann::json;

namespace {

std::string logs_of(const std::vector<const Contender*>& cs) {
  std::string s;
  for (const Contender* c : cs) s += "--- " + c->name + " log:\n" + c->log();
  return s;
}

// A free port other than `taken` (free_port() may hand out a port twice while it is unused).
std::uint16_t distinct_port(std::initializer_list<std::uint16_t> taken) {
  for (;;) {
    std::uint16_t p = free_port();
    if (std::find(taken.begin(), taken.end(), p) == taken.end()) return p;
  }
}

// A fencegate serve with one resource "ledger" in front of a recording upstream.
struct FencedResource {
  explicit FencedResource(const TempDir& dir)
      : data_port(free_port()),
        admin_port(distinct_port({data_port})),
        serve(Process::start({kFencegate, "serve", "--listen", "127.0.0.1:" + std::to_string(data_port), "--upstream",
                              upstream.url(), "--resource", "ledger", "--db", dir.file("fence.db"), "--admin-listen",
                              "127.0.0.1:" + std::to_string(admin_port)},
                             ProcessOptions{dir.file("serve.log"), {}, {}})),
        log_path(dir.file("serve.log")) {}
  bool wait() { return serve.wait_for_port(data_port) && serve.wait_for_port(admin_port); }
  std::string fence_url() const { return "http://127.0.0.1:" + std::to_string(admin_port) + "/v1/resources/ledger"; }
  std::int64_t generation() {
    auto r = request(admin_port, "GET", "/v1/resources/ledger");
    if (r.code() != 200) return 0;
    return json::parse(r.response.body).value("generation", std::int64_t{0});
  }
  int write(std::int64_t token) {
    return request(data_port, "POST", "/charge", {{"Fencing-Token", std::to_string(token)}}).code();
  }

  RecordingUpstream upstream;
  std::uint16_t data_port, admin_port;
  Process serve;
  std::string log_path;
};

// `fencegate serve` with one route "/" -> upstream, resource "ledger", whose authority is the
// election `billing` at `coordinator` (issue 31: "authority": {"coordinator": URL, ...}).
struct CoordinatorProxy {
  CoordinatorProxy(const TempDir& dir, const std::string& coordinator, const std::string& upstream,
                   const std::string& auth_file = "", const std::string& name = "fencegate",
                   const json& more = json::object())
      : port(free_port()), admin_port(distinct_port({port})), dir_(dir), name_(name) {
    json authority = {{"coordinator", coordinator}, {"election", "billing"}};
    if (!auth_file.empty()) authority["auth_file"] = auth_file;
    for (const auto& [k, v] : more.items()) authority[k] = v;
    json c = {{"listen", "127.0.0.1:" + std::to_string(port)},
              {"db", dir.file(name + ".db")},
              {"threads", 2},
              {"admin", {{"listen", "127.0.0.1:" + std::to_string(admin_port)}}},
              {"routes",
               {{{"prefix", "/"}, {"upstream", upstream}, {"resource", "ledger"}, {"authority", authority}}}}};
    write_file(dir.file(name_ + ".json"), c.dump(2));
  }
  bool start() {
    process = std::make_unique<Process>(Process::start({kFencegate, "serve", "--config", dir_.file(name_ + ".json")},
                                                       ProcessOptions{dir_.file(name_ + ".log"), {}, {}}));
    return process->wait_for_port(port, 15s) && process->wait_for_port(admin_port, 15s);
  }
  std::string log() const { return "serve log:\n" + read_file(dir_.file(name_ + ".log"), 16 * 1024); }
  ReadResult write(std::int64_t g) const {
    return request(port, "POST", "/ledger/charge", {{"Fencing-Token", std::to_string(g)}}, "{}", 10s);
  }
  std::string type(std::int64_t g) const {
    json j = json::parse(write(g).response.body, nullptr, false);
    return j.is_object() && j.contains("type") ? j["type"].get<std::string>() : "";
  }
  std::int64_t generation() const {
    auto r = request(admin_port, "GET", "/v1/resources/ledger", {}, {}, 5s);
    if (r.code() != 200) return 0;
    return json::parse(r.response.body).value("generation", std::int64_t{0});
  }

  std::uint16_t port, admin_port;
  const TempDir& dir_;
  std::string name_;
  std::unique_ptr<Process> process;
};

CommandResult leader_of(const std::string& coordinator, const std::string& election,
                        const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv{kFencegate, "leader", "--coordinator", coordinator, "--election", election};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return run_command(argv, 15s);
}

// Two workers; the leader is SIGSTOPped past its TTL; the successor fences and writes; the old one
// resumes: its command was killed (by its guardian, at the lease's earliest expiry), elect exits
// 75, and its token is refused 409 at the resource. `leader` then prints the successor.
void failover_scenario(const std::string& coordinator, const std::vector<std::string>& extra = {}) {
  TempDir dir("fencegate-backend");
  FencedResource res(dir);
  REQUIRE_MESSAGE(res.wait(), read_file(res.log_path));
  auto flags = [&](const std::string& id) {
    std::vector<std::string> f{"--coordinator", coordinator, "--election", "ledger", "--id",    id,
                               "--ttl",         "2",         "--grace-ms", "1000",   "--fence", res.fence_url()};
    f.insert(f.end(), extra.begin(), extra.end());
    return f;
  };
  Contender a = start_contender(dir.path(), "a", flags("worker-a"));
  INFO(logs_of({&a}));
  REQUIRE(eventually([&] { return a.started_command(); }, 15s));
  const std::int64_t ta = a.token();
  CHECK(ta > 0);
  CHECK(res.generation() == ta);  // fenced before the command ran
  const pid_t a_child = a.child_pid();
  REQUIRE(pid_alive(a_child));
  CHECK(res.write(ta) == 200);
  {
    auto l = leader_of(coordinator, "ledger", extra);
    REQUIRE_MESSAGE(l.code() == 0, l.err);
    CHECK(json::parse(l.out) == json{{"election", "ledger"}, {"leader", "worker-a"}, {"token", ta}});
  }

  Contender b = start_contender(dir.path(), "b", flags("worker-b"));
  std::this_thread::sleep_for(1000ms);
  CHECK_FALSE(b.started_command());  // waiting

  a.process->kill(SIGSTOP);
  const auto stopped_at = Clock::now();
  const bool b_won = eventually([&] { return b.started_command(); }, 15s);
  INFO(logs_of({&a, &b}));
  REQUIRE(b_won);
  const std::int64_t tb = b.token();
  CHECK(tb > ta);
  CHECK(res.generation() == tb);
  MESSAGE("B took over ", std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - stopped_at).count(),
          " ms after A was stopped");
  CHECK_FALSE(pid_alive(a_child));  // the guardian killed it at A's earliest expiry
  CHECK(res.write(tb) == 200);

  a.process->kill(SIGCONT);
  auto st = a.process->wait_for(10s);
  REQUIRE(st.has_value());
  CHECK(st->exited);
  CHECK(st->code == 75);
  CHECK(a.log().find("leadership lost") != std::string::npos);
  CHECK(res.write(ta) == 409);  // the old leader is refused at the resource
  CHECK(res.write(tb) == 200);

  auto l = leader_of(coordinator, "ledger", extra);
  REQUIRE_MESSAGE(l.code() == 0, l.err);
  CHECK(json::parse(l.out) == json{{"election", "ledger"}, {"leader", "worker-b"}, {"token", tb}});
  b.process->kill(SIGTERM);
  auto bs = b.process->wait_for(10s);
  REQUIRE(bs.has_value());
  CHECK(bs->code == 128 + SIGTERM);
  // B resigned: no leader now.
  CHECK(leader_of(coordinator, "ledger", extra).code() == 3);
}

std::string secret_file(const TempDir& dir, const std::string& name, const std::string& text, mode_t mode = 0600) {
  const std::string p = dir.file(name);
  write_file(p, text);
  ::chmod(p.c_str(), mode);
  return p;
}

}  // namespace

TEST_CASE("coordinator URLs: etcd://, zk:// with chroot, redis:// with db; bad ones are refused") {
  using fencegate::election::Coordinator;
  using fencegate::election::parse_coordinator;
  Coordinator c;
  std::string why;
  REQUIRE(parse_coordinator("etcd://127.0.0.1:2379,etcd-b:2379", &c, &why));
  CHECK(c.kind == Coordinator::Kind::etcd);
  CHECK(c.endpoints == std::vector<std::string>{"http://127.0.0.1:2379", "http://etcd-b:2379"});
  REQUIRE(parse_coordinator("zk://a:2181,b:2182/apps/billing/", &c, &why));
  CHECK(c.kind == Coordinator::Kind::zookeeper);
  CHECK(c.endpoints == std::vector<std::string>{"a:2181", "b:2182"});
  CHECK(c.chroot == "/apps/billing");
  REQUIRE(parse_coordinator("redis://127.0.0.1:6380/3", &c, &why));
  CHECK(c.kind == Coordinator::Kind::redis);
  CHECK(c.endpoints == std::vector<std::string>{"127.0.0.1:6380"});
  CHECK(c.db == 3);
  REQUIRE(parse_coordinator("redis://localhost", &c, &why));
  CHECK(c.endpoints == std::vector<std::string>{"localhost:6379"});
  CHECK_FALSE(parse_coordinator("http://127.0.0.1:2379", &c, &why));
  CHECK(why.find("unknown scheme") != std::string::npos);
  CHECK_FALSE(parse_coordinator("redis://a:1,b:2", &c, &why));
  CHECK_FALSE(parse_coordinator("redis://a:1/x", &c, &why));
  CHECK_FALSE(parse_coordinator("zk://a:99999", &c, &why));
  CHECK_FALSE(parse_coordinator("zk://a:1//x", &c, &why));
  CHECK_FALSE(parse_coordinator("etcd://a:1/path", &c, &why));
  CHECK_FALSE(parse_coordinator("127.0.0.1:2181", &c, &why));
  // hiredis 0.14 has no TLS: rediss:// is refused, never spoken in clear text.
  CHECK_FALSE(parse_coordinator("rediss://127.0.0.1:6380", &c, &why));
  CHECK(why.find("rediss:// needs hiredis with TLS (1.0+); this build has 0.14") != std::string::npos);
}

TEST_CASE("elect/leader --coordinator: bad URLs, --etcd with --coordinator, and auth files are refused with exit 2") {
  TempDir dir("fencegate-coordflags");
  auto run = [](std::vector<std::string> args) {
    std::vector<std::string> argv{kFencegate};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_command(argv, 10s);
  };
  auto r = run({"elect", "--coordinator", "mysql://x:1", "--election", "e", "--", "true"});
  CHECK(r.code() == 2);
  CHECK(r.err.find("--coordinator: unknown scheme") != std::string::npos);
  r = run({"leader", "--coordinator", "rediss://127.0.0.1:6380", "--election", "e"});
  CHECK(r.code() == 2);
  CHECK_MESSAGE(r.err.find("--coordinator: rediss:// needs hiredis with TLS (1.0+)") != std::string::npos, r.err);
  r = run(
      {"elect", "--coordinator", "zk://127.0.0.1:1", "--etcd", "http://127.0.0.1:2", "--election", "e", "--", "true"});
  CHECK(r.code() == 2);
  CHECK(r.err.find("give one of them") != std::string::npos);
  r = run({"leader", "--election", "e"});
  CHECK(r.code() == 2);
  CHECK(r.err.find("--coordinator: required") != std::string::npos);
  const std::string open = secret_file(dir, "open", "user:password", 0644);
  r = run({"elect", "--coordinator", "zk://127.0.0.1:1", "--zk-auth", open, "--election", "e", "--", "true"});
  CHECK(r.code() == 2);
  CHECK(r.err.find("--zk-auth: " + open + " has mode 0644") != std::string::npos);
  const std::string nouser = secret_file(dir, "nouser", "password-only\n");
  r = run({"leader", "--coordinator", "zk://127.0.0.1:1", "--zk-auth", nouser, "--election", "e"});
  CHECK(r.code() == 2);
  CHECK(r.err.find("must hold user:password") != std::string::npos);
  CHECK(r.err.find("password-only") == std::string::npos);  // never shown
  r = run({"leader", "--coordinator", "zk://127.0.0.1:1", "--redis-auth", nouser, "--election", "e"});
  CHECK(r.code() == 2);
  CHECK(r.err.find("--redis-auth: only for a redis:// coordinator") != std::string::npos);
  // Unreachable: exit 1 naming the backend.
  r = run({"leader", "--coordinator", "redis://127.0.0.1:" + std::to_string(free_port()), "--election", "e"});
  CHECK(r.code() == 1);
}

TEST_CASE(
    "elect over ZooKeeper: a SIGSTOPped leader loses its session to a successor with a larger czxid; the old "
    "one is refused 409 and its command stopped") {
  FG_REQUIRE_ZK();
  ZkServer zk;
  FG_START_ZK(zk);
  failover_scenario(zk.url("/fencegate/test"));
}

TEST_CASE(
    "elect over Redis: a SIGSTOPped leader's lock expires; the successor's generation is larger; the old one is "
    "refused 409 and its command stopped") {
  FG_REQUIRE_REDIS();
  RedisServer redis;
  FG_START_REDIS(redis);
  failover_scenario(redis.url(2));
}

TEST_CASE(
    "ZooKeeper: with many contenders, killing the leader wakes at most two of them (each watches only its "
    "predecessor)") {
  FG_REQUIRE_ZK();
  ZkServer zk;
  FG_START_ZK(zk);
  TempDir dir("fencegate-herd");
  constexpr int kContenders = 50;
  std::vector<Contender> cs;
  cs.reserve(kContenders);
  for (int i = 0; i < kContenders; ++i) {
    cs.push_back(start_contender(dir.path(), "c" + std::to_string(i),
                                 {"--coordinator", zk.url(), "--election", "herd", "--id", "c" + std::to_string(i),
                                  "--ttl", "10", "--log-level", "debug"}));
    if (i == 0) REQUIRE(eventually([&] { return cs[0].started_command(); }, 15s));
  }
  // Everyone is in line (each logged its candidate node and the predecessor it waits for).
  REQUIRE(eventually(
      [&] {
        return std::all_of(cs.begin() + 1, cs.end(), [](const Contender& c) {
          return c.log().find("waiting for the predecessor") != std::string::npos;
        });
      },
      30s));
  auto fired = [&] {
    int n = 0;
    for (const auto& c : cs)
      if (c.log().find("zookeeper watch fired") != std::string::npos) ++n;
    return n;
  };
  CHECK(fired() == 0);
  const std::int64_t t0 = cs[0].token();
  cs[0].process->kill(SIGKILL);  // its session closes with the process's socket; expiry at the latest
  auto leaders = [&] {
    std::vector<int> v;
    for (int i = 1; i < kContenders; ++i)
      if (cs[i].started_command()) v.push_back(i);
    return v;
  };
  REQUIRE(eventually([&] { return !leaders().empty(); }, 30s));
  std::this_thread::sleep_for(1000ms);  // time for any herd to show
  const int woke = fired();
  MESSAGE("contenders whose watch fired: ", woke);
  CHECK(woke >= 1);
  CHECK(woke <= 2);
  const std::vector<int> now = leaders();
  REQUIRE(now.size() == 1);  // one successor, the one whose predecessor went
  CHECK(cs[now.front()].token() > t0);
  CHECK(cs[now.front()].log().find("zookeeper watch fired") != std::string::npos);
  for (auto& c : cs) c.process->kill(SIGTERM);
  for (auto& c : cs) c.process->wait_for(10s);
}

TEST_CASE("ZooKeeper: digest auth from --zk-auth under a chroot; the nodes are the creator's only") {
  FG_REQUIRE_ZK();
  ZkServer zk;
  FG_START_ZK(zk);
  TempDir dir("fencegate-zkauth");
  const std::string auth = secret_file(dir, "zk-auth", "billing:s3cret-password\n");
  const std::string url = zk.url("/shared/billing");
  Contender a =
      start_contender(dir.path(), "a",
                      {"--coordinator", url, "--zk-auth", auth, "--election", "jobs", "--id", "a", "--ttl", "4"});
  INFO(logs_of({&a}));
  REQUIRE(eventually([&] { return a.started_command(); }, 15s));
  auto l = leader_of(url, "jobs", {"--zk-auth", auth});
  REQUIRE_MESSAGE(l.code() == 0, l.err);
  CHECK(json::parse(l.out) == json{{"election", "jobs"}, {"leader", "a"}, {"token", a.token()}});
  // Without the credentials the election cannot even be read (creator-only ACL): exit 1.
  auto anon = leader_of(url, "jobs");
  CHECK(anon.code() == 1);
  CHECK(anon.out.empty());
  // Another chroot is another namespace: no leader there.
  CHECK(leader_of(zk.url("/shared/other"), "jobs").code() == 3);
  a.process->kill(SIGTERM);
  a.process->wait_for(10s);

  // A route's authority reads the election with "auth_file"; without it, it cannot: 503.
  Contender b =
      start_contender(dir.path(), "b", {"--coordinator", url, "--zk-auth", auth, "--election", "billing", "--id", "b"});
  REQUIRE(eventually([&] { return b.started_command(); }, 15s));
  RecordingUpstream upstream;
  CoordinatorProxy with(dir, url, upstream.url(), auth, "with"), without(dir, url, upstream.url(), "", "without");
  INFO(with.log(), without.log());
  REQUIRE(with.start());
  REQUIRE(without.start());
  CHECK(eventually([&] { return with.generation() == b.token(); }, 10s));
  CHECK(with.write(b.token()).code() == 200);
  CHECK(without.write(b.token()).code() == 503);
  CHECK(without.generation() == 0);
  b.process->kill(SIGTERM);
  b.process->wait_for(10s);
}

TEST_CASE("Redis: the password comes from --redis-auth; a wrong one is refused; tokens keep growing across terms") {
  FG_REQUIRE_REDIS();
  RedisServer redis;
  FG_START_REDIS(redis, {"--requirepass", "correct-horse-battery"});
  TempDir dir("fencegate-redisauth");
  const std::string good = secret_file(dir, "good", "correct-horse-battery\n");
  const std::string acl = secret_file(dir, "acl", "default:correct-horse-battery\n");
  const std::string bad = secret_file(dir, "bad", "wrong-password\n");
  auto r = run_command({kFencegate, "elect", "--coordinator", redis.url(), "--redis-auth", bad, "--election", "e", "--",
                        "true"},
                       15s);
  CHECK(r.code() == 1);
  CHECK(r.err.find("AUTH refused") != std::string::npos);
  CHECK(r.err.find("wrong-password") == std::string::npos);
  std::int64_t last = 0;
  for (const auto& file : {good, acl, good}) {
    r = run_command({kFencegate, "elect", "--coordinator", redis.url(), "--redis-auth", file, "--election", "e", "--",
                     "sh", "-c", "echo $FENCING_TOKEN"},
                    15s);
    REQUIRE_MESSAGE(r.code() == 0, r.err);
    const std::int64_t t = std::stoll(r.out);
    CHECK(t > last);
    last = t;
  }
  CHECK(leader_of(redis.url(), "e", {"--redis-auth", good}).code() == 3);  // each resigned
}

namespace {

// The proxy follows the election itself: the leader's token is fenced in before the leader
// writes; a forged token, a former leader, and a leader that resigned with no successor are
// refused 409; the coordinator unreachable -> 503.
void authority_scenario(const std::string& coordinator, const std::function<void()>& stop_coordinator) {
  TempDir dir("fencegate-coordauth");
  RecordingUpstream upstream;
  CoordinatorProxy proxy(dir, coordinator, upstream.url());
  INFO(proxy.log());
  REQUIRE(proxy.start());
  auto flags = [&](const std::string& id) {
    return std::vector<std::string>{"--coordinator", coordinator, "--election", "billing", "--id", id, "--ttl", "3"};
  };
  Contender a = start_contender(dir.path(), "a", flags("worker-a"));
  INFO(logs_of({&a}));
  REQUIRE(eventually([&] { return a.started_command(); }, 15s));
  const std::int64_t ta = a.token();
  CHECK(eventually([&] { return proxy.generation() == ta; }, 10s));  // advanced by the proxy, no --fence
  CHECK(proxy.write(ta).code() == 200);
  constexpr std::int64_t kForged = 9223372036854775807;
  CHECK(proxy.write(kForged).code() == 409);
  CHECK(proxy.type(kForged) == "urn:fencegate:problem:unknown-generation");
  CHECK(proxy.generation() == ta);  // never advanced to an unconfirmed token

  Contender b = start_contender(dir.path(), "b", flags("worker-b"));
  std::this_thread::sleep_for(500ms);
  a.process->kill(SIGTERM);  // A resigns; B takes over
  REQUIRE(eventually([&] { return b.started_command(); }, 15s));
  const std::int64_t tb = b.token();
  CHECK(tb > ta);
  CHECK(eventually([&] { return proxy.generation() == tb; }, 10s));
  auto r = proxy.write(ta);
  CHECK(r.code() == 409);
  CHECK(proxy.type(ta) == "urn:fencegate:problem:stale-generation");
  CHECK(proxy.write(tb).code() == 200);

  b.process->kill(SIGTERM);  // B resigns, nobody leads: B's token is no leader's any more
  b.process->wait_for(10s);
  CHECK(eventually([&] { return proxy.write(tb).code() == 409; }, 10s));
  CHECK(proxy.type(tb) == "urn:fencegate:problem:not-leader");

  stop_coordinator();
  CHECK(eventually([&] { return proxy.write(tb).code() == 503; }, 10s));
  CHECK(proxy.generation() == tb);
}

}  // namespace

TEST_CASE(
    "authority over ZooKeeper: the proxy follows the election; old, forged and resigned tokens get 409; "
    "ZooKeeper down -> 503") {
  FG_REQUIRE_ZK();
  ZkServer zk;
  FG_START_ZK(zk);
  authority_scenario(zk.url("/fg"), [&] { zk.stop(); });
}

TEST_CASE(
    "authority over Redis: the proxy follows the lock; old, forged and resigned tokens get 409; Redis down -> "
    "503") {
  FG_REQUIRE_REDIS();
  RedisServer redis;
  FG_START_REDIS(redis);
  authority_scenario(redis.url(1), [&] { redis.stop(); });
}

TEST_CASE(
    "authority.coordinator: a bad URL, both etcd and coordinator, or a bad auth_file is a config error "
    "(exit 2)") {
  TempDir dir("fencegate-coordcfg");
  const std::string open_file = secret_file(dir, "open", "u:p", 0644);
  const std::string no_user = secret_file(dir, "nouser", "password");
  for (const auto& [authority, msg] :
       {std::pair<json, std::string>{json{{"coordinator", "mysql://db:3306"}, {"election", "e"}},
                                     "routes[0].authority.coordinator: must be etcd://host:port"},
        std::pair<json, std::string>{json{{"coordinator", "rediss://a:6380"}, {"election", "e"}},
                                     "routes[0].authority.coordinator: rediss:// needs hiredis with TLS (1.0+)"},
        std::pair<json, std::string>{json{{"coordinator", "zk://a:1"}, {"poll_ms", 5000}, {"election", "e"}},
                                     "routes[0].authority.poll_ms: only for a redis:// coordinator"},
        std::pair<json, std::string>{json{{"etcd", {"http://a:2379"}}, {"poll_ms", 5000}, {"election", "e"}},
                                     "routes[0].authority.poll_ms: only for a redis:// coordinator"},
        std::pair<json, std::string>{json{{"coordinator", "redis://a:1"}, {"poll_ms", 10}, {"election", "e"}},
                                     "routes[0].authority.poll_ms: must be an integer from 50 to 600000"},
        std::pair<json, std::string>{json{{"coordinator", "redis://a:1,b:2"}, {"election", "e"}},
                                     "routes[0].authority.coordinator: must be"},
        std::pair<json, std::string>{json{{"coordinator", "zk://a:1"}, {"etcd", {"http://a:2379"}}, {"election", "e"}},
                                     "give either \"etcd\" or \"coordinator\""},
        std::pair<json, std::string>{json{{"coordinator", "zk://a:1"}, {"auth_file", open_file}, {"election", "e"}},
                                     "routes[0].authority.auth_file: " + open_file + " has mode 0644"},
        std::pair<json, std::string>{json{{"coordinator", "zk://a:1"}, {"auth_file", no_user}, {"election", "e"}},
                                     "must hold user:password"},
        std::pair<json, std::string>{json{{"etcd", {"http://a:2379"}}, {"auth_file", no_user}, {"election", "e"}},
                                     "routes[0].authority.auth_file: only for a zk:// or redis:// coordinator"}}) {
    json c = {{"listen", "127.0.0.1:0"},
              {"db", dir.file("fence.db")},
              {"routes", {{{"prefix", "/"}, {"upstream", "http://127.0.0.1:9"}, {"authority", authority}}}}};
    write_file(dir.file("c.json"), c.dump());
    auto r = run_command({kFencegate, "serve", "--config", dir.file("c.json")}, 10s);
    CHECK(r.code() == 2);
    CHECK_MESSAGE(r.err.find(msg) != std::string::npos, r.err);
  }
}

namespace {

ReadResult status_get(std::uint16_t port, const std::string& path) { return request(port, "GET", path, {}, {}, 5s); }

// The value of an exposition line "name{labels} value" (or "name value"); -1 if absent.
double metric(const std::string& text, const std::string& series) {
  const auto at = text.find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + series.size() + 2));
}

}  // namespace

TEST_CASE(
    "elect --catch-up runs with the token before the fences and the command; a failing or slow catch-up "
    "resigns (exit 76); --status-listen serves /readyz and the fencegate_elect_* metrics") {
  FG_REQUIRE_REDIS();
  RedisServer redis;
  FG_START_REDIS(redis);
  TempDir dir("fencegate-catchup");
  FencedResource res(dir);
  REQUIRE_MESSAGE(res.wait(), read_file(res.log_path));
  const std::uint16_t pa = distinct_port({res.data_port, res.admin_port, redis.port()});
  const std::uint16_t pb = distinct_port({res.data_port, res.admin_port, redis.port(), pa});
  auto flags = [&](const std::string& id, const std::string& catch_up, std::uint16_t status_port) {
    std::vector<std::string> f{"--coordinator", redis.url(), "--election", "ledger",        "--id",       id,
                               "--ttl",         "2",         "--fence",    res.fence_url(), "--catch-up", catch_up};
    if (status_port) f.insert(f.end(), {"--status-listen", "127.0.0.1:" + std::to_string(status_port)});
    return f;
  };
  // A's catch-up records the token and the fence's generation at that moment (not yet advanced).
  const std::string fence_get = "http://127.0.0.1:" + std::to_string(res.admin_port) + "/v1/resources/ledger";
  Contender a = start_contender(dir.path(), "a",
                                flags("worker-a",
                                      "echo $FENCING_TOKEN > '" + dir.file("catchup.token") + "'; test -z \"$(ls '" +
                                          dir.file("a.token") + "' 2>/dev/null)\" && sleep 0.3",
                                      pa));
  INFO(logs_of({&a}));
  REQUIRE(eventually([&] { return a.started_command(); }, 15s));
  const std::int64_t ta = a.token();
  CHECK(read_file(dir.file("catchup.token")) == std::to_string(ta) + "\n");
  CHECK(res.generation() == ta);
  CHECK(a.log().find("\"msg\":\"failover breakdown\"") != std::string::npos);
  CHECK(a.log().find("\"catch_up_ms\":") != std::string::npos);
  CHECK(status_get(pa, "/readyz").code() == 200);
  CHECK(eventually(
      [&] {
        return metric(status_get(pa, "/metrics").response.body, "fencegate_elect_renewal_margin_seconds_count") >= 1;
      },
      5s));
  const std::string m = status_get(pa, "/metrics").response.body;
  CHECK(metric(m, "fencegate_elect_leader") == 1);
  CHECK(metric(m, "fencegate_elect_generation") == ta);
  CHECK(metric(m, "fencegate_elect_campaigns_total") == 1);
  CHECK(metric(m, "fencegate_elect_stage_seconds{stage=\"catch_up\"}") >= 0.3);
  CHECK(metric(m, "fencegate_elect_stage_seconds{stage=\"fence\"}") >= 0);
  CHECK(metric(m, "fencegate_elect_stage_seconds{stage=\"acquire\"}") >= 0);
  CHECK(metric(m, "fencegate_elect_stage_seconds{stage=\"start\"}") >= 0);
  CHECK(metric(m, "fencegate_elect_losses_total{reason=\"catch_up\"}") == 0);
  CHECK(m.find("# TYPE fencegate_elect_renewal_margin_seconds histogram") != std::string::npos);
  CHECK(status_get(pa, "/nope").code() == 404);

  // B's catch-up fails: once A is gone, B wins, resigns without fencing or starting its command.
  Contender b = start_contender(dir.path(), "b", flags("worker-b", "exit 3", pb));
  REQUIRE(eventually([&] { return status_get(pb, "/readyz").code() == 503; }, 10s));
  CHECK(metric(status_get(pb, "/metrics").response.body, "fencegate_elect_leader") == 0);
  a.process->kill(SIGTERM);
  auto bs = b.process->wait_for(15s);
  INFO(logs_of({&a, &b}));
  REQUIRE(bs.has_value());
  CHECK(bs->code == 76);
  CHECK_FALSE(b.started_command());
  CHECK(b.log().find("catch-up failed: resigning") != std::string::npos);
  CHECK(res.generation() == ta);  // B never fenced

  // C's catch-up outlives --catch-up-timeout-ms: killed, resigned, exit 76; the lock is free again.
  std::vector<std::string> cf = flags("worker-c", "sleep 30", 0);
  cf.insert(cf.end(), {"--catch-up-timeout-ms", "300"});
  Contender c = start_contender(dir.path(), "c", cf);
  auto cs = c.process->wait_for(15s);
  REQUIRE(cs.has_value());
  CHECK(cs->code == 76);
  CHECK_FALSE(c.started_command());
  CHECK(c.log().find("did not finish within --catch-up-timeout-ms") != std::string::npos);
  CHECK(leader_of(redis.url(), "ledger").code() == 3);
}

TEST_CASE("elect: a process the command daemonized with setsid (double fork) is killed when the lease is lost") {
  FG_REQUIRE_REDIS();
  if (::access("/usr/bin/redis-cli", X_OK) != 0) {
    MESSAGE("SKIPPED: redis-cli is not installed");
    return;
  }
  RedisServer redis;
  FG_START_REDIS(redis);
  TempDir dir("fencegate-daemon");
  const std::string pidfile = dir.file("daemon.pid");
  // The command starts a daemon in a session of its own whose parent exits at once, then waits.
  std::vector<std::string> argv{kFencegate,
                                "elect",
                                "--coordinator",
                                redis.url(),
                                "--election",
                                "jobs",
                                "--ttl",
                                "2",
                                "--grace-ms",
                                "500",
                                "--",
                                "sh",
                                "-c",
                                "setsid sh -c 'sleep 300 & echo $! > " + pidfile + ".tmp; mv " + pidfile + ".tmp " +
                                    pidfile + "' & exec sleep 300"};
  // The fallback: no cgroup (cgroup_test below covers the cgroup v2 path).
  Process elect = Process::start(argv, ProcessOptions{dir.file("elect.log"), {}, {"FENCEGATE_ELECT_CGROUP=0"}});
  INFO("elect log:\n", read_file(dir.file("elect.log")));
  REQUIRE(eventually([&] { return file_exists(pidfile); }, 15s));
  CHECK(read_file(dir.file("elect.log")).find("stopping the command's processes: child subreaper") !=
        std::string::npos);
  const pid_t daemon = static_cast<pid_t>(std::stol(read_file(pidfile)));
  REQUIRE(pid_alive(daemon));
  CHECK(::getsid(daemon) != ::getsid(elect.pid()));  // it left the command's session and group
  // The lock is taken away (an operator's DEL): the lease is lost, the command stopped, exit 75.
  auto del =
      run_command({"/usr/bin/redis-cli", "-p", std::to_string(redis.port()), "DEL", "fencegate:election:jobs:lock"},
                  10s);
  REQUIRE(del.code() == 0);
  auto st = elect.wait_for(15s);
  REQUIRE(st.has_value());
  CHECK(st->code == 75);
  CHECK(eventually([&] { return !pid_alive(daemon); }, 3s));
  CHECK(read_file(dir.file("elect.log")).find("killed processes the command left outside its process group") !=
        std::string::npos);
}

TEST_CASE(
    "elect: with cgroup v2 writable, the command runs in a cgroup of its own; a setsid double-forked daemon is "
    "killed through cgroup.kill when the lease is lost, and by the guardian while elect is stopped; the cgroup "
    "is removed") {
  FG_REQUIRE_REDIS();
  std::string why;
  const std::string parent = fencegate::election::command_cgroup_parent(&why);
  if (parent.empty()) {
    MESSAGE("SKIPPED: cgroup v2 is not writable here (", why, "); the subreaper test covers the fallback");
    return;
  }
  if (::access("/usr/bin/redis-cli", X_OK) != 0) {
    MESSAGE("SKIPPED: redis-cli is not installed");
    return;
  }
  RedisServer redis;
  FG_START_REDIS(redis);
  TempDir dir("fencegate-cgroup");
  const std::string pidfile = dir.file("daemon.pid");
  std::vector<std::string> argv{kFencegate,
                                "elect",
                                "--coordinator",
                                redis.url(),
                                "--election",
                                "jobs",
                                "--ttl",
                                "2",
                                "--grace-ms",
                                "500",
                                "--",
                                "sh",
                                "-c",
                                "setsid sh -c 'sleep 300 & echo $! > " + pidfile + ".tmp; mv " + pidfile + ".tmp " +
                                    pidfile + "' & exec sleep 300"};
  Process elect = Process::start(argv, ProcessOptions{dir.file("elect.log"), {}, {}});
  INFO("elect log:\n", read_file(dir.file("elect.log")));
  REQUIRE(eventually([&] { return file_exists(pidfile); }, 15s));
  const pid_t daemon = static_cast<pid_t>(std::stol(read_file(pidfile)));
  REQUIRE(pid_alive(daemon));
  CHECK(::getsid(daemon) != ::getsid(elect.pid()));  // it left the command's session and group
  const std::string cgroup = parent + "/fencegate-elect-" + std::to_string(elect.pid());
  const std::string log_text = read_file(dir.file("elect.log"));
  CHECK(log_text.find("stopping the command's processes: cgroup v2") != std::string::npos);
  // The daemon was born in the command's cgroup: it is listed there, and its /proc cgroup says so.
  const std::string procs = read_file(cgroup + "/cgroup.procs");
  CHECK_MESSAGE(("\n" + procs).find("\n" + std::to_string(daemon) + "\n") != std::string::npos, procs);
  CHECK(read_file("/proc/" + std::to_string(daemon) + "/cgroup")
            .find("/fencegate-elect-" + std::to_string(elect.pid())) != std::string::npos);
  // The lock is taken away: the lease is lost, the command stopped, exit 75; the daemon died with
  // the cgroup (the subreaper's sweep found nothing left).
  auto del =
      run_command({"/usr/bin/redis-cli", "-p", std::to_string(redis.port()), "DEL", "fencegate:election:jobs:lock"},
                  10s);
  REQUIRE(del.code() == 0);
  auto st = elect.wait_for(15s);
  REQUIRE(st.has_value());
  CHECK(st->code == 75);
  CHECK(eventually([&] { return !pid_alive(daemon); }, 3s));
  const std::string after = read_file(dir.file("elect.log"));
  CHECK(after.find("killed the processes left in the command's cgroup (cgroup.kill)") != std::string::npos);
  CHECK(after.find("killed processes the command left outside its process group") == std::string::npos);
  CHECK_FALSE(file_exists(cgroup + "/cgroup.procs"));  // removed

  // The gap the subreaper leaves: elect itself stopped (SIGSTOP) past its lease. Its guardian kills
  // the command's cgroup at the lease's expiry, the daemon with it, while elect still sleeps.
  const std::string pidfile2 = dir.file("daemon2.pid");
  argv.back() = "setsid sh -c 'sleep 300 & echo $! > " + pidfile2 + ".tmp; mv " + pidfile2 + ".tmp " + pidfile2 +
                "' & exec sleep 300";
  Process elect2 = Process::start(argv, ProcessOptions{dir.file("elect2.log"), {}, {}});
  INFO("elect2 log:\n", read_file(dir.file("elect2.log")));
  REQUIRE(eventually([&] { return file_exists(pidfile2); }, 15s));
  const pid_t daemon2 = static_cast<pid_t>(std::stol(read_file(pidfile2)));
  REQUIRE(pid_alive(daemon2));
  elect2.kill(SIGSTOP);
  const auto stopped_at = Clock::now();
  // TTL 2 s: the lease's earliest expiry is at most 2 s after the last renewal.
  CHECK(eventually([&] { return !pid_alive(daemon2); }, 6s));
  MESSAGE("the daemon died ", std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - stopped_at).count(),
          " ms after elect was stopped");
  CHECK(elect2.running());  // still stopped: the guardian did it
  elect2.kill(SIGCONT);
  auto st2 = elect2.wait_for(15s);
  REQUIRE(st2.has_value());
  CHECK(st2->code == 75);
  CHECK_FALSE(file_exists(parent + "/fencegate-elect-" + std::to_string(elect2.pid()) + "/cgroup.procs"));
}

TEST_CASE(
    "authority restore safety: a serve started on a store that knows nothing (restored from an old backup) "
    "raises the fence to the current leader's generation before any write; older tokens are stale") {
  FG_REQUIRE_REDIS();
  RedisServer redis;
  FG_START_REDIS(redis);
  TempDir dir("fencegate-restore");
  // An earlier term (token 1) ended; the current leader holds token 2.
  auto first =
      run_command({kFencegate, "elect", "--coordinator", redis.url(1), "--election", "billing", "--", "true"}, 15s);
  REQUIRE_MESSAGE(first.code() == 0, first.err);
  Contender b =
      start_contender(dir.path(), "b", {"--coordinator", redis.url(1), "--election", "billing", "--id", "worker-b"});
  INFO(logs_of({&b}));
  REQUIRE(eventually([&] { return b.started_command(); }, 15s));
  const std::int64_t tb = b.token();
  REQUIRE(tb == 2);
  RecordingUpstream upstream;
  CoordinatorProxy proxy(dir, redis.url(1), upstream.url());
  INFO(proxy.log());
  REQUIRE(proxy.start());
  CHECK(eventually([&] { return proxy.generation() == tb; }, 10s));  // no write needed
  CHECK(upstream.count() == 0);
  CHECK(proxy.write(1).code() == 409);
  CHECK(proxy.type(1) == "urn:fencegate:problem:stale-generation");
  CHECK(proxy.write(tb).code() == 200);
  b.process->kill(SIGTERM);
  b.process->wait_for(10s);
}

TEST_CASE("ZooKeeper restarted mid-leadership within the session timeout: the session and the leadership survive") {
  FG_REQUIRE_ZK();
  ZkServer zk;
  FG_START_ZK(zk);
  TempDir dir("fencegate-zkrestart");
  Contender a =
      start_contender(dir.path(), "a", {"--coordinator", zk.url(), "--election", "jobs", "--id", "a", "--ttl", "12"});
  INFO(logs_of({&a}));
  REQUIRE(eventually([&] { return a.started_command(); }, 15s));
  const std::int64_t ta = a.token();
  const pid_t child = a.child_pid();
  zk.stop();
  FG_START_ZK(zk);  // same port and data dir: the server restores its sessions
  CHECK(eventually(
      [&] {
        auto l = leader_of(zk.url(), "jobs");
        return l.code() == 0 && json::parse(l.out) == json{{"election", "jobs"}, {"leader", "a"}, {"token", ta}};
      },
      10s));
  CHECK(pid_alive(child));
  CHECK(a.process->running());
  CHECK(a.log().find("leadership lost") == std::string::npos);
  a.process->kill(SIGTERM);
  a.process->wait_for(10s);
}

TEST_CASE(
    "Redis restarted without persistence mid-leadership: the leader loses its lock and exits 75; the next "
    "leader's generation starts over and the fence refuses it (safe, not live)") {
  FG_REQUIRE_REDIS();
  RedisServer redis;
  FG_START_REDIS(redis);
  TempDir dir("fencegate-redisrestart");
  FencedResource res(dir);
  REQUIRE_MESSAGE(res.wait(), read_file(res.log_path));
  auto flags = [&](const std::string& id) {
    return std::vector<std::string>{"--coordinator", redis.url(), "--election", "jobs",         "--id", id,
                                    "--ttl",         "2",         "--fence",    res.fence_url()};
  };
  // Two terms: the fence holds generation 2.
  auto first = run_command({kFencegate, "elect", "--coordinator", redis.url(), "--election", "jobs", "--fence",
                            res.fence_url(), "--", "true"},
                           15s);
  REQUIRE_MESSAGE(first.code() == 0, first.err);
  Contender a = start_contender(dir.path(), "a", flags("a"));
  INFO(logs_of({&a}));
  REQUIRE(eventually([&] { return a.started_command(); }, 15s));
  CHECK(a.token() == 2);
  CHECK(res.generation() == 2);
  redis.stop();
  FG_START_REDIS(redis);  // everything forgotten: no lock, the counter back at 0
  auto st = a.process->wait_for(10s);
  REQUIRE(st.has_value());
  CHECK(st->code == 75);
  // The next leader gets generation 1: the fence refuses it (the barrier fails: exit 76).
  auto next = run_command({kFencegate, "elect", "--coordinator", redis.url(), "--election", "jobs", "--fence",
                           res.fence_url(), "--fence-timeout-ms", "2000", "--", "true"},
                          15s);
  CHECK(next.code() == 76);
  CHECK(next.err.find("fence refused the token") != std::string::npos);
  CHECK(res.generation() == 2);
  CHECK(res.write(1) == 409);
}

TEST_CASE("elect/leader --coordinator etcd://: the same etcd election as --etcd http://") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  TempDir dir("fencegate-etcdurl");
  const std::string url = "etcd://127.0.0.1:" + std::to_string(etcd.client_port());
  Contender a = start_contender(dir.path(), "a", {"--coordinator", url, "--election", "e", "--id", "a", "--ttl", "5"});
  INFO(logs_of({&a}));
  REQUIRE(eventually([&] { return a.started_command(); }, 15s));
  auto l = leader_of(url, "e");
  REQUIRE_MESSAGE(l.code() == 0, l.err);
  CHECK(json::parse(l.out) == json{{"election", "e"}, {"leader", "a"}, {"token", a.token()}});
  auto old = run_command({kFencegate, "leader", "--etcd", etcd.url(), "--election", "e"}, 10s);
  CHECK(old.out == l.out);
  a.process->kill(SIGTERM);
  a.process->wait_for(10s);
  CHECK(leader_of(url, "e").code() == 3);
}

TEST_CASE(
    "authority over Redis with keyspace notifications: a lost or taken lock is refused within moments, long "
    "before the poll_ms poll; pongs keep it available; without notifications the poll stays bounded") {
  FG_REQUIRE_REDIS();
  if (::access("/usr/bin/redis-cli", X_OK) != 0) {
    MESSAGE("SKIPPED: redis-cli is not installed");
    return;
  }
  TempDir dir("fencegate-notify");
  RecordingUpstream upstream;
  auto cli = [](const RedisServer& r, std::vector<std::string> args) {
    std::vector<std::string> argv{"/usr/bin/redis-cli", "-p", std::to_string(r.port())};
    argv.insert(argv.end(), args.begin(), args.end());
    auto res = run_command(argv, 10s);
    REQUIRE_MESSAGE(res.code() == 0, res.err);
    return res.out;
  };
  const std::string lock = "fencegate:election:billing:lock", gen = "fencegate:election:billing:generation";
  const json slow_poll = {{"poll_ms", 5000}};  // the safety net: 5 s; the outage window is 1 s
  auto ms_since = [](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
  };
  // No 503 for `d`: contact keeps coming although the poll runs every 5 s.
  auto always_available = [](const CoordinatorProxy& p, std::int64_t g, std::chrono::milliseconds d) {
    int bad = 0, n = 0;
    for (const auto until = Clock::now() + d; Clock::now() < until; ++n) {
      if (p.write(g).code() != 200) ++bad;
      std::this_thread::sleep_for(100ms);
    }
    MESSAGE(n, " writes, ", bad, " not 200");
    return bad == 0;
  };

  RedisServer redis;
  FG_START_REDIS(redis, {"--notify-keyspace-events", "KEA"});
  cli(redis, {"SET", gen, "7"});
  cli(redis, {"SET", lock, "7 n1 worker-a", "PX", "600000"});
  CoordinatorProxy proxy(dir, redis.url(), upstream.url(), "", "notify", slow_poll);
  INFO(proxy.log());
  REQUIRE(proxy.start());
  REQUIRE(eventually([&] { return proxy.write(7).code() == 200; }, 10s));
  CHECK(read_file(dir.file("notify.log")).find("following Redis keyspace notifications") != std::string::npos);
  CHECK(always_available(proxy, 7, 2500ms));
  // The lock is lost (deleted): generation 7 is refused within moments.
  auto t = Clock::now();
  cli(redis, {"DEL", lock});
  REQUIRE(eventually([&] { return proxy.write(7).code() == 409; }, 10s));
  const auto lost_ms = ms_since(t);
  // Taken by a new holder: its generation is fenced in, the old one stale.
  t = Clock::now();
  cli(redis, {"SET", gen, "8"});
  cli(redis, {"SET", lock, "8 n2 worker-b", "PX", "600000"});
  REQUIRE(eventually([&] { return proxy.generation() == 8; }, 10s));
  const auto taken_ms = ms_since(t);
  CHECK(proxy.write(7).code() == 409);
  CHECK(proxy.type(7) == "urn:fencegate:problem:stale-generation");
  CHECK(proxy.write(8).code() == 200);
  MESSAGE("notifications: lock loss refused after ", lost_ms, " ms, new holder fenced after ", taken_ms,
          " ms (poll_ms 5000)");
  CHECK(lost_ms < 1500);
  CHECK(taken_ms < 1500);

  // Without notifications (the server's default): the bounded poll, whatever poll_ms says.
  RedisServer plain;
  FG_START_REDIS(plain);
  cli(plain, {"SET", gen, "3"});
  cli(plain, {"SET", lock, "3 n3 worker-c", "PX", "600000"});
  CoordinatorProxy polled(dir, plain.url(), upstream.url(), "", "polled", slow_poll);
  INFO(polled.log());
  REQUIRE(polled.start());
  REQUIRE(eventually([&] { return polled.write(3).code() == 200; }, 10s));
  CHECK(always_available(polled, 3, 2500ms));
  CHECK(read_file(dir.file("polled.log")).find("no Redis keyspace notifications; polling the election") !=
        std::string::npos);
  t = Clock::now();
  cli(plain, {"DEL", lock});
  REQUIRE(eventually([&] { return polled.write(3).code() == 409; }, 10s));
  MESSAGE("polling: lock loss refused after ", ms_since(t), " ms");
  CHECK(ms_since(t) < 2000);
}
