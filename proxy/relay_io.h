// The relay's building blocks, internal to proxy/ (it includes Asio): the executor and socket
// types of the data path, byte buffers, upstream connections, and the small hot helpers that build
// message heads and send gather writes without a reactor operation (send_now). Header-only so that
// they stay inlined where they are used.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.h"
#include "proxy/framing.h"
#include "proxy/head.h"
#include "proxy/readiness.h"
#include "proxy/tls_upstream.h"

namespace fencegate::proxy {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using config::Mode;
using Clock = std::chrono::steady_clock;

// One concrete executor type everywhere: no type-erased executor on the request path.
using Executor = net::io_context::executor_type;
template <class T = void>
using task = net::awaitable<T, Executor>;
constexpr net::use_awaitable_t<Executor> use_task{};
using Socket = net::basic_stream_socket<tcp, Executor>;
using Timer = net::basic_waitable_timer<Clock, net::wait_traits<Clock>, Executor>;
using Acceptor = net::basic_socket_acceptor<tcp, Executor>;

constexpr std::size_t kRelayBuffer = 16 * 1024;
constexpr std::size_t kMaxResponseHeader = 64 * 1024;
constexpr std::uint64_t kDiscardLimit = 64 * 1024;  // refused bodies up to this are skipped, not fatal
constexpr auto kWatchdogTick = std::chrono::milliseconds(20);
constexpr auto kHotIdle = std::chrono::milliseconds(50);  // idle reads keep their buffer this long
constexpr std::size_t kMaxHotIdle = 4096;                 // ... on at most this many connections per worker
constexpr std::size_t kTlsHotBuffers = 64;  // TLS: idle reads keep OpenSSL's ~34 KiB of buffers on this many
constexpr std::size_t kReservedSockets = 2048;            // Asio socket states made at start, per worker
constexpr std::size_t kPoolBurst = 1024;                  // pooled upstreams kept beyond the setting ...
constexpr auto kPoolBurstIdle = std::chrono::seconds(1);  // ... while idle less than this
constexpr std::size_t kMaxGather = 32;    // chunk data runs re-framed per write
constexpr unsigned kSendRingDepth = 64;   // sends per io_uring submission
inline constexpr std::size_t kScratchPool = 64;  // free Scratch kept per worker
inline constexpr std::size_t kSpareSuspended = 256;  // free nodes of Worker::suspended kept

// A byte buffer with a read and a write end. Holds no memory while empty and released, so an
// idle keep-alive connection costs no buffer.
class ByteBuf {
 public:
  std::string_view view() const { return {p_.get() + b_, e_ - b_}; }
  std::size_t size() const { return e_ - b_; }
  bool empty() const { return b_ == e_; }
  void consume(std::size_t n) {
    b_ += n;
    if (b_ >= e_) b_ = e_ = 0;
  }
  // Room for `want` more bytes at the end (moves the unread bytes to the front or grows).
  net::mutable_buffer prepare(std::size_t want) {
    if (cap_ - e_ < want) {
      const std::size_t n = size();
      if (b_ > 0 && cap_ - n >= want) {
        std::memmove(p_.get(), p_.get() + b_, n);
      } else {
        std::size_t cap = std::max(n + want, cap_ * 2);
        std::unique_ptr<char[]> q(new char[cap]);
        if (n) std::memcpy(q.get(), p_.get() + b_, n);
        p_ = std::move(q);
        cap_ = cap;
      }
      b_ = 0;
      e_ = n;
    }
    return net::buffer(p_.get() + e_, want);
  }
  void commit(std::size_t n) { e_ += n; }
  // Frees the memory if nothing is unread.
  void release() {
    if (empty()) {
      p_.reset();
      cap_ = b_ = e_ = 0;
    }
  }

