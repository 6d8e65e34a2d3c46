// Durability and process life: kill -9 and restart on the same port and database, crash in the
// middle of a burst, one owner per database, clean SIGTERM/SIGINT, store failure fails closed.
#include "tests/integration/ops_harness.h"

#include <sys/resource.h>

#include <atomic>
#include <filesystem>
#include <thread>
#include <map>
#include <mutex>
#include <set>

using namespace fencegate::testing;

TEST_SUITE("durability") {

TEST_CASE("durability: kill -9, immediate restart on the same port and db keeps the generation and audit") {
  RecordingUpstream up;
  ProxySpec spec;
  spec.upstream = up.url();
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  for (int g = 1; g <= 7; ++g) REQUIRE(is_2xx(request(px.port(), "POST", "/g" + std::to_string(g), token(g))));
  check_problem(request(px.port(), "POST", "/stale-before-crash", token(3)), 409, "default", 3, 7);
  // Keep a client connection open across the crash, as real clients do.
  HttpClient idle;
  REQUIRE(idle.connect(px.port()));

  auto st = px.kill9();
  CHECK(st.signaled);
  REQUIRE_MESSAGE(px.start(), "restart on the same port failed (address reuse?)\n", px.log_for_failure());

  check_problem(request(px.port(), "POST", "/after-6", token(6)), 409, "default", 6, 7);
  auto seven = request(px.port(), "POST", "/after-7", token(7));
  INFO(describe(seven));
  CHECK(is_2xx(seven));
  CHECK(seven.response.header("Fencing-Generation") == "7");
  CHECK(is_2xx(request(px.port(), "POST", "/after-8", token(8))));

  auto stop = px.stop();
  CHECK(stop.exited);
  auto rows = read_audit(px.db());
  INFO("audit:\n", describe(rows));
  bool found = false;
  for (const auto& r : rows)
    if (r.target == "/stale-before-crash") {
      found = true;
      CHECK(r.decision == "rejected_stale");
      CHECK(r.presented_generation == 3);
      CHECK(r.current_generation == 7);
    }
  CHECK_MESSAGE(found, "the audit row of a 409 the client received before kill -9 is missing");
}

TEST_CASE("durability: kill -9 in the middle of a burst of advancing writes") {
  RecordingUpstream up([](const RecordedRequest&) { return UpstreamAction::delayed(3); });
  ProxySpec spec;
  spec.upstream = up.url();
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);

  std::atomic<std::int64_t> next{1};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<std::string> rejected_targets;  // 409s the clients received
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t)
    writers.emplace_back([&] {
      HttpClient c;
      while (!stop.load()) {
        if (!c.connected() && !c.connect(px.port(), 1s)) break;
        std::int64_t g = next.fetch_add(1);
        std::string target = "/burst/" + std::to_string(g);
        // Every third request replays an older generation to produce 409s (and audit rows).
        if (g % 3 == 0 && g > 6) g -= 5;
        auto r = c.request("POST", target, token(g), "", 5s);
        if (!r.ok()) {
          c.close();
          continue;
        }
        if (r.response.status == 409) {
          std::lock_guard lk(mu);
          rejected_targets.push_back(target);
        }
      }
    });
  REQUIRE(up.wait_for_count(30, 20s));
  px.kill9();
  stop = true;
  for (auto& w : writers) w.join();

  std::int64_t highest = 0;
  for (const auto& r : up.requests()) highest = std::max(highest, r.fencing_token().value_or(0));
  REQUIRE(highest > 2);
  REQUIRE_MESSAGE(px.start(), "restart failed\n", px.log_for_failure());
  auto r = request(px.port(), "POST", "/after", token(highest - 1));
  INFO("highest generation ever forwarded: ", highest, "\n", describe(r));
  check_problem(r, 409, "default", highest - 1, std::nullopt);
  json j = body_json(r);
  if (j.contains("current_generation")) CHECK(j["current_generation"].get<std::int64_t>() >= highest);
  CHECK(is_2xx(request(px.port(), "POST", "/after-ok", token(highest))));

  px.stop();
  auto rows = read_audit(px.db());
  std::set<std::string> audited;
  for (const auto& row : rows) audited.insert(row.target);
  std::lock_guard lk(mu);
  INFO("highest forwarded ", highest, ", 409s received ", rejected_targets.size());
  for (const auto& t : rejected_targets) {
    CAPTURE(t);
    CHECK_MESSAGE(audited.count(t) == 1, "a rejection the client received has no audit row after kill -9");
  }
}

