// RecordingUpstream: a real HTTP/1.1 server on 127.0.0.1 that records every request it receives,
// byte for byte as it arrived, so integration tests can check what the proxy let through.
//
// One thread per connection, keep-alive, strict request parsing (Content-Length or chunked).
// Each request's behaviour is chosen by a hook (delay, status, hang, reset, close without
// response); the default answers 200 with a small JSON body echoing method and target.
//
// Timestamps are steady-clock and chosen to be causally safe for ordering checks:
//   arrival    is taken after the request head was fully read (so the proxy had sent it before);
//   completion is taken just before the last bytes of the response are written (so the proxy
//              cannot have had the whole response earlier), or when the exchange was torn down.
// Hence if exchange a really finished before b started, a.completion < b.arrival always holds.
//
// Thread-safety: every public method is thread-safe. The hook runs on connection threads.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tests/support/net_util.h"

namespace fencegate::testing {

// How a recorded exchange ended.
enum class Outcome {
  pending,          // still being handled (delay or hang in progress)
  responded,        // the full response was written
  write_failed,     // writing the response failed (peer gone)
  aborted_by_peer,  // the peer closed or reset the connection while we delayed or hung
  reset,            // we reset the connection as the hook asked
  closed,           // we closed without responding as the hook asked
  stopped,          // stop() ended a hang
};
const char* to_string(Outcome o);

struct RecordedRequest {
  std::uint64_t index = 0;          // position in requests() (order of full receipt)
  std::uint64_t connection_id = 0;  // 1, 2, ... in accept order
  std::string method, target, version;
  Headers headers;                  // in wire order, names as sent
  std::string body;                 // decoded body (chunked framing removed)
  std::string raw_head;             // request line + headers + CRLF CRLF as received
  std::string raw_body;             // body bytes as received (with chunked framing)
  bool chunked = false;
  Clock::time_point arrival{};      // head fully received
  Clock::time_point completion{};   // see file comment; meaningful once outcome != pending
  Outcome outcome = Outcome::pending;

  std::string header(std::string_view name) const { return header_value(headers, name); }
  std::vector<std::string> headers_named(std::string_view name) const { return header_values(headers, name); }
  bool has(std::string_view name) const { return has_header(headers, name); }
  // Raw value of the (first) Fencing-Token header, "" if absent.
  std::string fencing_token_raw(std::string_view name = "Fencing-Token") const { return header(name); }
  // Fencing-Token parsed as a decimal integer (after OWS trim); nullopt if absent or not a number.
  std::optional<std::int64_t> fencing_token(std::string_view name = "Fencing-Token") const;
};

// What to do with one request.
struct UpstreamAction {
  enum class Kind { respond, hang, reset, close };
  Kind kind = Kind::respond;
  int delay_ms = 0;             // before responding (respond only)
  int status = 200;
  Headers headers;              // extra response headers ("Connection: close" closes after it)
  std::optional<std::string> body;  // nullopt: default JSON echo
  // Written at once and then every interim_every_ms while the delay runs (a "102 Processing"
  // of a server still working): respond only.
  std::string interim;
  int interim_every_ms = 0;

  static UpstreamAction respond(int status = 200, int delay_ms = 0) {
    UpstreamAction a;
    a.status = status;
    a.delay_ms = delay_ms;
    return a;
  }
  static UpstreamAction delayed(int delay_ms) { return respond(200, delay_ms); }
  // Never responds; the connection stays open until the peer closes it or stop().
  static UpstreamAction hang() { return kind_only(Kind::hang); }
  // Closes with SO_LINGER 0 (the peer sees a TCP reset), without responding.
  static UpstreamAction reset_connection() { return kind_only(Kind::reset); }
  // Closes cleanly without responding.
  static UpstreamAction close_connection() { return kind_only(Kind::close); }

 private:
  static UpstreamAction kind_only(Kind k) {
    UpstreamAction a;
    a.kind = k;
    return a;
  }
};

class RecordingUpstream {
 public:
  // Called once per fully received request, on its connection thread, before it is answered.
  using Hook = std::function<UpstreamAction(const RecordedRequest&)>;

  // Binds 127.0.0.1:0 and starts accepting. Throws std::runtime_error if it cannot bind.
  explicit RecordingUpstream(Hook hook = {});
  ~RecordingUpstream();
  RecordingUpstream(const RecordingUpstream&) = delete;
  RecordingUpstream& operator=(const RecordingUpstream&) = delete;

  std::uint16_t port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  void set_hook(Hook hook);

  // Snapshot of every request received so far (index order).
  std::vector<RecordedRequest> requests() const;
  std::size_t count() const;
  std::size_t connections_accepted() const { return connections_.load(); }
  // Requests that could not be parsed (each also got a 400 and a close); text describes why.
  std::vector<std::string> parse_errors() const;
  // Returns true iff count() >= n within timeout.
  bool wait_for_count(std::size_t n, std::chrono::milliseconds timeout) const;
  // Returns true iff request `index` has left Outcome::pending within timeout.
  bool wait_for_outcome(std::size_t index, std::chrono::milliseconds timeout) const;

  // Closes the listener and every connection and joins all threads. Idempotent.
  void stop();

 private:
  void accept_loop();
  void serve(int fd, std::uint64_t conn_id);
  std::size_t record(RecordedRequest r);
  void finish(std::size_t index, Outcome o, Clock::time_point t);
  // Waits `ms` (<0: forever) while watching fd for the peer closing. Returns true iff the wait ran
  // to its end; false if the peer went away (*peer_gone) or stop() was called.
  bool watchful_wait(int fd, int ms, bool* peer_gone);

  // Constant after construction
  Fd listener_;
  std::uint16_t port_ = 0;

  std::atomic<bool> stopping_{false};
  std::atomic<std::size_t> connections_{0};
  std::thread acceptor_;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  // Guarded by mu_
  Hook hook_;
  std::vector<RecordedRequest> requests_;
  std::vector<std::string> parse_errors_;
  std::list<std::thread> threads_;
  std::vector<int> open_fds_;
  bool stopped_ = false;
};

}  // namespace fencegate::testing
