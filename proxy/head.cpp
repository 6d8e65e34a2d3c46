#include "proxy/head.h"

#include <cctype>
#include <cstring>

namespace fencegate::proxy {

std::string_view RequestHead::user_agent() const {
  for (const auto& f : fields)
    if (f.kind == FieldKind::user_agent) return f.value;
  return {};
}

std::string clipped(std::string_view s, std::size_t max) {
  if (s.size() <= max) return std::string(s);
  std::string out(s.substr(0, max));
  out += "...(truncated)";
  return out;
}

std::size_t RequestHead::count(std::string_view name, std::string_view* first) const {
  std::size_t n = 0;
  for (const auto& f : fields) {
    if (iequals(f.name, name)) {
      if (n == 0 && first) *first = f.value;
      ++n;
    }
  }
  return n;
}

namespace {

// iequals() with "_" in `name` read as "-" (`dashed` has only "-"); *underscore says if any was.
bool iequals_dashed(std::string_view name, std::string_view dashed, bool* underscore) {
  if (name.size() != dashed.size()) return false;
  bool u = false;
  for (std::size_t i = 0; i < name.size(); ++i) {
    const char x = name[i], y = dashed[i];
    if (x == y) continue;
    if (y == '-' && x == '_') {
      u = true;
      continue;
    }
    const char lx = static_cast<char>(x | 0x20);
    if (lx != static_cast<char>(y | 0x20) || lx < 'a' || lx > 'z') return false;
  }
  *underscore = u;
  return true;
}

}  // namespace

bool underscore_alias(std::string_view name, std::string_view dashed) {
  bool u = false;
  return iequals_dashed(name, dashed, &u) && u;
}

FieldKind classify_field(std::string_view n) {
  bool alias = false;
  switch (n.size()) {
    case 2:
      if (iequals(n, "TE")) return FieldKind::hop_by_hop;
      break;
    case 4:
      if (iequals(n, "Host")) return FieldKind::host;
      break;
    case 6:
      if (iequals(n, "Expect")) return FieldKind::expect;
      break;
    case 7:
      if (iequals(n, "Upgrade")) return FieldKind::upgrade;
      if (iequals(n, "Trailer")) return FieldKind::hop_by_hop;
      break;
    case 9:
      if (iequals(n, "Forwarded")) return FieldKind::forwarded;
      break;
    case 10:
      if (iequals(n, "Connection")) return FieldKind::connection;
      if (iequals(n, "Keep-Alive")) return FieldKind::hop_by_hop;
      if (iequals(n, "User-Agent")) return FieldKind::user_agent;
      break;
    case 13:
      if (iequals(n, "Fencing-Token")) return FieldKind::fencing_token;
      if (underscore_alias(n, "Fencing-Token")) return FieldKind::framing_alias;
      break;
    case 14:
      if (n == "Content-Length" || n == "content-length") return FieldKind::content_length;  // the usual spellings
      if (iequals_dashed(n, "Content-Length", &alias))
        return alias ? FieldKind::framing_alias : FieldKind::content_length;
      if (iequals(n, "Fencing-Leader")) return FieldKind::fencing_leader;
      if (underscore_alias(n, "Fencing-Leader")) return FieldKind::framing_alias;
      break;
    case 15:
      if (iequals(n, "X-Forwarded-For")) return FieldKind::x_forwarded_for;
      if (underscore_alias(n, "X-Forwarded-For")) return FieldKind::framing_alias;
      if (iequals(n, "Fencing-Observe")) return FieldKind::fencing_observe;
      break;
    case 16:
      if (iequals(n, "Proxy-Connection")) return FieldKind::hop_by_hop;
      break;
    case 17:
      if (n == "Transfer-Encoding" || n == "transfer-encoding") return FieldKind::transfer_encoding;
      if (iequals_dashed(n, "Transfer-Encoding", &alias))
        return alias ? FieldKind::framing_alias : FieldKind::transfer_encoding;
      break;
    case 18:
      if (iequals(n, "Fencing-Generation")) return FieldKind::fencing_generation;
      if (iequals(n, "Proxy-Authenticate")) return FieldKind::hop_by_hop;
      break;
    case 19:
      if (iequals(n, "Proxy-Authorization")) return FieldKind::hop_by_hop;
      break;
    default: break;
  }
  return FieldKind::other;
}

namespace {

HeadScan bad(std::string reason) {
  HeadScan s;
  s.status = HeadStatus::bad;
  s.reason = std::move(reason);
  return s;
}

inline bool is_field_vchar(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7f); }

// Eight bytes of field-value text (no byte below 0x20, none 0x7f)? A block that fails holds a
// CR (the value's end), a tab, or a byte a value may not hold; it is then looked at byte by byte.
inline bool plain_block(const char* p) {
  std::uint64_t x;
  std::memcpy(&x, p, 8);
  const std::uint64_t below_space = (x - 0x2020202020202020ULL) & ~x & 0x8080808080808080ULL;
  const std::uint64_t y = x ^ 0x7f7f7f7f7f7f7f7fULL;
  const std::uint64_t del = (y - 0x0101010101010101ULL) & ~y & 0x8080808080808080ULL;
  return (below_space | del) == 0;
}

// Why the field line at `at` (its name does not end at a colon) is refused.
const char* bad_name(std::string_view head, std::size_t at) {
  std::string_view line = head.substr(at, head.find("\r\n", at) - at);
  if (line.empty()) return "malformed header block";
  const std::size_t c = line.find(':');
  if (c == std::string_view::npos || c == 0) return "header line without a field name";
  return "invalid character in header field name";
}

// Parses the field lines of `head` (every line ends in CRLF) from `pos` on, in one pass: a
// name is the run of token characters up to its colon, a value runs (checked eight bytes at a
// time) up to the CR of its line's CRLF. Returns nullptr, or why the block is refused.
const char* scan_fields(std::string_view head, std::size_t pos, std::vector<HeadField>* fields, std::uint32_t* kinds) {
  *kinds = 0;
  const char* const base = head.data();
  const std::size_t size = head.size();
  while (pos < size) {
    const unsigned char first = static_cast<unsigned char>(base[pos]);
    if (first == ' ' || first == '\t') return "obsolete line folding in a header";
    std::size_t i = pos;
    while (i < size && is_tchar(static_cast<unsigned char>(base[i]))) ++i;
    if (i == pos || i == size || base[i] != ':') return bad_name(head, pos);
    const std::string_view name(base + pos, i - pos);
    const std::size_t v = i + 1;
    std::size_t j = v;
    for (;;) {
      while (j + 8 <= size && plain_block(base + j)) j += 8;
      const std::size_t stop = std::min(j + 8, size);
      while (j < stop && is_field_vchar(static_cast<unsigned char>(base[j]))) ++j;
      if (j < stop || j == size) break;
    }
    if (j + 1 >= size || base[j] != '\r' || base[j + 1] != '\n') return "invalid character in header field value";
    std::string_view value(base + v, j - v);
    pos = j + 2;
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    const FieldKind kind = classify_field(name);
    *kinds |= kind_bit(kind);
    fields->push_back({name, value, kind});
  }
  return nullptr;
}

}  // namespace

