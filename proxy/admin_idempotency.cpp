// Issue 30: the admin API's idempotency-key endpoints (see admin_idempotency.h).
#include "proxy/admin_idempotency.h"

#include <cctype>
#include <future>

#include "common/hex.h"
#include "common/json.h"
#include "proxy/local_reply.h"
#include "proxy/timefmt.h"

namespace fencegate::proxy {

namespace {

AdminAnswer problem_answer(unsigned status, std::string type, std::string title, std::string detail) {
  AdminAnswer a;
  a.status = status;
  a.content_type = "application/problem+json";
  a.body = problem_body(Problem{status, std::move(type), std::move(title), std::move(detail)});
  return a;
}

bool valid_resource(std::string_view r) {
  if (r.empty() || r.size() > 256) return false;
  for (unsigned char c : r)
    if (!(std::isalnum(c) || c == '.' || c == '_' || c == '~' || c == '-' || c == ':')) return false;
  return true;
}

}  // namespace

bool percent_decode(std::string_view in, std::string* out) {
  out->clear();
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      *out += in[i];
      continue;
    }
    if (i + 2 >= in.size()) return false;
    const int hi = common::hex_value(static_cast<unsigned char>(in[i + 1])),
              lo = common::hex_value(static_cast<unsigned char>(in[i + 2]));
    if (hi < 0 || lo < 0) return false;
    *out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return true;
}

std::string key_json(const store::KeyRecord& r) {
  std::string j =
      "{\"key\":" + json::quote(r.key) + ",\"state\":" + json::quote(store::to_string(r.state)) + ",\"status\":" +
      (r.state == store::KeyState::in_flight || r.status == 0 ? std::string("null") : std::to_string(r.status)) +
      ",\"created_at\":" + json::quote(format_rfc3339_ms(r.created_ms)) +
      ",\"expires_at\":" + json::quote(format_rfc3339_ms(r.expires_ms)) +
      ",\"generation\":" + std::to_string(r.generation) + ",\"resource\":" + json::quote(r.resource);
  if (!r.scope.empty()) j += ",\"client\":" + json::quote(r.scope);
  if (r.state == store::KeyState::completed) j += std::string(",\"body_kept\":") + (r.body_kept ? "true" : "false");
  j += ",\"fingerprint\":" + json::quote(r.fingerprint) + "}";
  return j;
}

AdminAnswer idempotency_endpoint(store::Store& store, std::string_view method, std::string_view rest,
                                 const std::map<std::string, std::string>& q) {
  static constexpr std::string_view kMid = "/idempotency/";
  const std::size_t at = rest.find(kMid);
  const std::string resource(rest.substr(0, at));
  std::string key;
  if (!valid_resource(resource))
    return problem_answer(400, "bad-resource", "Bad request", "a resource name is 1-256 of [A-Za-z0-9._~:-]");
  if (!percent_decode(rest.substr(at + kMid.size()), &key) || key.empty() || key.size() > 255)
    return problem_answer(400, "bad-key", "Bad request",
                          "the key is 1-255 bytes, percent-encoded (%XX) where it is not a path character");
  if (method != "GET" && method != "HEAD" && method != "DELETE") {
    AdminAnswer a = problem_answer(405, "method-not-allowed", "Method not allowed", "GET, HEAD or DELETE");
    return a;
  }
  auto c = q.find("client");
  const std::string scope = c == q.end() ? std::string() : c->second;
  store::KeyRecord rec;
  store::Status st = store::Status::OK();
  const bool found = store.key_get(resource, scope, key, &rec, &st);
  if (!st.ok()) return problem_answer(503, "store-unavailable", "Service unavailable", st.message());
  if (!found)
    return problem_answer(404, "no-such-key", "Not found",
                          "resource " + resource + " holds no idempotency key " + json::quote(key) +
                              (scope.empty() ? "" : " for client " + scope));
  if (method == "DELETE") {
    std::promise<store::Status> done;
    auto f = done.get_future();
    store.key_release(resource, scope, key, [&done](store::Status s) { done.set_value(std::move(s)); });
    const store::Status s = f.get();
    if (!s.ok()) return problem_answer(503, "store-unavailable", "Service unavailable", s.message());
    AdminAnswer a;
    a.body = "{\"deleted\":" + key_json(rec) + "}\n";
    return a;
  }
  AdminAnswer a;
  a.body = key_json(rec) + "\n";
  return a;
}

}  // namespace fencegate::proxy
