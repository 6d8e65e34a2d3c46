// Who may create a resource (issue 32, finding 3) against the real binary: a route with
// "new_resources": "fenced_only" refuses writes to a resource never fenced (a new tenant, a forged
// 2^63-1) and creates nothing; the admin fence endpoint creates it; DELETE /v1/resources/{id}
// removes a resource's fence durably, with its audit row, after which older generations pass again.
#include "tests/integration/ops_harness.h"

using namespace fencegate::testing;

namespace {

constexpr std::int64_t kForged = 9223372036854775807LL;

ProxySpec config_spec(json cfg) {
  ProxySpec s;
  s.config = std::move(cfg);
  return s;
}

json fenced_only(json r) {
  r["new_resources"] = "fenced_only";
  return r;
}

// Tenants on a fenced_only route (enforce and observe), the rest on an on_write route.
json tenants_config(const RecordingUpstream& up) {
  return config_with_routes({fenced_only(route("/t/{tenant}/", up.url(), "tenant-{tenant}", "enforce")),
                             fenced_only(route("/o/{tenant}/", up.url(), "otenant-{tenant}", "observe")),
                             route("/", up.url(), "ledger", "enforce")});
}

ReadResult fence_call(std::uint16_t admin, const std::string& resource, std::int64_t g) {
  return request(admin, "POST", "/v1/resources/" + resource + "/fence", token(g), {}, 30s);
}

ReadResult delete_call(std::uint16_t admin, const std::string& target) {
  return request(admin, "DELETE", target, {}, {}, 30s);
}

std::vector<json> audit_rows(std::uint16_t admin, const std::string& query) {
  json j = admin_json(admin, "/v1/audit" + query);
  std::vector<json> out;
  if (j.contains("rows"))
    for (auto& r : j["rows"]) out.push_back(r);
  return out;
}

bool holds(std::uint16_t admin, const std::string& resource) {
  const json listing = admin_json(admin, "/v1/resources");  // (not a range over a temporary's member)
  for (const auto& r : listing["resources"])
    if (r["resource"] == resource) return true;
  return false;
}

}  // namespace

TEST_SUITE("new_resources") {
  TEST_CASE("new_resources: fenced_only refuses a new tenant and a forged generation; nothing is created") {
    RecordingUpstream up;
    Proxy px(config_spec(tenants_config(up)));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);

    for (const char* tenant : {"acme", "globex", "initech"}) {
      CAPTURE(tenant);
      auto r = request(px.port(), "POST", std::string("/t/") + tenant + "/orders", token(kForged));
      check_problem(r, 409, std::string("tenant-") + tenant, kForged, 0);
      CHECK(body_json(r)["type"].get<std::string>().find("resource-not-fenced") != std::string::npos);
      CHECK_FALSE(holds(admin, std::string("tenant-") + tenant));
    }
    CHECK(up.count() == 0);
    auto rows = audit_rows(admin, "?decision=rejected_unfenced_resource");
    INFO(json(rows).dump());
    REQUIRE(rows.size() == 3);
    CHECK(rows[0]["presented_generation"] == kForged);
    CHECK(rows[0]["mode"] == "enforce");
  // Nothing stored either: after a restart the tenants are still unknown.
    for (const auto& s : read_resources(px.db())) CHECK(s.resource.rfind("tenant-", 0) != 0);

  // The activation barrier creates the tenant; its writes then pass, and the fence holds.
    REQUIRE(fence_call(admin, "tenant-acme", 3).code() == 200);
    CHECK(is_2xx(request(px.port(), "POST", "/t/acme/orders", token(3))));
    check_problem(request(px.port(), "POST", "/t/acme/orders", token(2)), 409, "tenant-acme", 2, 3);
    CHECK(is_2xx(request(px.port(), "POST", "/t/acme/orders", token(4))));  // an existing resource advances
    CHECK(admin_json(admin, "/v1/resources/tenant-acme")["generation"] == 4);
  // Other tenants stay refused; an on_write route creates on first write as before.
    CHECK(request(px.port(), "POST", "/t/globex/orders", token(4)).code() == 409);
    CHECK(is_2xx(request(px.port(), "POST", "/anything", token(1))));
    CHECK(admin_json(admin, "/v1/resources/ledger")["generation"] == 1);
  }

  TEST_CASE("new_resources: observe mode forwards a write to a never-fenced resource but creates nothing") {
    RecordingUpstream up;
    Proxy px(config_spec(tenants_config(up)));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);

    for (int i = 0; i < 3; ++i) {
      auto r = request(px.port(), "POST", "/o/t" + std::to_string(i) + "/x", token(kForged));
      INFO(describe(r));
      CHECK(is_2xx(r));
      CHECK(r.response.header("Fencing-Observe") == "would_reject_unfenced_resource");
    // Without a token too: observe mode takes no room in the fence for it.
      CHECK(is_2xx(request(px.port(), "POST", "/o/n" + std::to_string(i) + "/x")));
    }
    CHECK(up.count() == 6);
    auto all = admin_json(admin, "/v1/resources")["resources"];
    INFO(all.dump());
    CHECK(all.empty());
  // (Observe rows are written with the next batch, not waited for.)
    CHECK(eventually([&] { return audit_rows(admin, "?decision=would_reject_unfenced_resource").size() == 3; }, 10s));
  // Fenced by the barrier, the resource is tracked and advanced as any observe resource.
    REQUIRE(fence_call(admin, "otenant-t0", 5).code() == 200);
    auto ok = request(px.port(), "POST", "/o/t0/x", token(5));
    CHECK(is_2xx(ok));
    CHECK_FALSE(ok.response.has("Fencing-Observe"));
  }

  TEST_CASE("new_resources: DELETE /v1/resources/{id} needs confirm, removes the fence durably and is audited") {
    RecordingUpstream up;
    Proxy px(config_spec(tenants_config(up)));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);

    REQUIRE(is_2xx(request(px.port(), "POST", "/w", token(kForged))));  // a forged generation on an on_write route
    check_problem(request(px.port(), "POST", "/w", token(7)), 409, "ledger", 7, kForged);

    CHECK(delete_call(admin, "/v1/resources/ledger").code() == 400);                 // no confirm
    CHECK(delete_call(admin, "/v1/resources/ledger?confirm=ledge").code() == 400);   // not the same name
    CHECK(delete_call(admin, "/v1/resources/nothing?confirm=nothing").code() == 404);
    CHECK(admin_json(admin, "/v1/resources/ledger")["generation"] == kForged);  // nothing deleted yet

    auto del = delete_call(admin, "/v1/resources/ledger?confirm=ledger");
    INFO(describe(del));
    REQUIRE(del.code() == 200);
    CHECK(body_json(del)["generation"] == kForged);
  // An older generation is acceptable again.
    CHECK(is_2xx(request(px.port(), "POST", "/w", token(7))));
    CHECK(admin_json(admin, "/v1/resources/ledger")["generation"] == 7);
    auto rows = audit_rows(admin, "?decision=resource_deleted");
    INFO(json(rows).dump());
    REQUIRE(rows.size() == 1);
    CHECK(rows[0]["resource"] == "ledger");
    CHECK(rows[0]["current_generation"] == kForged);
    CHECK(rows[0]["method"] == "DELETE");

  // A fenced_only resource, deleted, refuses writes again until it is fenced anew; durably.
    REQUIRE(fence_call(admin, "tenant-acme", 9).code() == 200);
    REQUIRE(delete_call(admin, "/v1/resources/tenant-acme?confirm=tenant-acme").code() == 200);
    CHECK(request(px.port(), "POST", "/t/acme/x", token(9)).code() == 409);
    const std::size_t from = log_size(px);
    px.stop();
    FG_START(px);
    FG_ADMIN_PORT(admin2, px, from);
    CHECK(admin_get(admin2, "/v1/resources/tenant-acme").code() == 404);
    CHECK(admin_json(admin2, "/v1/resources/ledger")["generation"] == 7);
    CHECK(request(px.port(), "POST", "/t/acme/x", token(9)).code() == 409);
  }

