// Tests for proxy/send_ring.h: sends on several sockets in one submission. What the proxy relies
// on: every op gets the result a sendmsg(2) would have given (all sent, part sent, -EAGAIN on a
// full socket at once rather than later, the error of a broken or bad descriptor), the bytes
// arrive intact and in order, and run() never waits for a peer.
#include "proxy/send_ring.h"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <vector>

using fencegate::proxy::SendRing;

namespace {

// A connected loopback TCP pair; both ends non-blocking.
struct TcpPair {
  int a = -1, b = -1;
  TcpPair() {
    int l = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(l, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(l, 1) == 0);
    socklen_t len = sizeof addr;
    ::getsockname(l, reinterpret_cast<sockaddr*>(&addr), &len);
    a = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    ::connect(a, reinterpret_cast<sockaddr*>(&addr), sizeof addr);  // EINPROGRESS on loopback is fine
    b = ::accept4(l, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    ::close(l);
    REQUIRE(b >= 0);
  }
  ~TcpPair() {
    if (a >= 0) ::close(a);
    if (b >= 0) ::close(b);
  }
  std::string drain() {
    std::string got;
    char buf[65536];
    for (;;) {
      ssize_t n = ::recv(b, buf, sizeof buf, MSG_DONTWAIT);
      if (n <= 0) break;
      got.append(buf, static_cast<std::size_t>(n));
    }
    return got;
  }
};

struct Msg {
  std::vector<iovec> iov;
  msghdr m{};
  explicit Msg(std::vector<std::string>& parts) {
    for (auto& p : parts) iov.push_back(iovec{p.data(), p.size()});
    m.msg_iov = iov.data();
    m.msg_iovlen = iov.size();
  }
};

}  // namespace

TEST_CASE("send ring: many sockets in one run, each its own bytes and result") {
  auto ring = SendRing::open(8);
  if (!ring) {
    MESSAGE("io_uring is not available here (the proxy sends one by one); nothing to test");
    return;
  }
  // More ops than the ring's depth: run() submits in rounds.
  constexpr int kN = 20;
  std::vector<TcpPair> pairs(kN);
  std::vector<std::vector<std::string>> data(kN);
  std::vector<Msg> msgs;
  msgs.reserve(kN);
  std::vector<SendRing::Op> ops(kN);
  for (int i = 0; i < kN; ++i) {
    data[i] = {"HTTP/1.1 200 OK\r\nX-Pair: " + std::to_string(i) + "\r\n\r\n", std::string(100 + i, 'a' + i % 26)};
    msgs.emplace_back(data[i]);
    ops[i] = SendRing::Op{pairs[i].a, &msgs[i].m, 12345};
  }
  REQUIRE(ring->run(ops.data(), ops.size()) == ops.size());
  for (int i = 0; i < kN; ++i) {
    const std::string want = data[i][0] + data[i][1];
    CHECK(ops[i].result == static_cast<long>(want.size()));
    CHECK(pairs[i].drain() == want);
  }
  CHECK_FALSE(ring->broken());
}

TEST_CASE("send ring: a full socket gives -EAGAIN at once, a part-sent one its count, others go") {
  auto ring = SendRing::open(8);
  if (!ring) return;
  TcpPair partial, fine;
  // `full`: a Unix stream pair filled up (over TCP, loopback may make room again at any moment).
  int full[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, full) == 0);
  char chunk[4096] = {};
  while (::send(full[0], chunk, sizeof chunk, MSG_DONTWAIT | MSG_NOSIGNAL) > 0) {
  }
  while (::send(full[0], chunk, 1, MSG_DONTWAIT | MSG_NOSIGNAL) > 0) {
  }
  // `partial`: small buffers, and a message larger than they take.
  int small = 4096;
  ::setsockopt(partial.a, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  ::setsockopt(partial.b, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  std::vector<std::string> big{std::string(4 << 20, 'x')};
  std::vector<std::string> one{"x"}, hello{"hello"};
  Msg mfull(one), mpart(big), mfine(hello);
  SendRing::Op ops[3] = {{full[0], &mfull.m, 0}, {partial.a, &mpart.m, 0}, {fine.a, &mfine.m, 0}};
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(ring->run(ops, 3) == 3);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1));  // nothing waited for a peer
  CHECK(ops[0].result == -EAGAIN);
  CHECK(ops[1].result > 0);
  CHECK(ops[1].result < static_cast<long>(big[0].size()));
  CHECK(ops[2].result == 5);
  CHECK(fine.drain() == "hello");
  ::close(full[0]);
  ::close(full[1]);
}

TEST_CASE("send ring: a peer that is gone and a descriptor that is no socket give sendmsg's errors, not a signal") {
  auto ring = SendRing::open(4);
  if (!ring) return;
  TcpPair gone;
  ::shutdown(gone.b, SHUT_RD);
  ::close(gone.b);  // RST on the next data, then EPIPE
  gone.b = -1;
  std::vector<std::string> hello{"hello"};
  Msg m(hello);
  long first = 0, second = 0;
  for (long* r : {&first, &second}) {
    SendRing::Op op{gone.a, &m.m, 0};
    REQUIRE(ring->run(&op, 1) == 1);
    *r = op.result;
    ::usleep(20000);  // the RST comes back
  }
  CHECK(first == 5);  // the first send still goes: the close is not known yet
  CHECK((second == -EPIPE || second == -ECONNRESET));
  int pipefd[2];
  REQUIRE(::pipe(pipefd) == 0);
  SendRing::Op bad{pipefd[1], &m.m, 0};
  REQUIRE(ring->run(&bad, 1) == 1);
  CHECK(bad.result == -ENOTSOCK);
  CHECK_FALSE(ring->broken());
  ::close(pipefd[0]);
  ::close(pipefd[1]);
}
