// One writer for an audit row: `fencegate audit --json` and the admin API's GET /v1/audit give
// the same object for the same row, field for field, also for strings that need escaping.
#include <sstream>

#include "tests/integration/ops_harness.h"

using namespace fencegate::testing;

TEST_SUITE("audit_json") {

TEST_CASE("audit json: `fencegate audit --json` lines equal the admin API's /v1/audit rows") {
  RecordingUpstream up;
  ProxySpec spec;
  spec.config = config_with_routes({route("/", up.url(), "ledger", "enforce")});
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  FG_ADMIN_PORT(admin, px);

  HttpClient c;
  REQUIRE(c.connect(px.port()));
  REQUIRE(is_2xx(c.request("POST", "/adv", token(5))));
  // A leader and User-Agent with a quote, a backslash and UTF-8; a target with a percent-escape.
  CHECK(c.request("POST", "/stale?q=%22", token(4, {{"Fencing-Leader", "zo\"mb\\ie-\xc3\xa9"}, {"User-Agent", "ua \xe2\x82\xac"}}))
            .code() == 409);
  CHECK(c.request("POST", "/missing").code() == 428);

  json rows;
  REQUIRE(eventually([&] {
    rows = admin_json(admin, "/v1/audit")["rows"];
    return rows.size() == 2;
  }));
  auto r = run_command({kFencegate, "audit", "--db", px.db(), "--json"}, 30s);
  INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
  CHECK(r.code() == 0);
  std::vector<std::string> lines;
  std::istringstream in(r.out);
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) lines.push_back(l);
  REQUIRE(lines.size() == rows.size());
  for (std::size_t i = 0; i < lines.size(); ++i) {
    CAPTURE(lines[i]);
    CHECK(json::parse(lines[i]) == rows[i]);
  }
  CHECK(rows[1]["leader"] == "zo\"mb\\ie-\xc3\xa9");
  CHECK(rows[1]["user_agent"] == "ua \xe2\x82\xac");
}

}  // TEST_SUITE
