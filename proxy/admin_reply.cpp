// The admin API's replies: a status, a content type and a body (JSON or problem+json), and the
// bytes of an HTTP/1.1 answer made from one. No I/O.
#include <nlohmann/json.hpp>

#include "config/router.h"
#include "proxy/admin_session.h"
#include "proxy/audit_json.h"
#include "proxy/local_reply.h"

namespace fencegate::proxy::admin_detail {

namespace {

// The audit log and the fence state hold request bytes as they came (a header value need not be
// UTF-8): invalid sequences are sent as U+FFFD rather than failing the whole answer.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"; }

}  // namespace

// The bytes of an answer: its head and, unless `with_body` is false (HEAD), its body.
std::string response_bytes(const Reply& rep, bool keep, bool with_body) {
  std::string out = "HTTP/1.1 " + std::to_string(rep.status) + " " + reason_phrase(rep.status) +
                    "\r\nContent-Type: " + rep.content_type + "\r\nContent-Length: " + std::to_string(rep.body.size()) +
                    "\r\nCache-Control: no-store\r\n" + rep.extra_headers + (keep ? "" : "Connection: close\r\n") +
                    "\r\n";
  if (with_body) out += rep.body;
  return out;
}

Reply json_reply(unsigned status, const json& j) {
  Reply r;
  r.status = status;
  r.body = dump(j);
  return r;
}

// A problem+json reply (local_reply.h builds the body); `extra` adds members to it.
Reply problem(unsigned status, std::string type, std::string title, std::string detail, json extra) {
  std::string members;
  for (auto& [k, v] : extra.items()) {
    if (!members.empty()) members += ',';
    members += json(k).dump() + ":" + v.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  Reply r;
  r.status = status;
  r.content_type = "application/problem+json";
  r.body = problem_body(Problem{status, std::move(type), std::move(title), std::move(detail)}, members);
  return r;
}

Reply problem(const Problem& p) {
  Reply r;
  r.status = p.status;
  r.content_type = "application/problem+json";
  r.body = problem_body(p);
  return r;
}

// The mode the data path fences `resource` in; `off` routes never fence: only when no other route
// can make the name is it "off".
std::string mode_of(const config::Router& router, std::string_view resource) {
  bool off = false;
  if (const config::Route* r = router.owner_of(resource, &off)) return std::string(config::to_string(r->mode));
  return off ? "off" : "unrouted";
}

// A Host a loopback-only admin API answers to: "localhost" or an IP literal, with an optional

json audit_json(const store::AuditRecord& rec) {
  // One writer for an audit row, shared with `fencegate audit --json` (proxy/audit_json.h); the
  // object's fields and values are what they were.
  return json::parse(audit_row_json(rec));
}

}  // namespace fencegate::proxy::admin_detail
