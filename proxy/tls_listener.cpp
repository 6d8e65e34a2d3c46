// The TLS terminator of the data listener (see tls_listener.h).
#include "proxy/tls_listener.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <unordered_map>
#include <utility>

#include "proxy/session.h"

namespace fencegate::proxy {

namespace {

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

// One TLS connection during its handshake: OpenSSL straight on the client's socket (non-blocking;
// a want-read or want-write waits for the socket's readiness). After the handshake the socket and
// the SSL go to a Session (session_tls.cpp), and this goes.
struct Conn : std::enable_shared_from_this<Conn> {
  Conn(ServerState& st, Worker& w, Socket sock, SSL* ssl)
      : st(st), w(w), sock(std::move(sock)), ssl(ssl), guard(w.ioc.get_executor()) {}
  ~Conn() { SSL_free(ssl); }  // null once a Session took it; the socket BIO never owns the descriptor
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;
  ServerState& st;
  Worker& w;
  Socket sock;  // the client's
  SSL* ssl;
  Timer guard;  // the handshake's deadline
  bool timed_out = false;
  std::string ip;

  // Arms the guard: past `t` the client's socket is cancelled (a stalled peer gives up its wait).
  void arm(std::chrono::milliseconds t) {
    timed_out = false;
    guard.expires_after(t);
    guard.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
      if (ec) return;  // re-armed or cancelled
      if (auto c = weak.lock()) {
        c->timed_out = true;
        boost::system::error_code ig;
        c->sock.cancel(ig);
      }
    });
  }
  void disarm() { guard.cancel(); }
  void uncount() {
    st.connections.fetch_sub(1, std::memory_order_relaxed);
    st.rt.metrics.open_connections.fetch_sub(1, std::memory_order_relaxed);
  }
  // Waits until the client's socket is ready for what OpenSSL asked for (`want`, from
  // SSL_get_error). False if the wait ended otherwise (cancelled: a deadline, or closing).
  task<bool> ready_for(int want) {
    boost::system::error_code ec;
    co_await sock.async_wait(want == SSL_ERROR_WANT_WRITE ? tcp::socket::wait_write : tcp::socket::wait_read,
                             net::redirect_error(use_task, ec));
    co_return !ec;
  }
};

// The handshake, under the guard armed by the caller. 1: done; 0: failed (counted and logged).
task<bool> handshake(Conn& c) {
  for (;;) {
    ERR_clear_error();
    const int r = SSL_do_handshake(c.ssl);
    if (r == 1) co_return true;
    const int e = SSL_get_error(c.ssl, r);
    if ((e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) && co_await c.ready_for(e)) continue;
    const unsigned long err = ERR_peek_last_error();
    const char* reason = c.timed_out ? "timeout" : handshake_failure_reason(c.ssl, e == SSL_ERROR_SSL ? err : 0);
    c.st.rt.metrics.count_tls_failure(reason);
    std::string detail =
        c.timed_out ? "no TLS handshake within header_timeout_ms"
        : err != 0  ? std::string(ERR_reason_error_string(err) ? ERR_reason_error_string(err) : "TLS error")
        : e == SSL_ERROR_SYSCALL || e == SSL_ERROR_ZERO_RETURN ? "the client closed during the handshake"
                                                               : "TLS error";
    if (const long v = SSL_get_verify_result(c.ssl); v != X509_V_OK)
      detail += std::string(" (") + X509_verify_cert_error_string(v) + ")";
    log_failure(c.ip, reason, detail);
    ERR_clear_error();
    co_return false;
  }
}

task<void> run_connection(std::shared_ptr<Conn> c, std::shared_ptr<const TlsContext> ctx) {
  const std::chrono::milliseconds handshake_timeout = c->st.rt.snapshot()->cfg->header_timeout;
  boost::system::error_code ec;
  Socket& tcp_sock = c->sock;
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
  const bool shaken = co_await handshake(*c);
  c->disarm();
  if (!shaken) {
    c->uncount();
    co_return;
  }
  ctx.reset();  // the handshake is over: SNI will not be asked again (no renegotiation)
  std::string identity = peer_identity(c->ssl);

  // From here the Session reads and writes the connection, and counts it (its destructor
  // uncounts it).
  auto s = std::make_unique<Session>(c->st, c->w, std::move(c->sock));
  if (!s->set_tls(std::exchange(c->ssl, nullptr), std::move(identity))) {
    log::warn("TLS: no memory for the connection's BIO; connection closed");
    co_return;
  }
  if (!s->count_client()) {
    c->st.rt.metrics.connections_refused_per_client.fetch_add(1, std::memory_order_relaxed);
    co_return;  // dropping the session closes the connection (close_notify first)
  }
  // The handshake's read may already hold the first request: the session reads OpenSSL first.
  Session::start(std::move(s), false);
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
  if (!ec && ssl) sock.non_blocking(true, ec);  // OpenSSL reads and writes the descriptor itself
  if (!ssl || ec || SSL_set_fd(ssl, sock.is_open() ? sock.native_handle() : fd) != 1) {
    if (ssl) SSL_free(ssl);
    if (sock.is_open()) sock.close(ec);
    else ::close(fd);
    st_.connections.fetch_sub(1, std::memory_order_relaxed);
    st_.rt.metrics.open_connections.fetch_sub(1, std::memory_order_relaxed);
    return;
  }
  SSL_set_accept_state(ssl);
  // Whole records per read (fewer system calls); OpenSSL's record buffers released when idle.
  SSL_set_read_ahead(ssl, 1);
  SSL_set_mode(ssl, SSL_MODE_RELEASE_BUFFERS | SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  set_nodelay(sock);
  auto c = std::make_shared<Conn>(st_, w, std::move(sock), ssl);
  if (auto ep = c->sock.remote_endpoint(ec); !ec) c->ip = ep.address().to_string();
  net::co_spawn(w.ioc, run_connection(c, std::move(ctx)), net::detached);
}

}  // namespace fencegate::proxy