TEST_CASE("durability: a second fencegate on the same database refuses to start; readers still read") {
  RecordingUpstream up;
  ProxySpec spec;
  spec.upstream = up.url();
  Proxy first(spec);
  FG_LOG_ON_FAILURE(first);
  FG_START(first);
  REQUIRE(is_2xx(request(first.port(), "POST", "/a", token(2))));

  TempDir dir;
  ProcessOptions o;
  o.log_path = dir.file("second.log");
  auto port2 = free_port();
  auto second = Process::start({kFencegate, "serve", "--listen", "127.0.0.1:" + std::to_string(port2), "--upstream",
                                up.url(), "--db", first.db(), "--admin-listen", "127.0.0.1:0"},
                               o);
  auto st = second.wait_for(10s);
  INFO("second fencegate log:\n", second.log());
  REQUIRE_MESSAGE(st.has_value(), "a second owner of the database did not exit");
  CHECK(st->exited);
  CHECK(st->code != 0);
  CHECK_FALSE(second.log().empty());  // a clear error for the operator

  // The first one is unaffected.
  CHECK(is_2xx(request(first.port(), "POST", "/b", token(2))));
  // Read-only readers work while it runs.
  auto cli = run_command({"/usr/bin/sqlite3", "-readonly", first.db(), "PRAGMA user_version;"}, 10s);
  INFO("sqlite3: ", cli.status.describe(), "\n", cli.out, cli.err);
  CHECK(cli.code() == 0);
  auto res = read_resources(first.db());
  bool found = false;
  for (const auto& r : res)
    if (r.resource == "default") {
      found = true;
      CHECK(r.generation == 2);
    }
  CHECK(found);
}

TEST_CASE("durability: SIGTERM and SIGINT stop it cleanly and promptly (exit 0)") {
  RecordingUpstream up;
  ProxySpec spec;
  spec.upstream = up.url();
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  REQUIRE(is_2xx(request(px.port(), "POST", "/a", token(1))));
  HttpClient idle;  // an idle keep-alive connection must not hold up the exit
  REQUIRE(idle.connect(px.port()));
  REQUIRE(is_2xx(idle.request("GET", "/idle")));
  px.process().kill(SIGTERM);
  auto st = px.process().wait_for(5s);
  REQUIRE_MESSAGE(st.has_value(), "still running 5 s after SIGTERM");
  CHECK(st->exited);
  CHECK(st->code == 0);

  FG_START(px);
  REQUIRE(is_2xx(request(px.port(), "POST", "/b", token(1))));
  px.process().kill(SIGINT);
  st = px.process().wait_for(5s);
  REQUIRE_MESSAGE(st.has_value(), "still running 5 s after SIGINT");
  CHECK(st->exited);
  CHECK(st->code == 0);
}

TEST_CASE("durability: store failure (file size limit) answers 503 and forwards nothing (fail closed)") {
  RecordingUpstream up;
  ProxySpec spec;
  spec.upstream = up.url();
  spec.fsize_limit = 512 * 1024;
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);

  std::int64_t failed_at = 0;
  ReadResult failure;
  HttpClient c;
  for (std::int64_t g = 1; g <= 4000 && !failed_at; ++g) {
    if (!c.connected()) REQUIRE(c.connect(px.port()));
    auto r = c.request("POST", "/adv/" + std::to_string(g), token(g), "", 15s);
    INFO("generation ", g, ": ", describe(r));
    REQUIRE(r.ok());
    if (r.response.status == 503) {
      failed_at = g;
      failure = r;
    } else {
      REQUIRE(is_2xx(r));
    }
  }
  REQUIRE_MESSAGE(failed_at > 0, "no 503 before the limit; raise the write count or lower fsize_limit");
  INFO("store failure after ", failed_at - 1, " advances");
  check_problem(failure, 503, "default", std::nullopt, std::nullopt, /*full_fence_members=*/false);

  // The failed advance's write is not upstream, nor anything above the last durable generation.
  for (const auto& r : up.requests()) {
    CAPTURE(r.target);
    CHECK(r.fencing_token().value_or(0) < failed_at);
  }
  // Still failing closed on the next advances, and still alive.
  for (std::int64_t g = failed_at + 1; g < failed_at + 4; ++g) {
    auto r = request(px.port(), "POST", "/again/" + std::to_string(g), token(g));
    INFO(describe(r));
    CHECK(r.code() == 503);
  }
  for (const auto& r : up.requests()) CHECK(r.target.rfind("/again/", 0) != 0);
  CHECK(px.running());
}

