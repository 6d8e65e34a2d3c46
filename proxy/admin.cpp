// The admin API's dispatcher: which endpoint a request is for, and the checks every request passes
// first (no requests from web pages, the Host check against DNS rebinding, the bearer token).
// The endpoints themselves are in admin_reads.cpp (reads), admin_fence.cpp (fence, DELETE); the
// connections in admin_conn.cpp.
#include "proxy/admin.h"

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "config/router.h"
#include "proxy/admin_idempotency.h"  // issue 30
#include "proxy/admin_query.h"
#include "proxy/admin_session.h"
#include "proxy/admin_ui.h"
#include "proxy/fleet.h"
#include "proxy/runtime.h"

namespace fencegate::proxy::admin_detail {

namespace {

bool valid_resource_name(std::string_view r) {
  if (r.empty() || r.size() > config::kMaxResourceName) return false;
  for (unsigned char c : r)
    if (!(std::isalnum(c) || c == '.' || c == '_' || c == '~' || c == '-' || c == ':')) return false;
  return true;
}

// port. A DNS-rebinding page reaches 127.0.0.1 under its own name, and that name is its Host.
bool loopback_host_ok(std::string_view host) {
  std::string_view name = host;
  if (!name.empty() && name.front() == '[') {
    const std::size_t close = name.find(']');
    if (close == std::string_view::npos) return false;
    std::string_view rest = name.substr(close + 1);
    if (!rest.empty() && (rest.front() != ':' || rest.size() == 1)) return false;
    boost::system::error_code ec;
    net::ip::make_address_v6(std::string(name.substr(1, close - 1)), ec);
    return !ec;
  }
  if (const std::size_t colon = name.rfind(':'); colon != std::string_view::npos) name = name.substr(0, colon);
  if (!name.empty() && name.back() == '.') name.remove_suffix(1);  // "localhost." is fully qualified
  // Names that resolve to loopback only (RFC 6761 reserves "localhost" and its subdomains;
  // Debian's /etc/hosts has the ip6- ones): no rebinding page can be served under them.
  if (iequals(name, "localhost") || iequals(name, "ip6-localhost") || iequals(name, "ip6-loopback") ||
      (name.size() > 10 && iequals(name.substr(name.size() - 10), ".localhost")))
    return true;
  boost::system::error_code ec;
  net::ip::make_address_v4(std::string(name), ec);
  return !ec;
}

bool constant_time_equals(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  return diff == 0;
}

struct Endpoint {
  const char* method;
  const char* path;
  const char* help;
};
constexpr Endpoint kEndpoints[] = {
    {"GET", "/", "this list"},
    {"GET", "/healthz", "200 while the process runs"},
    {"GET", "/readyz",
     "200 when it can serve safely (store writable, config loaded, not stopping); else 503 with the reason"},
    {"GET", "/metrics", "Prometheus metrics (fencegate_ prefix)"},
    {"GET", "/ui", "the status page (HTML): resources, live tail of refusals, unfenced callers, ready to enforce"},
    {"GET", "/v1/resources",
     "resources by name: generation, mode, when and by whom it last advanced, in-flight writes; "
     "?limit=&cursor=&prefix=&mode= (no limit: all)"},
    {"GET", "/v1/resources/{id}", "one resource"},
    {"GET", "/v1/resources/{id}/readiness",
     "ready to enforce? missing-token and stale writes of the resource within ?window= (default 24h), with the "
     "callers"},
    {"POST", "/v1/resources/{id}/fence",
     "activation barrier: advance to the generation in the token header or {\"generation\":N,\"leader\":\"...\"}, "
     "draining older writes; answers once durable; 409 if stale"},
    {"DELETE", "/v1/resources/{id}?confirm={id}",
     "remove a resource's fence (durably; audited resource_deleted): older generations become acceptable again; "
     "409 while writes of it are in flight"},
    {"GET", "/v1/audit", "audit rows newest first: ?resource=&decision=&since=&until=&leader=&limit=&cursor="},
    {"GET", "/v1/audit/unfenced", "callers still writing without a valid token, grouped: ?resource=&since=&limit="},
    {"POST", "/v1/config/reload", "re-read the config file (same as SIGHUP); a bad config is rejected whole"},
};

}  // namespace

awaitable<Reply> AdminSession::route(const RequestHead& h, std::string_view body) {
  Runtime& rt = admin_.rt;
  auto snap = rt.snapshot();
  const config::Config& cfg = *snap->cfg;
  std::string_view target = h.target;
  std::string_view path = target.substr(0, target.find('?'));
  std::string_view query = target.size() > path.size() ? target.substr(path.size() + 1) : std::string_view();
  const bool get = h.method == "GET" || h.method == "HEAD";
  const bool post = h.method == "POST";

  if (path == "/healthz" || path == "/readyz") {
    if (!get) {  // probes read; a write to a probe is a mistake worth saying (as elsewhere: 405)
      Reply r = problem(405, "method-not-allowed", "Method not allowed", "probes answer GET and HEAD");
      r.extra_headers = "Allow: GET, HEAD\r\n";
      co_return r;
    }
    co_return path == "/healthz" ? json_reply(200, {{"status", "ok"}}) : readyz();
  }

  // The admin API is not for browsers. Without a token it trusts whoever reaches loopback, and a
  // web page in a browser on this host reaches it too: a cross-site POST to the fence endpoint
  // could raise any resource to 2^63-1 (every later write 409), and a DNS-rebinding page could
  // read the audit log. Browsers mark such requests (Origin on cross-origin requests and on every
  // POST; Sec-Fetch-Site), and a rebinding page's Host is its own name. Command-line clients
  // (curl, fencegate elect, scripts) send none of these. The one page let in is the status page
  // (GET /ui) this listener serves itself: its same-origin reads, and a write only with the
  // custom Fencegate-UI header and the bearer token (checked below; never without a token).
  {
    std::string_view site, origin, host;
    const bool has_site = h.count("Sec-Fetch-Site", &site) == 1;
    const bool has_origin = h.count("Origin", &origin) > 0;
    const bool from_page = has_origin || h.count("Sec-Fetch-Site") > 1 || (has_site && !iequals(site, "none"));
    const bool one_host = h.count("Host", &host) == 1;
    const bool foreign_host = cfg.admin.token.empty() && one_host && !loopback_host_ok(host);
    // Same-origin by the browser's own word (a page cannot set Sec-Fetch-Site), and an Origin, when
    // sent, that is this very Host.
    const bool same_origin = has_site && iequals(site, "same-origin") && one_host &&
                             (!has_origin || (h.count("Origin") == 1 && origin == "http://" + std::string(host)));
    const bool page_ok = same_origin && (get || (h.count(kUiHeader) == 1 && !cfg.admin.token.empty()));
    if ((from_page && !page_ok) || foreign_host)
      co_return problem(403, "browser-request", "Forbidden",
                        foreign_host ? "without an admin token the admin API answers only to Host localhost or an IP "
                                       "address"
                        : same_origin
                            ? "a state-changing request from the status page needs the admin token and the " +
                                  std::string(kUiHeader) + " header"
                            : "the admin API does not take requests from web pages (Origin or Sec-Fetch-Site present) "
                              "other than the status page's own");
  }

  // The status page: static, no data in it (it reads the API like any client), so it needs no token.
  if (path == "/ui") {
    if (!get) {
      Reply r = problem(405, "method-not-allowed", "Method not allowed", "the status page answers GET and HEAD");
      r.extra_headers = "Allow: GET, HEAD\r\n";
      co_return r;
    }
    Reply r;
    r.content_type = "text/html; charset=utf-8";
    r.body = std::string(admin_ui_page());
    r.extra_headers = std::string(admin_ui_headers());
    co_return r;
  }

  if (!cfg.admin.token.empty()) {
    std::string_view auth;
    bool ok = h.count("Authorization", &auth) == 1 && auth.size() > 7 && iequals(auth.substr(0, 7), "Bearer ") &&
              constant_time_equals(auth.substr(7), cfg.admin.token);
    if (!ok) {
      note_unauthorized(h);
      Reply r = problem(401, "unauthorized", "Unauthorized", "this admin API needs Authorization: Bearer <token>");
      r.extra_headers = "WWW-Authenticate: Bearer realm=\"fencegate-admin\"\r\n";
      co_return r;
    }
  }

  std::string qerr;
  auto q = parse_query(query, &qerr);
  if (!qerr.empty()) co_return problem(400, "bad-query", "Bad request", qerr);
  auto method_not_allowed = [&] {
    Reply r = problem(405, "method-not-allowed", "Method not allowed", "see GET / for the endpoints");
    const bool post_only = path == "/v1/config/reload" || (path.size() > 6 && path.substr(path.size() - 6) == "/fence");
    r.extra_headers = post_only ? "Allow: POST\r\n" : "Allow: GET, HEAD\r\n";
    return r;
  };

  if (path == "/") {
    if (!get) co_return method_not_allowed();
    json list = json::array();
    for (const auto& e : kEndpoints) list.push_back({{"method", e.method}, {"path", e.path}, {"help", e.help}});
    co_return json_reply(200, {{"endpoints", list}});
  }
  if (path == "/metrics") {
    if (!get) co_return method_not_allowed();
    co_return metrics();
  }
  if (path == "/v1/fleet" && rt.fleet) {  // fleet (docs/fleet.md)
    if (!get) co_return method_not_allowed();
    Reply r;
    r.body = rt.fleet->status_json();
    co_return r;
  }
  if (path == "/v1/resources") {
    if (!get) co_return method_not_allowed();
    co_return co_await net::co_spawn(admin_.queries, on_query_thread(Query::resources, {}, q), use_awaitable);
  }
  static constexpr std::string_view kRes = "/v1/resources/";
  if (path.substr(0, kRes.size()) == kRes) {
    std::string_view rest = path.substr(kRes.size());
    bool is_fence = false, is_readiness = false;
    if (rest.size() > 6 && rest.substr(rest.size() - 6) == "/fence") {
      is_fence = true;
      rest.remove_suffix(6);
    } else if (rest.size() > 10 && rest.substr(rest.size() - 10) == "/readiness") {
      is_readiness = true;
      rest.remove_suffix(10);
    }
    if (rest.find("/idempotency/") != std::string_view::npos) {  // issue 30: proxy/admin_idempotency.h
      AdminAnswer a = idempotency_endpoint(rt.store, h.method, rest, q);
      Reply r;
      r.status = a.status;
      r.content_type = std::move(a.content_type);
      r.body = std::move(a.body);
      co_return r;
    }
    if (rest.find('/') != std::string_view::npos)  // a resource name has no '/': no such endpoint
      co_return problem(404, "not-found", "Not found", "no such admin endpoint; see GET /");
    std::string id(rest);
    if (!valid_resource_name(id))
      co_return problem(400, "bad-resource", "Bad request", "a resource name is 1-256 of [A-Za-z0-9._~:-]");
    if (is_fence) {
      if (!post) co_return method_not_allowed();
      co_return co_await fence(id, h, body);
    }
    if (is_readiness) {
      if (!get) co_return method_not_allowed();
      co_return co_await net::co_spawn(admin_.queries, on_query_thread(Query::readiness, id, q), use_awaitable);
    }
    if (h.method == "DELETE") co_return co_await delete_resource(id, q, h);
    if (!get) co_return method_not_allowed();
    co_return co_await net::co_spawn(admin_.queries, on_query_thread(Query::resource, id, {}), use_awaitable);
  }
  // Audit queries read SQLite and may take seconds on a large log: they run on the query
  // thread (as resource listings do), so /healthz, /readyz and the fence endpoint never wait
  // behind one.
  if (path == "/v1/audit") {
    if (!get) co_return method_not_allowed();
    co_return co_await net::co_spawn(admin_.queries, on_query_thread(Query::audit, {}, q), use_awaitable);
  }
  if (path == "/v1/audit/unfenced") {
    if (!get) co_return method_not_allowed();
    co_return co_await net::co_spawn(admin_.queries, on_query_thread(Query::unfenced, {}, q), use_awaitable);
  }
  if (path == "/v1/config/reload") {
    if (!post) co_return method_not_allowed();
    if (cfg.config_file.empty())
      co_return problem(409, "no-config-file", "Nothing to reload",
                        "this process was started without --config; flags and environment cannot change live");
    auto errors = rt.reload();
    if (!errors.empty())
      co_return problem(422, "reload-rejected", "Config reload rejected",
                        "the new config is invalid; the running config stays", {{"errors", errors}});
    co_return json_reply(200, {{"status", "reloaded"}, {"config", rt.snapshot()->cfg->config_file}});
  }
  co_return problem(404, "not-found", "Not found", "no such admin endpoint; see GET /");
}

}  // namespace fencegate::proxy::admin_detail
