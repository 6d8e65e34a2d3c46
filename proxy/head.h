// Strict HTTP/1.1 request-head scanning and framing checks.
//
// The proxy is the only gate to the resource, so anything a lenient parser downstream could read
// differently is refused here before a byte goes upstream: obsolete line folding, bare CR or LF,
// control bytes, whitespace before a colon, invalid field names, duplicate or list-valued
// Content-Length, Content-Length with Transfer-Encoding, any transfer coding but a single
// "chunked", Transfer-Encoding on HTTP/1.0, missing or repeated Host, and fields named like
// Content-Length, Transfer-Encoding, Fencing-Token, Fencing-Leader or X-Forwarded-For with "_"
// for "-" (CGI-style servers read them as such).
//
// Pure functions on bytes; no I/O. Thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fencegate::proxy {

// The fields the relay treats specially, recognised once while the head is scanned (so the
// relay never compares a field name twice). Names are ASCII case-insensitive.
enum class FieldKind : std::uint8_t {
  other,
  host,
  content_length,
  transfer_encoding,
  framing_alias,  // Content_Length, Transfer_Encoding, Fencing_Token, Fencing_Leader, X_Forwarded_For:
                  // "_" for "-" (refused, see above)
  connection,
  upgrade,
  hop_by_hop,     // Keep-Alive, Proxy-Connection, TE, Trailer, Proxy-Authenticate, Proxy-Authorization
  expect,
  x_forwarded_for,
  forwarded,
  user_agent,
  fencing_generation,
  fencing_observe,
  fencing_token,   // under its default name; a configured other name is looked up with count()
  fencing_leader,  // likewise
};
inline constexpr std::uint32_t kind_bit(FieldKind k) { return 1u << static_cast<unsigned>(k); }

// The kind of a field named `name`.
FieldKind classify_field(std::string_view name);

// Whether `name` is `dashed` with "_" for at least one "-" (and any letter case): a name that
// CGI-style servers read as `dashed`.
bool underscore_alias(std::string_view name, std::string_view dashed);

struct HeadField {
  std::string_view name;
  std::string_view value;  // leading and trailing whitespace removed
  FieldKind kind = FieldKind::other;
};

struct RequestHead {
  std::string_view method;
  std::string_view target;
  int version = 11;  // 10 or 11
  std::vector<HeadField> fields;
  std::uint32_t kinds = 0;  // kind_bit() of every field's kind
  bool has(FieldKind k) const { return (kinds & kind_bit(k)) != 0; }

  // Number of fields named `name` (case-insensitive) and the first one's value.
  std::size_t count(std::string_view name, std::string_view* first = nullptr) const;
  // The first User-Agent value ("" if none).
  std::string_view user_agent() const;
};

// `s` cut to `max` bytes for an audit row, marked "...(truncated)" when cut: a value kept in part
// must not pass for the whole one (a target without its query, a leader that is another's prefix).
std::string clipped(std::string_view s, std::size_t max);

enum class HeadStatus { incomplete, complete, bad, too_large };

struct HeadScan {
  HeadStatus status = HeadStatus::incomplete;
  std::size_t length = 0;  // bytes of the head including the final CRLF (iff complete)
  std::string reason;      // iff bad
};

// Scans `data` (bytes received so far) for a complete request head of at most `max_bytes`.
// On `complete`, fills *out with views into `data` (otherwise *out is unspecified).
HeadScan scan_request_head(std::string_view data, std::size_t max_bytes, RequestHead* out);

// Returns true iff `data` cannot become a valid head by receiving more bytes, judging only the
// bytes from `from` on (cheap incremental check: a bare CR or LF, or a NUL; size limits are
// scan_request_head's).
bool head_prefix_hopeless(std::string_view data, std::size_t from);

struct Framing {
  bool ok = false;
  std::string reason;                 // iff !ok
  std::optional<std::uint64_t> content_length;
  bool chunked = false;
};

// Checks message framing and Host of a complete head.
Framing check_framing(const RequestHead& h);

// An upstream's response head (views into the scanned bytes).
struct ResponseHead {
  int version = 11;  // 10 or 11
  int status = 0;
  std::vector<HeadField> fields;
  std::uint32_t kinds = 0;  // kind_bit() of every field's kind
  bool has(FieldKind k) const { return (kinds & kind_bit(k)) != 0; }
  std::size_t count(std::string_view name, std::string_view* first = nullptr) const;
};

// Scans `data` for a complete response head (status line and fields, the same field rules as
// requests). On `complete`, fills *out with views into `data` (otherwise *out is unspecified).
HeadScan scan_response_head(std::string_view data, std::size_t max_bytes, ResponseHead* out);

// ASCII case-insensitive equality (field names, tokens).
inline bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    unsigned char x = static_cast<unsigned char>(a[i]), y = static_cast<unsigned char>(b[i]);
    if (x == y) continue;
    if ((x | 0x20) != (y | 0x20) || (x | 0x20) < 'a' || (x | 0x20) > 'z') return false;
  }
  return true;
}

// RFC 9110 tchar: the characters of tokens and field names.
inline bool is_tchar(unsigned char c) {
  static constexpr auto kTable = [] {
    std::array<bool, 256> t{};
    for (int c = '0'; c <= '9'; ++c) t[c] = true;
    for (int c = 'a'; c <= 'z'; ++c) t[c] = t[c - 32] = true;
    for (char c : std::string_view("!#$%&'*+-.^_`|~")) t[static_cast<unsigned char>(c)] = true;
    return t;
  }();
  return kTable[c];
}

}  // namespace fencegate::proxy
