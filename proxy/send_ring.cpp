#include "proxy/send_ring.h"

#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

namespace fencegate::proxy {

namespace {

int ring_setup(unsigned entries, io_uring_params* p) {
  return static_cast<int>(::syscall(__NR_io_uring_setup, entries, p));
}

int ring_enter(int fd, unsigned submit, unsigned wait) {
  return static_cast<int>(::syscall(__NR_io_uring_enter, fd, submit, wait, IORING_ENTER_GETEVENTS, nullptr, 0));
}

unsigned load_acquire(const unsigned* p) { return std::atomic_ref<const unsigned>(*p).load(std::memory_order_acquire); }
void store_release(unsigned* p, unsigned v) { std::atomic_ref<unsigned>(*p).store(v, std::memory_order_release); }

}  // namespace

struct SendRing::Rings {
  int fd = -1;
  void* sq_map = MAP_FAILED;
  std::size_t sq_len = 0;
  void* cq_map = MAP_FAILED;  // == sq_map with IORING_FEAT_SINGLE_MMAP
  std::size_t cq_len = 0;
  io_uring_sqe* sqes = static_cast<io_uring_sqe*>(MAP_FAILED);
  std::size_t sqes_len = 0;
  unsigned* sq_head = nullptr;
  unsigned* sq_tail = nullptr;
  unsigned* sq_array = nullptr;
  unsigned sq_mask = 0;
  unsigned sq_entries = 0;
  unsigned* cq_head = nullptr;
  unsigned* cq_tail = nullptr;
  io_uring_cqe* cqes = nullptr;
  unsigned cq_mask = 0;

  ~Rings() {
    if (sqes != MAP_FAILED) ::munmap(sqes, sqes_len);
    if (cq_map != MAP_FAILED && cq_map != sq_map) ::munmap(cq_map, cq_len);
    if (sq_map != MAP_FAILED) ::munmap(sq_map, sq_len);
    if (fd >= 0) ::close(fd);
  }

  bool map(const io_uring_params& p) {
    sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    cq_len = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
    const bool single = p.features & IORING_FEAT_SINGLE_MMAP;
    if (single) sq_len = cq_len = std::max(sq_len, cq_len);
    sq_map = ::mmap(nullptr, sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQ_RING);
    if (sq_map == MAP_FAILED) return false;
    cq_map = single
                 ? sq_map
                 : ::mmap(nullptr, cq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_CQ_RING);
    if (cq_map == MAP_FAILED) return false;
    sqes_len = p.sq_entries * sizeof(io_uring_sqe);
    sqes = static_cast<io_uring_sqe*>(
        ::mmap(nullptr, sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQES));
    if (sqes == MAP_FAILED) return false;
    auto* sq = static_cast<char*>(sq_map);
    auto* cq = static_cast<char*>(cq_map);
    sq_head = reinterpret_cast<unsigned*>(sq + p.sq_off.head);
    sq_tail = reinterpret_cast<unsigned*>(sq + p.sq_off.tail);
    sq_array = reinterpret_cast<unsigned*>(sq + p.sq_off.array);
    sq_mask = *reinterpret_cast<unsigned*>(sq + p.sq_off.ring_mask);
    sq_entries = p.sq_entries;
    cq_head = reinterpret_cast<unsigned*>(cq + p.cq_off.head);
    cq_tail = reinterpret_cast<unsigned*>(cq + p.cq_off.tail);
    cqes = reinterpret_cast<io_uring_cqe*>(cq + p.cq_off.cqes);
    cq_mask = *reinterpret_cast<unsigned*>(cq + p.cq_off.ring_mask);
    return true;
  }

  // Queues ops[0..k) (k <= sq_entries, the ring empty) and submits them, waiting for `wait`
  // completions in the same call. Returns how many the kernel took, or -1.
  int submit(SendRing::Op* ops, unsigned k, unsigned wait) {
    const unsigned head = load_acquire(sq_head);
    const unsigned tail = *sq_tail;  // only this thread writes it
    for (unsigned i = 0; i < k; ++i) {
      const unsigned idx = (tail + i) & sq_mask;
      io_uring_sqe& e = sqes[idx];
      std::memset(&e, 0, sizeof e);
      e.opcode = IORING_OP_SENDMSG;
      e.fd = ops[i].fd;
      e.addr = reinterpret_cast<std::uint64_t>(ops[i].msg);
      e.len = 1;
      e.msg_flags = MSG_NOSIGNAL | MSG_DONTWAIT;  // MSG_DONTWAIT: -EAGAIN now, never a later completion
      e.user_data = i;
      sq_array[idx] = idx;
    }
    store_release(sq_tail, tail + k);
    int r;
    do r = ring_enter(fd, k, wait);
    while (r < 0 && errno == EINTR && load_acquire(sq_head) == head);
    // An interrupted wait may still have submitted: what the kernel took is what its head says.
    return r < 0 && load_acquire(sq_head) == head ? -1 : static_cast<int>(load_acquire(sq_head) - head);
  }

