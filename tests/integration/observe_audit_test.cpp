// Observe and off modes, and the audit log of decisions (read back from the database with
// Store::open_readonly, which works while the proxy runs).
#include "tests/integration/harness.h"

using namespace fencegate::testing;

namespace {

const fencegate::store::AuditRow* find_row(const std::vector<fencegate::store::AuditRow>& rows,
                                           const std::string& target) {
  for (const auto& r : rows)
    if (r.target == target) return &r;
  return nullptr;
}

}  // namespace

TEST_SUITE("observe_audit") {

TEST_CASE("observe: nothing rejected, would-be rejections marked and audited, generations still advance") {
  RecordingUpstream up;
  ProxySpec spec;
  spec.upstream = up.url();
  spec.args = {"--mode", "observe"};
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);

  auto five = request(px.port(), "POST", "/five", token(5));
  INFO(describe(five));
  REQUIRE(is_2xx(five));
  CHECK_FALSE(five.response.has("Fencing-Observe"));
  CHECK(five.response.header("Fencing-Generation") == "5");

  struct Case {
    std::string target;
    Headers headers;
    std::string decision;
    std::int64_t presented, current;
  };
  std::vector<Case> cases{
      {"/stale", token(3, {{"Fencing-Leader", "old-leader"}}), "would_reject_stale", 3, 5},
      {"/missing", {}, "would_reject_missing", 0, 5},
      {"/malformed", {{"Fencing-Token", "0x5"}}, "would_reject_malformed", 0, 5},
  };
  for (const auto& c : cases) {
    CAPTURE(c.target);
    auto r = request(px.port(), "POST", c.target, c.headers, "body");
    INFO(describe(r));
    CHECK(is_2xx(r));
    CHECK(r.response.header("Fencing-Observe") == c.decision);
    CHECK(r.response.header("Fencing-Generation") == "5");
  }
  auto six = request(px.port(), "PUT", "/six", token(6));
  CHECK(is_2xx(six));
  CHECK(six.response.header("Fencing-Generation") == "6");
  auto stale_again = request(px.port(), "DELETE", "/five-again", token(5));
  CHECK(is_2xx(stale_again));
  CHECK(stale_again.response.header("Fencing-Observe") == "would_reject_stale");
  CHECK(stale_again.response.header("Fencing-Generation") == "6");
  CHECK(up.count() == 6);  // everything was forwarded

  // SIGTERM commits queued (asynchronously batched) observe rows.
  auto st = px.stop();
  CHECK(st.exited);
  CHECK(st.code == 0);
  auto rows = read_audit(px.db());
  INFO("audit:\n", describe(rows));
  cases.push_back({"/five-again", {}, "would_reject_stale", 5, 6});
  for (const auto& c : cases) {
    CAPTURE(c.target);
    auto* row = find_row(rows, c.target);
    REQUIRE(row != nullptr);
    CHECK(row->decision == c.decision);
    CHECK(row->resource == "default");
    CHECK(row->presented_generation == c.presented);
    CHECK(row->current_generation == c.current);
    CHECK(row->mode == "observe");
  }
  CHECK(find_row(rows, "/stale")->leader == "old-leader");
  auto res = read_resources(px.db());
  REQUIRE(res.size() == 1);
  CHECK(res[0].generation == 6);
}

TEST_CASE("observe: a fence holding max_resources resources still forwards writes of new ones") {
  RecordingUpstream up;
  ProxySpec spec;
  json r = route("/t/{t}/", up.url(), "t-{t}");
  r["mode"] = "observe";
  spec.config = config_with_routes({r});
  (*spec.config)["max_resources"] = 2;
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  for (const char* t : {"a", "b", "c", "d"}) {
    auto w = request(px.port(), "POST", std::string("/t/") + t + "/w", token(3));
    INFO(t, ": ", describe(w));
    CHECK(is_2xx(w));  // observe rejects nothing, not even beyond the cap (c, d are not tracked)
  }
  CHECK(up.count() == 4);
}

TEST_CASE("mode off: a plain proxy, nothing checked or marked") {
  RecordingUpstream up;
  ProxySpec spec;
  spec.upstream = up.url();
  spec.args = {"--mode", "off"};
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  CHECK(is_2xx(request(px.port(), "POST", "/a", token(5))));
  for (const auto& h : std::vector<Headers>{token(1), {}, {{"Fencing-Token", "bogus"}}}) {
    auto r = request(px.port(), "POST", "/b", h);
    INFO(describe(r));
    CHECK(is_2xx(r));
    CHECK_FALSE(r.response.has("Fencing-Observe"));
  }
  CHECK(up.count() == 4);
  CHECK(up.requests()[1].fencing_token_raw() == "1");  // token still forwarded unchanged
  px.stop();
  for (const auto& row : read_audit(px.db())) {
    INFO(describe(row));
    CHECK(row.decision.rfind("rejected_", 0) != 0);
    CHECK(row.decision.rfind("would_reject_", 0) != 0);
  }
}

