// HttpConnection: one persistent HTTP/1.1 client connection (plain http) to the first reachable
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

// http://host[:port][/path]; https is not supported.
struct HttpUrl {
  std::string host;
  std::uint16_t port = 80;
  std::string path;  // "" or starting with '/', without query
  std::string origin() const {
    return "http://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
  }
};
// Returns true iff `s` is an http URL; fills *out, or *err with what is wrong.
bool parse_http_url(std::string_view s, HttpUrl* out, std::string* err);

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
                const std::atomic<bool>* cancel, HttpResponse* error_response = nullptr);

  // Closes the connection (the next call reconnects, to the same endpoint).
  void close();
  // "http://host:port" of the endpoint in use.
  std::string current_endpoint() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fencegate::election
