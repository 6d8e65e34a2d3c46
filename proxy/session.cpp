// The client session's request path: read and parse the head (run, scan_head), check it,
// route it once, admit it (the fence decision: proxy/admission.h), then forward it (relay.cpp);
// and the session's own replies (reply, refuse), reads and lingering close.
#include "proxy/session.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>

#include "proxy/authority.h"
#include "proxy/traceparent.h"

namespace fencegate::proxy {

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
    case HeadStatus::complete: *head_len = s.length; return 1;
    case HeadStatus::bad:
      sc_->out = local_reply(Problem{400, "bad-request", "Bad request", s.reason}, false, 11, kNoFenceHeaders);
      return -1;
    case HeadStatus::too_large:
      // A request line that alone does not fit is a target too long (RFC 9112 3: 414).
      if (data.substr(0, std::min<std::size_t>(data.size(), cfg.max_header_bytes)).find('\n') == std::string_view::npos)
        sc_->out = local_reply(Problem{414, "uri-too-long", "URI too long",
                                       "the request line exceeds " + std::to_string(cfg.max_header_bytes) + " bytes"},
                               false, 11, kNoFenceHeaders);
      else
        sc_->out = local_reply(Problem{431, "header-too-large", "Request header fields too large",
                                       "the request head exceeds " + std::to_string(cfg.max_header_bytes) + " bytes"},
                               false, 11, kNoFenceHeaders);
      return -1;
    default: return 0;
  }
}