TEST_CASE("audit: each enforce rejection has a durable row by the time the client gets it") {
  RecordingUpstream up;
  ProxySpec spec;
  spec.upstream = up.url();
  spec.args = {"--resource", "orders"};
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);

  HttpClient c;
  REQUIRE(c.connect(px.port()));
  REQUIRE(is_2xx(c.request("POST", "/a", token(5, {{"Fencing-Leader", "node-a"}}))));
  check_problem(c.request("POST", "/b?x=1", token(4, {{"Fencing-Leader", "node-b"}})), 409,
                "orders", 4, 5);
  check_problem(c.request("PUT", "/c", {{"Fencing-Leader", "node-c"}}), 428, "orders", 0, 5);
  check_problem(c.request("DELETE", "/d", {{"Fencing-Token", "-1"}, {"Fencing-Leader", "node-d"}}), 400, "orders", 0,
                5);

  // Read while the proxy still runs: rejections were answered only after their rows were durable.
  auto rows = read_audit(px.db());
  INFO("audit:\n", describe(rows));
  struct Want {
    std::string target, method, decision, leader;
    std::int64_t presented;
  };
  for (const auto& w : std::vector<Want>{{"/b?x=1", "POST", "rejected_stale", "node-b", 4},
                                         {"/c", "PUT", "rejected_missing", "node-c", 0},
                                         {"/d", "DELETE", "rejected_malformed", "node-d", 0}}) {
    CAPTURE(w.target);
    auto* row = find_row(rows, w.target);
    REQUIRE(row != nullptr);
    CHECK(row->decision == w.decision);
    CHECK(row->method == w.method);
    CHECK(row->leader == w.leader);
    CHECK(row->presented_generation == w.presented);
    CHECK(row->current_generation == 5);
    CHECK(row->resource == "orders");
    CHECK(row->mode == "enforce");
    CHECK(row->client.find("127.0.0.1") != std::string::npos);
    CHECK(row->time_ms > 1600000000000);
  }
  CHECK(find_row(rows, "/a") == nullptr);  // a forwarded advance is not a rejection

  // A leader over max_leader_bytes is refused, and its row does not name another leader.
  const std::string long_leader = "node-a" + std::string(300, 'x');
  check_problem(c.request("POST", "/long", token(5, {{"Fencing-Leader", long_leader}})), 400, "orders", 0, 5);
  rows = read_audit(px.db());
  auto* cut = find_row(rows, "/long");
  REQUIRE(cut != nullptr);
  CHECK(cut->decision == "rejected_malformed");
  CHECK(cut->leader.find("(truncated)") != std::string::npos);

  // A target over the row's 2048 bytes is marked as cut too: its query is not silently lost.
  const std::string long_target = "/long-target?" + std::string(3000, 'q') + "&tail=1";
  check_problem(c.request("POST", long_target, token(4)), 409, "orders", 4, 5);
  rows = read_audit(px.db());
  bool marked = false;
  for (const auto& r : rows)
    if (r.target.rfind("/long-target?", 0) == 0) marked = r.target.size() < long_target.size() &&
                                                          r.target.find("...(truncated)") != std::string::npos;
  CHECK(marked);

  auto res = read_resources(px.db());
  REQUIRE(res.size() == 1);
  CHECK(res[0].resource == "orders");
  CHECK(res[0].generation == 5);
  CHECK(res[0].advanced_by == "node-a");
  CHECK(res[0].advanced_at_ms > 1600000000000);
  CHECK(up.count() == 1);
}

TEST_CASE("audit: a flood of stale writes is answered and fully audited (group commit)") {
  RecordingUpstream up;
  ProxySpec spec;
  spec.upstream = up.url();
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  REQUIRE(is_2xx(request(px.port(), "POST", "/adv", token(100))));
  constexpr int kThreads = 8, kEach = 25;
  std::vector<std::thread> ts;
  std::atomic<int> n409{0};
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      HttpClient c;
      if (!c.connect(px.port())) return;
      for (int i = 0; i < kEach; ++i) {
        auto r = c.request("POST", "/flood/" + std::to_string(t) + "/" + std::to_string(i), token(1 + i));
        if (r.code() == 409) ++n409;
      }
    });
  for (auto& t : ts) t.join();
  CHECK(n409 == kThreads * kEach);
  auto rows = read_audit(px.db());
  int stale = 0;
  for (const auto& r : rows) stale += r.decision == "rejected_stale" && r.target.rfind("/flood/", 0) == 0;
  CHECK(stale == kThreads * kEach);
  CHECK(up.count() == 1);
}

}  // TEST_SUITE