TEST_CASE("durability: readiness follows the store back without waiting for a fenced write") {
  RecordingUpstream up;
  ProxySpec spec;
  spec.upstream = up.url();
  spec.fsize_limit = 512 * 1024;
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  FG_ADMIN_PORT(admin, px);
  HttpClient c;
  REQUIRE(c.connect(px.port()));
  bool failed = false;
  for (std::int64_t g = 1; g <= 4000 && !failed; ++g) failed = c.request("POST", "/adv", token(g), "", 15s).code() == 503;
  REQUIRE(failed);
  CHECK(request(admin, "GET", "/readyz").code() == 503);
  // The disk has room again. No write comes (an unready pod gets no traffic): the store's own
  // check finds it writable and readiness returns.
  rlimit unlimited{RLIM_INFINITY, RLIM_INFINITY};
  REQUIRE(::prlimit(px.process().pid(), RLIMIT_FSIZE, &unlimited, nullptr) == 0);
  bool ready = false;
  for (int i = 0; i < 60 && !ready; ++i) {
    ready = request(admin, "GET", "/readyz").code() == 200;
    if (!ready) std::this_thread::sleep_for(100ms);
  }
  CHECK(ready);
  CHECK(px.log().find("commits succeed again") != std::string::npos);
}

TEST_CASE("durability: a database deleted under a running sidecar fails closed, and its state survives a restart") {
  RecordingUpstream up;
  ProxySpec spec;
  spec.upstream = up.url();
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  FG_ADMIN_PORT(admin, px);
  REQUIRE(is_2xx(request(px.port(), "POST", "/five", token(5))));
  check_problem(request(px.port(), "POST", "/stale", token(4)), 409, "default", 4, 5);
  REQUIRE(std::filesystem::remove(px.db()));  // a cleanup script, an operator
  // Nothing more is committed to a file no restart would read: fail closed, and say why.
  auto nine = request(px.port(), "POST", "/nine", token(9));
  CHECK(nine.code() == 503);
  auto rz = request(admin, "GET", "/readyz");
  CHECK(rz.code() == 503);
  CHECK(rz.response.body.find("deleted or replaced") != std::string::npos);
  for (const auto& r : up.requests()) CHECK(r.target != "/nine");
  // What the sidecar had was written back: after kill -9 and a restart the fence is where it was.
  CHECK(std::filesystem::exists(px.db()));
  px.kill9();
  REQUIRE_MESSAGE(px.start(), px.log_for_failure());
  check_problem(request(px.port(), "POST", "/stale-again", token(4)), 409, "default", 4, 5);
  CHECK(is_2xx(request(px.port(), "POST", "/five-again", token(5))));
  px.stop();
  bool found = false;
  for (const auto& r : read_audit(px.db())) found = found || r.target == "/stale";
  CHECK(found);

  // `rm fence.db*` and a clean stop at once, before any check ran: the stop puts it back too.
  REQUIRE_MESSAGE(px.start(), px.log_for_failure());
  REQUIRE(is_2xx(request(px.port(), "POST", "/seven", token(7))));
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(px.db() + suffix);
  auto stopped = px.stop();
  CHECK(stopped.exited);
  CHECK(std::filesystem::exists(px.db()));
  REQUIRE_MESSAGE(px.start(), px.log_for_failure());
  check_problem(request(px.port(), "POST", "/six", token(6)), 409, "default", 6, 7);
}

TEST_CASE("durability: a write-ahead log without its database refuses to start (exit 1)") {
  RecordingUpstream up;
  ProxySpec spec;
  spec.upstream = up.url();
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  REQUIRE(is_2xx(request(px.port(), "POST", "/five", token(5))));
  px.kill9();  // the -wal holds the commit
  REQUIRE(std::filesystem::exists(px.db() + "-wal"));
  REQUIRE(std::filesystem::remove(px.db()));
  CHECK_FALSE(px.start(3s));
  auto st = px.process().wait();
  CHECK(st.exited);
  CHECK(st.code == 1);
  CHECK(px.log().find("write-ahead log") != std::string::npos);
}

}  // TEST_SUITE
