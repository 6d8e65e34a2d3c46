// GET /v1/resources/{id}/readiness?window=24h: is it safe to switch this resource's route from
// observe to enforce? Ready when the audit log holds no write without a valid token and no stale
// write (nor one enforce would refuse for another reason) of it within the window, with the evidence:
// counts, when last seen, and which callers. Read-only; runs on the admin query thread.
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "config/router.h"
#include "proxy/admin_query.h"
#include "proxy/admin_session.h"
#include "proxy/runtime.h"
#include "proxy/timefmt.h"

namespace fencegate::proxy::admin_detail {

namespace {

// Rows read per decision at most: a log with more than this many of one kind in the window is
// not ready anyway, and its counts say "at least" (`truncated`).
constexpr int kMaxScanRows = 100000;

// The window: a positive count of s, m, h or d ("24h"). 0 if it is not one.
std::int64_t window_ms(std::string_view w) {
  if (w.size() < 2 || w.size() > 12) return 0;
  std::int64_t n = 0;
  for (char c : w.substr(0, w.size() - 1)) {
    if (c < '0' || c > '9') return 0;
    n = n * 10 + (c - '0');
  }
  const std::int64_t unit = w.back() == 's'   ? 1000
                            : w.back() == 'm' ? 60000
                            : w.back() == 'h' ? 3600000
                            : w.back() == 'd' ? 86400000
                                              : 0;
  if (n <= 0 || n > 3650LL * 86400000 / std::max<std::int64_t>(unit, 1)) return 0;
  return n * unit;
}

struct Caller {
  std::int64_t missing = 0, stale = 0, other = 0;
  std::int64_t last_ms = 0;
};
using CallerKey = std::tuple<std::string, std::string, std::string>;  // client, user agent, leader

}  // namespace

Reply AdminSession::readiness(const std::string& resource, const std::map<std::string, std::string>& q) {
  Runtime& rt = admin_.rt;
  for (const auto& [k, _] : q)
    if (k != "window") return problem(400, "bad-query", "Bad request", "unknown parameter \"" + k + "\"");
  const std::string w = q.contains("window") ? param(q, "window") : std::string("24h");
  const std::int64_t win = window_ms(w);
  if (win == 0)
    return problem(400, "bad-query", "Bad request",
                   "window \"" + w + "\": give a positive count of s, m, h or d, e.g. 24h (at most 3650d)");
  const std::int64_t since = std::max<std::int64_t>(1, now_unix_ms() - win);

  std::map<CallerKey, Caller> callers;
  std::int64_t missing = 0, stale = 0, other = 0, last_ms = 0;
  bool truncated = false;
  store::Status st = store::Status::OK();
  // Writes without a valid token (missing or malformed), grouped by caller by the store.
  auto groups = rt.store.query_unfenced(resource, since, 1001, &st);
  if (!st.ok()) return problem(503, "store-unavailable", "Fence store unavailable", st.message());
  truncated = groups.size() > 1000;
  for (const auto& g : groups) {
    Caller& c = callers[{g.client, g.user_agent, g.leader}];
    c.missing += g.count;
    c.last_ms = std::max(c.last_ms, g.last_ms);
    missing += g.count;
  }
  // Writes enforce mode would refuse for their generation: stale, or (authority-linked routes) not
  // the leader's or unknown, or (fenced_only routes) of a resource never fenced.
  for (std::string_view d : store::kAuditDecisions) {
    const bool is_stale = d.ends_with("_stale");
    if (!is_stale && !d.ends_with("_not_leader") && !d.ends_with("_unknown_generation") &&
        !d.ends_with("_unfenced_resource"))
      continue;
    store::AuditQuery aq;
    aq.resource = resource;
    aq.decision = std::string(d);
    aq.since_ms = since;
    aq.limit = 1000;
    for (int scanned = 0;;) {
      auto rows = rt.store.query_audit(aq, &st);
      if (!st.ok()) return problem(503, "store-unavailable", "Fence store unavailable", st.message());
      for (const auto& r : rows) {
        Caller& c = callers[{r.row.client, r.row.user_agent, r.row.leader}];
        (is_stale ? c.stale : c.other) += 1;
        (is_stale ? stale : other) += 1;
        c.last_ms = std::max(c.last_ms, r.row.time_ms);
      }
      scanned += static_cast<int>(rows.size());
      if (rows.size() < 1000) break;
      if (scanned >= kMaxScanRows) {
        truncated = true;
        break;
      }
      aq.before_id = rows.back().id;
    }
  }
  json list = json::array();
  for (const auto& [key, c] : callers) {
    last_ms = std::max(last_ms, c.last_ms);
    list.push_back({{"client", std::get<0>(key)},
                    {"user_agent", std::get<1>(key)},
                    {"leader", std::get<2>(key)},
                    {"missing", c.missing},
                    {"stale", c.stale},
                    {"other", c.other},
                    {"last_seen", format_rfc3339_ms(c.last_ms)}});
  }
  std::sort(list.begin(), list.end(),
            [](const json& a, const json& b) { return a["last_seen"].get<std::string>() > b["last_seen"]; });
  json out = {{"resource", resource},
              {"mode", mode_of(rt.snapshot()->router, resource)},
              {"window", w},
              {"since", format_rfc3339_ms(since)},
              {"ready", missing == 0 && stale == 0 && other == 0},
              {"missing", missing},
              {"stale", stale},
              {"other", other},
              {"last_seen", last_ms ? json(format_rfc3339_ms(last_ms)) : json(nullptr)},
              {"callers", std::move(list)},
              {"truncated", truncated}};
  return json_reply(200, out);
}

}  // namespace fencegate::proxy::admin_detail
