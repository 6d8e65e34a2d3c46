// Upstream connections (split from relay.cpp): a pooled one checked before reuse, a new one within
// upstream_connect_timeout_ms (and, for an https:// upstream, its TLS handshake: tls_origin.h),
// and the give-back to the worker's pool.
#include "proxy/session.h"

namespace fencegate::proxy {

std::unique_ptr<UpConn> Session::pooled_upstream(const config::Route& route) {
  auto& pool = w_.pool(route.upstream);
  while (!pool.empty()) {
    auto c = std::move(pool.back());
    pool.pop_back();
    // Every time, however short its idle time: bytes the upstream sent after its last response
    // (a body after a HEAD or 204 answer, data past Content-Length or the last chunk, in a write
    // of their own) would otherwise be read as the answer to this request: one client's
    // response reaching another. And a close sent meanwhile would fail this request with a 502
    // rather than reach the upstream. One non-blocking peek (an EAGAIN, ~0.3 us) per reuse.
    if (c->buf.empty() && still_open(c->sock)) return c;
  }
  return nullptr;
}

task<std::unique_ptr<UpConn>> Session::connect_upstream(const config::Route& route, std::shared_ptr<Exchange>& ex,
                                                        boost::system::error_code& ec) {
  ex->up = std::make_unique<UpConn>(w_.ioc);  // visible to a drain abort while connecting
  std::vector<tcp::endpoint> endpoints;
  for (const auto& a : snap_->upstreams[snap_->route_index(&route)]) {
    boost::system::error_code aec;
    auto addr = net::ip::make_address(a.ip, aec);
    if (!aec) endpoints.emplace_back(addr, a.port);
  }
  waiting_up_ = ex->up.get();
  arm(cfg().upstream_connect_timeout);
  co_await net::async_connect(ex->up->sock, endpoints, net::redirect_error(use_task, ec));
  disarm();
  waiting_up_ = nullptr;
  if (timed_out_) ec = net::error::timed_out;
  std::unique_ptr<UpConn> c = std::move(ex->up);
  if (!ec) set_nodelay(c->sock);
  co_return c;
}

void Session::give_back(const config::Route& route, std::unique_ptr<UpConn> c) {
  // upstream_idle_per_thread connections are kept; during a burst up to kPoolBurst more are,
  // for kPoolBurstIdle each (the watchdog closes them): a burst of concurrent exchanges larger
  // than the pool would otherwise close and reconnect upstream connections on every request.
  const std::size_t keep = cfg().upstream_idle_per_thread;
  if (keep == 0) return;
  w_.pool_keep = keep;
  auto& pool = w_.pool(route.upstream);
  if (pool.size() >= keep + kPoolBurst) return;
  c->idle_since = Clock::now();
  pool.push_back(std::move(c));
}

}  // namespace fencegate::proxy
