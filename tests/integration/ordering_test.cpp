// The fencing order, the heart of the contract: for each resource, forwarded writes ordered by
// when the upstream got them have non-decreasing generations, and no exchange of a lower
// generation overlaps one of a higher generation. Plus drain and drain timeout.
#include "tests/integration/harness.h"
#include "tests/integration/ops_harness.h"

#include <atomic>
#include <future>
#include <map>
#include <random>
#include <set>

using namespace fencegate::testing;

namespace {

struct Sent {
  int thread = 0;
  std::int64_t gen = 0;
  std::string target;
  ReadResult result;
};

std::string show(const RecordedRequest& r, Clock::time_point t0) {
  return r.target + " gen=" + r.fencing_token_raw() + " arrival=+" + std::to_string(ms_between(t0, r.arrival)) +
         "ms completion=+" + std::to_string(ms_between(t0, r.completion)) + "ms " + to_string(r.outcome);
}

}  // namespace

TEST_SUITE("ordering") {

TEST_CASE("ordering: many concurrent writers, slow upstream: generations ordered, exchanges never overlap") {
  RecordingUpstream up([](const RecordedRequest& r) { return UpstreamAction::delayed(5 + int(r.index * 13 % 30)); });
  ProxySpec spec;
  spec.upstream = up.url();
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);

  constexpr int kThreads = 8;
  constexpr int kPerThread = 25;
  std::vector<std::vector<Sent>> sent(kThreads);
  std::vector<std::thread> threads;
  const auto t0 = Clock::now();
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      // Generations follow a shared clock (a new leader every ~60 ms) with per-writer jitter, so
      // writers mostly overlap on the same or adjacent generations: advances, equal-generation
      // writes, drains and stale rejections all happen, interleaved.
      std::mt19937 rng(1000 + t);
      std::uniform_int_distribution<int> jitter(-1, 1);
      HttpClient c;
      for (int k = 0; k < kPerThread; ++k) {
        Sent s;
        s.thread = t;
        s.gen = std::max<std::int64_t>(1, 2 + ms_between(t0, Clock::now()) / 60 + jitter(rng));
        s.target = "/w/" + std::to_string(t) + "/" + std::to_string(k);
        if (!c.connected() && !c.connect(px.port())) {
          s.result.status = ReadStatus::reset;
          s.result.error = "connect failed";
        } else {
          s.result = c.request("POST", s.target, token(s.gen), "payload " + s.target, 30s);
          if (!s.result.ok() || to_lower(s.result.response.header("Connection")) == "close") c.close();
        }
        sent[t].push_back(std::move(s));
      }
    });
  }
  for (auto& th : threads) th.join();

  // 1. Every client got a 2xx or a 409.
  std::map<std::string, const Sent*> by_target;
  int n2xx = 0, n409 = 0;
  for (const auto& v : sent)
    for (const auto& s : v) {
      by_target[s.target] = &s;
      CAPTURE(s.target);
      CAPTURE(s.gen);
      INFO(describe(s.result));
      REQUIRE(s.result.ok());
      int code = s.result.response.status;
      CHECK((is_2xx(s.result) || code == 409));
      if (is_2xx(s.result)) {
        ++n2xx;
        auto fg = s.result.response.header("Fencing-Generation");
        REQUIRE_FALSE(fg.empty());
        CHECK(std::stoll(fg) >= s.gen);
      } else if (code == 409) {
        ++n409;
        json j = body_json(s.result);
        REQUIRE(j.contains("current_generation"));
        CHECK(j["presented_generation"] == s.gen);
        CHECK(j["current_generation"].get<std::int64_t>() > s.gen);
      }
    }
  INFO("forwarded: ", n2xx, ", rejected stale: ", n409);
  CHECK(n2xx >= 20);  // the property is only meaningful with many forwarded writes
  CHECK(n409 >= 1);

  // 2. The upstream saw exactly the 2xx writes, each once, with the token the client sent.
  auto reqs = up.requests();
  std::set<std::string> seen;
  for (const auto& r : reqs) {
    CAPTURE(r.target);
    CHECK(seen.insert(r.target).second);  // no duplicates
    auto it = by_target.find(r.target);
    REQUIRE(it != by_target.end());
    CHECK(is_2xx(it->second->result));  // a 409's write never reaches the upstream
    CHECK(r.fencing_token() == it->second->gen);
    CHECK(r.outcome == Outcome::responded);
  }
  CHECK(int(reqs.size()) == n2xx);
  CHECK(up.parse_errors().empty());

  // 3. Ordered by arrival, generations never decrease.
  std::sort(reqs.begin(), reqs.end(), [](const auto& a, const auto& b) { return a.arrival < b.arrival; });
  int decreases = 0;
  for (std::size_t i = 1; i < reqs.size(); ++i)
    if (*reqs[i - 1].fencing_token() > *reqs[i].fencing_token() && ++decreases <= 5) {
      INFO("previous: ", show(reqs[i - 1], t0), "\nthis:     ", show(reqs[i], t0));
      CHECK_MESSAGE(false, "the generation decreased in upstream arrival order");
    }
  CHECK(decreases == 0);
  // 4. A lower generation's exchange is over before a higher generation's starts.
  int overlaps = 0;
  for (const auto& a : reqs)
    for (const auto& b : reqs)
      if (*a.fencing_token() < *b.fencing_token() && !(a.completion <= b.arrival)) {
        if (++overlaps <= 5) {
          INFO("lower:  ", show(a, t0), "\nhigher: ", show(b, t0));
          CHECK_MESSAGE(false, "a lower generation's upstream exchange overlaps a higher one's");
        }
      }
  CHECK(overlaps == 0);
}

