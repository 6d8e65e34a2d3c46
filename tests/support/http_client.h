// A raw HTTP/1.1 client for tests: sends exactly the bytes it is given and parses what comes back.
//
// It never "fixes" a request, so tests can send malformed framing on purpose. Responses are parsed
// with Content-Length, chunked or close-delimited bodies; a clean close, a reset and a timeout are
// told apart.
//
// Thread-safety: an HttpClient is used by one thread at a time; free functions are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "tests/support/net_util.h"

namespace fencegate::testing {

using namespace std::chrono_literals;

struct Response {
  int status = 0;
  std::string version, reason;
  Headers headers;  // in wire order
  std::string body;

  // First value of `name` (case-insensitive), "" if absent.
  std::string header(std::string_view name) const { return header_value(headers, name); }
  std::vector<std::string> headers_named(std::string_view name) const { return header_values(headers, name); }
  bool has(std::string_view name) const { return has_header(headers, name); }
};

enum class ReadStatus {
  ok,       // a complete response
  closed,   // clean EOF before the first byte of a response
  reset,    // connection reset / error before a complete response
  timeout,  // nothing complete within the timeout
  invalid,  // bytes that do not parse as an HTTP/1.1 response
};
const char* to_string(ReadStatus s);

struct ReadResult {
  ReadStatus status = ReadStatus::invalid;
  Response response;
  std::string error;  // what went wrong, for messages
  bool ok() const { return status == ReadStatus::ok; }
  int code() const { return ok() ? response.status : 0; }  // 0 when there is no response
};

class HttpClient {
 public:
  HttpClient() = default;
  HttpClient(HttpClient&&) = default;
  HttpClient& operator=(HttpClient&&) = default;

  // Returns true iff connected to 127.0.0.1:port within timeout.
  bool connect(std::uint16_t port, std::chrono::milliseconds timeout = 5s);
  bool connected() const { return fd_.valid(); }
  const std::string& last_error() const { return error_; }
  // Local port of the connection (the client address the proxy sees).
  std::uint16_t local_port() const;

  // Sends the bytes as they are. Returns true iff all were written.
  bool send(std::string_view bytes);
  // Reads one response. expect_no_body: the response has no body whatever its headers say
  // (answers to HEAD).
  ReadResult read_response(std::chrono::milliseconds timeout = 10s, bool expect_no_body = false);
  // Sends one request built by build_request() and reads its response, on this connection.
  ReadResult request(std::string_view method, std::string_view target, const Headers& headers = {},
                     std::string_view body = {}, std::chrono::milliseconds timeout = 10s);
  // Returns true iff the peer closes the connection (EOF or reset) within timeout; data that
  // arrives meanwhile is kept for read_response().
  bool wait_closed(std::chrono::milliseconds timeout = 5s);
  // Returns true iff the peer has sent nothing more and not closed during `for_how_long`.
  bool stays_silent(std::chrono::milliseconds for_how_long);
  void shutdown_write();
  void close();
  // Bytes received but not consumed by read_response().
  const std::string& pending() const { return buf_; }

 private:
  // Reads more into buf_; on failure sets status.
  bool fill(Clock::time_point deadline, ReadStatus* status);

  Fd fd_;
  std::string buf_;
  bool eof_ = false;
  std::string error_;
};

// Builds a request: adds "Host: 127.0.0.1" unless given, and Content-Length when there is a body
// or the method is POST/PUT/PATCH, unless Content-Length or Transfer-Encoding is given.
std::string build_request(std::string_view method, std::string_view target, const Headers& headers = {},
                          std::string_view body = {});

// One request on a new connection, then closes it.
ReadResult request(std::uint16_t port, std::string_view method, std::string_view target,
                   const Headers& headers = {}, std::string_view body = {},
                   std::chrono::milliseconds timeout = 10s);

// Sends raw bytes on a new connection and reads one response (connection returned for more checks).
ReadResult send_raw(HttpClient& c, std::uint16_t port, std::string_view bytes,
                    std::chrono::milliseconds timeout = 10s);

// Chunked encoding of `body` in pieces of at most `chunk` bytes, with the terminating chunk.
std::string chunked(std::string_view body, std::size_t chunk = 7);

// For messages: "409 Conflict {body...}" or "timeout: ...".
std::string describe(const ReadResult& r);

}  // namespace fencegate::testing
