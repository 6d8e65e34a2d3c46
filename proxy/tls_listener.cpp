// The TLS terminator of the data listener (see tls_listener.h).
#include "proxy/tls_listener.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/ssl.hpp>
#include <unordered_map>

#include "proxy/session.h"

namespace fencegate::proxy {

namespace {

using TlsStream = net::ssl::stream<Socket>;

// Logs a failed handshake at most once per peer address and 10 s: a flood of bad handshakes
// must not flood the log.
void log_failure(const std::string& ip, const char* reason, const std::string& detail) {
  static std::mutex mu;
  static std::unordered_map<std::string, Clock::time_point> last;
  const auto now = Clock::now();
  {
    std::lock_guard lk(mu);
    if (last.size() > 10000) last.clear();
    auto [it, fresh] = last.try_emplace(ip, now);
    if (!fresh && now - it->second < std::chrono::seconds(10)) return;
    it->second = now;
  }
  log::warn("TLS handshake failed (logged once per client address and 10 s)",
            {log::kv("client", ip), log::kv("reason", reason), log::kv("detail", detail)});
}

constexpr std::string_view kPlainHttp400 =
    "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 58\r\nConnection: close\r\n\r\n"
    "This port speaks TLS: use https://, not plain HTTP.      \n";

struct Conn : std::enable_shared_from_this<Conn> {
  Conn(ServerState& st, Worker& w, Socket sock, SSL* ssl)
      : st(st), w(w), tls(std::move(sock), ssl), inner(w.ioc.get_executor()), guard(w.ioc.get_executor()) {}
  ServerState& st;
  Worker& w;
  TlsStream tls;
  Socket inner;  // our end of the socketpair; the Session holds the other
  Timer guard;   // handshake deadline, then each write's to the client
  bool timed_out = false;
  bool closing = false;  // the Session's end closed: the client's side is being shut down
  std::string ip;
  std::uint16_t port = 0;
  bool v6 = false;

  // Arms the guard: past `t` the client's socket is cancelled (a stalled peer gives up its wait).
  void arm(std::chrono::milliseconds t) {
    timed_out = false;
    guard.expires_after(t);
    guard.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
      if (ec) return;  // re-armed or cancelled
      if (auto c = weak.lock()) {
        c->timed_out = true;
        boost::system::error_code ig;
        c->tls.next_layer().cancel(ig);
      }
    });
  }
  void disarm() { guard.cancel(); }
  void uncount() {
    st.connections.fetch_sub(1, std::memory_order_relaxed);
    st.rt.metrics.open_connections.fetch_sub(1, std::memory_order_relaxed);
  }
};

// The client's bytes, decrypted, to the Session.
task<void> pump_up(std::shared_ptr<Conn> c) {
  std::array<char, kRelayBuffer> buf;
  boost::system::error_code ec;
  for (;;) {
    const std::size_t n = co_await c->tls.async_read_some(net::buffer(buf), net::redirect_error(use_task, ec));
    if (ec) break;
    co_await net::async_write(c->inner, net::buffer(buf.data(), n), net::redirect_error(use_task, ec));
    if (ec) break;
  }
  boost::system::error_code ig;
  if (!c->closing) {
    c->inner.shutdown(tcp::socket::shutdown_send, ig);  // the Session sees the client's end
    co_return;
  }
  // The Session is done: say so to the client (close_notify), for at most a second.
  c->arm(std::chrono::milliseconds(1000));
  co_await c->tls.async_shutdown(net::redirect_error(use_task, ec));
  c->disarm();
}

// The Session's bytes, encrypted, to the client.
task<void> pump_down(std::shared_ptr<Conn> c, std::chrono::milliseconds write_timeout) {
  std::array<char, kRelayBuffer> buf;
  boost::system::error_code ec;
  for (;;) {
    const std::size_t n = co_await c->inner.async_read_some(net::buffer(buf), net::redirect_error(use_task, ec));
    if (ec) break;
    c->arm(write_timeout);
    co_await net::async_write(c->tls, net::buffer(buf.data(), n), net::redirect_error(use_task, ec));
    c->disarm();
    if (ec) break;
  }
  // The Session closed (or the client went): end the other direction's wait; it then sends
  // close_notify to the client.
  c->closing = true;
  boost::system::error_code ig;
  c->tls.next_layer().cancel(ig);
  c->inner.cancel(ig);
}