TEST_CASE("ordering: drain: a newer generation waits for the in-flight older write; older arrivals get 409 at once") {
  RecordingUpstream up([](const RecordedRequest& r) {
    return r.fencing_token() == 1 ? UpstreamAction::delayed(1000) : UpstreamAction{};
  });
  ProxySpec spec;
  spec.upstream = up.url();
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);

  auto old_write = std::async(std::launch::async, [&] { return timed_request(px.port(), "POST", "/gen1", token(1)); });
  REQUIRE(up.wait_for_count(1, 10s));
  auto new_write = std::async(std::launch::async, [&] { return timed_request(px.port(), "POST", "/gen2", token(2)); });
  std::this_thread::sleep_for(150ms);  // let gen 2 be admitted (its advance committed) and start waiting
  auto late = timed_request(px.port(), "POST", "/gen1-late", token(1));
  auto o = old_write.get();
  auto n = new_write.get();
  INFO("gen1: ", describe(o.result), "\ngen2: ", describe(n.result), "\nlate gen1: ", describe(late.result));

  CHECK(is_2xx(o.result));  // the older write that was let through completes normally
  CHECK(is_2xx(n.result));
  check_problem(late.result, 409, "default", 1, 2);
  CHECK(late.elapsed < 700ms);  // at once, not after the 1 s in-flight write

  auto reqs = up.requests();
  REQUIRE(reqs.size() == 2);
  CHECK(reqs[0].target == "/gen1");
  CHECK(reqs[1].target == "/gen2");
  CHECK(reqs[0].outcome == Outcome::responded);
  CHECK(reqs[0].completion <= reqs[1].arrival);
  CHECK(ms_between(reqs[0].arrival, reqs[1].arrival) >= 900);
}

TEST_CASE("ordering: drain timeout: the hung older exchange is aborted with 504, then the newer write goes") {
  RecordingUpstream up([](const RecordedRequest& r) {
    return r.fencing_token() == 1 ? UpstreamAction::hang() : UpstreamAction{};
  });
  ProxySpec spec;
  spec.upstream = up.url();
  spec.args = {"--drain-timeout-ms", "800"};
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);

  auto old_write = std::async(std::launch::async, [&] { return timed_request(px.port(), "POST", "/gen1", token(1)); });
  REQUIRE(up.wait_for_count(1, 10s));
  auto new_write = std::async(std::launch::async, [&] { return timed_request(px.port(), "POST", "/gen2", token(2)); });
  std::this_thread::sleep_for(150ms);
  auto late = timed_request(px.port(), "POST", "/gen1-late", token(1));
  auto n = new_write.get();
  auto o = old_write.get();
  INFO("gen1: ", describe(o.result), "\ngen2: ", describe(n.result), "\nlate gen1: ", describe(late.result));

  check_problem(late.result, 409, "default", 1, 2);
  CHECK(late.elapsed < 600ms);
  CHECK(is_2xx(n.result));
  CHECK(n.elapsed >= 600ms);  // it waited for the drain timeout (800 ms, less the test's own latency)
  CHECK(n.elapsed < 8s);
  REQUIRE(o.result.ok());
  check_problem(o.result, 504, std::nullopt, std::nullopt, std::nullopt, /*full_fence_members=*/false);

  REQUIRE(up.wait_for_outcome(0, 5s));
  auto reqs = up.requests();
  REQUIRE(reqs.size() == 2);
  CHECK(reqs[0].target == "/gen1");
  CHECK(reqs[0].outcome == Outcome::aborted_by_peer);
  CHECK(reqs[1].target == "/gen2");
  CHECK(ms_between(reqs[0].arrival, reqs[1].arrival) >= 600);
  // The abort is seen by the upstream's own thread, so allow it a little scheduling slack.
  CHECK(ms_between(reqs[0].completion, reqs[1].arrival) >= -100);
}

