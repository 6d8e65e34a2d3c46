// The relay's failures (split from relay.cpp): an exchange with the upstream that failed (502,
// 504), an answer that cannot be relayed, a client body that stopped or broke, a client that went,
// and the lingering of a fenced write whose exchange failed while the upstream may still apply it.
#include "common/log.h"
#include "proxy/session.h"

namespace fencegate::proxy {

namespace {

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

}  // namespace

// True (and the exchange handed to linger_after_failure) when some of this fenced write went
// to the upstream, which may still be applying it; otherwise the exchange is released.
bool Session::linger_or_release(Forwarding& fw, const char* why, bool incomplete) {
  Exchange& x = *fw.ex;
  if (fw.sent && !x.aborted && x.up && x.up->sock.is_open() && x.node.resource != nullptr) {
    x.client = nullptr;  // the session and its socket go before the exchange does
    net::co_spawn(w_.ioc, linger_after_failure(fw.ex, cfg().drain_timeout, st_.active_requests, why, incomplete),
                  net::detached);
    return true;
  }
  x.release();
  return false;
}

// The exchange with the upstream failed at `stage` (connect, send, response): 504 if it timed
// out or a newer generation's drain aborted it, else 502.
task<bool> Session::upstream_failed(Forwarding& fw, boost::system::error_code e, const char* stage) {
  Exchange& x = *fw.ex;
  if (fw.keyed) idem_failed(*fw.keyed);  // issue 30: settled before the client has its answer
  waiting_up_ = nullptr;
  const bool timeout = e == net::error::timed_out && std::string_view(stage) != "connect";
  // The upstream has the request (or part of it, and stopped reading) and has not answered: it
  // may still apply it. (A send that failed otherwise means the upstream closed the connection.)
  const bool response = std::string_view(stage) == "response";
  bool linger = false;
  if (timeout)
    linger = linger_or_release(fw, response ? "upstream timeout (response)" : "upstream timeout (send)", !response);
  else x.release();
  count(fw.resource, Outcome::upstream_error);
  // TLS to the upstream (issue 27): a failed handshake is a 502 with its reason class. Nothing of
  // the request was sent: the exchange is over (released above), as after a refused connect.
  const char* tls_failure = std::string_view(stage) == "connect" && !x.aborted ? sc_->tls_failure : nullptr;
  if (tls_failure) {
    rt_.metrics.count_upstream_tls_failure(tls_failure);
    log::warn("upstream TLS handshake failed", {log::kv("upstream", fw.route.upstream), log::kv("reason", tls_failure),
                                                log::kv("error", sc_->tls_detail)});
    sc_->problem = Problem{502, "upstream-error", "Bad gateway",
                           std::string("upstream ") + fw.route.upstream + ": TLS handshake failed (" + tls_failure +
                               "): " + sc_->tls_detail};
    co_return co_await reply(sc_->problem, false, fw.version, fw.fence);
  }
  log::warn("upstream exchange failed",
            {log::kv("upstream", fw.route.upstream), log::kv("stage", stage), log::kv("error", e.message()),
             log::kv("aborted_by_drain", x.aborted ? 1 : 0), log::kv("still_in_flight", linger ? 1 : 0)});
  if (x.aborted || timeout)
    sc_->problem = Problem{504, "upstream-timeout", "Gateway timeout",
                           x.aborted ? "a newer generation's drain timed out; this exchange was aborted"
                                     : std::string("the upstream did not answer in time (") + stage + ")"};
  else
    sc_->problem = Problem{502, "upstream-error", "Bad gateway",
                           std::string("upstream ") + fw.route.upstream + ": " + stage + ": " + e.message()};
  co_return co_await reply(sc_->problem, false, fw.version, fw.fence);
}

// The upstream's answer cannot be relayed (malformed, 101, bad framing) and nothing of it has
// reached the client: 502 with `detail`; logged as `log_line` (if any) with `log_error`.
task<bool> Session::upstream_answer_refused(Forwarding& fw, std::string detail, const char* log_line,
                                            std::string_view log_error) {
  waiting_up_ = nullptr;
  if (fw.keyed) idem_failed(*fw.keyed);  // issue 30
  fw.ex->release();
  count(fw.resource, Outcome::upstream_error);
  if (log_line) log::warn(log_line, {log::kv("upstream", fw.route.upstream), log::kv("error", log_error)});
  sc_->problem = Problem{502, "upstream-error", "Bad gateway", std::move(detail)};
  co_return co_await reply(sc_->problem, false, fw.version, fw.fence);
}

// The client's body stopped or broke: the upstream has an incomplete request. Its connection
// is half-closed and, for a fenced write, kept in flight until the upstream is done with it.
task<bool> Session::client_body_failed(Forwarding& fw, const char* why, bool too_large) {
  waiting_up_ = nullptr;
  linger_or_release(fw,
                    too_large    ? "body too large"
                    : timed_out_ ? "client body stalled"
                    : why        ? "malformed client body"
                                 : "client gone mid-body",
                    true);
  if (fw.ex->aborted) {  // woken by a newer generation's drain timeout (see node.abort)
    sc_->problem = Problem{504, "upstream-timeout", "Gateway timeout",
                           "a newer generation's drain timed out; this exchange was aborted"};
    co_await reply(sc_->problem, false, fw.version, fw.fence);
  } else if (too_large) {
    sc_->problem = Problem{413, "body-too-large", "Content too large",
                           "the body exceeds " + std::to_string(cfg().max_body_bytes) + " bytes"};
    co_await reply(sc_->problem, false, fw.version, fw.fence);
    co_await linger_close();
  } else if (timed_out_) {
    sc_->problem = Problem{408, "request-timeout", "Request timeout", "the request body stalled"};
    co_await reply(sc_->problem, false, fw.version, fw.fence);
  } else if (why) {
    sc_->problem = Problem{400, "bad-body", "Bad request", std::string("malformed request body: ") + why};
    co_await reply(sc_->problem, false, fw.version, fw.fence);
  }
  co_return false;
}

// The client went (a write to it failed or timed out) while the upstream may still be working
// on this fenced write: the write stays in flight for the fence until the upstream's answer
// has ended, so the answer is read to its end and dropped. False when nothing is to wait for
// (not a fenced write, or no longer in flight): the exchange just ends.
bool Session::client_went(Forwarding& fw) {
  if (!fw.ex->node.resource || fw.ex->aborted) return false;
  fw.client_gone = true;
  timed_out_ = false;
  boost::system::error_code ignored;
  client_.shutdown(tcp::socket::shutdown_both, ignored);
  return true;
}

// The response head is already out: all we can do is cut the client connection.
bool Session::body_failed(Forwarding& fw, const std::string& why) {
  count(fw.resource, Outcome::upstream_error);
  log::warn("upstream response body failed", {log::kv("upstream", fw.route.upstream), log::kv("error", why)});
  return false;
}

}  // namespace fencegate::proxy
