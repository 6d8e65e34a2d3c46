// Issue 30: operation IDs (docs/idempotency.md) through the real binary: replay, 422, 409 while
// in flight, outcome unknown after an upstream reset, release when the upstream is unreachable,
// expiry, the per-resource limit, observe mode, a retry across a leader change, keys surviving a
// restart.
#include <thread>

#include "tests/integration/harness.h"

using namespace fencegate::testing;

namespace {

json keyed_config(const std::string& upstream, json idem = json::object(), const std::string& mode = "enforce") {
  json r = route("/", upstream, "ledger", mode);
  r["idempotency"] = std::move(idem);
  return config_with_routes({r});
}

Headers keyed(std::int64_t g, const std::string& key, Headers more = {}) {
  more.emplace_back("Idempotency-Key", "\"" + key + "\"");
  return token(g, std::move(more));
}

std::string problem_type(const ReadResult& r) {
  try {
    return body_json(r).value("type", "");
  } catch (...) {
    return "";
  }
}

}  // namespace

TEST_SUITE("idempotency") {
  TEST_CASE("idempotency: a retry gets the recorded answer without touching the upstream; another request 422") {
    RecordingUpstream up([](const RecordedRequest& r) {
      UpstreamAction a = UpstreamAction::respond(201);
      a.headers = {{"Content-Type", "application/json"}, {"Location", "/charges/1"}, {"Set-Cookie", "s=1"}};
      a.body = "{\"charged\":\"" + r.body + "\"}";
      return a;
    });
    Proxy px(ProxySpec{.config = keyed_config(up.url())});
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    auto first = request(px.port(), "POST", "/charges", keyed(5, "charge:alice:2026-11"), "alice");
    INFO(describe(first));
    REQUIRE(first.code() == 201);
    CHECK_FALSE(first.response.has("Idempotent-Replayed"));
    auto again = request(px.port(), "POST", "/charges", keyed(5, "charge:alice:2026-11"), "alice");
    INFO(describe(again));
    CHECK(again.code() == 201);
    CHECK(again.response.header("Idempotent-Replayed") == "true");
    CHECK(again.response.body == first.response.body);
    CHECK(again.response.header("Content-Type") == "application/json");
    CHECK(again.response.header("Location") == "/charges/1");
    CHECK_FALSE(again.response.has("Set-Cookie"));  // only fields that describe the body are kept
    CHECK(again.response.header("Fencing-Generation") == "5");
    CHECK(up.count() == 1);
  // Same key, another body (or target): 422, not forwarded.
    auto other = request(px.port(), "POST", "/charges", keyed(5, "charge:alice:2026-11"), "bob");
    INFO(describe(other));
    CHECK(other.code() == 422);
    CHECK(problem_type(other) == "urn:fencegate:problem:idempotency-key-mismatch");
    auto other_target = request(px.port(), "POST", "/refunds", keyed(5, "charge:alice:2026-11"), "alice");
    CHECK(other_target.code() == 422);
    CHECK(up.count() == 1);
  // Requests without a key pass as before; a malformed key is 400.
    CHECK(is_2xx(request(px.port(), "POST", "/charges", token(5), "carol")));
    auto bad = request(px.port(), "POST", "/charges", token(5, {{"Idempotency-Key", "unquoted"}}), "x");
    CHECK(bad.code() == 400);
    CHECK(problem_type(bad) == "urn:fencegate:problem:idempotency-key-malformed");
    auto two = request(px.port(), "POST", "/charges", keyed(5, "a", {{"Idempotency-Key", "\"b\""}}), "x");
    CHECK(two.code() == 400);
    CHECK(up.count() == 2);
  // Fencing first: a stale generation is refused as ever, whatever its key.
    CHECK(is_2xx(request(px.port(), "POST", "/other", token(7), "y")));
    auto stale = request(px.port(), "POST", "/charges", keyed(5, "charge:alice:2026-11"), "alice");
    INFO(describe(stale));
    CHECK(stale.code() == 409);
    CHECK(problem_type(stale) == "urn:fencegate:problem:stale-generation");
    px.stop();
    auto rows = read_audit(px.db());
    int mismatches = 0;
    for (const auto& r : rows) mismatches += r.decision == "rejected_idempotency_mismatch";
    CHECK(mismatches == 2);
  }

  TEST_CASE("idempotency: required keys; chunked bodies are fingerprinted decoded") {
    RecordingUpstream up;
    Proxy px(ProxySpec{.config = keyed_config(up.url(), {{"required", true}})});
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    auto missing = request(px.port(), "POST", "/x", token(1), "b");
    CHECK(missing.code() == 400);
    CHECK(problem_type(missing) == "urn:fencegate:problem:idempotency-key-missing");
    CHECK(up.count() == 0);
    HttpClient c;
    Headers h = keyed(1, "chunky", {{"Transfer-Encoding", "chunked"}});
    auto a = request(px.port(), "POST", "/x", h, chunked("hello chunked world", 4));
    INFO(describe(a));
    REQUIRE(is_2xx(a));
    auto b = request(px.port(), "POST", "/x", keyed(1, "chunky"), "hello chunked world");  // same body, other framing
    INFO(describe(b));
    CHECK(b.code() == a.code());
    CHECK(b.response.header("Idempotent-Replayed") == "true");
    CHECK(up.count() == 1);
    REQUIRE(up.requests().size() == 1);
    CHECK(up.requests()[0].body == "hello chunked world");
  }

  TEST_CASE("idempotency: a keyed write with Expect: 100-continue gets its 100 before it sends the body") {
    RecordingUpstream up;
    Proxy px(ProxySpec{.config = keyed_config(up.url())});
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    for (int round = 0; round < 2; ++round) {
      CAPTURE(round);
      HttpClient c;
      REQUIRE(c.connect(px.port()));
      REQUIRE(
          c.send("POST /e HTTP/1.1\r\nHost: x\r\nFencing-Token: 1\r\nIdempotency-Key: \"exp\"\r\n"
                 "Expect: 100-continue\r\nContent-Length: 5\r\n\r\n"));
      // The 100 arrives before any body byte is sent (read_response skips it later).
      CHECK_FALSE(c.stays_silent(5s));
      CHECK(c.pending().starts_with("HTTP/1.1 100 Continue\r\n"));
      REQUIRE(c.send("hello"));
      auto r = c.read_response(5s);
      INFO(describe(r));
      CHECK(r.code() == 200);
      CHECK(r.response.has("Idempotent-Replayed") == (round == 1));
    }
    CHECK(up.count() == 1);
    REQUIRE(up.requests().size() == 1);
    CHECK(up.requests()[0].body == "hello");
    CHECK_FALSE(up.requests()[0].has("Expect"));
  }

  TEST_CASE("idempotency: a retry while the first is in flight is 409 with Retry-After") {
    RecordingUpstream up([](const RecordedRequest&) { return UpstreamAction::respond(200, 1500); });
    Proxy px(ProxySpec{.config = keyed_config(up.url())});
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    ReadResult first;
    std::thread t([&] { first = request(px.port(), "POST", "/jobs", keyed(3, "job-1"), "run", 20s); });
    REQUIRE(up.wait_for_count(1, 10s));
    auto second = request(px.port(), "POST", "/jobs", keyed(3, "job-1"), "run");
    INFO(describe(second));
    CHECK(second.code() == 409);
    CHECK(problem_type(second) == "urn:fencegate:problem:idempotency-in-flight");
    CHECK(second.response.header("Retry-After") == "1");
    t.join();
    REQUIRE(is_2xx(first));
    auto third = request(px.port(), "POST", "/jobs", keyed(3, "job-1"), "run");
    CHECK(is_2xx(third));
    CHECK(third.response.header("Idempotent-Replayed") == "true");
    CHECK(up.count() == 1);
  }

  TEST_CASE("idempotency: an upstream reset makes the outcome unknown; 503 releases; 502 from a gateway is unknown") {
    std::atomic<int> calls{0};
    RecordingUpstream up([&](const RecordedRequest& r) {
      ++calls;
      if (r.target == "/reset") return UpstreamAction::reset_connection();
      if (r.target == "/busy") return UpstreamAction::respond(calls.load() == 2 ? 503 : 200);
      if (r.target == "/gateway") return UpstreamAction::respond(502);
      return UpstreamAction::respond(200);
    });
    Proxy px(ProxySpec{.config = keyed_config(up.url())});
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    auto a = request(px.port(), "POST", "/reset", keyed(2, "r1"), "x");
    CHECK(a.code() == 502);
    auto retry = request(px.port(), "POST", "/reset", keyed(2, "r1"), "x");
    INFO(describe(retry));
    CHECK(retry.code() == 409);
    CHECK(problem_type(retry) == "urn:fencegate:problem:idempotency-outcome-unknown");
    CHECK(up.count() == 1);
    // 503: the upstream says it did not act; the key is released and the retry goes through.
    auto busy = request(px.port(), "POST", "/busy", keyed(2, "b1"), "x");
    CHECK(busy.code() == 503);
    auto busy_retry = request(px.port(), "POST", "/busy", keyed(2, "b1"), "x");
    CHECK(busy_retry.code() == 200);
    CHECK_FALSE(busy_retry.response.has("Idempotent-Replayed"));
    CHECK(up.count() == 3);
    auto gw = request(px.port(), "POST", "/gateway", keyed(2, "g1"), "x");
    CHECK(gw.code() == 502);
    auto gw_retry = request(px.port(), "POST", "/gateway", keyed(2, "g1"), "x");
    CHECK(problem_type(gw_retry) == "urn:fencegate:problem:idempotency-outcome-unknown");
    CHECK(up.count() == 4);
  }

  TEST_CASE("idempotency: on_unknown forward sends the retry of an unknown outcome on") {
    RecordingUpstream up([](const RecordedRequest& r) {
      return r.index == 0 ? UpstreamAction::reset_connection() : UpstreamAction::respond(200);
    });
    Proxy px(ProxySpec{.config = keyed_config(up.url(), {{"on_unknown", "forward"}})});
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    CHECK(request(px.port(), "POST", "/u", keyed(2, "u1"), "x").code() == 502);
    CHECK(request(px.port(), "POST", "/u", keyed(2, "u1"), "x").code() == 200);
    auto third = request(px.port(), "POST", "/u", keyed(2, "u1"), "x");
    CHECK(third.response.header("Idempotent-Replayed") == "true");
    CHECK(up.count() == 2);
  }

  TEST_CASE("idempotency: a key whose write never reached the upstream is released") {
    const auto closed = free_port();  // nothing listens there
    Proxy px(ProxySpec{.config = keyed_config("http://127.0.0.1:" + std::to_string(closed))});
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    auto a = request(px.port(), "POST", "/n", keyed(1, "n1"), "x");
    CHECK(a.code() == 502);
    auto b = request(px.port(), "POST", "/n", keyed(1, "n1"), "x");
    INFO(describe(b));
    CHECK(b.code() == 502);  // forwarded again (not 409 in flight or unknown)
    px.stop();
    std::string err;
    auto ro = fencegate::store::Store::open_readonly(px.db(), &err);
    REQUIRE(ro);
    fencegate::store::KeyRecord rec;
    CHECK_FALSE(ro->key_get("ledger", "", "n1", &rec, nullptr));
  }

  TEST_CASE("idempotency: keys expire after their retention; a resource at max_keys refuses new keys with 503") {
    RecordingUpstream up;
    Proxy px(ProxySpec{.config = keyed_config(up.url(), {{"retention", "1s"}, {"max_keys", 2}})});
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    REQUIRE(is_2xx(request(px.port(), "POST", "/e", keyed(1, "e1"), "x")));
    REQUIRE(is_2xx(request(px.port(), "POST", "/e", keyed(1, "e2"), "x")));
    auto full = request(px.port(), "POST", "/e", keyed(1, "e3"), "x");
    INFO(describe(full));
    CHECK(full.code() == 503);
    CHECK(problem_type(full) == "urn:fencegate:problem:idempotency-limit");
    CHECK(request(px.port(), "POST", "/e", keyed(1, "e1"), "x").response.header("Idempotent-Replayed") == "true");
    CHECK(up.count() == 2);
    // After the retention the keys are gone (removed in the background): e3 now fits, and e1 is
    // forwarded as new.
    bool fits = false;
    for (int i = 0; i < 100 && !fits; ++i) {
      std::this_thread::sleep_for(100ms);
      fits = is_2xx(request(px.port(), "POST", "/e", keyed(1, "e3"), "x"));
    }
    CHECK(fits);
    auto e1 = request(px.port(), "POST", "/e", keyed(1, "e1"), "x");
    CHECK(is_2xx(e1));
    CHECK_FALSE(e1.response.has("Idempotent-Replayed"));
    CHECK(up.count() == 4);
  }

  TEST_CASE("idempotency: observe mode forwards duplicates, counted and audited as would_replay") {
    RecordingUpstream up;
    Proxy px(ProxySpec{.config = keyed_config(up.url(), json::object(), "observe")});
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    CHECK(is_2xx(request(px.port(), "POST", "/o", keyed(1, "o1"), "x")));
    auto dup = request(px.port(), "POST", "/o", keyed(1, "o1"), "x");
    CHECK(is_2xx(dup));
    CHECK_FALSE(dup.response.has("Idempotent-Replayed"));
    CHECK(is_2xx(request(px.port(), "POST", "/o", keyed(1, "o1"), "other body")));  // no 422 either
    CHECK(is_2xx(request(px.port(), "POST", "/o", token(1, {{"Idempotency-Key", "bad"}}), "x")));
    CHECK(up.count() == 4);
    px.stop();
    int would = 0;
    for (const auto& r : read_audit(px.db())) would += r.decision == "would_replay";
    CHECK(would == 1);
  }

  TEST_CASE("idempotency: a new leader's retry gets the old leader's result; keys survive a restart") {
    RecordingUpstream up([](const RecordedRequest& r) {
      UpstreamAction a = UpstreamAction::respond(201);
      a.body = "charged by " + r.fencing_token_raw();
      return a;
    });
    Proxy px(ProxySpec{.config = keyed_config(up.url())});
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    auto old_leader = request(px.port(), "POST", "/charge", keyed(4, "charge:bob:2026-11"), "bob");
    REQUIRE(old_leader.code() == 201);
    auto new_leader = request(px.port(), "POST", "/charge", keyed(5, "charge:bob:2026-11"), "bob");
    INFO(describe(new_leader));
    CHECK(new_leader.code() == 201);
    CHECK(new_leader.response.body == "charged by 4");
    CHECK(new_leader.response.header("Idempotent-Replayed") == "true");
    CHECK(new_leader.response.header("Fencing-Generation") == "5");
    CHECK(up.count() == 1);
    REQUIRE(px.stop().code == 0);
    FG_START(px);
    auto after = request(px.port(), "POST", "/charge", keyed(5, "charge:bob:2026-11"), "bob");
    INFO(describe(after));
    CHECK(after.code() == 201);
    CHECK(after.response.body == "charged by 4");
    CHECK(after.response.header("Idempotent-Replayed") == "true");
    CHECK(up.count() == 1);
  }

  TEST_CASE("idempotency: a key in flight when fencegate is killed is unknown after the restart") {
    RecordingUpstream up([](const RecordedRequest&) { return UpstreamAction::hang(); });
    Proxy px(ProxySpec{.config = keyed_config(up.url())});
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    std::thread t([&] { (void)request(px.port(), "POST", "/k", keyed(1, "killed"), "x", 10s); });
    REQUIRE(up.wait_for_count(1, 10s));
    px.kill9();
    t.join();
    FG_START(px);
    auto retry = request(px.port(), "POST", "/k", keyed(1, "killed"), "x");
    INFO(describe(retry));
    CHECK(retry.code() == 409);
    CHECK(problem_type(retry) == "urn:fencegate:problem:idempotency-outcome-unknown");
    CHECK(up.count() == 1);
  }

  TEST_CASE("idempotency: an operator looks an unknown key up and clears it (admin API, fencegate keys, metrics)") {
    RecordingUpstream up([](const RecordedRequest& r) {
      return r.index == 0 ? UpstreamAction::reset_connection() : UpstreamAction::respond(200);
    });
    json cfg = keyed_config(up.url());
    const auto admin = free_port();
    cfg["admin"] = {{"listen", "127.0.0.1:" + std::to_string(admin)}};
    Proxy px(ProxySpec{.config = cfg});
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    const std::string key = "charge:dave/2026 11";  // '/' and ' ' percent-encoded below
    const std::string path = "/v1/resources/ledger/idempotency/charge:dave%2F2026%2011";
    CHECK(request(px.port(), "POST", "/c", keyed(2, key), "x").code() == 502);
    // The key's fate is queued before the client has its 502; the admin API reads what is
    // committed, a moment later.
    ReadResult got;
    for (int i = 0; i < 100; ++i) {
      got = request(admin, "GET", path);
      if (got.code() != 200 || body_json(got)["state"] != "in_flight") break;
      std::this_thread::sleep_for(50ms);
    }
    INFO(describe(got));
    REQUIRE(got.code() == 200);
    json j = body_json(got);
    CHECK(j["key"] == key);
    CHECK(j["state"] == "unknown");
    CHECK(j["generation"] == 2);
    CHECK(j.contains("status"));
    CHECK(j["created_at"].get<std::string>().ends_with("Z"));
    CHECK(j["expires_at"].get<std::string>() > j["created_at"].get<std::string>());
    CHECK(request(admin, "GET", "/v1/resources/ledger/idempotency/nope").code() == 404);
    auto metrics = request(admin, "GET", "/metrics");
    CHECK(metrics.response.body.find("fencegate_idempotency_total{resource=\"ledger\",outcome=\"unknown\"} 1") !=
          std::string::npos);
    CHECK(metrics.response.body.find("fencegate_idempotency_keys{resource=\"ledger\"} 1") != std::string::npos);
    auto cli = run_command({kFencegate, "keys", "--db", px.db(), "--json"}, 10s);
    INFO(cli.out, cli.err);
    CHECK(cli.code() == 0);
    CHECK(cli.out.find("\"state\":\"unknown\"") != std::string::npos);
    CHECK(cli.out.find("charge:dave/2026 11") != std::string::npos);
    auto one = run_command({kFencegate, "keys", "--db", px.db(), "--resource", "ledger", "--key", "absent"}, 10s);
    CHECK(one.code() == 3);
    // Cleared, the retry is forwarded as new.
    CHECK(request(px.port(), "POST", "/c", keyed(2, key), "x").code() == 409);
    CHECK(request(admin, "DELETE", path).code() == 200);
    CHECK(request(admin, "GET", path).code() == 404);
    CHECK(request(px.port(), "POST", "/c", keyed(2, key), "x").code() == 200);
    CHECK(up.count() == 2);
  }

}  // TEST_SUITE
