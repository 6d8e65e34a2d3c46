// Idempotency keys, the pure half (see idempotency.h): key parsing, fingerprints, fates, the
// capture and replay of a response, the problems.
#include "proxy/idempotency.h"

#include <openssl/evp.h>

#include <algorithm>
#include <array>
#include <stdexcept>

namespace fencegate::proxy::idem {

namespace {

constexpr char kHex[] = "0123456789abcdef";

std::string hex(const unsigned char* p, unsigned n) {
  std::string out(2 * static_cast<std::size_t>(n), '0');
  for (unsigned i = 0; i < n; ++i) {
    out[2 * i] = kHex[p[i] >> 4];
    out[2 * i + 1] = kHex[p[i] & 15];
  }
  return out;
}

// SHA-256, fetched from OpenSSL's default provider once. Given the legacy EVP_sha256(), OpenSSL 3
// fetches the algorithm again (a locked lookup) at every digest's init: a keyed request makes
// two digests.
const EVP_MD* sha256() {
  static const EVP_MD* const md = [] {
    const EVP_MD* m = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    return m ? m : EVP_sha256();
  }();
  return md;
}

bool ows(char c) { return c == ' ' || c == '\t'; }

}  // namespace

std::optional<std::string> parse_key(std::string_view field, std::string* why) {
  std::string_view v = field;
  auto fail = [&](std::string w) -> std::optional<std::string> {
    if (why) *why = std::move(w);
    return std::nullopt;
  };
  while (!v.empty() && ows(v.front())) v.remove_prefix(1);
  while (!v.empty() && ows(v.back())) v.remove_suffix(1);
  if (v.empty() || v.front() != '"') return fail("the key must be a quoted string (RFC 8941), such as \"a1b2c3\"");
  std::string key;
  std::size_t i = 1;
  for (;; ++i) {
    if (i >= v.size()) return fail("the key's closing quote is missing");
    const unsigned char c = static_cast<unsigned char>(v[i]);
    if (c == '"') break;
    if (c == '\\') {
      if (i + 1 >= v.size()) return fail("the key ends in a lone backslash");
      const char e = v[++i];
      if (e != '"' && e != '\\') return fail("only \\\" and \\\\ may be escaped in a key");
      key += e;
    } else if (c < 0x20 || c > 0x7e) {
      return fail("the key may hold only printable ASCII characters (0x20-0x7E)");
    } else {
      key += static_cast<char>(c);
    }
    if (key.size() > kMaxKeyBytes) return fail("the key is longer than " + std::to_string(kMaxKeyBytes) + " bytes");
  }
  if (i + 1 != v.size()) {
    return fail(v[i + 1] == ';' ? "the key may not carry parameters" : "nothing may follow the key's closing quote");
  }
  if (key.empty()) return fail("the key is empty");
  return key;
}

std::string serialize_key(std::string_view key) {
  std::string out = "\"";
  for (char c : key) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  out += '"';
  return out;
}

struct Fingerprint::Impl {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ~Impl() { EVP_MD_CTX_free(ctx); }
};

Fingerprint::Fingerprint() : impl_(std::make_unique<Impl>()) {
  if (!impl_->ctx || EVP_DigestInit_ex(impl_->ctx, sha256(), nullptr) != 1)
    throw std::runtime_error("SHA-256 is not available from OpenSSL");
}
Fingerprint::~Fingerprint() = default;

void Fingerprint::update(std::string_view b) {
  if (!b.empty()) EVP_DigestUpdate(impl_->ctx, b.data(), b.size());
}

std::string Fingerprint::finish(std::string_view method, std::string_view target) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned n = 0;
  EVP_DigestFinal_ex(impl_->ctx, md.data(), &n);
  std::string text;
  text.reserve(method.size() + target.size() + 66);
  text.append(method).append(" ").append(target).append("\n").append(hex(md.data(), n));
  return sha256_hex(text);
}

std::string sha256_hex(std::string_view data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned n = 0;
  EVP_Digest(data.data(), data.size(), md.data(), &n, sha256(), nullptr);
  return hex(md.data(), n);
}

std::string fingerprint(std::string_view method, std::string_view target, std::string_view body) {
  Fingerprint f;
  f.update(body);
  return f.finish(method, target);
}

Fate fate_of(int status) {
  switch (status) {
    case 408:
    case 425:
    case 429:
    case 503: return Fate::release;
    case 502:
    case 504: return Fate::unknown;
    default: return Fate::record;
  }
}

Fate fate_of(int status, const std::vector<int>& release, const std::vector<int>& unknown) {
  if (std::find(release.begin(), release.end(), status) != release.end()) return Fate::release;
  if (std::find(unknown.begin(), unknown.end(), status) != unknown.end()) return Fate::unknown;
  return Fate::record;
}

