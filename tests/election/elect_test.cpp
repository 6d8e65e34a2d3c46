// `fencegate elect` and `fencegate leader` end to end: the real binary, a real etcd, and for the
// activation barrier either a recording HTTP server or a real `fencegate serve`.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "election_client/elector.h"
#include "tests/election/etcd_harness.h"
#include "tests/support/net_util.h"
#include "tests/support/http_client.h"
#include "tests/support/upstream.h"

using namespace fencegate::testing;
using json = nlohmann::json;

namespace {

CommandResult leader_of(const EtcdServer& etcd, const std::string& election) {
  return run_command({kFencegate, "leader", "--etcd", etcd.url(), "--election", election}, 10s);
}

std::string both_logs(const Contender& a, const Contender* b = nullptr) {
  std::string s = "--- " + a.name + " log:\n" + a.log();
  if (b) s += "--- " + b->name + " log:\n" + b->log();
  return s;
}

}  // namespace

TEST_CASE("elect/leader: bad flags exit 2 with a message; --help exits 0") {
  auto r = run_command({kFencegate, "elect", "--etcd", "http://127.0.0.1:2379", "--election", "x"}, 10s);
  CHECK(r.code() == 2);
  CHECK(r.err.find("a command is required after --") != std::string::npos);
  r = run_command({kFencegate, "elect", "--etcd", "ftp://x", "--election", "x", "--ttl", "1", "--", "true"}, 10s);
  CHECK(r.code() == 2);
  CHECK(r.err.find("--ttl: must be an integer in 2..3600") != std::string::npos);
  CHECK(r.err.find("--etcd") != std::string::npos);
  r = run_command({kFencegate, "elect", "--bogus", "--", "true"}, 10s);
  CHECK(r.code() == 2);
  CHECK(r.err.find("unknown flag \"--bogus\"") != std::string::npos);
  // Longer than any sidecar takes as Fencing-Leader: refused now, not after winning.
  r = run_command({kFencegate, "elect", "--etcd", "http://127.0.0.1:2379", "--election", "x", "--id",
                   std::string(300, 'i'), "--", "true"},
                  10s);
  CHECK(r.code() == 2);
  CHECK(r.err.find("--id: at most 256 bytes (got 300)") != std::string::npos);
  // Control characters, which the sidecars refuse in a leader identity; a fence timeout of 0,
  // which would never try the fence.
  r = run_command({kFencegate, "elect", "--etcd", "http://127.0.0.1:2379", "--election", "x", "--id", "a\x01b",
                   "--fence-timeout-ms", "0", "--", "true"},
                  10s);
  CHECK(r.code() == 2);
  CHECK(r.err.find("--id: must not contain control characters") != std::string::npos);
  CHECK(r.err.find("--fence-timeout-ms") != std::string::npos);
  // Election names a sidecar's authority could not follow (serve refuses them), and an empty --id.
  for (const std::string& bad : {std::string("two words"), std::string("line\nbreak"), std::string(300, 'e')}) {
    CAPTURE(bad);
    r = run_command({kFencegate, "elect", "--etcd", "http://127.0.0.1:2379", "--election", bad, "--", "true"}, 10s);
    CHECK(r.code() == 2);
    CHECK(r.err.find("--election: must be 1..256 printable ASCII characters") != std::string::npos);
    r = run_command({kFencegate, "leader", "--etcd", "http://127.0.0.1:2379", "--election", bad}, 10s);
    CHECK(r.code() == 2);
  }
  r = run_command({kFencegate, "elect", "--etcd", "http://127.0.0.1:2379", "--election", "x", "--id", "", "--", "true"},
                  10s);
  CHECK(r.code() == 2);
  CHECK(r.err.find("--id: must not be empty") != std::string::npos);
  r = run_command({kFencegate, "elect", "--help"}, 10s);
  CHECK(r.code() == 0);
  CHECK(r.out.find("FENCING_TOKEN") != std::string::npos);
  r = run_command({kFencegate, "leader", "--election", "x"}, 10s);
  CHECK(r.code() == 2);
  CHECK(r.err.find("--etcd: required") != std::string::npos);
  r = run_command({kFencegate, "leader", "--help"}, 10s);
  CHECK(r.code() == 0);
  // Unreachable etcd: 1 for both.
  const std::string dead = "http://127.0.0.1:" + std::to_string(free_port());
  r = run_command({kFencegate, "leader", "--etcd", dead, "--election", "x"}, 10s);
  CHECK(r.code() == 1);
  r = run_command({kFencegate, "elect", "--etcd", dead, "--election", "x", "--", "true"}, 20s);
  CHECK(r.code() == 1);
  CHECK(r.err.find("could not grant a lease") != std::string::npos);
}

