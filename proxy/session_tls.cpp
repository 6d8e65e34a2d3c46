// TLS in the session (issue 27): a TLS client connection's records are read and written by the
// session itself, on the client's non-blocking socket. The handshake ran before
// (tls_listener.cpp); from then on a request costs the system calls a plain one does, not the
// four more of a hop through a socketpair to a separate terminator.
//
// OpenSSL talks to the socket through the session's own BIO (below). Reads: the records come
// in through Asio's read on the session's socket, as a plain request's bytes do (a read tries
// at once unless readiness.h's mark says the socket is drained, and a wait costs no system
// call of its own), into the session's scratch, where the BIO hands them to OpenSSL. Writes
// made while tls_seal encrypts are appended to the session's scratch, and the caller sends them
// as it sends plain bytes: through the worker's batched send path (one io_uring submission per
// reactor pass), with the same deadlines.
// Other writes (close_notify, an alert, a key update's answer) go straight to the socket.
//
// Every wait is on the session's own socket, so the watchdog's cancellations (deadlines, the
// hot read going cold, the probe of a trusted mark) end a TLS wait as they end a plain read.
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "proxy/readiness.h"
#include "proxy/session.h"

namespace fencegate::proxy {

namespace {

constexpr std::size_t kRecord = 16384;  // TLS's largest record: one SSL_write, one send

// OpenSSL's error queue is per thread; a call's failure is read from it, so it must be empty
// before each call. Clearing an empty queue still walks and frees all 16 of its slots (about 3%
// of the proxy's CPU per TLS request): look first.
inline void clear_errors() {
  if (ERR_peek_error() != 0) ERR_clear_error();
}

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

// The session's BIO: its data is the session's TlsIo.
Session::TlsIo& io_of(BIO* b) { return *static_cast<Session::TlsIo*>(BIO_get_data(b)); }

// Records read from the socket (tls_read reads them); none: retry once more have come.
int bio_read(BIO* b, char* data, std::size_t len, std::size_t* got) {
  Session::TlsIo& io = io_of(b);
  BIO_clear_retry_flags(b);
  if (io.in && !io.in->empty()) {
    const std::size_t n = std::min(len, io.in->size());
    std::memcpy(data, io.in->view().data(), n);
    io.in->consume(n);
    *got = n;
    return 1;
  }
  if (io.eof) {
    BIO_set_flags(b, BIO_FLAGS_IN_EOF);
    return 0;
  }
  BIO_set_retry_read(b);
  return 0;
}

int bio_write(BIO* b, const char* data, std::size_t len, std::size_t* put) {
  Session::TlsIo& io = io_of(b);
  BIO_clear_retry_flags(b);
  if (io.capture) {
    io.capture->append(data, len);
    *put = len;
    return 1;
  }
  ssize_t n;
  do n = ::send(io.fd, data, len, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n >= 0) {
    *put = static_cast<std::size_t>(n);
    return 1;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_write(b);
  return 0;
}

long bio_ctrl(BIO* b, int cmd, long /*num*/, void* ptr) {
  switch (cmd) {
    case BIO_CTRL_FLUSH: return 1;  // nothing is held here
    case BIO_CTRL_EOF: return BIO_test_flags(b, BIO_FLAGS_IN_EOF) != 0 ? 1 : 0;
    case BIO_CTRL_PENDING: return io_of(b).in ? static_cast<long>(io_of(b).in->size()) : 0;
    case BIO_C_GET_FD:
      if (ptr) *static_cast<int*>(ptr) = io_of(b).fd;
      return io_of(b).fd;
    default: return 0;
  }
}

const BIO_METHOD* session_bio() {
  static BIO_METHOD* const method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "fencegate session");
    if (!m) return m;
    BIO_meth_set_read_ex(m, bio_read);
    BIO_meth_set_write_ex(m, bio_write);
    BIO_meth_set_ctrl(m, bio_ctrl);
    BIO_meth_set_create(m, [](BIO* b) {
      BIO_set_init(b, 1);
      return 1;
    });
    return m;
  }();
  return method;
}

}  // namespace

bool Session::set_tls(ssl_st* ssl, std::string identity) {
  ssl_ = ssl;
  client_identity_ = std::move(identity);
  tls_io_.fd = client_.native_handle();
  const BIO_METHOD* m = session_bio();
  BIO* b = m ? BIO_new(m) : nullptr;
  if (!b) return false;
  BIO_set_data(b, &tls_io_);
  SSL_set_bio(ssl_, b, b);  // one reference for both directions; the handshake's socket BIO goes
  // OpenSSL's record buffers (~17 KiB each way) stay while the connection is busy: releasing
  // them after every record (SSL_MODE_RELEASE_BUFFERS) cost a malloc and a free of each per
  // request. They go when the connection parks, or waits for its next request while more than
  // kTlsHotBuffers others wait (tls_shed), so idle connections hold none and at most that many
  // waiting ones do (freed memory stays resident: 10,000 connections opened at once must not
  // all have held them).
  SSL_clear_mode(ssl_, SSL_MODE_RELEASE_BUFFERS);
  return true;
}

