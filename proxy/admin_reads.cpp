// The admin API's read-only answers: /readyz, /metrics, the resource listings and the audit
// queries (/v1/audit, /v1/audit/unfenced). Store reads among them run on the query thread.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "config/router.h"
#include "proxy/admin_query.h"
#include "proxy/admin_session.h"
#include "proxy/authority.h"
#include "proxy/fleet.h"
#include "proxy/metrics.h"
#include "proxy/runtime.h"
#include "proxy/timefmt.h"

namespace fencegate::proxy::admin_detail {

Reply AdminSession::readyz() {
  Runtime& rt = admin_.rt;
  if (rt.stopping.load()) return json_reply(503, {{"status", "not ready"}, {"reason", "shutting down"}});
  std::string why;
  if (!rt.store_ok(&why)) return json_reply(503, {{"status", "not ready"}, {"reason", "store: " + why}});
  if (!rt.snapshot()) return json_reply(503, {{"status", "not ready"}, {"reason", "no config loaded"}});
  if (rt.fleet && !rt.fleet->member())  // fleet (docs/fleet.md)
    return json_reply(503, {{"status", "not ready"}, {"reason", "not a member of the fleet"}});
  return json_reply(200, {{"status", "ready"}});
}

Reply AdminSession::metrics() {
  Runtime& rt = admin_.rt;
  std::string out;
  out.reserve(8192);
  rt.metrics.render(out);
  render_idempotency_keys(out, rt.store.key_counts());  // issue 30
  render_idempotency_bytes(out, rt.store.key_bytes());  // issue 30
  if (rt.fleet) rt.fleet->render_metrics(out);  // fleet (docs/fleet.md)
  auto views = rt.fence.snapshot();
  auto stats = rt.fence.stats();
  out += "# HELP fencegate_generation Current durable generation per resource (labelled resources only).\n";
  out += "# TYPE fencegate_generation gauge\n";
  std::size_t shown = 0;
  for (const auto& v : views) {
    if (shown >= 1000) break;  // bounded label set
    if (!rt.metrics.has_label(v.name) && shown >= 100) continue;
    ++shown;
    out += "fencegate_generation{resource=\"" + prom_escape(v.name) + "\"} " + std::to_string(v.stored) + "\n";
  }
  out += "# HELP fencegate_resources Resources held by the fence.\n# TYPE fencegate_resources gauge\n";
  out += "fencegate_resources " + std::to_string(views.size()) + "\n";
  out += "# HELP fencegate_advances_total Generation advances committed.\n# TYPE fencegate_advances_total counter\n";
  out += "fencegate_advances_total " + std::to_string(stats.advances) + "\n";
  out += "# HELP fencegate_drain_waits_total Advances that had to wait for older in-flight writes.\n";
  out += "# TYPE fencegate_drain_waits_total counter\n";
  out += "fencegate_drain_waits_total " + std::to_string(stats.drain_waits) + "\n";
  out += "# HELP fencegate_drain_aborts_total Older upstream exchanges aborted by a drain timeout.\n";
  out += "# TYPE fencegate_drain_aborts_total counter\n";
  out += "fencegate_drain_aborts_total " + std::to_string(stats.drain_aborts) + "\n";
  out += "# HELP fencegate_audit_queue_depth Items waiting for the store thread.\n";
  out += "# TYPE fencegate_audit_queue_depth gauge\n";
  out += "fencegate_audit_queue_depth " + std::to_string(rt.store.queue_depth()) + "\n";
  out += "# HELP fencegate_audit_rows_dropped_total Observe-mode audit rows given up on after failed commits.\n";
  out += "# TYPE fencegate_audit_rows_dropped_total counter\n";
  out += "fencegate_audit_rows_dropped_total " + std::to_string(rt.store.audit_rows_dropped()) + "\n";
  std::string why;
  out += "# HELP fencegate_store_ok 1 if the last store commit succeeded.\n# TYPE fencegate_store_ok gauge\n";
  out += std::string("fencegate_store_ok ") + (rt.store_ok(&why) ? "1" : "0") + "\n";
  // Election authorities (routes with an "authority"), one series per election: whether etcd's
  // view is current (reachable within the leader's lease window, in sync) and the leader's
  // generation (0: no leader). The alerts on a lost or flapping election use these.
  std::map<std::string, Authority::Health> elections;
  if (rt.authorities)
    for (const auto& route : rt.snapshot()->cfg->routes)
      if (Authority* au = rt.authorities->for_route(route)) elections.emplace(au->config().election, au->health());
  out += "# HELP fencegate_authority_available 1 while the election authority's view of etcd is current.\n";
  out += "# TYPE fencegate_authority_available gauge\n";
  for (const auto& [name, h] : elections)
    out += "fencegate_authority_available{election=\"" + prom_escape(name) + "\"} " +
           (h.available && h.synced ? "1" : "0") + "\n";
  out += "# HELP fencegate_authority_leader_generation The election's current leader generation (0: none).\n";
  out += "# TYPE fencegate_authority_leader_generation gauge\n";
  for (const auto& [name, h] : elections)
    out += "fencegate_authority_leader_generation{election=\"" + prom_escape(name) + "\"} " + std::to_string(h.leader) +
           "\n";
  out += "# HELP fencegate_ready 1 while GET /readyz answers 200.\n# TYPE fencegate_ready gauge\n";
  out += std::string("fencegate_ready ") + (readyz().status == 200 ? "1" : "0") + "\n";
  Reply r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = std::move(out);
  return r;
}

namespace {

constexpr std::string_view kModes[] = {"enforce", "observe", "off", "unrouted"};

// One resource's row in the listing: the fence's view (in memory), the store's (advanced at and
// by), the route's mode and, for a resource with its own metrics label, its requests so far.
json resource_row(const config::Router& router, const std::string& name) {
  return json{{"resource", name},
              {"generation", 0},
              {"highest_seen", 0},
              {"in_flight", 0},
              {"waiting", 0},
              {"mode", mode_of(router, name)},
              {"unstored_generation", nullptr},
              {"advanced_at", nullptr},
              {"advanced_by", nullptr}};
}

}  // namespace

// GET /v1/resources[/{id}]: sorted by name. Without `limit` every resource is listed (the answer
// clients had before paging); with it, a page of `limit` resources after `cursor` (the last name
// of the previous page) and `next_cursor` while more follow. `prefix` and `mode` filter.
Reply AdminSession::resources(const std::string* one, const std::map<std::string, std::string>& q) {
  Runtime& rt = admin_.rt;
  for (const auto& [k, _] : q)
    if (k != "limit" && k != "cursor" && k != "prefix" && k != "mode")
      return problem(400, "bad-query", "Bad request", "unknown parameter \"" + k + "\"");
  std::int64_t limit = 0;
  std::string err;
  if (!parse_int_param(q, "limit", 1, 1000, &limit, &err)) return problem(400, "bad-query", "Bad request", err);
  const std::string prefix = param(q, "prefix"), mode = param(q, "mode"), cursor = param(q, "cursor");
  if (!mode.empty() && std::find(std::begin(kModes), std::end(kModes), mode) == std::end(kModes))
    return problem(400, "bad-query", "Bad request",
                   "mode \"" + mode + "\": unknown; one of enforce, observe, off, unrouted");
  auto wanted = [&](const std::string& name) {
    if (one) return name == *one;
    return name.starts_with(prefix) && (cursor.empty() || name > cursor);
  };
  auto snap = rt.snapshot();
  std::map<std::string, json> out;
  for (const auto& v : rt.fence.snapshot()) {
    if (!wanted(v.name)) continue;
    json& j = out[v.name] = resource_row(snap->router, v.name);
    j["generation"] = v.stored;
    j["highest_seen"] = v.seen;
    j["in_flight"] = v.inflight;
    j["waiting"] = v.waiting;
    if (v.owed > v.stored) j["unstored_generation"] = v.owed;
  }
  store::Status st = store::Status::OK();
  for (const auto& s : rt.store.load_all(&st)) {
    if (!wanted(s.resource)) continue;
    auto& j = out[s.resource];
    if (j.is_null()) {
      j = resource_row(snap->router, s.resource);
      j["generation"] = s.generation;
      j["highest_seen"] = s.generation;
    }
    j["advanced_at"] = s.advanced_at_ms ? json(format_rfc3339_ms(s.advanced_at_ms)) : json(nullptr);
    j["advanced_by"] = s.advanced_by;
  }
  for (auto& [name, j] : out) {
    std::uint64_t writes = 0, refusals = 0;
    if (rt.metrics.totals(name, &writes, &refusals)) {
      j["writes"] = writes;
      j["refusals"] = refusals;
    } else {  // no label of its own (over max_resource_labels): not counted alone
      j["writes"] = nullptr;
      j["refusals"] = nullptr;
    }
  }
  if (one) {
    auto it = out.find(*one);
    if (it == out.end()) return problem(404, "unknown-resource", "Not found", "no generation is known for " + *one);
    return json_reply(200, it->second);
  }
  json list = json::array();
  std::string last;
  bool more = false;
  for (auto& [name, j] : out) {
    if (!mode.empty() && j["mode"] != mode) continue;
    if (limit > 0 && list.size() == static_cast<std::size_t>(limit)) {
      more = true;
      break;
    }
    last = name;
    list.push_back(std::move(j));
  }
  json body = {{"resources", std::move(list)}};
  if (more) body["next_cursor"] = last;
  return json_reply(200, body);
}

Reply AdminSession::audit(const std::map<std::string, std::string>& q) {
  for (const auto& [k, _] : q)
    if (k != "resource" && k != "decision" && k != "since" && k != "until" && k != "leader" && k != "limit" &&
        k != "cursor")
      return problem(400, "bad-query", "Bad request", "unknown parameter \"" + k + "\"");
  store::AuditQuery aq;
  aq.resource = param(q, "resource");
  aq.decision = param(q, "decision");
  if (!aq.decision.empty() && std::find(store::kAuditDecisions.begin(), store::kAuditDecisions.end(), aq.decision) ==
                                  store::kAuditDecisions.end()) {
    std::string known;
    for (auto d : store::kAuditDecisions) known += (known.empty() ? "" : ", ") + std::string(d);
    return problem(400, "bad-query", "Bad request", "decision \"" + aq.decision + "\": unknown; one of " + known);
  }
  aq.leader = param(q, "leader");
  std::string err;
  std::int64_t limit = 100, cursor = 0;
  if (!parse_time_param(q, "since", &aq.since_ms, &err) || !parse_time_param(q, "until", &aq.until_ms, &err) ||
      !parse_int_param(q, "limit", 1, 1000, &limit, &err) || !parse_int_param(q, "cursor", 1, INT64_MAX, &cursor, &err))
    return problem(400, "bad-query", "Bad request", err);
  // until is exclusive, and 0 means "no bound" to the store: an until at or before the epoch
  // matches nothing, so it becomes the earliest bound that does the same.
  if (!param(q, "until").empty() && aq.until_ms <= 0) aq.until_ms = 1;  // (empty: absent, as elsewhere)
  aq.before_id = cursor;
  aq.limit = static_cast<int>(limit) + 1;  // one more tells whether another page exists
  store::Status st = store::Status::OK();
  auto rows = admin_.rt.store.query_audit(aq, &st);
  if (!st.ok()) return problem(503, "store-unavailable", "Fence store unavailable", st.message());
  json out = {{"rows", json::array()}};
  bool more = rows.size() > static_cast<std::size_t>(limit);
  if (more) rows.resize(static_cast<std::size_t>(limit));
  for (const auto& r : rows) out["rows"].push_back(audit_json(r));
  if (more && !rows.empty()) out["next_cursor"] = std::to_string(rows.back().id);
  return json_reply(200, out);
}

Reply AdminSession::unfenced(const std::map<std::string, std::string>& q) {
  for (const auto& [k, _] : q)
    if (k != "resource" && k != "since" && k != "limit")
      return problem(400, "bad-query", "Bad request", "unknown parameter \"" + k + "\"");
  std::string err;
  std::int64_t since = 0, limit = 100;
  if (!parse_time_param(q, "since", &since, &err) || !parse_int_param(q, "limit", 1, 1000, &limit, &err))
    return problem(400, "bad-query", "Bad request", err);
  store::Status st = store::Status::OK();
  auto groups = admin_.rt.store.query_unfenced(param(q, "resource"), since, static_cast<int>(limit) + 1, &st);
  if (!st.ok()) return problem(503, "store-unavailable", "Fence store unavailable", st.message());
  const bool more = groups.size() > static_cast<std::size_t>(limit);  // one more tells
  if (more) groups.resize(static_cast<std::size_t>(limit));
  json list = json::array();
  for (const auto& g : groups)
    list.push_back({{"resource", g.resource},
                    {"client", g.client},
                    {"user_agent", g.user_agent},
                    {"leader", g.leader},
                    {"count", g.count},
                    {"first_seen", format_rfc3339_ms(g.first_ms)},
                    {"last_seen", format_rfc3339_ms(g.last_ms)}});
  return json_reply(200, {{"callers", list}, {"truncated", more}});
}

}  // namespace fencegate::proxy::admin_detail