TEST_CASE("elect --fence-token-file: refused when group or others may read it, under 16 bytes, or with a control byte") {
  TempDir dir("fencegate-elect-token");
  const std::string tf = dir.file("admin.token");
  auto write = [&](const std::string& text, mode_t mode) {
    { std::ofstream(tf, std::ios::trunc) << text; }
    REQUIRE(::chmod(tf.c_str(), mode) == 0);
  };
  const std::string dead = "http://127.0.0.1:" + std::to_string(free_port());
  auto elect = [&] {
    return run_command({kFencegate, "elect", "--etcd", dead, "--election", "x", "--fence-token-file", tf, "--", "true"},
                       20s);
  };
  // Accepted: on to etcd, which is not there (exit 1, not 2).
  write("  0123456789abcdef\n", 0600);
  auto r = elect();
  CHECK_MESSAGE(r.code() == 1, r.err);
  CHECK(r.err.find("could not grant a lease") != std::string::npos);
  std::string token;
  CHECK(fencegate::election::load_token_file(tf, &token).empty());
  CHECK(token == "0123456789abcdef");

  write("0123456789abcdef\n", 0644);
  r = elect();
  CHECK(r.code() == 2);
  CHECK_MESSAGE(r.err.find("--fence-token-file: " + tf + " has mode 0644: group or others may read or write it") !=
                    std::string::npos,
                r.err);
  write("0123456789abcdef\n", 0620);
  CHECK(elect().code() == 2);

  write("0123456789abcde\n", 0600);  // 15 bytes
  r = elect();
  CHECK(r.code() == 2);
  CHECK_MESSAGE(r.err.find("--fence-token-file: the token in " + tf + " has 15 bytes; at least 16 are required") !=
                    std::string::npos,
                r.err);

  // A CR or LF inside would go into the Authorization header of the fence request.
  for (const std::string& inner : {std::string("01234567\r\n89abcdef"), std::string("01234567\n89abcdefgh"),
                                   std::string("01234567\r89abcdefgh"), std::string("0123456789abcdef\x01x"),
                                   std::string("0123456789abcdef\x7fx")}) {
    CAPTURE(inner);
    write(inner + "\n", 0600);
    r = elect();
    CHECK(r.code() == 2);
    CHECK_MESSAGE(r.err.find("--fence-token-file: the token in " + tf + " has a control character inside") !=
                      std::string::npos,
                  r.err);
    CHECK(r.err.find("01234567") == std::string::npos);  // the token is never shown
    CHECK_FALSE(fencegate::election::load_token_file(tf, &token).empty());
    CHECK(fencegate::election::read_token_file(tf).empty());  // the re-read before a barrier keeps the old one
  }
}

TEST_CASE("elect: the command gets the token in its environment; its exit status is elect's; leader prints it") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  TempDir dir("fencegate-elect");

  auto none = leader_of(etcd, "billing");
  CHECK(none.code() == 3);
  CHECK(none.out.empty());

  Contender a = start_contender(dir.path(), "a", {"--etcd", etcd.url(), "--election", "billing", "--id", "worker-a", "--ttl", "3"});
  INFO(both_logs(a));
  REQUIRE(eventually([&] { return a.started_command(); }, 10s));
  CHECK(read_file(a.file("env")) == "billing worker-a\n");
  auto l = leader_of(etcd, "billing");
  REQUIRE(l.code() == 0);
  json j = json::parse(l.out);
  CHECK(j == json{{"election", "billing"}, {"leader", "worker-a"}, {"token", a.token()}});

  // The command's status becomes elect's, after it resigned.
  a.process->kill(SIGTERM);  // passed to the command (sleep dies of it)
  auto st = a.process->wait_for(10s);
  REQUIRE(st.has_value());
  CHECK(st->exited);
  CHECK(st->code == 128 + SIGTERM);
  CHECK_FALSE(pid_alive(a.child_pid()));
  CHECK(leader_of(etcd, "billing").code() == 3);
  CHECK(a.log().find("\"msg\":\"resigned\"") != std::string::npos);

  auto r = run_command({kFencegate, "elect", "--etcd", etcd.url(), "--election", "billing", "--ttl", "2", "--", "sh",
                        "-c", "test \"$FENCING_TOKEN\" -gt 0 && exit 7"},
                       20s);
  CHECK(r.code() == 7);
  CHECK(r.err.find("\"level\":\"info\",\"msg\":\"elected\"") != std::string::npos);
  CHECK(leader_of(etcd, "billing").code() == 3);
}

