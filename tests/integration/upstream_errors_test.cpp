// Upstream failures: unreachable -> 502, too slow -> 504, both problem+json; a reset or an early
// close -> 502; the proxy keeps serving afterwards.
#include "tests/integration/harness.h"

using namespace fencegate::testing;

TEST_SUITE("upstream_errors") {

TEST_CASE("upstream unreachable: 502 problem+json for writes and reads") {
  ProxySpec spec;
  spec.upstream = "http://127.0.0.1:" + std::to_string(free_port());  // nothing listens there
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  auto w = request(px.port(), "POST", "/w", token(1), "x", 15s);
  // A fenced request: its every problem names the fence, like its Fencing-Generation header.
  check_problem(w, 502, "default", 1, 1);
  auto r = request(px.port(), "GET", "/r", {}, {}, 15s);
  check_problem(r, 502, std::nullopt, std::nullopt, std::nullopt, false);
  CHECK_FALSE(body_json(r).contains("resource"));  // an unfenced read has no fence to name
}

// The client is answered at the timeout; the exchange stays open (and the write in flight for the
// fence, see ordering_test) until the upstream answers, since the upstream may still apply it.
TEST_CASE("upstream slower than the upstream timeout: 504 problem+json at the timeout, the upstream finishes it") {
  RecordingUpstream up([](const RecordedRequest& r) {
    return r.target == "/slow" ? UpstreamAction::delayed(4000) : UpstreamAction{};
  });
  ProxySpec spec;
  spec.upstream = up.url();
  spec.args = {"--upstream-timeout-ms", "400"};
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  auto t = timed_request(px.port(), "POST", "/slow", token(1));
  check_problem(t.result, 504, "default", 1, 1);
  CHECK(t.elapsed < 3500ms);
  auto fast = timed_request(px.port(), "POST", "/fast", token(1));  // same generation: not held
  CHECK(is_2xx(fast.result));
  CHECK(fast.elapsed < 2s);
  REQUIRE(up.wait_for_outcome(0, 6s));
  auto o = up.requests()[0].outcome;
  CAPTURE(to_string(o));
  CHECK(o == Outcome::responded);
}

TEST_CASE("upstream resets or closes without answering: 502, and the proxy keeps serving") {
  RecordingUpstream up([](const RecordedRequest& r) {
    if (r.target == "/reset") return UpstreamAction::reset_connection();
    if (r.target == "/close") return UpstreamAction::close_connection();
    return UpstreamAction{};
  });
  ProxySpec spec;
  spec.upstream = up.url();
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  check_problem(request(px.port(), "POST", "/reset", token(1)), 502, std::nullopt, std::nullopt, std::nullopt, false);
  check_problem(request(px.port(), "POST", "/close", token(1)), 502, std::nullopt, std::nullopt, std::nullopt, false);
  CHECK(is_2xx(request(px.port(), "POST", "/after", token(1))));
}

TEST_CASE("upstream closing its connections after each response does not break later requests") {
  RecordingUpstream up([](const RecordedRequest&) {
    auto a = UpstreamAction::respond(200);
    a.headers = {{"Connection", "close"}};
    return a;
  });
  ProxySpec spec;
  spec.upstream = up.url();
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  HttpClient c;
  REQUIRE(c.connect(px.port()));
  for (int i = 0; i < 5; ++i) {
    auto r = c.request("POST", "/n" + std::to_string(i), token(1));
    INFO(describe(r));
    CHECK(is_2xx(r));
    if (!r.ok() || to_lower(r.response.header("Connection")) == "close") REQUIRE(c.connect(px.port()));
  }
  CHECK(up.count() == 5);
  CHECK(up.connections_accepted() == 5);
}

}  // TEST_SUITE

// The upstream pool keeps upstream_idle_per_thread connections; a burst of concurrent exchanges
// beyond that keeps its extra connections for about a second (so the next burst reuses them
// instead of reconnecting on every request), after which the surplus is closed.
TEST_CASE("upstream pool: a burst reuses its connections, and the surplus is closed after a second idle") {
  RecordingUpstream up([](const RecordedRequest&) { return UpstreamAction::delayed(150); });
  ProxySpec spec;
  spec.upstream = up.url();
  spec.threads = 1;  // one pool
  spec.args = {"--upstream-idle-per-thread", "2"};
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  constexpr int kBurst = 12;
  auto burst = [&](const std::string& name) {
    std::vector<std::thread> ts;
    std::atomic<int> ok{0};
    for (int i = 0; i < kBurst; ++i)
      ts.emplace_back([&, i] { ok += is_2xx(request(px.port(), "GET", "/" + name + std::to_string(i))); });
    for (auto& t : ts) t.join();
    return ok.load();
  };
  REQUIRE(burst("a") == kBurst);
  const std::size_t after_first = up.connections_accepted();
  CHECK(after_first >= kBurst - 1);  // the delay makes the exchanges overlap
  REQUIRE(burst("b") == kBurst);
  const std::size_t after_second = up.connections_accepted();
  INFO("upstream connections after bursts: ", after_first, ", ", after_second);
  CHECK(after_second - after_first <= 2);  // reused, not reconnected
  std::this_thread::sleep_for(1800ms);     // idle past the burst allowance: only 2 stay pooled
  REQUIRE(burst("c") == kBurst);
  const std::size_t after_third = up.connections_accepted();
  INFO("after the idle pause: ", after_third);
  CHECK(after_third - after_second >= kBurst - 4);
}
