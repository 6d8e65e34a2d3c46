// https:// upstreams (issue 27, docs/tls.md): the TLS client side of an upstream connection, the
// "originator". The relay keeps speaking plaintext on its UpConn's socket, which for an https
// upstream is our end of a socketpair; a coroutine pair on the same worker thread pumps bytes between
// the other end and the TLS connection to the upstream (OpenSSL on the non-blocking socket, waits
// through Asio; no Asio SSL). So every relay stage (send_now, io_uring sends, early answers, the
// pool's liveness peek, the linger's half-close) works unchanged.
//
// - Handshake (originate_tls): before anything of the request is sent, under the caller's connect
//   deadline (the watchdog cancels the socket: a handshake never hangs) and a drain abort's close.
// - Half-close: when the relay shuts down its sending side (linger_after_failure), the upstream gets
//   close_notify and a FIN, and its answer still comes back; when the relay closes its end, the TLS
//   connection is closed. When the upstream closes, the relay reads EOF.
// - The session of the handshake (a TLS 1.3 ticket) is cached in the UpstreamTls for the next
//   connection's resumption.
// Internal to proxy/ (it includes Asio through relay_io.h).
#pragma once

#include <memory>
#include <string>

#include "proxy/relay_io.h"
#include "proxy/tls_upstream.h"

namespace fencegate::proxy {

// Why a handshake failed: the reason class (upstream_tls_failure's, or "timeout") and its detail.
struct TlsFailure {
  const char* reason = nullptr;  // nullptr: no failure
  std::string detail;
};

// Runs the TLS handshake on `up.sock` (connected to the upstream). On success `up.sock` is replaced
// by our end of a socketpair pumped to the TLS connection by coroutines on `ioc`, and true is
// returned. Else false with *ec (operation_aborted when the socket was cancelled or closed: a
// timeout or a drain abort, which the caller tells apart) and *why (reason and detail).
task<bool> originate_tls(net::io_context& ioc, UpConn& up, const std::shared_ptr<const UpstreamTls>& tls,
                         boost::system::error_code& ec, TlsFailure* why);

}  // namespace fencegate::proxy
