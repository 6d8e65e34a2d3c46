// Live reload against the real binary: POST /v1/config/reload and SIGHUP re-read the config file;
// a bad config is rejected whole (422, errors listed) and the old one keeps working; the
// observe -> enforce switch under concurrent load loses no request and never both forwards and
// rejects one.
#include <atomic>
#include <future>
#include <map>
#include <set>
#include <thread>

#include "tests/integration/ops_harness.h"

using namespace fencegate::testing;

namespace {

ProxySpec observe_spec(const RecordingUpstream& up) {
  ProxySpec s;
  s.config = config_with_routes({route("/", up.url(), "ledger", "observe")});
  return s;
}

void set_mode(const Proxy& px, const std::string& mode) {
  json c = read_config(px);
  c["routes"][0]["mode"] = mode;
  write_config(px, c);
}

ReadResult reload(std::uint16_t admin) { return request(admin, "POST", "/v1/config/reload", {}, {}, 30s); }

std::string errors_text(const ReadResult& r) {
  json j = body_json(r);
  return j.contains("errors") ? j["errors"].dump() : std::string("<no errors member>");
}

}  // namespace

TEST_SUITE("reload") {
  TEST_CASE("reload: POST /v1/config/reload switches observe to enforce for new requests") {
    RecordingUpstream up;
    Proxy px(observe_spec(up));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);

    auto before = request(px.port(), "POST", "/before");
    INFO(describe(before));
    CHECK(is_2xx(before));
    CHECK(before.response.header("Fencing-Observe") == "would_reject_missing");

    set_mode(px, "enforce");
    auto r = reload(admin);
    INFO(describe(r));
    REQUIRE(r.code() == 200);

    check_problem(request(px.port(), "POST", "/after"), 428, "ledger");
    CHECK(is_2xx(request(px.port(), "POST", "/after-token", token(1))));
    CHECK(admin_json(admin, "/v1/resources/ledger")["mode"] == "enforce");
    for (const auto& rec : up.requests()) CHECK(rec.target != "/after");
    auto ss = parse_prometheus(metrics_text(admin));
    CHECK(sample(ss, "fencegate_config_reloads_total", {{"result", "ok"}}) == std::optional<double>(1));
  }

