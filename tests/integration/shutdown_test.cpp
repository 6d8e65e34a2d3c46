// Graceful shutdown against the real binary: on SIGTERM /readyz turns 503 with a reason at once,
// new connections are refused, the request in flight still completes, queued observe-mode audit
// rows are committed, and the process exits 0; in-flight work is bounded by a deadline.
#include "tests/integration/ops_harness.h"

using namespace fencegate::testing;

TEST_SUITE("shutdown") {

TEST_CASE("shutdown: SIGTERM turns readyz 503, finishes the in-flight request, flushes audit rows, exits 0") {
  RecordingUpstream up([](const RecordedRequest& r) {
    return r.target == "/slow" ? UpstreamAction::delayed(2500) : UpstreamAction::respond();
  });
  ProxySpec s;
  s.config = config_with_routes({route("/", up.url(), "ledger", "observe")});
  Proxy px(s);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  FG_ADMIN_PORT(admin, px);

  auto ready = admin_get(admin, "/readyz");
  INFO(describe(ready));
  REQUIRE(ready.code() == 200);

  // Observe-mode rows are queued without waiting for their commit.
  constexpr int kQueued = 40;
  {
    HttpClient c;
    REQUIRE(c.connect(px.port()));
    for (int i = 0; i < kQueued; ++i)
      REQUIRE(is_2xx(c.request("POST", "/queued/" + std::to_string(i), {{"User-Agent", "legacy/1"}})));
  }
  ReadResult slow;
  std::thread t([&] { slow = request(px.port(), "POST", "/slow", {}, "payload", 30s); });
  REQUIRE(up.wait_for_count(kQueued + 1, 10s));

  HttpClient idle;  // an idle keep-alive connection must not hold the shutdown up
  REQUIRE(idle.connect(px.port()));
  REQUIRE(is_2xx(idle.request("POST", "/idle", token(1))));

  px.process().kill(SIGTERM);
  json rz;
  bool not_ready = eventually(
      [&] {
        auto r = admin_get(admin, "/readyz");
        if (r.code() != 503) return false;
        rz = body_json(r);
        return true;
      },
      2s);
  INFO("readyz during shutdown: ", rz.dump());
  CHECK(not_ready);
  CHECK(rz.value("reason", std::string()).size() > 0);
  CHECK(admin_get(admin, "/healthz").code() == 200);  // still alive, just not ready
  // Stopped accepting: a new data connection is refused.
  bool refused = eventually([&] { return !connect_loopback(px.port(), 500ms).valid(); }, 3s);
  CHECK(refused);
  CHECK(px.running());  // the slow request is still in flight

  t.join();
  INFO("in-flight request: ", describe(slow));
  CHECK(is_2xx(slow));
  auto st = px.process().wait_for(20s);
  REQUIRE(st.has_value());
  INFO(st->describe());
  CHECK(st->exited);
  CHECK(st->code == 0);

  auto rows = read_audit(px.db());
  int queued = 0, slow_rows = 0;
  for (const auto& r : rows) {
    if (r.target.rfind("/queued/", 0) == 0 && r.decision == "would_reject_missing") ++queued;
    if (r.target == "/slow") ++slow_rows;
  }
  INFO("audit:\n", describe(rows));
  CHECK(queued == kQueued);
  CHECK(slow_rows == 1);
  CHECK(px.log(256 * 1024).find("\"stopped\"") != std::string::npos);
}

TEST_CASE("shutdown: an upstream that never answers delays the exit only up to the deadline, still exit 0") {
  RecordingUpstream up([](const RecordedRequest& r) {
    return r.target == "/hang" ? UpstreamAction::hang() : UpstreamAction::respond();
  });
  ProxySpec s;
  s.config = config_with_routes({route("/", up.url(), "ledger", "enforce")});
  s.config->operator[]("drain_timeout_ms") = 1000;
  Proxy px(s);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  ReadResult hung;
  std::thread t([&] { hung = request(px.port(), "POST", "/hang", token(1), "x", 30s); });
  REQUIRE(up.wait_for_count(1, 10s));
  auto t0 = Clock::now();
  px.process().kill(SIGTERM);
  auto st = px.process().wait_for(15s);
  t.join();
  REQUIRE(st.has_value());
  INFO(st->describe(), "\nhung request: ", describe(hung));
  CHECK(st->exited);
  CHECK(st->code == 0);
  CHECK(ms_between(t0, Clock::now()) < 8000);
  CHECK_FALSE(is_2xx(hung));  // it never got an upstream answer
  up.stop();
}

TEST_CASE("shutdown: SIGINT on an idle proxy exits 0 promptly") {
  RecordingUpstream up;
  ProxySpec s;
  s.upstream = up.url();
  Proxy px(s);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  REQUIRE(is_2xx(request(px.port(), "POST", "/a", token(1))));
  auto t0 = Clock::now();
  px.process().kill(SIGINT);
  auto st = px.process().wait_for(10s);
  REQUIRE(st.has_value());
  CHECK(st->exited);
  CHECK(st->code == 0);
  CHECK(ms_between(t0, Clock::now()) < 3000);
}

}  // TEST_SUITE shutdown
