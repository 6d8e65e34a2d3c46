// Admission: the fence decision as a value (see admission.h for the contract).
#include "proxy/admission.h"

#include <algorithm>

#include "proxy/authority.h"
#include "proxy/token.h"

namespace fencegate::proxy {

void read_token(const RequestHead& head, const config::Config& cfg, PresentedToken* out) {
  std::string_view tv, lv;
  std::size_t nt = 0, nl = 0;
  if (cfg.token_header == "Fencing-Token" && cfg.leader_header == "Fencing-Leader") {
    // The default names: the scanner has marked these fields already.
    if (head.has(FieldKind::fencing_token) || head.has(FieldKind::fencing_leader))
      for (const auto& f : head.fields) {
        if (f.kind == FieldKind::fencing_token && nt++ == 0) tv = f.value;
        if (f.kind == FieldKind::fencing_leader && nl++ == 0) lv = f.value;
      }
  } else {
    nt = head.count(cfg.token_header, &tv);
    nl = head.count(cfg.leader_header, &lv);
  }
  out->state = TokenState::ok;
  out->generation = 0;
  out->why.clear();
  if (nt == 0) {
    out->state = TokenState::missing;
  } else if (nt > 1) {
    out->state = TokenState::malformed;
    out->why = "several " + cfg.token_header + " headers";
  } else if (auto t = parse_token(tv)) {
    out->generation = *t;
  } else {
    out->state = TokenState::malformed;
    out->why =
        cfg.token_header + " must be a decimal integer in 1..9223372036854775807 without sign, leading zeros or spaces";
  }
  if (out->state == TokenState::ok && (nl > 1 || lv.size() > cfg.max_leader_bytes)) {
    out->state = TokenState::malformed;
    out->why = nl > 1 ? "several " + cfg.leader_header + " headers"
                      : cfg.leader_header + " is longer than " + std::to_string(cfg.max_leader_bytes) + " bytes";
  }
  out->leader = clipped(lv, cfg.max_leader_bytes);
}

namespace {

// A 503 refusal: the fence, the store or the election authority cannot decide now, so the write
// is refused (fail closed) and nothing is forwarded.
Problem unavailable(const char* type, const char* title, std::string detail, std::string resource,
                    std::optional<std::int64_t> presented, std::optional<std::int64_t> current) {
  return Problem{503, type, title, std::move(detail), std::move(resource), presented, current};
}

store::AuditRow audit_row(const AdmissionInput& in, std::string decision, std::int64_t current) {
  store::AuditRow row;
  row.resource = *in.resource;
  row.decision = std::move(decision);
  row.presented_generation = in.token->generation;
  row.current_generation = current;
  row.method = std::string(in.request->method);
  row.target = clipped(in.request->target, 2048);
  row.client = std::string(in.client);
  row.leader = in.token->leader;
  row.mode = in.mode == config::Mode::enforce ? "enforce" : "observe";
  row.user_agent = clipped(in.request->user_agent(), 512);
  return row;
}

// A refusal (refuses) or what enforce would have refused, forwarded (observe mode's writes).
// `decision_suffix`: "stale", "missing", ...; `current`: the generation the row and the problem name.
void reject(const AdmissionInput& in, bool refuses, std::string_view decision_suffix, Outcome rejected, Outcome would,
            std::int64_t current, Problem problem, Admission* a) {
  const std::string suffix(decision_suffix);
  a->current = current;
  if (refuses) {
    a->step = AdmissionStep::refuse;
    a->outcome = rejected;
    a->audit = audit_row(in, "rejected_" + suffix, current);
    a->audit_durable = true;
    a->refusal = std::move(problem);
    return;
  }
  a->step = AdmissionStep::forward;
  a->outcome = would;
  a->audit = audit_row(in, "would_reject_" + suffix, current);
  a->observe = "would_reject_" + suffix;
}

// The token is missing or malformed.
Admission decide_bad_token(const AdmissionInput& in, bool refuses, std::int64_t current) {
  Admission a;
  a.generation = current;
  const std::string& resource = *in.resource;
  if (in.token->state == TokenState::missing)
    reject(in, refuses, "missing", Outcome::rejected_missing, Outcome::would_reject_missing, current,
           Problem{428, "token-required", "Fencing token required",
                   "writes to this resource need a " + std::string(in.token_header) + " header", resource, std::nullopt,
                   current},
           &a);
  else
    reject(in, refuses, "malformed", Outcome::rejected_malformed, Outcome::would_reject_malformed, current,
           Problem{400, "malformed-token", "Malformed fencing token", in.token->why, resource, std::nullopt, current},
           &a);
  return a;
}

// The route's election authority says the generation does not lead (or cannot be asked).
Admission decide_by_authority(const AdmissionInput& in, bool refuses, std::int64_t current) {
  const AuthorityCheck& ac = *in.authority;
  const std::int64_t g = in.token->generation;
  const std::string& resource = *in.resource;
  const std::string election(in.election);
  Admission a;
  if (ac.verdict == AuthorityVerdict::unavailable) {  // refused: fail closed, not audited
    a.step = AdmissionStep::refuse;
    a.generation = current;
    a.outcome = Outcome::authority_unavailable;
    a.refusal = unavailable("authority-unavailable", "Election authority unavailable",
                            ac.why + "; nothing was forwarded", resource, g, current);
    return a;
  }
  const std::int64_t newest = std::max(current, ac.leader);
  const std::string gs = std::to_string(g), ls = std::to_string(ac.leader);
  std::string suffix, type, title, detail;
  Outcome rejected = Outcome::rejected_stale, would = Outcome::would_reject_stale;
  switch (ac.verdict) {
    case AuthorityVerdict::stale:
      suffix = "stale", type = "stale-generation", title = "Stale fencing token";
      detail = "generation " + gs + " is older than generation " + ls + " of the current leader of election " +
               election + " (resource " + resource + ")";
      break;
    case AuthorityVerdict::not_leader:
      suffix = "not_leader", type = "not-leader", title = "Not the leader";
      rejected = Outcome::rejected_not_leader, would = Outcome::would_reject_not_leader;
      detail = ac.leader ? "generation " + gs + " is not the leader of election " + election +
                               " (a candidate still waiting, or a former leader); the leader's generation is " + ls
                         : "generation " + gs + " no longer leads election " + election +
                               " (its key is gone: resigned or lease expired) and no successor is elected yet";
      break;
    default:
      suffix = "unknown_generation", type = "unknown-generation", title = "Unknown fencing token";
      rejected = Outcome::rejected_unknown_generation, would = Outcome::would_reject_unknown_generation;
      detail = "generation " + gs + " is not the creation revision of any key of election " + election +
               " (forged, or from another election or etcd cluster)";
      break;
  }
  // Observe: forwarded, but the fence is never advanced to a generation etcd says does not lead.
  a.generation = refuses ? newest : current;
  reject(in, refuses, suffix, rejected, would, newest, Problem{409, type, title, detail, resource, g, newest}, &a);
  // A barrier refused by its authority advanced nothing and is not audited.
  if (in.kind == AdmissionKind::barrier) {
    a.audit.reset();
    a.audit_durable = false;
  }
  return a;
}

// The fence has decided.
Admission decide_by_fence(const AdmissionInput& in, bool refuses) {
  const Decision& d = *in.fence;
  const std::int64_t g = in.token->generation;
  const std::string& resource = *in.resource;
  Admission a;
  a.generation = d.current;
  // A barrier in observe mode does not pass as what enforce would have refused: it is refused.
  const bool stale = d.verdict == Verdict::stale || (d.verdict == Verdict::admit && d.observe_stale && refuses);
  if (stale) {
    // The refusal names the generation that superseded it, in the header as in the body (it may
    // still be committing; the request is refused either way).
    a.generation = d.newest;
    reject(in, true, "stale", Outcome::rejected_stale, Outcome::would_reject_stale, d.newest,
           Problem{409, "stale-generation", "Stale fencing token",
                   "generation " + std::to_string(g) + " is older than generation " + std::to_string(d.newest) +
                       " of resource " + resource,
                   resource, g, d.newest},
           &a);
    return a;
  }
  switch (d.verdict) {
    case Verdict::admit:
      if (d.observe_stale) {
        a.outcome = Outcome::would_reject_stale;
        a.current = d.newest;
        a.audit = audit_row(in, "would_reject_stale", d.newest);
        a.observe = "would_reject_stale";
      }
      return a;
    case Verdict::store_error:
      // Observe mode forwards it all the same; the fence retries the generation until stored.
      a.outcome = Outcome::store_error;
      a.current = d.current;
      if (refuses && d.fleet_unavailable) {  // fleet: this replica is not a member (docs/fleet.md)
        a.step = AdmissionStep::refuse;
        a.refusal = unavailable("fleet-unavailable", "Fleet membership unavailable",
                                "this replica cannot show it is still a member of its fleet (etcd lease not "
                                "renewed in time); nothing was forwarded",
                                resource, g, d.current);
      } else if (refuses) {
        a.step = AdmissionStep::refuse;
        a.refusal =
            unavailable("store-unavailable", "Fence store unavailable",
                        "the new generation could not be made durable; nothing was forwarded", resource, g, d.current);
      }
      return a;
    case Verdict::overloaded:
      // Observe rejects nothing: the write goes on, but its generation is not tracked.
      a.outcome = Outcome::too_many_resources;
      if (refuses) {
        a.step = AdmissionStep::refuse;
        a.refusal = unavailable("too-many-resources", "Too many resources",
                                "the fence holds its maximum number of resources (max_resources, or the route's own)",
                                resource, g, std::nullopt);
      }
      return a;
    case Verdict::unfenced:
      // Observe mode forwards it as what enforce would refuse, but creates nothing either.
      reject(in, refuses, "unfenced_resource", Outcome::rejected_unfenced_resource,
             Outcome::would_reject_unfenced_resource, 0,
             Problem{409, "resource-not-fenced", "Resource not fenced",
                     "resource " + resource +
                         " has never been fenced, and its route creates resources only through the admin fence "
                         "endpoint (new_resources: fenced_only); nothing was stored",
                     resource, g, 0},
             &a);
      return a;
    case Verdict::stale: break;  // above
  }
  return a;
}

}  // namespace

bool may_create_resource(const AdmissionInput& in) {
  return !in.fenced_only || in.kind == AdmissionKind::barrier ||
         (in.authority && in.authority->verdict == AuthorityVerdict::leader);
}

Admission decide_admission(const AdmissionInput& in, Fence& fence) {
  const bool refuses = in.kind == AdmissionKind::barrier || in.mode == config::Mode::enforce;
  if (in.token->state != TokenState::ok) return decide_bad_token(in, refuses, fence.current(*in.resource));
  if (in.fence) return decide_by_fence(in, refuses);
  if (const AuthorityCheck* ac = in.authority; ac && ac->verdict != AuthorityVerdict::leader) {
    // Observe mode with etcd out of reach: a write is forwarded and the fence is left alone. No
    // election confirms this token, and advancing to it would keep a forged 2^63-1 in the fence
    // for good once the route is switched to enforce.
    if (ac->verdict == AuthorityVerdict::unavailable && !refuses) {
      Admission a;
      a.generation = fence.current(*in.resource);
      return a;
    }
    return decide_by_authority(in, refuses, fence.current(*in.resource));
  }
  Admission a;
  a.step = AdmissionStep::ask_fence;
  return a;
}

Admission client_not_allowed(const AdmissionInput& in, std::string_view identity) {
  Admission a;
  a.step = AdmissionStep::refuse;
  a.outcome = Outcome::rejected_client_not_allowed;
  a.audit = audit_row(in, "rejected_client_not_allowed", 0);
  a.audit_durable = true;
  const std::string who = identity.empty() ? std::string("a client without a verified certificate")
                                           : "client " + std::string(clipped(identity, 256));
  a.refusal = Problem{403,
                      "client-not-allowed",
                      "Client not allowed",
                      who + " may not use this route (allowed_clients); nothing was forwarded",
                      *in.resource,
                      std::nullopt,
                      std::nullopt};
  return a;
}

void audit_failed(Admission& a, const store::Status& st) {
  a.outcome = Outcome::store_error;
  a.step = AdmissionStep::refuse;
  Problem& p = a.refusal;
  p = unavailable("store-unavailable", "Fence store unavailable",
                  "the audit row could not be made durable: " + st.message(), std::move(p.resource), p.presented,
                  p.current);
}

}  // namespace fencegate::proxy