// The old leader's write, forwarded under observe mode and still at the upstream when the route
// turns to enforce, is drained like an older enforce write: the new leader's fence barrier and
// write wait for it, so the two exchanges never overlap at the upstream.
  TEST_CASE("reload: writes still in flight from observe mode are drained before the first enforce write or fence") {
    RecordingUpstream up([](const RecordedRequest& r) {
      return r.target == "/slow" ? UpstreamAction::delayed(1200) : UpstreamAction{};
    });
    Proxy px(observe_spec(up));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);
    REQUIRE(is_2xx(request(px.port(), "POST", "/first", token(5))));

    for (bool barrier : {false, true}) {
      CAPTURE(barrier);
      const std::int64_t next = barrier ? 7 : 6;
      if (barrier) {
        set_mode(px, "observe");
        REQUIRE(reload(admin).code() == 200);
      }
      const std::size_t before = up.requests().size();
      ReadResult slow;
      std::thread old_leader([&] { slow = request(px.port(), "POST", "/slow", token(next - 1), "x", 15s); });
      REQUIRE(up.wait_for_count(before + 1, 5s));  // the old leader's write is at the upstream
      set_mode(px, "enforce");
      REQUIRE(reload(admin).code() == 200);
      const auto t0 = Clock::now();
      if (barrier) {
        auto f = request(admin, "POST", "/v1/resources/ledger/fence", token(next), {}, 15s);
        INFO(describe(f));
        CHECK(f.code() == 200);
        CHECK(Clock::now() - t0 > 500ms);  // it waited for the write in flight
      }
      auto w = request(px.port(), "POST", "/new", token(next), "y", 15s);
      old_leader.join();
      INFO(describe(slow), " / ", describe(w));
      CHECK(is_2xx(slow));  // started under observe: forwarded, and not cut short
      CHECK(is_2xx(w));
      auto reqs = up.requests();
      const RecordedRequest* old_rec = nullptr;
      const RecordedRequest* new_rec = nullptr;
      for (const auto& r : reqs) {
        if (r.index < before) continue;
        if (r.target == "/slow") old_rec = &r;
        if (r.target == "/new") new_rec = &r;
      }
      REQUIRE(old_rec != nullptr);
      REQUIRE(new_rec != nullptr);
      REQUIRE(old_rec->outcome != Outcome::pending);
      CHECK(new_rec->arrival >= old_rec->completion);  // no overlap at the upstream
    }
  }

  TEST_CASE("reload: a new config applies to the next request on an already open keep-alive connection") {
    RecordingUpstream up;
    Proxy px(observe_spec(up));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);

    HttpClient c;
    REQUIRE(c.connect(px.port()));
    auto first = c.request("POST", "/first");
    CHECK(is_2xx(first));
    CHECK(first.response.header("Fencing-Observe") == "would_reject_missing");

    set_mode(px, "enforce");
    REQUIRE(reload(admin).code() == 200);

  // Same connection, sent after the reload answered: a new request, so the new config applies.
    auto second = c.request("POST", "/second-on-old-connection");
    INFO("second request on the kept-alive connection: ", describe(second));
    CHECK(second.code() == 428);
    for (const auto& rec : up.requests()) CHECK(rec.target != "/second-on-old-connection");

  // The limits too, for the next request's head: it is read under the new max_header_bytes.
    json cfg = read_config(px);
    cfg["max_header_bytes"] = 2048;
    write_config(px, cfg);
    REQUIRE(reload(admin).code() == 200);
    auto big = c.request("POST", "/big-head", token(1, {{"X-Pad", std::string(3000, 'p')}}));
    INFO(describe(big));
    CHECK(big.code() == 431);
  }

  TEST_CASE("reload: a bad config is rejected whole with 422 and its errors; the old config keeps working") {
    RecordingUpstream up;
    ProxySpec s;
    s.config = config_with_routes({route("/", up.url(), "ledger", "enforce")});
    Proxy px(s);
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);
    const json good = read_config(px);

    auto still_enforcing = [&] {
      check_problem(request(px.port(), "POST", "/no-token"), 428, "ledger");
      CHECK(is_2xx(request(px.port(), "POST", "/with-token", token(3))));
    };
    still_enforcing();

    {  // unknown key
      json c = good;
      c["bogus_key"] = 1;
      write_config(px, c);
      auto r = reload(admin);
      INFO(describe(r));
      CHECK(r.code() == 422);
      CHECK(r.response.header("Content-Type").rfind("application/problem+json", 0) == 0);
      CHECK(errors_text(r).find("bogus_key") != std::string::npos);
      still_enforcing();
    }
    {  // bad mode, next to a valid change (route 0 to observe) that must not be applied either
      json c = good;
      c["routes"][0]["mode"] = "observe";
      json r1 = route("/x/", up.url(), "x", "enforse");
      c["routes"].push_back(r1);
      write_config(px, c);
      auto r = reload(admin);
      INFO(describe(r));
      CHECK(r.code() == 422);
      std::string errs = errors_text(r);
      CHECK(errs.find("routes[1].mode") != std::string::npos);
      CHECK(errs.find("enforse") != std::string::npos);
      still_enforcing();
      CHECK(admin_json(admin, "/v1/resources/ledger")["mode"] == "enforce");
    }
    {  // not JSON at all
      write_file(config_path(px), "{\"routes\": [");
      auto r = reload(admin);
      INFO(describe(r));
      CHECK(r.code() == 422);
      CHECK(body_json(r)["errors"].size() >= 1);
      still_enforcing();
    }
    {  // a change that needs a restart
      json c = good;
      c["listen"] = "127.0.0.1:" + std::to_string(free_port());
      write_config(px, c);
      auto r = reload(admin);
      INFO(describe(r));
      CHECK(r.code() == 422);
      CHECK(errors_text(r).find("listen") != std::string::npos);
      still_enforcing();
    }
    CHECK(px.log(256 * 1024).find("config reload rejected") != std::string::npos);
    auto ss = parse_prometheus(metrics_text(admin));
    CHECK(sample(ss, "fencegate_config_reloads_total", {{"result", "rejected"}}) == std::optional<double>(4));
    CHECK(sample(ss, "fencegate_config_reloads_total", {{"result", "ok"}}) == std::optional<double>(0));

  // Fixing the file makes the next reload succeed.
    write_config(px, good);
    CHECK(reload(admin).code() == 200);
    CHECK(px.running());
  }

