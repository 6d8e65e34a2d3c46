// A client's Forwarded value that is not RFC 7239 syntax is dropped before fencegate appends its
// own (issue 32, finding 5: `for="x` swallowed the appended element), and counted.
#include "tests/integration/ops_harness.h"

using namespace fencegate::testing;

TEST_CASE("forwarded: a malformed client Forwarded value is dropped; the upstream sees only ours") {
  RecordingUpstream up;
  ProxySpec s;
  s.upstream = up.url();
  Proxy px(s);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  FG_ADMIN_PORT(admin, px);
  REQUIRE(is_2xx(request(px.port(), "POST", "/a", token(1, {{"Forwarded", "for=\"x"}}))));
  REQUIRE(is_2xx(request(px.port(), "POST", "/b", token(1, {{"Forwarded", "for=10.0.0.2;proto=http"}}))));
  auto reqs = up.requests();
  REQUIRE(reqs.size() == 2);
  CHECK(reqs[0].headers_named("Forwarded") == std::vector<std::string>{"for=127.0.0.1"});
  CHECK(reqs[1].headers_named("Forwarded") == std::vector<std::string>{"for=10.0.0.2;proto=http, for=127.0.0.1"});
  auto ss = parse_prometheus(metrics_text(admin));
  CHECK(sample(ss, "fencegate_forwarded_dropped_total") == 1.0);
}