// The upstream timeout answers the older write's client (504), but the upstream still has the
// whole request and may apply it: a newer generation must wait until it answers (here after
// 1.5 s), not go at the timeout and be applied before the older write.
TEST_CASE("ordering: an upstream timeout does not let a newer generation past the older write still at the upstream") {
  RecordingUpstream up([](const RecordedRequest& r) {
    return r.fencing_token() == 1 ? UpstreamAction::delayed(1500) : UpstreamAction{};
  });
  ProxySpec spec;
  spec.upstream = up.url();
  spec.args = {"--upstream-timeout-ms", "500", "--drain-timeout-ms", "10000"};
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  FG_ADMIN_PORT(admin, px);

  auto old_write = std::async(std::launch::async, [&] { return timed_request(px.port(), "POST", "/gen1", token(1)); });
  REQUIRE(up.wait_for_count(1, 10s));
  auto o = old_write.get();
  INFO("gen1: ", describe(o.result));
  REQUIRE(o.result.ok());
  check_problem(o.result, 504, std::nullopt, std::nullopt, std::nullopt, /*full_fence_members=*/false);
  CHECK(o.elapsed < 1200ms);  // the client is answered at the timeout, not when the upstream is done

  // A new leader's barrier and write both wait for the older write the upstream is working on.
  auto barrier = std::async(std::launch::async, [&] {
    return timed_request(admin, "POST", "/v1/resources/default/fence", token(2));
  });
  auto n = timed_request(px.port(), "POST", "/gen2", token(2));
  auto b = barrier.get();
  INFO("gen2: ", describe(n.result), "\nbarrier: ", describe(b.result));
  CHECK(is_2xx(n.result));
  CHECK(is_2xx(b.result));
  auto reqs = up.requests();
  REQUIRE(reqs.size() == 2);
  CHECK(reqs[0].target == "/gen1");
  CHECK(reqs[1].target == "/gen2");
  CHECK(reqs[0].outcome == Outcome::responded);  // the upstream finished it
  CHECK(reqs[0].completion <= reqs[1].arrival);
  CHECK(ms_between(reqs[0].arrival, reqs[1].arrival) >= 1300);
  // Later writes of the same generation no longer wait.
  auto again = timed_request(px.port(), "POST", "/gen2-again", token(2));
  CHECK(is_2xx(again.result));
  CHECK(again.elapsed < 1s);
}

// A graceful stop waits for a write that timed out upstream and is still being worked on there:
// a restarted sidecar must not let the next generation overlap it.
TEST_CASE("ordering: SIGTERM waits for a timed-out write the upstream is still working on") {
  RecordingUpstream up([](const RecordedRequest& r) {
    return r.fencing_token() == 5 ? UpstreamAction::delayed(2500) : UpstreamAction{};
  });
  ProxySpec spec;
  spec.upstream = up.url();
  spec.args = {"--upstream-timeout-ms", "300", "--drain-timeout-ms", "10000"};
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  auto o = timed_request(px.port(), "POST", "/gen5", token(5));
  check_problem(o.result, 504, std::nullopt, std::nullopt, std::nullopt, /*full_fence_members=*/false);
  const auto t0 = Clock::now();
  auto st = px.stop();  // SIGTERM (SIGKILL after 5 s)
  CHECK(st.exited);
  CHECK(st.code == 0);
  CHECK(ms_between(t0, Clock::now()) >= 1500);  // it waited for the upstream (2.5 s from the start)
  FG_START(px);
  REQUIRE(is_2xx(request(px.port(), "POST", "/gen6", token(6))));
  auto reqs = up.requests();
  REQUIRE(reqs.size() == 2);
  CHECK(reqs[0].outcome == Outcome::responded);
  CHECK(reqs[0].completion <= reqs[1].arrival);
}

