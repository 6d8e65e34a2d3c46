// TLS on the data listener (issue 27, docs/tls.md): the handshake in front of the sessions.
//
// When `tls` is configured, each accepted connection goes here (on its worker's thread) instead of
// straight to a Session: the TLS handshake runs under header_timeout_ms (a stalled handshake holds
// no one else up: each is its own coroutine on the worker), plain HTTP sent to the port gets a
// short plaintext 400 and a close, and failures are counted
// (fencegate_tls_handshake_failures_total{reason}) and logged at most once per peer address and
// 10 s. After the handshake the connection becomes an ordinary Session, which reads and writes
// its records itself (session_tls.cpp) on the client's own socket, told the verified client
// identity in process (so no byte from the network can claim one).
//
// The SSL_CTX is built at start and on each reload (reload(): a certificate that does not load
// keeps the old context, and the reload fails saying why); connections already open keep theirs.
// Internal to proxy/ (its .cpp includes Asio).
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "config/config.h"
#include "proxy/tls_context.h"

namespace fencegate::proxy {

struct ServerState;
struct Worker;

class TlsTerminator {
 public:
  explicit TlsTerminator(ServerState& st) : st_(st) {}

  // Builds the context from cfg.tls. False with *error naming the field and file.
  bool start(const config::Config& cfg, std::string* error);
  // Builds a new context from cfg.tls and installs it; "" on success, else why (the old one stays).
  std::string reload(const config::Config& cfg);
  // Takes over an accepted client descriptor (already counted in st.connections) on `w`'s thread.
  void serve(Worker& w, int fd);

 private:
  std::shared_ptr<const TlsContext> current() const {
    std::lock_guard lk(mu_);
    return ctx_;
  }
  ServerState& st_;
  mutable std::mutex mu_;
  std::shared_ptr<const TlsContext> ctx_;  // guarded by mu_
};

}  // namespace fencegate::proxy