// A closed terminal (SIGHUP) or SIGQUIT must not kill elect outright, leaving its leader key to
// the TTL: the command is stopped with SIGTERM and elect resigns. SIGUSR1 only reaches the command.
TEST_CASE("elect: SIGHUP and SIGQUIT stop the command with SIGTERM and resign; SIGUSR1 is passed on") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  TempDir dir("fencegate-elect");
  for (int sig : {SIGHUP, SIGQUIT}) {
    CAPTURE(sig);
    Contender a = start_contender(dir.path(), "a" + std::to_string(sig),
                                  {"--etcd", etcd.url(), "--election", "billing", "--id", "worker-a", "--ttl", "30"});
    INFO(both_logs(a));
    REQUIRE(eventually([&] { return a.started_command(); }, 10s));
    if (sig == SIGHUP) {
      a.process->kill(SIGUSR1);  // the command (sleep) dies of it: elect does not, and passes it on
      auto st = a.process->wait_for(10s);
      REQUIRE(st.has_value());
      CHECK(st->code == 128 + SIGUSR1);  // the command's status
      CHECK(leader_of(etcd, "billing").code() == 3);
      a = start_contender(dir.path(), "b" + std::to_string(sig),
                          {"--etcd", etcd.url(), "--election", "billing", "--id", "worker-a", "--ttl", "30"});
      REQUIRE(eventually([&] { return a.started_command(); }, 10s));
    }
    a.process->kill(sig);
    auto st = a.process->wait_for(10s);
    REQUIRE(st.has_value());
    CHECK(st->exited);
    CHECK(st->code == 128 + SIGTERM);  // the command got SIGTERM
    CHECK_FALSE(pid_alive(a.child_pid()));
    CHECK(leader_of(etcd, "billing").code() == 3);  // resigned: no leader key left for the TTL (30 s)
  }
}

// A shell starts background jobs (`fencegate elect ... &` in a script) with SIGINT ignored, and
// an ignored signal stays ignored across exec. elect acts on SIGINT and passes it on, so the
// command must get it with the default disposition, or it could not even trap it.
TEST_CASE("elect: started with SIGINT ignored, SIGINT still reaches the command, which can trap it") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  TempDir dir("fencegate-elect");
  const std::string started = dir.file("int-started");
  const std::string script = "trap '' INT; exec " + std::string(kFencegate) + " elect --etcd " + etcd.url() +
                             " --election billing --id worker-int --ttl 30 --grace-ms 8000 -- sh -c "
                             "'trap \"exit 42\" INT; touch " + started + "; while :; do sleep 0.05; done'";
  Process p = Process::start({"/bin/sh", "-c", script}, ProcessOptions{dir.file("int.log"), {}, {}});
  INFO(read_file(dir.file("int.log")));
  REQUIRE(eventually([&] { return std::filesystem::exists(started); }, 10s));
  const auto t0 = Clock::now();
  p.kill(SIGINT);
  auto st = p.wait_for(10s);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  REQUIRE(st.has_value());
  CHECK(st->exited);
  CHECK(st->code == 42);  // the command's trap ran: no SIGKILL after the 8 s grace
  CHECK(ms < 4000);
  CHECK(leader_of(etcd, "billing").code() == 3);
}

// A launcher's inherited dispositions: an ignored SIGCHLD must not lose the command's status (the
// kernel would reap it), and an ignored SIGHUP (nohup) means a hangup stops neither elect nor
// its command.
TEST_CASE("elect: started with SIGCHLD ignored it reports the command's status; under nohup SIGHUP stops nothing") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  TempDir dir("fencegate-elect");
  const std::string flags = " elect --etcd " + etcd.url() + " --election billing --ttl 30 -- ";
  {
    Process p = Process::start({"/bin/sh", "-c", "trap '' CHLD; exec " + std::string(kFencegate) + flags + "sh -c 'exit 3'"},
                               ProcessOptions{dir.file("chld.log"), {}, {}});
    INFO(read_file(dir.file("chld.log")));
    auto st = p.wait_for(15s);
    REQUIRE(st.has_value());
    CHECK(st->exited);
    CHECK(st->code == 3);
  }
  const std::string started = dir.file("hup-started");
  Process p = Process::start({"/bin/sh", "-c", "trap '' HUP; exec " + std::string(kFencegate) + flags +
                                                   "sh -c 'touch " + started + "; while :; do sleep 0.05; done'"},
                             ProcessOptions{dir.file("hup.log"), {}, {}});
  INFO(read_file(dir.file("hup.log")));
  REQUIRE(eventually([&] { return std::filesystem::exists(started); }, 10s));
  p.kill(SIGHUP);
  std::this_thread::sleep_for(500ms);
  CHECK(p.running());
  CHECK(leader_of(etcd, "billing").code() == 0);
  p.kill(SIGTERM);
  auto st = p.wait_for(10s);
  REQUIRE(st.has_value());
  CHECK(st->code == 128 + SIGTERM);
}

