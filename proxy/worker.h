// A worker: one data-path thread's io_context, with what its sessions share: the parked
// connections' epoll set, the watchdog that enforces every session's deadline, the idle upstream
// pools, the scratch buffers leased to running sessions, the results handed over from other
// threads (CrossThreadResult) and the batched sends of each reactor pass (flush_sends).
// Internal to proxy/ (it includes Asio).
#pragma once

#include <poll.h>
#include <sched.h>

#include <atomic>
#include <boost/asio/any_completion_handler.hpp>
#include <functional>
#include <list>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "config/router.h"
#include "fence_store/store.h"
#include "proxy/admission.h"
#include "proxy/authority.h"
#include "proxy/fence.h"
#include "proxy/local_reply.h"
#include "common/log.h"
#include "common/wake_batch.h"
#include "proxy/metrics.h"
#include "proxy/relay_io.h"
#include "proxy/runtime.h"
#include "proxy/send_ring.h"

namespace fencegate::proxy {

// ---------------------------------------------------------------------------------------------
// Shared state (constant after start, or atomic).

// Process-wide state of the data path that is not part of the config.
struct ServerState {
  explicit ServerState(Runtime& r) : rt(r) {}
  Runtime& rt;
  Authorities* authorities = nullptr;  // routes' election authorities (constant after start)
  std::atomic<std::size_t> connections{0};
  std::atomic<std::size_t> active_requests{0};
  // max_connections_per_client (0: off): the connections of each client address, counted while
  // the limit is on (a connection accepted while it was off is not counted).
  std::mutex per_client_mu;
  std::unordered_map<std::string, std::size_t> per_client;  // guarded by per_client_mu
};

class Session;
namespace idem {
struct Keyed;  // issue 30: proxy/idempotency.h
}

// One request's values that its stages share (session.cpp: check, route, admit; relay.cpp:
// forward). It lives in the frame of the request's coroutine (Session::handle), so a connection
// waiting for its next request holds none of it.
struct RequestState {
  std::size_t head_len = 0;               // bytes of the head in Scratch::in
  int version = 11;                       // 10 or 11
  Framing framing;
  bool has_body = false;
  bool client_keep_alive = true;          // the client's intent, before any refusal
  bool expect_continue = false;           // Expect: 100-continue, validated
  bool routed = false;                    // match is this request's
  config::Router::Match match;            // the route and resource (routed once)
  bool fenced = false;                    // the route fences this method
  FenceHeaders fence;                     // the answer's fence headers (fence.resource views match.resource)
  PresentedToken token;
  std::optional<AuthorityCheck> authority;  // the route's election authority's verdict on the token
  Decision decision;                        // the fence's, once asked
  Admission admission;                      // the admission decision
  std::shared_ptr<idem::Keyed> idem;        // issue 30: a keyed write recorded in flight (else null)
  std::shared_ptr<store::KeyRider> idem_rider;  // issue 30: its key and body read (idem_prepare), else null
  std::uint64_t idem_body = 0;                  // issue 30: the bytes of that body in Scratch::in
};

// What a connection needs only while it is not parked: buffers and the parsed heads. Leased
// from the worker's pool, so a parked connection holds none of it.
struct Scratch {
  ByteBuf in;                            // bytes from the client not yet used
  std::string out;                       // the head being sent (upstream or client)
  RequestHead head;                      // the current request's head (views into in)
  bool head_method = false;              // the current request is a HEAD (its views may be gone)
  ResponseHead resp;
  std::vector<net::const_buffer> gather;
  std::string frame, te_value;
  // Built here, not as temporaries inside a co_await expression: those would each take a slot
  // in the request coroutine's frame (GCC keeps them across the suspension).
  Problem problem{0, {}, {}, {}};
  // TLS to the upstream (issue 27): why this request's upstream handshake failed (reason class, or
  // nullptr) and OpenSSL's words for it, for upstream_failed().
  const char* tls_failure = nullptr;
  std::string tls_detail;
  // TLS from the client (issue 27, session_tls.cpp): a write's pieces gathered into one record,
  // the records made of them, waiting for the batched send, and records read, not yet decrypted.
  std::string tls_out, tls_wire;
  ByteBuf tls_in;
  // The request being handled (Session::handle). Here, not in handle's coroutine frame: ~1.1 KiB
  // there made the frame too large for Asio's per-thread recycling of frames (<= 1020 bytes),
  // a malloc and a free per request.
  RequestState rq;
};

// The result of the last lookup by name, kept: nearly every request of a worker goes to the
// same upstream and resource. For lookups whose results live as long as the worker (map entries
// that are never erased). A null result is looked up again next time.
template <class T>
struct LastLookup {
  std::string name;
  T* value = nullptr;
  template <class Find>
  T* get(const std::string& n, Find&& find) {
    if (!value || n != name) {
      value = find(n);
      name = n;
    }
    return value;
  }
};

// Says once per process how the workers send (the first worker to find out).
void log_send_path(bool ring);

struct Worker {
  Worker();
  ~Worker();  // closes the parked connections
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  // Declared before ioc: sessions still suspended when ioc is destroyed unlink themselves.
  Session* sessions = nullptr;  // intrusive list, for the watchdog
  // One thread runs it, and every socket operation of its sessions starts on that thread
  // (sessions are made by a handler posted here; other threads only post): no per-socket locks.
  net::io_context ioc{BOOST_ASIO_CONCURRENCY_HINT_UNSAFE_IO};
  // Parked connections wait here, not in ioc's reactor: their descriptors are in this epoll set
  // (level-triggered, one-shot), which itself is one descriptor in ioc's reactor. A parked
  // connection so holds no Asio state at all (no descriptor state, no pending operation).
  net::posix::basic_stream_descriptor<Executor> parked{ioc.get_executor()};
  void watch_parked();
  // Guarded by running on ioc's single thread.
  std::unordered_map<std::string, std::vector<std::unique_ptr<UpConn>>> idle;
  Timer watchdog{ioc.get_executor()};
  std::uint64_t requests = 0;            // started on this worker
  std::uint64_t activity = 0;            // requests started and connections parked
  std::uint64_t activity_at_tick = 0;    // ... as of the previous watchdog tick
  bool trimmed = true;                   // no request since the heap was last trimmed
  std::size_t hot_idle = 0;              // sessions waiting for a request hot (not parked)
  std::vector<std::unique_ptr<Scratch>> scratch;  // free ones, reused LIFO
  using Pool = std::vector<std::unique_ptr<UpConn>>;
  LastLookup<Pool> last_pool;
  LastLookup<FenceResource> last_fence;
  LastLookup<ResourceCounters> last_counters;
  std::size_t pool_keep = 0;  // upstream_idle_per_thread as of the last give-back
  // Closes pooled connections beyond pool_keep that have been idle for kPoolBurstIdle (the
  // oldest are at the front).
  void close_burst_surplus(Clock::time_point now) {
    for (auto& [_, pool] : idle) {
      std::size_t n = 0;
      while (pool.size() - n > pool_keep && now - pool[n]->idle_since >= kPoolBurstIdle) ++n;
      if (n) pool.erase(pool.begin(), pool.begin() + static_cast<std::ptrdiff_t>(n));
      // TLS to the upstream (issue 27): a reload replaced the context these were made with.
      if (!pool.empty() && pool.front()->tls && pool.front()->tls->retired()) pool.clear();
    }
  }
  // The idle pool of an upstream.
  Pool& pool(const std::string& upstream) {
    return *last_pool.get(upstream, [this](const std::string& u) { return &idle[u]; });
  }
  // The metrics counters of a resource (Metrics keeps them for the process's life).
  ResourceCounters* counters(Metrics& m, const std::string& resource) {
    return last_counters.get(resource, [&m](const std::string& r) { return m.resource(r); });
  }
  void start_watchdog();
  std::unique_ptr<Scratch> lease() {
    if (scratch.empty()) return std::make_unique<Scratch>();
    auto s = std::move(scratch.back());
    scratch.pop_back();
    return s;
  }
  void give_back(std::unique_ptr<Scratch> s) {
    if (!s || scratch.size() >= kScratchPool) return;
    s->in.consume(s->in.size());
    s->in.release();
    s->tls_in.consume(s->tls_in.size());
    s->tls_in.release();
    s->rq = RequestState{};  // a keyed write's capture and key go with their request
    scratch.push_back(std::move(s));
  }