task<void> run_connection(std::shared_ptr<Conn> c, std::shared_ptr<const TlsContext> ctx) {
  std::chrono::milliseconds handshake_timeout, write_timeout;
  {
    // Copied: a long connection must not hold on to the config of its start.
    const std::shared_ptr<const Snapshot> snap = c->st.rt.snapshot();
    handshake_timeout = snap->cfg->header_timeout;
    write_timeout = snap->cfg->body_timeout;
  }
  boost::system::error_code ec;
  Socket& tcp_sock = c->tls.next_layer();
  c->arm(handshake_timeout);
  // Plain HTTP to the TLS port: a short plaintext 400, then close (as nginx does).
  co_await tcp_sock.async_wait(tcp::socket::wait_read, net::redirect_error(use_task, ec));
  unsigned char first = 0;
  const ssize_t peeked = ec ? -1 : ::recv(tcp_sock.native_handle(), &first, 1, MSG_PEEK);
  if (peeked <= 0) {  // closed before a byte (a port probe) or timed out
    c->disarm();
    if (c->timed_out) {
      c->st.rt.metrics.count_tls_failure("timeout");
      log_failure(c->ip, "timeout", "no TLS handshake within header_timeout_ms");
    }
    c->uncount();
    co_return;
  }
  if (first != 0x16) {  // not a TLS handshake record
    const bool http = first >= 'A' && first <= 'Z';
    c->st.rt.metrics.count_tls_failure(http ? "plaintext_http" : "protocol");
    log_failure(c->ip, http ? "plaintext_http" : "protocol", http ? "plain HTTP sent to the TLS port" : "not TLS");
    if (http) co_await net::async_write(tcp_sock, net::buffer(kPlainHttp400), net::redirect_error(use_task, ec));
    c->disarm();
    tcp_sock.shutdown(tcp::socket::shutdown_both, ec);
    c->uncount();
    co_return;
  }
  co_await c->tls.async_handshake(net::ssl::stream_base::server, net::redirect_error(use_task, ec));
  c->disarm();
  if (ec) {
    const unsigned long e =
        ec.category() == net::error::get_ssl_category() ? static_cast<unsigned long>(ec.value()) : 0;
    const char* reason = c->timed_out ? "timeout" : handshake_failure_reason(c->tls.native_handle(), e);
    c->st.rt.metrics.count_tls_failure(reason);
    std::string detail = ec.message();
    if (const long v = SSL_get_verify_result(c->tls.native_handle()); v != X509_V_OK)
      detail += std::string(" (") + X509_verify_cert_error_string(v) + ")";
    log_failure(c->ip, reason, detail);
    ERR_clear_error();
    c->uncount();
    co_return;
  }
  ctx.reset();  // the handshake is over: SNI will not be asked again (no renegotiation)
  std::string identity = peer_identity(c->tls.native_handle());

  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) {
    log::warn("TLS: socketpair failed; connection closed", {log::kv("error", std::strerror(errno))});
    c->uncount();
    co_return;
  }
  c->inner.assign(tcp::v4(), sv[0], ec);
  Socket session_end(c->w.ioc.get_executor());
  boost::system::error_code ec2;
  session_end.assign(c->v6 ? tcp::v6() : tcp::v4(), sv[1], ec2);
  if (ec || ec2) {
    if (ec) ::close(sv[0]);
    if (ec2) ::close(sv[1]);
    c->uncount();
    co_return;
  }
  // From here the Session counts the connection (its destructor uncounts it).
  auto s = std::make_unique<Session>(c->st, c->w, std::move(session_end));
  s->set_tls_peer(c->ip, c->port, c->v6, std::move(identity));
  if (!s->count_client()) {
    c->st.rt.metrics.connections_refused_per_client.fetch_add(1, std::memory_order_relaxed);
    co_return;  // dropping the session closes its end; ours and the client's close with c
  }
  Session::start(std::move(s), false);
  net::co_spawn(c->w.ioc, pump_up(c), net::detached);
  co_await pump_down(c, write_timeout);
}

}  // namespace

bool TlsTerminator::start(const config::Config& cfg, std::string* error) {
  auto ctx = TlsContext::build(cfg.tls, error);
  if (!ctx) return false;
  std::lock_guard lk(mu_);
  ctx_ = std::move(ctx);
  return true;
}

std::string TlsTerminator::reload(const config::Config& cfg) {
  std::string error;
  auto ctx = TlsContext::build(cfg.tls, &error);
  if (!ctx) return error + " (the running certificates stay)";
  std::lock_guard lk(mu_);
  ctx_ = std::move(ctx);
  return {};
}

void TlsTerminator::serve(Worker& w, int fd) {
  std::shared_ptr<const TlsContext> ctx = current();
  SSL* ssl = ctx ? ctx->new_ssl() : nullptr;
  boost::system::error_code ec;
  Socket sock(w.ioc.get_executor());
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  const bool named = ::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0;
  const bool v6 = named && ss.ss_family == AF_INET6;
  if (ssl) sock.assign(v6 ? tcp::v6() : tcp::v4(), fd, ec);
  if (!ssl || ec) {
    if (ssl) SSL_free(ssl);
    ::close(fd);
    st_.connections.fetch_sub(1, std::memory_order_relaxed);
    st_.rt.metrics.open_connections.fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  set_nodelay(sock);
  auto c = std::make_shared<Conn>(st_, w, std::move(sock), ssl);
  if (auto ep = c->tls.next_layer().remote_endpoint(ec); !ec) {
    c->ip = ep.address().to_string();
    c->port = ep.port();
    c->v6 = ep.address().is_v6();
  }
  net::co_spawn(w.ioc, run_connection(c, std::move(ctx)), net::detached);
}

}  // namespace fencegate::proxy
