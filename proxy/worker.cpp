// A worker's own work: its construction (epoll set of parked connections, reserved socket
// states), the watchdog tick, and the flush of a reactor pass's sends (one io_uring submission).
#include "proxy/worker.h"

#include <malloc.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "proxy/session.h"

namespace fencegate::proxy {

void log_send_path(bool ring) {
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  if (ring) log::info("sends of each reactor pass go out in one io_uring submission");
  else log::info("io_uring is not available here: each send is its own system call (slower, same results)");
}

Worker::Worker() {
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) throw std::system_error(errno, std::generic_category(), "epoll_create1");
  parked.assign(ep);
  watch_parked();
  // Asio keeps one small state block per registered socket, pooled for reuse but never freed.
  // Blocks made during a burst of connections land between that burst's request buffers and
  // frames and keep those heap pages resident after the burst; made here, up front, a worker's
  // first kReservedSockets blocks sit together instead.
  {
    std::vector<Socket> reserve;
    reserve.reserve(kReservedSockets);
    for (std::size_t i = 0; i < kReservedSockets; ++i) {
      boost::system::error_code ec;
      Socket s(ioc.get_executor());
      s.open(tcp::v4(), ec);
      if (ec) break;
      reserve.push_back(std::move(s));
    }
  }  // closed: their state blocks go to Asio's free pool
}

Worker::~Worker() {
  // Parked sessions are owned by the list; the others by handlers that die with ioc.
  for (Session *s = sessions, *next = nullptr; s; s = next) {
    next = s->next_;
    if (s->parked_fd_ >= 0) delete s;
  }
}

void Worker::watch_parked() {
  parked.async_wait(net::posix::descriptor_base::wait_read, [this](boost::system::error_code ec) {
    if (ec) return;
    // ioc's reactor watches this set edge-triggered: take every ready connection before waiting
    // again. Each is removed from the set before it runs, so none is reported twice.
    std::array<epoll_event, 64> ready;
    for (;;) {
      const int n = ::epoll_wait(parked.native_handle(), ready.data(), static_cast<int>(ready.size()), 0);
      if (n < 0 && errno == EINTR) continue;
      for (int i = 0; i < n; ++i) static_cast<Session*>(ready[i].data.ptr)->unpark();
      if (n < static_cast<int>(ready.size())) break;
    }
    watch_parked();
  });
}

void Worker::start_watchdog() {
  watchdog.expires_after(kWatchdogTick);
  watchdog.async_wait([this](boost::system::error_code ec) {
    if (ec) return;
    Session::check_deadlines(*this, Clock::now());
    close_burst_surplus(Clock::now());
    // A burst of requests leaves freed frames and buffers between the small allocations that
    // idle connections keep; once the worker has gone quiet, hand those pages back to the
    // system (never under load: only after a whole tick without a new request, and after the
    // connections those requests left idle have parked and freed their buffers).
    if (activity != activity_at_tick) {
      activity_at_tick = activity;
      trimmed = false;
    } else if (!trimmed) {
      trimmed = true;
      // Quiet: pooled buffers go too (they are cheap to make again), then the heap is trimmed.
      scratch.clear();
      for (auto& [_, pool] : idle)
        for (auto& c : pool) c->buf.release();
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
      // (Sanitizer builds bring their own allocator: glibc's malloc_trim would walk arenas that
      // were never set up, and crash.)
      ::malloc_trim(0);
#endif
    }
    start_watchdog();
  });
}

// Scans what the client sent so far. Returns 1 with *head_len when sc_->head holds a complete head,
void Worker::flush_sends() {
  sending.swap(sends);
  const std::size_t n = sending.size();
  send_ops.clear();
  send_of.clear();
  for (std::size_t i = 0; i < n; ++i) {
    QueuedSend* q = sending[i];
    // The descriptor as of now: a socket closed meanwhile (a drain abort) gets EBADF, never
    // another connection's bytes, and stays out of the ring.
    if (!q->sock->is_open()) {
      q->result = -EBADF;
      continue;
    }
    if (q->fence && !q->fence->fleet_allows_send(*q->node)) {  // issue 33 (docs/fleet.md)
      q->result = -ECONNABORTED;
      continue;
    }
    send_ops.push_back(SendRing::Op{q->sock->native_handle(), &q->msg, 0});
    send_of.push_back(q);
  }
  const std::size_t m = send_ops.size();
  std::size_t done = 0;
  if (m > 1 && batching()) {
    done = ring->run(send_ops.data(), m);
    if (ring->broken()) log::error("io_uring failed: each send is its own system call from now on");
  }
  for (std::size_t i = done; i < m; ++i) send_ops[i].result = send_msg(send_ops[i].fd, send_ops[i].msg);
  for (std::size_t i = 0; i < m; ++i) send_of[i]->result = send_ops[i].result;
  // Resumed in order; one that sends again queues for the next flush.
  for (std::size_t i = 0; i < n; ++i) resume(sending[i]->waiter);
  sending.clear();
}

}  // namespace fencegate::proxy
