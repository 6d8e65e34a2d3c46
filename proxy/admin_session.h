// The admin API's internals, shared by its units (proxy/admin*.cpp) and included by nothing else:
// the reply type and its builders, the connection list, the session and the server object.
#pragma once

#include <boost/asio.hpp>
#include <chrono>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "common/log.h"
#include "config/config.h"
#include "fence_store/store.h"
#include "proxy/admin.h"
#include "proxy/authority.h"
#include "proxy/fence.h"
#include "proxy/head.h"
#include "proxy/local_reply.h"

namespace fencegate::config {
class Router;
}

namespace fencegate::proxy {
class Runtime;
class TlsContext;  // issue 27 (tls-ctl): admin.tls
}  // namespace fencegate::proxy

namespace fencegate::proxy::admin_detail {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using net::awaitable;
using net::use_awaitable;
using json = nlohmann::json;

// Refused requests are logged at most once per client address in this long (they are counted
// in fencegate_admin_unauthorized_total every time).
constexpr auto kUnauthorizedLogEvery = std::chrono::seconds(10);

struct Reply {
  unsigned status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::string extra_headers;
};

// The bytes of an answer: its head and, unless `with_body` is false (HEAD), its body.
std::string response_bytes(const Reply& rep, bool keep, bool with_body);
Reply json_reply(unsigned status, const json& j);
// A problem+json reply (local_reply.h builds the body); `extra` adds members to it.
Reply problem(unsigned status, std::string type, std::string title, std::string detail, json extra = json::object());
Reply problem(const Problem& p);
// The mode the data path fences `resource` in; `off` routes never fence: only when no other route
// can make the name is it "off".
std::string mode_of(const config::Router& router, std::string_view resource);
// An audit row as JSON: the one writer shared with `fencegate audit --json` (proxy/audit_json.h).
json audit_json(const store::AuditRecord& rec);

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
// Issue 27 (tls-ctl): a connection's TLS stream over its socket (admin_conn.cpp; no ssl.hpp here).
struct AdminTls;

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
  // Issue 27 (tls-ctl): with admin.tls, the TLS handshake (within admin.header_timeout_ms). False:
  // the connection is closed.
  awaitable<bool> start_tls();
  awaitable<std::size_t> tls_read_some(net::mutable_buffer into, boost::system::error_code& ec);
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
    if (tls_) co_return co_await tls_read_some(into, ec);  // issue 27 (tls-ctl)
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
  Reply resources(const std::string* one, const std::map<std::string, std::string>& q);
  Reply readiness(const std::string& resource, const std::map<std::string, std::string>& q);
  Reply metrics();
  Reply readyz();
  Reply audit(const std::map<std::string, std::string>& q);
  Reply unfenced(const std::map<std::string, std::string>& q);
  // Runs one store read on the query thread. Its arguments are taken by value, so they live in
  // the coroutine's own frame (not in a lambda's captures: GCC 12 loses those here).
  enum class Query { resources, resource, readiness, audit, unfenced };
  // A refusal confirmed with etcd, on the confirm thread (arguments by value, as below).
  awaitable<AuthorityCheck> confirm_on_thread(Authority* au, std::int64_t g) { co_return au->confirm(g); }
  awaitable<Reply> on_query_thread(Query what, std::string id, std::map<std::string, std::string> q) {
    switch (what) {
      case Query::resources: co_return resources(nullptr, q);
      case Query::resource: co_return resources(&id, q);
      case Query::readiness: co_return readiness(id, q);
      case Query::audit: co_return audit(q);
      case Query::unfenced: co_return unfenced(q);
    }
    co_return Reply{};
  }

  Admin& admin_;
  tcp::socket sock_;
  std::shared_ptr<AdminTls> tls_;  // issue 27 (tls-ctl): set by start_tls() with admin.tls
  std::list<AdminConn>::iterator conn_;
  std::string buf_;
};

class Admin final : public AdminServer {
 public:
  Admin(Runtime& rt) : rt(rt), acceptor(ioc), signals(ioc, SIGHUP) {}
  // NOLINTNEXTLINE(bugprone-exception-escape): stop() throws only if the thread cannot be joined
  ~Admin() override { stop(); }

  void stop() override;
  // Accepts admin connections, each into its own AdminSession, until the acceptor closes.
  awaitable<void> accept_loop();
  // Whether a new connection from `client` may stay: not over admin.max_connections_per_client;
  // at admin.max_connections the longest-idle connection not answering a request is closed for
  // it, so connections that stall (before any token is checked) cannot lock probes and fences out.
  bool make_room(const std::string& client);
  // Refusals at accept come in floods: one line in a while is enough.
  void log_refusal(std::string_view what, std::initializer_list<log::Field> fields);
  // SIGHUP reloads the config file.
  void wait_hup();
  // Issue 27 (tls-ctl): the admin listener's TLS context (null without admin.tls); replaced on reload.
  std::shared_ptr<const TlsContext> tls() const {
    std::lock_guard lk(tls_mu);
    return tls_ctx;
  }

  Runtime& rt;
  mutable std::mutex tls_mu;
  std::shared_ptr<const TlsContext> tls_ctx;  // guarded by tls_mu (issue 27, tls-ctl)
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

}  // namespace fencegate::proxy::admin_detail