// Finding 2 of the hardening review: an observe write whose client trickles its body makes
// progress, so none of its own timeouts ends it; after a switch to enforce, the first enforce
// write waits for it at most upstream_timeout_ms, then the write is aborted (before the fix it
// held the switch until its client finished: here 100 s).
  TEST_CASE("reload: an observe write trickling its body holds the switch to enforce at most upstream_timeout_ms") {
    RecordingUpstream up;
    ProxySpec spec = observe_spec(up);
    (*spec.config)["upstream_timeout_ms"] = 1500;
    Proxy px(spec);
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);
    REQUIRE(is_2xx(request(px.port(), "POST", "/seed", token(1))));

    HttpClient trickler;
    REQUIRE(trickler.connect(px.port()));
    REQUIRE(trickler.send(build_request("POST", "/trickle", {{"Fencing-Token", "1"}, {"Content-Length", "200"}})));
    std::atomic<bool> stop{false};
    std::thread feed([&] {
      for (int i = 0; i < 200 && !stop.load(); ++i) {
        if (!trickler.send("x")) return;
        std::this_thread::sleep_for(500ms);  // progress every 0.5 s: under any timeout of its own
      }
    });
    std::this_thread::sleep_for(1000ms);  // the observe write is in flight

    set_mode(px, "enforce");
    REQUIRE(reload(admin).code() == 200);
    const auto t0 = std::chrono::steady_clock::now();
    auto r = request(px.port(), "POST", "/after-switch", token(1), {}, 30s);
    const auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    INFO(describe(r), " after ", ms, " ms");
    CHECK(is_2xx(r));
    CHECK(ms < 10000);  // the cap is 1.5 s; generous for sanitizer builds, far under the trickle's 100 s
    stop = true;
    feed.join();
    trickler.close();
  }

  TEST_CASE("reload: SIGHUP re-reads the config like POST does") {
    RecordingUpstream up;
    Proxy px(observe_spec(up));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);
    REQUIRE(is_2xx(request(px.port(), "POST", "/seed", token(1))));
    CHECK(admin_json(admin, "/v1/resources/ledger")["mode"] == "observe");

    set_mode(px, "enforce");
    px.process().kill(SIGHUP);
    bool switched = eventually([&] { return admin_json(admin, "/v1/resources/ledger")["mode"] == "enforce"; }, 15s);
    REQUIRE(switched);
    check_problem(request(px.port(), "POST", "/after-hup"), 428, "ledger");

  // A bad config on SIGHUP: logged, rejected, old config stays, process stays up.
    json c = read_config(px);
    c["routes"][0]["mode"] = "sometimes";
    write_config(px, c);
    px.process().kill(SIGHUP);
    bool logged =
        eventually([&] { return px.log(256 * 1024).find("config reload rejected") != std::string::npos; }, 15s);
    CHECK(logged);
    CHECK(px.running());
    check_problem(request(px.port(), "POST", "/after-bad-hup"), 428, "ledger");
    CHECK(admin_json(admin, "/v1/resources/ledger")["mode"] == "enforce");
  }

  TEST_CASE("reload: observe -> enforce under concurrent load: no request lost, none both forwarded and rejected") {
  // Some exchanges take a while so that requests are in flight at the moment of the switch.
    RecordingUpstream up([](const RecordedRequest& r) {
      return r.target.find("/slow") != std::string::npos ? UpstreamAction::delayed(40) : UpstreamAction::respond();
    });
    Proxy px(observe_spec(up));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);
    REQUIRE(is_2xx(request(px.port(), "POST", "/seed", token(1))));
    const std::size_t seeded = up.count();

    struct Sent {
      std::string target;
      bool missing = false;
      Clock::time_point start;
      ReadResult result;
    };
    constexpr int kThreads = 6;
    std::vector<std::vector<Sent>> sent(kThreads);
    std::atomic<bool> stop{false};
    std::atomic<int> connect_failures{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t)
      ts.emplace_back([&, t] {
        HttpClient c;
        for (int i = 0; !stop.load(); ++i) {
          if (!c.connected() && !c.connect(px.port())) {
            ++connect_failures;
            std::this_thread::sleep_for(10ms);
            continue;
          }
          Sent s;
          s.missing = i % 2 == 0;
          s.target = "/w/" + std::to_string(t) + "/" + std::to_string(i) + (s.missing ? "/missing" : "/token") +
                     (i % 7 == 3 ? "/slow" : "");
          s.start = Clock::now();
          s.result = c.request("POST", s.target, s.missing ? Headers{} : token(1), "x", 30s);
          const bool keep = s.result.ok() && !iequals(s.result.response.header("Connection"), "close");
          sent[t].push_back(std::move(s));
          if (!keep) c.close();
        }
      });

    std::this_thread::sleep_for(1200ms);
    set_mode(px, "enforce");
    auto r = reload(admin);
    const auto switched_at = Clock::now();
    std::this_thread::sleep_for(1200ms);
    stop = true;
    for (auto& t : ts) t.join();
    INFO("reload: ", describe(r));
    REQUIRE(r.code() == 200);

  // Every request got exactly one response, each either forwarded (2xx) or rejected (428).
    std::set<std::string> ok_targets, rejected_targets;
    std::size_t total = 0, missing_before_fwd = 0, missing_after = 0, lost = 0, odd = 0, late_forwarded = 0;
    std::string problems;
    for (const auto& per : sent)
      for (const auto& s : per) {
        ++total;
        if (!s.result.ok()) {
          ++lost;
          if (problems.size() < 2000) problems += s.target + ": " + describe(s.result) + "\n";
          continue;
        }
        int code = s.result.response.status;
        if (code >= 200 && code < 300) {
          ok_targets.insert(s.target);
          if (s.missing && s.start < switched_at) ++missing_before_fwd;
          if (s.missing) CHECK(s.result.response.header("Fencing-Observe") == "would_reject_missing");
        } else if (code == 428 && s.missing) {
          rejected_targets.insert(s.target);
        } else {
          ++odd;
          if (problems.size() < 2000) problems += s.target + ": " + describe(s.result) + "\n";
        }
        if (s.missing && s.start > switched_at) {
          ++missing_after;
          if (code != 428) {
            ++late_forwarded;
            if (problems.size() < 2000) problems += "after the switch: " + s.target + ": " + describe(s.result) + "\n";
          }
        }
      }
    INFO("requests: ", total, ", 2xx: ", ok_targets.size(), ", 428: ", rejected_targets.size(),
         ", upstream: ", up.count() - seeded, "\n", problems);
    CHECK(connect_failures == 0);
    CHECK(lost == 0);
    CHECK(odd == 0);
    CHECK(late_forwarded == 0);
  // Both phases really happened.
    CHECK(missing_before_fwd > 0);
    CHECK(missing_after > 0);
    CHECK(total > 100);

  // The upstream saw exactly the 2xx requests: once each, none that was rejected.
    std::map<std::string, int> at_upstream;
    for (const auto& rec : up.requests())
      if (rec.target != "/seed") ++at_upstream[rec.target];
    std::size_t dup = 0, rejected_but_forwarded = 0, forwarded_without_2xx = 0;
    for (const auto& [target, n] : at_upstream) {
      if (n != 1) ++dup;
      if (rejected_targets.count(target)) ++rejected_but_forwarded;
      if (!ok_targets.count(target)) ++forwarded_without_2xx;
    }
    CHECK(dup == 0);
    CHECK(rejected_but_forwarded == 0);
    CHECK(forwarded_without_2xx == 0);
    CHECK(up.count() - seeded == ok_targets.size());
    for (const auto& t : ok_targets) {
      if (!at_upstream.count(t)) {
        FAIL_CHECK("2xx without reaching the upstream: ", t);
        break;
      }
    }
    CHECK(px.running());
  }