// Gives back the memory an idle connection does not need while it waits (it is parking).
void Session::shed() {
  tls_shed();
  w_.give_back(std::move(sc_));
}

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
        // deadline (idle or head timeout) stays armed for the watchdog. Bytes OpenSSL holds
        // (a pipelined request read with the last one) would wake no one: read them now.
        if (tls_buffered()) {
          hot = true;
        } else {
          shed();
          co_return true;
        }
      }
      std::size_t room =
          std::min<std::size_t>(cfg().max_header_bytes + 4 - sc_->in.size(), !sc_->in.empty() ? 16384 : 4096);
      // A hot connection reads straight away (no readiness wait to register); if nothing comes
      // for kHotIdle the watchdog cancels the read and the connection waits cold, bufferless.
      const bool idle_wait = hot && sc_->in.empty();
      if (hot) cold_at_ = Clock::now() + kHotIdle;
      w_.hot_idle += idle_wait;
      // TLS: a connection waiting for its next request keeps OpenSSL's record buffers only
      // while few others wait on this worker (they would stay resident, see tls_shed).
      if (idle_wait && w_.hot_idle > kTlsHotBuffers) tls_shed();
      // Waiting for the next request, a read right after a short one waits without a recv()
      // that fails (readiness.h). Reads of the rest of a head try first, so that an EOF is seen
      // at once, and so does the wait after a connection's first answer: a client that sent its
      // one request and its EOF together (their epoll edges merged) is closed at once. From the
      // second answer on, a connection is taken to be kept alive; if it then stays idle past a
      // watchdog tick, the watchdog has the read try after all (probe).
      // On TLS the rule holds for the socket under the records, while OpenSSL holds none.
      const bool trust = sc_->in.empty() && answered >= 2 && !probe && !tls_buffered();
      if (!trust) readiness::unknown(client_);
      read_waits_on_mark_ = trust;
      probe = false;
      const std::size_t asked = std::max<std::size_t>(room, 1);
      std::size_t n = 0;
      if (ssl_) n = co_await tls_read(sc_->in.prepare(asked), ec);
      else n = co_await client_.async_read_some(sc_->in.prepare(asked), net::redirect_error(use_task, ec));
      read_waits_on_mark_ = false;
      const bool probed = read_cancelled_to_probe_;
      read_cancelled_to_probe_ = false;
      if (!ec && !ssl_) readiness::drained(client_, n, asked);
      w_.hot_idle -= idle_wait;
      sc_->in.commit(n);
      cold_at_ = Clock::time_point::max();
      const bool went_cold = read_cancelled_to_go_cold_;
      read_cancelled_to_go_cold_ = false;
      hot = false;
      if (went_cold && n == 0 && !timed_out_ && ec == net::error::operation_aborted) continue;
      if (probed && n == 0 && !timed_out_ && ec == net::error::operation_aborted) {
        hot = true;  // the same hot wait goes on, its read trying first
        probe = true;
        continue;
      }
      if (timed_out_) {
        if (!sc_->in.empty()) {
          sc_->out =
              local_reply(Problem{408, "request-timeout", "Request timeout", "the request head did not arrive in time"},
                          false, 11, kNoFenceHeaders);
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
      net::const_buffer one = net::buffer(sc_->out);
      if (!ssl_ || tls_seal({&one, 1}, ec)) co_await net::async_write(client_, one, net::redirect_error(use_task, ec));
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
  tls_close();
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
  log::error("request failed",
             {log::kv("error", e.what()), log::kv("client", client_ip_), log::kv("client_port", client_port_)});
}

task<boost::system::error_code> Session::read_client(std::size_t want, std::chrono::milliseconds timeout) {
  arm(timeout);
  boost::system::error_code ec;
  std::size_t n = 0;
  readiness::unknown(client_);  // body reads try first: a client that left is seen at once
  if (ssl_) {
    n = co_await tls_read(sc_->in.prepare(want), ec);
  } else {
    n = co_await client_.async_read_some(sc_->in.prepare(want), net::redirect_error(use_task, ec));
    if (!ec) readiness::drained(client_, n, want);
  }
  disarm();
  sc_->in.commit(n);
  if (timed_out_) ec = net::error::timed_out;
  co_return ec;
}

// Answers with a local reply (proxy/local_reply.h); a fenced request's problem names its resource
// and generations even when it is not a fence decision (502, 504, 408, ...).
task<bool> Session::reply(const Problem& p, bool keep_alive, int version, const FenceHeaders& fence) {
  std::string r;
  if (fence.generation && p.resource.empty() && !fence.resource.empty()) {
    Problem q = p;
    q.resource = std::string(fence.resource);
    q.presented = fence.presented;
    q.current = fence.generation;
    r = local_reply(q, keep_alive, version, fence, sc_->head_method);
  } else {
    r = local_reply(p, keep_alive, version, fence, sc_->head_method);
  }
  timed_out_ = false;
  arm(cfg().body_timeout);
  boost::system::error_code ec;
  net::const_buffer one = net::buffer(r);
  if (!ssl_ || tls_seal({&one, 1}, ec)) co_await net::async_write(client_, one, net::redirect_error(use_task, ec));
  co_return !settle(ec) && keep_alive;
}

// Before a close with request bytes still unread: stop sending and read (and drop) what the
// client still sends, for a while. Closing a socket with unread data resets the connection, and a
// client still writing its body would see the reset rather than our answer (RFC 9112 9.6).
task<void> Session::linger_close() {
  constexpr auto kLingerTime = std::chrono::seconds(2);
  constexpr std::uint64_t kLingerBytes = 16u << 20;
  boost::system::error_code ec;
  tls_close();
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
  row.traceparent = traceparent_of(sc_->head);  // the caller's trace, to find the refusal from it
  row.client_identity = client_identity_;        // TLS (issue 27)
  auto slot = std::make_shared<CrossThreadResult<store::Status>>(w_);
  rt_.store.append_audit(std::move(row),
                         [slot](store::Status st) { CrossThreadResult<store::Status>::fulfil(slot, std::move(st)); });
  co_return co_await slot->wait();
}

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
  if (ssl_) return false;  // the kernel's queue holds records, not body bytes: relayed as usual
  int queued = 0;
  if (::ioctl(fd, FIONREAD, &queued) != 0 || queued < 0) return false;
  readiness::unknown(client_);
  const std::string_view held = sc_->in.view().substr(head_len);
  if (!fr.chunked) return fr.content_length && held.size() + static_cast<std::uint64_t>(queued) < *fr.content_length;
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

// One request, top to bottom: check the head, route it (once), admit it (the fence decision,
// proxy/admission.h), forward it (relay.cpp). Every refusal is answered through reply().
task<bool> Session::handle(std::size_t head_len) {
  RequestState& rq = sc_->rq;  // the Scratch stays while the request runs
  rq = RequestState{};
  start_request(rq, head_len);
  // 1. The head's own checks. A refusal here still carries Fencing-Generation when the path
  // routes to a fenced resource, as every answer to a fenced request does.
  if (!head_acceptable(rq)) co_return co_await reply(sc_->problem, false, rq.version, early_fence_headers(rq));
  // 2. Route: the resource comes from the route and the path, never from a header.
  route_request(rq);
  if (rq.match.outcome == config::Router::Outcome::bad_target) {
    sc_->problem = Problem{400, "bad-target", "Bad request", rq.match.reason};
    co_return co_await reply(sc_->problem, false, rq.version, kNoFenceHeaders);
  }
  if (rq.match.outcome == config::Router::Outcome::no_route) {
    sc_->problem = Problem{404, "no-route", "Not found", "no route matches this path"};
    co_return co_await refuse(rq, sc_->problem, kNoFenceHeaders);
  }
  const config::Route& route = *rq.match.route;
  rq.fenced = route.mode != Mode::off && route.is_fenced(sc_->head.method);
  if (rq.fenced) rq.fence.resource = rq.match.resource;
  // TLS (issue 27): the route's allowed_clients, before anything touches the fence.
  if (!route.allowed_clients.empty() && !config::client_allowed(route.allowed_clients, client_identity_))
    co_return co_await refuse_client(rq);
  if (rq.framing.content_length && *rq.framing.content_length > cfg().max_body_bytes) {
    if (rq.fenced) rq.fence.generation = rt_.fence.current(rq.match.resource);
    sc_->problem = Problem{413, "body-too-large", "Content too large",
                           "the body exceeds " + std::to_string(cfg().max_body_bytes) + " bytes"};
    co_await reply(sc_->problem, false, rq.version, rq.fence);
    co_await linger_close();
    co_return false;
  }
  // 3. Admit. Most writes are decided at once (the fast path, or stale); only an advance waits.
  auto ex = std::make_shared<Exchange>(rt_.fence);
  if (rq.fenced) {
    const AdmitNow now = admit_now(rq, *ex);
    if (now != AdmitNow::forward) {
      bool answered = false;
      const bool keep = co_await admit_after_wait(rq, *ex, now, &answered);
      if (answered) co_return keep;
    }
  }
  // Observe mode: the write is in flight until its exchange ends, so that a switch to enforce
  // drains it before the first enforce write goes (Fence::track_observed).
  if (rq.fenced && route.mode == Mode::observe) {
    arm_abort(*ex);
    rt_.fence.track_observed(fence_resource(rq, !route.fenced_only), &ex->node);
  }
  // Issue 30: operation IDs (idempotency_path.cpp), only for a keyed write the fence admitted.
  if (rq.fenced && route.idempotency && route.is_keyed(sc_->head.method)) {
    const std::optional<bool> answered = co_await idem_gate(rq, *ex);
    if (answered) co_return *answered;
  }
  // 4. Forward.
  const bool keep = co_await forward(rq, std::move(ex));
  if (rq.idem) idem_after(rq);  // issue 30: a key whose answer did not end is released or unknown
  co_return keep;
}

// The request's values from its head: framing, keep-alive intent, HEAD.
void Session::start_request(RequestState& rq, std::size_t head_len) {
  const RequestHead& head = sc_->head;  // scanned by run()
  rq.head_len = head_len;
  rq.version = head.version;
  rq.routed = false;
  rq.fenced = false;
  rq.fence = FenceHeaders{};
  rq.expect_continue = false;  // set once Expect is validated
  sc_->head_method = head.method == "HEAD";
  rq.framing = check_framing(head);
  const auto& cfg = this->cfg();
  if (rq.framing.ok && !(cfg.token_header == "Fencing-Token" && cfg.leader_header == "Fencing-Leader")) {
    // Configured names: their "_" spellings are refused as check_framing refuses the defaults'.
    for (const auto& f : head.fields)
      if (f.kind == FieldKind::other &&
          (underscore_alias(f.name, cfg.token_header) || underscore_alias(f.name, cfg.leader_header))) {
        rq.framing.ok = false;
        rq.framing.reason = "header " + std::string(f.name) + " reads as " +
                            (underscore_alias(f.name, cfg.token_header) ? cfg.token_header : cfg.leader_header) +
                            " to CGI-style servers (\"_\" for \"-\")";
        break;
      }
  }
  const Framing& fr = rq.framing;
  rq.has_body = fr.chunked || (fr.content_length && *fr.content_length > 0);
  // Client keep-alive intent (before we touch the header).
  bool close = false, keep = false;
  if (head.has(FieldKind::connection))
    for (const auto& f : head.fields)
      if (f.kind == FieldKind::connection)
        for_each_token(f.value, [&](std::string_view t) {
          if (iequals(t, "close")) close = true;
          if (iequals(t, "keep-alive")) keep = true;
        });
  rq.client_keep_alive = rq.version == 11 ? !close : (keep && !close);
}

// The checks of the head before routing: framing, CONNECT and upgrades (501), a Connection
// header naming an end-to-end field, Expect (417). False with sc_->problem set when refused (the
// connection closes after the reply).
bool Session::head_acceptable(RequestState& rq) {
  const RequestHead& head = sc_->head;
  const auto& cfg = this->cfg();
  if (!rq.framing.ok) {
    sc_->problem = Problem{400, "bad-framing", "Bad request", rq.framing.reason};
    return false;
  }
  if (head.method == "CONNECT" || head.has(FieldKind::upgrade)) {
    sc_->problem =
        Problem{501, "not-implemented", "Not implemented", "CONNECT and protocol upgrades are not supported"};
    return false;
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
      return false;
    }
  }
  std::string_view ev;
  std::size_t ne = 0;
  if (head.has(FieldKind::expect))
    for (const auto& f : head.fields)
      if (f.kind == FieldKind::expect && ne++ == 0) ev = f.value;
  if (ne > 1 || (ne == 1 && !iequals(ev, "100-continue"))) {
    sc_->problem =
        Problem{417, "expectation-failed", "Expectation failed", "only \"Expect: 100-continue\" is supported"};
    return false;
  }
  rq.expect_continue = ne == 1 && rq.version == 11;
  return true;
}

