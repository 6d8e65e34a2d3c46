// Idempotency keys (issue 30, docs/idempotency.md): the operation ID a client sends in an
// Idempotency-Key header, so that a retried write takes effect once. This unit is the pure half
// (no Asio, no store): parsing the key (an RFC 8941 sf-string), the request's fingerprint (method,
// target and the SHA-256 of the body), which upstream answers are final, the capture of a
// response to record, the replay of a recorded one, and the problems fencegate answers with.
// proxy/idempotency_path.cpp runs it on the data path.
//
// Thread-safety: free functions are pure; a Fingerprint or Capture is used by one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fence_store/store.h"
#include "proxy/head.h"
#include "proxy/local_reply.h"

namespace fencegate::proxy::idem {

// The longest key accepted, in bytes after unescaping (the draft sets no bound; Stripe's is 255).
inline constexpr std::size_t kMaxKeyBytes = 255;
// A keyed write's body is read whole before it is forwarded (its SHA-256 is part of the
// fingerprint that a retry is compared with): at most this many bytes (else 413).
inline constexpr std::uint64_t kMaxKeyedBodyBytes = 8u << 20;
// The header a replayed response carries (Stripe's name).
inline constexpr std::string_view kReplayedHeader = "Idempotent-Replayed";

// Parses a field value as an RFC 8941 sf-string: DQUOTE, printable ASCII (0x20-0x7E) with only
// \" and \\ escaped, DQUOTE; optional surrounding spaces (SP/HTAB, RFC 9110 5.5) are allowed,
// parameters are not. Returns the unescaped key, or nullopt with *why (a sentence for the
// client) set. An empty key ("") and one over kMaxKeyBytes are refused.
std::optional<std::string> parse_key(std::string_view field, std::string* why = nullptr);

// The key as an sf-string (the inverse of parse_key for a valid key).
std::string serialize_key(std::string_view key);

// SHA-256 of a request's body, fed in pieces (OpenSSL libcrypto).
class Fingerprint {
 public:
  Fingerprint();
  ~Fingerprint();
  Fingerprint(const Fingerprint&) = delete;
  Fingerprint& operator=(const Fingerprint&) = delete;
  void update(std::string_view body_bytes);
  // The fingerprint: hex SHA-256 of "<method> <target>\n<hex SHA-256 of the body>". Once.
  std::string finish(std::string_view method, std::string_view target);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
// The fingerprint of a whole request at once.
std::string fingerprint(std::string_view method, std::string_view target, std::string_view body);
// Hex SHA-256 of `data`.
std::string sha256_hex(std::string_view data);

// What an upstream answer does to its key: recorded (a final answer), released (408, 425, 429,
// 503: the upstream says it did not act, a retry is forwarded) or outcome unknown (502, 504: a
// gateway in front of the upstream may or may not have passed the request on).
// The defaults; a route may name its own (idempotency.release_statuses, .unknown_statuses).
enum class Fate { record, release, unknown };
Fate fate_of(int status);
Fate fate_of(int status, const std::vector<int>& release, const std::vector<int>& unknown);

// True iff a response field describes the body and is recorded with it (Content-Type,
// Content-Encoding, Content-Language, Content-Location, Content-Disposition, ETag,
// Last-Modified, Location).
bool describes_body(std::string_view name);

// The response of a keyed write as it is relayed: its status, the fields that describe its body
// and the body, up to max_body bytes (beyond that only the status is kept).
struct Capture {
  explicit Capture(std::uint64_t max_body) : max_body_(max_body) {}
  void head(const ResponseHead& rh);
  void body(std::string_view bytes);
  bool have_head = false;
  bool sent = false;     // some of the request went upstream
  bool settled = false;  // the key's fate was decided (recorded, released or unknown)
  int status = 0;
  std::string headers;  // "Name: value\r\n" each
  std::string data;
  bool kept = true;

 private:
  std::uint64_t max_body_;
};

// A keyed write on its way upstream: its key's row and the capture of its answer. Made by
// Session::idem_gate once the key is recorded in flight; Session::idem_settle (the answer ended)
// or Session::idem_after (the exchange failed) decides the key's fate, once.
struct Keyed {
  explicit Keyed(std::uint64_t max_body) : cap(max_body) {}
  store::KeyRecord rec;  // resource, scope, key, fingerprint, generation
  Capture cap;
  std::vector<int> release_statuses, unknown_statuses;  // the route's (fate_of)
};

// The replay of a completed key's response: its status line, its recorded fields, Content-Length,
// Date, Idempotent-Replayed: true and the fence headers. A response recorded by status only gets
// a problem+json body that says the original body was not kept.
std::string replay_response(const store::KeyRecord& rec, bool keep_alive, int version, const FenceHeaders& fence,
                            bool head_only);

// The problems (types urn:fencegate:problem:idempotency-*).
Problem malformed(const std::string& header, const std::string& why);   // 400
Problem missing(const std::string& header);                             // 400
Problem mismatch(const std::string& key);                               // 422
Problem in_flight(const std::string& key);                              // 409 (+ Retry-After)
Problem outcome_unknown(const std::string& key);                        // 409
Problem limit(const std::string& resource, std::uint64_t max_keys);      // 503
Problem store_failed(const std::string& why);                           // 503
Problem body_too_large();                                               // 413
// The seconds in the Retry-After of an in-flight refusal.
inline constexpr int kRetryAfterSeconds = 1;

// Adds "Name: value\r\n" after the status line of a reply built by local_reply.
std::string with_field(std::string reply, std::string_view name, std::string_view value);

}  // namespace fencegate::proxy::idem