  // Sessions waiting for another thread: the store's durable commit, a fence decision. That
  // thread often shares a core with this busy worker, and a thread woken there (by the disk's
  // completion, say) may only get the core at the scheduler's next tick, 4 ms later: a worker
  // with requests queued never blocks, so it gives the scheduler no earlier point to switch.
  // While any session waits and the worker keeps serving, it offers the core once per pass
  // through its ready handlers (sched_yield returns at once when nothing else is runnable).
  std::size_t waits_elsewhere = 0;
  bool offering = false;
  std::uint64_t requests_at_offer = 0;
  void offer_cpu() {
    if (offering || waits_elsewhere == 0) return;
    offering = true;
    requests_at_offer = requests;
    net::post(ioc, [this] {
      offering = false;
      // Nobody waits any more, or no request started since the last pass: the worker is about
      // to block in the reactor anyway (begin_request() starts the offers again).
      if (waits_elsewhere == 0 || requests == requests_at_offer) return;
      ::sched_yield();
      offer_cpu();
    });
  }

  // Results made on other threads for sessions of this worker (CrossThreadResult::fulfil).
  // Posted to ioc, each would queue behind every handler already ready (under load, a whole pass
  // through the busy connections) and then behind a second pass for the session's own wake-up.
  // Instead they are run at the next request start on this worker (begin_request), or by one
  // posted handler if that comes first (an idle worker), and each resumes its session directly.
  using Suspended = std::list<net::any_completion_handler<void()>>;  // see `suspended`
  // Any thread:
  void deliver(std::function<void()> f) {
    bool first = false;
    {
      std::lock_guard lk(delivered_mu);
      first = delivered.empty();
      delivered.push_back(std::move(f));
      has_delivered.store(true, std::memory_order_release);
    }
    // Non-empty means an earlier post has not run yet: it takes this one too.
    // (Within a WakeBatch, once the batch ends: all its deliveries then wake this thread once.)
    if (first) WakeBatch::wake([this] { net::post(ioc, [this] { run_delivered(); }); });
  }
  // The worker's thread: runs what was delivered so far (cheap when nothing was).
  void run_delivered() {
    if (!has_delivered.load(std::memory_order_acquire)) return;
    std::vector<std::function<void()>> batch;  // local: a resumed session may come back here
    {
      std::lock_guard lk(delivered_mu);
      batch.swap(delivered);
      has_delivered.store(false, std::memory_order_relaxed);
    }
    for (auto& f : batch) f();
  }
  std::mutex delivered_mu;
  std::vector<std::function<void()>> delivered;  // guarded by delivered_mu
  std::atomic<bool> has_delivered{false};
  // Upstream answers awaited by exchanges that already waited on another thread (a generation
  // advance): besides the reactor, the worker polls these sockets at each request start, so such
  // an answer is taken as soon as it is there, not a pass through the busy connections later.
  struct PromptRead {
    Socket* sock = nullptr;
    Suspended::iterator waiter;
    bool waiting = false;          // waiter is set and not yet resumed
    bool reactor_pending = false;  // the reactor's readiness wait is still outstanding
  };
  std::vector<std::shared_ptr<PromptRead>> prompt;
  // Resumes p's session unless that happened already (the reactor and the poll both end here).
  void prompt_ready(const std::shared_ptr<PromptRead>& p) {
    auto it = std::find(prompt.begin(), prompt.end(), p);
    if (it != prompt.end()) prompt.erase(it);
    if (!p->waiting) return;
    p->waiting = false;
    resume(p->waiter);
  }
  // At a request start: resumes the sessions whose upstream answers have arrived (one poll(2)).
  void poll_prompt() {
    if (prompt.empty()) return;
    std::array<pollfd, 16> fds;
    std::array<std::shared_ptr<PromptRead>, 16> ps;
    std::size_t n = 0;
    for (auto& p : prompt) {
      if (n == fds.size()) break;
      fds[n] = pollfd{p->sock->native_handle(), POLLIN, 0};  // closed (-1): reported ready below
      ps[n++] = p;
    }
    if (::poll(fds.data(), n, 0) < 0) return;
    for (std::size_t i = 0; i < n; ++i)
      if (fds[i].fd < 0 || fds[i].revents) prompt_ready(ps[i]);
  }
  // Sends of this reactor pass, made together at its end (flush_sends): answers to clients and
  // requests to upstreams, in one io_uring submission rather than a sendmsg(2) each (a system
  // call costs ~1.2 us before any work on the VMs measured: bench/HISTORY.md, the 2026-12-02 16:20 run). Each session
  // stays suspended until its bytes went and then learns what went exactly as from send_now();
  // nothing is copied. Without io_uring (a container's seccomp profile, an old kernel, it
  // disabled) sessions send inline with send_now(): batching alone measured no faster.
  struct QueuedSend {
    Socket* sock = nullptr;
    std::array<iovec, kMaxGather + 4> iov;
    msghdr msg{};
    long result = 0;  // bytes sent, -errno, or SendRing::kUnknown
    Suspended::iterator waiter;
    // Issue 33: a fenced write's bytes to its upstream in a fleet: membership is checked again
    // right before they go (a replica stopped between queueing and this pass's flush must not send
    // them after it lost its membership). Not sent: result -ECONNABORTED.
    const Fence* fence = nullptr;
    const InflightNode* node = nullptr;
  };
  std::vector<QueuedSend*> sends;  // queued in this pass
  std::vector<QueuedSend*> sending;  // being sent by flush_sends
  std::vector<SendRing::Op> send_ops;  // the sends of `sending` on open sockets ...
  std::vector<QueuedSend*> send_of;  // ... and the QueuedSend of each
  std::unique_ptr<SendRing> ring;  // null: io_uring is not available, sendmsg one by one
  bool ring_opened = false;
  // True iff sends go through flush_sends (opens the ring on first use: on the worker's thread,
  // the only one that submits to it).
  bool batching() {
    if (!ring_opened) {
      ring_opened = true;
      ring = SendRing::open(kSendRingDepth);
      log_send_path(ring != nullptr);
    }
    return ring && !ring->broken();
  }
  void queue_send(QueuedSend* q, net::any_completion_handler<void()> h) {
    q->waiter = suspend(std::move(h));
    sends.push_back(q);
    // Posted now, it runs after every handler already ready: the rest of this pass.
    if (sends.size() == 1) net::post(ioc, [this] { flush_sends(); });
  }
  void flush_sends();
  // Nodes of `suspended` are kept here once their session resumed (every batched send suspends:
  // a list node's malloc and free per send otherwise). Empty handlers only.
  Suspended spare;
  // Sessions suspended in CrossThreadResult::wait(), by their resumptions. Owned here, so that a
  // worker torn down with sessions still waiting destroys them (their coroutine frames hold the
  // CrossThreadResult) first, while everything they use is still there: keep this the last member.
  Suspended suspended;
  Suspended::iterator suspend(net::any_completion_handler<void()> h) {
    if (spare.empty()) return suspended.insert(suspended.end(), std::move(h));
    suspended.splice(suspended.end(), spare, spare.begin());
    auto it = std::prev(suspended.end());
    it->swap(h);  // (Boost 1.81's move assignment wraps its operand instead of taking it over)
    return it;
  }
  void resume(Suspended::iterator it) {
    auto h = std::move(*it);  // the node goes back empty
    if (spare.size() < kSpareSuspended) spare.splice(spare.end(), suspended, it);
    else suspended.erase(it);
    std::move(h)();
  }
};

// A value made on another thread (the store's durable commit, a fence decision) for a session of
// this worker, which waits for it in wait(). The value is handed over by Worker::deliver() and
// the session resumes directly from the delivery, not through the io_context's queue.
template <class T>
struct CrossThreadResult {
  explicit CrossThreadResult(Worker& w) : worker(w) {}
  Worker& worker;
  // On the worker's thread only.
  std::optional<T> value;
  std::optional<Worker::Suspended::iterator> waiter;  // the session's resumption while it waits

