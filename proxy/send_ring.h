// Several sends on several sockets in one system call, through an io_uring of our own.
//
// A worker sends the answers and requests of one reactor pass together, at the end of the pass
// (server.cpp, Worker::flush_sends): with a system call costing ~1.2 us before any work on these
// VMs, one io_uring_enter for the pass instead of one sendmsg per send is most of the gain. Each
// send is issued non-blocking (MSG_DONTWAIT): it completes during the submission, with what
// went or -EAGAIN, never later, so run() returns with every result and keeps no state behind.
//
// Where io_uring is not available (an old kernel, kernel.io_uring_disabled, a container's
// seccomp profile), open() returns null and the caller sends one by one: same results.
//
// Thread-safety: one SendRing per thread; only the thread that opened it may call run().
#pragma once

#include <sys/socket.h>

#include <climits>
#include <cstddef>
#include <memory>

namespace fencegate::proxy {

class SendRing {
 public:
  struct Op {
    int fd = -1;
    const msghdr* msg = nullptr;  // the data; lives until run() returns
    long result = 0;              // set by run(): bytes sent, -errno, or kUnknown
  };
  // The result of a send the kernel took but whose completion a failed ring lost: its bytes
  // may or may not have gone.
  static constexpr long kUnknown = LONG_MIN;

  // A ring for up to `depth` sends per submission; null where io_uring cannot be used.
  static std::unique_ptr<SendRing> open(unsigned depth);
  ~SendRing();
  SendRing(const SendRing&) = delete;
  SendRing& operator=(const SendRing&) = delete;

  // Sends each op's message on its descriptor (MSG_NOSIGNAL | MSG_DONTWAIT) and sets its result.
  // Returns the number of ops done, from the first: fewer than n only if the ring failed (then
  // it is not used again, broken() is true, and the caller sends the rest itself). Ops the ring
  // took before it failed may be kUnknown. REQUIRES: every fd >= 0 (without
  // IORING_SETUP_SUBMIT_ALL, kernels before 5.18, a bad one would stop the submission).
  std::size_t run(Op* ops, std::size_t n);
  bool broken() const { return broken_; }

 private:
  struct Rings;
  explicit SendRing(std::unique_ptr<Rings> r);
  std::unique_ptr<Rings> r_;
  bool broken_ = false;
};

}  // namespace fencegate::proxy