// The fence headers of a refusal made before routing: the request is routed for them (and not
// again after).
const FenceHeaders& Session::early_fence_headers(RequestState& rq) {
  route_request(rq);
  const config::Router::Match& m = rq.match;
  if (m.outcome == config::Router::Outcome::matched && m.route->mode != Mode::off &&
      m.route->is_fenced(sc_->head.method)) {
    rq.fence.generation = rt_.fence.current(m.resource);
    rq.fence.resource = m.resource;
  }
  return rq.fence;
}

void Session::route_request(RequestState& rq) {
  if (rq.routed) return;
  rq.match = snap_->router.match(sc_->head.target);
  rq.routed = true;
}

// The request's resource in the fence (the worker keeps the last one found). `may_create` false
// (a fenced_only route): a resource not held is not made (nullptr), so a write that is then refused
// takes no room in the fence.
FenceResource* Session::fence_resource(const RequestState& rq, bool may_create) {
  return w_.last_fence.get(rq.match.resource, [this, may_create, &rq](const std::string& r) {
    const config::Route& route = *rq.match.route;
    return rt_.fence.find(r, may_create, Fence::RouteQuota{route.prefix, route.max_resources});
  });
}

AdmissionInput Session::admission_input(const RequestState& rq) const {
  const RequestHead& head = sc_->head;
  AdmissionInput in;
  in.kind = AdmissionKind::write;
  in.mode = rq.match.route->mode;
  in.fenced_only = rq.match.route->fenced_only;
  in.resource = &rq.match.resource;
  in.token = &rq.token;
  if (rq.authority) {
    in.authority = &*rq.authority;
    in.election = rq.match.route->authority->election;
  }
  in.request = &head;
  in.client = client_ip_;
  in.token_header = cfg().token_header;
  return in;
}

