// History checker: the fencing contract (docs/contract.md, "The contract", "Guarantees") as properties of a
// recorded history. Pure: no I/O, no clocks read, no threads; feed it what a run recorded.
//
// A history is what the clients sent and got back, what the recording upstream received, the audit
// rows in the fence database and the stored generations sampled around restarts. Every request
// carries a unique op id (the fault schedules put it in the path, `/r/<resource>/<op id>`, which
// the upstream records and the audit row keeps as `target`), so client ops, upstream ops and audit
// rows are matched 1:1 by op id.
//
// Properties, per resource (check() names them by these keys):
//   "1-order"     forwarded writes, in upstream arrival order, have non-decreasing generations
//                 (across restarts too: the stored generation survives kill -9).
//   "2-overlap"   no upstream exchange of a lower generation is still running when one of a higher
//                 generation starts (lower.completion <= higher.arrival).
//   "3-match"     every 2xx a client saw matches exactly one upstream request; every upstream request
//                 matches exactly one client op (nothing invented, nothing duplicated), with the
//                 resource and generation the client sent; a local rejection (400/409/428/503)
//                 matches none. Anything else (no response, 502, 504, ...) is indeterminate: 0 or 1.
//   "4-audit"     every 409/428 (and 400 for a malformed token) a client saw has its audit row with
//                 the matching decision; no op is both audited as rejected and forwarded; no audit
//                 row names an op nobody sent.
//   "5-stored"    per resource, sampled stored generations never decrease (sample order), and each
//                 sample is >= every generation that arrived upstream before the sample was taken
//                 (an advance is durable before the write is forwarded).
//   "0-history"   the history itself is malformed (duplicate client op id): a harness bug.
//
// Timestamps: RecordingUpstream's, which are causally safe for responded exchanges and for ones
// the upstream ended itself (reset/close): see tests/support/upstream.h. When the *peer* (the proxy)
// ended an exchange (drain abort, kill -9), the upstream only notices it a little later, so its
// completion is an upper bound; Options::peer_abort_slack allows for that scheduling delay.
//
// Thread-safety: check() is a pure function; call it from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace fencegate::fault {

using Clock = std::chrono::steady_clock;

// How the client presented its token.
enum class Token { valid, missing, malformed };

// One request a client sent, and what came back.
struct ClientOp {
  std::string op_id;             // unique per history
  std::string resource;          // the resource the path routes to
  std::string leader;            // Fencing-Leader sent ("" if none); for traces
  std::int64_t generation = 0;   // Fencing-Token sent (meaningful when token == valid)
  Token token = Token::valid;
  bool write = true;             // a fenced method; reads are only matched (property 3)
  Clock::time_point sent{}, done{};
  int status = 0;                // HTTP status; 0 = no response (reset, closed, timeout, proxy killed)
  std::string error;             // why there was no response, for traces
};

// One request the upstream received (a RecordedRequest, reduced).
struct UpstreamOp {
  std::string op_id;             // from the target; "" if the target carried none
  std::string resource;
  std::int64_t generation = 0;   // Fencing-Token as forwarded (0 if absent / not a number)
  Clock::time_point arrival{}, completion{};
  std::string outcome;           // upstream.h Outcome names: responded, aborted_by_peer, write_failed,
                                 // reset, closed, stopped, pending
};

// One audit row (store::AuditRow, reduced). op_id is taken from the row's target.
struct AuditFact {
  std::string op_id;
  std::string resource;
  std::string decision;          // rejected_stale, rejected_missing, rejected_malformed, ...
  std::int64_t presented = 0;
  std::int64_t current = 0;
};

// The stored generation of a resource read from the database (proxy stopped, killed or running).
struct StoredSample {
  std::string resource;
  std::int64_t generation = 0;
  int epoch = 0;                 // how many times fencegate had been (re)started when sampled
  Clock::time_point at{};        // when it was read
};

// Something the schedule did (fault injected), only for traces: shown when it falls between the
// first and last timestamp of the ops in a violation.
struct Event {
  Clock::time_point at{};
  std::string what;              // "SIGSTOP fencegate", "kill -9 fencegate", ...
};

struct History {
  std::vector<ClientOp> client;
  std::vector<UpstreamOp> upstream;
  std::vector<AuditFact> audit;
  std::vector<StoredSample> stored;   // in the order they were taken
  std::vector<Event> events;
};

struct Violation {
  std::string property;          // "1-order", "2-overlap", "3-match", "4-audit", "5-stored", "0-history"
  std::string resource;
  std::string trace;             // minimal readable trace: only the ops (and faults) involved
};

struct Options {
  // Allowance on the completion time of an exchange the peer ended (outcome aborted_by_peer or
  // write_failed): the upstream noticed the close after it happened.
  std::chrono::milliseconds peer_abort_slack{250};
  // At most this many violations are reported per (property, resource); the rest are counted in
  // one extra Violation ("... and N more").
  int max_per_kind = 3;
};

// Returns every violation of the properties above; empty iff the history satisfies the contract.
std::vector<Violation> check(const History& h, const Options& options = {});

// "property [resource]:\n<trace>" for each violation, for failure messages.
std::string describe(const std::vector<Violation>& v);

// For traces and schedules: "/r/<resource>/<op id>" and its inverse (false if `target` is not
// of that form).
std::string op_target(const std::string& resource, const std::string& op_id);
bool parse_op_target(const std::string& target, std::string* resource, std::string* op_id);

}  // namespace fencegate::fault