bool head_prefix_hopeless(std::string_view data, std::size_t from) {
  for (std::size_t i = from; i < data.size(); ++i) {
    char c = data[i];
    if (c == '\0') return true;
    if (c == '\n' && (i == 0 || data[i - 1] != '\r')) return true;
    if (i > 0 && data[i - 1] == '\r' && c != '\n') return true;
  }
  return false;
}

HeadScan scan_request_head(std::string_view data, std::size_t max_bytes, RequestHead* out) {
  // Find the end of the head first: nothing is judged until the head is whole (or hopeless).
  std::size_t end = data.find("\r\n\r\n");
  if (end == std::string_view::npos) {
    if (head_prefix_hopeless(data, 0)) return bad("bare CR or LF, or NUL, in the request head");
    HeadScan s;
    s.status = data.size() >= max_bytes ? HeadStatus::too_large : HeadStatus::incomplete;
    return s;
  }
  const std::size_t length = end + 4;
  if (length > max_bytes) {
    HeadScan s;
    s.status = HeadStatus::too_large;
    return s;
  }
  std::string_view head = data.substr(0, end + 2);  // every line ends in CRLF
  if (head.size() >= 2 && head.substr(0, 2) == "\r\n") return bad("empty line before the request line");

  RequestHead local;
  RequestHead& h = out ? *out : local;  // filled in place: its field vector's memory is reused
  h.fields.clear();
  h.kinds = 0;
  std::size_t pos = 0;
  auto next_line = [&](std::string_view& line) -> bool {
    std::size_t e = head.find("\r\n", pos);
    if (e == std::string_view::npos) return false;
    line = head.substr(pos, e - pos);
    pos = e + 2;
    return true;
  };

  std::string_view line;
  next_line(line);
  // request-line = method SP request-target SP HTTP-version
  std::size_t sp1 = line.find(' ');
  if (sp1 == std::string_view::npos || sp1 == 0) return bad("malformed request line");
  h.method = line.substr(0, sp1);
  if (h.method.size() > 32) return bad("method too long");
  for (unsigned char c : h.method)
    if (!is_tchar(c)) return bad("invalid character in method");
  std::size_t sp2 = line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || sp2 == sp1 + 1) return bad("malformed request line");
  h.target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  for (unsigned char c : h.target)
    if (c <= 0x20 || c >= 0x7f) return bad("invalid character in request target");
  std::string_view version = line.substr(sp2 + 1);
  if (version == "HTTP/1.1") h.version = 11;
  else if (version == "HTTP/1.0") h.version = 10;
  else return bad("unsupported HTTP version (HTTP/1.1 and HTTP/1.0 only)");

  if (const char* why = scan_fields(head, pos, &h.fields, &h.kinds)) return bad(why);

  HeadScan s;
  s.status = HeadStatus::complete;
  s.length = length;
  return s;
}

