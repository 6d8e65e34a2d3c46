// Admission: THE fence decision for one fenced request, for both its callers: a write on the data
// path (proxy/session.cpp) and a barrier from the admin API's fence endpoint (proxy/admin.cpp).
// A function over plain values that returns a value; it neither waits, nor writes, nor logs. The
// caller asks the fence when the decision says so (ask_fence: the fence's answer may have to wait
// for an advance), calls again with the fence's Decision, and then does what the result says:
// append the audit row (durably first, for a refusal), count and log the outcome, and forward or
// refuse.
//
// Where the fence's guarantees are enforced: a write is forwarded only if the token is valid, the
// route's election authority (if any) says its generation leads, and the Fence admitted it
// (Fence::admit links it in flight, so a newer generation drains it). Every refusal in enforce
// mode is audited durably before it is answered; if the row cannot be made durable the request
// fails closed (503).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "config/config.h"
#include "fence_store/store.h"
#include "proxy/fence.h"
#include "proxy/head.h"
#include "proxy/local_reply.h"
#include "proxy/metrics.h"

namespace fencegate::proxy {

struct AuthorityCheck;

enum class TokenState { ok, missing, malformed };

// The generation and leader a request presents.
struct PresentedToken {
  TokenState state = TokenState::missing;
  std::int64_t generation = 0;  // iff ok
  std::string leader;           // the leader header's value, clipped to max_leader_bytes ("" if none)
  std::string why;              // iff malformed
};

// Reads the token and leader headers of a data-path request (exactly one token, a canonical
// decimal; at most one leader, at most max_leader_bytes).
void read_token(const RequestHead& head, const config::Config& cfg, PresentedToken* out);

enum class AdmissionKind {
  write,    // a request to forward: observe mode refuses nothing (what enforce would refuse is
            // forwarded, audited as would_reject_* and marked Fencing-Observe)
  barrier,  // the fence endpoint's activation barrier: it forwards nothing, so a refusal stands
            // in observe mode too (an authority's refusal is not audited: it advanced nothing)
};

struct AdmissionInput {
  AdmissionKind kind = AdmissionKind::write;
  config::Mode mode = config::Mode::enforce;  // of the route that owns the resource: enforce or observe
  // The route's "new_resources" is "fenced_only": a write may not create the resource (see
  // may_create_resource()).
  bool fenced_only = false;
  const std::string* resource = nullptr;      // REQUIRES: set
  const PresentedToken* token = nullptr;      // REQUIRES: set
  // The verdict of the route's election authority on the token's generation (nullptr: the route
  // has none, or the token is not valid), and that election's name.
  const AuthorityCheck* authority = nullptr;
  std::string_view election;
  // The fence's decision, once asked (the answer to ask_fence); nullptr before.
  const Decision* fence = nullptr;
  // The request, for audit rows (its method, target and User-Agent) and details.
  const RequestHead* request = nullptr;  // REQUIRES: set
  std::string_view client;
  std::string_view token_header;
};

enum class AdmissionStep {
  ask_fence,  // ask the Fence (admit in enforce, observe in observe mode) and decide again with its Decision
  forward,    // go on (a write: forward it; a barrier: it is in place)
  refuse,     // answer `refusal`
};

struct Admission {
  AdmissionStep step = AdmissionStep::forward;
  std::optional<std::int64_t> generation;  // Fencing-Generation of the answer
  std::string observe;                     // Fencing-Observe: the refusal enforce would have made
  std::optional<Outcome> outcome;          // to count (and log) for the resource
  std::int64_t current = 0;                // the generation the refusal (or would-be refusal) names
  std::optional<store::AuditRow> audit;    // to append
  bool audit_durable = false;  // the refusal is answered only once the row is durable (else audit_failed())
  Problem refusal{0, {}, {}, {}};  // iff step == refuse
};

// Whether this request may create its resource (hold it in the fence, store its first
// generation): always on an on_write route; on a fenced_only route only a barrier (the admin fence
// endpoint) or a write whose generation the route's election authority confirms as leader. Pass
// it to the Fence (admit/observe/decide_now/find) when asking it: a write that may not is decided
// Verdict::unfenced, refused with 409 resource-not-fenced (observe: forwarded, audited
// would_reject_unfenced_resource), and creates nothing in memory or in the store.
bool may_create_resource(const AdmissionInput& in);

// The decision. Calls fence.current() (one lock) only on the paths that do not ask the fence.
Admission decide_admission(const AdmissionInput& in, Fence& fence);

// TLS (issue 27): the refusal of a request on a route whose allowed_clients do not list the
// verified client identity (`identity`, "" without a client certificate): 403 client-not-allowed
// and an audit row rejected_client_not_allowed to make durable before answering, in any mode
// (an authorization, not a fence decision). Made before the fence is asked.
Admission client_not_allowed(const AdmissionInput& in, std::string_view identity);

// A refusal's audit row could not be made durable: the request fails closed with 503
// store-unavailable, counted as a store error.
void audit_failed(Admission& a, const store::Status& st);

}  // namespace fencegate::proxy
