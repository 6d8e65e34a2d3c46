// The TLS terminator of the data listener (see tls_listener.h).
#include "proxy/tls_listener.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <unordered_map>
#include <vector>

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

// The pumps' buffers, taken from this worker's free list only while bytes flow: an idle
// connection holds none (each would otherwise keep two 16 KiB buffers for its whole life).
class BufferPool {
 public:
  std::unique_ptr<char[]> take() {
    if (free_.empty()) return std::make_unique<char[]>(kRelayBuffer);
    auto b = std::move(free_.back());
    free_.pop_back();
    return b;
  }
  void give(std::unique_ptr<char[]> b) {
    if (b && free_.size() < kKept) free_.push_back(std::move(b));
  }

 private:
  static constexpr std::size_t kKept = 64;
  std::vector<std::unique_ptr<char[]>> free_;
};
thread_local BufferPool pool;  // the coroutines of a connection run on its worker's thread

// A buffer from the pool, given back when it goes.
struct Lease {
  std::unique_ptr<char[]> b;
  char* get() {
    if (!b) b = pool.take();
    return b.get();
  }
  void reset() { pool.give(std::move(b)); }
  ~Lease() { reset(); }
};

// One TLS connection: OpenSSL straight on the client's socket (non-blocking; a want-read or
// want-write waits for the socket's readiness), so nothing but OpenSSL's own state is held per
// connection, and OpenSSL releases its record buffers while the connection is idle.
struct Conn : std::enable_shared_from_this<Conn> {
  Conn(ServerState& st, Worker& w, Socket sock, SSL* ssl)
      : st(st), w(w), sock(std::move(sock)), ssl(ssl), inner(w.ioc.get_executor()), guard(w.ioc.get_executor()) {}
  ~Conn() { SSL_free(ssl); }  // the socket BIO does not own the descriptor: `sock` closes it
  Conn(const Conn&) = delete;
  Conn& operator=(const Conn&) = delete;
  ServerState& st;
  Worker& w;
  Socket sock;  // the client's
  SSL* ssl;
  Socket inner;  // our end of the socketpair; the Session holds the other
  Timer guard;   // handshake deadline, then each write's to the client
  bool timed_out = false;
  bool closing = false;  // the Session's end closed: the client's side is being shut down
  std::string ip;
  std::uint16_t port = 0;
  bool v6 = false;
  std::chrono::milliseconds write_timeout{0};  // each write to the client, once the handshake is over

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

// The two directions. Between bursts neither holds a coroutine, only a wait on its socket: a
// burst (a request, an answer) runs in a coroutine spawned when the socket is readable, which
// goes back to waiting when the socket is drained.
task<void> pump_up(std::shared_ptr<Conn> c);
task<void> pump_down(std::shared_ptr<Conn> c);
task<void> end_up(std::shared_ptr<Conn> c);

// Waits for the client's next bytes, then decrypts them (pump_up); a cancelled wait ends it.
void wait_up(std::shared_ptr<Conn> c) {
  Socket& s = c->sock;
  s.async_wait(tcp::socket::wait_read, [c = std::move(c)](boost::system::error_code ec) mutable {
    Worker& w = c->w;
    if (ec) net::co_spawn(w.ioc, end_up(std::move(c)), net::detached);
    else net::co_spawn(w.ioc, pump_up(std::move(c)), net::detached);
  });
}

// The Session closed (or the client went): end the other direction's wait; it then sends
// close_notify to the client.
void end_down(Conn& c) {
  ERR_clear_error();
  c.closing = true;
  boost::system::error_code ig;
  c.sock.cancel(ig);
  c.inner.cancel(ig);
}

// Waits for the Session's next bytes, then encrypts them (pump_down); a cancelled wait ends it.
void wait_down(std::shared_ptr<Conn> c) {
  Socket& s = c->inner;
  s.async_wait(tcp::socket::wait_read, [c = std::move(c)](boost::system::error_code ec) mutable {
    if (ec) end_down(*c);
    else net::co_spawn(c->w.ioc, pump_down(c), net::detached);
  });
}

// The client's bytes, decrypted, to the Session, until OpenSSL has nothing more to give.
task<void> pump_up(std::shared_ptr<Conn> c) {
  Lease buf;
  boost::system::error_code ec;
  for (;;) {
    ERR_clear_error();
    const int n = SSL_read(c->ssl, buf.get(), static_cast<int>(kRelayBuffer));
    if (n > 0) {
      co_await net::async_write(c->inner, net::buffer(buf.get(), static_cast<std::size_t>(n)),
                                net::redirect_error(use_task, ec));
      if (ec) break;
      if (SSL_has_pending(c->ssl) == 0) {  // nothing buffered (not even part of a record)
        wait_up(std::move(c));
        co_return;
      }
      continue;
    }
    const int e = SSL_get_error(c->ssl, n);
    if (e == SSL_ERROR_WANT_READ) {
      wait_up(std::move(c));
      co_return;
    }
    if (e != SSL_ERROR_WANT_WRITE || !co_await c->ready_for(e)) break;  // close_notify, the end, a bad record
  }
  buf.reset();
  co_await end_up(std::move(c));
}

// The client's side is over: the Session is told (its end sees EOF), or, if the Session ended
// first, the client is: close_notify, then a wait of at most a second for the client's own, so
// that the answer it is still reading is not cut by a reset.
task<void> end_up(std::shared_ptr<Conn> c) {
  ERR_clear_error();
  boost::system::error_code ig;
  if (!c->closing) {
    c->inner.shutdown(tcp::socket::shutdown_send, ig);
    co_return;
  }
  c->arm(std::chrono::milliseconds(1000));
  for (;;) {
    ERR_clear_error();
    const int r = SSL_shutdown(c->ssl);
    if (r == 1) break;
    const int e = r == 0 ? SSL_ERROR_WANT_READ : SSL_get_error(c->ssl, r);
    if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) break;
    if (!co_await c->ready_for(e)) break;
  }
  c->disarm();
  ERR_clear_error();
}