bool describes_body(std::string_view name) {
  for (std::string_view n : {"Content-Type", "Content-Encoding", "Content-Language", "Content-Location",
                             "Content-Disposition", "ETag", "Last-Modified", "Location"})
    if (iequals(name, n)) return true;
  return false;
}

void Capture::head(const ResponseHead& rh) {
  have_head = true;
  status = rh.status;
  headers.clear();
  for (const auto& f : rh.fields) {
    if (!describes_body(f.name)) continue;
    headers.append(f.name).append(": ").append(f.value).append("\r\n");
  }
}

void Capture::body(std::string_view bytes) {
  if (!kept) return;
  if (data.size() + bytes.size() > max_body_) {
    kept = false;
    data.clear();
    data.shrink_to_fit();
    return;
  }
  data.append(bytes);
}

std::string replay_response(const store::KeyRecord& rec, bool keep_alive, int version, const FenceHeaders& fence,
                            bool head_only) {
  std::string body, headers;
  if (rec.body_kept) {
    body = rec.body;
    headers = rec.headers;
  } else {
    const Problem p(static_cast<unsigned>(rec.status), "idempotency-body-not-kept", "Response body not kept",
                    "this is a replay of the response to operation " + serialize_key(rec.key) +
                        "; its body was larger than the route's idempotency.max_body_bytes and was not kept");
    body = problem_body(p);
    headers = "Content-Type: application/problem+json\r\n";
  }
  std::string r = version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ";
  r += std::to_string(rec.status);
  r += ' ';
  r += reason_phrase(static_cast<unsigned>(rec.status));
  r += "\r\nDate: ";
  r += http_date();
  r += "\r\n";
  r += headers;
  r += kReplayedHeader;
  r += ": true\r\n";
  const bool no_content = rec.status == 204 || rec.status == 304 || (rec.status >= 100 && rec.status < 200);
  if (!no_content) r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  if (fence.generation) r += "Fencing-Generation: " + std::to_string(*fence.generation) + "\r\n";
  if (!fence.observe.empty()) r += "Fencing-Observe: " + fence.observe + "\r\n";
  if (!keep_alive) r += "Connection: close\r\n";
  else if (version == 10) r += "Connection: keep-alive\r\n";
  r += "\r\n";
  if (!head_only && !no_content) r += body;
  return r;
}

Problem malformed(const std::string& header, const std::string& why) {
  return Problem(400, "idempotency-key-malformed", "Malformed idempotency key",
                 header + " must be a Structured Field string (RFC 8941): " + why);
}
Problem missing(const std::string& header) {
  return Problem(400, "idempotency-key-missing", "Idempotency key missing",
                 "this route requires an operation ID in the " + header + " header");
}
Problem mismatch(const std::string& key) {
  return Problem(422, "idempotency-key-mismatch", "Idempotency key reused",
                 "operation " + serialize_key(key) +
                     " was first used for another request (method, target or body differ); a key names one "
                     "operation");
}
Problem in_flight(const std::string& key) {
  return Problem(409, "idempotency-in-flight", "Operation in progress",
                 "operation " + serialize_key(key) + " is still in progress; retry after it has finished");
}
Problem outcome_unknown(const std::string& key) {
  return Problem(409, "idempotency-outcome-unknown", "Outcome of the operation unknown",
                 "operation " + serialize_key(key) +
                     " reached the upstream but no complete answer came back, so whether it took effect is unknown; "
                     "it is not forwarded again. An operator can look it up and clear it: GET/DELETE "
                     "/v1/resources/{id}/idempotency/{key} on the admin API, or fencegate keys");
}
Problem limit(const std::string& resource, std::uint64_t max_keys) {
  return Problem(503, "idempotency-limit", "Too many idempotency keys",
                 "resource " + resource + " holds its idempotency.max_keys (" + std::to_string(max_keys) +
                     ") live keys; new keyed writes are refused until keys expire");
}
Problem store_failed(const std::string& why) {
  return Problem(503, "store-unavailable", "Service unavailable",
                 "the operation ID could not be recorded durably, so the write was not forwarded: " + why);
}
Problem body_too_large() {
  return Problem(413, "body-too-large", "Content too large",
                 "a keyed write's body is read whole before it is forwarded: at most " +
                     std::to_string(kMaxKeyedBodyBytes) + " bytes");
}

std::string with_field(std::string reply, std::string_view name, std::string_view value) {
  const std::size_t eol = reply.find("\r\n");
  if (eol == std::string::npos) return reply;
  std::string f;
  f.append(name).append(": ").append(value).append("\r\n");
  reply.insert(eol + 2, f);
  return reply;
}

}  // namespace fencegate::proxy::idem
