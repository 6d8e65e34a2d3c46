// The fenced reverse proxy: listener, client sessions, upstream pool, and the HTTP/1.1 relay.
//
// The relay is our own, on plain Asio sockets: request heads come from the strict scanner in
// proxy/head.h, bodies are framed by Content-Length or by proxy/framing.h's chunk decoder, and
// every message that goes out (upstream or to the client) gets a head built here, so nothing
// passes through that this file did not parse. Per request in the common case that is one read
// from the client, one gather write upstream, one read of the response, one gather write back;
// the writes of one event-loop pass go out together, in one io_uring submission where the
// kernel allows it (Worker::flush_sends).
//
// Timeouts: each session has one deadline (head, body, upstream, client write: whatever it is
// waiting for now) and each worker one watchdog timer that ticks every kWatchdogTick and cancels
// the socket operations of sessions past their deadline. No timer is armed per operation.
//
// Threads: one io_context per worker thread (each runs single-threaded, so a session and the
// upstream pool of its worker need no locks); the Store's thread commits; the Fence's timer thread
// enforces drain timeouts. Results from those threads are handed to the session's worker
// (Worker::deliver), which resumes the session at its next request start or from one posted
// handler, whichever comes first.
#include "proxy/server.h"

#include <malloc.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <poll.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/any_completion_handler.hpp>
#include <list>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "config/router.h"
#include "fence_store/store.h"
#include "proxy/admin.h"
#include "proxy/authority.h"
#include "proxy/fence.h"
#include "proxy/framing.h"
#include "proxy/head.h"
#include "proxy/log.h"
#include "proxy/metrics.h"
#include "proxy/readiness.h"
#include "proxy/runtime.h"
#include "proxy/send_ring.h"
#include "proxy/token.h"

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

namespace {

constexpr std::size_t kRelayBuffer = 16 * 1024;
constexpr std::size_t kMaxResponseHeader = 64 * 1024;
constexpr std::uint64_t kDiscardLimit = 64 * 1024;  // refused bodies up to this are skipped, not fatal
constexpr auto kWatchdogTick = std::chrono::milliseconds(20);
constexpr auto kHotIdle = std::chrono::milliseconds(50);  // idle reads keep their buffer this long
constexpr std::size_t kMaxHotIdle = 4096;                 // ... on at most this many connections per worker
constexpr std::size_t kReservedSockets = 2048;            // Asio socket states made at start, per worker
constexpr std::size_t kPoolBurst = 1024;                  // pooled upstreams kept beyond the setting ...
constexpr auto kPoolBurstIdle = std::chrono::seconds(1);  // ... while idle less than this
constexpr std::size_t kMaxGather = 32;    // chunk data runs re-framed per write
constexpr unsigned kSendRingDepth = 64;   // sends per io_uring submission
constexpr std::size_t kScratchPool = 64;  // free Scratch kept per worker

// ---------------------------------------------------------------------------------------------
// Shared state (constant after start, or atomic).

// Process-wide state of the data path that is not part of the config.
struct ServerState {
  explicit ServerState(Runtime& r) : rt(r) {}
  Runtime& rt;
  Authorities* authorities = nullptr;  // routes' election authorities (constant after start)
  std::atomic<std::size_t> connections{0};
  std::atomic<std::size_t> active_requests{0};
};

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
};

class Session;

struct Problem {
  Problem(unsigned s, std::string ty, std::string ti, std::string d, std::string res = {},
          std::optional<std::int64_t> pres = std::nullopt, std::optional<std::int64_t> cur = std::nullopt)
      : status(s),
        type(std::move(ty)),
        title(std::move(ti)),
        detail(std::move(d)),
        resource(std::move(res)),
        presented(pres),
        current(cur) {}
  unsigned status = 400;
  std::string type;  // short slug, e.g. "stale-generation"
  std::string title;
  std::string detail;
  // Fence context (emitted when resource is set).
  std::string resource;
  std::optional<std::int64_t> presented;
  std::optional<std::int64_t> current;
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
  store::AuditRow row;
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
void log_send_path(bool ring) {
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  if (ring) log::info("sends of each reactor pass go out in one io_uring submission");
  else log::info("io_uring is not available here: each send is its own system call (slower, same results)");
}

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
    }
  }
  // The idle pool of an upstream.
  Pool& pool(const std::string& upstream) {
    return *last_pool.get(upstream, [this](const std::string& u) { return &idle[u]; });
  }
  // The fence state of a resource (the Fence keeps it for its life; nullptr: over the cap).
  FenceResource* fence_resource(Fence& f, const std::string& resource) {
    return last_fence.get(resource, [&f](const std::string& r) { return f.find(r); });
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

  // Results made on other threads for sessions of this worker (Slot::fulfil). Posted to ioc, each
  // would queue behind every handler already ready (under load, a whole pass through the busy
  // connections) and then behind a second pass for the session's own wake-up. Instead they are
  // run at the next request start on this worker (begin_request), or by one posted handler if
  // that comes first (an idle worker), and each resumes its session directly.
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
    if (first) net::post(ioc, [this] { run_delivered(); });
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
  // call costs ~1.2 us before any work on the VMs measured: bench/RESULTS.md). Each session
  // stays suspended until its bytes went and then learns what went exactly as from send_now();
  // nothing is copied. Without io_uring (a container's seccomp profile, an old kernel, it
  // disabled) sessions send inline with send_now(): batching alone measured no faster.
  struct QueuedSend {
    Socket* sock = nullptr;
    std::array<iovec, kMaxGather + 4> iov;
    msghdr msg{};
    long result = 0;  // bytes sent, -errno, or SendRing::kUnknown
    Suspended::iterator waiter;
  };
  std::vector<QueuedSend*> sends;    // queued in this pass
  std::vector<QueuedSend*> sending;  // being sent by flush_sends
  std::vector<SendRing::Op> send_ops;  // the sends of `sending` on open sockets ...
  std::vector<QueuedSend*> send_of;    // ... and the QueuedSend of each
  std::unique_ptr<SendRing> ring;    // null: io_uring is not available, sendmsg one by one
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
  // Sessions suspended in Slot::wait(), by their resumptions. Owned here, so that a worker torn
  // down with sessions still waiting destroys them (their coroutine frames hold the Slot) first,
  // while everything they use is still there: keep this the last member.
  Suspended suspended;
  Suspended::iterator suspend(net::any_completion_handler<void()> h) {
    return suspended.insert(suspended.end(), std::move(h));
  }
  void resume(Suspended::iterator it) {
    auto h = std::move(*it);
    suspended.erase(it);
    std::move(h)();
  }
};

// A value made on another thread (the store's durable commit, a fence decision) for a session of
// this worker, which waits for it in wait(). The value is handed over by Worker::deliver() and
// the session resumes directly from the delivery, not through the io_context's queue.
template <class T>
struct Slot {
  explicit Slot(Worker& w) : worker(w) {}
  Worker& worker;
  // On the worker's thread only.
  std::optional<T> value;
  std::optional<Worker::Suspended::iterator> waiter;  // the session's resumption while it waits

