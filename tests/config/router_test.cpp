// Router: which route and resource a request target maps to, and which targets are refused.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "config/router.h"

using namespace fencegate::config;

namespace {

Route route(std::string prefix, std::string resource = "default") {
  Route r;
  r.prefix = std::move(prefix);
  r.upstream = "http://127.0.0.1:9000";
  r.resource = std::move(resource);
  return r;
}

using Outcome = Router::Outcome;

}  // namespace

TEST_CASE("literal prefixes: longest wins, '/' matches everything") {
  std::vector<Route> routes{route("/", "root"), route("/api/", "api"), route("/api/orders", "orders")};
  Router router(routes);

  auto m = router.match("/api/orders/17?x=1");
  REQUIRE(m.outcome == Outcome::matched);
  CHECK(m.route == &routes[2]);
  CHECK(m.resource == "orders");

  CHECK(router.match("/api/ordersX").resource == "orders");  // string prefix, not segment prefix
  CHECK(router.match("/api/x").resource == "api");
  CHECK(router.match("/api").resource == "api");  // a prefix ending in "/" takes the path without it
  CHECK(router.match("/").resource == "root");
  CHECK(router.match("/other?q=/api/").resource == "root");  // query is not the path
}

TEST_CASE("no_route when nothing matches") {
  std::vector<Route> routes{route("/api/")};
  Router router(routes);
  auto m = router.match("/web/index.html");
  CHECK(m.outcome == Outcome::no_route);
  CHECK(m.route == nullptr);
  CHECK(m.resource.empty());
}

TEST_CASE("captures fill the resource template") {
  std::vector<Route> routes{route("/tenants/{tenant}/", "tenant-{tenant}"),
                            route("/t/{id}", "t:{id}"),
                            route("/o/{org}/p/{proj}/", "{org}.{proj}")};
  Router router(routes);

  auto m = router.match("/tenants/acme/orders");
  REQUIRE(m.outcome == Outcome::matched);
  CHECK(m.route == &routes[0]);
  CHECK(m.resource == "tenant-acme");

  CHECK(router.match("/t/acme").resource == "t:acme");
  CHECK(router.match("/t/acme/x").resource == "t:acme");  // whole segment is captured
  CHECK(router.match("/t/A-b_c.d~9?q").resource == "t:A-b_c.d~9");
  CHECK(router.match("/o/x/p/y/z").resource == "x.y");
  // A prefix ending in '/' also takes the path without it: "/tenants/acme" is acme's too.
  CHECK(router.match("/tenants/acme").resource == "tenant-acme");
  CHECK(router.match("/tenants/acme?x=1").resource == "tenant-acme");
  CHECK(router.match("/tenants/").outcome == Outcome::no_route);  // captures are non-empty
  CHECK(router.match("/tenants").outcome == Outcome::no_route);
  CHECK(router.match("/t/").outcome == Outcome::no_route);
}

TEST_CASE("a prefix ending in '/' takes the path without it, not the fallback route") {
  std::vector<Route> routes{route("/", "root"), route("/orders/", "orders"), route("/t/{tenant}/", "t-{tenant}"),
                            route("/api", "api-exact"), route("/api/", "api-dir")};
  Router router(routes);
  CHECK(router.match("/orders").resource == "orders");  // else fenced under "root"
  CHECK(router.match("/orders?page=2").resource == "orders");
  CHECK(router.match("/orders/1").resource == "orders");
  CHECK(router.match("/order").resource == "root");
  CHECK(router.match("/ordersx").resource == "root");
  CHECK(router.match("/t/acme").resource == "t-acme");
  CHECK(router.match("/t").resource == "root");
  CHECK(router.match("/api").resource == "api-exact");  // an exact match beats one without the '/'
  CHECK(router.match("/api/x").resource == "api-dir");
}

TEST_CASE("ties: longest matched portion, then fewer captures, then config order") {
  std::vector<Route> routes{route("/t/{id}/", "cap-{id}"), route("/t/admin/", "admin"),
                            route("/t/{x}/items", "items-{x}"), route("/t/{y}/items", "second-{y}")};
  Router router(routes);
  CHECK(router.match("/t/admin/x").resource == "admin");        // same length: fewer captures
  CHECK(router.match("/t/bob/x").resource == "cap-bob");
  CHECK(router.match("/t/bob/items/1").resource == "items-bob");  // longer match; first in order
  CHECK(router.match("/t/admin/items").resource == "items-admin");  // longer beats literal
}

TEST_CASE("capture segments are restricted to [A-Za-z0-9._~-]") {
  std::vector<Route> routes{route("/", "root"), route("/t/{id}/", "t-{id}")};
  Router router(routes);
  CHECK(router.match("/t/a%41/x").outcome == Outcome::bad_target);  // encoded unreserved: refused outright
  for (const char* target : {"/t/a+b/x", "/t/a%2B/x", "/t/a@b/", "/t/a:b/", "/t/a!b/"}) {
    auto m = router.match(target);
    INFO(target);
    // Refused rather than falling back to "/": the upstream may decode it into this tenant's path.
    CHECK(m.outcome == Outcome::bad_target);
    CHECK(m.reason.find("{id}") != std::string::npos);
  }
}

