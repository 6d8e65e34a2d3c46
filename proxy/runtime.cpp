#include "proxy/runtime.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include "fence_store/store.h"
#include "proxy/fence.h"
#include "common/log.h"
#include "proxy/metrics.h"

namespace fencegate::proxy {

namespace {

bool resolve(const config::Endpoint& ep, std::vector<UpstreamAddr>* out, std::string* error) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_family = AF_UNSPEC;
  std::string host = ep.host;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(ep.port).c_str(), &hints, &res);
  if (rc != 0) {
    *error = gai_strerror(rc);
    return false;
  }
  for (addrinfo* p = res; p; p = p->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (p->ai_family == AF_INET)
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(p->ai_addr)->sin_addr, buf, sizeof buf);
    else if (p->ai_family == AF_INET6)
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(p->ai_addr)->sin6_addr, buf, sizeof buf);
    else continue;
    out->push_back(UpstreamAddr{buf, ep.port});
  }
  ::freeaddrinfo(res);
  if (out->empty()) {
    *error = "no IPv4 or IPv6 address";
    return false;
  }
  return true;
}

}  // namespace

std::shared_ptr<const Snapshot> make_snapshot(std::shared_ptr<const config::Config> cfg, std::string* error,
                                              bool* tls_error) {
  auto snap = std::make_shared<Snapshot>(cfg);
  for (std::size_t i = 0; i < cfg->routes.size(); ++i) {
    const auto& r = cfg->routes[i];
    std::vector<UpstreamAddr> addrs;
    std::string why;
    if (!resolve(r.upstream_addr, &addrs, &why)) {
      *error = "routes[" + std::to_string(i) + "].upstream: cannot resolve " + r.upstream + ": " + why;
      return nullptr;
    }
    snap->upstreams.push_back(std::move(addrs));
    // TLS to the upstream (issue 27): one client context per https:// route, built here only.
    std::shared_ptr<const UpstreamTls> tls;
    if (r.upstream_tls) {
      const std::string field = "routes[" + std::to_string(i) + "]";
      tls = UpstreamTls::build(r, field, error);
      if (!tls) {
        if (tls_error) *tls_error = true;
        return nullptr;
      }
      if (!r.upstream_verify)
        log::warn("upstream_verify is false: the upstream's certificate and name are not checked",
                  {log::kv("route", field), log::kv("upstream", r.upstream)});
    }
    snap->upstream_tls.push_back(std::move(tls));
  }
  return snap;
}

std::vector<std::string> Runtime::reload() {
  std::lock_guard serial(reload_mu_);
  auto current = snapshot();
  config::LoadResult r = config::load_serve(current->cfg->args);
  std::vector<std::string> errors = std::move(r.errors);
  if (r.config && errors.empty()) {
    for (auto& e : config::reload_incompatibilities(*current->cfg, *r.config)) errors.push_back(std::move(e));
  }
  if (!r.config && errors.empty()) errors.push_back("invalid configuration");
  std::shared_ptr<const Snapshot> next;
  if (errors.empty()) {
    std::string why;
    next = make_snapshot(std::make_shared<const config::Config>(std::move(*r.config)), &why);
    if (!next) errors.push_back(why);
  }
  // TLS (issue 27): new certificates for new connections; open ones keep theirs.
  if (errors.empty() && reload_tls)
    if (std::string why = reload_tls(*next->cfg); !why.empty()) errors.push_back(std::move(why));
  if (errors.empty() && reload_admin_tls)  // issue 27 (tls-ctl)
    if (std::string why = reload_admin_tls(*next->cfg); !why.empty()) errors.push_back(std::move(why));
  if (!errors.empty()) {
    metrics.reload_failures.fetch_add(1);
    std::string all;
    for (const auto& e : errors) all += (all.empty() ? "" : "; ") + e;
    log::error("config reload rejected; the running config stays", {log::kv("errors", all)});
    return errors;
  }
  log::Level lvl;
  if (log::parse_level(next->cfg->log_level, &lvl)) log::set_level(lvl);
  fence.set_limits(next->cfg->drain_timeout, next->cfg->max_resources);
  fence.set_observe_cap(next->cfg->upstream_timeout);
  recount_routes(fence, *next);
  store.set_retention(static_cast<std::int64_t>(next->cfg->audit.max_age.count()) * 1000, next->cfg->audit.max_rows);
  install(next);
  // TLS to the upstream (issue 27): connections made under the old contexts leave the pools.
  for (const auto& t : current->upstream_tls)
    if (t) t->retire();
  metrics.reloads.fetch_add(1);
  log::info("config reloaded",
            {log::kv("routes", next->cfg->routes.size()), log::kv("config", next->cfg->config_file)});
  return {};
}

void recount_routes(Fence& fence, const Snapshot& snap) {
  fence.recount_routes([&snap](const std::string& resource) {
    bool off = false;
    const config::Route* r = snap.router.owner_of(resource, &off);
    return r ? r->prefix : std::string();
  });
}

}  // namespace fencegate::proxy