 private:
  std::unique_ptr<char[]> p_;
  std::size_t cap_ = 0, b_ = 0, e_ = 0;
};

struct UpConn {
  explicit UpConn(net::io_context& ioc) : sock(ioc.get_executor()) {}
  Socket sock;
  ByteBuf buf;
  Clock::time_point idle_since{};  // when it went back to the pool
  // This exchange's upstream began a success answer before it had the whole request (it streams
  // while it reads): the rest of the request goes on, and is not watched for an answer again.
  bool duplex = false;
  // TLS to the upstream (issue 27): an https:// upstream's context; `sock` is then our end of the
  // socketpair to its TLS connection (proxy/tls_origin.h). Null for http://.
  std::shared_ptr<const UpstreamTls> tls;
};

// Hop-by-hop fields of RFC 9110 7.6.1 (Connection, Keep-Alive, Proxy-Connection, TE, Trailer,
// Upgrade, Proxy-Authenticate, Proxy-Authorization): never relayed.
inline bool is_hop_by_hop(FieldKind k) {
  return k == FieldKind::connection || k == FieldKind::upgrade || k == FieldKind::hop_by_hop;
}

// Splits a comma-separated list into trimmed, non-empty tokens.
template <class F>
void for_each_token(std::string_view v, F&& f) {
  while (!v.empty()) {
    auto c = v.find(',');
    std::string_view t = v.substr(0, c);
    while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
    while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.remove_suffix(1);
    if (!t.empty()) f(t);
    if (c == std::string_view::npos) break;
    v.remove_prefix(c + 1);
  }
}

// True iff a Connection field of the head lists `n` (hop-by-hop by declaration).
template <class Head>
bool named_by_connection(const Head& h, std::string_view n) {
  if (!h.has(FieldKind::connection)) return false;
  bool found = false;
  for (const auto& f : h.fields)
    if (!found && f.kind == FieldKind::connection)
      for_each_token(f.value, [&](std::string_view t) { found = found || iequals(t, n); });
  return found;
}

// Appends the pieces to `out` with one size check and one copy each.
template <class... Parts>
void append(std::string& out, const Parts&... parts) {
  const std::string_view views[] = {std::string_view(parts)...};
  std::size_t n = 0;
  for (auto v : views) n += v.size();
  std::size_t at = out.size();
  out.resize(at + n);
  for (auto v : views) {
    if (v.empty()) continue;  // an empty view may have no data pointer at all
    std::memcpy(out.data() + at, v.data(), v.size());
    at += v.size();
  }
}

inline void append_field(std::string& out, std::string_view name, std::string_view value) {
  const std::size_t at = out.size();
  out.resize(at + name.size() + value.size() + 4);
  char* p = out.data() + at;
  if (!name.empty()) std::memcpy(p, name.data(), name.size());
  p += name.size();
  *p++ = ':';
  *p++ = ' ';
  if (!value.empty()) std::memcpy(p, value.data(), value.size());
  p += value.size();
  *p++ = '\r';
  *p = '\n';
}

// Decimal digits of v (no allocation).
struct Decimal {
  explicit Decimal(std::uint64_t v) {
    len = static_cast<std::size_t>(std::to_chars(buf, buf + sizeof buf, v).ptr - buf);
  }
  operator std::string_view() const { return {buf, len}; }
  char buf[24];
  std::size_t len;
};

// "host:port" of an upstream URL as configured ("http://host:port" or "https://...", perhaps with a path).
inline std::string_view upstream_authority(std::string_view url) {
  if (url.substr(0, 7) == "http://") url.remove_prefix(7);
  else if (url.substr(0, 8) == "https://") url.remove_prefix(8);  // TLS to the upstream (issue 27)
  return url.substr(0, url.find('/'));
}

// Moves `bufs` past its first n bytes.
template <class Buffers>
void advance(Buffers& bufs, std::size_t n) {
  for (net::const_buffer& b : bufs) {
    const std::size_t k = std::min(n, b.size());
    b += k;
    n -= k;
  }
}

// The pieces of a message for sendmsg(2): returns how many (empty ones skipped; *total: their
// bytes), or iov.size() + 1 if there are more than one call takes.
template <class Buffers>
std::size_t to_iov(const Buffers& bufs, std::array<iovec, kMaxGather + 4>& iov, std::size_t* total) {
  std::size_t n = 0;
  *total = 0;
  for (const net::const_buffer& b : bufs) {
    if (b.size() == 0) continue;
    if (n == iov.size()) return iov.size() + 1;
    iov[n].iov_base = const_cast<void*>(b.data());
    iov[n].iov_len = b.size();
    *total += b.size();
    ++n;
  }
  return n;
}

// How a send of `total` bytes that returned `r` (bytes, or -errno) went, in send_now's terms.
template <class Buffers>
bool sent_all(Buffers& bufs, std::size_t total, long r, boost::system::error_code& ec) {
  if (r < 0) {
    if (r != -EAGAIN && r != -EWOULDBLOCK) ec.assign(static_cast<int>(-r), boost::system::system_category());
    return false;
  }
  if (static_cast<std::size_t>(r) == total) return true;
  advance(bufs, static_cast<std::size_t>(r));
  return false;
}

inline long send_msg(int fd, const msghdr* msg) {
  ssize_t r;
  do r = ::sendmsg(fd, msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (r < 0 && errno == EINTR);
  return r < 0 ? -errno : static_cast<long>(r);
}

// Sends as much of `bufs` as the kernel takes right now, straight from this thread (the socket
// is non-blocking). Returns true iff all of it went: the common case, which then costs one
// sendmsg and no reactor operation, completion post or coroutine suspension. Otherwise `bufs`
// is advanced past what went and the caller writes the rest through Asio; *ec is set on a hard
// error (a full socket buffer is not one).
template <class Buffers>
bool send_now(Socket& s, Buffers& bufs, boost::system::error_code& ec) {
  ec.clear();  // like the write it replaces: *ec says how this send went, nothing earlier
  std::array<iovec, kMaxGather + 4> iov;
  std::size_t total = 0;
  const std::size_t n = to_iov(bufs, iov, &total);
  if (n > iov.size()) return false;  // more pieces than one call takes: all through Asio
  if (total == 0) return true;
  msghdr msg{};
  msg.msg_iov = iov.data();
  msg.msg_iovlen = n;
  return sent_all(bufs, total, send_msg(s.native_handle(), &msg), ec);
}

// A gather write of a relayed body: [the message head], a slot for a chunk-size line, then the
// body's data runs. Returns the slot's index.
inline std::size_t start_gather(std::vector<net::const_buffer>& gather, const std::string* head) {
  gather.clear();
  if (head) gather.push_back(net::buffer(*head));
  gather.emplace_back();
  return gather.size() - 1;
}

// Decodes chunks from `avail` and adds their data runs to the write (at most kMaxGather
// buffers). Returns the bytes of `avail` consumed; adds the data bytes to *total.
inline std::size_t decode_into(ChunkDecoder& dec, std::string_view avail, std::vector<net::const_buffer>& gather,
                               std::size_t* total) {
  std::size_t used = 0;
  while (used < avail.size() && !dec.done() && !dec.failed() && gather.size() < kMaxGather) {
    std::string_view d;
    used += dec.feed(avail.substr(used), &d);
    if (!d.empty()) {
      gather.push_back(net::buffer(d.data(), d.size()));
      *total += d.size();
    }
  }
  return used;
}

// Frames the data runs after `size_slot` as one chunk of our own (none for no data) and, when
// `last`, ends the body with the last chunk. `frame` holds the chunk-size line.
inline void frame_chunk(std::vector<net::const_buffer>& gather, std::size_t size_slot, std::string& frame,
                        std::size_t total, bool last) {
  frame.clear();
  if (total) {
    append_chunk_header(frame, total);
    gather[size_slot] = net::buffer(frame);
    gather.push_back(net::buffer(kChunkEnd));
  }
  if (last) gather.push_back(net::buffer(kLastChunk));
}

inline void set_nodelay(Socket& s) {
  boost::system::error_code ec;
  s.set_option(tcp::no_delay(true), ec);
}

// True iff an idle pooled connection still looks usable (peer has not closed it).
inline bool still_open(Socket& s) {
  char c;
  ssize_t n = ::recv(s.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return false;                                      // orderly close
  if (n > 0) return false;                                       // unsolicited bytes: unusable
  if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
  // Nothing queued, not even an EOF: the answer's first read waits for it without trying first.
  readiness::mark_empty(s);
  return true;
}

}  // namespace fencegate::proxy