namespace {

// Host = uri-host [ ":" port ] (RFC 9110 7.2, RFC 3986 3.2.2): an IP literal in brackets, or
// unreserved, sub-delims and percent-encoded bytes; the port is digits. Empty is allowed (a
// target with no authority). Anything else ("a b", "x/y", "u@h") an upstream or a virtual-host
// router may read another way than we do.
bool valid_host(std::string_view v) {
  std::size_t i = 0;
  if (!v.empty() && v[0] == '[') {
    const std::size_t close = v.find(']');
    if (close == std::string_view::npos || close == 1) return false;
    for (char c : v.substr(1, close - 1))
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == ':' || c == '.' || c == '%' || c == '-' || c == '_' ||
            c == '~'))  // IPv6 (with an RFC 6874 zone) or IPvFuture
        return false;
    i = close + 1;
  } else {
    for (; i < v.size() && v[i] != ':'; ++i) {
      const char c = v[i];
      const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_' || c == '~' ||
                      c == '%' || c == '!' || c == '$' || c == '&' || c == '\'' || c == '(' || c == ')' || c == '*' ||
                      c == '+' || c == ',' || c == ';' || c == '=';
      if (!ok) return false;
    }
  }
  if (i == v.size()) return true;
  if (v[i] != ':') return false;
  // port = *DIGIT (RFC 3986 3.2.3): empty is allowed; a port given must name one, 1..65535.
  const std::string_view port = v.substr(i + 1);
  if (port.empty()) return true;
  unsigned value = 0;
  for (char c : port) {
    if (c < '0' || c > '9') return false;
    value = value * 10 + static_cast<unsigned>(c - '0');
    if (value > 65535) return false;
  }
  return value >= 1;
}

}  // namespace