// A route's own max_resources: one capture route cannot take every slot of the global cap; the
// count includes the resources loaded from the store, and other routes keep creating theirs.
  TEST_CASE("new_resources: a route's max_resources caps what its writes create, not other routes") {
    RecordingUpstream up;
    json t = route("/t/{tenant}/", up.url(), "tenant-{tenant}", "enforce");
    t["max_resources"] = 2;
    json cfg = config_with_routes(
        {t, route("/u/{tenant}/", up.url(), "user-{tenant}", "enforce"), route("/", up.url(), "ledger", "enforce")});
    Proxy px(config_spec(cfg));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);
    CHECK(is_2xx(request(px.port(), "POST", "/t/a/x", token(1))));
    CHECK(is_2xx(request(px.port(), "POST", "/t/b/x", token(1))));
    auto third = request(px.port(), "POST", "/t/c/x", token(1));
    INFO(describe(third));
    CHECK(third.code() == 503);
    CHECK(body_json(third)["type"] == "urn:fencegate:problem:too-many-resources");
    CHECK_FALSE(holds(admin, "tenant-c"));
  // The route's own resources still pass; other routes still create theirs.
    CHECK(is_2xx(request(px.port(), "POST", "/t/a/y", token(1))));
    CHECK(is_2xx(request(px.port(), "POST", "/u/c/x", token(1))));
    CHECK(is_2xx(request(px.port(), "POST", "/u/d/x", token(1))));
    CHECK(is_2xx(request(px.port(), "POST", "/u/e/x", token(1))));

  // After a restart the stored resources count against the route.
    px.stop();
    FG_START(px);
    FG_ADMIN_PORT(admin2, px);
    CHECK(request(px.port(), "POST", "/t/c/x", token(1)).code() == 503);
    CHECK(is_2xx(request(px.port(), "POST", "/t/b/z", token(1))));
  }

// A route's max_resources that is not a whole number is refused at start, naming the field.
  TEST_CASE("new_resources: a bad route max_resources is a config error naming the field") {
    RecordingUpstream up;
    json t = route("/t/{tenant}/", up.url(), "tenant-{tenant}", "enforce");
    t["max_resources"] = -1;
    Proxy px(config_spec(config_with_routes({t})));
    CHECK_FALSE(px.start());
    CHECK(px.log().find("routes[0].max_resources") != std::string::npos);
  }

}  // TEST_SUITE new_resources