// An upstream that never answers a timed-out write holds the fence for drain_timeout_ms at most:
// then the newer generation goes (the documented limit for upstreams slower than the drain).
TEST_CASE("ordering: a timed-out write the upstream never answers holds a newer generation only up to the drain timeout") {
  RecordingUpstream up([](const RecordedRequest& r) {
    return r.fencing_token() == 1 ? UpstreamAction::hang() : UpstreamAction{};
  });
  ProxySpec spec;
  spec.upstream = up.url();
  spec.args = {"--upstream-timeout-ms", "300", "--drain-timeout-ms", "800"};
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);

  auto o = timed_request(px.port(), "POST", "/gen1", token(1));
  check_problem(o.result, 504, std::nullopt, std::nullopt, std::nullopt, /*full_fence_members=*/false);
  auto n = timed_request(px.port(), "POST", "/gen2", token(2));
  INFO("gen1: ", describe(o.result), "\ngen2: ", describe(n.result));
  CHECK(is_2xx(n.result));
  CHECK(n.elapsed >= 300ms);  // it waited for the older write...
  CHECK(n.elapsed < 3s);      // ...only up to the drain timeout
  REQUIRE(up.wait_for_outcome(0, 5s));
  auto reqs = up.requests();
  REQUIRE(reqs.size() == 2);
  CHECK(reqs[0].outcome == Outcome::aborted_by_peer);
  CHECK(ms_between(reqs[0].completion, reqs[1].arrival) >= -100);
}

// The older write's client goes while the upstream still works on it and says so with 102s:
// the proxy cannot pass them on, but the write is still in flight upstream, so a newer
// generation waits until the upstream is done with it. (A streamed answer: response_framing_test.)
TEST_CASE("ordering: an older write whose client left is still waited for while the upstream works on it") {
  RecordingUpstream up([](const RecordedRequest& r) {
    UpstreamAction a = r.fencing_token() == 1 ? UpstreamAction::delayed(1500) : UpstreamAction{};
    if (r.fencing_token() == 1) {
      a.interim = "HTTP/1.1 102 Processing\r\n\r\n";
      a.interim_every_ms = 200;
    }
    return a;
  });
  ProxySpec spec;
  spec.upstream = up.url();
  spec.args = {"--drain-timeout-ms", "10000"};
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  {
    HttpClient old_client;
    REQUIRE(old_client.connect(px.port()));
    REQUIRE(old_client.send("POST /gen1 HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Token: 1\r\nContent-Length: 1\r\n\r\nx"));
    REQUIRE(up.wait_for_count(1, 10s));
    std::this_thread::sleep_for(300ms);
    old_client.close();  // gone, mid-exchange
  }
  std::this_thread::sleep_for(300ms);  // the proxy's next 102 to it fails
  auto n = timed_request(px.port(), "POST", "/gen2", token(2));
  INFO("gen2: ", describe(n.result));
  CHECK(is_2xx(n.result));
  auto reqs = up.requests();
  REQUIRE(reqs.size() == 2);
  CHECK(reqs[1].target == "/gen2");
  CHECK(reqs[0].completion <= reqs[1].arrival);
  CHECK(ms_between(reqs[0].arrival, reqs[1].arrival) >= 1300);
}

