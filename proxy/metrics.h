// Metrics: counters, gauges and histograms rendered as Prometheus text (fencegate_ prefix).
//
// Per-resource label values are bounded: the first `max_resource_labels` distinct resources get
// their own label; the rest are aggregated under resource="_other", so a flood of path-template
// resources cannot grow the metric set without limit.
//
// Thread-safety: all methods are thread-safe. Counting is lock-free once a resource's counters
// exist (one shared-lock map lookup per request).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>
#include <utility>

namespace fencegate::proxy {

enum class Outcome : int {
  forwarded = 0,
  rejected_stale,
  rejected_missing,
  rejected_malformed,
  would_reject_stale,
  would_reject_missing,
  would_reject_malformed,
  store_error,
  upstream_error,
  // Authority-linked fencing (proxy/authority.h).
  rejected_not_leader,          // 409: the generation's leader key is gone, or it is a waiting candidate
  rejected_unknown_generation,  // 409: not the creation revision of any election key seen
  would_reject_not_leader,
  would_reject_unknown_generation,
  authority_unavailable,        // 503: etcd unreachable for longer than the leader's lease TTL (or grace)
  // A resource the fence could not take on: it holds max_resources already. Enforce: 503
  // too-many-resources; observe: forwarded untracked (and counted as forwarded too).
  too_many_resources,
  // A route with "new_resources": "fenced_only": a write to a resource never fenced (409
  // resource-not-fenced; observe: forwarded, nothing created).
  rejected_unfenced_resource,
  would_reject_unfenced_resource,
  // TLS (issue 27): 403 client-not-allowed (the route's allowed_clients).
  rejected_client_not_allowed,
  kCount
};
std::string_view to_string(Outcome o);

// Issue 30 (idempotency): fencegate_idempotency_total{resource,outcome}.
enum class IdemOutcome : int { stored = 0, replayed, mismatch, in_flight, unknown, released, would_replay, kCount };
std::string_view to_string(IdemOutcome o);

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);  // upper bounds, ascending, in seconds
  void observe(double seconds);
  // Appends the Prometheus lines for `name` (with optional extra labels "k=\"v\"").
  void render(std::string& out, std::string_view name, std::string_view labels = {}) const;

 private:
  const std::vector<double> bounds_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> counts_;  // bounds_.size() + 1 (+Inf)
  std::atomic<std::uint64_t> sum_ns_{0};
};

struct ResourceCounters {
  std::array<std::atomic<std::uint64_t>, static_cast<int>(Outcome::kCount)> by_outcome{};
  std::array<std::atomic<std::uint64_t>, static_cast<int>(IdemOutcome::kCount)> idem{};  // issue 30
};

class Metrics {
 public:
  explicit Metrics(std::size_t max_resource_labels = 1000);

  // Counters of `resource` (or of "_other" once the label cap is reached). Never null.
  ResourceCounters* resource(std::string_view name);
  void count(std::string_view name, Outcome o) {
    resource(name)->by_outcome[static_cast<int>(o)].fetch_add(1, std::memory_order_relaxed);
  }

  Histogram drain_wait{{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30}};
  Histogram upstream_latency{{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}};
  Histogram store_commit{{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1}};
  std::atomic<std::int64_t> open_connections{0};
  std::atomic<std::uint64_t> connections_refused_per_client{0};  // closed at accept: max_connections_per_client
  std::atomic<std::uint64_t> store_commit_failures{0};
  std::atomic<std::uint64_t> reloads{0};
  std::atomic<std::uint64_t> reload_failures{0};
  std::atomic<std::uint64_t> admin_unauthorized{0};  // admin requests refused for a missing or wrong token
  std::atomic<std::uint64_t> forwarded_dropped{0};   // client Forwarded values dropped as not RFC 7239
  // TLS (issue 27): failed handshakes on the data listener, by reason (kTlsFailureReasons).
  static constexpr std::array<std::string_view, 8> kTlsFailureReasons = {
      "timeout",  "plaintext_http", "no_client_certificate", "unknown_ca", "certificate_expired", "certificate_invalid",
      "protocol", "other"};
  std::array<std::atomic<std::uint64_t>, kTlsFailureReasons.size()> tls_handshake_failures{};
  // The admin listener's own (admin.tls), by the same reasons.
  std::array<std::atomic<std::uint64_t>, kTlsFailureReasons.size()> admin_tls_handshake_failures{};
  // The index of `reason` in kTlsFailureReasons ("other" for one not listed).
  static std::size_t tls_failure_index(std::string_view reason) {
    std::size_t i = 0;
    while (i + 1 < kTlsFailureReasons.size() && kTlsFailureReasons[i] != reason) ++i;
    return i;
  }
  void count_tls_failure(std::string_view reason) {
    tls_handshake_failures[tls_failure_index(reason)].fetch_add(1, std::memory_order_relaxed);
  }
  void count_admin_tls_failure(std::string_view reason) {
    admin_tls_handshake_failures[tls_failure_index(reason)].fetch_add(1, std::memory_order_relaxed);
  }

  // TLS to the upstream (issue 27): failed upstream handshakes, by reason class
  // (fencegate_upstream_tls_failures_total{reason}; upstream_tls_failure() in tls_upstream.h).
  static constexpr std::array<std::string_view, 6> kUpstreamTlsFailureReasons = {"unknown-ca", "name-mismatch",
                                                                                 "expired",    "certificate-invalid",
                                                                                 "timeout",    "handshake-failed"};
  std::array<std::atomic<std::uint64_t>, kUpstreamTlsFailureReasons.size()> upstream_tls_failures{};
  void count_upstream_tls_failure(std::string_view reason) {
    std::size_t i = 0;
    while (i + 1 < kUpstreamTlsFailureReasons.size() && kUpstreamTlsFailureReasons[i] != reason) ++i;
    upstream_tls_failures[i].fetch_add(1, std::memory_order_relaxed);
  }

  void count(std::string_view name, IdemOutcome o) {  // issue 30
    resource(name)->idem[static_cast<int>(o)].fetch_add(1, std::memory_order_relaxed);
  }

  // Renders the counters and histograms held here. Gauges owned elsewhere (generations, queue
  // depth) are appended by the caller.
  void render(std::string& out) const;

  // True iff `resource` has its own label (for rendering per-resource gauges under the cap).
  bool has_label(std::string_view resource) const;

  // The operator's view (GET /v1/resources, the status page): a labelled resource's requests so far,
  // as `writes` (every request the fence decided on) and `refusals` (refused or would-be refused
  // by the fence: rejected_* and would_reject_*). False for a resource without a label of its own.
  bool totals(std::string_view resource, std::uint64_t* writes, std::uint64_t* refusals) const;

 private:
  const std::size_t max_labels_;
  mutable std::shared_mutex mu_;
  std::map<std::string, std::unique_ptr<ResourceCounters>, std::less<>> resources_;  // Guarded by mu_
  ResourceCounters other_;
};

// Issue 30: the fencegate_idempotency_keys{resource} gauge (live keys per resource, as the store
// counts them), at most 1000 series.
void render_idempotency_keys(std::string& out, const std::vector<std::pair<std::string, std::int64_t>>& counts);
// Issue 30: the fencegate_idempotency_bytes{resource} gauge (response bytes kept for replay).
void render_idempotency_bytes(std::string& out, const std::vector<std::pair<std::string, std::int64_t>>& bytes);

// Escapes a Prometheus label value.
std::string prom_escape(std::string_view v);

}  // namespace fencegate::proxy
