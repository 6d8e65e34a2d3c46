// Enforce mode, seen from outside: which writes reach the upstream, the status codes and
// problem+json bodies of rejections, Fencing-Generation on every fenced response, reads,
// routes with captures, and what the proxy does to headers on the way.
#include <cstdlib>
#include <ctime>

#include "tests/integration/harness.h"

using namespace fencegate::testing;

namespace {

ProxySpec flags_for(const RecordingUpstream& up, std::vector<std::string> args = {}) {
  ProxySpec s;
  s.upstream = up.url();
  s.args = std::move(args);
  return s;
}

// Targets recorded upstream, in order.
std::vector<std::string> targets(const RecordingUpstream& up) {
  std::vector<std::string> t;
  for (const auto& r : up.requests()) t.push_back(r.target);
  return t;
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

TEST_SUITE("enforce") {

TEST_CASE("enforce: advance, equal and stale writes; 409 is problem+json and not forwarded") {
  RecordingUpstream up;
  Proxy px(flags_for(up));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);

  auto first = request(px.port(), "POST", "/orders/1", token(5), "{\"n\":1}");
  INFO("first: ", describe(first));
  REQUIRE(is_2xx(first));
  CHECK(first.response.header("Fencing-Generation") == "5");
  REQUIRE(up.count() == 1);
  CHECK(up.requests()[0].fencing_token_raw() == "5");
  CHECK(up.requests()[0].body == "{\"n\":1}");

  auto stale = request(px.port(), "POST", "/orders/2", token(4));
  check_problem(stale, 409, "default", 4, 5);

  auto equal = request(px.port(), "PUT", "/orders/3", token(5));
  INFO("equal: ", describe(equal));
  CHECK(is_2xx(equal));
  CHECK(equal.response.header("Fencing-Generation") == "5");

  auto higher = request(px.port(), "PATCH", "/orders/4", token(6));
  CHECK(is_2xx(higher));
  CHECK(higher.response.header("Fencing-Generation") == "6");

  auto stale2 = request(px.port(), "DELETE", "/orders/5", token(5));
  check_problem(stale2, 409, "default", 5, 6);
  auto stale3 = request(px.port(), "POST", "/orders/6", token(1));
  check_problem(stale3, 409, "default", 1, 6);

  // A marker write after the rejections: everything the proxy forwarded is in by now.
  REQUIRE(is_2xx(request(px.port(), "POST", "/marker", token(6))));
  auto t = targets(up);
  INFO("upstream saw: ", joined(t));
  CHECK(t == std::vector<std::string>{"/orders/1", "/orders/3", "/orders/4", "/marker"});
  CHECK(up.parse_errors().empty());
}

TEST_CASE("enforce: missing token on each write method is 428, not forwarded") {
  RecordingUpstream up;
  Proxy px(flags_for(up));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  for (const char* m : {"POST", "PUT", "PATCH", "DELETE"}) {
    CAPTURE(m);
    auto r = request(px.port(), m, "/x", {}, "body");
    check_problem(r, 428, "default", 0, 0);
  }
  REQUIRE(is_2xx(request(px.port(), "POST", "/marker", token(3))));
  auto r = request(px.port(), "POST", "/x", {{"Fencing-Leader", "node-a"}});
  check_problem(r, 428, "default", 0, 3);
  CHECK(targets(up) == std::vector<std::string>{"/marker"});
  // fencegate is the origin of its refusals: they carry a Date (RFC 9110 6.6.1), an IMF-fixdate.
  const std::string date = r.response.header("Date");
  CAPTURE(date);
  REQUIRE(date.size() == 29);
  CHECK(date.substr(25) == " GMT");
  CHECK(date[3] == ',');
  std::tm t{};
  CHECK(strptime(date.c_str(), "%a, %d %b %Y %H:%M:%S GMT", &t) != nullptr);
  CHECK(std::abs(static_cast<long>(timegm(&t) - std::time(nullptr))) < 60);
}

TEST_CASE("enforce: malformed tokens are 400, not forwarded; 2^63-1 is valid") {
  RecordingUpstream up;
  Proxy px(flags_for(up));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  const std::vector<std::string> bad{"",     "+5",   "-5",  "05",    "0",   "0x10", "1 2", "5,6",
                                     "5, 6", "abc",  "5.0", "1e3",   "5a",  "00",   "-0",  "9223372036854775808",
                                     "18446744073709551616", "99999999999999999999999"};
  for (const auto& v : bad) {
    CAPTURE(v);
    auto r = request(px.port(), "POST", "/bad", {{"Fencing-Token", v}});
    check_problem(r, 400, "default", 0, 0);
  }
  SUBCASE("two Fencing-Token headers, even equal ones") {
    auto r = request(px.port(), "POST", "/bad", {{"Fencing-Token", "5"}, {"Fencing-Token", "5"}});
    check_problem(r, 400, "default", 0, 0);
    auto r2 = request(px.port(), "POST", "/bad", {{"Fencing-Token", "5"}, {"fencing-token", "6"}});
    check_problem(r2, 400, "default", 0, 0);
  }
  CHECK(up.count() == 0);
  auto max = request(px.port(), "POST", "/max", {{"Fencing-Token", "9223372036854775807"}});
  INFO("max: ", describe(max));
  CHECK(is_2xx(max));
  CHECK(max.response.header("Fencing-Generation") == "9223372036854775807");
  CHECK(targets(up) == std::vector<std::string>{"/max"});
}

TEST_CASE("enforce: reads pass without checks; HEAD gets no body") {
  RecordingUpstream up;
  Proxy px(flags_for(up));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  REQUIRE(is_2xx(request(px.port(), "POST", "/w", token(9))));
  auto get = request(px.port(), "GET", "/r1");
  INFO(describe(get));
  CHECK(is_2xx(get));
  CHECK(get.response.body.find("/r1") != std::string::npos);
  CHECK(is_2xx(request(px.port(), "GET", "/r2", token(3))));                  // stale token on a read: no check
  CHECK(is_2xx(request(px.port(), "GET", "/r3", {{"Fencing-Token", "x"}})));  // malformed on a read: no check
  CHECK(is_2xx(request(px.port(), "OPTIONS", "/r4")));
  auto head = request(px.port(), "HEAD", "/r5");
  INFO(describe(head));
  CHECK(is_2xx(head));
  CHECK(head.response.body.empty());
  CHECK(targets(up) == std::vector<std::string>{"/w", "/r1", "/r2", "/r3", "/r4", "/r5"});
}

TEST_CASE("enforce: route with fence_reads fences GET; write_methods is honoured") {
  RecordingUpstream up;
  json r1 = route("/fenced/", up.url(), "fenced");
  r1["fence_reads"] = true;
  json r2 = route("/posts-only/", up.url(), "posts");
  r2["write_methods"] = json::array({"POST"});
  ProxySpec spec;
  spec.config = config_with_routes({r1, r2, route("/", up.url(), "root")});
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);

  check_problem(request(px.port(), "GET", "/fenced/a"), 428, "fenced", 0, 0);
  auto g3 = request(px.port(), "GET", "/fenced/b", token(3));
  CHECK(is_2xx(g3));
  CHECK(g3.response.header("Fencing-Generation") == "3");
  check_problem(request(px.port(), "GET", "/fenced/c", token(2)), 409, "fenced", 2, 3);
  {
    // fencegate's own answers to HEAD carry the headers of the full answer and no body: on a
    // keep-alive connection a body would be read as the start of the next response.
    HttpClient c;
    REQUIRE(c.connect(px.port()));
    REQUIRE(c.send("HEAD /fenced/h HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
                   "HEAD /fenced/h2 HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Token: 2\r\n\r\n"
                   "GET /fenced/g HTTP/1.1\r\nHost: 127.0.0.1\r\nFencing-Token: 3\r\n\r\n"));
    auto h1 = c.read_response(10s, /*expect_no_body=*/true);
    INFO(describe(h1));
    REQUIRE(h1.ok());
    CHECK(h1.response.status == 428);
    CHECK(std::stoi(h1.response.header("Content-Length")) > 0);
    CHECK(h1.response.header("Fencing-Generation") == "3");
    auto h2 = c.read_response(10s, true);
    INFO(describe(h2));
    REQUIRE(h2.ok());
    CHECK(h2.response.status == 409);  // a stale token on a fenced read
    auto g = c.read_response(10s);
    INFO(describe(g));
    REQUIRE(g.ok());
    CHECK(g.response.status == 200);
    CHECK(c.pending().empty());
  }

  CHECK(is_2xx(request(px.port(), "PUT", "/posts-only/d")));     // PUT is not a write here
  CHECK(is_2xx(request(px.port(), "DELETE", "/posts-only/e")));
  check_problem(request(px.port(), "POST", "/posts-only/f"), 428, "posts", 0, 0);
  CHECK(is_2xx(request(px.port(), "GET", "/plain")));            // root route: reads are not fenced
  check_problem(request(px.port(), "DELETE", "/plain"), 428, "root", 0, 0);
  CHECK(targets(up) == std::vector<std::string>{"/fenced/b", "/fenced/g", "/posts-only/d", "/posts-only/e", "/plain"});
}

TEST_CASE("enforce: routes with captures give each tenant its own generation; longest prefix wins") {
  RecordingUpstream tenants_up, root_up;
  ProxySpec spec;
  spec.config = config_with_routes({route("/", root_up.url(), "root"),
                                    route("/tenants/{tenant}/", tenants_up.url(), "tenant-{tenant}")});
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);

