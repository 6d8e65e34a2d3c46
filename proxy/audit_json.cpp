// One audit row as JSON, shared by `fencegate audit --json` and GET /v1/audit (see audit_json.h).
#include "proxy/audit_json.h"

#include <cstdio>

#include "common/json.h"
#include "proxy/timefmt.h"

namespace fencegate::proxy {

// Decodes one UTF-8 sequence at s[*i] and advances. Returns the code point, or -1 for an invalid
// byte (consumed alone).
std::int32_t next_code_point(std::string_view s, std::size_t* i) {
  const auto b0 = static_cast<unsigned char>(s[*i]);
  if (b0 < 0x80) {
    ++*i;
    return b0;
  }
  int len;
  std::int32_t cp, min;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    ++*i;
    return -1;
  }
  if (*i + static_cast<std::size_t>(len) > s.size()) {
    ++*i;
    return -1;
  }
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[*i + static_cast<std::size_t>(k)]);
    if ((b & 0xC0) != 0x80) {
      ++*i;
      return -1;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++*i;
    return -1;
  }
  *i += static_cast<std::size_t>(len);
  return cp;
}

bool is_control(std::int32_t cp) { return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F); }

namespace {

void json_string(std::string* out, std::string_view s) { json::append_string(*out, s); }

}  // namespace

void append_audit_row_json(std::string* out, const store::AuditRecord& rec) {
  const auto& r = rec.row;
  *out += "{\"id\":" + std::to_string(rec.id) + ",\"time\":";
  json_string(out, format_rfc3339_ms(r.time_ms));
  *out += ",\"resource\":";
  json_string(out, r.resource);
  *out += ",\"decision\":";
  json_string(out, r.decision);
  // No valid token presented is null, not 0.
  *out += ",\"presented_generation\":" +
          (r.presented_generation ? std::to_string(r.presented_generation) : std::string("null"));
  *out += ",\"current_generation\":" + std::to_string(r.current_generation);
  *out += ",\"method\":";
  json_string(out, r.method);
  *out += ",\"target\":";
  json_string(out, r.target);
  *out += ",\"client\":";
  json_string(out, r.client);
  *out += ",\"leader\":";
  json_string(out, r.leader);
  *out += ",\"mode\":";
  json_string(out, r.mode);
  *out += ",\"user_agent\":";
  json_string(out, r.user_agent);
  *out += ",\"traceparent\":";  // W3C trace context of the request; "" when it had none
  json_string(out, r.traceparent);
  *out += ",\"client_identity\":";  // TLS (issue 27): the verified client certificate's identity; "" none
  json_string(out, r.client_identity);
  *out += ",\"member\":";  // fleet (issue 33): the replica's fleet member id; "" not in a fleet
  json_string(out, r.member);
  *out += '}';
}

std::string audit_row_json(const store::AuditRecord& rec) {
  std::string out;
  append_audit_row_json(&out, rec);
  return out;
}

}  // namespace fencegate::proxy