TEST_CASE("elect: the command starts only after every fence answered 200 (activation barrier)") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  TempDir dir("fencegate-elect");
  std::atomic<int> command_ran_before_fence{0};
  std::string marker = dir.file("a.token");
  // Fakes of a fencegate fence: 200 with the generation made durable, as the admin API answers.
  auto durable = [](const RecordedRequest& req, int delay_ms) {
    UpstreamAction a = UpstreamAction::respond(200, delay_ms);
    a.body = json{{"generation", req.fencing_token().value_or(0)}}.dump();
    return a;
  };
  RecordingUpstream fence1([&](const RecordedRequest& req) {
    if (file_exists(marker)) ++command_ran_before_fence;
    return durable(req, 300);  // a slow, durable fence
  });
  RecordingUpstream fence2([&](const RecordedRequest& req) {
    if (file_exists(marker)) ++command_ran_before_fence;
    return durable(req, 100);
  });
  Contender a = start_contender(dir.path(), "a",
                                {"--etcd", etcd.url(), "--election", "ledger", "--id", "worker-a", "--ttl", "3",
                                 "--fence", fence1.url() + "/v1/resources/ledger", "--fence",
                                 fence2.url() + "/v1/resources/journal/"});
  INFO(both_logs(a));
  REQUIRE(eventually([&] { return a.started_command(); }, 10s));
  CHECK(command_ran_before_fence.load() == 0);
  const auto t = a.token();
  auto r1 = fence1.requests();
  auto r2 = fence2.requests();
  REQUIRE(r1.size() == 1);
  REQUIRE(r2.size() == 1);
  CHECK(r1[0].method == "POST");
  CHECK(r1[0].target == "/v1/resources/ledger/fence");
  CHECK(r2[0].target == "/v1/resources/journal/fence");
  CHECK(r1[0].header("Fencing-Token") == std::to_string(t));
  json body = json::parse(r1[0].body);
  CHECK(body == json{{"generation", t}, {"leader", "worker-a"}});

  a.process->kill(SIGINT);
  auto st = a.process->wait_for(10s);
  REQUIRE(st.has_value());
  CHECK(st->code == 128 + SIGINT);
  CHECK(leader_of(etcd, "ledger").code() == 3);
}

TEST_CASE("elect: a fence that refuses or stays unreachable: resign, exit 76, the command never runs") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  TempDir dir("fencegate-elect");
  RecordingUpstream refusing([](const RecordedRequest&) { return UpstreamAction::respond(409); });
  Contender a = start_contender(dir.path(), "a",
                                {"--etcd", etcd.url(), "--election", "ledger", "--ttl", "3", "--fence",
                                 refusing.url() + "/v1/resources/ledger"});
  auto st = a.process->wait_for(15s);
  INFO(both_logs(a));
  REQUIRE(st.has_value());
  CHECK(st->code == 76);
  CHECK_FALSE(a.started_command());
  CHECK(refusing.count() == 1);  // a refusal is final: no retry
  CHECK(leader_of(etcd, "ledger").code() == 3);
  CHECK(a.log().find("fence refused the token") != std::string::npos);

  Contender b = start_contender(dir.path(), "b",
                                {"--etcd", etcd.url(), "--election", "ledger", "--ttl", "3", "--fence-timeout-ms",
                                 "700", "--fence", "http://127.0.0.1:" + std::to_string(free_port()) + "/v1/resources/x"});
  st = b.process->wait_for(15s);
  INFO(both_logs(b));
  REQUIRE(st.has_value());
  CHECK(st->code == 76);
  CHECK_FALSE(b.started_command());
  CHECK(b.log().find("fence unreachable") != std::string::npos);
  CHECK(leader_of(etcd, "ledger").code() == 3);

  // A URL that answers 200 but is no fence (here a plain upstream) has fenced nothing.
  RecordingUpstream plain;
  Contender c = start_contender(dir.path(), "c",
                                {"--etcd", etcd.url(), "--election", "ledger", "--ttl", "3", "--fence",
                                 plain.url() + "/v1/resources/ledger"});
  st = c.process->wait_for(15s);
  INFO(both_logs(c));
  REQUIRE(st.has_value());
  CHECK(st->code == 76);
  CHECK_FALSE(c.started_command());
  CHECK(c.log().find("without making the token durable") != std::string::npos);
  CHECK(leader_of(etcd, "ledger").code() == 3);
}

TEST_CASE("elect: a command that cannot be started: exit 1 with the reason, and the leadership is given up") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  auto r = run_command({kFencegate, "elect", "--etcd", etcd.url(), "--election", "nocmd", "--ttl", "3", "--",
                        "/nonexistent/command"},
                       20s);
  CHECK(r.code() == 1);
  CHECK(r.err.find("could not start the command") != std::string::npos);
  CHECK(r.err.find("No such file or directory") != std::string::npos);
  CHECK(leader_of(etcd, "nocmd").code() == 3);  // resigned
}