  auto a10 = request(px.port(), "POST", "/tenants/a/x", token(10));
  INFO(describe(a10));
  REQUIRE(is_2xx(a10));
  CHECK(a10.response.header("Fencing-Generation") == "10");
  auto b1 = request(px.port(), "POST", "/tenants/b/x", token(1));
  CHECK(is_2xx(b1));
  CHECK(b1.response.header("Fencing-Generation") == "1");
  check_problem(request(px.port(), "POST", "/tenants/a/y", token(9)), 409, "tenant-a", 9, 10);
  CHECK(is_2xx(request(px.port(), "POST", "/tenants/b/y", token(1))));
  check_problem(request(px.port(), "POST", "/tenants/b/z", {{"Fencing-Token", "01"}}), 400, "tenant-b", 0, 1);
  // The root route's resource is separate from every tenant's.
  CHECK(is_2xx(request(px.port(), "POST", "/elsewhere", token(2))));
  check_problem(request(px.port(), "POST", "/elsewhere", token(1)), 409, "root", 1, 2);
  // A client header cannot pick the resource.
  check_problem(request(px.port(), "POST", "/tenants/a/q", token(5, {{"Fencing-Resource", "tenant-b"}})), 409,
                "tenant-a", 5, 10);

  CHECK(targets(tenants_up) == std::vector<std::string>{"/tenants/a/x", "/tenants/b/x", "/tenants/b/y"});
  CHECK(targets(root_up) == std::vector<std::string>{"/elsewhere"});
}