// The admission decision as far as it needs no wait: the token, the election authority (a
// lookup in memory), and the fence's decision when it can be made at once. Nearly every write
// is forwarded from here (and all of that without an allocation on the fast path).
Session::AdmitNow Session::admit_now(RequestState& rq, Exchange& ex) {
  const config::Route& route = *rq.match.route;
  read_token(sc_->head, cfg(), &rq.token);
  const bool token_ok = rq.token.state == TokenState::ok;
  const std::int64_t g = rq.token.generation;
  if (token_ok) rq.fence.presented = g;
  // Authority-linked fencing: etcd's view of the election decides before the fence does.
  rq.authority.reset();
  if (token_ok)
    if (Authority* au = st_.authorities ? st_.authorities->for_route(route) : nullptr) rq.authority = au->check(g);
  AdmissionInput in = admission_input(rq);
  Admission& a = rq.admission;
  a = decide_admission(in, rt_.fence);
  if (a.step == AdmissionStep::ask_fence) {
    const bool enforce = route.mode == Mode::enforce;
    if (enforce) arm_abort(ex);
    const bool may_create = may_create_resource(in);
    if (!rt_.fence.decide_now(fence_resource(rq, may_create), g, enforce ? &ex.node : nullptr, &rq.decision,
                              may_create))
      return AdmitNow::wait_fence;
    in.fence = &rq.decision;
    a = decide_admission(in, rt_.fence);
  }
  if (a.step == AdmissionStep::refuse) return AdmitNow::refuse;
  admitted(rq);
  return AdmitNow::forward;
}