  // Reaps completions into ops until `want` have come. Returns false if the ring failed.
  bool reap(SendRing::Op* ops, unsigned want) {
    unsigned got = 0;
    for (;;) {
      unsigned head = *cq_head;
      const unsigned tail = load_acquire(cq_tail);
      for (; head != tail; ++head, ++got) {
        const io_uring_cqe& c = cqes[head & cq_mask];
        ops[c.user_data].result = c.res;
      }
      store_release(cq_head, head);
      if (got >= want) return true;
      const int r = ring_enter(fd, 0, want - got);
      if (r < 0 && errno != EINTR) return false;
    }
  }
};

SendRing::SendRing(std::unique_ptr<Rings> r) : r_(std::move(r)) {}
SendRing::~SendRing() = default;

std::unique_ptr<SendRing> SendRing::open(unsigned depth) {
  // The cheapest mode first: the kernel runs completion work only when we wait (we always do,
  // at once), and knows one thread submits.
  unsigned modes[] = {
#if defined(IORING_SETUP_SUBMIT_ALL) && defined(IORING_SETUP_SINGLE_ISSUER) && defined(IORING_SETUP_DEFER_TASKRUN)
    IORING_SETUP_SUBMIT_ALL | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
#endif
#ifdef IORING_SETUP_SUBMIT_ALL
    IORING_SETUP_SUBMIT_ALL,
#endif
    0
  };
  for (unsigned flags : modes) {
    io_uring_params p{};
    p.flags = flags;
    auto r = std::make_unique<Rings>();
    r->fd = ring_setup(depth, &p);
    if (r->fd < 0) {
      if (errno == EINVAL) continue;  // a flag this kernel does not know
      return nullptr;                 // ENOSYS, EPERM (disabled, seccomp), ENOMEM: not here
    }
    if (!(p.features & IORING_FEAT_NODROP) || !r->map(p)) return nullptr;
    std::unique_ptr<SendRing> ring(new SendRing(std::move(r)));
    // The one property everything rests on, checked on this kernel: a non-blocking send that
    // would block completes at once with -EAGAIN (it is not parked to finish later, which
    // would make run() wait for the peer). A socket pair with its send buffer full; the probe
    // is submitted without waiting, and its completion must be there when the call returns.
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) return nullptr;
    static const char fill[4096] = {};  // static: a parked probe may outlive this frame
    while (::send(sv[0], fill, sizeof fill, MSG_DONTWAIT | MSG_NOSIGNAL) > 0) {
    }
    static iovec iov{const_cast<char*>(fill), sizeof fill};
    msghdr m{};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    Op probe{sv[0], &m, 0};
    const int took = ring->r_->submit(&probe, 1, 0);
    const unsigned ready = load_acquire(ring->r_->cq_tail) - *ring->r_->cq_head;
    const bool ok = took == 1 && ready == 1 && ring->r_->reap(&probe, 1) && probe.result == -EAGAIN;
    // A parked probe ends with its sockets (an error, nothing sent), then the ring goes.
    ::close(sv[0]);
    ::close(sv[1]);
    if (!ok) return nullptr;
    return ring;
  }
  return nullptr;
}

std::size_t SendRing::run(Op* ops, std::size_t n) {
  std::size_t done = 0;
  while (done < n && !broken_) {
    const unsigned k = static_cast<unsigned>(std::min<std::size_t>(n - done, r_->sq_entries));
    for (unsigned i = 0; i < k; ++i) ops[done + i].result = kUnknown;  // until its completion is reaped
    const int took = r_->submit(ops + done, k, k);
    if (took <= 0) {
      broken_ = true;
      break;
    }
    if (!r_->reap(ops + done, static_cast<unsigned>(took))) {
      broken_ = true;  // results not reaped stay kUnknown
      done += static_cast<unsigned>(took);
      break;
    }
    done += static_cast<unsigned>(took);
    if (static_cast<unsigned>(took) < k) broken_ = true;
  }
  return done;
}

}  // namespace fencegate::proxy
