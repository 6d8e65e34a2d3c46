#include "proxy/metrics.h"

#include <cstdio>
#include <mutex>

namespace fencegate::proxy {

std::string_view to_string(Outcome o) {
  switch (o) {
    case Outcome::forwarded: return "forwarded";
    case Outcome::rejected_stale: return "rejected_stale";
    case Outcome::rejected_missing: return "rejected_missing";
    case Outcome::rejected_malformed: return "rejected_malformed";
    case Outcome::would_reject_stale: return "would_reject_stale";
    case Outcome::would_reject_missing: return "would_reject_missing";
    case Outcome::would_reject_malformed: return "would_reject_malformed";
    case Outcome::store_error: return "store_error";
    case Outcome::upstream_error: return "upstream_error";
    case Outcome::rejected_not_leader: return "rejected_not_leader";
    case Outcome::rejected_unknown_generation: return "rejected_unknown_generation";
    case Outcome::would_reject_not_leader: return "would_reject_not_leader";
    case Outcome::would_reject_unknown_generation: return "would_reject_unknown_generation";
    case Outcome::authority_unavailable: return "authority_unavailable";
    case Outcome::too_many_resources: return "too_many_resources";
    case Outcome::rejected_unfenced_resource: return "rejected_unfenced_resource";
    case Outcome::rejected_client_not_allowed: return "rejected_client_not_allowed";
    case Outcome::would_reject_unfenced_resource: return "would_reject_unfenced_resource";
    case Outcome::kCount: break;
  }
  return "unknown";
}

std::string prom_escape(std::string_view v) {
  std::string o;
  o.reserve(v.size());
  for (char c : v) {
    if (c == '\\') o += "\\\\";
    else if (c == '"') o += "\\\"";
    else if (c == '\n') o += "\\n";
    else o += c;
  }
  return o;
}

static std::string fmt_double(double d) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", d);
  return b;
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(new std::atomic<std::uint64_t>[bounds_.size() + 1]) {
  for (std::size_t i = 0; i <= bounds_.size(); ++i) counts_[i].store(0);
}

void Histogram::observe(double seconds) {
  std::size_t i = 0;
  while (i < bounds_.size() && seconds > bounds_[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<std::uint64_t>(seconds * 1e9), std::memory_order_relaxed);
}

void Histogram::render(std::string& out, std::string_view name, std::string_view labels) const {
  std::string lp = labels.empty() ? std::string() : std::string(labels) + ",";
  std::uint64_t cum = 0;
  for (std::size_t i = 0; i <= bounds_.size(); ++i) {
    cum += counts_[i].load(std::memory_order_relaxed);
    out += name;
    out += "_bucket{" + lp + "le=\"" + (i < bounds_.size() ? fmt_double(bounds_[i]) : std::string("+Inf")) + "\"} " +
           std::to_string(cum) + "\n";
  }
  std::string l = labels.empty() ? std::string() : "{" + std::string(labels) + "}";
  out += std::string(name) + "_sum" + l + " " + fmt_double(sum_ns_.load() / 1e9) + "\n";
  // The +Inf bucket's value: a separate total read apart from the buckets could disagree with it
  // under load, and a scrape must be self-consistent (+Inf == _count).
  out += std::string(name) + "_count" + l + " " + std::to_string(cum) + "\n";
}

Metrics::Metrics(std::size_t max_resource_labels) : max_labels_(max_resource_labels) {}

ResourceCounters* Metrics::resource(std::string_view name) {
  // A resource that is really named "_other" shares the aggregate's series: a label of its own
  // would be the same series twice in the exposition.
  if (name == "_other") return &other_;
  {
    std::shared_lock lk(mu_);
    auto it = resources_.find(name);
    if (it != resources_.end()) return it->second.get();
    if (resources_.size() >= max_labels_) return &other_;
  }
  std::unique_lock lk(mu_);
  auto it = resources_.find(name);
  if (it != resources_.end()) return it->second.get();
  if (resources_.size() >= max_labels_) return &other_;
  auto [ins, _] = resources_.emplace(std::string(name), std::make_unique<ResourceCounters>());
  return ins->second.get();
}

bool Metrics::has_label(std::string_view resource) const {
  std::shared_lock lk(mu_);
  return resources_.find(resource) != resources_.end();
}

std::string_view to_string(IdemOutcome o) {
  switch (o) {
    case IdemOutcome::stored: return "stored";
    case IdemOutcome::replayed: return "replayed";
    case IdemOutcome::mismatch: return "mismatch";
    case IdemOutcome::in_flight: return "in_flight";
    case IdemOutcome::unknown: return "unknown";
    case IdemOutcome::released: return "released";
    case IdemOutcome::would_replay: return "would_replay";
    case IdemOutcome::kCount: break;
  }
  return "unknown";
}

void render_idempotency_keys(std::string& out, const std::vector<std::pair<std::string, std::int64_t>>& counts) {
  out += "# HELP fencegate_idempotency_keys Idempotency keys held per resource (issue 30).\n";
  out += "# TYPE fencegate_idempotency_keys gauge\n";
  std::size_t shown = 0;
  for (const auto& [res, n] : counts) {
    if (shown++ >= 1000) break;
    out += "fencegate_idempotency_keys{resource=\"" + prom_escape(res) + "\"} " + std::to_string(n) + "\n";
  }
}

void render_idempotency_bytes(std::string& out, const std::vector<std::pair<std::string, std::int64_t>>& bytes) {
  out += "# HELP fencegate_idempotency_bytes Response bytes kept for replay per resource (issue 30).\n";
  out += "# TYPE fencegate_idempotency_bytes gauge\n";
  std::size_t shown = 0;
  for (const auto& [res, n] : bytes) {
    if (shown++ >= 1000) break;
    out += "fencegate_idempotency_bytes{resource=\"" + prom_escape(res) + "\"} " + std::to_string(n) + "\n";
  }
}

bool Metrics::totals(std::string_view resource, std::uint64_t* writes, std::uint64_t* refusals) const {
  std::shared_lock lk(mu_);
  auto it = resources_.find(resource);
  if (it == resources_.end()) return false;
  *writes = *refusals = 0;
  for (int i = 0; i < static_cast<int>(Outcome::kCount); ++i) {
    const std::uint64_t v = it->second->by_outcome[i].load(std::memory_order_relaxed);
    *writes += v;
    const std::string_view name = to_string(static_cast<Outcome>(i));
    if (name.starts_with("rejected_") || name.starts_with("would_reject_")) *refusals += v;
  }
  return true;
}

void Metrics::render(std::string& out) const {
  out += "# HELP fencegate_requests_total Requests by resource and fence decision.\n";
  out += "# TYPE fencegate_requests_total counter\n";
  auto emit = [&](const std::string& res, const ResourceCounters& c) {
    for (int i = 0; i < static_cast<int>(Outcome::kCount); ++i) {
      std::uint64_t v = c.by_outcome[i].load(std::memory_order_relaxed);
      if (v == 0) continue;
      out += "fencegate_requests_total{resource=\"" + prom_escape(res) + "\",decision=\"" +
             std::string(to_string(static_cast<Outcome>(i))) + "\"} " + std::to_string(v) + "\n";
    }
  };
  {
    std::shared_lock lk(mu_);
    for (const auto& [name, c] : resources_) emit(name, *c);
  }
  emit("_other", other_);
  // Issue 30: idempotency outcomes.
  out += "# HELP fencegate_idempotency_total Keyed writes by resource and idempotency outcome.\n";
  out += "# TYPE fencegate_idempotency_total counter\n";
  auto emit_idem = [&](const std::string& res, const ResourceCounters& c) {
    for (int i = 0; i < static_cast<int>(IdemOutcome::kCount); ++i) {
      std::uint64_t v = c.idem[i].load(std::memory_order_relaxed);
      if (v == 0) continue;
      out += "fencegate_idempotency_total{resource=\"" + prom_escape(res) + "\",outcome=\"" +
             std::string(to_string(static_cast<IdemOutcome>(i))) + "\"} " + std::to_string(v) + "\n";
    }
  };
  {
    std::shared_lock lk(mu_);
    for (const auto& [name, c] : resources_) emit_idem(name, *c);
  }
  emit_idem("_other", other_);

  out += "# HELP fencegate_drain_wait_seconds Time a newer generation waited for older in-flight writes.\n";
  out += "# TYPE fencegate_drain_wait_seconds histogram\n";
  drain_wait.render(out, "fencegate_drain_wait_seconds");
  out += "# HELP fencegate_upstream_latency_seconds Upstream exchange time (request sent to response complete).\n";
  out += "# TYPE fencegate_upstream_latency_seconds histogram\n";
  upstream_latency.render(out, "fencegate_upstream_latency_seconds");
  out += "# HELP fencegate_store_commit_seconds Store transaction time including fsync.\n";
  out += "# TYPE fencegate_store_commit_seconds histogram\n";
  store_commit.render(out, "fencegate_store_commit_seconds");
  out += "# HELP fencegate_store_commit_failures_total Store batches that failed to commit.\n";
  out += "# TYPE fencegate_store_commit_failures_total counter\n";
  out += "fencegate_store_commit_failures_total " + std::to_string(store_commit_failures.load()) + "\n";
  out += "# HELP fencegate_open_connections Open client connections.\n";
  out += "# TYPE fencegate_open_connections gauge\n";
  out += "fencegate_open_connections " + std::to_string(open_connections.load()) + "\n";
  out +=
      "# HELP fencegate_connections_refused_per_client_total Client connections closed at accept: their address held "
      "max_connections_per_client.\n";
  out += "# TYPE fencegate_connections_refused_per_client_total counter\n";
  out +=
      "fencegate_connections_refused_per_client_total " + std::to_string(connections_refused_per_client.load()) + "\n";
  out += "# HELP fencegate_config_reloads_total Config reloads, by result.\n";
  out += "# TYPE fencegate_config_reloads_total counter\n";
  out += "fencegate_config_reloads_total{result=\"ok\"} " + std::to_string(reloads.load()) + "\n";
  out += "fencegate_config_reloads_total{result=\"rejected\"} " + std::to_string(reload_failures.load()) + "\n";
  out += "# HELP fencegate_admin_unauthorized_total Admin API requests refused for a missing or wrong bearer token.\n";
  out += "# TYPE fencegate_admin_unauthorized_total counter\n";
  out += "fencegate_admin_unauthorized_total " + std::to_string(admin_unauthorized.load()) + "\n";
  out += "# HELP fencegate_forwarded_dropped_total Client Forwarded values dropped as not RFC 7239 syntax.\n";
  out += "# TYPE fencegate_forwarded_dropped_total counter\n";
  out += "fencegate_forwarded_dropped_total " + std::to_string(forwarded_dropped.load()) + "\n";
  // TLS (issue 27)
  out += "# HELP fencegate_tls_handshake_failures_total Failed TLS handshakes on the data listener, by reason.\n";
  out += "# TYPE fencegate_tls_handshake_failures_total counter\n";
  for (std::size_t i = 0; i < kTlsFailureReasons.size(); ++i)
    out += "fencegate_tls_handshake_failures_total{reason=\"" + std::string(kTlsFailureReasons[i]) + "\"} " +
           std::to_string(tls_handshake_failures[i].load()) + "\n";
  // TLS to the upstream (issue 27)
  out +=
      "# HELP fencegate_admin_tls_handshake_failures_total Failed TLS handshakes on the admin listener, by reason.\n";
  out += "# TYPE fencegate_admin_tls_handshake_failures_total counter\n";
  for (std::size_t i = 0; i < kTlsFailureReasons.size(); ++i)
    out += "fencegate_admin_tls_handshake_failures_total{reason=\"" + std::string(kTlsFailureReasons[i]) + "\"} " +
           std::to_string(admin_tls_handshake_failures[i].load()) + "\n";
  out += "# HELP fencegate_upstream_tls_failures_total Failed TLS handshakes with https upstreams (502), by reason.\n";
  out += "# TYPE fencegate_upstream_tls_failures_total counter\n";
  for (std::size_t i = 0; i < kUpstreamTlsFailureReasons.size(); ++i)
    out += "fencegate_upstream_tls_failures_total{reason=\"" + std::string(kUpstreamTlsFailureReasons[i]) + "\"} " +
           std::to_string(upstream_tls_failures[i].load()) + "\n";
}

}  // namespace fencegate::proxy