TEST_CASE("ordering: drain timeout: an older write stalled on its own client does not hold the newer one past it") {
  RecordingUpstream up;
  ProxySpec spec;
  spec.upstream = up.url();
  spec.args = {"--drain-timeout-ms", "500", "--body-timeout-ms", "8000"};
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  // Generation 1's client sends its head and part of its body, then stalls (a paused process).
  HttpClient old_client;
  REQUIRE(old_client.connect(px.port()));
  REQUIRE(old_client.send("POST /gen1 HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Token: 1\r\nContent-Length: 100\r\n\r\n" +
                          std::string(10, 'x')));
  std::this_thread::sleep_for(300ms);  // forwarded: head and the 10 bytes are upstream
  const auto t0 = Clock::now();
  auto n = timed_request(px.port(), "POST", "/gen2", token(2));
  INFO("gen2: ", describe(n.result));
  CHECK(is_2xx(n.result));
  // The drain timeout bounds the wait, not the stalled client's body timeout (8 s).
  CHECK(n.elapsed < 3s);
  auto o = old_client.read_response(3s);
  INFO("gen1: ", describe(o));
  REQUIRE(o.ok());
  CHECK(o.response.status == 504);  // an aborted exchange, not a 408 after the body timeout
  CHECK(ms_between(t0, Clock::now()) < 4000);
}

// A write that waited for its generation's durable commit reads the upstream's answer both
// through the reactor and by a poll at every other request's start on its worker (one worker
// here, with load on another resource, so both paths run). However that answer ends, the client
// gets the right response and the load is not disturbed.
TEST_CASE("ordering: under load on another resource, a new generation's write ends right: late answer, timeout, drain abort") {
  RecordingUpstream up([](const RecordedRequest& r) {
    if (r.target == "/adv/slow") return UpstreamAction::delayed(300);
    if (r.target.rfind("/adv/hang", 0) == 0) return UpstreamAction::hang();
    return UpstreamAction{};
  });
  ProxySpec spec;
  spec.threads = 1;
  spec.config = config_with_routes({route("/", up.url(), "load"), route("/adv/", up.url(), "adv")});
  (*spec.config)["upstream_timeout_ms"] = 1500;
  (*spec.config)["drain_timeout_ms"] = 300;
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  REQUIRE(is_2xx(request(px.port(), "POST", "/load", token(1))));

  std::atomic<bool> stop{false};
  std::atomic<int> load_ok{0}, load_bad{0};
  std::vector<std::thread> load;
  for (int i = 0; i < 4; ++i)
    load.emplace_back([&] {
      while (!stop.load()) (is_2xx(request(px.port(), "POST", "/load", token(1))) ? load_ok : load_bad)++;
    });
  auto wait_target = [&](const std::string& target) {
    for (int i = 0; i < 500; ++i) {
      for (const auto& r : up.requests())
        if (r.target == target) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  };

  // Answered late: the client gets the upstream's answer.
  auto slow = timed_request(px.port(), "POST", "/adv/slow", token(1));
  CHECK(is_2xx(slow.result));
  CHECK(slow.elapsed >= 250ms);
  // Never answered: 504 after the upstream timeout, not sooner and not never.
  auto hung = timed_request(px.port(), "POST", "/adv/hang", token(2));
  check_problem(hung.result, 504, std::nullopt, std::nullopt, std::nullopt, /*full_fence_members=*/false);
  CHECK(hung.elapsed >= 1300ms);
  CHECK(hung.elapsed < 5s);
  // Aborted by a newer generation's drain timeout while waiting for its answer: 504, and the
  // newer write goes through after the drain.
  auto aborted = std::async(std::launch::async, [&] { return timed_request(px.port(), "POST", "/adv/hang3", token(3)); });
  REQUIRE(wait_target("/adv/hang3"));
  auto newer = timed_request(px.port(), "POST", "/adv/after", token(4));
  auto a = aborted.get();
  INFO("gen3: ", describe(a.result), "\ngen4: ", describe(newer.result));
  check_problem(a.result, 504, std::nullopt, std::nullopt, std::nullopt, false);
  CHECK(a.elapsed < 1300ms);  // the drain's abort, not the upstream timeout
  CHECK(is_2xx(newer.result));
  CHECK(newer.elapsed >= 250ms);

  stop = true;
  for (auto& t : load) t.join();
  CHECK(load_bad.load() == 0);
  CHECK(load_ok.load() > 20);
  // The upstream saw generation 4 only after the generation-3 exchange was over.
  Clock::time_point g3_end{}, g4_arrival{};
  for (const auto& r : up.requests()) {
    if (r.target == "/adv/hang3") g3_end = r.completion;
    if (r.target == "/adv/after") g4_arrival = r.arrival;
  }
  CHECK(ms_between(g3_end, g4_arrival) >= -100);  // the abort is seen on the upstream's own thread
}

}  // TEST_SUITE
