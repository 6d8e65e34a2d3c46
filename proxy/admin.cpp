// Admin API server: a small HTTP/1.1 server on its own io_context and thread, so nothing here
// (SQLite reads for audit queries, reloads) ever runs on a data-path I/O thread.
#include "proxy/admin.h"

#include <algorithm>
#include <charconv>
#include <boost/asio.hpp>
#include <csignal>
#include <list>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "config/router.h"
#include "fence_store/store.h"
#include "proxy/admin_query.h"
#include "proxy/audit_json.h"
#include "proxy/admission.h"
#include "proxy/authority.h"
#include "proxy/fence.h"
#include "proxy/head.h"
#include "proxy/listener.h"
#include "proxy/local_reply.h"
#include "common/log.h"
#include "proxy/fleet.h"
#include "proxy/metrics.h"
#include "proxy/runtime.h"
#include "proxy/timefmt.h"
#include "proxy/token.h"

namespace fencegate::proxy {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using net::awaitable;
using net::use_awaitable;
using json = nlohmann::json;

namespace {

constexpr std::size_t kMaxAdminHead = 16 * 1024;
constexpr std::size_t kMaxAdminBody = 64 * 1024;
// Refused requests are logged at most once per client address in this long (they are counted
// in fencegate_admin_unauthorized_total every time).
constexpr auto kUnauthorizedLogEvery = std::chrono::seconds(10);

struct Reply {
  unsigned status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::string extra_headers;
};

// The audit log and the fence state hold request bytes as they came (a header value need not be
// UTF-8): invalid sequences are sent as U+FFFD rather than failing the whole answer.
std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"; }

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
Reply problem(unsigned status, std::string type, std::string title, std::string detail, json extra = json::object()) {
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

bool valid_resource_name(std::string_view r) {
  if (r.empty() || r.size() > config::kMaxResourceName) return false;
  for (unsigned char c : r)
    if (!(std::isalnum(c) || c == '.' || c == '_' || c == '~' || c == '-' || c == ':')) return false;
  return true;
}

// The mode the data path fences `resource` in; `off` routes never fence: only when no other route
// can make the name is it "off".
std::string mode_of(const config::Router& router, std::string_view resource) {
  bool off = false;
  if (const config::Route* r = router.owner_of(resource, &off)) return std::string(config::to_string(r->mode));
  return off ? "off" : "unrouted";
}

// A Host a loopback-only admin API answers to: "localhost" or an IP literal, with an optional
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

json audit_json(const store::AuditRecord& rec) {
  // One writer for an audit row, shared with `fencegate audit --json` (proxy/audit_json.h); the
  // object's fields and values are what they were.
  return json::parse(audit_row_json(rec));
}

// The barrier's generation and leader, from the token and leader headers or the JSON body
// {"generation": N, "leader": "..."} (both given: they must agree). A reply when they are
// missing or malformed.
std::optional<Reply> read_barrier(const RequestHead& h, std::string_view body, const config::Config& cfg,
                                  std::int64_t* generation, std::string* leader_out) {
  std::int64_t& g = *generation;
  std::string& leader = *leader_out;
  g = 0;
  leader.clear();
  std::string_view tv, lv;
  std::size_t nt = h.count(cfg.token_header, &tv);
  const std::size_t nl = h.count(cfg.leader_header, &lv);
  if (nl == 1) leader = std::string(lv);
  if (nt > 1) return problem(400, "malformed-token", "Malformed fencing token", "several token headers");
  if (nl > 1) return problem(400, "bad-leader", "Bad request", "several " + cfg.leader_header + " headers");
  if (nt == 1) {
    auto t = parse_token(tv);
    if (!t)
      return problem(400, "malformed-token", "Malformed fencing token",
                     "the token is not a canonical decimal in 1..2^63-1");
    g = *t;
  }
  if (!body.empty()) {
    // A repeated key is refused, not resolved (nlohmann keeps the last one): {"generation": 9,
    // "generation": 6} must not mean whichever a reader of the request happens to pick.
    std::set<std::string> keys;
    std::string repeated;
    json j = json::parse(
        body,
        [&](int depth, json::parse_event_t ev, json& parsed) {
          if (ev == json::parse_event_t::key && depth == 1 && parsed.is_string() &&
              !keys.insert(parsed.get<std::string>()).second && repeated.empty())
            repeated = parsed.get<std::string>();
          return true;
        },
        false);
    if (j.is_discarded() || !j.is_object())
      return problem(400, "bad-json", "Bad request",
                     "the body must be a JSON object {\"generation\": N, \"leader\": \"...\"}");
    if (!repeated.empty()) return problem(400, "bad-json", "Bad request", "duplicate key \"" + repeated + "\"");
    for (auto& [k, v] : j.items())
      if (k != "generation" && k != "leader")
        return problem(400, "bad-json", "Bad request", "unknown key \"" + k + "\"");
    if (j.contains("generation")) {
      const auto& v = j["generation"];
      if (!v.is_number_integer() || v.get<std::int64_t>() < 1)
        return problem(400, "malformed-token", "Malformed fencing token", "generation must be an integer in 1..2^63-1");
      std::int64_t jg = v.get<std::int64_t>();
      if (g && g != jg) return problem(400, "malformed-token", "Malformed fencing token", "header and body disagree");
      g = jg;
    }
    if (j.contains("leader")) {
      if (!j["leader"].is_string()) return problem(400, "bad-json", "Bad request", "leader must be a string");
      // As with the generation: a header and a body that disagree are refused, not resolved.
      if (h.count(cfg.leader_header) && j["leader"].get<std::string>() != leader)
        return problem(400, "bad-leader", "Bad request",
                       "the " + cfg.leader_header + " header and the body's leader disagree");
      leader = j["leader"].get<std::string>();
    }
  }
  if (g == 0)
    return problem(428, "token-required", "Fencing token required",
                   "give the generation in the " + cfg.token_header + " header or as {\"generation\": N}");
  if (leader.size() > cfg.max_leader_bytes) return problem(400, "bad-leader", "Bad request", "leader is too long");
  // As in a Fencing-Leader header: no control characters (it is shown in logs and audit rows).
  if (std::any_of(leader.begin(), leader.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
    return problem(400, "bad-leader", "Bad request", "leader must not contain control characters");
  return std::nullopt;
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
    {"GET", "/v1/resources", "every resource: generation, mode, when and by whom it last advanced"},
    {"GET", "/v1/resources/{id}", "one resource"},
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

// A value made on another thread (a fence decision, the store's commit) for an admin session:
// posted to the admin thread, where the session waits for it on a timer that the delivery ends.
template <class T>
struct PostedResult {
  explicit PostedResult(net::io_context& c) : ioc(c), timer(c, net::steady_timer::time_point::max()) {}
  net::io_context& ioc;
  net::steady_timer timer;
  std::optional<T> value;  // on the admin thread only

  // Any thread, once.
  static void deliver(const std::shared_ptr<PostedResult>& r, T v) {
    net::post(r->ioc, [r, v] {
      r->value = v;
      r->timer.cancel();
    });
  }
  awaitable<T> wait() {
    while (!value) {
      boost::system::error_code ec;
      co_await timer.async_wait(net::redirect_error(use_awaitable, ec));
    }
    co_return *value;
  }
};

class Admin;

// One open admin connection, as the accept loop sees it: who, when it last moved bytes, and
// whether it is answering a request (then it is not closed to make room). Admin thread only.
struct AdminConn {
  tcp::socket* sock;
  std::string client;  // the peer's address, for the per-client cap
  std::chrono::steady_clock::time_point active;
  bool busy = false;
  bool evicted = false;  // closed to make room; the session ends on its own
};

class AdminSession {
 public:
  AdminSession(Admin& a, tcp::socket s, std::list<AdminConn>::iterator conn)
      : admin_(a), sock_(std::move(s)), conn_(conn) {
    conn_->sock = &sock_;
  }
  awaitable<void> run();

 private:
  awaitable<Reply> route(const RequestHead& h, std::string_view body);
  // Arms the total deadline of one request's head and body (admin.header_timeout_ms): when it
  // fires the socket is closed, so a head sent a byte at a time cannot hold the connection.
  void arm_request_deadline(net::steady_timer& deadline, std::chrono::milliseconds limit) {
    deadline.expires_after(limit);
    deadline.async_wait([this](boost::system::error_code e) {
      if (!e) {
        boost::system::error_code ig;
        sock_.close(ig);
      }
    });
  }
  // Reads some bytes; the request deadline armed above bounds it.
  awaitable<std::size_t> read_some(net::mutable_buffer into, boost::system::error_code& ec) {
    std::size_t n = co_await sock_.async_read_some(into, net::redirect_error(use_awaitable, ec));
    conn_->active = std::chrono::steady_clock::now();
    co_return n;
  }
  // Writes a whole answer within admin.write_timeout_ms, else closes the connection: a client
  // that sends requests and never reads the answers cannot keep them buffered here.
  awaitable<void> write_all(std::string_view out, boost::system::error_code& ec);
  // Counts a refused request and logs it, at most once per client per kUnauthorizedLogEvery.
  void note_unauthorized(const RequestHead& h);
  awaitable<Reply> fence(const std::string& resource, const RequestHead& h, std::string_view body);
  awaitable<Reply> delete_resource(const std::string& resource, const std::map<std::string, std::string>& q,
                                   const RequestHead& h);
  awaitable<Decision> advance(const std::string& resource, std::int64_t g, const std::string& leader,
                              InflightNode* node);
  awaitable<store::Status> audit_sync(store::AuditRow row);
  Reply resources(const std::string* one);
  Reply metrics();
  Reply readyz();
  Reply audit(const std::map<std::string, std::string>& q);
  Reply unfenced(const std::map<std::string, std::string>& q);
  // Runs one store read on the query thread. Its arguments are taken by value, so they live in
  // the coroutine's own frame (not in a lambda's captures: GCC 12 loses those here).
  enum class Query { resources, resource, audit, unfenced };
  // A refusal confirmed with etcd, on the confirm thread (arguments by value, as below).
  awaitable<AuthorityCheck> confirm_on_thread(Authority* au, std::int64_t g) { co_return au->confirm(g); }
  awaitable<Reply> on_query_thread(Query what, std::string id, std::map<std::string, std::string> q) {
    switch (what) {
      case Query::resources: co_return resources(nullptr);
      case Query::resource: co_return resources(&id);
      case Query::audit: co_return audit(q);
      case Query::unfenced: co_return unfenced(q);
    }
    co_return Reply{};
  }

  Admin& admin_;
  tcp::socket sock_;
  std::list<AdminConn>::iterator conn_;
  std::string buf_;
};

class Admin final : public AdminServer {
 public:
  Admin(Runtime& rt) : rt(rt), acceptor(ioc), signals(ioc, SIGHUP) {}
  // NOLINTNEXTLINE(bugprone-exception-escape): stop() throws only if the thread cannot be joined
  ~Admin() override { stop(); }

  void stop() override {
    if (!thread.joinable()) return;
    net::post(ioc, [this] {
      boost::system::error_code ec;
      acceptor.close(ec);
      signals.cancel(ec);
      ioc.stop();
    });
    thread.join();
    queries_work.reset();
    queries.stop();
    if (query_thread.joinable()) query_thread.join();
    confirms_work.reset();
    confirms.stop();
    if (confirm_thread.joinable()) confirm_thread.join();
  }

  awaitable<void> accept_loop() {
    for (;;) {
      boost::system::error_code ec;
      tcp::socket s = co_await acceptor.async_accept(net::redirect_error(use_awaitable, ec));
      if (ec) {
        if (!acceptor.is_open()) co_return;
        continue;
      }
      std::string client = s.remote_endpoint(ec).address().to_string();
      if (ec || !make_room(client)) {
        s.close(ec);
        continue;
      }
      conns.push_front(AdminConn{nullptr, std::move(client), std::chrono::steady_clock::now()});
      ++sessions;
      net::co_spawn(
          ioc,
          [this, s = std::move(s), it = conns.begin()]() mutable -> awaitable<void> {
            struct Count {
              Admin& a;
              std::list<AdminConn>::iterator it;
              ~Count() {
                if (!it->evicted) --a.sessions;
                a.conns.erase(it);
              }
            } count{*this, it};
            AdminSession session(*this, std::move(s), it);
            co_await session.run();
          },
          net::detached);
    }
  }

  // Whether a new connection from `client` may stay: not over admin.max_connections_per_client;
  // at admin.max_connections the longest-idle connection not answering a request is closed for
  // it, so connections that stall (before any token is checked) cannot lock probes and fences out.
  bool make_room(const std::string& client) {
    const auto snap = rt.snapshot();
    const auto& acfg = snap->cfg->admin;
    std::size_t same_client = 0;
    AdminConn* idlest = nullptr;
    for (auto& c : conns) {
      if (c.evicted) continue;
      if (c.client == client) ++same_client;
      if (!c.busy && (!idlest || c.active < idlest->active)) idlest = &c;
    }
    if (same_client >= acfg.max_connections_per_client) {
      log_refusal("admin API: a client has too many connections open; closing its new ones",
                  {log::kv("client", client), log::kv("max", acfg.max_connections_per_client)});
      return false;
    }
    if (sessions < acfg.max_connections) return true;
    if (!idlest) {
      log_refusal("admin API: every connection is answering a request; closing new ones",
                  {log::kv("max", acfg.max_connections)});
      return false;
    }
    boost::system::error_code ig;
    idlest->sock->close(ig);  // its session sees the error and ends
    idlest->evicted = true;
    --sessions;
    return true;
  }

  // Refusals at accept come in floods: one line in a while is enough.
  void log_refusal(std::string_view what, std::initializer_list<log::Field> fields) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_refusal_log < kUnauthorizedLogEvery) return;
    last_refusal_log = now;
    log::warn(what, fields);
  }

  void wait_hup() {
    signals.async_wait([this](boost::system::error_code ec, int) {
      if (ec) return;
      if (rt.snapshot()->cfg->config_file.empty()) {
        // As POST /v1/config/reload answers 409: flags and environment cannot change live.
        log::warn("SIGHUP: nothing to reload (started without --config)");
      } else {
        log::info("SIGHUP: reloading the config");
        rt.reload();
      }
      wait_hup();
    });
  }

  Runtime& rt;
  // Declared before ioc, so they outlive it: destroying ioc destroys the sessions' suspended
  // coroutine frames, whose guards still unlink themselves from conns.
  std::size_t sessions = 0;    // open admin connections not yet closed for room (ioc's thread only)
  std::list<AdminConn> conns;  // every admin session, newest first (ioc's thread only)
  net::io_context ioc{1};
  tcp::acceptor acceptor;
  std::chrono::steady_clock::time_point last_refusal_log{};
  // Refused requests (401): when each client's last was logged (ioc's thread only; pruned as it grows).
  std::map<std::string, std::chrono::steady_clock::time_point, std::less<>> unauthorized_logged;
  net::signal_set signals;
  std::thread thread;
  // Store reads (audit queries, resource listings), one at a time, off the thread that answers
  // health probes and fences.
  net::io_context queries{1};
  std::optional<net::executor_work_guard<net::io_context::executor_type>> queries_work;
  // Fence barriers that must ask etcd (a refusal is confirmed first): a hung etcd holds this
  // thread for a request timeout, not the one that answers probes and the leader's own barrier.
  net::io_context confirms{1};
  std::optional<net::executor_work_guard<net::io_context::executor_type>> confirms_work;
  std::thread confirm_thread;
  std::thread query_thread;
};

awaitable<void> AdminSession::run() {
  for (;;) {
    // Head.
    std::size_t head_len = 0;
    RequestHead h;
    net::steady_timer deadline(admin_.ioc);
    arm_request_deadline(deadline, admin_.rt.snapshot()->cfg->admin.header_timeout);
    for (;;) {
      HeadScan s = scan_request_head(buf_, kMaxAdminHead, &h);
      if (s.status == HeadStatus::complete) {
        head_len = s.length;
        break;
      }
      if (s.status != HeadStatus::incomplete) {  // admin clients get no second chance, but an answer
        Reply rep = s.status == HeadStatus::too_large
                        ? problem(431, "header-too-large", "Request header fields too large",
                                  "admin request heads are limited to 16 KiB")
                        : problem(400, "bad-request", "Bad request", s.reason);
        deadline.cancel();
        std::string out = response_bytes(rep, false, true);
        boost::system::error_code ec;
        co_await write_all(out, ec);
        sock_.shutdown(tcp::socket::shutdown_send, ec);
        co_return;
      }
      char tmp[4096];
      boost::system::error_code ec;
      std::size_t n = co_await read_some(net::buffer(tmp), ec);
      if (ec) co_return;
      buf_.append(tmp, n);
    }
    // The head is scanned once: its views point into buf_, which nothing appends to from here on
    // (the rest of a body goes to body_bytes).
    Framing fr = check_framing(h);
    Reply rep;
    bool keep = true;
    std::size_t body_len = 0, body_in_buf = 0;  // the body's length, and its bytes read with the head
    if (!fr.ok || fr.chunked) {
      rep = problem(400, "bad-request", "Bad request", fr.ok ? "chunked bodies are not accepted here" : fr.reason);
      keep = false;
    } else if (fr.content_length && *fr.content_length > kMaxAdminBody) {
      rep = problem(413, "body-too-large", "Content too large", "admin request bodies are limited to 64 KiB");
      keep = false;
    } else {
      body_len = fr.content_length.value_or(0);
      body_in_buf = std::min(body_len, buf_.size() - head_len);
      std::string body_bytes = buf_.substr(head_len, body_in_buf);
      while (body_bytes.size() < body_len) {
        char tmp[4096];
        boost::system::error_code ec;
        // Never past the body: what follows it (a pipelined request) stays unread.
        const std::size_t want = std::min(sizeof tmp, body_len - body_bytes.size());
        std::size_t n = co_await read_some(net::buffer(tmp, want), ec);
        if (ec) co_return;
        body_bytes.append(tmp, n);
      }
      deadline.cancel();
      std::string_view body(body_bytes);
      conn_->busy = true;  // not closed for room while it answers (a fence may wait on a drain)
      try {
        rep = co_await route(h, body);
      } catch (const std::exception& e) {
        rep = problem(500, "internal", "Internal error", e.what());
      }
      conn_->busy = false;
      std::string_view conn;
      if (h.count("Connection", &conn) && iequals(conn, "close")) keep = false;
      if (h.version == 10) keep = false;
    }
    deadline.cancel();
    std::string out = response_bytes(rep, keep, h.method != "HEAD");  // HEAD: same headers, no body
    boost::system::error_code ec;
    co_await write_all(out, ec);
    if (ec || !keep) co_return;
    buf_.erase(0, head_len + body_in_buf);
  }
}

awaitable<void> AdminSession::write_all(std::string_view out, boost::system::error_code& ec) {
  net::steady_timer limit(admin_.ioc);
  limit.expires_after(admin_.rt.snapshot()->cfg->admin.write_timeout);
  limit.async_wait([this](boost::system::error_code e) {
    if (!e) {
      boost::system::error_code ig;
      sock_.close(ig);
    }
  });
  co_await net::async_write(sock_, net::buffer(out), net::redirect_error(use_awaitable, ec));
  limit.cancel();
  conn_->active = std::chrono::steady_clock::now();
}

void AdminSession::note_unauthorized(const RequestHead& h) {
  admin_.rt.metrics.admin_unauthorized.fetch_add(1, std::memory_order_relaxed);
  const auto now = std::chrono::steady_clock::now();
  auto& logged = admin_.unauthorized_logged;
  if (logged.size() > 4096)
    std::erase_if(logged, [&](const auto& e) { return now - e.second >= kUnauthorizedLogEvery; });
  auto it = logged.find(conn_->client);
  if (it != logged.end() && now - it->second < kUnauthorizedLogEvery) return;
  if (it == logged.end() && logged.size() > 4096) return;  // a flood from many addresses: counted, not logged
  logged[conn_->client] = now;
  log::warn("admin API: request refused: missing or wrong bearer token",
            {log::kv("client", conn_->client), log::kv("method", h.method), log::kv("target", h.target)});
}

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
  // (curl, fencegate elect, scripts) send none of these.
  {
    std::string_view site;
    const bool from_page = h.count("Origin") > 0 || (h.count("Sec-Fetch-Site", &site) > 0 && !iequals(site, "none"));
    std::string_view host;
    const bool foreign_host = cfg.admin.token.empty() && h.count("Host", &host) == 1 && !loopback_host_ok(host);
    if (from_page || foreign_host)
      co_return problem(403, "browser-request", "Forbidden",
                        from_page ? "the admin API does not take requests from web pages (Origin or Sec-Fetch-Site "
                                    "present)"
                                  : "without an admin token the admin API answers only to Host localhost or an IP "
                                    "address");
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
    co_return co_await net::co_spawn(admin_.queries, on_query_thread(Query::resources, {}, {}), use_awaitable);
  }
  static constexpr std::string_view kRes = "/v1/resources/";
  if (path.substr(0, kRes.size()) == kRes) {
    std::string_view rest = path.substr(kRes.size());
    bool is_fence = false;
    if (rest.size() > 6 && rest.substr(rest.size() - 6) == "/fence") {
      is_fence = true;
      rest.remove_suffix(6);
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

Reply AdminSession::readyz() {
  Runtime& rt = admin_.rt;
  if (rt.stopping.load()) return json_reply(503, {{"status", "not ready"}, {"reason", "shutting down"}});
  std::string why;
  if (!rt.store_ok(&why)) return json_reply(503, {{"status", "not ready"}, {"reason", "store: " + why}});
  if (!rt.snapshot()) return json_reply(503, {{"status", "not ready"}, {"reason", "no config loaded"}});
  if (rt.fleet && !rt.fleet->member())  // fleet (docs/fleet.md)
    return json_reply(503, {{"status", "not ready"}, {"reason", "not a member of the fleet"}});
  return json_reply(200, {{"status", "ready"}});
}

Reply AdminSession::metrics() {
  Runtime& rt = admin_.rt;
  std::string out;
  out.reserve(8192);
  rt.metrics.render(out);
  if (rt.fleet) rt.fleet->render_metrics(out);  // fleet (docs/fleet.md)
  auto views = rt.fence.snapshot();
  auto stats = rt.fence.stats();
  out += "# HELP fencegate_generation Current durable generation per resource (labelled resources only).\n";
  out += "# TYPE fencegate_generation gauge\n";
  std::size_t shown = 0;
  for (const auto& v : views) {
    if (shown >= 1000) break;  // bounded label set
    if (!rt.metrics.has_label(v.name) && shown >= 100) continue;
    ++shown;
    out += "fencegate_generation{resource=\"" + prom_escape(v.name) + "\"} " + std::to_string(v.stored) + "\n";
  }
  out += "# HELP fencegate_resources Resources held by the fence.\n# TYPE fencegate_resources gauge\n";
  out += "fencegate_resources " + std::to_string(views.size()) + "\n";
  out += "# HELP fencegate_advances_total Generation advances committed.\n# TYPE fencegate_advances_total counter\n";
  out += "fencegate_advances_total " + std::to_string(stats.advances) + "\n";
  out += "# HELP fencegate_drain_waits_total Advances that had to wait for older in-flight writes.\n";
  out += "# TYPE fencegate_drain_waits_total counter\n";
  out += "fencegate_drain_waits_total " + std::to_string(stats.drain_waits) + "\n";
  out += "# HELP fencegate_drain_aborts_total Older upstream exchanges aborted by a drain timeout.\n";
  out += "# TYPE fencegate_drain_aborts_total counter\n";
  out += "fencegate_drain_aborts_total " + std::to_string(stats.drain_aborts) + "\n";
  out += "# HELP fencegate_audit_queue_depth Items waiting for the store thread.\n";
  out += "# TYPE fencegate_audit_queue_depth gauge\n";
  out += "fencegate_audit_queue_depth " + std::to_string(rt.store.queue_depth()) + "\n";
  out += "# HELP fencegate_audit_rows_dropped_total Observe-mode audit rows given up on after failed commits.\n";
  out += "# TYPE fencegate_audit_rows_dropped_total counter\n";
  out += "fencegate_audit_rows_dropped_total " + std::to_string(rt.store.audit_rows_dropped()) + "\n";
  std::string why;
  out += "# HELP fencegate_store_ok 1 if the last store commit succeeded.\n# TYPE fencegate_store_ok gauge\n";
  out += std::string("fencegate_store_ok ") + (rt.store_ok(&why) ? "1" : "0") + "\n";
  Reply r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = std::move(out);
  return r;
}

Reply AdminSession::resources(const std::string* one) {
  Runtime& rt = admin_.rt;
  auto snap = rt.snapshot();
  std::map<std::string, json> out;
  for (const auto& v : rt.fence.snapshot()) {
    if (one && v.name != *one) continue;
    out[v.name] = json{{"resource", v.name},
                       {"generation", v.stored},
                       {"highest_seen", v.seen},
                       {"in_flight", v.inflight},
                       {"waiting", v.waiting},
                       {"mode", mode_of(snap->router, v.name)},
                       {"unstored_generation", v.owed > v.stored ? json(v.owed) : json(nullptr)},
                       {"advanced_at", nullptr},
                       {"advanced_by", nullptr}};
  }
  for (const auto& s : rt.store.load_all()) {
    if (one && s.resource != *one) continue;
    auto& j = out[s.resource];
    if (j.is_null())
      j = json{{"resource", s.resource},
               {"generation", s.generation},
               {"highest_seen", s.generation},
               {"in_flight", 0},
               {"waiting", 0},
               {"mode", mode_of(snap->router, s.resource)},
               {"unstored_generation", nullptr}};
    j["advanced_at"] = s.advanced_at_ms ? json(format_rfc3339_ms(s.advanced_at_ms)) : json(nullptr);
    j["advanced_by"] = s.advanced_by;
  }
  if (one) {
    auto it = out.find(*one);
    if (it == out.end()) return problem(404, "unknown-resource", "Not found", "no generation is known for " + *one);
    return json_reply(200, it->second);
  }
  json list = json::array();
  for (auto& [_, j] : out) list.push_back(std::move(j));
  return json_reply(200, {{"resources", list}});
}

awaitable<Reply> AdminSession::fence(const std::string& resource, const RequestHead& h, std::string_view body) {
  Runtime& rt = admin_.rt;
  auto snap = rt.snapshot();
  const config::Config& cfg = *snap->cfg;
  std::int64_t g = 0;
  std::string leader;
  if (std::optional<Reply> refused = read_barrier(h, body, cfg, &g, &leader)) co_return std::move(*refused);

  // A barrier on a name no fencing route makes (a typo, the wrong case, an `off` route's resource)
  // would protect nothing while the caller believes it fenced the real resource.
  bool off = false;
  const config::Route* owner = snap->router.owner_of(resource, &off);
  if (!owner)
    co_return problem(404, "unfenced-resource", "Not a fenced resource",
                      "no enforce or observe route makes resource \"" + resource + "\" (" +
                          (off ? "its route is off" : "no route names it") + "): a barrier on it would protect nothing",
                      {{"resource", resource}});
  PresentedToken token;
  token.state = TokenState::ok;
  token.generation = g;
  token.leader = leader;
  boost::system::error_code ig;
  auto ep = sock_.remote_endpoint(ig);
  const std::string client = ig ? std::string() : ep.address().to_string();
  AdmissionInput in;
  in.kind = AdmissionKind::barrier;
  in.mode = owner->mode;
  in.resource = &resource;
  in.token = &token;
  in.request = &h;  // a POST (route() takes no other here)
  in.client = client;
  in.token_header = cfg.token_header;
  // A resource bound to an election authority only advances to its current leader's generation:
  // the barrier must not become a way around the authority (a forged or stale token). A refusal
  // the watch may not have caught up with yet is confirmed with etcd first (on its own thread).
  AuthorityCheck ac;
  if (Authority* au = rt.authorities ? rt.authorities->for_route(*owner) : nullptr) {
    ac = au->check(g);
    if (ac.verdict == AuthorityVerdict::not_leader || ac.verdict == AuthorityVerdict::unknown_generation)
      ac = co_await net::co_spawn(admin_.confirms, confirm_on_thread(au, g), use_awaitable);  // asks etcd
    in.authority = &ac;
    in.election = owner->authority->election;
  }
  Admission a = decide_admission(in, rt.fence);
  InflightNode node;
  Decision d;
  if (a.step == AdmissionStep::ask_fence) {
    d = co_await advance(resource, g, leader, owner->mode == config::Mode::observe ? nullptr : &node);
    in.fence = &d;
    a = decide_admission(in, rt.fence);
  }
  if (a.step == AdmissionStep::forward) {
    rt.fence.release(&node);  // (a no-op in observe mode: nothing was linked)
    log::info("fenced", {log::kv("resource", resource), log::kv("generation", d.current), log::kv("leader", leader)});
    Reply ok = json_reply(200, {{"resource", resource}, {"generation", d.current}, {"leader", leader}});
    ok.extra_headers = "Fencing-Generation: " + std::to_string(d.current) + "\r\n";
    co_return ok;
  }
  // Refused. A stale barrier is audited durably before it is answered, as a stale write is.
  if (a.audit && a.audit_durable) {
    store::Status st = co_await audit_sync(std::move(*a.audit));
    if (!st.ok()) audit_failed(a, st);
  }
  if (a.audit_durable || a.outcome == Outcome::too_many_resources) rt.metrics.count(resource, *a.outcome);
  if (in.fence && a.outcome == Outcome::too_many_resources)
    log::warn("rejected fence: the fence holds max_resources resources",
              {log::kv("resource", resource), log::kv("max_resources", cfg.max_resources)});
  else if (in.fence && a.audit_durable)
    log::warn("rejected fence", {log::kv("resource", resource), log::kv("presented_generation", g),
                                 log::kv("current_generation", a.current), log::kv("leader", leader)});
  else if (!in.fence && ac.verdict != AuthorityVerdict::unavailable)
    log::warn("rejected fence", {log::kv("resource", resource), log::kv("presented_generation", g),
                                 log::kv("decision", to_string(ac.verdict)), log::kv("leader", leader)});
  Reply refused = problem(a.refusal);
  if (in.fence && a.refusal.status == 409)
    refused.extra_headers = "Fencing-Generation: " + std::to_string(*a.generation) + "\r\n";
  co_return refused;
}

// DELETE /v1/resources/{id}?confirm={id}: the resource's fence is removed from memory and then
// durably from the store, and the removal is audited (resource_deleted, with the generation it
// had). Older generations are acceptable again afterwards. Refused with 409 while anything is under
// way for the resource (a write in flight or parked, an advance): the caller retries once it is
// quiet, and no write admitted under the old generation is left running unfenced.
awaitable<Reply> AdminSession::delete_resource(const std::string& resource, const std::map<std::string, std::string>& q,
                                               const RequestHead& h) {
  Runtime& rt = admin_.rt;
  auto confirm = q.find("confirm");
  if (confirm == q.end() || confirm->second != resource)
    co_return problem(400, "confirm-required", "Confirmation required",
                      "deleting a resource's fence lets older generations through again: repeat its name as "
                      "?confirm=" +
                          resource,
                      {{"resource", resource}});
  std::int64_t generation = 0;
  switch (rt.fence.remove(resource, &generation)) {
    case Fence::Removal::unknown:
      co_return problem(404, "unknown-resource", "Unknown resource",
                        "the fence holds no generation for resource \"" + resource + "\"", {{"resource", resource}});
    case Fence::Removal::busy:
      co_return problem(409, "resource-busy", "Resource busy",
                        "writes of resource \"" + resource +
                            "\" are in flight or an advance is under way: nothing was deleted; retry when it is quiet",
                        {{"resource", resource}});
    case Fence::Removal::removed: break;
  }
  auto result = std::make_shared<PostedResult<store::Status>>(admin_.ioc);
  rt.store.remove(resource,
                  [result](store::Status st) { PostedResult<store::Status>::deliver(result, std::move(st)); });
  store::Status st = co_await result->wait();
  if (!st.ok()) {
    rt.fence.restore(resource, generation);
    co_return problem(503, "store-unavailable", "Fence store unavailable",
                      "the resource could not be removed from the store: " + st.message() + "; nothing was deleted",
                      {{"resource", resource}});
  }
  boost::system::error_code ig;
  auto ep = sock_.remote_endpoint(ig);
  store::AuditRow row;
  row.resource = resource;
  row.decision = "resource_deleted";
  row.current_generation = generation;
  row.method = std::string(h.method);
  row.target = clipped(h.target, 2048);
  row.client = ig ? std::string() : ep.address().to_string();
  row.mode = mode_of(rt.snapshot()->router, resource);
  row.user_agent = clipped(h.user_agent(), 512);
  const std::string client = row.client;  // the row is moved into the store below
  if (store::Status ast = co_await audit_sync(std::move(row)); !ast.ok())
    log::warn("resource deleted, but its audit row could not be made durable",
              {log::kv("resource", resource), log::kv("why", ast.message())});
  log::warn("resource deleted: older generations are acceptable again",
            {log::kv("resource", resource), log::kv("generation", generation), log::kv("client", client)});
  co_return json_reply(200, {{"resource", resource}, {"deleted", true}, {"generation", generation}});
}

// Advances the fence exactly as a write would, then lets go (the caller releases `node`): in
// enforce mode (node given) drains older in-flight writes and commits durably; in observe mode
// commits durably without draining (observe mode stops and waits for nothing: its writes keep
// coming, and a barrier waiting for them would never end).
awaitable<Decision> AdminSession::advance(const std::string& resource, std::int64_t g, const std::string& leader,
                                          InflightNode* node) {
  Runtime& rt = admin_.rt;
  auto result = std::make_shared<PostedResult<Decision>>(admin_.ioc);
  auto deliver = [result](Decision dd) { PostedResult<Decision>::deliver(result, dd); };
  Decision d;
  const bool now = node ? rt.fence.admit(resource, g, leader, node, &d, deliver)
                        : rt.fence.observe(resource, g, leader, &d, deliver);
  if (now) co_return d;
  co_return co_await result->wait();
}

// Appends an audit row and waits until it is durable (or failed).
awaitable<store::Status> AdminSession::audit_sync(store::AuditRow row) {
  auto result = std::make_shared<PostedResult<store::Status>>(admin_.ioc);
  admin_.rt.store.append_audit(std::move(row), [result](store::Status st) {
    PostedResult<store::Status>::deliver(result, std::move(st));
  });
  co_return co_await result->wait();
}

Reply AdminSession::audit(const std::map<std::string, std::string>& q) {
  for (const auto& [k, _] : q)
    if (k != "resource" && k != "decision" && k != "since" && k != "until" && k != "leader" && k != "limit" &&
        k != "cursor")
      return problem(400, "bad-query", "Bad request", "unknown parameter \"" + k + "\"");
  store::AuditQuery aq;
  aq.resource = param(q, "resource");
  aq.decision = param(q, "decision");
  if (!aq.decision.empty() && std::find(store::kAuditDecisions.begin(), store::kAuditDecisions.end(), aq.decision) ==
                                  store::kAuditDecisions.end()) {
    std::string known;
    for (auto d : store::kAuditDecisions) known += (known.empty() ? "" : ", ") + std::string(d);
    return problem(400, "bad-query", "Bad request", "decision \"" + aq.decision + "\": unknown; one of " + known);
  }
  aq.leader = param(q, "leader");
  std::string err;
  std::int64_t limit = 100, cursor = 0;
  if (!parse_time_param(q, "since", &aq.since_ms, &err) || !parse_time_param(q, "until", &aq.until_ms, &err) ||
      !parse_int_param(q, "limit", 1, 1000, &limit, &err) || !parse_int_param(q, "cursor", 1, INT64_MAX, &cursor, &err))
    return problem(400, "bad-query", "Bad request", err);
  // until is exclusive, and 0 means "no bound" to the store: an until at or before the epoch
  // matches nothing, so it becomes the earliest bound that does the same.
  if (!param(q, "until").empty() && aq.until_ms <= 0) aq.until_ms = 1;  // (empty: absent, as elsewhere)
  aq.before_id = cursor;
  aq.limit = static_cast<int>(limit) + 1;  // one more tells whether another page exists
  store::Status st = store::Status::OK();
  auto rows = admin_.rt.store.query_audit(aq, &st);
  if (!st.ok()) return problem(503, "store-unavailable", "Fence store unavailable", st.message());
  json out = {{"rows", json::array()}};
  bool more = rows.size() > static_cast<std::size_t>(limit);
  if (more) rows.resize(static_cast<std::size_t>(limit));
  for (const auto& r : rows) out["rows"].push_back(audit_json(r));
  if (more && !rows.empty()) out["next_cursor"] = std::to_string(rows.back().id);
  return json_reply(200, out);
}

Reply AdminSession::unfenced(const std::map<std::string, std::string>& q) {
  for (const auto& [k, _] : q)
    if (k != "resource" && k != "since" && k != "limit")
      return problem(400, "bad-query", "Bad request", "unknown parameter \"" + k + "\"");
  std::string err;
  std::int64_t since = 0, limit = 100;
  if (!parse_time_param(q, "since", &since, &err) || !parse_int_param(q, "limit", 1, 1000, &limit, &err))
    return problem(400, "bad-query", "Bad request", err);
  store::Status st = store::Status::OK();
  auto groups = admin_.rt.store.query_unfenced(param(q, "resource"), since, static_cast<int>(limit) + 1, &st);
  if (!st.ok()) return problem(503, "store-unavailable", "Fence store unavailable", st.message());
  const bool more = groups.size() > static_cast<std::size_t>(limit);  // one more tells
  if (more) groups.resize(static_cast<std::size_t>(limit));
  json list = json::array();
  for (const auto& g : groups)
    list.push_back({{"resource", g.resource},
                    {"client", g.client},
                    {"user_agent", g.user_agent},
                    {"leader", g.leader},
                    {"count", g.count},
                    {"first_seen", format_rfc3339_ms(g.first_ms)},
                    {"last_seen", format_rfc3339_ms(g.last_ms)}});
  return json_reply(200, {{"callers", list}, {"truncated", more}});
}

}  // namespace

std::unique_ptr<AdminServer> AdminServer::start(Runtime& rt, const config::Endpoint& listen, std::string* error) {
  auto a = std::make_unique<Admin>(rt);
  if (ListenError le; !open_listener(a->acceptor, listen, &le)) {
    *error = (le.resolving ? "cannot resolve " : "cannot listen on ") + listen.to_string() + ": " + le.message;
    return nullptr;
  }
  log::info("admin listening",
            {log::kv("address", bound_address(a->acceptor)),
             log::kv("auth", rt.snapshot()->cfg->admin.token.empty() ? "none (loopback)" : "bearer")});
  Admin* raw = a.get();
  net::co_spawn(a->ioc, raw->accept_loop(), net::detached);
  raw->wait_hup();
  raw->queries_work.emplace(raw->queries.get_executor());
  raw->query_thread = std::thread([raw] { raw->queries.run(); });
  raw->confirms_work.emplace(raw->confirms.get_executor());
  raw->confirm_thread = std::thread([raw] { raw->confirms.run(); });
  a->thread = std::thread([raw] { raw->ioc.run(); });
  return a;
}

}  // namespace fencegate::proxy