TEST_CASE("elect: a SIGSTOPped leader loses to a successor; its guardian kills the command by the lease's expiry, "
          "before the successor starts; on SIGCONT exit 75, and its stale write is refused") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  TempDir dir("fencegate-elect");

  // A real fencegate in front of a recording upstream; both contenders fence its resource.
  RecordingUpstream upstream;
  const std::uint16_t data_port = free_port(), admin_port = free_port();
  Process serve = Process::start({kFencegate, "serve", "--listen", "127.0.0.1:" + std::to_string(data_port), "--upstream",
                                  upstream.url(), "--resource", "ledger", "--db", dir.file("fence.db"),
                                  "--admin-listen", "127.0.0.1:" + std::to_string(admin_port)},
                                 ProcessOptions{dir.file("serve.log"), {}, {}});
  REQUIRE_MESSAGE(serve.wait_for_port(data_port), read_file(dir.file("serve.log")));
  REQUIRE(serve.wait_for_port(admin_port));
  const std::string fence = "http://127.0.0.1:" + std::to_string(admin_port) + "/v1/resources/ledger";
  auto generation = [&] {
    auto r = request(admin_port, "GET", "/v1/resources/ledger");
    if (r.code() != 200) return std::int64_t{0};
    return json::parse(r.response.body).value("generation", std::int64_t{0});
  };

  auto flags = [&](const std::string& id) {
    return std::vector<std::string>{"--etcd", etcd.url(), "--election", "ledger", "--id", id, "--ttl", "2",
                                    "--grace-ms", "1000", "--fence", fence};
  };
  Contender a = start_contender(dir.path(), "a", flags("worker-a"));
  INFO(both_logs(a));
  REQUIRE(eventually([&] { return a.started_command(); }, 10s));
  const std::int64_t ta = a.token();
  CHECK(generation() == ta);  // fenced before the command ran
  const pid_t a_child = a.child_pid();
  REQUIRE(pid_alive(a_child));
  CHECK(request(data_port, "POST", "/charge", {{"Fencing-Token", std::to_string(ta)}}).code() == 200);

  Contender b = start_contender(dir.path(), "b", flags("worker-b"));
  std::this_thread::sleep_for(1000ms);
  CHECK_FALSE(b.started_command());  // waiting in line

  // A pauses (a GC, a VM suspend) beyond its 2 s lease; B takes over with a higher token.
  a.process->kill(SIGSTOP);
  const auto stopped_at = Clock::now();
  bool b_won = eventually([&] { return b.started_command(); }, 10s);
  INFO(both_logs(a, &b));
  REQUIRE(b_won);
  const std::int64_t tb = b.token();
  CHECK(tb > ta);
  CHECK(generation() == tb);
  MESSAGE("B took over ", std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - stopped_at).count(),
          " ms after A was stopped");
  // A's elect could not stop its command during the pause: its guardian did, at the lease's
  // earliest expiry, before etcd could let B lead.
  CHECK_FALSE(pid_alive(a_child));
  std::this_thread::sleep_for(500ms);

  // A resumes: its clock says the lease deadline has long passed.
  const auto resumed_at = Clock::now();
  a.process->kill(SIGCONT);
  bool gone = eventually([&] { return !pid_alive(a_child); }, 3s);
  const auto gone_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - resumed_at).count();
  MESSAGE("A's command was gone ", gone_ms, " ms after SIGCONT");
  CHECK(gone);
  CHECK(gone_ms < 1000);
  auto st = a.process->wait_for(10s);
  REQUIRE(st.has_value());
  CHECK(st->exited);
  CHECK(st->code == 75);
  CHECK(a.log().find("leadership lost: the lease ran out while elect was stopped") != std::string::npos);

  // Whatever A's command had still queued is refused by the fence.
  auto stale = request(data_port, "POST", "/charge", {{"Fencing-Token", std::to_string(ta)}});
  CHECK(stale.code() == 409);
  CHECK(request(data_port, "POST", "/charge", {{"Fencing-Token", std::to_string(tb)}}).code() == 200);

  auto l = leader_of(etcd, "ledger");
  REQUIRE(l.code() == 0);
  CHECK(json::parse(l.out) == json{{"election", "ledger"}, {"leader", "worker-b"}, {"token", tb}});
  CHECK(b.process->running());
  b.process->kill(SIGTERM);
  auto bs = b.process->wait_for(10s);
  REQUIRE(bs.has_value());
  CHECK(bs->code == 128 + SIGTERM);
  serve.stop();
}