// An admitted write: its fence headers, its would-be refusal's audit row (observe), counted.
void Session::admitted(RequestState& rq) {
  Admission& a = rq.admission;
  rq.fence.generation = a.generation;
  if (!a.observe.empty()) rq.fence.observe = a.observe;
  if (a.audit) {
    a.audit->traceparent = traceparent_of(sc_->head);
    a.audit->client_identity = client_identity_;  // TLS (issue 27)
    rt_.store.append_audit(std::move(*a.audit), nullptr);
  }
  note_admission(a, rq);
}

// The rest of the admission when it waits: for the fence (an advance: a drain, a commit), then
// for a refusal's audit row to be durable. *answered: the request was answered here (or its
// client left); the result is then whether the connection goes on.
task<bool> Session::admit_after_wait(RequestState& rq, Exchange& ex, AdmitNow state, bool* answered) {
  Admission& a = rq.admission;
  *answered = true;
  if (state == AdmitNow::wait_fence) {
    const std::int64_t g = rq.token.generation;
    const std::string& resource = rq.match.resource;
    auto slot = std::make_shared<CrossThreadResult<Decision>>(w_);
    auto later = [slot](Decision dd) { CrossThreadResult<Decision>::fulfil(slot, dd); };
    const bool may_create = may_create_resource(admission_input(rq));
    // Issue 30: a keyed write that waits for an advance has its key recorded in the advance's
    // commit (one fsync for both): its key and body are read first (idempotency_path.cpp).
    const bool enforce = rq.match.route->mode == Mode::enforce;
    if (enforce && rq.match.route->idempotency && rq.match.route->is_keyed(sc_->head.method))
      if (std::optional<bool> gone = co_await idem_prepare(rq, ex, true)) co_return *gone;
    const bool now = enforce ? rt_.fence.admit(resource, g, rq.token.leader, &ex.node, &rq.decision, later, may_create,
                                               rq.idem_rider)
                             : rt_.fence.observe(resource, g, rq.token.leader, &rq.decision, later, may_create);
    if (!now) {
      rq.decision = co_await slot->wait();
      prompt_ = true;
      // It waited (a drain, a commit): a client that closed meanwhile before its body was
      // whole can never complete this request. It is not sent late, cut off, to an upstream.
      if (rq.decision.verdict == Verdict::admit && rq.has_body && body_abandoned(rq.framing, rq.head_len)) {
        log::info("client closed before its body was whole while its write waited for the fence: not forwarded",
                  {log::kv("resource", resource), log::kv("generation", g)});
        if (rq.idem_rider) rt_.store.abandon(rq.idem_rider);  // issue 30
        co_return false;
      }
    }
    AdmissionInput in = admission_input(rq);
    in.fence = &rq.decision;
    a = decide_admission(in, rt_.fence);
    if (a.step != AdmissionStep::refuse) {
      admitted(rq);
      *answered = false;
      co_return true;
    }
    if (rq.idem_rider) rt_.store.abandon(rq.idem_rider);  // issue 30: not admitted, its key goes
  }
  // A refusal. In enforce mode it is answered only once its audit row is durable; when the store
  // cannot make it so, the request fails closed (503).
  rq.fence.generation = a.generation;
  if (a.audit && a.audit_durable) {
    store::Status st = co_await audit_sync(*a.audit);
    if (!st.ok()) audit_failed(a, st);
  }
  note_admission(a, rq);
  co_return co_await refuse(rq, a.refusal, rq.fence);
}

// TLS (issue 27): 403 client-not-allowed, answered once its audit row is durable (else 503).
task<bool> Session::refuse_client(RequestState& rq) {
  read_token(sc_->head, cfg(), &rq.token);  // for the audit row
  Admission a = client_not_allowed(admission_input(rq), client_identity_);
  if (rq.fenced) rq.fence.generation = rt_.fence.current(rq.match.resource);
  log::warn("refused request: client identity not in the route's allowed_clients",
            {log::kv("resource", rq.match.resource), log::kv("client", client_ip_),
             log::kv("client_identity", client_identity_), log::kv("method", sc_->head.method)});
  store::Status st = co_await audit_sync(*a.audit);
  if (!st.ok()) audit_failed(a, st);
  count(rq.match.resource, *a.outcome);
  co_return co_await refuse(rq, a.refusal, rq.fence);
}