TEST_CASE("enforce: token header forwarded unchanged; X-Forwarded-For and Forwarded appended") {
  RecordingUpstream up;
  Proxy px(flags_for(up));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  REQUIRE(is_2xx(request(px.port(), "POST", "/a", token(7, {{"Fencing-Leader", "node-1"}, {"X-End", "kept"}}))));
  REQUIRE(is_2xx(request(px.port(), "POST", "/b",
                         token(7, {{"X-Forwarded-For", "10.0.0.1"}, {"Forwarded", "for=10.0.0.2;proto=http"}}))));
  auto reqs = up.requests();
  REQUIRE(reqs.size() == 2);
  CHECK(reqs[0].headers_named("Fencing-Token") == std::vector<std::string>{"7"});
  CHECK(reqs[0].header("Fencing-Leader") == "node-1");
  CHECK(reqs[0].header("X-End") == "kept");
  CHECK(joined(reqs[0].headers_named("X-Forwarded-For")) == "127.0.0.1");
  CHECK(joined(reqs[0].headers_named("Forwarded")).find("127.0.0.1") != std::string::npos);

  std::string xff = joined(reqs[1].headers_named("X-Forwarded-For"));
  CAPTURE(xff);
  CHECK(xff.rfind("10.0.0.1", 0) == 0);
  CHECK(xff.size() >= 9);
  CHECK(xff.substr(xff.size() - 9) == "127.0.0.1");
  std::string fwd = joined(reqs[1].headers_named("Forwarded"));
  CAPTURE(fwd);
  CHECK(fwd.rfind("for=10.0.0.2;proto=http", 0) == 0);
  CHECK(fwd.find("127.0.0.1") != std::string::npos);

  // A client that names them in Connection made its own values hop-by-hop: only ours go on.
  REQUIRE(is_2xx(request(px.port(), "POST", "/c",
                         token(7, {{"Connection", "X-Forwarded-For, Forwarded"}, {"X-Forwarded-For", "10.9.9.9"},
                                   {"Forwarded", "for=10.9.9.8"}}))));
  reqs = up.requests();
  REQUIRE(reqs.size() == 3);
  CHECK(joined(reqs[2].headers_named("X-Forwarded-For")) == "127.0.0.1");
  CHECK(joined(reqs[2].headers_named("Forwarded")).find("10.9.9.8") == std::string::npos);
}