TEST_CASE("elect: a leader key deleted while its lease lives ends the term: command stopped, exit 75, the next "
          "candidate leads") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  TempDir dir("fencegate-elect");
  fencegate::election::Client c(client_options(etcd));

  auto flags = [&](const std::string& id) {
    return std::vector<std::string>{"--etcd", etcd.url(), "--election", "jobs", "--id", id, "--ttl", "5",
                                    "--grace-ms", "1000"};
  };
  Contender a = start_contender(dir.path(), "a", flags("worker-a"));
  INFO(both_logs(a));
  REQUIRE(eventually([&] { return a.started_command(); }, 10s));
  const std::int64_t ta = a.token();
  const pid_t a_child = a.child_pid();
  Contender b = start_contender(dir.path(), "b", flags("worker-b"));
  std::this_thread::sleep_for(1000ms);
  REQUIRE_FALSE(b.started_command());

  // A longer key that starts with A's (another candidate's, say) changes nothing.
  fencegate::election::KeyValue lead;
  REQUIRE(c.leader("jobs", &lead).ok());
  REQUIRE(lead.create_revision == ta);
  REQUIRE(c.put(lead.key + "0", "x").ok());
  std::this_thread::sleep_for(500ms);
  CHECK(pid_alive(a_child));
  REQUIRE(c.delete_range(lead.key + "0", "").ok());

  // An operator deletes the leader key; A's lease is still alive, but B now leads.
  const auto deleted_at = Clock::now();
  REQUIRE(c.delete_range(lead.key, "").ok());
  bool gone = eventually([&] { return !pid_alive(a_child); }, 3s);
  INFO(both_logs(a, &b));
  CHECK(gone);
  MESSAGE("A's command was gone ",
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - deleted_at).count(),
          " ms after its key was deleted");
  auto st = a.process->wait_for(10s);
  REQUIRE(st.has_value());
  CHECK(st->exited);
  CHECK(st->code == 75);
  CHECK(a.log().find("the leader key was deleted") != std::string::npos);
  REQUIRE(eventually([&] { return b.started_command(); }, 10s));
  CHECK(b.token() > ta);
  b.process->kill(SIGTERM);
  CHECK(b.process->wait_for(10s).has_value());
}

TEST_CASE("elect: the lease survives an etcd restart within the TTL; leadership is lost when etcd stays down") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  TempDir dir("fencegate-elect");
  Contender a = start_contender(dir.path(), "a",
                                {"--etcd", etcd.url(), "--election", "ledger", "--id", "worker-a", "--ttl", "6",
                                 "--grace-ms", "1000"});
  INFO(both_logs(a));
  REQUIRE(eventually([&] { return a.started_command(); }, 10s));
  const std::int64_t ta = a.token();
  const pid_t child = a.child_pid();

  // Restart etcd (same data dir and ports) well within the 6 s TTL.
  const auto down_at = Clock::now();
  etcd.stop();
  FG_START_ETCD(etcd);
  MESSAGE("etcd was down for ", std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - down_at).count(), " ms");
  std::this_thread::sleep_for(5s);  // past the deadline the pre-restart renewals gave
  CHECK(a.process->running());
  CHECK(pid_alive(child));
  auto l = leader_of(etcd, "ledger");
  REQUIRE(l.code() == 0);
  CHECK(json::parse(l.out)["token"] == ta);
  CHECK(a.log().find("jeopardy") == std::string::npos);

  // Now etcd stays down: by the local deadline (last renewal sent + 6 s - 1.2 s) the command is
  // stopped and elect exits 75.
  const auto stop_at = Clock::now();
  etcd.stop();
  CHECK(eventually([&] { return !pid_alive(child); }, 8s));
  const auto gone_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - stop_at).count();
  MESSAGE("command stopped ", gone_ms, " ms after etcd went down");
  CHECK(gone_ms <= 4800 + 200);  // never later than the deadline (+ scheduling slack)
  auto st = a.process->wait_for(10s);
  REQUIRE(st.has_value());
  CHECK(st->code == 75);
}

