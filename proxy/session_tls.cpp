// TLS in the session (issue 27): a TLS client connection's records are read and written by the
// session itself, with OpenSSL straight on the client's non-blocking socket. The handshake ran
// before (tls_listener.cpp); from then on a request costs the system calls a plain one does
// (a recv for the request, a send for the answer), not the four more of a hop through a
// socketpair to a separate terminator.
//
// A want-read or want-write waits for the socket's readiness with the session's own socket, so
// the watchdog's cancellations (deadlines, the hot read going cold) end a TLS wait as they end a
// plain read. A wait only ever follows an OpenSSL call that found the socket drained (EAGAIN),
// so the edge-triggered reactor always has an edge to come.
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <cerrno>

#include "proxy/session.h"

namespace fencegate::proxy {

namespace {

constexpr std::size_t kRecord = 16384;  // TLS's largest record: one SSL_write, one send

// How a failed OpenSSL call ended, as the plain path's errors: the client closed (cleanly with
// close_notify, or not) is an EOF; anything else (a bad record, a reset) a reset.
boost::system::error_code tls_error(int e) {
  const unsigned long err = ERR_peek_last_error();
  const int sys = errno;
  ERR_clear_error();
  if (e == SSL_ERROR_ZERO_RETURN) return net::error::eof;
  if (e == SSL_ERROR_SYSCALL && err == 0)
    return sys == 0 ? boost::system::error_code(net::error::eof)
                    : boost::system::error_code(sys, boost::system::system_category());
  if (e == SSL_ERROR_SSL && ERR_GET_REASON(err) == SSL_R_UNEXPECTED_EOF_WHILE_READING) return net::error::eof;
  return net::error::connection_reset;
}

}  // namespace

task<std::size_t> Session::tls_read(net::mutable_buffer b, boost::system::error_code& ec) {
  ec.clear();
  if (tls_broken_) {
    ec = net::error::connection_reset;
    co_return 0;
  }
  for (;;) {
    ERR_clear_error();
    errno = 0;
    std::size_t n = 0;
    const int r = SSL_read_ex(ssl_, b.data(), b.size(), &n);
    if (r == 1) co_return n;
    const int e = SSL_get_error(ssl_, r);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
      co_await client_.async_wait(e == SSL_ERROR_WANT_WRITE ? tcp::socket::wait_write : tcp::socket::wait_read,
                                  net::redirect_error(use_task, ec));
      if (ec) co_return 0;  // cancelled (a deadline, the hot wait going cold) or an error
      continue;
    }
    ec = tls_error(e);
    if (e != SSL_ERROR_ZERO_RETURN) tls_broken_ = tls_done_ = true;  // no close_notify after this
    co_return 0;
  }
}

task<void> Session::tls_write(std::span<const net::const_buffer> bufs, boost::system::error_code& ec) {
  ec.clear();
  if (tls_done_) {
    ec = net::error::broken_pipe;
    co_return;
  }
  std::string& stage = sc_->tls_out;
  std::size_t piece = 0, off = 0;  // the next byte to gather: bufs[piece], at off
  for (;;) {
    // Gathers up to one record's worth: a head and its body go as one record, one send.
    stage.clear();
    while (piece < bufs.size() && stage.size() < kRecord) {
      const auto* p = static_cast<const char*>(bufs[piece].data());
      const std::size_t take = std::min(bufs[piece].size() - off, kRecord - stage.size());
      stage.append(p + off, take);
      off += take;
      if (off == bufs[piece].size()) {
        ++piece;
        off = 0;
      }
    }
    if (stage.empty()) co_return;
    for (std::size_t sent = 0; sent < stage.size();) {
      ERR_clear_error();
      errno = 0;
      std::size_t n = 0;
      const int r = SSL_write_ex(ssl_, stage.data() + sent, stage.size() - sent, &n);
      if (r == 1) {
        sent += n;
        continue;
      }
      const int e = SSL_get_error(ssl_, r);
      if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) {
        // The stage stays put across the wait: it is this session's (its Scratch).
        co_await client_.async_wait(e == SSL_ERROR_WANT_READ ? tcp::socket::wait_read : tcp::socket::wait_write,
                                    net::redirect_error(use_task, ec));
        if (ec) co_return;
        continue;
      }
      ec = tls_error(e);
      if (!ec || ec == net::error::eof) ec = net::error::broken_pipe;
      tls_broken_ = tls_done_ = true;
      co_return;
    }
  }
}

void Session::tls_close() {
  if (!ssl_ || tls_done_) return;
  tls_done_ = true;
  ERR_clear_error();
  (void)SSL_shutdown(ssl_);  // close_notify if the socket takes it now; never waits
  ERR_clear_error();
}

bool Session::tls_buffered() const { return ssl_ && SSL_has_pending(ssl_) == 1; }

void Session::tls_end() {
  // The descriptor is still open while parked (parked_fd_) or while the socket is: only then may
  // OpenSSL write to it (a closed descriptor's number may already be another connection's).
  if (parked_fd_ >= 0 || client_.is_open()) tls_close();
  SSL_free(ssl_);
  ssl_ = nullptr;
}

}  // namespace fencegate::proxy
