// The TLS client side of https:// upstream connections (see tls_origin.h).
#include "proxy/tls_origin.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/log.h"

namespace fencegate::proxy {

namespace {

// One TLS connection to the upstream and the socketpair end the relay's socket talks to.
struct Origin {
  Origin(Socket t, Socket i, SSL* s, std::shared_ptr<const UpstreamTls> c)
      : tcp(std::move(t)), inner(std::move(i)), ssl(s), ctx(std::move(c)) {}
  ~Origin() { SSL_free(ssl); }
  Origin(const Origin&) = delete;
  Origin& operator=(const Origin&) = delete;
  Socket tcp;    // to the upstream
  Socket inner;  // our end of the socketpair; the relay's UpConn holds the other
  SSL* ssl;
  std::shared_ptr<const UpstreamTls> ctx;  // the session cache of new_session (and the SSL_CTX)
  bool in_done = false;                    // the upstream's side has ended (pump_in is over)
  void close_all() {
    boost::system::error_code ig;
    tcp.close(ig);
    inner.close(ig);
  }
};

// Waits until `s` is ready for what OpenSSL asked (SSL_ERROR_WANT_READ/WRITE). False on any other
// error, or when the wait ends with an error (cancelled, closed).
task<bool> wait_for(Socket& s, int ssl_err, boost::system::error_code& ec) {
  if (ssl_err == SSL_ERROR_WANT_READ) co_await s.async_wait(Socket::wait_read, net::redirect_error(use_task, ec));
  else if (ssl_err == SSL_ERROR_WANT_WRITE)
    co_await s.async_wait(Socket::wait_write, net::redirect_error(use_task, ec));
  else co_return false;
  co_return !ec;
}

// True iff the relay has closed its end for good (not just shut down its sending side): a unix
// socket whose peer is gone polls as hung up.
bool relay_gone(Socket& inner) {
  pollfd p{inner.native_handle(), POLLOUT, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR | POLLNVAL)) != 0;
}

// The upstream's bytes, decrypted, to the relay. Ends when the upstream closes (close_notify, EOF
// or an error): the relay then reads EOF.
task<void> pump_in(std::shared_ptr<Origin> o) {
  std::array<char, kRelayBuffer> buf;
  boost::system::error_code ec;
  for (;;) {
    ERR_clear_error();
    std::size_t n = 0;
    const int r = SSL_read_ex(o->ssl, buf.data(), buf.size(), &n);
    if (r == 1) {
      co_await net::async_write(o->inner, net::buffer(buf.data(), n), net::redirect_error(use_task, ec));
      if (ec) break;  // the relay is gone
      continue;
    }
    // (Each co_await a statement of its own: GCC 12 mishandles one inside a condition.)
    const bool ready = co_await wait_for(o->tcp, SSL_get_error(o->ssl, r), ec);
    if (!ready) break;
  }
  ERR_clear_error();
  o->in_done = true;
  boost::system::error_code ig;
  o->inner.shutdown(tcp::socket::shutdown_send, ig);
  if (ec) o->close_all();
}

// The relay's bytes, encrypted, to the upstream. When the relay shuts down its side, the upstream
// gets close_notify and a FIN (it reads the end of the request there) and its answer still comes
// back; once the relay has closed its end for good (or the upstream side has ended too), the TLS
// connection is closed.
task<void> pump_out(std::shared_ptr<Origin> o) {
  std::array<char, kRelayBuffer> buf;
  boost::system::error_code ec;
  bool failed = false;
  for (;;) {
    const std::size_t n = co_await o->inner.async_read_some(net::buffer(buf), net::redirect_error(use_task, ec));
    if (ec) break;  // EOF: the relay is done sending (or closed)
    std::size_t off = 0;
    while (off < n && !failed) {
      ERR_clear_error();
      std::size_t w = 0;
      const int r = SSL_write_ex(o->ssl, buf.data() + off, n - off, &w);
      if (r == 1) {
        off += w;
        continue;
      }
      const bool ready = co_await wait_for(o->tcp, SSL_get_error(o->ssl, r), ec);
      failed = !ready;
    }
    if (failed) break;
  }
  ERR_clear_error();
  if (failed) {  // the upstream connection broke: the relay reads EOF (or a reset)
    o->close_all();
    co_return;
  }
  // close_notify (one try: a full send buffer is not waited for), then the FIN.
  if (!o->in_done) {
    (void)SSL_shutdown(o->ssl);
    ERR_clear_error();
    boost::system::error_code ig;
    o->tcp.shutdown(tcp::socket::shutdown_send, ig);
  }
  // The upstream may still answer (a half-closed exchange lingering for the fence): until the relay
  // closes its end or the upstream's side ends, look once a second.
  Timer t(o->inner.get_executor());
  while (!o->in_done && !relay_gone(o->inner)) {
    t.expires_after(std::chrono::seconds(1));
    co_await t.async_wait(net::redirect_error(use_task, ec));
  }
  o->close_all();
}

}  // namespace

task<bool> originate_tls(net::io_context& ioc, UpConn& up, const std::shared_ptr<const UpstreamTls>& tls,
                         boost::system::error_code& ec, TlsFailure* why) {
  ec.clear();
  // Freed on every way out, also when the frame is destroyed while suspended (a stop).
  std::unique_ptr<SSL, void (*)(SSL*)> ssl(tls->new_ssl(), SSL_free);
  if (!ssl || SSL_set_fd(ssl.get(), up.sock.native_handle()) != 1) {
    why->reason = "handshake-failed";
    why->detail = "cannot create a TLS connection";
    ec = net::error::no_memory;
    ERR_clear_error();
    co_return false;
  }
  up.sock.non_blocking(true, ec);
  unsigned long err = 0;
  bool ok = false;
  while (!ec) {
    ERR_clear_error();
    const int r = SSL_connect(ssl.get());
    if (r == 1) {
      ok = true;
      break;
    }
    const int saved_errno = errno;
    const int e = SSL_get_error(ssl.get(), r);
    if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) {
      err = ERR_peek_last_error();
      if (e == SSL_ERROR_SYSCALL && saved_errno != 0 && err == 0) why->detail = std::strerror(saved_errno);
      break;
    }
    co_await wait_for(up.sock, e, ec);
  }
  if (!ok) {
    if (!ec) {
      why->reason = upstream_tls_failure(ssl.get(), err, &why->detail);
      ec = net::error::connection_refused;  // the caller answers with why's words; any error will do
    }
    ERR_clear_error();
    co_return false;
  }
  // The socketpair the relay talks plaintext on.
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) {
    const int saved_errno = errno;
    why->reason = "handshake-failed";
    why->detail = std::string("socketpair: ") + std::strerror(saved_errno);
    ec.assign(saved_errno, boost::system::system_category());
    co_return false;
  }
  Socket inner(ioc.get_executor()), relay_end(ioc.get_executor());
  boost::system::error_code e1, e2;
  inner.assign(tcp::v4(), sv[0], e1);
  relay_end.assign(tcp::v4(), sv[1], e2);
  if (e1 || e2) {
    if (e1) ::close(sv[0]);
    if (e2) ::close(sv[1]);
    why->reason = "handshake-failed";
    why->detail = "cannot use the socketpair";
    ec = e1 ? e1 : e2;
    co_return false;
  }
  auto o = std::make_shared<Origin>(std::move(up.sock), std::move(inner), ssl.release(), tls);
  up.sock = std::move(relay_end);
  up.tls = tls;
  net::co_spawn(ioc, pump_in(o), net::detached);
  net::co_spawn(ioc, pump_out(std::move(o)), net::detached);
  co_return true;
}

}  // namespace fencegate::proxy
