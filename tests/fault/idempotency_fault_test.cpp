// Issue 30 fault test: fencegate killed with -9 at random points while two leaders send keyed,
// concurrent, retried writes. The upstream's own record must show no operation ID executed twice,
// and no acknowledged answer lost: every operation a client saw succeed was executed (once) and
// every later answer to it is the same answer.
#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "tests/integration/harness.h"

using namespace fencegate::testing;

TEST_CASE("idempotency fault: kill -9 under keyed concurrent retries from two leaders executes no operation twice") {
  std::mt19937 rng(static_cast<unsigned>(std::random_device{}()));
  const unsigned seed = rng();
  INFO("seed ", seed);
  std::mt19937 delays(seed);
  std::mutex delays_mu;
  RecordingUpstream up([&](const RecordedRequest& r) {
    int d;
    {
      std::lock_guard lk(delays_mu);
      d = static_cast<int>(delays() % 40);
    }
    UpstreamAction a = UpstreamAction::respond(201, d);
    a.body = "done " + r.header("Idempotency-Key") + " by " + r.fencing_token_raw();
    return a;
  });
  json cfg = config_with_routes({route("/", up.url(), "jobs")});
  cfg["routes"][0]["idempotency"] = json::object();
  Proxy px(ProxySpec{.config = cfg});
  FG_LOG_ON_FAILURE(px);
  FG_START(px);

  constexpr int kOps = 40;
  struct Seen {
    std::mutex mu;
    std::map<int, std::string> acked;  // op -> the body of its first 2xx answer
    std::vector<std::string> problems;
  } seen;
  std::atomic<bool> stop{false};
  // A leader runs every operation, retrying each until it has a final answer. Leader 1 (token 1)
  // starts first; leader 2 (token 2) re-runs all of them a little later, as a successor that
  // restored an old checkpoint would.
  auto leader = [&](int generation, int start_delay_ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(start_delay_ms));
    for (int op = 0; op < kOps && !stop; ++op) {
      const std::string key = "op:" + std::to_string(op);
      for (int attempt = 0; attempt < 400 && !stop; ++attempt) {
        auto r = request(px.port(), "POST", "/jobs/" + std::to_string(op),
                         token(generation, {{"Idempotency-Key", "\"" + key + "\""}}), "run " + key, 5s);
        if (!r.ok() || r.code() == 503 || r.code() == 502 || r.code() == 504 ||
            (r.code() == 409 && r.response.body.find("idempotency-in-flight") != std::string::npos)) {
          std::this_thread::sleep_for(30ms);  // fencegate down or busy: retry
          continue;
        }
        std::lock_guard lk(seen.mu);
        if (r.code() == 201) {
          auto [it, fresh] = seen.acked.emplace(op, r.response.body);
          if (!fresh && it->second != r.response.body)
            seen.problems.push_back(key + ": answered " + it->second + " and later " + r.response.body);
        } else if (r.code() == 409 && r.response.body.find("stale-generation") != std::string::npos) {
          return;  // this leader was fenced out
        } else if (r.code() != 409) {  // 409 outcome unknown: never executed twice; anything else is wrong
          seen.problems.push_back(key + ": unexpected " + describe(r));
        }
        break;
      }
    }
  };
  std::thread l1(leader, 1, 0), l2(leader, 2, 150);
  for (int kill = 0; kill < 3; ++kill) {
    std::this_thread::sleep_for(std::chrono::milliseconds(150 + rng() % 250));
    px.kill9();
    REQUIRE(px.start());
  }
  l1.join();
  l2.join();
  stop = true;
  std::map<std::string, int> executed;
  for (const auto& r : up.requests()) ++executed[r.header("Idempotency-Key")];
  for (const auto& [key, n] : executed) {
    CAPTURE(key);
    CHECK(n == 1);
  }
  for (const auto& p : seen.problems) FAIL_CHECK(p);
  for (const auto& [op, body] : seen.acked) {
    const std::string key = "\"op:" + std::to_string(op) + "\"";
    CAPTURE(key);
    CHECK(executed[key] == 1);  // acknowledged: executed, once
  }
  MESSAGE("operations acknowledged: ", seen.acked.size(), " of ", kOps, "; executed upstream: ", executed.size());
  CHECK(seen.acked.size() > 0);
}
