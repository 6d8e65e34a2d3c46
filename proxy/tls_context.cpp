// TLS server contexts and client identities (see tls_context.h).
#include "proxy/tls_context.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cstring>

namespace fencegate::proxy {

namespace {

constexpr unsigned char kSessionIdContext[] = "fencegate";

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

// ALPN: http/1.1 when the client offers it; a client that offers only other protocols (h2) goes
// on without ALPN and speaks HTTP/1.1 or fails, as with a server that knows no ALPN.
int select_alpn(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in, unsigned inlen,
                void*) {
  static constexpr unsigned char kHttp11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  unsigned char* sel = nullptr;
  unsigned char sel_len = 0;
  if (SSL_select_next_proto(&sel, &sel_len, kHttp11, sizeof kHttp11, in, inlen) == OPENSSL_NPN_NEGOTIATED) {
    *out = sel;
    *outlen = sel_len;
    return SSL_TLSEXT_ERR_OK;
  }
  return SSL_TLSEXT_ERR_NOACK;
}

// One SSL_CTX with its certificate and key, and the settings every context of the listener shares.
SSL_CTX* make_ctx(const config::Tls& tls, const std::string& field, const std::string& cert, const std::string& key,
                  std::string* error) {
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (!ctx) {
    *error = "tls: cannot create a TLS context: " + openssl_error();
    return nullptr;
  }
  auto fail = [&](std::string why) {
    *error = std::move(why);
    SSL_CTX_free(ctx);
    return nullptr;
  };
  SSL_CTX_set_min_proto_version(ctx, tls.min_version == "1.3" ? TLS1_3_VERSION : TLS1_2_VERSION);
  SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  // TLS 1.2: forward-secret AEAD suites only (TLS 1.3's defaults are all of that kind).
  if (SSL_CTX_set_cipher_list(ctx, "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL") != 1)
    return fail("tls: cannot set the cipher suites: " + openssl_error());
  SSL_CTX_set_session_id_context(ctx, kSessionIdContext, sizeof kSessionIdContext - 1);
  if (tls.session_resumption) {
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_SERVER);
  } else {  // no ticket sent (TLS 1.3 and 1.2), no session cached: nothing to resume
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
    SSL_CTX_set_num_tickets(ctx, 0);
  }
  SSL_CTX_set_alpn_select_cb(ctx, select_alpn, nullptr);
  if (SSL_CTX_use_certificate_chain_file(ctx, cert.c_str()) != 1)
    return fail(field + ".cert: cannot load the certificate chain " + cert + ": " + openssl_error());
  if (SSL_CTX_use_PrivateKey_file(ctx, key.c_str(), SSL_FILETYPE_PEM) != 1)
    return fail(field + ".key: cannot load the private key " + key + ": " + openssl_error());
  if (SSL_CTX_check_private_key(ctx) != 1) {
    ERR_clear_error();
    return fail(field + ".key: " + key + " is not the private key of the certificate " + cert);
  }
  if (tls.client_auth != config::ClientAuth::none) {
    if (SSL_CTX_load_verify_locations(ctx, tls.client_ca.c_str(), nullptr) != 1)
      return fail("tls.client_ca: cannot load the CA bundle " + tls.client_ca + ": " + openssl_error());
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(tls.client_ca.c_str());
    if (!names) return fail("tls.client_ca: " + tls.client_ca + " holds no CA certificate");
    SSL_CTX_set_client_CA_list(ctx, names);
    SSL_CTX_set_verify(ctx,
                       tls.client_auth == config::ClientAuth::required
                           ? SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT
                           : SSL_VERIFY_PEER,
                       nullptr);
    SSL_CTX_set_verify_depth(ctx, 8);
  }
  return ctx;
}

bool name_matches(const std::string& pattern, std::string_view name) {
  auto ieq = [](std::string_view a, std::string_view b) {
    return a.size() == b.size() &&
           std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) { return std::tolower(x) == std::tolower(y); });
  };
  if (pattern.starts_with("*.")) {  // one label
    const auto dot = name.find('.');
    return dot != std::string_view::npos && dot > 0 && ieq(std::string_view(pattern).substr(1), name.substr(dot));
  }
  return ieq(pattern, name);
}

bool printable(std::string_view s) {
  return !s.empty() && s.size() <= 1024 && std::all_of(s.begin(), s.end(), [](char ch) {
    auto u = static_cast<unsigned char>(ch);
    return u >= 0x20 && u < 0x7f;
  });
}

}  // namespace