task<std::size_t> Session::tls_read(net::mutable_buffer b, boost::system::error_code& ec) {
  ec.clear();
  if (tls_broken_) {
    ec = net::error::connection_reset;
    co_return 0;
  }
  ByteBuf& records = sc_->tls_in;
  // The BIO sees the records only while this runs: the Scratch goes when the session parks.
  struct Lend {
    TlsIo& io;
    ~Lend() { io.in = nullptr; }
  } lend{tls_io_};
  tls_io_.in = &records;
  for (;;) {
    clear_errors();
    errno = 0;
    std::size_t n = 0;
    const int r = SSL_read_ex(ssl_, b.data(), b.size(), &n);
    if (r == 1) co_return n;
    const int e = SSL_get_error(ssl_, r);
    if (e == SSL_ERROR_WANT_READ && !tls_io_.eof) {
      // More records: Asio's read, trying at once unless the caller left a drained mark.
      const net::mutable_buffer room = records.prepare(kRecord + 256);
      const std::size_t got = co_await client_.async_read_some(room, net::redirect_error(use_task, ec));
      if (ec == net::error::eof) {
        tls_io_.eof = true;  // OpenSSL tells whether the client closed cleanly
        ec.clear();
        continue;
      }
      if (ec) co_return 0;  // cancelled (a deadline, the hot wait going cold, the probe) or an error
      readiness::drained(client_, got, room.size());
      records.commit(got);
      continue;
    }
    if (e == SSL_ERROR_WANT_WRITE) {  // a key update's answer the socket did not take at once
      co_await client_.async_wait(tcp::socket::wait_write, net::redirect_error(use_task, ec));
      if (ec) co_return 0;
      continue;
    }
    ec = tls_error(e);
    if (e != SSL_ERROR_ZERO_RETURN) tls_broken_ = tls_done_ = true;  // no close_notify after this
    co_return 0;
  }
}

bool Session::tls_seal(std::span<net::const_buffer> bufs, boost::system::error_code& ec) {
  ec.clear();
  if (tls_done_) {
    ec = net::error::broken_pipe;
    return false;
  }
  std::string& stage = sc_->tls_out;
  std::string& wire = sc_->tls_wire;
  wire.clear();
  // The BIO appends to `wire` (no write can block), a record per 16 KiB gathered: a head and its
  // body go as one record.
  tls_io_.capture = &wire;
  std::size_t piece = 0, off = 0;  // the next byte to gather: bufs[piece], at off
  for (;;) {
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
    if (stage.empty()) break;
    // Partial writes are on: a client that negotiated smaller records (max_fragment_length) gets
    // several per stage. The BIO takes everything, so each call makes progress.
    for (std::size_t sent = 0; sent < stage.size();) {
      clear_errors();
      errno = 0;
      std::size_t n = 0;
      const int r = SSL_write_ex(ssl_, stage.data() + sent, stage.size() - sent, &n);
      if (r != 1 || n == 0) {
        tls_io_.capture = nullptr;
        ec = tls_error(SSL_get_error(ssl_, r));
        if (!ec || ec == net::error::eof) ec = net::error::broken_pipe;
        tls_broken_ = tls_done_ = true;
        return false;
      }
      sent += n;
    }
  }
  tls_io_.capture = nullptr;
  // The caller sends the records as it sends plain bytes (`wire` stays put meanwhile: it is this
  // session's, in its Scratch).
  for (auto& b : bufs) b = net::const_buffer();
  if (!bufs.empty()) bufs[0] = net::buffer(wire);
  return true;
}

void Session::tls_shed() {
  if (ssl_ && !tls_done_) (void)SSL_free_buffers(ssl_);  // refused (and kept) while it holds bytes
}

void Session::tls_close() {
  if (!ssl_ || tls_done_) return;
  tls_done_ = true;
  ERR_clear_error();
  (void)SSL_shutdown(ssl_);  // close_notify if the socket takes it now; never waits
  ERR_clear_error();
}

bool Session::tls_pending() const { return SSL_has_pending(ssl_) == 1 || (sc_ && !sc_->tls_in.empty()); }

void Session::tls_end() {
  // The descriptor is still open while parked (parked_fd_) or while the socket is: only then may
  // OpenSSL write to it (a closed descriptor's number may already be another connection's).
  if (parked_fd_ >= 0 || client_.is_open()) tls_close();
  SSL_free(ssl_);
  ssl_ = nullptr;
}

}  // namespace fencegate::proxy