TEST_CASE("enforce: hop-by-hop headers are not forwarded (RFC 9110 7.6.1)") {
  RecordingUpstream up;
  Proxy px(flags_for(up));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  Headers h = token(3, {{"Connection", "keep-alive, X-Hop"},
                        {"Keep-Alive", "timeout=5"},
                        {"X-Hop", "secret"},
                        {"TE", "trailers"},
                        {"Proxy-Connection", "keep-alive"},
                        {"X-End", "1"}});
  auto r = request(px.port(), "POST", "/h", h, "x");
  INFO(describe(r));
  REQUIRE(is_2xx(r));
  REQUIRE(up.count() == 1);
  auto q = up.requests()[0];
  INFO("upstream head:\n", q.raw_head);
  CHECK_FALSE(q.has("Keep-Alive"));
  CHECK_FALSE(q.has("X-Hop"));
  CHECK_FALSE(q.has("TE"));
  CHECK_FALSE(q.has("Proxy-Connection"));
  CHECK(to_lower(q.header("Connection")).find("x-hop") == std::string::npos);
  CHECK(q.header("X-End") == "1");
  CHECK(q.fencing_token_raw() == "3");
  CHECK(q.body == "x");
}

TEST_CASE("enforce: responses pass through: status, headers, body") {
  RecordingUpstream up([](const RecordedRequest& r) {
    auto a = UpstreamAction::respond(r.target == "/created" ? 201 : 404);
    a.headers = {{"X-Up", "yes"}, {"Content-Type", "text/plain"}, {"Fencing-Observe", "would_reject_stale"},
                 {"Fencing-Generation", "99"}};
    a.body = "from upstream " + r.target;
    return a;
  });
  Proxy px(flags_for(up));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  auto c = request(px.port(), "POST", "/created", token(1));
  INFO(describe(c));
  CHECK(c.code() == 201);
  CHECK(c.response.header("X-Up") == "yes");
  CHECK(c.response.body == "from upstream /created");
  // The fence headers of a fenced request are the proxy's alone, once each.
  CHECK(c.response.header("Fencing-Generation") == "1");
  CHECK_FALSE(c.response.has("Fencing-Observe"));
  auto n = request(px.port(), "GET", "/missing");
  CHECK(n.code() == 404);
  CHECK(n.response.body == "from upstream /missing");
}