TEST_CASE("bad targets are refused with a reason") {
  std::vector<Route> routes{route("/")};
  Router router(routes);
  const char* bad[] = {
      "",                         // empty
      "http://example.com/",      // absolute-form
      "example.com:443",          // authority-form
      "*",                        // asterisk-form
      "/a b",                     // space
      "/a\tb",                    // control
      "/a\x7f",                   // DEL
      "/caf\xc3\xa9",             // non-ASCII
      "/a?q=\x01",                // control in query
      "/a\\b",                    // backslash
      "/a#frag",                  // fragment
      "/a?x#y",                   // fragment after query
      "//a",                      // empty segment
      "/a//b",                    // empty segment
      "/a/./b", "/a/../b", "/a/..", "/a/.", "/..", "/.",  // dot segments
      "/a%2Fb", "/a%2fb", "/a%2E%2E/b", "/a%2e", "/a%5Cb", "/a%5c", "/a%25", "/a%00", "/a%1F", "/a%7f",
      "/a%", "/a%4", "/a%G1", "/a%zz/b",  // invalid percent-encodings
      // Path parameters: Tomcat, Jetty and Spring strip ";..." per segment, so these reach them as
      // "/b/x", "/a/x", "/tenants/x": another route's (or tenant's) path.
      "/a/..;/b/x", "/a/.;/x", "/a/x/..;", "/a;jsessionid=1/x", "/tenants;x/acme", "/a%3Bb", "/a%3b",
  };
  for (const char* t : bad) {
    auto m = router.match(t);
    INFO("target: ", t);
    CHECK(m.outcome == Outcome::bad_target);
    CHECK_FALSE(m.reason.empty());
    CHECK(m.route == nullptr);
  }
  CHECK(router.match("/a/b/").outcome == Outcome::matched);  // trailing '/' is fine
  CHECK(router.match("/a%20b%C3%A9").outcome == Outcome::matched);
  // An upstream may decode encoded unreserved characters (RFC 3986 6.2.2.2): /tenant%73/ would
  // become /tenants/ there while we routed it elsewhere (found by the router fuzzer).
  CHECK(router.match("/tenant%73/acme/charge").outcome == Outcome::bad_target);
  CHECK(router.match("/a%7E").outcome == Outcome::bad_target);
  CHECK(router.match("/a/.hidden/..x").outcome == Outcome::matched);
  CHECK(router.match("/a?b=%2F&c=..//").outcome == Outcome::matched);  // query not inspected
  CHECK(router.match("/a\\b").reason == "backslash in path");
  CHECK(router.match("/a/zz/..;/b").reason == "path parameter (';') in path");
  CHECK(router.match("/a?x=1;y=2").outcome == Outcome::matched);  // ';' in the query is fine
}

TEST_CASE("check_route_template") {
  auto check = [](std::string prefix, std::string resource = "r") {
    return check_route_template(route(std::move(prefix), std::move(resource)));
  };
  CHECK(check("/") == "");
  CHECK(check("/t/{tenant}/", "tenant-{tenant}") == "");
  CHECK(check("/t/{tenant}", "{tenant}") == "");
  CHECK(check("/o/{a}/p/{b_2}/", "x:{a}:{b_2}") == "");
  CHECK(check("/t/{tenant/") == "prefix: unbalanced '{'");
  CHECK(check("/t/tenant}/") == "prefix: unbalanced '}'");
  CHECK(check("/t/{{x}}/") == "prefix: unbalanced '{'");
  CHECK(check("/t/{9x}/").rfind("prefix: bad capture name \"9x\"", 0) == 0);
  CHECK(check("/t/{}/").rfind("prefix: bad capture name \"\"", 0) == 0);
  CHECK(check("/t/{a-b}/").rfind("prefix: bad capture name", 0) == 0);
  CHECK(check("/t/x{id}/") == "prefix: capture {id} must be a whole path segment");
  CHECK(check("/t/{id}x/") == "prefix: capture {id} must be a whole path segment");
  CHECK(check("/{a}/{a}/") == "prefix: duplicate capture {a}");
  CHECK(check("/a//b").rfind("prefix: empty path segment", 0) == 0);
  CHECK(check("/a/../b").rfind("prefix: dot segment", 0) == 0);
  CHECK(check("/a?b") == "prefix: must not contain '?'");
  CHECK(check("/a%41/").rfind("prefix: ", 0) == 0);  // no percent-encoding in prefixes
  CHECK(check("/a*b/").rfind("prefix: character '*' not allowed", 0) == 0);
  CHECK(check("api") == "prefix: must start with \"/\"");
  CHECK(check("/t/{id}/", "t-{tenant}") == "resource: uses {tenant}, which the prefix does not capture");
  CHECK(check("/", "") == "resource: must not be empty");
  CHECK(check("/", "a/b").rfind("resource: character '/' not allowed", 0) == 0);
  CHECK(check("/", "a b").rfind("resource: character ' ' not allowed", 0) == 0);
  CHECK(check("/t/{id}/", "x-{id").rfind("resource: unbalanced '{'", 0) == 0);
  CHECK(check("/t/{id}/", "x-id}").rfind("resource: unbalanced '}'", 0) == 0);
  // Captures side by side must be told apart: '-' (or nothing) between them is not enough.
  CHECK(check("/t/{a}/{b}/", "{a}-{b}").rfind("resource: {a} and {b} need a ':' between them", 0) == 0);
  CHECK(check("/t/{a}/{b}/", "{a}{b}").rfind("resource: {a} and {b} need a ':' between them", 0) == 0);
  CHECK(check("/t/{a}/{b}/", "{a}-:-{b}") == "");
  CHECK(check("/t/{a}/{b}/", "{a}-{a}:{b}").rfind("resource: {a} and {a} need a ':'", 0) == 0);
  CHECK(check("/", std::string(200, 'a')) == "");
  CHECK(check("/", std::string(201, 'a')) == "resource: longer than 200 characters");
}

