// The admin API's state-changing resource endpoints: POST /v1/resources/{id}/fence (the activation
// barrier: the same decide_admission as a write, then a drain and a durable advance) and DELETE
// /v1/resources/{id}?confirm={id} (remove a resource's fence, durably and audited).
#include <algorithm>
#include <boost/asio.hpp>
#include <nlohmann/json.hpp>
#include <set>

#include "common/log.h"
#include "config/router.h"
#include "proxy/admin_session.h"
#include "proxy/admission.h"
#include "proxy/metrics.h"
#include "proxy/runtime.h"
#include "proxy/token.h"
#include "proxy/traceparent.h"

namespace fencegate::proxy::admin_detail {

namespace {

// The barrier's generation and leader, from the token and leader headers or the JSON body
// {"generation": N, "leader": "..."} (both given: they must agree). A reply when they are
// missing or malformed.
std::optional<Reply> read_barrier(const RequestHead& h, std::string_view body, const config::Config& cfg,
                                  std::int64_t* generation, std::string* leader_out) {
  std::int64_t& g = *generation;
  std::string& leader = *leader_out;
  g = 0;
  leader.clear();
  std::string_view tv, lv;
  std::size_t nt = h.count(cfg.token_header, &tv);
  const std::size_t nl = h.count(cfg.leader_header, &lv);
  if (nl == 1) leader = std::string(lv);
  if (nt > 1) return problem(400, "malformed-token", "Malformed fencing token", "several token headers");
  if (nl > 1) return problem(400, "bad-leader", "Bad request", "several " + cfg.leader_header + " headers");
  if (nt == 1) {
    auto t = parse_token(tv);
    if (!t)
      return problem(400, "malformed-token", "Malformed fencing token",
                     "the token is not a canonical decimal in 1..2^63-1");
    g = *t;
  }
  if (!body.empty()) {
    // A repeated key is refused, not resolved (nlohmann keeps the last one): {"generation": 9,
    // "generation": 6} must not mean whichever a reader of the request happens to pick.
    std::set<std::string> keys;
    std::string repeated;
    json j = json::parse(
        body,
        [&](int depth, json::parse_event_t ev, json& parsed) {
          if (ev == json::parse_event_t::key && depth == 1 && parsed.is_string() &&
              !keys.insert(parsed.get<std::string>()).second && repeated.empty())
            repeated = parsed.get<std::string>();
          return true;
        },
        false);
    if (j.is_discarded() || !j.is_object())
      return problem(400, "bad-json", "Bad request",
                     "the body must be a JSON object {\"generation\": N, \"leader\": \"...\"}");
    if (!repeated.empty()) return problem(400, "bad-json", "Bad request", "duplicate key \"" + repeated + "\"");
    for (auto& [k, v] : j.items())
      if (k != "generation" && k != "leader")
        return problem(400, "bad-json", "Bad request", "unknown key \"" + k + "\"");
    if (j.contains("generation")) {
      const auto& v = j["generation"];
      if (!v.is_number_integer() || v.get<std::int64_t>() < 1)
        return problem(400, "malformed-token", "Malformed fencing token", "generation must be an integer in 1..2^63-1");
      std::int64_t jg = v.get<std::int64_t>();
      if (g && g != jg) return problem(400, "malformed-token", "Malformed fencing token", "header and body disagree");
      g = jg;
    }
    if (j.contains("leader")) {
      if (!j["leader"].is_string()) return problem(400, "bad-json", "Bad request", "leader must be a string");
      // As with the generation: a header and a body that disagree are refused, not resolved.
      if (h.count(cfg.leader_header) && j["leader"].get<std::string>() != leader)
        return problem(400, "bad-leader", "Bad request",
                       "the " + cfg.leader_header + " header and the body's leader disagree");
      leader = j["leader"].get<std::string>();
    }
  }
  if (g == 0)
    return problem(428, "token-required", "Fencing token required",
                   "give the generation in the " + cfg.token_header + " header or as {\"generation\": N}");
  if (leader.size() > cfg.max_leader_bytes) return problem(400, "bad-leader", "Bad request", "leader is too long");
  // As in a Fencing-Leader header: no control characters (it is shown in logs and audit rows).
  if (std::any_of(leader.begin(), leader.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
    return problem(400, "bad-leader", "Bad request", "leader must not contain control characters");
  return std::nullopt;
}

}  // namespace

awaitable<Reply> AdminSession::fence(const std::string& resource, const RequestHead& h, std::string_view body) {
  Runtime& rt = admin_.rt;
  auto snap = rt.snapshot();
  const config::Config& cfg = *snap->cfg;
  std::int64_t g = 0;
  std::string leader;
  if (std::optional<Reply> refused = read_barrier(h, body, cfg, &g, &leader)) co_return std::move(*refused);

  // A barrier on a name no fencing route makes (a typo, the wrong case, an `off` route's resource)
  // would protect nothing while the caller believes it fenced the real resource.
  bool off = false;
  const config::Route* owner = snap->router.owner_of(resource, &off);
  if (!owner)
    co_return problem(404, "unfenced-resource", "Not a fenced resource",
                      "no enforce or observe route makes resource \"" + resource + "\" (" +
                          (off ? "its route is off" : "no route names it") + "): a barrier on it would protect nothing",
                      {{"resource", resource}});
  PresentedToken token;
  token.state = TokenState::ok;
  token.generation = g;
  token.leader = leader;
  boost::system::error_code ig;
  auto ep = sock_.remote_endpoint(ig);
  const std::string client = ig ? std::string() : ep.address().to_string();
  AdmissionInput in;
  in.kind = AdmissionKind::barrier;
  in.mode = owner->mode;
  in.resource = &resource;
  in.token = &token;
  in.request = &h;  // a POST (route() takes no other here)
  in.client = client;
  in.token_header = cfg.token_header;
  // A resource bound to an election authority only advances to its current leader's generation:
  // the barrier must not become a way around the authority (a forged or stale token). A refusal
  // the watch may not have caught up with yet is confirmed with etcd first (on its own thread).
  AuthorityCheck ac;
  if (Authority* au = rt.authorities ? rt.authorities->for_route(*owner) : nullptr) {
    ac = au->check(g);
    if (ac.verdict == AuthorityVerdict::not_leader || ac.verdict == AuthorityVerdict::unknown_generation)
      ac = co_await net::co_spawn(admin_.confirms, confirm_on_thread(au, g), use_awaitable);  // asks etcd
    in.authority = &ac;
    in.election = owner->authority->election;
  }
  Admission a = decide_admission(in, rt.fence);
  InflightNode node;
  Decision d;
  if (a.step == AdmissionStep::ask_fence) {
    d = co_await advance(resource, g, leader, owner->mode == config::Mode::observe ? nullptr : &node);
    in.fence = &d;
    a = decide_admission(in, rt.fence);
  }
  if (a.step == AdmissionStep::forward) {
    rt.fence.release(&node);  // (a no-op in observe mode: nothing was linked)
    log::info("fenced", {log::kv("resource", resource), log::kv("generation", d.current), log::kv("leader", leader)});
    Reply ok = json_reply(200, {{"resource", resource}, {"generation", d.current}, {"leader", leader}});
    ok.extra_headers = "Fencing-Generation: " + std::to_string(d.current) + "\r\n";
    co_return ok;
  }
  // Refused. A stale barrier is audited durably before it is answered, as a stale write is.
  if (a.audit && a.audit_durable) {
    a.audit->traceparent = traceparent_of(h);
    store::Status st = co_await audit_sync(std::move(*a.audit));
    if (!st.ok()) audit_failed(a, st);
  }
  if (a.audit_durable || a.outcome == Outcome::too_many_resources) rt.metrics.count(resource, *a.outcome);
  if (in.fence && a.outcome == Outcome::too_many_resources)
    log::warn("rejected fence: the fence holds max_resources resources",
              {log::kv("resource", resource), log::kv("max_resources", cfg.max_resources)});
  else if (in.fence && a.audit_durable)
    log::warn("rejected fence", {log::kv("resource", resource), log::kv("presented_generation", g),
                                 log::kv("current_generation", a.current), log::kv("leader", leader)});
  else if (!in.fence && ac.verdict != AuthorityVerdict::unavailable)
    log::warn("rejected fence", {log::kv("resource", resource), log::kv("presented_generation", g),
                                 log::kv("decision", to_string(ac.verdict)), log::kv("leader", leader)});
  Reply refused = problem(a.refusal);
  if (in.fence && a.refusal.status == 409)
    refused.extra_headers = "Fencing-Generation: " + std::to_string(*a.generation) + "\r\n";
  co_return refused;
}

// DELETE /v1/resources/{id}?confirm={id}: the resource's fence is removed from memory and then
// durably from the store, and the removal is audited (resource_deleted, with the generation it
// had). Older generations are acceptable again afterwards. Refused with 409 while anything is under
// way for the resource (a write in flight or parked, an advance): the caller retries once it is
// quiet, and no write admitted under the old generation is left running unfenced.
awaitable<Reply> AdminSession::delete_resource(const std::string& resource, const std::map<std::string, std::string>& q,
                                               const RequestHead& h) {
  Runtime& rt = admin_.rt;
  auto confirm = q.find("confirm");
  if (confirm == q.end() || confirm->second != resource)
    co_return problem(400, "confirm-required", "Confirmation required",
                      "deleting a resource's fence lets older generations through again: repeat its name as "
                      "?confirm=" +
                          resource,
                      {{"resource", resource}});
  std::int64_t generation = 0;
  switch (rt.fence.remove(resource, &generation)) {
    case Fence::Removal::unknown:
      co_return problem(404, "unknown-resource", "Unknown resource",
                        "the fence holds no generation for resource \"" + resource + "\"", {{"resource", resource}});
    case Fence::Removal::busy:
      co_return problem(409, "resource-busy", "Resource busy",
                        "writes of resource \"" + resource +
                            "\" are in flight or an advance is under way: nothing was deleted; retry when it is quiet",
                        {{"resource", resource}});
    case Fence::Removal::removed: break;
  }
  auto result = std::make_shared<PostedResult<store::Status>>(admin_.ioc);
  rt.store.remove(resource,
                  [result](store::Status st) { PostedResult<store::Status>::deliver(result, std::move(st)); });
  store::Status st = co_await result->wait();
  if (!st.ok()) {
    rt.fence.restore(resource, generation);
    co_return problem(503, "store-unavailable", "Fence store unavailable",
                      "the resource could not be removed from the store: " + st.message() + "; nothing was deleted",
                      {{"resource", resource}});
  }
  boost::system::error_code ig;
  auto ep = sock_.remote_endpoint(ig);
  store::AuditRow row;
  row.resource = resource;
  row.decision = "resource_deleted";
  row.current_generation = generation;
  row.method = std::string(h.method);
  row.target = clipped(h.target, 2048);
  row.client = ig ? std::string() : ep.address().to_string();
  row.mode = mode_of(rt.snapshot()->router, resource);
  row.user_agent = clipped(h.user_agent(), 512);
  row.traceparent = traceparent_of(h);
  const std::string client = row.client;  // the row is moved into the store below
  if (store::Status ast = co_await audit_sync(std::move(row)); !ast.ok())
    log::warn("resource deleted, but its audit row could not be made durable",
              {log::kv("resource", resource), log::kv("why", ast.message())});
  log::warn("resource deleted: older generations are acceptable again",
            {log::kv("resource", resource), log::kv("generation", generation), log::kv("client", client)});
  co_return json_reply(200, {{"resource", resource}, {"deleted", true}, {"generation", generation}});
}

// Advances the fence exactly as a write would, then lets go (the caller releases `node`): in
// enforce mode (node given) drains older in-flight writes and commits durably; in observe mode
// commits durably without draining (observe mode stops and waits for nothing: its writes keep
// coming, and a barrier waiting for them would never end).
awaitable<Decision> AdminSession::advance(const std::string& resource, std::int64_t g, const std::string& leader,
                                          InflightNode* node) {
  Runtime& rt = admin_.rt;
  auto result = std::make_shared<PostedResult<Decision>>(admin_.ioc);
  auto deliver = [result](Decision dd) { PostedResult<Decision>::deliver(result, dd); };
  Decision d;
  const bool now = node ? rt.fence.admit(resource, g, leader, node, &d, deliver)
                        : rt.fence.observe(resource, g, leader, &d, deliver);
  if (now) co_return d;
  co_return co_await result->wait();
}

// Appends an audit row and waits until it is durable (or failed).
awaitable<store::Status> AdminSession::audit_sync(store::AuditRow row) {
  auto result = std::make_shared<PostedResult<store::Status>>(admin_.ioc);
  admin_.rt.store.append_audit(std::move(row), [result](store::Status st) {
    PostedResult<store::Status>::deliver(result, std::move(st));
  });
  co_return co_await result->wait();
}

}  // namespace fencegate::proxy::admin_detail
