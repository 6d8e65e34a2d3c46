// The client contexts of https:// upstreams (see tls_upstream.h).
#include "proxy/tls_upstream.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <cstdlib>

namespace fencegate::proxy {

namespace {

std::string openssl_error() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? std::string("unknown OpenSSL error") : out;
}

bool is_ip(const std::string& s) {
  unsigned char buf[16];
  return ::inet_pton(AF_INET, s.c_str(), buf) == 1 || ::inet_pton(AF_INET6, s.c_str(), buf) == 1;
}

// The system's CA bundle, loaded into the context's store now (SSL_CERT_FILE, else OpenSSL's
// default file); only where there is no such file, the default directory (looked up per handshake).
bool load_system_cas(SSL_CTX* ctx) {
  const char* file = std::getenv(X509_get_default_cert_file_env());
  if (!file || !*file) file = X509_get_default_cert_file();
  if (SSL_CTX_load_verify_file(ctx, file) == 1) return true;
  ERR_clear_error();
  return SSL_CTX_set_default_verify_paths(ctx) == 1;
}

std::atomic<std::uint64_t> g_builds{0};

}  // namespace

std::shared_ptr<const UpstreamTls> UpstreamTls::build(const config::Route& route, const std::string& field,
                                                      std::string* error) {
  std::shared_ptr<UpstreamTls> t(new UpstreamTls());
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (!ctx) {
    *error = field + ".upstream: cannot create a TLS context: " + openssl_error();
    return nullptr;
  }
  t->ctx_ = ctx;  // freed by ~UpstreamTls on every way out
  auto fail = [&](std::string why) {
    *error = std::move(why);
    return nullptr;
  };
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  // Partial writes (the pump retries with what is left), idle pooled connections without buffers.
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
  static constexpr unsigned char kHttp11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  SSL_CTX_set_alpn_protos(ctx, kHttp11, sizeof kHttp11);  // 0 on success
  // Sessions (tickets) are kept by us, one per context, for the next connection's resumption.
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
  SSL_CTX_sess_set_new_cb(ctx, on_new_session);
  SSL_CTX_set_app_data(ctx, t.get());

  t->verify_ = route.upstream_verify;
  if (t->verify_) {
    if (!route.upstream_ca.empty()) {
      if (SSL_CTX_load_verify_locations(ctx, route.upstream_ca.c_str(), nullptr) != 1)
        return fail(field + ".upstream_ca: cannot load the CA bundle " + route.upstream_ca + ": " + openssl_error());
    } else if (!load_system_cas(ctx)) {
      return fail(field + ".upstream: cannot load the system's CA certificates: " + openssl_error());
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    SSL_CTX_set_verify_depth(ctx, 8);
  } else {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
  }
  if (!route.upstream_cert.empty()) {
    if (SSL_CTX_use_certificate_chain_file(ctx, route.upstream_cert.c_str()) != 1)
      return fail(field + ".upstream_cert: cannot load the certificate chain " + route.upstream_cert + ": " +
                  openssl_error());
    if (SSL_CTX_use_PrivateKey_file(ctx, route.upstream_key.c_str(), SSL_FILETYPE_PEM) != 1)
      return fail(field + ".upstream_key: cannot load the private key " + route.upstream_key + ": " + openssl_error());
    if (SSL_CTX_check_private_key(ctx) != 1) {
      ERR_clear_error();
      return fail(field + ".upstream_key: " + route.upstream_key + " is not the private key of the certificate " +
                  route.upstream_cert);
    }
  }
  std::string host = route.upstream_addr.host;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  t->name_ = route.upstream_server_name.empty() ? host : route.upstream_server_name;
  t->name_is_ip_ = is_ip(t->name_);
  t->pool_key_ = route.upstream + "#tls" + std::to_string(g_builds.fetch_add(1, std::memory_order_relaxed));
  return t;
}

UpstreamTls::~UpstreamTls() {
  if (session_) SSL_SESSION_free(session_);
  if (ctx_) SSL_CTX_free(ctx_);
}

SSL* UpstreamTls::new_ssl() const {
  SSL* ssl = SSL_new(ctx_);
  if (!ssl) return nullptr;
  bool ok = true;
  if (name_is_ip_) {
    if (verify_) ok = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name_.c_str()) == 1;
  } else {
    // SNI carries DNS names only (RFC 6066 3): an IP address is checked, not sent.
    ok = SSL_set_tlsext_host_name(ssl, name_.c_str()) == 1;
    if (ok && verify_) {
      SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
      ok = SSL_set1_host(ssl, name_.c_str()) == 1;
    }
  }
  if (!ok) {
    SSL_free(ssl);
    return nullptr;
  }
  std::lock_guard lk(mu_);
  if (session_) SSL_set_session(ssl, session_);
  return ssl;
}

// A session (TLS 1.3: a ticket, after the handshake) the upstream offers for resumption: kept,
// replacing the previous one.
int UpstreamTls::on_new_session(SSL* ssl, SSL_SESSION* session) {
  const auto* self = static_cast<const UpstreamTls*>(SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl)));
  if (!self || SSL_SESSION_is_resumable(session) != 1) return 0;
  std::lock_guard lk(self->mu_);
  if (self->session_) SSL_SESSION_free(self->session_);
  self->session_ = session;
  return 1;  // the reference is ours
}

const char* upstream_tls_failure(SSL* ssl, unsigned long ssl_error, std::string* detail) {
  const long v = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
  if (v != X509_V_OK) {
    *detail = X509_verify_cert_error_string(v);
    switch (v) {
      case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
      case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
      case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
      case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
      case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
      case X509_V_ERR_CERT_SIGNATURE_FAILURE: return "unknown-ca";
      case X509_V_ERR_HOSTNAME_MISMATCH:
      case X509_V_ERR_IP_ADDRESS_MISMATCH:
      case X509_V_ERR_EMAIL_MISMATCH: return "name-mismatch";
      case X509_V_ERR_CERT_HAS_EXPIRED:
      case X509_V_ERR_CERT_NOT_YET_VALID: return "expired";
      default: return "certificate-invalid";
    }
  }
  if (ssl_error) {
    char buf[256];
    ERR_error_string_n(ssl_error, buf, sizeof buf);
    *detail = buf;
  } else if (detail->empty()) {
    *detail = "the connection closed during the handshake";
  }
  return "handshake-failed";
}

}  // namespace fencegate::proxy
