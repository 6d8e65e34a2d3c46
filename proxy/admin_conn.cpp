// The admin API's connections: the accept loop with its per-client and total caps (make_room
// closes the longest-idle connection for a new one), one session per connection reading heads and
// bodies within their deadlines, write_all's write deadline, SIGHUP, and starting and stopping
// the admin thread. What a request means is decided in proxy/admin.cpp (AdminSession::route).
#include <openssl/ssl.h>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <csignal>

#include "common/log.h"
#include "proxy/admin_session.h"
#include "proxy/framing.h"
#include "proxy/listener.h"
#include "proxy/metrics.h"
#include "proxy/runtime.h"
#include "proxy/tls_context.h"

namespace fencegate::proxy::admin_detail {

// Issue 27 (tls-ctl): admin.tls. The session's TLS stream over its own socket (so the socket's
// close, the deadlines and remote_endpoint work as without TLS).
struct AdminTls {
  AdminTls(tcp::socket& s, SSL* ssl) : stream(s, ssl) {}
  net::ssl::stream<tcp::socket&> stream;
};

namespace {

constexpr std::size_t kMaxAdminHead = 16 * 1024;
constexpr std::size_t kMaxAdminBody = 64 * 1024;

}  // namespace

void Admin::stop() {
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

awaitable<void> Admin::accept_loop() {
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

bool Admin::make_room(const std::string& client) {
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

void Admin::log_refusal(std::string_view what, std::initializer_list<log::Field> fields) {
  const auto now = std::chrono::steady_clock::now();
  if (now - last_refusal_log < kUnauthorizedLogEvery) return;
  last_refusal_log = now;
  log::warn(what, fields);
}

void Admin::wait_hup() {
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

awaitable<bool> AdminSession::start_tls() {
  std::shared_ptr<const TlsContext> ctx = admin_.tls();
  if (!ctx) co_return true;
  SSL* ssl = ctx->new_ssl();
  if (!ssl) co_return false;
  tls_ = std::make_shared<AdminTls>(sock_, ssl);
  net::steady_timer deadline(admin_.ioc);
  arm_request_deadline(deadline, admin_.rt.snapshot()->cfg->admin.header_timeout);
  boost::system::error_code ec;
  co_await tls_->stream.async_handshake(net::ssl::stream_base::server, net::redirect_error(use_awaitable, ec));
  deadline.cancel();
  if (ec) {
    const long v = SSL_get_verify_result(tls_->stream.native_handle());
    // The deadline closes the socket: a handshake cut by it is a timeout.
    const unsigned long e =
        ec.category() == net::error::get_ssl_category() ? static_cast<unsigned long>(ec.value()) : 0;
    const char* reason = !sock_.is_open() ? "timeout" : handshake_failure_reason(tls_->stream.native_handle(), e);
    admin_.rt.metrics.count_admin_tls_failure(reason);
    admin_.log_refusal("admin API: TLS handshake failed (logged at most once in 10 s)",
                       {log::kv("client", conn_->client), log::kv("reason", reason), log::kv("error", ec.message()),
                        log::kv("verify", v == X509_V_OK ? "ok" : X509_verify_cert_error_string(v))});
    ERR_clear_error();
    co_return false;
  }
  conn_->active = std::chrono::steady_clock::now();
  co_return true;
}

awaitable<std::size_t> AdminSession::tls_read_some(net::mutable_buffer into, boost::system::error_code& ec) {
  std::size_t n = co_await tls_->stream.async_read_some(into, net::redirect_error(use_awaitable, ec));
  conn_->active = std::chrono::steady_clock::now();
  co_return n;
}

awaitable<void> AdminSession::run() {
  if (!co_await start_tls()) co_return;  // issue 27 (tls-ctl)
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
  if (tls_)  // issue 27 (tls-ctl)
    co_await net::async_write(tls_->stream, net::buffer(out), net::redirect_error(use_awaitable, ec));
  else co_await net::async_write(sock_, net::buffer(out), net::redirect_error(use_awaitable, ec));
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

}  // namespace fencegate::proxy::admin_detail

namespace fencegate::proxy {

using admin_detail::Admin;
namespace net = boost::asio;

std::unique_ptr<AdminServer> AdminServer::start(Runtime& rt, const config::Endpoint& listen, std::string* error) {
  auto a = std::make_unique<Admin>(rt);
  // Issue 27 (tls-ctl): admin.tls, built before the port opens; reloaded with the config.
  if (const auto& t = rt.snapshot()->cfg->admin.tls; t.enabled()) {
    a->tls_ctx = TlsContext::build(t, error);
    if (!a->tls_ctx) {
      *error = "admin." + *error;
      return nullptr;
    }
    rt.reload_admin_tls = [raw = a.get()](const config::Config& c) -> std::string {
      std::string why;
      auto ctx = TlsContext::build(c.admin.tls, &why);
      if (!ctx) return "admin." + why + " (the running admin certificates stay)";
      std::lock_guard lk(raw->tls_mu);
      raw->tls_ctx = std::move(ctx);
      return {};
    };
  }
  if (ListenError le; !open_listener(a->acceptor, listen, &le)) {
    *error = (le.resolving ? "cannot resolve " : "cannot listen on ") + listen.to_string() + ": " + le.message;
    return nullptr;
  }
  log::info("admin listening", {log::kv("address", bound_address(a->acceptor)),
                                log::kv("auth", rt.snapshot()->cfg->admin.token.empty() ? "none (loopback)" : "bearer"),
                                log::kv("tls", a->tls_ctx ? "on" : "off")});
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
