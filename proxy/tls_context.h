// TLS on the data listener (issue 27, docs/tls.md): the OpenSSL server context, built once at start
// and once per reload (never per connection: OpenSSL 3 fetches algorithms when a context is built,
// so a handshake does no lookups), and the client identity read from a verified certificate.
//
// No Asio here: the terminator (proxy/tls_listener.cpp) wraps each connection's SSL in Asio.
// Thread-safety: a TlsContext is immutable once built; share it as std::shared_ptr<const TlsContext>.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config/config.h"

struct ssl_ctx_st;
struct ssl_st;

namespace fencegate::proxy {

class TlsContext {
 public:
  // Loads the certificate chains and keys of `tls` (the main one and every `sni` entry), the client
  // CA bundle, and sets the protocol floor, verification, ALPN and SNI. nullptr with *error naming
  // the field and the file when a file does not load or a key does not match its certificate.
  static std::shared_ptr<const TlsContext> build(const config::Tls& tls, std::string* error);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  // A new connection's SSL (server side), or nullptr. The caller owns it (SSL_free).
  ssl_st* new_ssl() const;

 private:
  TlsContext() = default;
  struct Sni {
    std::vector<std::string> names;
    ssl_ctx_st* ctx = nullptr;
  };
  static int on_server_name(ssl_st* ssl, int* alert, void* arg);
  ssl_ctx_st* main_ = nullptr;
  std::vector<Sni> sni_;
};

// The verified client identity of a finished handshake: the first SAN URI (a SPIFFE ID), else the
// first SAN DNS name, else the subject CN; "" without a verified certificate, or when the name holds
// anything but printable ASCII (it goes into a request header and audit rows).
std::string peer_identity(ssl_st* ssl);

// The reason class of a failed handshake, for the metric's label and the log ("unknown_ca",
// "certificate_expired", "no_client_certificate", "protocol", ...).
const char* handshake_failure_reason(ssl_st* ssl, unsigned long ssl_error);

}  // namespace fencegate::proxy