Framing check_framing(const RequestHead& h) {
  Framing f;
  std::string_view cl, te, host;
  std::size_t ncl = 0, nte = 0, nhost = 0;
  std::string_view alias;
  for (const auto& fl : h.fields) {
    switch (fl.kind) {
      case FieldKind::content_length:
        if (ncl++ == 0) cl = fl.value;
        break;
      case FieldKind::transfer_encoding:
        if (nte++ == 0) te = fl.value;
        break;
      case FieldKind::host:
        if (nhost++ == 0) host = fl.value;
        break;
      case FieldKind::framing_alias:
        if (alias.empty()) alias = fl.name;
        break;
      default: break;
    }
  }
  auto fail = [&](std::string r) {
    f.ok = false;
    f.reason = std::move(r);
    return f;
  };
  if (ncl > 1) return fail("several Content-Length headers");
  if (nte > 1) return fail("several Transfer-Encoding headers");
  if (ncl && nte) return fail("both Content-Length and Transfer-Encoding");
  // CGI-style stacks (CGI, WSGI, Rack, PHP behind FastCGI) map "_" and "-" in header names to the
  // same variable, so "Transfer_Encoding" or "Content_Length" may frame the body there while we
  // forward it as an unknown field, and "Fencing_Token" may join the token we checked (WSGI's
  // HTTP_FENCING_TOKEN = "3,7"). No client needs such a name.
  if (!alias.empty()) {
    std::string dashed(alias);
    for (char& ch : dashed)
      if (ch == '_') ch = '-';
    return fail("header " + std::string(alias) + " reads as " + dashed + " to CGI-style servers (\"_\" for \"-\")");
  }
  if (ncl) {
    if (cl.empty() || cl.size() > 19) return fail("invalid Content-Length");
    std::uint64_t n = 0;
    for (char c : cl) {
      if (c < '0' || c > '9') return fail("invalid Content-Length");
      n = n * 10 + static_cast<std::uint64_t>(c - '0');
    }
    f.content_length = n;
  }
  if (nte) {
    if (h.version == 10) return fail("Transfer-Encoding in an HTTP/1.0 request");
    if (!iequals(te, "chunked")) return fail("unsupported transfer coding (only a single \"chunked\")");
    f.chunked = true;
  }
  if (h.version == 11 && nhost != 1) return fail(nhost ? "several Host headers" : "missing Host header");
  if (h.version == 10 && nhost > 1) return fail("several Host headers");
  if (nhost && !valid_host(host)) return fail("invalid Host header (want host or host:port)");
  f.ok = true;
  return f;
}

HeadScan scan_response_head(std::string_view data, std::size_t max_bytes, ResponseHead* out) {
  std::size_t end = data.find("\r\n\r\n");
  if (end == std::string_view::npos) {
    if (head_prefix_hopeless(data, 0)) return bad("bare CR or LF, or NUL, in the response head");
    HeadScan s;
    s.status = data.size() >= max_bytes ? HeadStatus::too_large : HeadStatus::incomplete;
    return s;
  }
  if (end + 4 > max_bytes) {
    HeadScan s;
    s.status = HeadStatus::too_large;
    return s;
  }
  std::string_view head = data.substr(0, end + 2);
  std::size_t eol = head.find("\r\n");
  std::string_view line = head.substr(0, eol);
  // status-line = HTTP-version SP 3DIGIT SP [ reason-phrase ]   (a missing last SP is tolerated)
  ResponseHead local;
  ResponseHead& h = out ? *out : local;
  h.fields.clear();
  h.kinds = 0;
  if (line.size() < 12 || line.substr(0, 7) != "HTTP/1." || (line[7] != '0' && line[7] != '1') || line[8] != ' ')
    return bad("malformed status line");
  h.version = line[7] == '1' ? 11 : 10;
  for (int i = 9; i < 12; ++i)
    if (line[i] < '0' || line[i] > '9') return bad("malformed status code");
  h.status = (line[9] - '0') * 100 + (line[10] - '0') * 10 + (line[11] - '0');
  if (h.status < 100) return bad("malformed status code");
  if (line.size() > 12) {
    if (line[12] != ' ') return bad("malformed status line");
    for (unsigned char c : line.substr(13))
      if (!is_field_vchar(c)) return bad("invalid character in reason phrase");
  }
  if (const char* why = scan_fields(head, eol + 2, &h.fields, &h.kinds)) return bad(why);
  HeadScan s;
  s.status = HeadStatus::complete;
  s.length = end + 4;
  return s;
}

std::size_t ResponseHead::count(std::string_view name, std::string_view* first) const {
  std::size_t n = 0;
  for (const auto& f : fields)
    if (iequals(f.name, name)) {
      if (n++ == 0 && first) *first = f.value;
    }
  return n;
}

}  // namespace fencegate::proxy