// The Session's bytes, encrypted, to the client, until the socketpair is drained.
task<void> pump_down(std::shared_ptr<Conn> c) {
  Lease buf;
  boost::system::error_code ec;
  for (;;) {
    const std::size_t n = c->inner.read_some(net::buffer(buf.get(), kRelayBuffer), ec);
    if (ec == net::error::would_block || ec == net::error::try_again) {
      wait_down(std::move(c));
      co_return;
    }
    if (ec) break;  // the Session's end (or an error)
    c->arm(c->write_timeout);
    bool failed = false;
    for (std::size_t off = 0; off < n && !failed;) {
      ERR_clear_error();
      const int w = SSL_write(c->ssl, buf.get() + off, static_cast<int>(n - off));
      if (w > 0) {
        off += static_cast<std::size_t>(w);
        continue;
      }
      const int e = SSL_get_error(c->ssl, w);
      failed = (e != SSL_ERROR_WANT_WRITE && e != SSL_ERROR_WANT_READ) || !co_await c->ready_for(e);
    }
    c->disarm();
    if (failed) break;
    if (n < kRelayBuffer) {  // it gave less than asked: drained (a wait that finds more returns at once)
      wait_down(std::move(c));
      co_return;
    }
  }
  end_down(*c);
}

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
  std::chrono::milliseconds handshake_timeout, write_timeout;
  {
    // Copied: a long connection must not hold on to the config of its start.
    const std::shared_ptr<const Snapshot> snap = c->st.rt.snapshot();
    handshake_timeout = snap->cfg->header_timeout;
    write_timeout = snap->cfg->body_timeout;
  }
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
  c->inner.non_blocking(true, ec);
  // From here the Session counts the connection (its destructor uncounts it).
  auto s = std::make_unique<Session>(c->st, c->w, std::move(session_end));
  s->set_tls_peer(c->ip, c->port, c->v6, std::move(identity));
  if (!s->count_client()) {
    c->st.rt.metrics.connections_refused_per_client.fetch_add(1, std::memory_order_relaxed);
    co_return;  // dropping the session closes its end; ours and the client's close with c
  }
  Session::start(std::move(s), false);
  c->write_timeout = write_timeout;
  // The handshake's read may already hold the first request: read first. The Session has said
  // nothing yet: wait for it.
  net::co_spawn(c->w.ioc, pump_up(c), net::detached);
  wait_down(std::move(c));
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
  if (auto ep = c->sock.remote_endpoint(ec); !ec) {
    c->ip = ep.address().to_string();
    c->port = ep.port();
    c->v6 = ep.address().is_v6();
  }
  net::co_spawn(w.ioc, run_connection(c, std::move(ctx)), net::detached);
}

}  // namespace fencegate::proxy
