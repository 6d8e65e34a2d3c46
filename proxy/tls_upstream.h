// https:// upstreams (issue 27, docs/tls.md "The upstream"): the OpenSSL client context of one
// route's upstream, built once at start and at each reload (never per connection: OpenSSL 3 fetches
// its algorithms and loads the CA bundle when the context is built, so a handshake does no
// lookups), with the TLS session of the last handshake cached for the next connection's resumption.
//
// No Asio and no OpenSSL headers here (the snapshot in runtime.h holds these); the connections
// themselves are in tls_origin.{h,cpp}.
// Thread-safety: an UpstreamTls is shared by every worker; new_ssl() and the session cache are
// thread-safe, the rest is immutable once built.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "config/config.h"

struct ssl_ctx_st;
struct ssl_st;
struct ssl_session_st;

namespace fencegate::proxy {

class UpstreamTls {
 public:
  // The context of `route`'s https:// upstream: verification (on unless upstream_verify is false)
  // against upstream_ca or the system's CA bundle, the name checked (upstream_server_name, else the
  // upstream's host: a DNS name is also sent as SNI, an IP address is matched against IP SANs), the
  // client certificate (upstream_cert, upstream_key). nullptr with *error naming `field`'s setting
  // ("routes[0].upstream_ca") and the file when a file does not load or the key is not the
  // certificate's.
  static std::shared_ptr<const UpstreamTls> build(const config::Route& route, const std::string& field,
                                                  std::string* error);
  ~UpstreamTls();
  UpstreamTls(const UpstreamTls&) = delete;
  UpstreamTls& operator=(const UpstreamTls&) = delete;

  // A new connection's SSL (client side: name check, SNI, the cached session if any), or nullptr.
  // The caller owns it (SSL_free).
  ssl_st* new_ssl() const;
  // Idle connections are pooled under this key: the upstream and this context (each build gets its
  // own), so a connection is reused only under the settings it was made with.
  const std::string& pool_key() const { return pool_key_; }
  const std::string& server_name() const { return name_; }
  bool verify() const { return verify_; }
  // A reload replaced this context: its pooled connections are closed (Worker's watchdog).
  void retire() const { retired_.store(true, std::memory_order_relaxed); }
  bool retired() const { return retired_.load(std::memory_order_relaxed); }

 private:
  UpstreamTls() = default;
  static int on_new_session(ssl_st* ssl, ssl_session_st* session);
  ssl_ctx_st* ctx_ = nullptr;
  std::string name_;
  bool name_is_ip_ = false;
  bool verify_ = true;
  std::string pool_key_;
  mutable std::mutex mu_;
  mutable ssl_session_st* session_ = nullptr;  // guarded by mu_: the newest resumable session
  mutable std::atomic<bool> retired_{false};
};

// The reason class of a failed upstream handshake, for the 502's detail, the log and the metric
// fencegate_upstream_tls_failures_total{reason}: "unknown-ca", "name-mismatch", "expired",
// "certificate-invalid" (another verification failure), or "handshake-failed" (an alert, a protocol
// error, the connection closed). *detail gets OpenSSL's words for it. (A timeout is "timeout",
// decided by the caller.)
const char* upstream_tls_failure(ssl_st* ssl, unsigned long ssl_error, std::string* detail);

}  // namespace fencegate::proxy
