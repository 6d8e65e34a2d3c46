// Issue 30: a route's "idempotency" object: defaults, every field, and errors that name the field.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "config/config.h"

using namespace fencegate::config;

namespace {

LoadResult load_route(const std::string& route_extra) {
  return load_json(R"({"routes": [{"prefix": "/", "upstream": "http://127.0.0.1:9000")" + route_extra + "}]}");
}

bool has_error_starting(const LoadResult& r, const std::string& start) {
  for (const auto& e : r.errors)
    if (e.rfind(start, 0) == 0) return true;
  return false;
}

std::string errors(const LoadResult& r) {
  std::string s;
  for (const auto& e : r.errors) s += e + "\n";
  return s;
}

}  // namespace

TEST_CASE("idempotency config: absent is off; {} turns it on with the defaults") {
  auto off = load_route("");
  REQUIRE(off.config);
  CHECK_FALSE(off.config->routes[0].idempotency);
  CHECK_FALSE(off.config->routes[0].is_keyed("POST"));
  auto on = load_route(R"(, "idempotency": {})");
  INFO(errors(on));
  REQUIRE(on.config);
  const Route& r = on.config->routes[0];
  REQUIRE(r.idempotency);
  CHECK(r.idempotency->header == "Idempotency-Key");
  CHECK_FALSE(r.idempotency->required);
  CHECK(r.idempotency->retention == std::chrono::hours(24));
  CHECK(r.idempotency->max_body_bytes == 65536);
  CHECK(r.idempotency->max_keys == 1000000);
  CHECK_FALSE(r.idempotency->scope_client);
  CHECK_FALSE(r.idempotency->forward_unknown);
  CHECK(r.idempotency->release_statuses == std::vector<int>{408, 425, 429, 503});
  CHECK(r.idempotency->unknown_statuses == std::vector<int>{502, 504});
  // Default methods: the route's fenced ones.
  for (const char* m : {"POST", "PUT", "PATCH", "DELETE"}) CHECK(r.is_keyed(m));
  CHECK_FALSE(r.is_keyed("GET"));
}

TEST_CASE("idempotency config: every field") {
  auto on = load_route(R"(, "idempotency": {"header": "X-Operation-Id", "required": true, "retention": "7d",
      "max_body_bytes": 1024, "max_keys": 10, "methods": ["POST"], "scope": "client", "on_unknown": "forward",
      "release_statuses": [503, 500], "unknown_statuses": []})");
  INFO(errors(on));
  REQUIRE(on.config);
  const Route& r = on.config->routes[0];
  REQUIRE(r.idempotency);
  CHECK(r.idempotency->header == "X-Operation-Id");
  CHECK(r.idempotency->required);
  CHECK(r.idempotency->retention == std::chrono::hours(24 * 7));
  CHECK(r.idempotency->max_body_bytes == 1024);
  CHECK(r.idempotency->max_keys == 10);
  CHECK(r.idempotency->scope_client);
  CHECK(r.idempotency->forward_unknown);
  CHECK(r.idempotency->release_statuses == std::vector<int>{503, 500});
  CHECK(r.idempotency->unknown_statuses.empty());
  CHECK(r.is_keyed("POST"));
  CHECK_FALSE(r.is_keyed("PUT"));
}

TEST_CASE("idempotency config: errors name the field and why") {
  struct Case {
    std::string json, error;
  };
  const Case cases[] = {
      {R"("idempotency": true)", "routes[0].idempotency: must be an object"},
      {R"("idempotency": {"hedaer": "x"})", "routes[0].idempotency.hedaer: unknown key"},
      {R"("idempotency": {"header": "bad header"})", "routes[0].idempotency.header: must be an HTTP field name"},
      {R"("idempotency": {"header": "Fencing-Token"})", "routes[0].idempotency.header: \"Fencing-Token\" is a field"},
      {R"("idempotency": {"required": "yes"})", "routes[0].idempotency.required: must be true or false"},
      {R"("idempotency": {"retention": "0"})", "routes[0].idempotency.retention: must be longer than 0"},
      {R"("idempotency": {"retention": "24x"})", "routes[0].idempotency.retention: must be a duration"},
      {R"("idempotency": {"max_body_bytes": 99999999})", "routes[0].idempotency.max_body_bytes: must be an integer"},
      {R"("idempotency": {"max_keys": 0})", "routes[0].idempotency.max_keys: must be an integer from 1"},
      {R"("idempotency": {"methods": []})", "routes[0].idempotency.methods: must be a non-empty array"},
      {R"("idempotency": {"methods": ["post"]})", "routes[0].idempotency.methods[0]: must be an upper-case"},
      {R"("idempotency": {"methods": ["GET"]})", "routes[0].idempotency.methods[0]: \"GET\" is not fenced"},
      {R"("idempotency": {"scope": "tenant"})", "routes[0].idempotency.scope: must be \"resource\" or \"client\""},
      {R"("idempotency": {"on_unknown": "retry"})", "routes[0].idempotency.on_unknown: must be \"refuse\" or"},
      {R"("mode": "off", "idempotency": {})", "routes[0].idempotency: the route's mode is off"},
      {R"("idempotency": {"release_statuses": 503})", "routes[0].idempotency.release_statuses: must be an array"},
      {R"("idempotency": {"release_statuses": [503, 99]})",
       "routes[0].idempotency.release_statuses[1]: must be an HTTP status code from 100 to 599"},
      {R"("idempotency": {"unknown_statuses": ["502"]})",
       "routes[0].idempotency.unknown_statuses[0]: must be an HTTP status code"},
      {R"("idempotency": {"unknown_statuses": [600]})", "routes[0].idempotency.unknown_statuses[0]: must be"},
      {R"("idempotency": {"unknown_statuses": [502, 503]})",
       "routes[0].idempotency.unknown_statuses: 503 is also in release_statuses"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.json);
    auto r = load_route(", " + c.json);
    INFO(errors(r));
    CHECK_FALSE(r.config);
    CHECK(has_error_starting(r, c.error));
  }
}