TEST_CASE("elect: --recampaign starts a new term after the lease is lost; leftovers of the command's group are killed") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  TempDir dir("fencegate-elect");
  Contender a = start_contender(dir.path(), "a",
                                {"--etcd", etcd.url(), "--election", "jobs", "--id", "worker-a", "--ttl", "2",
                                 "--grace-ms", "500", "--recampaign"});
  INFO(both_logs(a));
  REQUIRE(eventually([&] { return a.started_command(); }, 10s));
  const std::int64_t t1 = a.token();
  const pid_t child1 = a.child_pid();

  // Someone revokes the lease: the keepalive finds it gone, the command is stopped, and elect
  // campaigns again with a new lease -- a new term with a higher token.
  fencegate::election::Client c(client_options(etcd));
  fencegate::election::KeyValue kv;
  REQUIRE(c.leader("jobs", &kv).ok());
  REQUIRE(c.revoke(kv.lease, 2s).ok());
  REQUIRE(eventually([&] { return !pid_alive(child1); }, 3s));
  REQUIRE(eventually([&] { return a.started_command() && a.token() > t1; }, 10s));
  CHECK(a.process->running());
  CHECK(pid_alive(a.child_pid()));
  CHECK(a.log().find("campaigning again (--recampaign)") != std::string::npos);
  a.process->kill(SIGTERM);
  auto st = a.process->wait_for(10s);
  REQUIRE(st.has_value());
  CHECK(st->code == 128 + SIGTERM);

  // A background process the command left behind does not outlive its authority.
  const std::string bg = dir.file("bg.pid");
  auto r = run_command({kFencegate, "elect", "--etcd", etcd.url(), "--election", "jobs", "--ttl", "2", "--", "sh", "-c",
                        "sleep 60 & echo $! > '" + bg + "'; exit 0"},
                       20s);
  CHECK(r.code() == 0);
  const std::string bgpid = read_file(bg);
  REQUIRE_FALSE(bgpid.empty());
  const pid_t p = static_cast<pid_t>(std::stol(bgpid));
  // sleep was re-parented to init (or a subreaper); give it a moment to be reaped.
  CHECK(eventually([&] { return !pid_alive(p); }, 3s));
}

TEST_CASE("elect: SIGKILLed, its command's whole group dies with it; the command inherits no etcd sockets") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  TempDir dir("fencegate-elect");
  const std::string bg = dir.file("bg.pid");
  // The command forks a child of its own (a worker pool, a shell pipeline).
  Process e = Process::start({kFencegate, "elect", "--etcd", etcd.url(), "--election", "jobs", "--ttl", "5", "--",
                              "sh", "-c", "sleep 60 & echo $! > '" + bg + ".tmp'; mv '" + bg + ".tmp' '" + bg + "'; wait"},
                             ProcessOptions{dir.file("elect.log"), {}, {}});
  INFO(read_file(dir.file("elect.log")));
  REQUIRE(eventually([&] { return file_exists(bg); }, 10s));
  const pid_t grandchild = static_cast<pid_t>(std::stol(read_file(bg)));
  REQUIRE(pid_alive(grandchild));
  // It holds no socket: no lease or client connection to etcd (elect was started with none).
  std::vector<std::string> sockets;
  for (const auto& d : std::filesystem::directory_iterator("/proc/" + std::to_string(grandchild) + "/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(d.path(), ec).string();
    if (target.rfind("socket:", 0) == 0) sockets.push_back(d.path().filename().string() + " -> " + target);
  }
  CHECK(sockets.empty());
  e.kill(SIGKILL);
  // The parent-death signal reaches only the direct child; the guardian takes the rest.
  CHECK(eventually([&] { return !pid_alive(grandchild); }, 3s));
}

TEST_CASE("elect: descriptors elect was started with pass to the command (3<file)") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  TempDir dir("fencegate-elect");
  write_file(dir.file("in"), "from fd 3\n");
  const std::string fg = kFencegate;
  auto r = run_command({"/bin/sh", "-c",
                        "exec 3<'" + dir.file("in") + "'; exec '" + fg + "' elect --etcd " + etcd.url() +
                            " --election jobs --ttl 3 -- sh -c 'cat <&3'"},
                       20s);
  INFO(r.err);
  CHECK(r.code() == 0);
  CHECK(r.out == "from fd 3\n");
}

TEST_CASE("elect: a first etcd endpoint that accepts and never answers does not use up the grant's time") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  // Listens, never accepts: connections complete in the backlog, requests get no answer.
  std::uint16_t hung_port = 0;
  Fd hung = listen_loopback(&hung_port);
  REQUIRE(hung.valid());
  const std::string hung_url = "http://127.0.0.1:" + std::to_string(hung_port);
  auto r = run_command({kFencegate, "elect", "--etcd", hung_url + "," + etcd.url(), "--election", "jobs", "--ttl", "3",
                        "--", "sh", "-c", "test \"$FENCING_TOKEN\" -gt 0 && exit 9"},
                       40s);
  hung.reset();
  INFO(r.err);
  CHECK(r.code() == 9);  // elected through the second endpoint, the command ran
}