std::shared_ptr<const TlsContext> TlsContext::build(const config::Tls& tls, std::string* error) {
  std::shared_ptr<TlsContext> c(new TlsContext());
  c->main_ = make_ctx(tls, "tls", tls.cert, tls.key, error);
  if (!c->main_) return nullptr;
  for (std::size_t i = 0; i < tls.sni.size(); ++i) {
    const config::TlsSni& e = tls.sni[i];
    SSL_CTX* ctx = make_ctx(tls, "tls.sni[" + std::to_string(i) + "]", e.cert, e.key, error);
    if (!ctx) return nullptr;  // ~TlsContext frees what was built
    c->sni_.push_back(Sni{e.names, ctx});
  }
  if (!c->sni_.empty()) {
    SSL_CTX_set_tlsext_servername_callback(c->main_, on_server_name);
    SSL_CTX_set_tlsext_servername_arg(c->main_, c.get());
  }
  return c;
}

TlsContext::~TlsContext() {
  for (Sni& s : sni_) SSL_CTX_free(s.ctx);
  if (main_) SSL_CTX_free(main_);
}

ssl_st* TlsContext::new_ssl() const { return SSL_new(main_); }

// SNI: the first entry naming the client's server name; else the main certificate. (The caller
// keeps the TlsContext alive for the handshake.)
int TlsContext::on_server_name(ssl_st* ssl, int*, void* arg) {
  const auto* self = static_cast<const TlsContext*>(arg);
  const char* name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
  if (!name) return SSL_TLSEXT_ERR_OK;
  for (const Sni& s : self->sni_)
    for (const std::string& p : s.names)
      if (name_matches(p, name)) {
        SSL_set_SSL_CTX(ssl, s.ctx);
        return SSL_TLSEXT_ERR_OK;
      }
  return SSL_TLSEXT_ERR_OK;
}

std::string peer_identity(ssl_st* ssl) {
  X509* cert = SSL_get0_peer_certificate(ssl);
  if (!cert || SSL_get_verify_result(ssl) != X509_V_OK) return {};
  std::string uri, dns;
  if (auto* sans = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr))) {
    for (int i = 0; i < sk_GENERAL_NAME_num(sans); ++i) {
      const GENERAL_NAME* g = sk_GENERAL_NAME_value(sans, i);
      if (g->type != GEN_URI && g->type != GEN_DNS) continue;
      const ASN1_STRING* s = g->type == GEN_URI ? g->d.uniformResourceIdentifier : g->d.dNSName;
      std::string v(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                    static_cast<std::size_t>(ASN1_STRING_length(s)));
      std::string& slot = g->type == GEN_URI ? uri : dns;
      if (slot.empty() && printable(v)) slot = std::move(v);
    }
    GENERAL_NAMES_free(sans);
  }
  if (!uri.empty()) return uri;
  if (!dns.empty()) return dns;
  const X509_NAME* subject = X509_get_subject_name(cert);
  const int idx = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  if (idx < 0) return {};
  const ASN1_STRING* cn = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, idx));
  unsigned char* utf8 = nullptr;
  const int n = ASN1_STRING_to_UTF8(&utf8, cn);
  if (n < 0) return {};
  std::string v(reinterpret_cast<const char*>(utf8), static_cast<std::size_t>(n));
  OPENSSL_free(utf8);
  return printable(v) ? v : std::string();
}

const char* handshake_failure_reason(ssl_st* ssl, unsigned long ssl_error) {
  if (ssl) {
    switch (SSL_get_verify_result(ssl)) {
      case X509_V_OK: break;
      case X509_V_ERR_CERT_HAS_EXPIRED:
      case X509_V_ERR_CERT_NOT_YET_VALID: return "certificate_expired";
      case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
      case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
      case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
      case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
      case X509_V_ERR_CERT_SIGNATURE_FAILURE: return "unknown_ca";
      default: return "certificate_invalid";
    }
  }
  switch (ERR_GET_REASON(ssl_error)) {
    case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE: return "no_client_certificate";
    case SSL_R_CERTIFICATE_VERIFY_FAILED: return "certificate_invalid";
    case SSL_R_UNSUPPORTED_PROTOCOL:
    case SSL_R_WRONG_VERSION_NUMBER:
    case SSL_R_NO_SHARED_CIPHER:
    case SSL_R_VERSION_TOO_LOW: return "protocol";
    default: return "other";
  }
}

}  // namespace fencegate::proxy