TEST_CASE("Router is movable and keeps pointing at the configured routes") {
  std::vector<Route> routes{route("/x/", "x")};
  Router a(routes);
  Router b(std::move(a));
  auto m = b.match("/x/1");
  REQUIRE(m.outcome == Outcome::matched);
  CHECK(m.route == &routes[0]);
}

TEST_CASE("a path that would make a resource name longer than the admin API takes is refused") {
  std::vector<Route> routes{route("/", "root"), route("/t/{tenant}/", "tenant-{tenant}")};
  Router router(routes);
  const std::string fits(256 - 7, 'a'), too_long(256 - 6, 'a');  // "tenant-" is 7 characters
  auto m = router.match("/t/" + fits + "/x");
  CHECK(m.outcome == Outcome::matched);
  CHECK(m.resource.size() == kMaxResourceName);
  m = router.match("/t/" + too_long + "/x");
  CHECK(m.outcome == Outcome::bad_target);  // not the "/" route: that would fence it under "root"
  CHECK(m.route == nullptr);
  CHECK(m.resource.empty());
  CHECK(m.reason.find("longer than 256") != std::string::npos);
}

TEST_CASE("resource_templates_overlap: can two templates name the same resource") {
  CHECK(resource_templates_overlap("default", "default"));
  CHECK_FALSE(resource_templates_overlap("default", "ledger"));
  CHECK(resource_templates_overlap("tenant-{t}", "tenant-acme"));
  CHECK(resource_templates_overlap("tenant-acme", "tenant-{t}"));
  CHECK_FALSE(resource_templates_overlap("tenant-{t}", "tenant-"));    // a capture takes one character or more
  CHECK_FALSE(resource_templates_overlap("tenant-{t}", "tenant-a:b"));  // ':' is never captured
  CHECK(resource_templates_overlap("{a}-x", "b-{c}"));                  // "b-x"
  CHECK(resource_templates_overlap("{a}", "x:{b}") == false);
  CHECK(resource_templates_overlap("{a}{b}", "xy"));
  CHECK_FALSE(resource_templates_overlap("{a}{b}", "x"));
  CHECK(resource_templates_overlap("t-{a}-{b}", "t-{c}"));              // "t-x-y": '-' is a capture character
  CHECK_FALSE(resource_templates_overlap("a-{t}", "b-{t}"));
  CHECK_FALSE(resource_templates_overlap("{t}:a", "{t}:b"));
}

TEST_CASE("a path that reaches another route once letter case is ignored is refused") {
  // An upstream that routes without regard to case (Express, ASP.NET Core) would apply
  // "/Tenants/acme/x" to tenant acme, while the exact match is the catch-all's resource.
  std::vector<Route> routes{route("/", "default"), route("/tenants/{tenant}/", "tenant-{tenant}"),
                            route("/tenants/vip/", "vip")};
  Router router(routes);
  for (const char* t : {"/Tenants/acme/x", "/TENANTS/acme", "/tenants/VIP/x", "/tenants/Vip"}) {
    CAPTURE(t);
    auto m = router.match(t);
    CHECK(m.outcome == Outcome::bad_target);
    CHECK(m.reason.find("letter case") != std::string::npos);
  }
  // Case that changes no route is fine: the capture keeps it, the catch-all takes the rest.
  CHECK(router.match("/tenants/Acme/x").resource == "tenant-Acme");
  CHECK(router.match("/Other/x").resource == "default");
  CHECK(router.match("/tenants/vip/x").resource == "vip");

  // Upper case in a route's own literal: the exact spelling reaches it, another spelling that
  // would fall to the catch-all is refused.
  std::vector<Route> upper{route("/", "default"), route("/API/", "api")};
  Router r2(upper);
  CHECK(r2.match("/API/x").resource == "api");
  CHECK(r2.match("/api/x").outcome == Outcome::bad_target);
  CHECK(r2.match("/x").resource == "default");

  // Two routes that differ only in case: each one's exact spelling still reaches it.
  std::vector<Route> twins{route("/A/", "upper"), route("/a/", "lower")};
  Router r3(twins);
  CHECK(r3.match("/A/x").resource == "upper");
  CHECK(r3.match("/a/x").resource == "lower");
}