// The fence's own limits follow a reload too (not only the per-request config): a raised
// drain_timeout_ms makes a newer generation wait longer for a slow older write, and a raised
// max_resources admits resources that got 503 before.
  TEST_CASE("reload: drain_timeout_ms and max_resources take effect in the fence") {
    RecordingUpstream up(
        [](const RecordedRequest& r) { return r.fencing_token() == 1 ? UpstreamAction::hang() : UpstreamAction{}; });
    ProxySpec spec;
    spec.config =
        config_with_routes({route("/a/", up.url(), "a"), route("/b/", up.url(), "b"), route("/c/", up.url(), "c")});
    (*spec.config)["max_resources"] = 2;
    (*spec.config)["drain_timeout_ms"] = 300;
    Proxy px(spec);
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);

    REQUIRE(is_2xx(request(px.port(), "POST", "/b/x", token(5))));
    REQUIRE(is_2xx(request(px.port(), "POST", "/c/x", token(5))));
    check_problem(request(px.port(), "POST", "/a/x", token(5)), 503, "a");  // a third resource
  // An operator sees the cap: counted under its own decision, logged at warn; the fence barrier
  // to a new resource is refused and counted the same way.
    REQUIRE(request(admin, "POST", "/v1/resources/a/fence", token(5)).code() == 503);
    {
      auto ss = parse_prometheus(metrics_text(admin));
      CHECK(sample(ss, "fencegate_requests_total", {{"resource", "a"}, {"decision", "too_many_resources"}}) ==
            std::optional<double>(2));
      CHECK(
          sample(ss, "fencegate_requests_total", {{"resource", "b"}, {"decision", "too_many_resources"}}).value_or(0) ==
          0);
      CHECK(px.log().find("the fence holds max_resources resources") != std::string::npos);
    }

    json c = read_config(px);
    c["max_resources"] = 10;
    c["drain_timeout_ms"] = 3000;
    write_config(px, c);
    auto r = reload(admin);
    INFO(describe(r));
    REQUIRE(r.code() == 200);

  // Resource a now fits; its generation-1 write hangs upstream, and generation 2 waits for it up
  // to the new drain timeout (3 s, not 300 ms), then aborts it.
    auto old_write = std::async(std::launch::async, [&] { return timed_request(px.port(), "POST", "/a/1", token(1)); });
    REQUIRE(up.wait_for_count(3, 10s));
    auto n = timed_request(px.port(), "POST", "/a/2", token(2));
    INFO("gen2: ", describe(n.result));
    CHECK(is_2xx(n.result));
    CHECK(n.elapsed >= 2500ms);
    CHECK(n.elapsed < 8s);
    auto o = old_write.get();
    check_problem(o.result, 504, std::nullopt, std::nullopt, std::nullopt, /*full_fence_members=*/false);
  }

}  // TEST_SUITE reload