  // Called from any thread, once.
  static void fulfil(const std::shared_ptr<CrossThreadResult>& s, T v) {
    s->worker.deliver([s, v = std::move(v)]() mutable {
      s->value = std::move(v);
      if (s->waiter) {
        auto it = *s->waiter;
        s->waiter.reset();
        s->worker.resume(it);
      }
    });
  }
  task<T> wait() {
    if (!value) {
      ++worker.waits_elsewhere;
      worker.offer_cpu();
      // The initiation runs once the coroutine is suspended; delivery resumes it.
      co_await net::async_initiate<const net::use_awaitable_t<Executor>&, void()>(
          [this](auto handler) { waiter = worker.suspend(std::move(handler)); }, use_task);
      --worker.waits_elsewhere;
    }
    co_return std::move(*value);
  }
};

// One forwarded exchange; it holds the fence registration and the upstream connection.
struct Exchange : std::enable_shared_from_this<Exchange> {
  Exchange(Fence& f) : fence(f) {}
  ~Exchange() { release(); }
  void release() { fence.release(&node); }
  Fence& fence;
  net::io_context* ioc = nullptr;  // of the session, for node.abort
  Socket* client = nullptr;  // the session's client socket, woken by node.abort
  InflightNode node;
  std::unique_ptr<UpConn> up;
  bool aborted = false;  // by a newer generation's drain timeout
};

}  // namespace fencegate::proxy