TEST_CASE("enforce: keep-alive and pipelining on one client connection") {
  RecordingUpstream up;
  Proxy px(flags_for(up));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  HttpClient c;
  REQUIRE(c.connect(px.port()));
  CHECK(is_2xx(c.request("POST", "/k1", token(1))));
  CHECK(is_2xx(c.request("GET", "/k2")));
  CHECK(is_2xx(c.request("PUT", "/k3", token(2))));
  check_problem(c.request("POST", "/k4", token(1)), 409, "default", 1, 2);
  CHECK(is_2xx(c.request("DELETE", "/k5", token(2))));
  // Pipelined: two requests in one write, answered in order.
  REQUIRE(c.send(build_request("POST", "/p1", token(2)) + build_request("GET", "/p2")));
  auto p1 = c.read_response();
  auto p2 = c.read_response();
  INFO(describe(p1), "\n", describe(p2));
  CHECK(is_2xx(p1));
  CHECK(p1.response.body.find("/p1") != std::string::npos);
  CHECK(is_2xx(p2));
  CHECK(p2.response.body.find("/p2") != std::string::npos);
  CHECK(targets(up) == std::vector<std::string>{"/k1", "/k2", "/k3", "/k5", "/p1", "/p2"});
}

TEST_CASE("enforce: chunked and large request bodies reach the upstream intact") {
  RecordingUpstream up;
  Proxy px(flags_for(up));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  std::string small = "a chunked body with\r\nCRLFs and 0\r\n\r\n inside";
  auto r = request(px.port(), "POST", "/c1", token(1, {{"Transfer-Encoding", "chunked"}}), chunked(small, 5));
  INFO(describe(r));
  CHECK(is_2xx(r));
  std::string big;
  for (int i = 0; i < 300000; ++i) big += static_cast<char>((static_cast<unsigned>(i) * 7919u) % 256u);  // unsigned: no overflow UB
  auto r2 = request(px.port(), "POST", "/c2", token(1, {{"Transfer-Encoding", "chunked"}}), chunked(big, 8191), 30s);
  CHECK(is_2xx(r2));
  auto r3 = request(px.port(), "PUT", "/c3", token(1), big, 30s);
  CHECK(is_2xx(r3));
  auto reqs = up.requests();
  REQUIRE(reqs.size() == 3);
  CHECK(reqs[0].body == small);
  CHECK(reqs[1].body.size() == big.size());
  CHECK(reqs[1].body == big);
  CHECK(reqs[2].body == big);
}

TEST_CASE("enforce: a configured token header name is used instead of Fencing-Token") {
  RecordingUpstream up;
  ProxySpec spec;
  spec.config = config_with_routes({route("/", up.url(), "default")});
  (*spec.config)["token_header"] = "X-Fence";
  Proxy px(spec);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  auto ok = request(px.port(), "POST", "/a", {{"X-Fence", "4"}});
  INFO(describe(ok));
  CHECK(is_2xx(ok));
  check_problem(request(px.port(), "POST", "/b", token(9)), 428, "default", 0, 4);
  check_problem(request(px.port(), "POST", "/c", {{"X-Fence", "3"}}), 409, "default", 3, 4);
  // Its "_" spelling would join X-Fence at a CGI-style upstream (HTTP_X_FENCE = "4,3").
  auto alias = request(px.port(), "POST", "/d", {{"X-Fence", "4"}, {"x_fence", "3"}});
  check_problem(alias, 400, std::nullopt, std::nullopt, std::nullopt, false);
  CHECK(body_json(alias).value("detail", "").find("x_fence reads as X-Fence") != std::string::npos);
  REQUIRE(up.count() == 1);
  CHECK(up.requests()[0].header("X-Fence") == "4");
}

}  // TEST_SUITE
