// Fuzz target: the request framing path, proxy/head.h scan_request_head + check_framing
// (+ head_prefix_hopeless, the incremental check the server runs on each read).
//
// Properties on arbitrary bytes: never crashes; a complete head is the first CRLFCRLF-terminated
// prefix, within max_bytes, and every view lies inside it; the parsed head has no CR, LF, NUL or
// other control byte in a name or value, no obs-fold, a token method, a printable target; a head
// accepted whole is never judged hopeless by the incremental check; the result does not depend on
// bytes after the head, and a smaller max_bytes only turns `complete` into `too_large`;
// check_framing accepts at most one Content-Length (plain digits, value as written), never with
// Transfer-Encoding, a Transfer-Encoding only as a single "chunked" on HTTP/1.1, and exactly one
// Host on HTTP/1.1.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "proxy/head.h"
#include "tests/fuzz/fuzz_check.h"

using namespace fencegate::proxy;
using fencegate::fuzz::show;

namespace {

constexpr std::size_t kMaxHead = 16 * 1024;

bool inside(std::string_view part, std::string_view whole) {
  if (part.empty()) return part.data() == nullptr || (part.data() >= whole.data() && part.data() <= whole.data() + whole.size());
  return part.data() >= whole.data() && part.data() + part.size() <= whole.data() + whole.size();
}

bool lower_equal(std::string_view a, std::string_view b) {  // independent of iequals()
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

bool tchar(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
}

bool same_head(const RequestHead& a, const RequestHead& b) {
  if (a.method != b.method || a.target != b.target || a.version != b.version || a.fields.size() != b.fields.size())
    return false;
  for (std::size_t i = 0; i < a.fields.size(); ++i)
    if (a.fields[i].name != b.fields[i].name || a.fields[i].value != b.fields[i].value) return false;
  return true;
}

void check_head(std::string_view data, const HeadScan& s, const RequestHead& h) {
  const std::string in = "input " + show(data.substr(0, 512));
  FUZZ_CHECK(s.length >= 4 && s.length <= data.size() && s.length <= kMaxHead, in);
  const std::string_view head = data.substr(0, s.length);
  FUZZ_CHECK(head.substr(head.size() - 4) == "\r\n\r\n", in);
  FUZZ_CHECK(data.find("\r\n\r\n") == s.length - 4, "head does not end at the first CRLFCRLF; " + in);
  // No obs-fold (a line starting with SP/HTAB), no bare CR or LF, no NUL anywhere in the head.
  FUZZ_CHECK(head.find("\r\n ") == std::string_view::npos && head.find("\r\n\t") == std::string_view::npos,
             "obs-fold accepted; " + in);
  for (std::size_t i = 0; i < head.size(); ++i) {
    FUZZ_CHECK(head[i] != '\0', "NUL accepted; " + in);
    if (head[i] == '\r') FUZZ_CHECK(i + 1 < head.size() && head[i + 1] == '\n', "bare CR accepted; " + in);
    if (head[i] == '\n') FUZZ_CHECK(i > 0 && head[i - 1] == '\r', "bare LF accepted; " + in);
  }
  FUZZ_CHECK(!head_prefix_hopeless(head, 0), "complete head judged hopeless incrementally; " + in);

  FUZZ_CHECK(h.version == 10 || h.version == 11, in);
  FUZZ_CHECK(inside(h.method, head) && inside(h.target, head), "method/target views outside the head; " + in);
  FUZZ_CHECK(!h.method.empty() && h.method.size() <= 32, in);
  for (unsigned char c : h.method) FUZZ_CHECK(tchar(c), "non-token method " + show(h.method));
  FUZZ_CHECK(h.method.data() == head.data(), "request line does not start the head; " + in);
  FUZZ_CHECK(!h.target.empty(), in);
  for (unsigned char c : h.target)
    FUZZ_CHECK(c > 0x20 && c < 0x7f, "control, space or non-ASCII byte in target " + show(h.target));

  // Lines: request line + one per field + the empty line.
  std::size_t lines = 0;
  for (std::size_t p = 0; (p = head.find("\r\n", p)) != std::string_view::npos; p += 2) ++lines;
  FUZZ_CHECK(lines == h.fields.size() + 2, "field count does not match the header lines; " + in);

  const char* prev_end = h.target.data() + h.target.size();
  for (const HeadField& f : h.fields) {
    FUZZ_CHECK(inside(f.name, head) && inside(f.value, head), "field view outside the head; " + in);
    FUZZ_CHECK(!f.name.empty(), in);
    FUZZ_CHECK(f.name.data() > prev_end, "fields out of order; " + in);
    FUZZ_CHECK(f.name.data()[-1] == '\n' && f.name.data()[f.name.size()] == ':',
               "field name is not a whole name at the start of a line: " + show(f.name));
    for (unsigned char c : f.name) FUZZ_CHECK(tchar(c), "non-token field name " + show(f.name));
    for (unsigned char c : f.value)
      FUZZ_CHECK(c == '\t' || (c >= 0x20 && c != 0x7f), "control byte (CR/LF/NUL/...) in field value " + show(f.value));
    if (!f.value.empty()) {
      FUZZ_CHECK(f.value.front() != ' ' && f.value.front() != '\t' && f.value.back() != ' ' && f.value.back() != '\t',
                 "value not trimmed: " + show(f.value));
      FUZZ_CHECK(f.value.data() > f.name.data() + f.name.size(), in);
    }
    prev_end = f.name.data() + f.name.size();
  }

  // Framing.
  const Framing fr = check_framing(h);
  std::size_t ncl = 0, nte = 0, nhost = 0;
  std::string_view cl, te;
  for (const HeadField& f : h.fields) {
    if (lower_equal(f.name, "content-length") && ncl++ == 0) cl = f.value;
    if (lower_equal(f.name, "transfer-encoding") && nte++ == 0) te = f.value;
    if (lower_equal(f.name, "host")) ++nhost;
  }
  FUZZ_CHECK(h.count("Content-Length") == ncl && h.count("transfer-encoding") == nte && h.count("HOST") == nhost,
             "RequestHead::count disagrees; " + in);
  if (!fr.ok) {
    FUZZ_CHECK(!fr.reason.empty(), "refused without a reason; " + in);
    return;
  }
  FUZZ_CHECK(ncl <= 1, "several Content-Length accepted; " + in);
  FUZZ_CHECK(nte <= 1, "several Transfer-Encoding accepted; " + in);
  FUZZ_CHECK(!(ncl && nte), "Content-Length with Transfer-Encoding accepted; " + in);
  FUZZ_CHECK(!(fr.chunked && fr.content_length), "chunked and Content-Length at once; " + in);
  FUZZ_CHECK(fr.chunked == (nte == 1), in);
  if (nte) {
    FUZZ_CHECK(h.version == 11, "Transfer-Encoding accepted on HTTP/1.0; " + in);
    FUZZ_CHECK(lower_equal(te, "chunked"), "transfer coding other than a single chunked: " + show(te));
  }
  FUZZ_CHECK(fr.content_length.has_value() == (ncl == 1), in);
  if (ncl) {
    FUZZ_CHECK(!cl.empty() && cl.size() <= 19, "Content-Length " + show(cl));
    std::uint64_t n = 0;
    for (char c : cl) {
      FUZZ_CHECK(c >= '0' && c <= '9', "non-digit Content-Length accepted: " + show(cl));
      n = n * 10 + static_cast<std::uint64_t>(c - '0');
    }
    FUZZ_CHECK(*fr.content_length == n, "Content-Length " + show(cl) + " read as " + std::to_string(*fr.content_length));
  }
  if (h.version == 11) FUZZ_CHECK(nhost == 1, "HTTP/1.1 without exactly one Host accepted; " + in);
  else FUZZ_CHECK(nhost <= 1, "several Host accepted; " + in);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* bytes, std::size_t size) {
  const std::string_view data(reinterpret_cast<const char*>(bytes), size);

  RequestHead h;
  const HeadScan s = scan_request_head(data, kMaxHead, &h);
  const HeadScan s_null = scan_request_head(data, kMaxHead, nullptr);
  FUZZ_CHECK(s.status == s_null.status && s.length == s_null.length, "result depends on the out pointer");

  if (s.status == HeadStatus::bad) FUZZ_CHECK(!s.reason.empty(), "bad without a reason");
  if (s.status != HeadStatus::complete) {
    FUZZ_CHECK(s.length == 0, "length set on a non-complete scan");
    // Still incomplete: the incremental check must agree that more bytes could help.
    if (s.status == HeadStatus::incomplete) FUZZ_CHECK(!head_prefix_hopeless(data, 0), "incomplete but hopeless");
    return 0;
  }
  check_head(data, s, h);

  // The head alone gives the same result (bytes after it are body or the next request).
  RequestHead h2;
  const HeadScan alone = scan_request_head(data.substr(0, s.length), kMaxHead, &h2);
  FUZZ_CHECK(alone.status == HeadStatus::complete && alone.length == s.length && same_head(h, h2),
             "head result depends on the bytes after it");
  // One byte short is never complete.
  const HeadScan shorter = scan_request_head(data.substr(0, s.length - 1), kMaxHead, nullptr);
  FUZZ_CHECK(shorter.status != HeadStatus::complete, "head complete one byte early");
  // A smaller limit: complete iff the head fits, else too_large.
  const std::size_t limit = s.length - 1 - (size % 8);
  if (limit > 0 && limit < s.length) {
    const HeadScan small = scan_request_head(data, limit, nullptr);
    FUZZ_CHECK(small.status == HeadStatus::too_large, "head longer than max_bytes not refused as too_large");
  }
  const HeadScan exact = scan_request_head(data, s.length, nullptr);
  FUZZ_CHECK(exact.status == HeadStatus::complete && exact.length == s.length, "head of exactly max_bytes refused");
  return 0;
}
