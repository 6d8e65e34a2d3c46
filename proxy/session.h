// A client connection's session: its memory (SessionSlots), its life (start, park, unpark) and
// its deadlines, which the worker's watchdog enforces. The request path itself is in
// session.cpp (read the head, check, route, admit) and relay.cpp (forward, relay the answer).
//
// Timeouts: each session has one deadline (head, body, upstream, client write: whatever it is
// waiting for now) and each worker one watchdog timer that ticks every kWatchdogTick and cancels
// the socket operations of sessions past their deadline. No timer is armed per operation.
// Internal to proxy/ (it includes Asio).
#pragma once

#include <sys/epoll.h>
#include <unistd.h>

#include <mutex>
#include <span>

#include "proxy/idempotency.h"
#include "proxy/worker.h"

struct ssl_st;  // OpenSSL's SSL, used only in session_tls.cpp

namespace fencegate::proxy {

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
    char* block = static_cast<char*>(::operator new(stride* kPerBlock, std::align_val_t{16}));
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
      : st_(st),
        rt_(st.rt),
        w_(w),
        client_(std::move(sock)),
        snap_version_(rt_.snapshot_version()),
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
    if (ssl_) tls_end();
    if (parked_fd_ >= 0) {
      ::epoll_ctl(w_.parked.native_handle(), EPOLL_CTL_DEL, parked_fd_, nullptr);
      ::close(parked_fd_);
    }
    if (prev_) prev_->next_ = next_;
    else w_.sessions = next_;
    if (next_) next_->prev_ = prev_;
    if (per_client_counted_) uncount_client();
    st_.connections.fetch_sub(1, std::memory_order_relaxed);
    rt_.metrics.open_connections.fetch_sub(1, std::memory_order_relaxed);
  }

  // TLS (issue 27, proxy/tls_listener.cpp, session_tls.cpp): the listener hands over a client
  // connection whose handshake is done; the session then reads and writes through `ssl` (which
  // it owns from here) on its own socket. `identity`: the verified client certificate's, from the
  // handshake in process, never from bytes on the connection. Call before start().
  // False if OpenSSL could not take the session's BIO (the caller drops the session).
  bool set_tls(ssl_st* ssl, std::string identity);
  // What the session's BIO (session_tls.cpp) works with: the client's descriptor, where a write
  // goes while tls_seal encrypts (appended there, sent after through the batched send path;
  // else straight to the socket), the records read from the socket and not yet taken by OpenSSL
  // (in the Scratch: null while parked), and whether the socket reached its end.
  struct TlsIo {
    int fd = -1;
    std::string* capture = nullptr;
    ByteBuf* in = nullptr;
    bool eof = false;
  };

  // max_connections_per_client: counts this connection against its client address. Returns
  // false (and counts nothing) when the address is at the limit: the caller then drops the
  // session, which closes the connection. Always true while the limit is 0 (off).
  bool count_client();
  void uncount_client();

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
    (void)s.release();  // owned by the worker's list while parked
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
      if (s->read_waits_on_mark_) {
        // Idle since before this tick on a read that skipped its recv(): try that recv() now.
        // It finds an EOF that came with the last request (their epoll edges merged), which the
        // mark cannot see, so such a client is closed within a tick, not after kHotIdle.
        s->read_waits_on_mark_ = false;
        s->read_cancelled_to_probe_ = true;
        boost::system::error_code ec;
        s->client_.cancel(ec);
      }
      if (s->cold_at_ <= now) {
        s->cold_at_ = Clock::time_point::max();
        s->read_cancelled_to_go_cold_ = true;
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
  // The request path, one stage each (session.cpp): handle() runs them in order.
  task<bool> handle(std::size_t head_len);
  void start_request(RequestState& rq, std::size_t head_len);
  bool head_acceptable(RequestState& rq);
  const FenceHeaders& early_fence_headers(RequestState& rq);
  void route_request(RequestState& rq);
  enum class AdmitNow { forward, wait_fence, refuse };
  AdmitNow admit_now(RequestState& rq, Exchange& ex);
  task<bool> admit_after_wait(RequestState& rq, Exchange& ex, AdmitNow state, bool* answered);
  AdmissionInput admission_input(const RequestState& rq) const;
  FenceResource* fence_resource(const RequestState& rq, bool may_create);
  void admitted(RequestState& rq);
  void note_admission(const Admission& a, const RequestState& rq);
  task<bool> refuse(const RequestState& rq, const Problem& p, const FenceHeaders& fence);
  task<bool> refuse_client(RequestState& rq);  // TLS (issue 27): allowed_clients
  bool body_abandoned(const Framing& fr, std::size_t head_len);
  task<bool> reply(const Problem& p, bool keep_alive, int version, const FenceHeaders& fence);
  task<store::Status> audit_sync(store::AuditRow& row);  // moves from row
  task<bool> discard(std::uint64_t n);
  task<void> linger_close();
  // Forwarding, in stages (relay.cpp).
  enum class ResponseBody { none, length, chunked, until_close };
  // One exchange's state while forward() and its stages run (it lives in forward's frame).
  struct Forwarding {
    const config::Route& route;
    const std::string& resource;
    const FenceHeaders& fence;
    std::shared_ptr<Exchange> ex;
    int version = 11;
    bool head_req = false;
    bool client_keep_alive = true;
    Clock::time_point started = Clock::now();
    bool sent = false;         // a send of this request's bytes upstream was started
    bool client_gone = false;  // the client went: the answer is read to its end and dropped (client_went)
    bool may_retry = false;    // retry_fresh may send the request once more
    bool early = false;        // the upstream answered before it had the whole request
    std::size_t rh_len = 0;    // the response head's bytes in the upstream buffer
    ResponseBody body = ResponseBody::until_close;
    std::uint64_t body_len = 0;
    bool up_reusable = false;  // the upstream connection goes back to the pool after
    bool keep = false;         // the client connection goes on after
    bool chunk_out = false;    // the body goes to the client in chunks of our framing
    idem::Keyed* keyed = nullptr;  // issue 30: a keyed write's key and the capture of its answer
  };
  task<bool> forward(const RequestState& rq, std::shared_ptr<Exchange> ex);
  task<bool> relay_response(Forwarding& fw);
  void build_upstream_head(const RequestHead& head, const Framing& fr, const config::Route& route);
  task<std::optional<bool>> send_chunked_body(Forwarding& fw);
  task<bool> relay_interim(Forwarding& fw);
  bool frame_response(Forwarding& fw);
  void build_response_head(Forwarding& fw);
  task<std::optional<bool>> relay_length_body(Forwarding& fw);
  task<std::optional<bool>> relay_chunked_body(Forwarding& fw);
  void exchange_over(Forwarding& fw);
  bool linger_or_release(Forwarding& fw, const char* why, bool incomplete);
  task<bool> upstream_failed(Forwarding& fw, boost::system::error_code e, const char* stage);
  task<bool> upstream_answer_refused(Forwarding& fw, std::string detail, const char* log_line = nullptr,
                                     std::string_view log_error = {});
  enum class HeadRefusal { malformed, switched, length };
  HeadStatus scan_upstream_head(Forwarding& fw);
  task<bool> head_refused(Forwarding& fw, HeadRefusal why);
  task<bool> client_body_failed(Forwarding& fw, const char* why, bool too_large);
  bool client_went(Forwarding& fw);
  task<bool> retry_fresh(Forwarding& fw, boost::system::error_code e);
  bool body_failed(Forwarding& fw, const std::string& why);
  std::unique_ptr<UpConn> pooled_upstream(const config::Route& route);
  task<std::size_t> read_promptly(UpConn& up, boost::system::error_code& ec);
  void arm_abort(Exchange& x);
  // Issue 30: operation IDs (idempotency_path.cpp). idem_gate runs for a keyed write the fence
  // admitted: nullopt to forward it (rq.idem set if its key was recorded in flight), else it was
  // answered here (replay or refusal) and the result is whether the connection goes on.
  task<std::optional<bool>> idem_gate(RequestState& rq, Exchange& ex);
  // Reads the key and the body (idem_gate's first half; rq.idem_rider set if keyed). `early`:
  // before the fence decides a write that waits for an advance (so its key can be recorded in
  // the advance's commit): a missing or malformed key is left for idem_gate, after the fence.
  task<std::optional<bool>> idem_prepare(RequestState& rq, Exchange& ex, bool early);
  void idem_settle(idem::Keyed& k);    // the upstream's answer has ended: record, release or unknown
  void idem_after(RequestState& rq);   // after forward(): a key not settled reached upstream or not
  void idem_failed(idem::Keyed& k);    // the exchange failed: unknown if it reached upstream, else released
  void idem_capture_runs(Forwarding& fw, std::size_t first);  // body runs in sc_->gather from `first`
  task<bool> idem_answer(RequestState& rq, std::string response, std::uint64_t body_bytes);
  task<std::optional<std::uint64_t>> idem_read_body(RequestState& rq, idem::Fingerprint& fp);
  task<bool> idem_refuse(RequestState& rq, const Problem& p, const char* decision, IdemOutcome o,
                         std::uint64_t body_bytes, bool retry_after);
  // Takes the newest config snapshot if a reload installed one (one atomic load otherwise).
  void refresh_snapshot() {
    if (std::uint64_t v = rt_.snapshot_version(); v != snap_version_) {
      snap_version_ = v;
      snap_ = rt_.snapshot();
    }
  }
  // send_now() at the end of this reactor pass, with the pass's other sends (Worker::flush_sends).
  // `guard` (issue 33): the fenced exchange whose fleet membership is checked again at the flush.
  template <class Buffers>
  task<bool> send_soon(Socket& s, Buffers& bufs, boost::system::error_code& ec, const Exchange* guard = nullptr);
  template <class Buffers>
  task<bool> send_request(UpConn& up, Buffers& bufs, boost::system::error_code& ec);
  bool answered_early(UpConn& up);
  task<std::unique_ptr<UpConn>> connect_upstream(const config::Route& route, std::shared_ptr<Exchange>& ex,
                                                 boost::system::error_code& ec);
  void give_back(const config::Route& route, std::unique_ptr<UpConn> c);
  const std::string& pool_key(const config::Route& route) const;  // issue 27: per TLS context

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
  // TLS in the session (session_tls.cpp).
  // tls_read: some decrypted bytes (0 and *ec at the end, on an error, or when the watchdog
  //   cancels the wait). The records come through Asio's read, as plain bytes do (readiness.h's
  //   marks apply: set them before, as for a plain read).
  // tls_seal: encrypts all of `bufs` (records of at most 16 KiB) into the Scratch and points
  //   `bufs` at the records instead (the first piece; the others empty), for the caller's send as
  //   on a plain connection. No co_await of its own: the request path's coroutine frames stay
  //   the size they are for plain connections. False (and *ec) if the connection is broken.
  // tls_close: close_notify, once, before the descriptor closes (never blocks).
  // tls_buffered: records read and not yet decrypted, or decrypted and not yet taken: bytes the
  //   socket's readiness will not announce.
  // tls_shed: OpenSSL's record buffers go (kept while it holds bytes): when the connection parks,
  //   and before an idle wait while more than kTlsHotBuffers others of the worker wait.
  // tls_end: the session goes (close_notify if the descriptor is still open; the SSL freed).
  task<std::size_t> tls_read(net::mutable_buffer b, boost::system::error_code& ec);
  bool tls_seal(std::span<net::const_buffer> bufs, boost::system::error_code& ec);
  void tls_close();
  void tls_shed();
  bool tls_buffered() const { return ssl_ && tls_pending(); }  // plain connections: no call
  bool tls_pending() const;
  void tls_end();

  const config::Config& cfg() const { return *snap_->cfg; }
  void count(const std::string& resource, Outcome o) {
    w_.counters(rt_.metrics, resource)->by_outcome[static_cast<int>(o)].fetch_add(1, std::memory_order_relaxed);
  }

  ServerState& st_;
  Runtime& rt_;
  Worker& w_;
  Socket client_;
  std::unique_ptr<Scratch> sc_;  // while the connection is not parked
  std::uint64_t snap_version_ = 0;  // read before snap_: a newer install is never missed
  std::shared_ptr<const Snapshot> snap_;  // the config this request runs under
  std::string client_ip_;
  std::uint16_t client_port_ = 0;
  bool client_v6_ = false;
  std::string client_identity_;  // TLS (issue 27): the verified client certificate's identity, or ""
  ssl_st* ssl_ = nullptr;  // TLS (issue 27): the connection's OpenSSL state (owned), or null
  bool tls_done_ = false;  // close_notify sent, or the connection broke: no more records out
  bool tls_broken_ = false;  // an OpenSSL call failed for good: no more records either way
  TlsIo tls_io_;  // the session's BIO's state (TLS only)
  bool per_client_counted_ = false;  // counted in st_.per_client (max_connections_per_client)
  Clock::time_point deadline_ = Clock::time_point::max();
  bool timed_out_ = false;
  Clock::time_point cold_at_ = Clock::time_point::max();  // a hot idle read gives up its buffer then
  bool read_cancelled_to_go_cold_ = false;  // ... and the watchdog cancelled that read for it
  bool read_waits_on_mark_ = false;  // an idle read waits on a short read's mark (readiness.h), not a recv()
  bool read_cancelled_to_probe_ = false;  // ... and the watchdog cancelled it to try the read after all
  UpConn* waiting_up_ = nullptr;  // the upstream connection in use, for the watchdog
  Exchange* sending_ = nullptr;  // issue 33: the exchange forward() sends (fleet_allows_send)
  bool prompt_ = false;  // this request waited on another thread: read its answer promptly
  int parked_fd_ = -1;  // the client's descriptor while parked (client_ is empty)
  Session* prev_ = nullptr;
  Session* next_ = nullptr;
};

}  // namespace fencegate::proxy
