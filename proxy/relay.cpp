// Forwarding: the request head and body sent upstream (send_request, watching for an early
// answer) and the response relayed back. The upstream connection (pooled or new, TLS for an
// https:// upstream) is in relay_upstream.cpp; failures and the lingering of a fenced write whose
// exchange failed while the upstream may still apply it in relay_failure.cpp.
//
// The relay is our own, on plain Asio sockets: request heads come from the strict scanner in
// proxy/head.h, bodies are framed by Content-Length or by proxy/framing.h's chunk decoder, and
// every message that goes out (upstream or to the client) gets a head built here, so nothing
// passes through that this file did not parse. Per request in the common case that is one read
// from the client, one gather write upstream, one read of the response, one gather write back;
// the writes of one event-loop pass go out together, in one io_uring submission where the
// kernel allows it (Worker::flush_sends).
#include <sys/socket.h>

#include <cstring>

#include "common/log.h"
#include "proxy/forwarded.h"
#include "proxy/session.h"

namespace fencegate::proxy {

namespace {

// A bodiless GET, HEAD or OPTIONS that the route does not count as a write (write_methods may
// name GET): safe to send again (RFC 9110 9.2.1, RFC 9112 9.3.1).
bool safe_to_send_again(const RequestHead& head, const RequestState& rq) {
  const Framing& fr = rq.framing;
  return (head.method == "GET" || head.method == "HEAD" || head.method == "OPTIONS") &&
         !rq.match.route->is_fenced(head.method) && !fr.chunked && fr.content_length.value_or(0) == 0 &&
         !rq.expect_continue;
}

}  // namespace

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
task<bool> Session::send_soon(Socket& s, Buffers& bufs, boost::system::error_code& ec, const Exchange* guard) {
  if (!cfg().io_uring || !w_.batching()) co_return send_now(s, bufs, ec);
  ec.clear();
  Worker::QueuedSend q;
  std::size_t total = 0;
  const std::size_t n = to_iov(bufs, q.iov, &total);
  if (n > q.iov.size()) co_return false;  // more pieces than one call takes: all through Asio
  if (total == 0) co_return true;
  q.sock = &s;
  if (guard) {
    q.fence = &guard->fence;
    q.node = &guard->node;
  }
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
// Issue 30: idempotency_path.cpp sends replays and its refusals through the batched send path too.
template task<bool> Session::send_soon(Socket&, std::array<net::const_buffer, 1>&, boost::system::error_code&,
                                       const Exchange*);

// Sends request bytes upstream; `bufs` is advanced past what went. A send that cannot go at
// once waits for room while watching the upstream, since a server may answer before it has read
// the whole request (an early 413 or 401) and then stop reading, or close: returns true iff it
// answered so (answered_early), and the rest of the request is then not sent. *ec: how the send
// went (a watchdog cancellation shows up in timed_out_).
template <class Buffers>
task<bool> Session::send_request(UpConn& up, Buffers& bufs, boost::system::error_code& ec) {
  for (;;) {
    if (sending_ && !sending_->fence.fleet_allows_send(sending_->node)) {  // issue 33 (docs/fleet.md)
      sending_->aborted = true;  // as the fleet thread's abort would: nothing more goes upstream
      up.sock.close(ec);
      ec = net::error::operation_aborted;
      co_return false;
    }
    if (co_await send_soon(up.sock, bufs, ec, sending_)) co_return false;
    // Not sent: membership lapsed between the check above and the flush (issue 33).
    if (ec == boost::system::errc::connection_aborted && sending_ && !sending_->fence.fleet_allows_send(sending_->node))
      continue;
    // A reset after an answer leaves the answer readable; with nothing there, the send failed.
    if (ec) co_return answered_early(up) && !up.buf.empty();
    // Issue 33: in a fleet, bytes that have to wait for room are not handed to a write that would
    // send them whenever room comes (after a stop, say, with the membership gone): the wait is for
    // room only, and the loop's top checks the membership again before they go.
    const bool guarded = sending_ && sending_->fence.fleet_gated(sending_->node);
    if (up.duplex) {  // its answer is under way and it still reads: just send
      if (guarded) {
        co_await up.sock.async_wait(Socket::wait_write, net::redirect_error(use_task, ec));
        if (!ec) continue;
        co_return false;
      }
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
    std::size_t n = 0;
    if (guarded) co_await up.sock.async_wait(Socket::wait_write, net::redirect_error(use_task, ec));
    else n = co_await net::async_write(up.sock, bufs, net::redirect_error(use_task, ec));
    watch->over = true;
    if (!watch->fired) {
      boost::system::error_code ignored;
      up.sock.cancel(ignored);  // ends the wait (its handler does nothing now)
      if (guarded && !ec) continue;  // room: sent from the top, after the membership check
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

// Forwards one admitted request and relays its answer, in stages: the upstream head, an upstream
// connection, the request (head and body), the response head, its framing, the client's head,
// the response body. Returns whether the client connection goes on.
task<bool> Session::forward(const RequestState& rq, std::shared_ptr<Exchange> ex) {
  const auto& cfg = this->cfg();
  const RequestHead& head = sc_->head;
  const Framing& fr = rq.framing;
  const config::Route& route = *rq.match.route;
  Forwarding fw{
      route, rq.match.resource, rq.fence, std::move(ex), head.version, head.method == "HEAD", rq.client_keep_alive};
  fw.keyed = rq.idem.get();  // issue 30
  Exchange& x = *fw.ex;
  sending_ = &x;  // issue 33: for send_request's fleet check; only used inside forward()
  boost::system::error_code ec;
  timed_out_ = false;
  count(fw.resource, Outcome::forwarded);
  build_upstream_head(head, fr, route);
  const bool safe_bodiless = safe_to_send_again(head, rq);
  sc_->in.consume(rq.head_len);  // `head` is not used past this point

  // Upstream connection.
  std::unique_ptr<UpConn> conn = pooled_upstream(route);
  const bool reused = conn != nullptr;
  if (!conn) conn = co_await connect_upstream(route, fw.ex, ec);
  if (ec || x.aborted) co_return co_await upstream_failed(fw, ec ? ec : net::error::operation_aborted, "connect");
  x.up = std::move(conn);
  UpConn& up = *x.up;
  // A pooled connection the upstream closes just as it is reused (its keep-alive timeout: a race
  // no peek can close) fails a request its application never saw. A bodiless GET, HEAD or
  // OPTIONS is safe to send again (RFC 9110 9.2.1, RFC 9112 9.3.1): once, on a new connection,
  // when nothing at all came back (retry_fresh). Anything with a body, writes above all, is not.
  fw.may_retry = reused && safe_bodiless;
  up.duplex = false;
  waiting_up_ = &up;
  if (rq.expect_continue) {
    static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    arm(cfg.body_timeout);
    net::const_buffer one = net::buffer(kContinue);
    if (!ssl_ || tls_seal({&one, 1}, ec)) co_await net::async_write(client_, one, net::redirect_error(use_task, ec));
    if (settle(ec)) co_return false;
  }

  // Request: the head with the first body bytes in one write, then the rest as it arrives.
  // An upstream may answer before it has the whole request (early): that answer is relayed, the
  // rest of the body is not sent, and both connections close after it (the client's body is
  // left unread).
  // (Each co_await of a stage is a statement of its own: GCC 12 mishandles one inside a condition
  // or a conditional expression.)
  if (fr.chunked) {
    const std::optional<bool> done = co_await send_chunked_body(fw);
    if (done) co_return *done;
  } else {
    std::uint64_t left = fr.content_length.value_or(0);
    std::size_t pre = static_cast<std::size_t>(std::min<std::uint64_t>(left, sc_->in.size()));
    arm(cfg.upstream_timeout);
    std::array<net::const_buffer, 2> b{net::buffer(sc_->out), net::buffer(sc_->in.view().data(), pre)};
    fw.sent = true;
    if (fw.keyed) fw.keyed->cap.sent = true;  // issue 30
    fw.early = co_await send_request(up, b, ec);
    ec = settle(ec);
    if (ec && !fw.early && co_await retry_fresh(fw, ec)) ec.clear();
    if (ec && !fw.early) co_return co_await upstream_failed(fw, ec, "send");
    sc_->in.consume(pre);
    left -= pre;
    while (left > 0 && !fw.early) {
      ec =
          co_await read_client(static_cast<std::size_t>(std::min<std::uint64_t>(left, kRelayBuffer)), cfg.body_timeout);
      if (ec) co_return co_await client_body_failed(fw, nullptr, false);
      std::size_t n = std::min<std::size_t>(sc_->in.size(), static_cast<std::size_t>(left));
      arm(cfg.upstream_timeout);
      std::array<net::const_buffer, 1> piece{net::buffer(sc_->in.view().data(), n)};
      fw.sent = true;
      fw.early = co_await send_request(up, piece, ec);
      ec = settle(ec);
      if (ec && !fw.early) co_return co_await upstream_failed(fw, ec, "send");
      sc_->in.consume(n);
      left -= n;
    }
  }

  co_return co_await relay_response(fw);
}

// The upstream's answer to a request forward() sent, relayed to the client. A coroutine of its
// own: forward()'s frame holding both halves was larger than Asio recycles (a malloc and a free
// per request).
task<bool> Session::relay_response(Forwarding& fw) {
  const auto& cfg = this->cfg();
  const config::Route& route = fw.route;
  Exchange& x = *fw.ex;
  UpConn& up = *x.up;
  boost::system::error_code ec;
  // Response head, after any interim 1xx answers.
  // (The refusals' messages are built in head_refused's frame: strings made inside a co_await
  // expression here would each hold a slot of this frame for the whole exchange.)
  ResponseHead& rh = sc_->resp;
  for (;;) {
    if (!up.buf.empty()) {
      const HeadStatus s = scan_upstream_head(fw);
      if (s == HeadStatus::complete) {
        if (rh.status < 100 || rh.status >= 200 || rh.status == 101) break;
        if (!co_await relay_interim(fw)) co_return false;
        continue;
      }
      if (s != HeadStatus::incomplete) co_return co_await head_refused(fw, HeadRefusal::malformed);
    }
    arm(cfg.upstream_timeout);
    std::size_t got =
        prompt_ ? co_await read_promptly(up, ec)
                : co_await up.sock.async_read_some(up.buf.prepare(kRelayBuffer), net::redirect_error(use_task, ec));
    prompt_ = false;
    up.buf.commit(got);
    ec = settle(ec);
    if (ec && co_await retry_fresh(fw, ec)) continue;
    if (ec) co_return co_await upstream_failed(fw, ec, "response");
  }
  if (rh.status == 101) co_return co_await head_refused(fw, HeadRefusal::switched);
  if (!frame_response(fw)) co_return co_await head_refused(fw, HeadRefusal::length);
  if (fw.keyed) fw.keyed->cap.head(rh);  // issue 30
  build_response_head(fw);

  // Response body.
  if (fw.body == ResponseBody::none) {
    exchange_over(fw);
    arm(cfg.body_timeout);
    std::array<net::const_buffer, 1> b{net::buffer(sc_->out)};
    // TLS: the records replace the bytes first, in a branch of their own (GCC 12 got
    // `(!ssl_ || tls_seal(b, ec)) && !co_await send_soon(client_, b, ec)` wrong: plaintext went).
    if (ssl_ && !tls_seal(b, ec)) {
      // broken: *ec says so
    } else if (!co_await send_soon(client_, b, ec) && !ec) {
      co_await net::async_write(client_, b, net::redirect_error(use_task, ec));
    }
    if (settle(ec)) co_return false;
  } else if (fw.body == ResponseBody::length) {
    const std::optional<bool> done = co_await relay_length_body(fw);
    if (done) co_return *done;
  } else {
    const std::optional<bool> done = co_await relay_chunked_body(fw);
    if (done) co_return *done;
  }
  waiting_up_ = nullptr;
  x.release();
  if (fw.up_reusable && !x.aborted && up.buf.empty()) give_back(route, std::move(x.up));
  co_return fw.keep && !fw.client_gone;
}

// The upstream's response head in sc_->resp once it is complete (fw.rh_len: its bytes).
HeadStatus Session::scan_upstream_head(Forwarding& fw) {
  const HeadScan s = scan_response_head(fw.ex->up->buf.view(), kMaxResponseHeader, &sc_->resp);
  if (s.status == HeadStatus::complete) fw.rh_len = s.length;
  return s.status;
}

// A response head fencegate does not relay: 502.
task<bool> Session::head_refused(Forwarding& fw, HeadRefusal why) {
  const std::string& upstream = fw.route.upstream;
  if (why == HeadRefusal::switched) co_return co_await upstream_answer_refused(fw, "the upstream switched protocols");
  if (why == HeadRefusal::length)
    co_return co_await upstream_answer_refused(fw, "upstream " + upstream + ": invalid or conflicting Content-Length");
  // Scanned again for the reason (only this path needs it).
  const HeadScan s = scan_response_head(fw.ex->up->buf.view(), kMaxResponseHeader, &sc_->resp);
  const std::string reason = s.status == HeadStatus::bad ? s.reason : "response head too large";
  co_return co_await upstream_answer_refused(fw, "upstream " + upstream + ": malformed response: " + reason,
                                             "upstream sent a bad response", reason);
}

// The upstream request head: hop-by-hop fields go (RFC 9110 7.6.1), X-Forwarded-For and
// Forwarded get the client appended (a client Forwarded value that does not parse is dropped
// first), framing is restated from what was validated. Into sc_->out.
void Session::build_upstream_head(const RequestHead& head, const Framing& fr, const config::Route& route) {
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
        if (f.kind == FieldKind::forwarded && !valid_forwarded(f.value)) {
          // Not RFC 7239 (an unterminated quote would swallow the element appended below).
          rt_.metrics.forwarded_dropped.fetch_add(1, std::memory_order_relaxed);
          log::debug("dropped a client Forwarded value that is not RFC 7239 syntax", {log::kv("client", client_ip_)});
          continue;
        }
        std::string& acc = f.kind == FieldKind::forwarded ? fwd : xff;
        if (!acc.empty()) acc += ", ";
        acc += f.value;
        continue;
      }
      default:
        if (is_hop_by_hop(f.kind) || named_by_connection(head, f.name)) continue;
        // TLS (issue 27): only our identity header goes on (nor a "_" spelling CGI reads as it).
        if (iequals(f.name, cfg().client_identity_header) || underscore_alias(f.name, cfg().client_identity_header))
          continue;
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
  // TLS (issue 27): the verified client certificate's identity.
  if (!client_identity_.empty()) append_field(out, cfg().client_identity_header, client_identity_);
  if (fr.chunked) append(out, std::string_view("Transfer-Encoding: chunked\r\n"));
  else if (fr.content_length) append_field(out, "Content-Length", Decimal(*fr.content_length));
  append(out, std::string_view("\r\n"));
}

// A chunked request body: every batch of decoded chunk data goes upstream as one chunk of our own
// framing (the head goes with the first). The request's result if it ended here.
task<std::optional<bool>> Session::send_chunked_body(Forwarding& fw) {
  UpConn& up = *fw.ex->up;
  auto& gather = sc_->gather;
  boost::system::error_code ec;
  ChunkDecoder dec(cfg().max_body_bytes);
  bool head_sent = false;
  for (;;) {
    const std::size_t size_slot = start_gather(gather, head_sent ? nullptr : &sc_->out);
    std::size_t total = 0;
    const std::size_t used = decode_into(dec, sc_->in.view(), gather, &total);
    if (dec.failed()) co_return co_await client_body_failed(fw, dec.error(), dec.too_large());
    frame_chunk(gather, size_slot, sc_->frame, total, dec.done());
    if (!head_sent || total || dec.done()) {
      arm(cfg().upstream_timeout);
      fw.sent = true;
      if (fw.keyed) fw.keyed->cap.sent = true;  // issue 30
      fw.early = co_await send_request(up, gather, ec);
      ec = settle(ec);
      if (ec && !fw.early) co_return co_await upstream_failed(fw, ec, "send");
      head_sent = true;
    }
    sc_->in.consume(used);
    if (dec.done() || fw.early) co_return std::nullopt;
    if (sc_->in.empty()) {
      ec = co_await read_client(kRelayBuffer, cfg().body_timeout);
      if (ec) co_return co_await client_body_failed(fw, nullptr, false);
    }
  }
}

// An interim answer (1xx but 101) whose head is complete in the upstream buffer: 103 Early Hints
// and 102 go on to HTTP/1.1 clients (RFC 9110 15.2); not 100 Continue: fencegate answers Expect
// itself and never forwards it. False when the exchange ended here (the client went).
task<bool> Session::relay_interim(Forwarding& fw) {
  UpConn& up = *fw.ex->up;
  const ResponseHead& rh = sc_->resp;
  if (rh.status != 100 && fw.version == 11) {
    std::string_view view = up.buf.view();
    sc_->out.clear();
    append(sc_->out, std::string_view("HTTP/1.1"), view.substr(8, view.find("\r\n") - 8), std::string_view("\r\n"));
    for (const auto& f : rh.fields)
      if (!is_hop_by_hop(f.kind) && !named_by_connection(rh, f.name)) append_field(sc_->out, f.name, f.value);
    sc_->out += "\r\n";
    if (!fw.client_gone) {
      boost::system::error_code ec;
      arm(cfg().body_timeout);
      std::array<net::const_buffer, 1> b{net::buffer(sc_->out)};
      if (ssl_ && !tls_seal(b, ec)) {
        // broken: *ec says so
      } else if (!send_now(client_, b, ec) && !ec) {
        co_await net::async_write(client_, b, net::redirect_error(use_task, ec));
      }
      if (settle(ec) && !client_went(fw)) {
        waiting_up_ = nullptr;
        fw.ex->release();
        co_return false;
      }
    }
  }
  up.buf.consume(fw.rh_len);
  co_return true;
}

// The response's framing (RFC 9112 6.3), its reuse and the client connection's. False when its
// Content-Length is invalid or conflicting (nothing is relayed then).
bool Session::frame_response(Forwarding& fw) {
  const ResponseHead& rh = sc_->resp;
  std::string& te_value = sc_->te_value;
  te_value.clear();
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
      if (f.value != cl || cl.empty() || cl.size() > 19 || cl.find_first_not_of("0123456789") != std::string_view::npos)
        cl_ok = false;
    }
    if (cl_ok) std::from_chars(cl.data(), cl.data() + cl.size(), fw.body_len);
  }
  fw.body = ResponseBody::until_close;
  if (fw.head_req || rh.status == 204 || rh.status == 304) fw.body = ResponseBody::none;
  else if (has_te) fw.body = te_chunked ? ResponseBody::chunked : ResponseBody::until_close;
  else if (ncl && !cl_ok) return false;
  else if (ncl) fw.body = ResponseBody::length;
  fw.up_reusable = rh.version == 11;
  for (const auto& f : rh.fields)
    if (f.kind == FieldKind::connection)
      for_each_token(f.value, [&](std::string_view t) {
        if (iequals(t, "close")) fw.up_reusable = false;
        else if (iequals(t, "keep-alive") && rh.version == 10) fw.up_reusable = true;
      });
  // Close-delimited, or framed both ways (RFC 9112 6.3: chunked wins, the connection closes after).
  if (fw.body == ResponseBody::until_close || (fw.body == ResponseBody::chunked && rh.has(FieldKind::content_length)))
    fw.up_reusable = false;
  if (fw.early) fw.up_reusable = false;  // it has a partial request
  fw.keep = fw.client_keep_alive && !fw.early && !rt_.stopping.load(std::memory_order_relaxed);
  // A 1.0 client gets a body it can delimit only by the close.
  const bool unframed = fw.body == ResponseBody::chunked || fw.body == ResponseBody::until_close;
  fw.chunk_out = fw.version == 11 && unframed;
  if (fw.version == 10 && unframed) fw.keep = false;
  return true;
}

// The client's response head, into sc_->out; the upstream's head leaves its buffer.
void Session::build_response_head(Forwarding& fw) {
  UpConn& up = *fw.ex->up;
  const ResponseHead& rh = sc_->resp;
  const FenceHeaders& fence = fw.fence;
  std::string& te_value = sc_->te_value;
  std::string_view view = up.buf.view();
  std::string_view status_line = view.substr(8, view.find("\r\n") - 8);  // " 200 OK"
  sc_->out.clear();
  append(sc_->out, std::string_view(fw.version == 10 ? "HTTP/1.0" : "HTTP/1.1"), status_line, std::string_view("\r\n"));
  bool has_date = false;
  for (const auto& f : rh.fields) {
    const FieldKind k = f.kind;
    has_date = has_date || (f.name.size() == 4 && iequals(f.name, "Date"));
    if (is_hop_by_hop(k) || k == FieldKind::transfer_encoding) continue;
    // A 204 has no content, so no Content-Length (RFC 9110 8.6): a client that believed one
    // would wait for bytes that never come, or read the next response as them.
    if (k == FieldKind::content_length && (fw.body != ResponseBody::none || rh.status == 204)) continue;
    // A fenced request's fence headers are ours alone: an upstream's Fencing-Observe on an
    // enforce route would tell the client its write was only observed.
    if (fence.generation && (k == FieldKind::fencing_generation || k == FieldKind::fencing_observe)) continue;
    if (named_by_connection(rh, f.name)) continue;
    append_field(sc_->out, f.name, f.value);
  }
  // A response without a Date gets ours (RFC 9110 6.6.1: a recipient with a clock adds one).
  if (!has_date) append_field(sc_->out, "Date", http_date());
  if (fence.generation)
    append_field(sc_->out, "Fencing-Generation", Decimal(static_cast<std::uint64_t>(*fence.generation)));
  if (!fence.observe.empty()) append_field(sc_->out, "Fencing-Observe", fence.observe);
  if (fw.body == ResponseBody::length) append_field(sc_->out, "Content-Length", Decimal(fw.body_len));
  // A close-delimited body under another coding (Transfer-Encoding: gzip) keeps its label, with
  // our chunked framing last: without it the client would take gzip bytes for the content.
  if (fw.chunk_out) {
    if (fw.body == ResponseBody::until_close && !te_value.empty()) te_value += ", chunked";
    append_field(sc_->out, "Transfer-Encoding",
                 fw.body == ResponseBody::until_close && te_value.empty() ? std::string_view("chunked")
                                                                          : std::string_view(te_value));
  }
  if (!fw.keep) sc_->out += "Connection: close\r\n";
  else if (fw.version == 10) sc_->out += "Connection: keep-alive\r\n";
  sc_->out += "\r\n";
  up.buf.consume(fw.rh_len);
}

// A Content-Length response body, sent on with the client's head in front of its first bytes.
// The request's result if it ended here; nullopt when the body was relayed whole.
task<std::optional<bool>> Session::relay_length_body(Forwarding& fw) {
  UpConn& up = *fw.ex->up;
  boost::system::error_code ec;
  std::uint64_t left = fw.body_len;
  bool head_sent = false;
  for (;;) {
    std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(left, up.buf.size()));
    left -= n;
    if (fw.keyed) fw.keyed->cap.body(up.buf.view().substr(0, n));  // issue 30
    if (left == 0) exchange_over(fw);
    std::array<net::const_buffer, 2> b{net::buffer(sc_->out.data(), head_sent ? 0 : sc_->out.size()),
                                       net::buffer(up.buf.view().data(), n)};
    if (!head_sent || n) {
      if (!fw.client_gone) {
        arm(cfg().body_timeout);
        if (ssl_ && !tls_seal(b, ec)) {
          // broken: *ec says so
        } else if (!co_await send_soon(client_, b, ec) && !ec) {
          co_await net::async_write(client_, b, net::redirect_error(use_task, ec));
        }
        if (settle(ec) && !client_went(fw)) co_return false;
      }
      head_sent = true;
    }
    up.buf.consume(n);
    if (left == 0) co_return std::nullopt;
    arm(cfg().upstream_timeout);
    std::size_t got = co_await up.sock.async_read_some(up.buf.prepare(static_cast<std::size_t>(
                                                           std::min<std::uint64_t>(left, kRelayBuffer))),
                                                       net::redirect_error(use_task, ec));
    up.buf.commit(got);
    ec = settle(ec);
    if (ec) co_return body_failed(fw, ec.message());
  }
}

// A chunked or close-delimited response body: decoded (chunked) or taken as it comes, and sent on
// in chunks of our own framing to an HTTP/1.1 client (raw to a 1.0 one, which reads to the close).
// The request's result if it ended here; nullopt when the body was relayed whole.
task<std::optional<bool>> Session::relay_chunked_body(Forwarding& fw) {
  UpConn& up = *fw.ex->up;
  auto& gather = sc_->gather;
  const bool close_delimited = fw.body == ResponseBody::until_close;
  boost::system::error_code ec;
  ChunkDecoder dec;
  bool eof = false, head_sent = false;
  for (;;) {
    const std::size_t size_slot = start_gather(gather, head_sent ? nullptr : &sc_->out);
    std::string_view avail = up.buf.view();
    std::size_t used = 0, total = 0;
    if (close_delimited) {
      if (!avail.empty()) gather.push_back(net::buffer(avail.data(), avail.size()));
      used = total = avail.size();
    } else {
      used = decode_into(dec, avail, gather, &total);
      // Nothing has reached the client yet: it gets a 502, not a cut connection.
      if (dec.failed() && !head_sent) {
        const std::string why = std::string("bad chunked framing: ") + dec.error();
        co_return co_await upstream_answer_refused(fw, "upstream " + fw.route.upstream + ": " + why,
                                                   "upstream response body failed", why);
      }
      if (dec.failed()) co_return body_failed(fw, std::string("bad chunked framing: ") + dec.error());
    }
    const bool done = close_delimited ? eof : dec.done();
    if (fw.keyed) idem_capture_runs(fw, size_slot + 1);  // issue 30
    if (done) exchange_over(fw);
    if (fw.chunk_out) frame_chunk(gather, size_slot, sc_->frame, total, done);  // else the runs go raw
    if (!head_sent || total || (done && fw.chunk_out)) {
      if (!fw.client_gone) {
        arm(cfg().body_timeout);
        if (ssl_ && !tls_seal(gather, ec)) {
          // broken: *ec says so
        } else if (!co_await send_soon(client_, gather, ec) && !ec) {
          co_await net::async_write(client_, gather, net::redirect_error(use_task, ec));
        }
        if (settle(ec) && !client_went(fw)) co_return false;
      }
      head_sent = true;
    }
    up.buf.consume(used);
    if (done) co_return std::nullopt;
    if (up.buf.empty()) {
      arm(cfg().upstream_timeout);
      std::size_t got =
          co_await up.sock.async_read_some(up.buf.prepare(kRelayBuffer), net::redirect_error(use_task, ec));
      up.buf.commit(got);
      ec = settle(ec);
      if (ec == net::error::eof && close_delimited) eof = true;
      else if (ec) co_return body_failed(fw, ec.message());
    }
  }
}

// The exchange is over as far as the fence is concerned (its answer is whole upstream).
void Session::exchange_over(Forwarding& fw) {
  Exchange& x = *fw.ex;
  if (fw.keyed) idem_settle(*fw.keyed);  // issue 30: recorded before the client has the last byte
  if (x.node.resource || !x.aborted)
    rt_.metrics.upstream_latency.observe(std::chrono::duration<double>(Clock::now() - fw.started).count());
  x.release();
}

// A pooled connection that failed before anything came back, for a request safe to send again:
// sends it once more on a new connection. True iff that went (or was answered early).
task<bool> Session::retry_fresh(Forwarding& fw, boost::system::error_code e) {
  Exchange& x = *fw.ex;
  UpConn& up = *x.up;
  if (!fw.may_retry || !up.buf.empty() || timed_out_ || x.aborted) co_return false;
  if (e != net::error::eof && e != net::error::connection_reset && e != net::error::broken_pipe) co_return false;
  fw.may_retry = false;
  std::unique_ptr<UpConn> keep = std::move(x.up);  // `up` (connect_upstream uses x.up meanwhile)
  boost::system::error_code cec;
  std::unique_ptr<UpConn> fresh = co_await connect_upstream(fw.route, fw.ex, cec);
  x.up = std::move(keep);
  if (cec || x.aborted) co_return false;
  up.sock = std::move(fresh->sock);
  waiting_up_ = &up;
  arm(cfg().upstream_timeout);
  std::array<net::const_buffer, 1> b{net::buffer(sc_->out)};
  boost::system::error_code sec;
  const bool answered = co_await send_request(up, b, sec);
  sec = settle(sec);
  co_return !sec || answered;
}

}  // namespace fencegate::proxy
