// HttpConnection: one persistent HTTP/1.1 client connection (http or https) to the first reachable
// of several endpoints, with failover and per-call deadlines. The only Asio/Beast user in
// election_client (http_conn.cpp); this header keeps Beast out of everyone else's compile.
//
// Failover: a call uses the current endpoint; on a connect error, an I/O error or a connection
// that the peer closed, it moves on to the next endpoint (round robin) and retries while the
// call's time remains, at most once per endpoint (plus one retry when a reused keep-alive
// connection turned out to be dead). A timeout ends the call; the next call starts on the next
// endpoint. Requests are retried after they may have been sent: only use it for requests that
// are safe to repeat (every etcd call election_client makes is).
//
// Cancellation: a call polls *cancel every 50 ms and aborts with Status::Cancelled when it is set.
//
// Thread-safety: one thread at a time per HttpConnection (calls block that thread).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "election_client/status.h"

namespace fencegate::election {

// http://host[:port][/path], or https:// where the caller allows it (issue 27).
struct HttpUrl {
  std::string host;
  std::uint16_t port = 80;
  std::string path;  // "" or starting with '/', without query
  bool tls = false;  // https://
  std::string origin() const {
    return std::string(tls ? "https://" : "http://") + (host.find(':') != std::string::npos ? "[" + host + "]" : host) +
           ":" + std::to_string(port);
  }
};
// Returns true iff `s` is an http URL (or, with allow_https, an https URL: port 443 by default);
// fills *out, or *err with what is wrong.
bool parse_http_url(std::string_view s, HttpUrl* out, std::string* err, bool allow_https = false);

// TLS to https endpoints (issue 27, docs/tls.md): PEM paths. Verification is always on: the peer's
// chain must verify against `cacert` (else the system store) and name the URL's host (a DNS name
// or an IP address in the certificate's SAN). `cert` + `key`: a client certificate (mutual TLS).
struct TlsFiles {
  std::string cacert, cert, key;
  bool empty() const { return cacert.empty() && cert.empty() && key.empty(); }
};
// An OpenSSL client context built once from TlsFiles and shared by connections (opaque here, so
// that no Asio/OpenSSL header reaches the includers). Immutable once built.
class TlsClient;
// Builds the context. nullptr with *err naming the file that does not load ("--cacert"-free text:
// the caller prefixes its field name).
std::shared_ptr<const TlsClient> make_tls_client(const TlsFiles& files, std::string* err);

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpResponse {
  int status = 0;
  std::string body;
};

class HttpConnection {
 public:
  struct Options {
    std::vector<HttpUrl> endpoints;                       // at least one; only host and port are used
    std::chrono::milliseconds connect_timeout{1000};      // per endpoint, within the call's time
    std::size_t max_body_bytes = 16 * 1024 * 1024;        // unary responses
    // Issue 27: the context for https endpoints; null = one with the system store, made on demand.
    std::shared_ptr<const TlsClient> tls;
  };
  explicit HttpConnection(Options options);
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  // POSTs `body` (JSON) to `target` and reads the whole response into *out. Any HTTP status is
  // OK() here; unavailable when no endpoint answered within `timeout`.
  Status post(std::string_view target, std::string_view body, std::chrono::milliseconds timeout, HttpResponse* out,
              const std::atomic<bool>* cancel = nullptr, const HttpHeaders& headers = {});

  // POSTs and then hands each line of a 200 response's body (newline-delimited JSON stream) to
  // on_line, until on_line returns false (OK), the stream ends or breaks (unavailable), nothing
  // arrives for idle_timeout (unavailable; zero = no limit) or *cancel is set (cancelled).
  // `head_timeout` bounds connecting and receiving the response head. A non-200 answer is returned
  // with its body in *error_response and Status OK() is not used: Status::Http.
  Status stream(std::string_view target, std::string_view body, std::chrono::milliseconds head_timeout,
                std::chrono::milliseconds idle_timeout, const std::function<bool(std::string_view)>& on_line,
                const std::atomic<bool>* cancel, HttpResponse* error_response = nullptr,
                const HttpHeaders& headers = {});

  // Closes the connection (the next call reconnects, to the same endpoint).
  void close();
  // "http://host:port" of the endpoint in use.
  std::string current_endpoint() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fencegate::election
