// Upstream connections (split from relay.cpp): a pooled one checked before reuse, a new one within
// upstream_connect_timeout_ms (and, for an https:// upstream, its TLS handshake: tls_origin.h),
// and the give-back to the worker's pool.
#include "proxy/session.h"
#include "proxy/tls_origin.h"

namespace fencegate::proxy {

// The pool of `route`'s upstream: by URL, and for https:// by its TLS context too (pool_key), so a
// connection is reused only under the settings it was made with.
const std::string& Session::pool_key(const config::Route& route) const {
  const auto& tls = snap_->upstream_tls[snap_->route_index(&route)];
  return tls ? tls->pool_key() : route.upstream;
}

std::unique_ptr<UpConn> Session::pooled_upstream(const config::Route& route) {
  auto& pool = w_.pool(pool_key(route));
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
  if (!ec) set_nodelay(ex->up->sock);
  // TLS to the upstream (issue 27): the handshake, within the same deadline, before a byte of the
  // request goes; a drain abort closes the socket it waits on, as it does a connect.
  sc_->tls_failure = nullptr;
  if (const auto& tls = snap_->upstream_tls[snap_->route_index(&route)]; tls && !ec && !timed_out_ && !ex->aborted) {
    TlsFailure why;
    const bool ok = co_await originate_tls(w_.ioc, *ex->up, tls, ec, &why);
    if (!ok && !ex->aborted) {
      sc_->tls_failure = timed_out_ ? "timeout" : why.reason;
      sc_->tls_detail = timed_out_ ? "no TLS handshake within upstream_connect_timeout_ms" : std::move(why.detail);
      if (!ec) ec = net::error::connection_refused;
    }
  }
  disarm();
  waiting_up_ = nullptr;
  if (timed_out_) ec = net::error::timed_out;
  std::unique_ptr<UpConn> c = std::move(ex->up);
  co_return c;
}

void Session::give_back(const config::Route& route, std::unique_ptr<UpConn> c) {
  // upstream_idle_per_thread connections are kept; during a burst up to kPoolBurst more are,
  // for kPoolBurstIdle each (the watchdog closes them): a burst of concurrent exchanges larger
  // than the pool would otherwise close and reconnect upstream connections on every request.
  const std::size_t keep = cfg().upstream_idle_per_thread;
  if (keep == 0) return;
  w_.pool_keep = keep;
  auto& pool = w_.pool(pool_key(route));
  if (pool.size() >= keep + kPoolBurst) return;
  c->idle_since = Clock::now();
  pool.push_back(std::move(c));
}

}  // namespace fencegate::proxy