  // Called from any thread, once.
  static void fulfil(const std::shared_ptr<Slot>& s, T v) {
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
  Socket* client = nullptr;         // the session's client socket, woken by node.abort
  InflightNode node;
  std::unique_ptr<UpConn> up;
  bool aborted = false;  // by a newer generation's drain timeout
};

// ---------------------------------------------------------------------------------------------
// Local replies.

const char* reason_of(unsigned status) {
  switch (status) {
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 417: return "Expectation Failed";
    case 428: return "Precondition Required";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Error";
  }
}

// An enforce-mode rejection is only answered once its audit row is durable; when the store
// could not make it so, the request fails closed with this 503.
Problem audit_not_durable(const store::Status& st, const std::string& resource, std::optional<std::int64_t> presented,
                          std::int64_t current) {
  return Problem{503, "store-unavailable", "Fence store unavailable",
                 "the audit row could not be made durable: " + st.message(), resource, presented, current};
}

std::string problem_body(const Problem& p) {
  std::string b = "{\"type\":" + log::json_quote("urn:fencegate:problem:" + p.type) +
                  ",\"title\":" + log::json_quote(p.title) + ",\"status\":" + std::to_string(p.status) +
                  ",\"detail\":" + log::json_quote(p.detail);
  if (!p.resource.empty()) {
    b += ",\"resource\":" + log::json_quote(p.resource);
    b += ",\"presented_generation\":" + (p.presented ? std::to_string(*p.presented) : std::string("null"));
    b += ",\"current_generation\":" + (p.current ? std::to_string(*p.current) : std::string("null"));
  }
  b += "}\n";
  return b;
}

// Fence headers added to every response of a fenced request.
struct FenceMarks {
  std::optional<std::int64_t> generation;  // Fencing-Generation
  std::string observe;                     // Fencing-Observe
  // For the problem body of a reply that is not a fence decision (502, 504, 408, ...): the
  // fence's fields, so a fenced request's every problem names resource and generations.
  std::string_view resource;               // the route's resource (lives as long as the request)
  std::optional<std::int64_t> presented;   // the request's token, if it had a valid one
};

// Named, not `{}`: GCC 12 mishandles a braced temporary bound to a reference inside co_await
// (it freed a FenceMarks' string from the wrong address).
const FenceMarks kNoMarks{};

// `head_only`: the answer to a HEAD request, which has the headers of the full answer and no body
// (RFC 9110 9.3.2); body bytes after it would be read as the start of the next response.
// The current time as an HTTP date (RFC 9110 5.6.7, IMF-fixdate), formatted once a second per
// thread.
std::string_view http_date() {
  static constexpr const char* kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  thread_local std::time_t last = -1;
  thread_local char buf[32];
  const std::time_t now = std::time(nullptr);
  if (now != last) {
    std::tm t{};
    gmtime_r(&now, &t);
    std::snprintf(buf, sizeof buf, "%s, %02d %s %04d %02d:%02d:%02d GMT", kDays[t.tm_wday], t.tm_mday,
                  kMonths[t.tm_mon], t.tm_year + 1900, t.tm_hour, t.tm_min, t.tm_sec);
    last = now;
  }
  return buf;
}

// fencegate's own answer (it is the origin of these: they carry a Date, RFC 9110 6.6.1).
std::string local_reply(const Problem& p, bool keep_alive, int version, const FenceMarks& marks,
                        bool head_only = false) {
  std::string body = problem_body(p);
  std::string r = version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ";
  r += std::to_string(p.status);
  r += ' ';
  r += reason_of(p.status);
  r += "\r\nDate: ";
  r += http_date();
  r += "\r\nContent-Type: application/problem+json\r\nContent-Length: ";
  r += std::to_string(body.size());
  r += "\r\nCache-Control: no-store\r\n";
  if (marks.generation) r += "Fencing-Generation: " + std::to_string(*marks.generation) + "\r\n";
  if (!marks.observe.empty()) r += "Fencing-Observe: " + marks.observe + "\r\n";
  if (!keep_alive) r += "Connection: close\r\n";
  else if (version == 10) r += "Connection: keep-alive\r\n";
  r += "\r\n";
  if (!head_only) r += body;
  return r;
}

// Hop-by-hop fields of RFC 9110 7.6.1 (Connection, Keep-Alive, Proxy-Connection, TE, Trailer,
// Upgrade, Proxy-Authenticate, Proxy-Authorization): never relayed.
bool is_hop_by_hop(FieldKind k) {
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

void append_field(std::string& out, std::string_view name, std::string_view value) {
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
  explicit Decimal(std::uint64_t v) { len = static_cast<std::size_t>(std::to_chars(buf, buf + sizeof buf, v).ptr - buf); }
  operator std::string_view() const { return {buf, len}; }
  char buf[24];
  std::size_t len;
};

// "host:port" of an upstream URL as configured ("http://host:port", perhaps with a path).
std::string_view upstream_authority(std::string_view url) {
  if (url.substr(0, 7) == "http://") url.remove_prefix(7);
  return url.substr(0, url.find('/'));
}

// Sends as much of `bufs` as the kernel takes right now, straight from this thread (the socket
// is non-blocking). Returns true iff all of it went: the common case, which then costs one
// sendmsg and no reactor operation, completion post or coroutine suspension. Otherwise `bufs`
// is advanced past what went and the caller writes the rest through Asio; *ec is set on a hard
// error (a full socket buffer is not one).
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

long send_msg(int fd, const msghdr* msg) {
  ssize_t r;
  do r = ::sendmsg(fd, msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (r < 0 && errno == EINTR);
  return r < 0 ? -errno : static_cast<long>(r);
}

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

// A gather write of a relayed body: [the message head], a slot for a chunk-size line, then the
// body's data runs. Returns the slot's index.
std::size_t start_gather(std::vector<net::const_buffer>& gather, const std::string* head) {
  gather.clear();
  if (head) gather.push_back(net::buffer(*head));
  gather.emplace_back();
  return gather.size() - 1;
}

// Decodes chunks from `avail` and adds their data runs to the write (at most kMaxGather
// buffers). Returns the bytes of `avail` consumed; adds the data bytes to *total.
std::size_t decode_into(ChunkDecoder& dec, std::string_view avail, std::vector<net::const_buffer>& gather,
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
void frame_chunk(std::vector<net::const_buffer>& gather, std::size_t size_slot, std::string& frame,
                 std::size_t total, bool last) {
  frame.clear();
  if (total) {
    append_chunk_header(frame, total);
    gather[size_slot] = net::buffer(frame);
    gather.push_back(net::buffer(kChunkEnd));
  }
  if (last) gather.push_back(net::buffer(kLastChunk));
}

void set_nodelay(Socket& s) {
  boost::system::error_code ec;
  s.set_option(tcp::no_delay(true), ec);
}

// True iff an idle pooled connection still looks usable (peer has not closed it).
bool still_open(Socket& s) {
  char c;
  ssize_t n = ::recv(s.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return false;                                      // orderly close
  if (n > 0) return false;                                       // unsolicited bytes: unusable
  if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
  // Nothing queued, not even an EOF: the answer's first read waits for it without trying first.
  readiness::mark_empty(s);
  return true;
}

// ---------------------------------------------------------------------------------------------
// Session.

// Sessions are carved from blocks of their own: a connection that stays open for hours then sits
// next to other sessions, not in a hole left by the coroutine frames and buffers its requests
// freed, where it would keep a whole heap page resident (10,000 parked connections would pin
// 10,000 pages). Free slots are kept per thread; blocks live as long as the process.
class SessionSlots {
 public:
  static void* take(std::size_t size) {
    Free*& head = free_head();
    if (!head) carve(size, head);
    Free* f = head;
    head = f->next;
    return f;
  }
  static void give(void* p) {
    Free*& head = free_head();
    auto* f = static_cast<Free*>(p);
    f->next = head;
    head = f;
  }

 private:
  struct Free {
    Free* next;
  };
  static constexpr std::size_t kPerBlock = 256;
  static Free*& free_head() {
    thread_local Free* head = nullptr;
    return head;
  }
  static void carve(std::size_t size, Free*& head) {
    const std::size_t stride = (std::max(size, sizeof(Free)) + 15) & ~std::size_t{15};
    char* block = static_cast<char*>(::operator new(stride * kPerBlock, std::align_val_t{16}));
    {
      static std::mutex mu;
      static std::vector<char*>* blocks = new std::vector<char*>();  // reachable for good
      std::lock_guard<std::mutex> lock(mu);
      blocks->push_back(block);
    }
    for (std::size_t i = kPerBlock; i-- > 0;) {
      auto* f = reinterpret_cast<Free*>(block + i * stride);
      f->next = head;
      head = f;
    }
  }
};

class Session {
  friend struct Worker;

 public:
  static void* operator new(std::size_t size) { return SessionSlots::take(size); }
  static void operator delete(void* p) { SessionSlots::give(p); }

  Session(ServerState& st, Worker& w, Socket sock)
      : st_(st), rt_(st.rt), w_(w), client_(std::move(sock)), snap_version_(rt_.snapshot_version()),
        snap_(rt_.snapshot()) {
    boost::system::error_code ec;
    auto ep = client_.remote_endpoint(ec);
    if (!ec) {
      client_ip_ = ep.address().to_string();
      client_port_ = ep.port();
      client_v6_ = ep.address().is_v6();
    }
    set_nodelay(client_);
    next_ = w_.sessions;
    if (next_) next_->prev_ = this;
    w_.sessions = this;
  }
  ~Session() {
    if (parked_fd_ >= 0) {
      ::epoll_ctl(w_.parked.native_handle(), EPOLL_CTL_DEL, parked_fd_, nullptr);
      ::close(parked_fd_);
    }
    if (prev_) prev_->next_ = next_;
    else w_.sessions = next_;
    if (next_) next_->prev_ = prev_;
    st_.connections.fetch_sub(1, std::memory_order_relaxed);
    rt_.metrics.open_connections.fetch_sub(1, std::memory_order_relaxed);
  }

  // Runs the connection's loop. When the connection goes idle it parks: the coroutine ends, the
  // descriptor moves from the Asio socket to the worker's epoll set of parked connections, and
  // only the session (a couple of hundred bytes) remains, until the client sends again (start()
  // once more) or the idle timeout closes it. A running session is owned by its coroutine's
  // completion handler; a parked one by the worker's list (its watchdog or its destructor
  // closes it).
  static void start(std::unique_ptr<Session> s, bool woken) {
    Session* raw = s.get();
    if (!raw->sc_) raw->sc_ = raw->w_.lease();
    net::co_spawn(raw->w_.ioc, raw->run(woken), [s = std::move(s)](std::exception_ptr e, bool park) mutable {
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& x) {
          log::error("session ended with an error", {log::kv("error", x.what())});
        }
        return;
      }
      if (park) Session::park(std::move(s));
      else s->w_.give_back(std::move(s->sc_));  // and the session closes
    });
  }
  // The descriptor leaves the reactor for the worker's epoll set of parked connections, and
  // only the session (in its block) remains.
  static void park(std::unique_ptr<Session> s) {
    if (s->rt_.stopping.load(std::memory_order_relaxed)) return;  // closes
    boost::system::error_code ec;
    const int fd = s->client_.release(ec);
    if (ec || fd < 0) return;
    // Level-triggered: bytes that arrived before this call wake the session at once.
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
    ev.data.ptr = s.get();
    if (::epoll_ctl(s->w_.parked.native_handle(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      ::close(fd);
      return;
    }
    s->parked_fd_ = fd;
    ++s->w_.activity;
    s.release();  // owned by the worker's list while parked
  }
  // The parked connection is readable (or closed by the client): run it again.
  void unpark() {
    std::unique_ptr<Session> self(this);
    const int fd = parked_fd_;
    parked_fd_ = -1;
    ::epoll_ctl(w_.parked.native_handle(), EPOLL_CTL_DEL, fd, nullptr);
    boost::system::error_code ec;
    client_.assign(client_v6_ ? tcp::v6() : tcp::v4(), fd, ec);
    if (ec) {
      ::close(fd);
      return;
    }
    if (timed_out_ || rt_.stopping.load(std::memory_order_relaxed)) return;  // closes
    disarm();
    Session::start(std::move(self), true);
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // The connection's loop; returns true to park (idle, nothing buffered) and false to close.
  task<bool> run(bool woken);

  // Watchdog (on the worker's thread): past the deadline, cancel what the session waits for.
  static void check_deadlines(Worker& w, Clock::time_point now) {
    for (Session *s = w.sessions, *next = nullptr; s; s = next) {
      next = s->next_;
      if (s->parked_fd_ >= 0) {
        if (s->deadline_ <= now) delete s;  // idle (or head) timeout while parked: close
        continue;
      }
      if (s->trusting_) {
        // Idle since before this tick on a read that skipped its recv(): try that recv() now.
        // It finds an EOF that came with the last request (their epoll edges merged), which the
        // mark cannot see, so such a client is closed within a tick, not after kHotIdle.
        s->trusting_ = false;
        s->probing_ = true;
        boost::system::error_code ec;
        s->client_.cancel(ec);
      }
      if (s->cold_at_ <= now) {
        s->cold_at_ = Clock::time_point::max();
        s->going_cold_ = true;
        boost::system::error_code ec;
        s->client_.cancel(ec);
      }
      if (s->deadline_ > now) continue;
      s->deadline_ = Clock::time_point::max();
      s->timed_out_ = true;
      boost::system::error_code ec;
      s->client_.cancel(ec);
      if (s->waiting_up_) s->waiting_up_->sock.cancel(ec);
    }
  }

 private:
  int scan_head(std::size_t* checked, std::size_t* head_len);
  void shed();
  void begin_request();
  void request_failed(const std::exception& e);
  task<bool> handle(std::size_t head_len);
  bool body_abandoned(const Framing& fr, std::size_t head_len);
  task<bool> reply(const Problem& p, bool keep_alive, int version, const FenceMarks& marks);
  task<store::Status> audit_sync(store::AuditRow& row);  // moves from row
  task<bool> discard(std::uint64_t n);
  task<void> linger_close();
  task<bool> forward(const RequestHead& head, const Framing& fr, std::size_t head_len, const config::Route& route,
                     const std::string& resource, bool client_keep_alive, bool expect_continue,
                     std::shared_ptr<Exchange> ex, const FenceMarks& marks);
  std::unique_ptr<UpConn> pooled_upstream(const config::Route& route);
  task<std::size_t> read_promptly(UpConn& up, boost::system::error_code& ec);
  void arm_abort(Exchange& x);
  // Takes the newest config snapshot if a reload installed one (one atomic load otherwise).
  void refresh_snapshot() {
    if (std::uint64_t v = rt_.snapshot_version(); v != snap_version_) {
      snap_version_ = v;
      snap_ = rt_.snapshot();
    }
  }
  // send_now() at the end of this reactor pass, with the pass's other sends (Worker::flush_sends).
  template <class Buffers>
  task<bool> send_soon(Socket& s, Buffers& bufs, boost::system::error_code& ec);
  template <class Buffers>
  task<bool> send_request(UpConn& up, Buffers& bufs, boost::system::error_code& ec);
  bool answered_early(UpConn& up);
  task<std::unique_ptr<UpConn>> connect_upstream(const config::Route& route, std::shared_ptr<Exchange>& ex,
                                              boost::system::error_code& ec);
  void give_back(const config::Route& route, std::unique_ptr<UpConn> c);

  // Deadline of what the session is about to wait for (none: Clock::time_point::max()).
  void arm(std::chrono::milliseconds t) { deadline_ = Clock::now() + t; }
  void disarm() { deadline_ = Clock::time_point::max(); }
  // After an awaited operation: disarms, and reports a watchdog cancellation as timed_out.
  boost::system::error_code settle(boost::system::error_code ec) {
    disarm();
    return timed_out_ ? boost::system::error_code(net::error::timed_out) : ec;
  }
  // Reads some bytes from the client into sc_->in under `timeout`. Returns the error (the watchdog's
  // cancellation shows up as timed_out_).
  task<boost::system::error_code> read_client(std::size_t want, std::chrono::milliseconds timeout);

  const config::Config& cfg() const { return *snap_->cfg; }
  void count(const std::string& resource, Outcome o) {
    w_.counters(rt_.metrics, resource)->by_outcome[static_cast<int>(o)].fetch_add(1, std::memory_order_relaxed);
  }

  ServerState& st_;
  Runtime& rt_;
  Worker& w_;
  Socket client_;
  std::unique_ptr<Scratch> sc_;           // while the connection is not parked
  std::uint64_t snap_version_ = 0;        // read before snap_: a newer install is never missed
  std::shared_ptr<const Snapshot> snap_;  // the config this request runs under
  std::string client_ip_;
  std::uint16_t client_port_ = 0;
  bool client_v6_ = false;
  Clock::time_point deadline_ = Clock::time_point::max();
  bool timed_out_ = false;
  Clock::time_point cold_at_ = Clock::time_point::max();  // a hot idle read gives up its buffer
  bool going_cold_ = false;
  bool trusting_ = false;  // an idle read waits on a short read's mark (readiness.h), not a recv()
  bool probing_ = false;   // ... and the watchdog cancelled it to try the read after all
  UpConn* waiting_up_ = nullptr;          // the upstream connection in use, for the watchdog
  bool prompt_ = false;                   // this request waited on another thread: read its answer promptly
  int parked_fd_ = -1;                    // the client's descriptor while parked (client_ is empty)
  Session* prev_ = nullptr;
  Session* next_ = nullptr;
};

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
// 0 when more bytes are needed, -1 when the head is refused (sc_->out then holds the reply).
int Session::scan_head(std::size_t* checked, std::size_t* head_len) {
  refresh_snapshot();  // a reload that landed while this connection waited for the head
  const auto& cfg = this->cfg();
  std::string_view data = sc_->in.view();
  // Empty lines before a request line are ignored (RFC 9112 2.2): some clients send a CRLF after
  // a body. They are dropped here, so nothing of them reaches the upstream.
  std::size_t blank = 0;
  while (data.size() - blank >= 2 && data[blank] == '\r' && data[blank + 1] == '\n') blank += 2;
  if (blank) {
    sc_->in.consume(blank);
    data = sc_->in.view();
    *checked = 0;
  }
  if (data.empty()) return 0;
  // Cheap incremental check first; the full scan runs once the head looks complete.
  const std::size_t from = *checked;
  *checked = data.size();
  bool maybe_done = data.find("\r\n\r\n", from > 3 ? from - 3 : 0) != std::string_view::npos;
  if (!maybe_done && !head_prefix_hopeless(data, from) && data.size() < cfg.max_header_bytes) return 0;
  HeadScan s = scan_request_head(data, cfg.max_header_bytes, &sc_->head);
  switch (s.status) {
    case HeadStatus::complete:
      *head_len = s.length;
      return 1;
    case HeadStatus::bad:
      sc_->out = local_reply(Problem{400, "bad-request", "Bad request", s.reason}, false, 11, kNoMarks);
      return -1;
    case HeadStatus::too_large:
      // A request line that alone does not fit is a target too long (RFC 9112 3: 414).
      if (data.substr(0, std::min<std::size_t>(data.size(), cfg.max_header_bytes)).find('\n') == std::string_view::npos)
        sc_->out = local_reply(Problem{414, "uri-too-long", "URI too long",
                                       "the request line exceeds " + std::to_string(cfg.max_header_bytes) + " bytes"},
                               false, 11, kNoMarks);
      else
        sc_->out = local_reply(Problem{431, "header-too-large", "Request header fields too large",
                                       "the request head exceeds " + std::to_string(cfg.max_header_bytes) + " bytes"},
                               false, 11, kNoMarks);
      return -1;
    default:
      return 0;
  }
}

// Gives back the memory an idle connection does not need while it waits (it is parking).
void Session::shed() { w_.give_back(std::move(sc_)); }

// The connection's loop. Everything that is not a wait lives in plain member functions: the
// frame of this coroutine stays allocated for as long as the connection is open, so it holds
// only a few scalars (10,000 idle keep-alive connections are 10,000 of these frames).
task<bool> Session::run(bool woken) {
  bool first = !woken;
  std::uint8_t answered = 0;  // requests this run has answered, up to 2
  // Hot: read straight away, with the read buffer in place (a new connection, one the client
  // just woke, one that just served a request). Cold: park until the client sends.
  bool hot = true;
  boost::system::error_code ec;
  for (;;) {
    // A reload applies from the next request on, its head included (limits, timeouts).
    refresh_snapshot();
    // Read until sc_->in holds a complete request head; it is scanned once, into sc_->head.
    std::size_t checked = 0, head_len = 0;
    bool started = !sc_->in.empty() || woken;
    woken = false;
    timed_out_ = false;
    Clock::time_point deadline = Clock::now() + (started || first ? cfg().header_timeout : cfg().idle_timeout);
    int state = 0;
    bool probe = false;  // the watchdog ended a read that trusted the mark: this one tries first
    while ((state = scan_head(&checked, &head_len)) == 0) {
      deadline_ = deadline;
      // Waiting hot holds the read buffer, a frame and Asio's per-socket state; past
      // kMaxHotIdle such waits on this worker, an idle connection parks at once instead.
      if (hot && sc_->in.empty() && w_.hot_idle >= kMaxHotIdle) hot = false;
      if (sc_->in.empty() && !hot) {
        // Idle with nothing buffered: park, holding no buffers, until bytes arrive. The
        // deadline (idle or head timeout) stays armed for the watchdog.
        shed();
        co_return true;
      }
      std::size_t room = std::min<std::size_t>(cfg().max_header_bytes + 4 - sc_->in.size(), sc_->in.size() ? 16384 : 4096);
      // A hot connection reads straight away (no readiness wait to register); if nothing comes
      // for kHotIdle the watchdog cancels the read and the connection waits cold, bufferless.
      const bool idle_wait = hot && sc_->in.empty();
      if (hot) cold_at_ = Clock::now() + kHotIdle;
      w_.hot_idle += idle_wait;
      // Waiting for the next request, a read right after a short one waits without a recv()
      // that fails (readiness.h). Reads of the rest of a head try first, so that an EOF is seen
      // at once, and so does the wait after a connection's first answer: a client that sent its
      // one request and its EOF together (their epoll edges merged) is closed at once. From the
      // second answer on, a connection is taken to be kept alive; if it then stays idle past a
      // watchdog tick, the watchdog has the read try after all (probe).
      const bool trust = sc_->in.empty() && answered >= 2 && !probe;
      if (!trust) readiness::unknown(client_);
      trusting_ = trust;
      probe = false;
      const std::size_t asked = std::max<std::size_t>(room, 1);
      std::size_t n = co_await client_.async_read_some(sc_->in.prepare(asked), net::redirect_error(use_task, ec));
      trusting_ = false;
      const bool probed = probing_;
      probing_ = false;
      if (!ec) readiness::drained(client_, n, asked);
      w_.hot_idle -= idle_wait;
      sc_->in.commit(n);
      cold_at_ = Clock::time_point::max();
      const bool went_cold = going_cold_;
      going_cold_ = false;
      hot = false;
      if (went_cold && n == 0 && !timed_out_ && ec == net::error::operation_aborted) continue;
      if (probed && n == 0 && !timed_out_ && ec == net::error::operation_aborted) {
        hot = true;  // the same hot wait goes on, its read trying first
        probe = true;
        continue;
      }
      if (timed_out_) {
        if (!sc_->in.empty()) {
          sc_->out = local_reply(Problem{408, "request-timeout", "Request timeout", "the request head did not arrive in time"},
                             false, 11, kNoMarks);
          state = -1;
        }
        break;
      }
      if (ec) break;
      if (!started) {
        started = true;
        deadline = Clock::now() + cfg().header_timeout;
      }
    }
    disarm();
    if (state < 0) {  // the refusal is in sc_->out; the connection closes after it
      timed_out_ = false;
      arm(cfg().body_timeout);
      co_await net::async_write(client_, net::buffer(sc_->out), net::redirect_error(use_task, ec));
      disarm();
    }
    if (state <= 0) break;
    begin_request();
    bool again = false;
    try {
      again = co_await handle(head_len);
    } catch (const std::exception& e) {
      request_failed(e);
    }
    st_.active_requests.fetch_sub(1, std::memory_order_relaxed);
    if (!again || rt_.stopping.load(std::memory_order_relaxed)) break;
    first = false;
    hot = true;
    if (answered < 2) ++answered;
  }
  disarm();
  client_.shutdown(tcp::socket::shutdown_send, ec);
  client_.close(ec);
  co_return false;
}

void Session::begin_request() {
  refresh_snapshot();  // a reload that landed while the head was read
  prompt_ = false;
  st_.active_requests.fetch_add(1, std::memory_order_relaxed);
  ++w_.requests;
  ++w_.activity;
  w_.run_delivered();  // results for waiting sessions go first
  w_.poll_prompt();
  if (w_.waits_elsewhere) w_.offer_cpu();
}

void Session::request_failed(const std::exception& e) {
  log::error("request failed", {log::kv("error", e.what()), log::kv("client", client_ip_), log::kv("client_port", client_port_)});
}

task<boost::system::error_code> Session::read_client(std::size_t want, std::chrono::milliseconds timeout) {
  arm(timeout);
  boost::system::error_code ec;
  readiness::unknown(client_);  // body reads try first: a client that left is seen at once
  std::size_t n = co_await client_.async_read_some(sc_->in.prepare(want), net::redirect_error(use_task, ec));
  if (!ec) readiness::drained(client_, n, want);
  disarm();
  sc_->in.commit(n);
  if (timed_out_) ec = net::error::timed_out;
  co_return ec;
}

task<bool> Session::reply(const Problem& p, bool keep_alive, int version, const FenceMarks& marks) {
  std::string r;
  if (marks.generation && p.resource.empty() && !marks.resource.empty()) {
    Problem q = p;
    q.resource = std::string(marks.resource);
    q.presented = marks.presented;
    q.current = marks.generation;
    r = local_reply(q, keep_alive, version, marks, sc_->head_method);
  } else {
    r = local_reply(p, keep_alive, version, marks, sc_->head_method);
  }
  timed_out_ = false;
  arm(cfg().body_timeout);
  boost::system::error_code ec;
  co_await net::async_write(client_, net::buffer(r), net::redirect_error(use_task, ec));
  co_return !settle(ec) && keep_alive;
}

// Before a close with request bytes still unread: stop sending and read (and drop) what the
// client still sends, for a while. Closing a socket with unread data resets the connection, and a
// client still writing its body would see the reset rather than our answer (RFC 9112 9.6).
task<void> Session::linger_close() {
  constexpr auto kLingerTime = std::chrono::seconds(2);
  constexpr std::uint64_t kLingerBytes = 16u << 20;
  boost::system::error_code ec;
  client_.shutdown(tcp::socket::shutdown_send, ec);
  if (ec) co_return;
  const auto until = Clock::now() + kLingerTime;
  std::uint64_t dropped = 0;
  timed_out_ = false;
  while (dropped < kLingerBytes) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    if (left <= std::chrono::milliseconds(0)) break;
    sc_->in.consume(sc_->in.size());
    if (co_await read_client(kRelayBuffer, left)) break;  // EOF (the client read our answer), error, time
    dropped += sc_->in.size();
  }
  sc_->in.consume(sc_->in.size());
}

// Reads and drops the next n body bytes. Returns false if they did not arrive.
task<bool> Session::discard(std::uint64_t n) {
  while (sc_->in.size() < n) {
    auto ec = co_await read_client(static_cast<std::size_t>(n - sc_->in.size()), cfg().body_timeout);
    if (ec) co_return false;
  }
  sc_->in.consume(static_cast<std::size_t>(n));
  co_return true;
}

task<store::Status> Session::audit_sync(store::AuditRow& row) {
  auto slot = std::make_shared<Slot<store::Status>>(w_);
  rt_.store.append_audit(std::move(row), [slot](store::Status st) { Slot<store::Status>::fulfil(slot, std::move(st)); });
  co_return co_await slot->wait();
}

enum class TokenState { ok, missing, malformed };

// True iff the client can never complete this request: it reset the connection, or it closed
// its side (FIN received: TCP_CLOSE_WAIT) with less of the body sent than the request needs
// (what sc_->in holds plus what the kernel has queued). A chunked body is decoded from what is
// held and queued, when that fits kAbandonPeek. Never blocks, never consumes.
bool Session::body_abandoned(const Framing& fr, std::size_t head_len) {
  constexpr std::size_t kAbandonPeek = 256 * 1024;
  const int fd = client_.native_handle();
  struct tcp_info ti {};
  socklen_t len = sizeof ti;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return false;
  if (ti.tcpi_state == TCP_CLOSE) return true;  // reset: no one to complete it or read an answer
  if (ti.tcpi_state != TCP_CLOSE_WAIT) return false;  // still connected: it may send the rest
  int queued = 0;
  if (::ioctl(fd, FIONREAD, &queued) != 0 || queued < 0) return false;
  readiness::unknown(client_);
  const std::string_view held = sc_->in.view().substr(head_len);
  if (!fr.chunked)
    return fr.content_length && held.size() + static_cast<std::uint64_t>(queued) < *fr.content_length;
  if (static_cast<std::size_t>(queued) > kAbandonPeek) return false;  // cannot tell cheaply: relayed as usual
  std::string peeked(static_cast<std::size_t>(queued), '\0');
  if (queued > 0) {
    const ssize_t n = ::recv(fd, peeked.data(), peeked.size(), MSG_PEEK | MSG_DONTWAIT);
    if (n < 0) return false;
    peeked.resize(static_cast<std::size_t>(n));
  }
  ChunkDecoder dec;
  for (std::string_view part : {held, std::string_view(peeked)}) {
    std::string_view data;
    while (!part.empty() && !dec.done() && !dec.failed()) {
      const std::size_t used = dec.feed(part, &data);
      if (used == 0) break;
      part.remove_prefix(used);
    }
  }
  return !dec.done();
}

task<bool> Session::handle(std::size_t head_len) {
  const auto& cfg = this->cfg();
  const RequestHead& head = sc_->head;  // scanned by run()
  const int version = head.version;
  sc_->head_method = head.method == "HEAD";
  Framing fr = check_framing(head);
  if (fr.ok && !(cfg.token_header == "Fencing-Token" && cfg.leader_header == "Fencing-Leader")) {
    // Configured names: their "_" spellings are refused as check_framing refuses the defaults'.
    for (const auto& f : head.fields)
      if (f.kind == FieldKind::other &&
          (underscore_alias(f.name, cfg.token_header) || underscore_alias(f.name, cfg.leader_header))) {
        fr.ok = false;
        fr.reason = "header " + std::string(f.name) + " reads as " +
                    (underscore_alias(f.name, cfg.token_header) ? cfg.token_header : cfg.leader_header) +
                    " to CGI-style servers (\"_\" for \"-\")";
        break;
      }
  }
  // Refusals made before the fence decision (ambiguous framing, 501, a Connection header naming
  // an end-to-end field, 417) still carry Fencing-Generation when the path routes to a fenced
  // resource, as every answer to a fenced request does.
  config::Router::Match early_match;
  FenceMarks early;
  auto early_marks = [&]() -> const FenceMarks& {
    early_match = snap_->router.match(head.target);
    if (early_match.outcome == config::Router::Outcome::matched && early_match.route->mode != Mode::off &&
        early_match.route->is_fenced(head.method)) {
      early.generation = rt_.fence.current(early_match.resource);
      early.resource = early_match.resource;
    }
    return early;
  };
  if (!fr.ok) {
    sc_->problem = Problem{400, "bad-framing", "Bad request", fr.reason};
    const FenceMarks& mk = early_marks();
    co_return co_await reply(sc_->problem, false, version, mk);
  }
  const bool has_body = fr.chunked || (fr.content_length && *fr.content_length > 0);

  // Client keep-alive intent (before we touch the header).
  bool client_keep_alive = true;
  {
    bool close = false, keep = false;
    if (head.has(FieldKind::connection))
      for (const auto& f : head.fields)
        if (f.kind == FieldKind::connection)
          for_each_token(f.value, [&](std::string_view t) {
            if (iequals(t, "close")) close = true;
            if (iequals(t, "keep-alive")) keep = true;
          });
    client_keep_alive = version == 11 ? !close : (keep && !close);
  }

  bool expect_continue = false;  // set below, once Expect is validated
  // A request refused before its body was read keeps the connection only if its body is small
  // and Content-Length framed: the body is then read and discarded. Otherwise the connection
  // closes after the reply.
  auto refuse = [&](const Problem& p, const FenceMarks& m = kNoMarks) -> task<bool> {
    const bool can_skip = client_keep_alive &&
        (!has_body || (!fr.chunked && !expect_continue && *fr.content_length <= kDiscardLimit));
    if (!co_await reply(p, can_skip, version, m)) {
      if (has_body) co_await linger_close();  // the body it may still be sending is not read
      co_return false;
    }
    sc_->in.consume(head_len);
    if (has_body) co_return co_await discard(*fr.content_length);
    co_return true;
  };

  if (head.method == "CONNECT" || head.has(FieldKind::upgrade)) {
    sc_->problem =
        Problem{501, "not-implemented", "Not implemented", "CONNECT and protocol upgrades are not supported"};
    const FenceMarks& mk = early_marks();
    co_return co_await reply(sc_->problem, false, version, mk);
  }
  // Connection may not name end-to-end fields we rely on: stripping them would change framing
  // or drop the token on its way upstream.
  if (head.has(FieldKind::connection)) {
    bool bad_conn = false;
    for (const auto& f : head.fields) {
      if (f.kind != FieldKind::connection) continue;
      for_each_token(f.value, [&](std::string_view t) {
        if (iequals(t, "Content-Length") || iequals(t, "Transfer-Encoding") || iequals(t, "Host") ||
            iequals(t, cfg.token_header) || iequals(t, cfg.leader_header))
          bad_conn = true;
      });
    }
    if (bad_conn) {
      sc_->problem =
          Problem{400, "bad-connection-header", "Bad request", "the Connection header names an end-to-end field"};
      const FenceMarks& mk = early_marks();
      co_return co_await reply(sc_->problem, false, version, mk);
    }
  }
  {
    std::string_view ev;
    std::size_t ne = 0;
    if (head.has(FieldKind::expect))
      for (const auto& f : head.fields)
        if (f.kind == FieldKind::expect && ne++ == 0) ev = f.value;
    if (ne > 1 || (ne == 1 && !iequals(ev, "100-continue"))) {
      sc_->problem =
          Problem{417, "expectation-failed", "Expectation failed", "only \"Expect: 100-continue\" is supported"};
      const FenceMarks& mk = early_marks();
      co_return co_await reply(sc_->problem, false, version, mk);
    }
    expect_continue = ne == 1 && version == 11;
  }
  // Route: the resource comes from the route and the path, never from a header.
  config::Router::Match m = snap_->router.match(head.target);
  if (m.outcome == config::Router::Outcome::bad_target) {
    sc_->problem = Problem{400, "bad-target", "Bad request", m.reason};
    co_return co_await reply(sc_->problem, false, version, kNoMarks);
  }
  if (m.outcome == config::Router::Outcome::no_route) {
    sc_->problem = Problem{404, "no-route", "Not found", "no route matches this path"};
    co_return co_await refuse(sc_->problem);
  }
  const config::Route& route = *m.route;

  // Fence decision.
  const bool fenced = route.mode != Mode::off && route.is_fenced(head.method);
  FenceMarks marks;
  if (fr.content_length && *fr.content_length > cfg.max_body_bytes) {
    if (fenced) {
      marks.generation = rt_.fence.current(m.resource);
      marks.resource = m.resource;
    }
    sc_->problem = Problem{413, "body-too-large", "Content too large",
                           "the body exceeds " + std::to_string(cfg.max_body_bytes) + " bytes"};
    co_await reply(sc_->problem, false, version, marks);
    co_await linger_close();
    co_return false;
  }
  auto ex = std::make_shared<Exchange>(rt_.fence);
  if (fenced) {
    std::string_view tv, lv;
    std::size_t nt = 0, nl = 0;
    if (cfg.token_header == "Fencing-Token" && cfg.leader_header == "Fencing-Leader") {
      // The default names: the scanner has marked these fields already.
      if (head.has(FieldKind::fencing_token) || head.has(FieldKind::fencing_leader))
        for (const auto& f : head.fields) {
          if (f.kind == FieldKind::fencing_token && nt++ == 0) tv = f.value;
          if (f.kind == FieldKind::fencing_leader && nl++ == 0) lv = f.value;
        }
    } else {
      nt = head.count(cfg.token_header, &tv);
      nl = head.count(cfg.leader_header, &lv);
    }
    TokenState ts = TokenState::ok;
    std::string why;
    std::int64_t g = 0;
    if (nt == 0) {
      ts = TokenState::missing;
    } else if (nt > 1) {
      ts = TokenState::malformed;
      why = "several " + cfg.token_header + " headers";
    } else if (auto t = parse_token(tv)) {
      g = *t;
    } else {
      ts = TokenState::malformed;
      why = cfg.token_header + " must be a decimal integer in 1..9223372036854775807 without sign, "
            "leading zeros or spaces";
    }
    if (ts == TokenState::ok && (nl > 1 || lv.size() > cfg.max_leader_bytes)) {
      ts = TokenState::malformed;
      why = nl > 1 ? "several " + cfg.leader_header + " headers"
                   : cfg.leader_header + " is longer than " + std::to_string(cfg.max_leader_bytes) + " bytes";
    }
    std::string leader = clipped(lv, cfg.max_leader_bytes);
    const bool enforce = route.mode == Mode::enforce;
    marks.resource = m.resource;
    if (ts == TokenState::ok) marks.presented = g;

    auto audit_row = [&](std::string decision, std::int64_t current) {
      store::AuditRow row;
      row.resource = m.resource;
      row.decision = std::move(decision);
      row.presented_generation = g;
      row.current_generation = current;
      row.method = std::string(head.method);
      row.target = clipped(head.target, 2048);
      row.client = client_ip_;
      row.leader = leader;
      row.mode = enforce ? "enforce" : "observe";
      row.user_agent = clipped(head.user_agent(), 512);
      return row;
    };

    // Every rejection (and would-be rejection) is counted and logged with its context.
    auto note = [&](Outcome o, std::int64_t current) {
      count(m.resource, o);
      const bool would = to_string(o).starts_with("would_");
      log::write(would ? log::Level::info : log::Level::warn, would ? "would reject write" : "rejected write",
                 {log::kv("decision", to_string(o)), log::kv("resource", m.resource),
                  log::kv("presented_generation", g), log::kv("current_generation", current),
                  log::kv("leader", leader), log::kv("client", client_ip_), log::kv("method", head.method),
                  log::kv("target", head.target.substr(0, 256))});
    };

    // Authority-linked fencing: etcd's view of the election decides before the fence does. Only
    // the current leader's generation goes on to the fence; in observe mode an unreachable etcd
    // just leaves the plain fence in charge.
    std::optional<AuthorityCheck> ac;
    if (ts == TokenState::ok)
      if (Authority* au = st_.authorities ? st_.authorities->for_route(route) : nullptr) ac = au->check(g);
    const bool authority_says_no = ac && ac->verdict != AuthorityVerdict::leader &&
                                   !(ac->verdict == AuthorityVerdict::unavailable && !enforce);

    if (ts != TokenState::ok) {
      std::int64_t cur = rt_.fence.current(m.resource);
      marks.generation = cur;
      const char* kind = ts == TokenState::missing ? "missing" : "malformed";
      if (enforce) {
        sc_->row = audit_row(std::string("rejected_") + kind, cur);
        store::Status st = co_await audit_sync(sc_->row);
        note(st.ok() ? (ts == TokenState::missing ? Outcome::rejected_missing : Outcome::rejected_malformed)
                     : Outcome::store_error,
             cur);
        if (!st.ok()) {
          sc_->problem = audit_not_durable(st, m.resource, std::nullopt, cur);
          co_return co_await refuse(sc_->problem, marks);
        }
        if (ts == TokenState::missing) {
          sc_->problem = Problem{428,
                                 "token-required",
                                 "Fencing token required",
                                 "writes to this resource need a " + cfg.token_header + " header",
                                 m.resource,
                                 std::nullopt,
                                 cur};
          co_return co_await refuse(sc_->problem, marks);
        }
        {
          sc_->problem = Problem{400, "malformed-token", "Malformed fencing token", why, m.resource, std::nullopt, cur};
          co_return co_await refuse(sc_->problem, marks);
        }
      }
      rt_.store.append_audit(audit_row(std::string("would_reject_") + kind, cur), nullptr);
      note(ts == TokenState::missing ? Outcome::would_reject_missing : Outcome::would_reject_malformed, cur);
      marks.observe = std::string("would_reject_") + kind;
    } else if (authority_says_no) {
      const std::int64_t cur = rt_.fence.current(m.resource);
      const std::int64_t newest = std::max(cur, ac->leader);
      const std::string& election = route.authority->election;
      if (ac->verdict == AuthorityVerdict::unavailable) {  // enforce: fail closed, not audited
        marks.generation = cur;
        count(m.resource, Outcome::authority_unavailable);
        log::warn("rejected write: election authority unavailable",
                  {log::kv("decision", "authority_unavailable"), log::kv("resource", m.resource),
                   log::kv("presented_generation", g), log::kv("election", election), log::kv("why", ac->why),
                   log::kv("leader", leader), log::kv("client", client_ip_)});
        {
          sc_->problem = Problem{503,
                                 "authority-unavailable",
                                 "Election authority unavailable",
                                 ac->why + "; nothing was forwarded",
                                 m.resource,
                                 g,
                                 cur};
          co_return co_await refuse(sc_->problem, marks);
        }
      }
      const std::string gs = std::to_string(g), ls = std::to_string(ac->leader);
      std::string suffix, type, title, detail;
      Outcome rejected = Outcome::rejected_stale, would = Outcome::would_reject_stale;
      switch (ac->verdict) {
        case AuthorityVerdict::stale:
          suffix = "stale", type = "stale-generation", title = "Stale fencing token";
          detail = "generation " + gs + " is older than generation " + ls + " of the current leader of election " +
                   election + " (resource " + m.resource + ")";
          break;
        case AuthorityVerdict::not_leader:
          suffix = "not_leader", type = "not-leader", title = "Not the leader";
          rejected = Outcome::rejected_not_leader, would = Outcome::would_reject_not_leader;
          detail = ac->leader ? "generation " + gs + " is not the leader of election " + election +
                                    " (a candidate still waiting, or a former leader); the leader's generation is " + ls
                              : "generation " + gs + " no longer leads election " + election +
                                    " (its key is gone: resigned or lease expired) and no successor is elected yet";
          break;
        default:
          suffix = "unknown_generation", type = "unknown-generation", title = "Unknown fencing token";
          rejected = Outcome::rejected_unknown_generation, would = Outcome::would_reject_unknown_generation;
          detail = "generation " + gs + " is not the creation revision of any key of election " + election +
                   " (forged, or from another election or etcd cluster)";
          break;
      }
      if (enforce) {
        marks.generation = newest;
        sc_->row = audit_row("rejected_" + suffix, newest);
        store::Status st = co_await audit_sync(sc_->row);
        note(st.ok() ? rejected : Outcome::store_error, newest);
        if (!st.ok()) {
          sc_->problem = audit_not_durable(st, m.resource, g, newest);
          co_return co_await refuse(sc_->problem, marks);
        }
        {
          sc_->problem = Problem{409, type, title, detail, m.resource, g, newest};
          co_return co_await refuse(sc_->problem, marks);
        }
      }
      // Observe: forwarded, but the fence is never advanced to a generation etcd says does not lead.
      marks.generation = cur;
      rt_.store.append_audit(audit_row("would_reject_" + suffix, newest), nullptr);
      note(would, newest);
      marks.observe = "would_reject_" + suffix;
    } else if (ac && ac->verdict == AuthorityVerdict::unavailable) {
      // Observe mode with etcd out of reach (enforce answered 503 above): forwarded, and the fence
      // is left alone. No election confirms this token, and advancing to it would keep a forged
      // 2^63-1 in the fence for good once the route is switched to enforce.
      marks.generation = rt_.fence.current(m.resource);
    } else {
      Decision d;
      if (enforce) arm_abort(*ex);
      // Most writes are decided at once (the fast path, or stale); only an advance waits.
      if (!rt_.fence.decide_now(w_.fence_resource(rt_.fence, m.resource), g, enforce ? &ex->node : nullptr, &d)) {
        auto slot = std::make_shared<Slot<Decision>>(w_);
        auto later = [slot](Decision dd) { Slot<Decision>::fulfil(slot, dd); };
        const bool now = enforce ? rt_.fence.admit(m.resource, g, leader, &ex->node, &d, later)
                                 : rt_.fence.observe(m.resource, g, leader, &d, later);
        if (!now) {
          d = co_await slot->wait();
          prompt_ = true;
          // It waited (a drain, a commit): a client that closed meanwhile before its body was
          // whole can never complete this request. It is not sent late, cut off, to an upstream.
          if (d.verdict == Verdict::admit && has_body && body_abandoned(fr, head_len)) {
            log::info("client closed before its body was whole while its write waited for the fence: not forwarded",
                      {log::kv("resource", m.resource), log::kv("generation", g)});
            co_return false;
          }
        }
      }
      marks.generation = d.current;
      switch (d.verdict) {
        case Verdict::admit:
          if (d.observe_stale) {
            rt_.store.append_audit(audit_row("would_reject_stale", d.newest), nullptr);
            note(Outcome::would_reject_stale, d.newest);
            marks.observe = "would_reject_stale";
          }
          break;
        case Verdict::stale: {
          // The rejection names the generation that superseded it, in the header as in the body
          // (it may still be committing; the write is refused either way).
          marks.generation = d.newest;
          sc_->row = audit_row("rejected_stale", d.newest);
          store::Status st = co_await audit_sync(sc_->row);
          note(st.ok() ? Outcome::rejected_stale : Outcome::store_error, d.newest);
          if (!st.ok()) {
            sc_->problem = audit_not_durable(st, m.resource, g, d.newest);
            co_return co_await refuse(sc_->problem, marks);
          }
          {
            sc_->problem = Problem{409,
                                   "stale-generation",
                                   "Stale fencing token",
                                   "generation " + std::to_string(g) + " is older than generation " +
                                       std::to_string(d.newest) + " of resource " + m.resource,
                                   m.resource,
                                   g,
                                   d.newest};
            co_return co_await refuse(sc_->problem, marks);
          }
        }
        case Verdict::store_error:
          if (enforce) {
            note(Outcome::store_error, d.current);
            sc_->problem = Problem{503,
                                   "store-unavailable",
                                   "Fence store unavailable",
                                   "the new generation could not be made durable; nothing was forwarded",
                                   m.resource,
                                   g,
                                   d.current};
            co_return co_await refuse(sc_->problem, marks);
          }
          // Observe mode forwards it all the same; the fence retries the generation until stored.
          count(m.resource, Outcome::store_error);
          log::warn("observe mode: could not store the generation; the write is forwarded and the "
                    "generation retried until it is stored",
                    {log::kv("resource", m.resource), log::kv("generation", g), log::kv("stored", d.current)});
          break;
        case Verdict::overloaded: {
          // Counted under the resource's label (Metrics caps the label set: a flood of new names
          // lands in "_other") and logged, the first time and then once per 1000.
          count(m.resource, Outcome::too_many_resources);
          static std::atomic<std::uint64_t> over_cap{0};
          const bool log_it = over_cap.fetch_add(1, std::memory_order_relaxed) % 1000 == 0;
          if (!enforce) {
            // Observe rejects nothing: the write goes on, but its generation is not tracked.
            if (log_it)
              log::warn("observe mode: the fence holds max_resources resources; forwarding without tracking "
                        "(logged once per 1000)",
                        {log::kv("resource", m.resource), log::kv("max_resources", cfg.max_resources)});
            break;
          }
          if (log_it)
            log::warn("rejected write: the fence holds max_resources resources (503; logged once per 1000)",
                      {log::kv("resource", m.resource), log::kv("max_resources", cfg.max_resources)});
          sc_->problem = Problem{503,
                                 "too-many-resources",
                                 "Too many resources",
                                 "the fence holds its maximum number of resources",
                                 m.resource,
                                 g,
                                 std::nullopt};
          co_return co_await refuse(sc_->problem, marks);
        }
      }
    }
  }


  // Observe mode: the write is in flight until its exchange ends, so that a switch to enforce
  // drains it before the first enforce write goes (Fence::track_observed).
  if (fenced && route.mode == Mode::observe) {
    arm_abort(*ex);
    rt_.fence.track_observed(w_.fence_resource(rt_.fence, m.resource), &ex->node);
  }
  co_return co_await forward(head, fr, head_len, route, m.resource, client_keep_alive, expect_continue, std::move(ex),
                             marks);
}

// Set before the exchange's node can be linked: a newer generation's drain timeout may call it as
// soon as it is. It captures a plain pointer (no allocation); the Exchange outlives any call,
// since its destructor unlinks the node under the lock the fence calls it under.
void Session::arm_abort(Exchange& x) {
  x.ioc = &w_.ioc;
  x.client = &client_;
  x.node.abort = [e = &x] {
    net::post(*e->ioc, [weak = e->weak_from_this()] {
      if (auto e = weak.lock()) {
        e->aborted = true;
        if (e->up) {
          boost::system::error_code ec;
          e->up->sock.shutdown(tcp::socket::shutdown_both, ec);
          e->up->sock.close(ec);
          // Nothing more of this exchange can reach the upstream now, so the newer generation
          // goes on at once rather than when this session next wakes (its client may stall a
          // body or not read the response for body_timeout). And the session is woken: a
          // client read or write it waits in ends, and its client gets the 504 of an aborted
          // exchange rather than a 408 later.
          e->release();
          if (e->client) e->client->cancel(ec);  // none once the exchange lingers (linger_after_failure)
        }
        // (Without an upstream connection the session holds none yet: it sees `aborted` before
        // it connects or sends, and releases then.)
      }
    });
  };
}

// A fenced write the upstream has, whole or in part, but whose exchange failed on our side (the
// upstream did not answer in time; the client's body stalled, broke off or was malformed; the
// upstream stopped reading it) may still be applied there: closing our socket cannot undo it, and
// an upstream that applies a body as it reads it is still working on what it has. Its client has
// its 504/408/400/413, but the write stays in flight for the fence (a newer generation's write or
// barrier waits for it, as for any older write) until the upstream answers or closes, or a newer
// generation's drain timeout aborts it (counted as a drain abort), or `cap` passes while no newer
// generation waits for it. An incomplete request is ended with a half-close first, so the upstream
// reads EOF where the body breaks off and can finish. Without this, the failure would let a newer
// generation through while the older write could still land after it. It counts as a request in
// flight, so a graceful stop waits for it (up to the stop deadline).
struct LingerCap {
  explicit LingerCap(const Executor& e, std::chrono::milliseconds c) : timer(e), cap(c) {}
  Timer timer;
  std::chrono::milliseconds cap;
  bool capped = false;
};
// Owns what it touches: an expiry already queued runs even after cancel() and the linger's frame.
void arm_linger_cap(std::shared_ptr<Exchange> ex, std::shared_ptr<LingerCap> c) {
  c->timer.expires_after(c->cap);
  c->timer.async_wait([ex, c](boost::system::error_code e) {
    if (e || !ex->up) return;
    // A newer generation waiting for this write: its own drain timeout decides (and aborts it).
    if (ex->fence.holds_advance(&ex->node)) return arm_linger_cap(ex, c);
    c->capped = true;
    boost::system::error_code ignored;
    ex->up->sock.close(ignored);
  });
}

task<void> linger_after_failure(std::shared_ptr<Exchange> ex, std::chrono::milliseconds cap,
                                std::atomic<std::size_t>& active, const char* why, bool incomplete) {
  UpConn& up = *ex->up;
  const auto started = Clock::now();
  if (incomplete) {
    boost::system::error_code ignored;
    up.sock.shutdown(tcp::socket::shutdown_send, ignored);
  }
  active.fetch_add(1, std::memory_order_relaxed);
  auto limit = std::make_shared<LingerCap>(up.sock.get_executor(), cap);
  arm_linger_cap(ex, limit);
  const char* how = "closed";
  for (;;) {
    if (!up.buf.empty()) {
      ResponseHead rh;
      HeadScan s = scan_response_head(up.buf.view(), kMaxResponseHeader, &rh);
      if (s.status == HeadStatus::complete && rh.status >= 100 && rh.status < 200 && rh.status != 101) {
        up.buf.consume(s.length);  // still working (102, 103): wait for its final answer
        continue;
      }
      if (s.status != HeadStatus::incomplete) {
        how = "answered";
        break;
      }
    }
    if (ex->aborted || limit->capped || !up.sock.is_open()) break;
    boost::system::error_code ec;
    std::size_t n = co_await up.sock.async_read_some(up.buf.prepare(kRelayBuffer), net::redirect_error(use_task, ec));
    up.buf.commit(n);
    if (ec) break;
  }
  limit->timer.cancel();
  if (ex->aborted) how = "aborted by a newer generation's drain";
  else if (limit->capped) how = "not answered within the drain timeout";
  log::warn("the write whose exchange failed is no longer in flight",
            {log::kv("failure", why), log::kv("how", how),
             log::kv("ms", std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started).count())});
  boost::system::error_code ignored;
  up.sock.close(ignored);
  ex->release();
  active.fetch_sub(1, std::memory_order_relaxed);
}

// The first read of an upstream answer for a request that already waited on another thread
// (Worker::PromptRead). Ends like async_read_some: bytes read, or *ec (the watchdog's
// cancellation shows up in timed_out_).
task<std::size_t> Session::read_promptly(UpConn& up, boost::system::error_code& ec) {
  ec.clear();
  auto p = std::make_shared<Worker::PromptRead>();
  p->sock = &up.sock;
  p->reactor_pending = true;
  Worker& w = w_;
  up.sock.async_wait(Socket::wait_read, [p, &w](boost::system::error_code) {
    p->reactor_pending = false;
    w.prompt_ready(p);
  });
  w.prompt.push_back(p);
  // Only plain pointers in a lambda inside co_await: with a shared_ptr captured there, GCC 12's
  // code released it once too often (ASan: the PromptRead was used after being freed).
  co_await net::async_initiate<const net::use_awaitable_t<Executor>&, void()>(
      [pr = p.get(), &w](auto handler) {
        pr->waiter = w.suspend(std::move(handler));
        pr->waiting = true;
      },
      use_task);
  if (p->reactor_pending) {  // resumed by the poll: the reactor's wait goes (its handler is a no-op)
    boost::system::error_code ignored;
    up.sock.cancel(ignored);
  }
  if (timed_out_) {
    ec = net::error::operation_aborted;
    co_return 0;
  }
  const auto b = up.buf.prepare(kRelayBuffer);
  ssize_t n;
  do n = ::recv(up.sock.native_handle(), b.data(), b.size(), MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n > 0) co_return static_cast<std::size_t>(n);
  if (n == 0) {
    ec = net::error::eof;
    co_return 0;
  }
  if (errno != EAGAIN && errno != EWOULDBLOCK) {
    ec.assign(errno, boost::system::system_category());
    co_return 0;
  }
  co_return co_await up.sock.async_read_some(b, net::redirect_error(use_task, ec));  // woken early
}

template <class Buffers>
task<bool> Session::send_soon(Socket& s, Buffers& bufs, boost::system::error_code& ec) {
  if (!cfg().io_uring || !w_.batching()) co_return send_now(s, bufs, ec);
  ec.clear();
  Worker::QueuedSend q;
  std::size_t total = 0;
  const std::size_t n = to_iov(bufs, q.iov, &total);
  if (n > q.iov.size()) co_return false;  // more pieces than one call takes: all through Asio
  if (total == 0) co_return true;
  q.sock = &s;
  q.msg.msg_iov = q.iov.data();
  q.msg.msg_iovlen = n;
  // Only plain pointers in the lambda (see read_promptly).
  Worker* w = &w_;
  Worker::QueuedSend* qp = &q;
  const bool timed_out_before = timed_out_;
  co_await net::async_initiate<const net::use_awaitable_t<Executor>&, void()>(
      [w, qp](auto handler) { w->queue_send(qp, std::move(handler)); }, use_task);
  // A send the ring took before it failed may be out: taken as sent, so that nothing is sent
  // twice and an upstream write counts as in flight until it is answered or times out (then it
  // lingers: the fence waits for it), as a write that went.
  const long r = q.result == SendRing::kUnknown ? static_cast<long>(total) : q.result;
  const bool all = sent_all(bufs, total, r, ec);
  // The watchdog's cancellation cannot reach a send waiting for the flush. A deadline that
  // passed meanwhile ends what is left to send, as it would have ended a write in progress
  // (settle() reports it as timed_out); the write that would follow has no deadline any more.
  if (!all && !ec && timed_out_ && !timed_out_before) ec = net::error::operation_aborted;
  co_return all;
}

// Sends request bytes upstream; `bufs` is advanced past what went. A send that cannot go at
// once waits for room while watching the upstream, since a server may answer before it has read
// the whole request (an early 413 or 401) and then stop reading, or close: returns true iff it
// answered so (answered_early), and the rest of the request is then not sent. *ec: how the send
// went (a watchdog cancellation shows up in timed_out_).
template <class Buffers>
task<bool> Session::send_request(UpConn& up, Buffers& bufs, boost::system::error_code& ec) {
  for (;;) {
    if (co_await send_soon(up.sock, bufs, ec)) co_return false;
    // A reset after an answer leaves the answer readable; with nothing there, the send failed.
    if (ec) co_return answered_early(up) && !up.buf.empty();
    if (up.duplex) {  // its answer is under way and it still reads: just send
      co_await net::async_write(up.sock, bufs, net::redirect_error(use_task, ec));
      co_return false;
    }
    struct Watch {
      bool fired = false;  // the upstream became readable while the write waited
      bool over = false;   // the write has ended
    };
    auto watch = std::make_shared<Watch>();
    Socket* sock = &up.sock;
    up.sock.async_wait(Socket::wait_read, [watch, sock](boost::system::error_code e) {
      if (e || watch->over) return;
      watch->fired = true;
      boost::system::error_code ignored;
      sock->cancel(ignored);  // ends the blocked write
    });
    std::size_t n = co_await net::async_write(up.sock, bufs, net::redirect_error(use_task, ec));
    watch->over = true;
    if (!watch->fired) {
      boost::system::error_code ignored;
      up.sock.cancel(ignored);  // ends the wait (its handler does nothing now)
      co_return ec && !timed_out_ && answered_early(up) && !up.buf.empty();
    }
    if (timed_out_) co_return false;
    advance(bufs, n);
    if (answered_early(up)) {
      ec.clear();
      co_return true;
    }
    ec.clear();  // only an interim answer, or part of a head: send on
  }
}

// Reads what the upstream sent while the request was still going out. True iff that is the start
// of a refusal (a final response head of 4xx/5xx, something that is not a response head, which
// the response path refuses, or a close); a complete interim 1xx answer is dropped and does not
// count. A 2xx/3xx head is an upstream that streams its answer while it reads: the request goes
// on (up.duplex), and the head waits in up.buf for the response path.
bool Session::answered_early(UpConn& up) {
  bool closed = false;
  for (;;) {
    while (!up.buf.empty()) {
      HeadScan s = scan_response_head(up.buf.view(), kMaxResponseHeader, &sc_->resp);
      if (s.status == HeadStatus::complete && sc_->resp.status >= 100 && sc_->resp.status < 200 &&
          sc_->resp.status != 101) {
        up.buf.consume(s.length);
        continue;
      }
      if (s.status == HeadStatus::complete && sc_->resp.status >= 200 && sc_->resp.status < 400) {
        up.duplex = true;
        return false;
      }
      if (s.status != HeadStatus::incomplete) return true;
      break;
    }
    if (closed) return true;
    const auto b = up.buf.prepare(kRelayBuffer);
    ssize_t n;
    do n = ::recv(up.sock.native_handle(), b.data(), b.size(), MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n > 0) {
      up.buf.commit(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;  // nothing (more) yet
    closed = true;  // EOF or reset: whatever came before it is the answer
  }
}

std::unique_ptr<UpConn> Session::pooled_upstream(const config::Route& route) {
  auto& pool = w_.pool(route.upstream);
  while (!pool.empty()) {
    auto c = std::move(pool.back());
    pool.pop_back();
    // Every time, however short its idle time: bytes the upstream sent after its last response
    // (a body after a HEAD or 204 answer, data past Content-Length or the last chunk, in a write
    // of their own) would otherwise be read as the answer to this request: one client's
    // response reaching another. And a close sent meanwhile would fail this request with a 502
    // rather than reach the upstream. One non-blocking peek (an EAGAIN, ~0.3 us) per reuse.
    if (c->buf.empty() && still_open(c->sock)) return c;
  }
  return nullptr;
}

task<std::unique_ptr<UpConn>> Session::connect_upstream(const config::Route& route, std::shared_ptr<Exchange>& ex,
                                                        boost::system::error_code& ec) {
  ex->up = std::make_unique<UpConn>(w_.ioc);  // visible to a drain abort while connecting
  std::vector<tcp::endpoint> endpoints;
  for (const auto& a : snap_->upstreams[snap_->route_index(&route)]) {
    boost::system::error_code aec;
    auto addr = net::ip::make_address(a.ip, aec);
    if (!aec) endpoints.emplace_back(addr, a.port);
  }
  waiting_up_ = ex->up.get();
  arm(cfg().upstream_connect_timeout);
  co_await net::async_connect(ex->up->sock, endpoints, net::redirect_error(use_task, ec));
  disarm();
  waiting_up_ = nullptr;
  if (timed_out_) ec = net::error::timed_out;
  std::unique_ptr<UpConn> c = std::move(ex->up);
  if (!ec) set_nodelay(c->sock);
  co_return c;
}

void Session::give_back(const config::Route& route, std::unique_ptr<UpConn> c) {
  // upstream_idle_per_thread connections are kept; during a burst up to kPoolBurst more are,
  // for kPoolBurstIdle each (the watchdog closes them): a burst of concurrent exchanges larger
  // than the pool would otherwise close and reconnect upstream connections on every request.
  const std::size_t keep = cfg().upstream_idle_per_thread;
  if (keep == 0) return;
  w_.pool_keep = keep;
  auto& pool = w_.pool(route.upstream);
  if (pool.size() >= keep + kPoolBurst) return;
  c->idle_since = Clock::now();
  pool.push_back(std::move(c));
}

task<bool> Session::forward(const RequestHead& head, const Framing& fr, std::size_t head_len,
                            const config::Route& route, const std::string& resource, bool client_keep_alive,
                            bool expect_continue, std::shared_ptr<Exchange> ex, const FenceMarks& marks) {
  const auto& cfg = this->cfg();
  const int version = head.version;
  const bool head_req = head.method == "HEAD";
  boost::system::error_code ec;
  const auto started = Clock::now();
  timed_out_ = false;
  count(resource, Outcome::forwarded);
  auto exchange_over = [&] {
    if (ex->node.resource || !ex->aborted) {
      rt_.metrics.upstream_latency.observe(std::chrono::duration<double>(Clock::now() - started).count());
    }
    ex->release();
  };
  // True (and the exchange handed to linger_after_failure) when some of this fenced write went
  // to the upstream, which may still be applying it; otherwise the exchange is released.
  bool sent = false;  // a send of this request's bytes upstream was started
  auto linger_or_release = [&](const char* why, bool incomplete) -> bool {
    if (sent && !ex->aborted && ex->up && ex->up->sock.is_open() && ex->node.resource != nullptr) {
      ex->client = nullptr;  // the session and its socket go before the exchange does
      net::co_spawn(w_.ioc, linger_after_failure(ex, cfg.drain_timeout, st_.active_requests, why, incomplete),
                    net::detached);
      return true;
    }
    ex->release();
    return false;
  };
  auto upstream_failed = [&](boost::system::error_code e, const char* stage) -> task<bool> {
    waiting_up_ = nullptr;
    const bool timeout = e == net::error::timed_out && std::string_view(stage) != "connect";
    // The upstream has the request (or part of it, and stopped reading) and has not answered: it
    // may still apply it. (A send that failed otherwise means the upstream closed the connection.)
    const bool response = std::string_view(stage) == "response";
    bool linger = false;
    if (timeout) linger = linger_or_release(response ? "upstream timeout (response)" : "upstream timeout (send)", !response);
    else ex->release();
    count(resource, Outcome::upstream_error);
    log::warn("upstream exchange failed", {log::kv("upstream", route.upstream), log::kv("stage", stage),
                                           log::kv("error", e.message()), log::kv("aborted_by_drain", ex->aborted ? 1 : 0),
                                           log::kv("still_in_flight", linger ? 1 : 0)});
    if (ex->aborted || timeout) {
      std::string detail = ex->aborted ? "a newer generation's drain timed out; this exchange was aborted"
                                       : std::string("the upstream did not answer in time (") + stage + ")";
      {
        sc_->problem = Problem{504, "upstream-timeout", "Gateway timeout", detail};
        co_return co_await reply(sc_->problem, false, version, marks);
      }
    }
    {
      sc_->problem = Problem{502, "upstream-error", "Bad gateway",
                             std::string("upstream ") + route.upstream + ": " + stage + ": " + e.message()};
      co_return co_await reply(sc_->problem, false, version, marks);
    }
  };
  // The client's body stopped or broke: the upstream has an incomplete request. Its connection
  // is half-closed and, for a fenced write, kept in flight until the upstream is done with it.
  auto client_body_failed = [&](const char* why, bool too_large) -> task<bool> {
    waiting_up_ = nullptr;
    linger_or_release(too_large ? "body too large" : timed_out_ ? "client body stalled"
                                                   : why ? "malformed client body" : "client gone mid-body",
                      true);
    if (ex->aborted) {  // woken by a newer generation's drain timeout (see node.abort)
      sc_->problem = Problem{504, "upstream-timeout", "Gateway timeout",
                             "a newer generation's drain timed out; this exchange was aborted"};
      co_await reply(sc_->problem, false, version, marks);
    } else if (too_large) {
      sc_->problem = Problem{413, "body-too-large", "Content too large",
                             "the body exceeds " + std::to_string(cfg.max_body_bytes) + " bytes"};
      co_await reply(sc_->problem, false, version, marks);
      co_await linger_close();
    } else if (timed_out_) {
      sc_->problem = Problem{408, "request-timeout", "Request timeout", "the request body stalled"};
      co_await reply(sc_->problem, false, version, marks);
    } else if (why) {
      sc_->problem = Problem{400, "bad-body", "Bad request", std::string("malformed request body: ") + why};
      co_await reply(sc_->problem, false, version, marks);
    }
    co_return false;
  };
  // The client went (a write to it failed or timed out) while the upstream may still be working
  // on this fenced write: the write stays in flight for the fence until the upstream's answer
  // has ended, so the answer is read to its end and dropped. False when nothing is to wait for
  // (not a fenced write, or no longer in flight): the exchange just ends.
  bool client_gone = false;
  auto client_went = [&]() -> bool {
    if (!ex->node.resource || ex->aborted) return false;
    client_gone = true;
    timed_out_ = false;
    boost::system::error_code ignored;
    client_.shutdown(tcp::socket::shutdown_both, ignored);
    return true;
  };
  // The upstream request head: hop-by-hop fields go (RFC 9110 7.6.1), X-Forwarded-For and
  // Forwarded get the client appended, framing is restated from what was validated.
  {
    std::string xff, fwd;
    std::string& out = sc_->out;
    out.clear();
    append(out, head.method, std::string_view(" "), head.target, std::string_view(" HTTP/1.1\r\n"));
    for (const auto& f : head.fields) {
      switch (f.kind) {
        case FieldKind::expect:
        case FieldKind::content_length:
        case FieldKind::transfer_encoding:
        case FieldKind::framing_alias:  // refused by check_framing; never relayed
          continue;
        case FieldKind::x_forwarded_for:
        case FieldKind::forwarded: {
          if (named_by_connection(head, f.name)) continue;  // hop-by-hop by the client's word: ours alone go on
          std::string& acc = f.kind == FieldKind::forwarded ? fwd : xff;
          if (!acc.empty()) acc += ", ";
          acc += f.value;
          continue;
        }
        default:
          if (is_hop_by_hop(f.kind) || named_by_connection(head, f.name)) continue;
          append_field(out, f.name, f.value);
      }
    }
    const std::string_view sep = ", ";
    append(out, std::string_view("X-Forwarded-For: "), xff, xff.empty() ? std::string_view() : sep, client_ip_,
           std::string_view("\r\nForwarded: "), fwd, fwd.empty() ? std::string_view() : sep,
           std::string_view(client_v6_ ? "for=\"[" : "for="), client_ip_,
           std::string_view(client_v6_ ? "]\"\r\n" : "\r\n"));
    // An HTTP/1.0 request may come without Host, but it goes on as HTTP/1.1, which must have one
    // (RFC 9112 3.2): the upstream's own authority, as a client addressing it directly would send.
    if (!head.has(FieldKind::host)) append_field(out, "Host", upstream_authority(route.upstream));
    if (fr.chunked) append(out, std::string_view("Transfer-Encoding: chunked\r\n"));
    else if (fr.content_length) append_field(out, "Content-Length", Decimal(*fr.content_length));
    append(out, std::string_view("\r\n"));
  }
  // (Not a method the route counts as a write: write_methods may name GET.)
  const bool safe_bodiless = (head.method == "GET" || head.method == "HEAD" || head.method == "OPTIONS") &&
                             !route.is_fenced(head.method) && !fr.chunked && fr.content_length.value_or(0) == 0 &&
                             !expect_continue;
  sc_->in.consume(head_len);  // `head` is not used past this point

  // Upstream connection.
  std::unique_ptr<UpConn> conn = pooled_upstream(route);
  const bool reused = conn != nullptr;
  if (!conn) conn = co_await connect_upstream(route, ex, ec);
  if (ec || ex->aborted) co_return co_await upstream_failed(ec ? ec : net::error::operation_aborted, "connect");
  ex->up = std::move(conn);
  UpConn& up = *ex->up;

  // A pooled connection the upstream closes just as it is reused (its keep-alive timeout: a race
  // no peek can close) fails a request its application never saw. A bodiless GET, HEAD or
  // OPTIONS is safe to send again (RFC 9110 9.2.1, RFC 9112 9.3.1): once, on a new connection,
  // when nothing at all came back. Anything with a body, writes above all, is not retried.
  bool may_retry = reused && safe_bodiless;
  auto retry_fresh = [&](boost::system::error_code e) -> task<bool> {
    if (!may_retry || !up.buf.empty() || timed_out_ || ex->aborted) co_return false;
    if (e != net::error::eof && e != net::error::connection_reset && e != net::error::broken_pipe) co_return false;
    may_retry = false;
    std::unique_ptr<UpConn> keep = std::move(ex->up);  // `up` (connect_upstream uses ex->up meanwhile)
    boost::system::error_code cec;
    std::unique_ptr<UpConn> fresh = co_await connect_upstream(route, ex, cec);
    ex->up = std::move(keep);
    if (cec || ex->aborted) co_return false;
    up.sock = std::move(fresh->sock);
    waiting_up_ = &up;
    arm(cfg.upstream_timeout);
    std::array<net::const_buffer, 1> b{net::buffer(sc_->out)};
    boost::system::error_code sec;
    const bool answered = co_await send_request(up, b, sec);
    sec = settle(sec);
    co_return !sec || answered;
  };
  up.duplex = false;
  waiting_up_ = &up;

  if (expect_continue) {
    static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    arm(cfg.body_timeout);
    co_await net::async_write(client_, net::buffer(kContinue), net::redirect_error(use_task, ec));
    if (settle(ec)) co_return false;
  }

  // Request: the head with the first body bytes in one write, then the rest as it arrives.
  // An upstream may answer before it has the whole request (early): that answer is relayed, the
  // rest of the body is not sent, and both connections close after it (the client's body is
  // left unread).
  auto& gather = sc_->gather;
  auto& frame = sc_->frame;
  bool early = false;
  if (!fr.chunked) {
    std::uint64_t left = fr.content_length.value_or(0);
    std::size_t pre = static_cast<std::size_t>(std::min<std::uint64_t>(left, sc_->in.size()));
    arm(cfg.upstream_timeout);
    std::array<net::const_buffer, 2> b{net::buffer(sc_->out), net::buffer(sc_->in.view().data(), pre)};
    sent = true;
    early = co_await send_request(up, b, ec);
    ec = settle(ec);
    if (ec && !early && co_await retry_fresh(ec)) ec.clear();
    if (ec && !early) co_return co_await upstream_failed(ec, "send");
    sc_->in.consume(pre);
    left -= pre;
    while (left > 0 && !early) {
      ec = co_await read_client(static_cast<std::size_t>(std::min<std::uint64_t>(left, kRelayBuffer)), cfg.body_timeout);
      if (ec) co_return co_await client_body_failed(nullptr, false);
      std::size_t n = std::min<std::size_t>(sc_->in.size(), static_cast<std::size_t>(left));
      arm(cfg.upstream_timeout);
      std::array<net::const_buffer, 1> piece{net::buffer(sc_->in.view().data(), n)};
      sent = true;
      early = co_await send_request(up, piece, ec);
      ec = settle(ec);
      if (ec && !early) co_return co_await upstream_failed(ec, "send");
      sc_->in.consume(n);
      left -= n;
    }
  } else {
    // Every batch of decoded chunk data goes upstream as one chunk of our own framing.
    ChunkDecoder dec(cfg.max_body_bytes);
    bool head_sent = false;
    for (;;) {
      const std::size_t size_slot = start_gather(gather, head_sent ? nullptr : &sc_->out);
      std::size_t total = 0;
      const std::size_t used = decode_into(dec, sc_->in.view(), gather, &total);
      if (dec.failed()) co_return co_await client_body_failed(dec.error(), dec.too_large());
      frame_chunk(gather, size_slot, frame, total, dec.done());
      if (!head_sent || total || dec.done()) {
        arm(cfg.upstream_timeout);
        sent = true;
        early = co_await send_request(up, gather, ec);
        ec = settle(ec);
        if (ec && !early) co_return co_await upstream_failed(ec, "send");
        head_sent = true;
      }
      sc_->in.consume(used);
      if (dec.done() || early) break;
      if (sc_->in.empty()) {
        ec = co_await read_client(kRelayBuffer, cfg.body_timeout);
        if (ec) co_return co_await client_body_failed(nullptr, false);
      }
    }
  }

  // Response head, after any interim 1xx answers.
  ResponseHead& rh = sc_->resp;
  std::size_t rh_len = 0;
  for (;;) {
    if (!up.buf.empty()) {
      HeadScan s = scan_response_head(up.buf.view(), kMaxResponseHeader, &rh);
      if (s.status == HeadStatus::complete) {
        rh_len = s.length;
        if (rh.status >= 100 && rh.status < 200 && rh.status != 101) {
          // Interim answers (103 Early Hints, 102) go on to HTTP/1.1 clients (RFC 9110 15.2);
          // not 100 Continue: fencegate answers Expect itself and never forwards it.
          if (rh.status != 100 && version == 11) {
            std::string_view view = up.buf.view();
            sc_->out.clear();
            append(sc_->out, std::string_view("HTTP/1.1"), view.substr(8, view.find("\r\n") - 8), std::string_view("\r\n"));
            for (const auto& f : rh.fields)
              if (!is_hop_by_hop(f.kind) && !named_by_connection(rh, f.name)) append_field(sc_->out, f.name, f.value);
            sc_->out += "\r\n";
            if (!client_gone) {
              arm(cfg.body_timeout);
              std::array<net::const_buffer, 1> b{net::buffer(sc_->out)};
              if (!send_now(client_, b, ec) && !ec) co_await net::async_write(client_, b, net::redirect_error(use_task, ec));
              if (settle(ec) && !client_went()) {
                waiting_up_ = nullptr;
                ex->release();
                co_return false;
              }
            }
          }
          up.buf.consume(rh_len);
          continue;
        }
        break;
      }
      if (s.status != HeadStatus::incomplete) {
        waiting_up_ = nullptr;
        ex->release();
        count(resource, Outcome::upstream_error);
        std::string why = s.status == HeadStatus::bad ? s.reason : "response head too large";
        log::warn("upstream sent a bad response", {log::kv("upstream", route.upstream), log::kv("error", why)});
        {
          sc_->problem = Problem{502, "upstream-error", "Bad gateway",
                                 "upstream " + route.upstream + ": malformed response: " + why};
          co_return co_await reply(sc_->problem, false, version, marks);
        }
      }
    }
    {
      arm(cfg.upstream_timeout);
      std::size_t got = prompt_ ? co_await read_promptly(up, ec)
                                : co_await up.sock.async_read_some(up.buf.prepare(kRelayBuffer), net::redirect_error(use_task, ec));
      prompt_ = false;
      up.buf.commit(got);
      ec = settle(ec);
    }
    if (ec && co_await retry_fresh(ec)) continue;
    if (ec) co_return co_await upstream_failed(ec, "response");
  }
  if (rh.status == 101) {
    waiting_up_ = nullptr;
    ex->release();
    count(resource, Outcome::upstream_error);
    {
      sc_->problem = Problem{502, "upstream-error", "Bad gateway", "the upstream switched protocols"};
      co_return co_await reply(sc_->problem, false, version, marks);
    }
  }

  // Response framing (RFC 9112 6.3).
  enum class Body { none, length, chunked, until_close };
  Body body = Body::until_close;
  std::uint64_t body_len = 0;
  std::string& te_value = sc_->te_value;
  te_value.clear();
  {
    std::string_view cl;
    std::size_t ncl = 0;
    bool te_chunked = false, has_te = false;
    for (const auto& f : rh.fields)
      if (f.kind == FieldKind::transfer_encoding) {
        has_te = true;
        // "identity" (RFC 2616's no-op coding, gone from HTTP/1.1 since RFC 7230) is not a
        // coding to pass on: a client would wait for a coding it cannot undo.
        for_each_token(f.value, [&](std::string_view t) {
          te_chunked = iequals(t, "chunked");  // of the last coding as sent (RFC 9112 6.3)
          if (iequals(t, "identity")) return;
          if (!te_value.empty()) te_value += ", ";
          te_value += t;
        });
      } else if (f.kind == FieldKind::content_length && ncl++ == 0) {
        cl = f.value;
      }
    bool cl_ok = ncl > 0;
    if (ncl) {
      for (const auto& f : rh.fields) {
        if (f.kind != FieldKind::content_length) continue;
        if (f.value != cl || cl.empty() || cl.size() > 19 ||
            cl.find_first_not_of("0123456789") != std::string_view::npos)
          cl_ok = false;
      }
      if (cl_ok) std::from_chars(cl.data(), cl.data() + cl.size(), body_len);
    }
    if (head_req || rh.status == 204 || rh.status == 304) body = Body::none;
    else if (has_te) body = te_chunked ? Body::chunked : Body::until_close;
    else if (ncl && !cl_ok) {
      waiting_up_ = nullptr;
      ex->release();
      count(resource, Outcome::upstream_error);
      {
        sc_->problem = Problem{502, "upstream-error", "Bad gateway",
                               "upstream " + route.upstream + ": invalid or conflicting Content-Length"};
        co_return co_await reply(sc_->problem, false, version, marks);
      }
    } else if (ncl) body = Body::length;
  }
  bool up_reusable = rh.version == 11;
  for (const auto& f : rh.fields)
    if (f.kind == FieldKind::connection)
      for_each_token(f.value, [&](std::string_view t) {
        if (iequals(t, "close")) up_reusable = false;
        else if (iequals(t, "keep-alive") && rh.version == 10) up_reusable = true;
      });
  // Close-delimited, or framed both ways (RFC 9112 6.3: chunked wins, the connection closes after).
  if (body == Body::until_close || (body == Body::chunked && rh.has(FieldKind::content_length))) up_reusable = false;
  if (early) up_reusable = false;  // it has a partial request
  bool keep = client_keep_alive && !early && !rt_.stopping.load(std::memory_order_relaxed);
  // A 1.0 client gets a body it can delimit only by the close.
  const bool chunk_out = version == 11 && (body == Body::chunked || body == Body::until_close);
  if (version == 10 && (body == Body::chunked || body == Body::until_close)) keep = false;

  // The client's response head.
  {
    std::string_view view = up.buf.view();
    std::string_view status_line = view.substr(8, view.find("\r\n") - 8);  // " 200 OK"
    sc_->out.clear();
    append(sc_->out, std::string_view(version == 10 ? "HTTP/1.0" : "HTTP/1.1"), status_line, std::string_view("\r\n"));
    bool has_date = false;
    for (const auto& f : rh.fields) {
      const FieldKind k = f.kind;
      has_date = has_date || (f.name.size() == 4 && iequals(f.name, "Date"));
      if (is_hop_by_hop(k) || k == FieldKind::transfer_encoding) continue;
      // A 204 has no content, so no Content-Length (RFC 9110 8.6): a client that believed one
      // would wait for bytes that never come, or read the next response as them.
      if (k == FieldKind::content_length && (body != Body::none || rh.status == 204)) continue;
      // A fenced request's fence headers are ours alone: an upstream's Fencing-Observe on an
      // enforce route would tell the client its write was only observed.
      if (marks.generation && (k == FieldKind::fencing_generation || k == FieldKind::fencing_observe)) continue;
      if (named_by_connection(rh, f.name)) continue;
      append_field(sc_->out, f.name, f.value);
    }
    // A response without a Date gets ours (RFC 9110 6.6.1: a recipient with a clock adds one).
    if (!has_date) append_field(sc_->out, "Date", http_date());
    if (marks.generation) append_field(sc_->out, "Fencing-Generation", Decimal(static_cast<std::uint64_t>(*marks.generation)));
    if (!marks.observe.empty()) append_field(sc_->out, "Fencing-Observe", marks.observe);
    if (body == Body::length) append_field(sc_->out, "Content-Length", Decimal(body_len));
    // A close-delimited body under another coding (Transfer-Encoding: gzip) keeps its label, with
    // our chunked framing last: without it the client would take gzip bytes for the content.
    if (chunk_out) {
      if (body == Body::until_close && !te_value.empty()) te_value += ", chunked";
      append_field(sc_->out, "Transfer-Encoding", body == Body::until_close && te_value.empty() ? std::string_view("chunked")
                                                                                                : std::string_view(te_value));
    }
    if (!keep) sc_->out += "Connection: close\r\n";
    else if (version == 10) sc_->out += "Connection: keep-alive\r\n";
    sc_->out += "\r\n";
    up.buf.consume(rh_len);
  }

  // Response body.
  auto body_failed = [&](const std::string& why) -> bool {
    // The response head is already out: all we can do is cut the client connection.
    count(resource, Outcome::upstream_error);
    log::warn("upstream response body failed", {log::kv("upstream", route.upstream), log::kv("error", why)});
    return false;
  };
  bool head_sent = false;
  switch (body) {
    case Body::none:
      exchange_over();
      arm(cfg.body_timeout);
      {
        std::array<net::const_buffer, 1> b{net::buffer(sc_->out)};
        if (!co_await send_soon(client_, b, ec) && !ec) co_await net::async_write(client_, b, net::redirect_error(use_task, ec));
      }
      if (settle(ec)) co_return false;
      break;
    case Body::length: {
      std::uint64_t left = body_len;
      for (;;) {
        std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(left, up.buf.size()));
        left -= n;
        if (left == 0) exchange_over();
        std::array<net::const_buffer, 2> b{net::buffer(sc_->out.data(), head_sent ? 0 : sc_->out.size()),
                                           net::buffer(up.buf.view().data(), n)};
        if (!head_sent || n) {
          if (!client_gone) {
            arm(cfg.body_timeout);
            if (!co_await send_soon(client_, b, ec) && !ec) co_await net::async_write(client_, b, net::redirect_error(use_task, ec));
            if (settle(ec) && !client_went()) co_return false;
          }
          head_sent = true;
        }
        up.buf.consume(n);
        if (left == 0) break;
        {
          arm(cfg.upstream_timeout);
          std::size_t got = co_await up.sock.async_read_some(up.buf.prepare(static_cast<std::size_t>(std::min<std::uint64_t>(left, kRelayBuffer))), net::redirect_error(use_task, ec));
          up.buf.commit(got);
          ec = settle(ec);
        }
        if (ec) co_return body_failed(ec.message());
      }
      break;
    }
    case Body::chunked:
    case Body::until_close: {
      ChunkDecoder dec;
      bool eof = false;
      for (;;) {
        const std::size_t size_slot = start_gather(gather, head_sent ? nullptr : &sc_->out);
        std::string_view avail = up.buf.view();
        std::size_t used = 0, total = 0;
        if (body == Body::until_close) {
          if (!avail.empty()) gather.push_back(net::buffer(avail.data(), avail.size()));
          used = total = avail.size();
        } else {
          used = decode_into(dec, avail, gather, &total);
          if (dec.failed() && !head_sent) {
            // Nothing has reached the client yet: it gets a 502, not a cut connection.
            waiting_up_ = nullptr;
            ex->release();
            count(resource, Outcome::upstream_error);
            log::warn("upstream response body failed", {log::kv("upstream", route.upstream),
                                                         log::kv("error", std::string("bad chunked framing: ") + dec.error())});
            sc_->problem = Problem{502, "upstream-error", "Bad gateway",
                                   "upstream " + route.upstream + ": bad chunked framing: " + dec.error()};
            co_return co_await reply(sc_->problem, false, version, marks);
          }
          if (dec.failed()) co_return body_failed(std::string("bad chunked framing: ") + dec.error());
        }
        const bool done = body == Body::chunked ? dec.done() : eof;
        if (done) exchange_over();
        if (chunk_out) frame_chunk(gather, size_slot, frame, total, done);  // else the runs go raw
        if (!head_sent || total || (done && chunk_out)) {
          if (!client_gone) {
            arm(cfg.body_timeout);
            if (!co_await send_soon(client_, gather, ec) && !ec) co_await net::async_write(client_, gather, net::redirect_error(use_task, ec));
            if (settle(ec) && !client_went()) co_return false;
          }
          head_sent = true;
        }
        up.buf.consume(used);
        if (done) break;
        if (up.buf.empty()) {
          {
            arm(cfg.upstream_timeout);
            std::size_t got = co_await up.sock.async_read_some(up.buf.prepare(kRelayBuffer), net::redirect_error(use_task, ec));
            up.buf.commit(got);
            ec = settle(ec);
          }
          if (ec == net::error::eof && body == Body::until_close) eof = true;
          else if (ec) co_return body_failed(ec.message());
        }
      }
      break;
    }
  }
  waiting_up_ = nullptr;
  ex->release();
  if (up_reusable && !ex->aborted && up.buf.empty()) give_back(route, std::move(ex->up));
  co_return keep && !client_gone;
}

// ---------------------------------------------------------------------------------------------
// Server.

// Accepts on worker 0 and hands each new descriptor to the next worker, which wraps it in a
// socket on its own thread: a socket is registered with, and only ever used from, the reactor of
// the thread that runs it (the workers' io_contexts take no per-socket locks).
task<void> accept_loop(ServerState& st, Acceptor& acceptor, std::vector<std::unique_ptr<Worker>>& workers) {
  std::size_t next = 0;
  boost::system::error_code ec;
  const tcp protocol = acceptor.local_endpoint(ec).protocol();
  acceptor.non_blocking(true, ec);
  for (;;) {
    co_await acceptor.async_wait(tcp::acceptor::wait_read, net::redirect_error(use_task, ec));
    if (ec == net::error::operation_aborted || !acceptor.is_open()) co_return;
    for (;;) {
      const int fd = ::accept4(acceptor.native_handle(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        const int e = errno;
        if (e == EAGAIN || e == EWOULDBLOCK) break;
        if (e == ECONNABORTED || e == EINTR || e == EPROTO) continue;
        log::warn("accept failed; backing off", {log::kv("error", std::strerror(e))});
        Timer t(acceptor.get_executor(), std::chrono::milliseconds(50));
        co_await t.async_wait(net::redirect_error(use_task, ec));
        break;
      }
      if (st.connections.load(std::memory_order_relaxed) >= st.rt.snapshot()->cfg->max_connections) {
        // Over the limit: close at once so the client sees it; the sidecar stays up for the rest.
        ::close(fd);
        continue;
      }
      st.connections.fetch_add(1, std::memory_order_relaxed);
      st.rt.metrics.open_connections.fetch_add(1, std::memory_order_relaxed);
      Worker& w = *workers[next];
      next = (next + 1) % workers.size();
      net::post(w.ioc, [&st, &w, fd, protocol] {
        boost::system::error_code aec;
        Socket sock(w.ioc.get_executor());
        sock.assign(protocol, fd, aec);
        if (aec) {
          ::close(fd);
          st.connections.fetch_sub(1, std::memory_order_relaxed);
          st.rt.metrics.open_connections.fetch_sub(1, std::memory_order_relaxed);
          return;
        }
        Session::start(std::make_unique<Session>(st, w, std::move(sock)), false);
      });
      // Let this worker's other handlers run between accepts: a burst of connects must not
      // starve the sessions (nor keep a just-closed one counted against max_connections).
      co_await net::post(acceptor.get_executor(), use_task);
    }
  }
}

// Lets the process hold max_connections sockets (client + upstream each) if the hard limit allows.
void raise_fd_limit(std::size_t max_connections) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < max_connections + 64)
    log::warn("file descriptor limit is below what max_connections needs",
              {log::kv("nofile", static_cast<std::uint64_t>(rl.rlim_cur)), log::kv("max_connections", max_connections)});
}

}  // namespace

int run_serve(std::shared_ptr<const config::Config> cfg) {
  std::signal(SIGPIPE, SIG_IGN);
  std::signal(SIGXFSZ, SIG_IGN);  // a full or limited disk must surface as a store error, not kill us
  log::Level lvl;
  if (log::parse_level(cfg->log_level, &lvl)) log::set_level(lvl);
  raise_fd_limit(cfg->max_connections);

  std::string err;
  std::shared_ptr<const Snapshot> snap = make_snapshot(cfg, &err);
  if (!snap) {
    log::error("cannot start", {log::kv("error", err)});
    return 1;
  }
  std::unique_ptr<store::Store> store = store::Store::open(cfg->db, &err);
  if (!store) {
    log::error("cannot open the fence store", {log::kv("db", cfg->db), log::kv("error", err)});
    return 1;
  }
  store->set_retention(static_cast<std::int64_t>(cfg->audit.max_age.count()) * 1000, cfg->audit.max_rows);
  auto fence = std::make_unique<Fence>(*store, cfg->drain_timeout, cfg->max_resources);
  if (!fence->load(&err)) {
    log::error("cannot load generations", {log::kv("db", cfg->db), log::kv("error", err)});
    return 1;
  }
  Metrics metrics;
  Runtime rt(*store, *fence, metrics);
  rt.install(snap);
  // Election authorities (authority-linked fencing): started before traffic, stopped before the
  // store and the fence go away. Until one has reached etcd its routes' writes get 503.
  Authorities authorities(rt);
  authorities.start(*cfg);
  fence->set_drain_observer([&metrics](double s) { metrics.drain_wait.observe(s); });
  store->set_commit_observer([&metrics, &rt](double s, std::size_t rows, const store::Status& result) {
    if (rows) {  // 0 rows: the store's idle health check, not a commit
      metrics.store_commit.observe(s);
      if (!result.ok()) metrics.store_commit_failures.fetch_add(1, std::memory_order_relaxed);
    }
    rt.store_result(result.ok(), result.ok() ? std::string() : "the last store commit failed: " + result.message());
  });
  ServerState st(rt);
  st.authorities = &authorities;
  rt.authorities = &authorities;

  std::vector<std::unique_ptr<Worker>> workers;
  for (int i = 0; i < std::max(1, cfg->threads); ++i) workers.push_back(std::make_unique<Worker>());
  // SIGINT/SIGTERM are taken over before the port opens: one that arrives as soon as a client
  // can connect is queued for the graceful stop below, not the default instant death.
  net::signal_set signals(workers[0]->ioc, SIGINT, SIGTERM);

  Acceptor acceptor(workers[0]->ioc.get_executor());
  {
    boost::system::error_code ec;
    tcp::resolver resolver(workers[0]->ioc);
    std::string host = cfg->listen.host;
    if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    auto results = resolver.resolve(host, std::to_string(cfg->listen.port), ec);
    if (ec || results.empty()) {
      log::error("cannot resolve listen address", {log::kv("listen", cfg->listen.to_string()), log::kv("error", ec.message())});
      return 1;
    }
    tcp::endpoint ep = results.begin()->endpoint();
    acceptor.open(ep.protocol(), ec);
    if (!ec) acceptor.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor.bind(ep, ec);
    if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      log::error("cannot listen", {log::kv("listen", cfg->listen.to_string()), log::kv("error", ec.message())});
      return 1;
    }
    auto bound = acceptor.local_endpoint(ec);
    log::info("listening", {log::kv("address", (bound.address().is_v6() ? "[" + bound.address().to_string() + "]" : bound.address().to_string()) + ":" + std::to_string(bound.port())),
                            log::kv("db", cfg->db), log::kv("threads", workers.size()),
                            log::kv("routes", cfg->routes.size())});
  }

  std::unique_ptr<AdminServer> admin = AdminServer::start(rt, cfg->admin.listen, &err);
  if (!admin) {
    log::error("cannot start the admin listener", {log::kv("admin_listen", cfg->admin.listen.to_string()),
                                                   log::kv("error", err)});
    return 1;
  }

  net::co_spawn(workers[0]->ioc, accept_loop(st, acceptor, workers), net::detached);
  for (auto& w : workers) w->start_watchdog();

  // SIGINT/SIGTERM: readiness turns 503, stop accepting, let requests in flight finish (bounded),
  // then stop. (SIGHUP, a reload, is handled by the admin server's thread.)
  net::steady_timer grace(workers[0]->ioc);
  std::chrono::steady_clock::time_point deadline;
  std::function<void()> poll_stop = [&] {
    if (st.active_requests.load() == 0 || std::chrono::steady_clock::now() >= deadline) {
      if (const auto left = st.active_requests.load())
        log::warn("stop deadline passed: the connections of requests still in flight are closed unanswered",
                  {log::kv("in_flight", left)});
      for (auto& w : workers) w->ioc.stop();
      return;
    }
    grace.expires_after(std::chrono::milliseconds(20));
    grace.async_wait([&](boost::system::error_code) { poll_stop(); });
  };
  signals.async_wait([&](boost::system::error_code ec, int sig) {
    if (ec) return;
    log::info("stopping", {log::kv("signal", sig), log::kv("in_flight", st.active_requests.load())});
    rt.stopping = true;
    boost::system::error_code ignored;
    acceptor.close(ignored);
    deadline = std::chrono::steady_clock::now() +
               std::min(rt.snapshot()->cfg->drain_timeout, std::chrono::milliseconds(10000));
    poll_stop();
  });

  std::vector<std::thread> threads;
  for (std::size_t i = 1; i < workers.size(); ++i) {
    threads.emplace_back([&w = *workers[i]] {
      auto guard = net::make_work_guard(w.ioc);
      w.ioc.run();
    });
  }
  workers[0]->ioc.run();
  for (auto& w : workers) w->ioc.stop();
  for (auto& t : threads) t.join();
  admin->stop();
  authorities.stop();

  // Commit what is queued (audit rows of observe mode) before anything else goes away (its
  // completions still reach the fence). Then the fence forgets parked callbacks and in-flight
  // registrations, so the sessions still suspended in the io_contexts (destroyed at scope exit,
  // before the fence) can go in any order.
  // Generations forwarded in observe mode while the store failed get one last attempt first.
  fence->settle_owed();
  store->set_commit_observer(nullptr);
  store->drain_and_stop();
  for (const ResourceView& v : fence->owed())
    log::error("observe mode: a forwarded generation was never stored (the store kept failing); "
               "after this restart a lower generation is not known to be stale",
               {log::kv("resource", v.name), log::kv("generation", v.owed), log::kv("stored", v.stored)});
  if (const std::uint64_t lost = store->audit_rows_dropped())
    log::error("observe-mode audit rows could not be written and are lost (the store kept failing)",
               {log::kv("rows", lost)});
  store.reset();
  fence->shutdown();
  log::info("stopped");
  return 0;
}

}  // namespace fencegate::proxy