// Every rejection (and would-be rejection) is counted and logged with its context.
void Session::note_admission(const Admission& a, const RequestState& rq) {
  if (!a.outcome) return;
  const Outcome o = *a.outcome;
  const std::string& resource = rq.match.resource;
  const std::int64_t g = rq.token.generation;
  count(resource, o);
  switch (o) {
    case Outcome::authority_unavailable:
      log::warn("rejected write: election authority unavailable",
                {log::kv("decision", "authority_unavailable"), log::kv("resource", resource),
                 log::kv("presented_generation", g), log::kv("election", rq.match.route->authority->election),
                 log::kv("why", rq.authority->why), log::kv("leader", rq.token.leader), log::kv("client", client_ip_)});
      return;
    case Outcome::too_many_resources: {
      // Counted under the resource's label (Metrics caps the label set: a flood of new names
      // lands in "_other") and logged, the first time and then once per 1000.
      static std::atomic<std::uint64_t> over_cap{0};
      if (over_cap.fetch_add(1, std::memory_order_relaxed) % 1000 != 0) return;
      if (a.step == AdmissionStep::forward)
        log::warn(
            "observe mode: the fence holds max_resources resources; forwarding without tracking "
            "(logged once per 1000)",
            {log::kv("resource", resource), log::kv("max_resources", cfg().max_resources)});
      else
        log::warn("rejected write: the fence holds max_resources resources (503; logged once per 1000)",
                  {log::kv("resource", resource), log::kv("max_resources", cfg().max_resources)});
      return;
    }
    case Outcome::store_error:
      if (a.step == AdmissionStep::forward) {
        log::warn(
            "observe mode: could not store the generation; the write is forwarded and the "
            "generation retried until it is stored",
            {log::kv("resource", resource), log::kv("generation", g), log::kv("stored", rq.decision.current)});
        return;
      }
      break;
    default: break;
  }
  const bool would = to_string(o).starts_with("would_");
  log::write(would ? log::Level::info : log::Level::warn, would ? "would reject write" : "rejected write",
             {log::kv("decision", to_string(o)), log::kv("resource", resource), log::kv("presented_generation", g),
              log::kv("current_generation", a.current), log::kv("leader", rq.token.leader),
              log::kv("client", client_ip_), log::kv("client_identity", client_identity_),  // TLS (issue 27)
              log::kv("method", sc_->head.method), log::kv("target", sc_->head.target.substr(0, 256)),
              log::kv("traceparent", traceparent_of(sc_->head))});
}

// A request refused before its body was read keeps the connection only if its body is small
// and Content-Length framed: the body is then read and discarded. Otherwise the connection
// closes after the reply.
task<bool> Session::refuse(const RequestState& rq, const Problem& p, const FenceHeaders& fence) {
  const Framing& fr = rq.framing;
  const bool can_skip = rq.client_keep_alive &&
                        (!rq.has_body || (!fr.chunked && !rq.expect_continue && *fr.content_length <= kDiscardLimit));
  if (!co_await reply(p, can_skip, rq.version, fence)) {
    if (rq.has_body) co_await linger_close();  // the body it may still be sending is not read
    co_return false;
  }
  sc_->in.consume(rq.head_len);
  if (rq.has_body) co_return co_await discard(*fr.content_length);
  co_return true;
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

bool Session::count_client() {
  const std::size_t limit = rt_.snapshot()->cfg->max_connections_per_client;
  if (limit == 0) return true;
  std::lock_guard lk(st_.per_client_mu);
  std::size_t& n = st_.per_client[client_ip_];
  if (n >= limit) {
    if (n == 0) st_.per_client.erase(client_ip_);
    return false;
  }
  ++n;
  per_client_counted_ = true;
  return true;
}

void Session::uncount_client() {
  std::lock_guard lk(st_.per_client_mu);
  auto it = st_.per_client.find(client_ip_);
  if (it != st_.per_client.end() && --it->second == 0) st_.per_client.erase(it);
}

}  // namespace fencegate::proxy