// The leader key's watch stream may sit on a member that went silent (here: an endpoint that
// accepts and never answers) while the quorum, through the other endpoint, keeps the lease alive
// and sees the key deleted and the next candidate elected. The term still ends promptly: the
// guard also reads the key (about every second), with failover.
TEST_CASE("elect: a leader key deleted while the key's watch sits on a silent endpoint still ends the term") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  TempDir dir("fencegate-elect");
  std::uint16_t hung_port = 0;
  Fd hung = listen_loopback(&hung_port);
  REQUIRE(hung.valid());
  const std::string hung_url = "http://127.0.0.1:" + std::to_string(hung_port);
  fencegate::election::Client c(client_options(etcd));
  Contender a = start_contender(dir.path(), "a",
                                {"--etcd", hung_url + "," + etcd.url(), "--election", "jobs", "--id", "worker-a",
                                 "--ttl", "10", "--grace-ms", "500"});
  INFO(a.log());
  REQUIRE(eventually([&] { return a.started_command(); }, 20s));
  const pid_t a_child = a.child_pid();
  std::this_thread::sleep_for(1500ms);  // the guard's watch is set up (on whichever endpoint)
  fencegate::election::KeyValue lead;
  REQUIRE(c.leader("jobs", &lead).ok());
  const auto deleted_at = Clock::now();
  REQUIRE(c.delete_range(lead.key, "").ok());
  CHECK(eventually([&] { return !pid_alive(a_child); }, 2500ms));
  MESSAGE("A's command was gone ",
          std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - deleted_at).count(),
          " ms after its key was deleted");
  auto st = a.process->wait_for(10s);
  REQUIRE(st.has_value());
  CHECK(st->code == 75);
  hung.reset();
}

// A command slow to stop (it ignores SIGTERM) with a --grace-ms longer than the lease margin:
// after a lost lease, the SIGKILL comes by the lease's earliest expiry on etcd, not after the
// whole grace, since a successor may lead from then on.
TEST_CASE("elect: on a lost lease the command is SIGKILLed by the lease's earliest expiry, not after a longer grace") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  TempDir dir("fencegate-elect");
  const std::string pidfile = dir.file("pid");
  Process e = Process::start({kFencegate, "elect", "--etcd", etcd.url(), "--election", "jobs", "--ttl", "3",
                              "--grace-ms", "20000", "--", "sh", "-c",
                              "trap '' TERM; echo $$ > '" + pidfile + ".tmp'; mv '" + pidfile + ".tmp' '" + pidfile +
                                  "'; while :; do sleep 0.1; done"},
                             ProcessOptions{dir.file("elect.log"), {}, {}});
  INFO(read_file(dir.file("elect.log")));
  REQUIRE(eventually([&] { return file_exists(pidfile); }, 15s));
  const pid_t child = static_cast<pid_t>(std::stol(read_file(pidfile)));
  const auto t0 = Clock::now();
  etcd.stop();  // no renewal can succeed: the lease's deadline (TTL - 600 ms after the last one) passes
  // Deadline <= 2.4 s, earliest expiry on etcd <= 3 s after the last renewal; not 2.4 + 20 s.
  CHECK(eventually([&] { return !pid_alive(child); }, 6s));
  MESSAGE("the command was gone ", std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count(),
          " ms after etcd stopped");
  CHECK(read_file(dir.file("elect.log")).find("the grace period is cut") != std::string::npos);
  e.kill(SIGKILL);
}

// etcd restarted while B waits in line: B campaigns again with the lease it has, so its key keeps
// its place. A new lease would queue a second key behind the abandoned one, which would lead next
// with no process behind it (and be fenced) until its lease expired: a failover a TTL late.
TEST_CASE("elect: a candidate cut off by an etcd restart keeps its place; the failover is not a TTL late") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  TempDir dir("fencegate-elect");
  const std::vector<std::string> flags{"--etcd", etcd.url(), "--election", "ledger", "--ttl", "20"};
  Contender a = start_contender(dir.path(), "a", flags);
  REQUIRE(eventually([&] { return a.started_command(); }, 15s));
  Contender b = start_contender(dir.path(), "b", flags);
  fencegate::election::Client c(client_options(etcd));
  auto keys = [&] {
    std::vector<fencegate::election::KeyValue> kvs;
    c.range("ledger/", "ledger0", &kvs);
    return kvs.size();
  };
  REQUIRE(eventually([&] { return keys() == 2; }, 10s));
  etcd.stop();
  std::this_thread::sleep_for(1500ms);  // B's campaign call breaks
  REQUIRE(etcd.start());
  std::this_thread::sleep_for(3s);  // B is back in line (its backoff is 0.5-1 s)
  CHECK(keys() == 2);  // no second key for B
  CHECK(b.log().find("campaigning again with the same lease") != std::string::npos);
  a.process->kill(SIGTERM);
  REQUIRE(a.process->wait_for(15s).has_value());
  const auto t0 = Clock::now();
  CHECK(eventually([&] { return b.started_command(); }, 15s));
  INFO(b.log());
  CHECK(Clock::now() - t0 < 5s);  // not the 20 s TTL of an abandoned key
  b.process->kill(SIGTERM);
  b.process->wait_for(15s);
}
