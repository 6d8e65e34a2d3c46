// Issue 30: operation IDs on the data path (docs/idempotency.md). For a write the fence admitted
// on a route with "idempotency": read the key (an RFC 8941 sf-string), read the body whole and
// fingerprint the request, then ask the store (in its group commit) to record the key in flight:
// a new key is forwarded; a completed one with the same fingerprint is replayed without touching
// the upstream; anything else is refused with its own problem. When the upstream's answer ends
// the key is recorded, released or marked outcome unknown (idem_settle); when the exchange
// failed, it is marked unknown if any of the request reached the upstream, else released
// (idem_after). Observe mode refuses and replays nothing: it counts and audits would_replay.
//
// session.cpp calls idem_gate and idem_after; relay.cpp feeds the capture (head, body runs,
// whether the request was sent) and calls idem_settle when the answer has ended.
#include <array>
#include <chrono>

#include "common/log.h"
#include "proxy/session.h"
#include "proxy/traceparent.h"

namespace fencegate::proxy {

namespace {

std::int64_t unix_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

std::string clip(std::string_view v, std::size_t n) { return std::string(v.substr(0, n)); }

// The audit row of a keyed write's decision here (a refusal, or a would-be replay).
store::AuditRow keyed_row(const RequestState& rq, const RequestHead& head, const std::string& client,
                          const std::string& identity, const std::string& resource, std::string decision,
                          const char* mode) {
  store::AuditRow row;
  row.resource = resource;
  row.decision = std::move(decision);
  row.presented_generation = rq.token.generation;
  row.current_generation = rq.fence.generation.value_or(0);
  row.method = std::string(head.method);
  row.target = clip(head.target, 2048);
  row.client = client;
  row.leader = rq.token.leader;
  row.mode = mode;
  row.user_agent = clip(head.user_agent(), 512);
  row.traceparent = traceparent_of(head);
  row.client_identity = identity;
  return row;
}

// A keyed write on its way upstream, with the route's final-status lists.
std::shared_ptr<idem::Keyed> keyed(const config::Idempotency& conf, store::KeyRecord rec) {
  auto k = std::make_shared<idem::Keyed>(conf.max_body_bytes);
  k->rec = std::move(rec);
  k->release_statuses = conf.release_statuses;
  k->unknown_statuses = conf.unknown_statuses;
  return k;
}

}  // namespace

// Reads the rest of a keyed write's body into sc_->in (behind the head) and feeds it to the
// fingerprint: Content-Length bodies as they are, chunked bodies decoded. Returns the body's
// bytes as they stand in sc_->in (raw, chunk framing included), or nullopt if the client failed
// to send it (sc_->problem is then set when an answer is due: 408, 400 or 413).
task<std::optional<std::uint64_t>> Session::idem_read_body(RequestState& rq, idem::Fingerprint& fp) {
  const Framing& fr = rq.framing;
  sc_->problem.status = 0;
  if (!fr.chunked) {
    const std::uint64_t n = fr.content_length.value_or(0);
    if (n > idem::kMaxKeyedBodyBytes) {
      sc_->problem = idem::body_too_large();
      co_return std::nullopt;
    }
    while (sc_->in.size() < rq.head_len + n) {
      const std::size_t want = static_cast<std::size_t>(
          std::min<std::uint64_t>(rq.head_len + n - sc_->in.size(), static_cast<std::uint64_t>(kRelayBuffer)));
      if (co_await read_client(want, cfg().body_timeout)) {
        if (timed_out_) sc_->problem = Problem{408, "request-timeout", "Request timeout", "the request body stalled"};
        co_return std::nullopt;
      }
    }
    fp.update(sc_->in.view().substr(rq.head_len, static_cast<std::size_t>(n)));
    co_return n;
  }
  ChunkDecoder dec(std::min<std::uint64_t>(cfg().max_body_bytes, idem::kMaxKeyedBodyBytes));
  std::size_t at = rq.head_len;  // decoded up to here
  for (;;) {
    std::string_view avail = sc_->in.view().substr(at);
    while (!avail.empty() && !dec.done() && !dec.failed()) {
      std::string_view data;
      const std::size_t used = dec.feed(avail, &data);
      fp.update(data);
      avail.remove_prefix(used);
      at += used;
      if (used == 0) break;
    }
    if (dec.failed()) {
      sc_->problem = dec.too_large() ? idem::body_too_large()
                                     : Problem{400, "bad-body", "Bad request",
                                               std::string("malformed request body: ") + dec.error()};
      co_return std::nullopt;
    }
    if (dec.done()) co_return static_cast<std::uint64_t>(at - rq.head_len);
    if (co_await read_client(kRelayBuffer, cfg().body_timeout)) {
      if (timed_out_) sc_->problem = Problem{408, "request-timeout", "Request timeout", "the request body stalled"};
      co_return std::nullopt;
    }
  }
}

// Sends an answer made here (a replay or a refusal) to a request whose body is buffered whole:
// the request's bytes leave sc_->in and the connection goes on if the client meant it to.
task<bool> Session::idem_answer(RequestState& rq, std::string response, std::uint64_t body_bytes) {
  timed_out_ = false;
  arm(cfg().body_timeout);
  boost::system::error_code ec;
  // The batched send path (one io_uring submission per reactor pass), as forwarded answers go.
  std::array<net::const_buffer, 1> b{net::buffer(response)};
  if (ssl_ && !tls_seal(b, ec)) {
    // broken: *ec says so
  } else if (!co_await send_soon(client_, b, ec) && !ec) {
    co_await net::async_write(client_, b, net::redirect_error(use_task, ec));
  }
  if (settle(ec)) co_return false;
  sc_->in.consume(rq.head_len + static_cast<std::size_t>(body_bytes));
  co_return rq.client_keep_alive;
}

// A refusal of a keyed write whose body was read: counted, logged with its decision, audited
// durably (enforce-mode refusals are, before they are answered; a store that cannot make the row
// durable turns the answer into 503), then answered.
task<bool> Session::idem_refuse(RequestState& rq, const Problem& p, const char* decision, IdemOutcome o,
                                std::uint64_t body_bytes, bool retry_after) {
  const std::string& resource = rq.match.resource;
  if (o != IdemOutcome::kCount) rt_.metrics.count(resource, o);  // kCount: not an idempotency outcome
  log::warn("rejected write: idempotency",
            {log::kv("decision", decision), log::kv("resource", resource), log::kv("problem", p.type),
             log::kv("presented_generation", rq.token.generation), log::kv("leader", rq.token.leader),
             log::kv("client", client_ip_), log::kv("method", sc_->head.method),
             log::kv("target", sc_->head.target.substr(0, 256))});
  Problem answer = p;  // (p may be sc_->problem)
  if (decision[0] != '\0') {
    store::AuditRow row = keyed_row(rq, sc_->head, client_ip_, client_identity_, resource, decision, "enforce");
    store::Status st = co_await audit_sync(row);
    if (!st.ok()) {
      answer = idem::store_failed("the refusal's audit row could not be made durable: " + st.message());
      retry_after = false;
    }
  }
  std::string r = local_reply(answer, rq.client_keep_alive, rq.version, rq.fence, sc_->head_method);
  if (retry_after) r = idem::with_field(std::move(r), "Retry-After", "1");
  co_return co_await idem_answer(rq, std::move(r), body_bytes);
}

task<std::optional<bool>> Session::idem_prepare(RequestState& rq, Exchange& ex, bool early) {
  const config::Route& route = *rq.match.route;
  const config::Idempotency& conf = *route.idempotency;
  const bool observe = route.mode == Mode::observe;
  const std::string& resource = rq.match.resource;
  // The key: at most one field, an sf-string.
  std::string_view value;
  std::size_t fields = 0;
  for (const auto& f : sc_->head.fields)
    if (iequals(f.name, conf.header) && fields++ == 0) value = f.value;
  if (fields == 0) {
    if (!conf.required || observe || early) co_return std::nullopt;  // an unkeyed write: forwarded as any other
    ex.release();
    sc_->problem = idem::missing(conf.header);
    co_return co_await refuse(rq, sc_->problem, rq.fence);
  }
  std::string why;
  std::optional<std::string> key = fields > 1 ? std::nullopt : idem::parse_key(value, &why);
  if (fields > 1) why = "the request has " + std::to_string(fields) + " " + conf.header + " fields";
  if (!key) {
    if (observe || early) co_return std::nullopt;
    ex.release();
    log::info("rejected write: malformed idempotency key",
              {log::kv("decision", "idempotency_key_malformed"), log::kv("resource", resource), log::kv("why", why),
               log::kv("client", client_ip_)});
    sc_->problem = idem::malformed(conf.header, why);
    co_return co_await refuse(rq, sc_->problem, rq.fence);
  }
  // The body, whole: its SHA-256 is part of the fingerprint. A client waiting for 100 Continue
  // gets it now (the upstream is not asked: nothing goes there before the key is recorded).
  if (rq.expect_continue) {
    static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    arm(cfg().body_timeout);
    boost::system::error_code ec;
    net::const_buffer one = net::buffer(kContinue);
    if (!ssl_ || tls_seal({&one, 1}, ec)) co_await net::async_write(client_, one, net::redirect_error(use_task, ec));
    if (settle(ec)) {
      ex.release();
      co_return false;
    }
    rq.expect_continue = false;
  }
  idem::Fingerprint fp;
  const std::optional<std::uint64_t> body = co_await idem_read_body(rq, fp);
  // Reading may have moved the buffer: the head's views are taken again from where it now is.
  (void)scan_request_head(sc_->in.view(), cfg().max_header_bytes, &sc_->head);
  if (!body) {
    ex.release();
    if (sc_->problem.status == 0) co_return false;  // the client went
    co_await reply(sc_->problem, false, rq.version, rq.fence);
    co_await linger_close();
    co_return false;
  }
  auto rider = std::make_shared<store::KeyRider>();
  store::KeyRecord& rec = rider->rec;
  rider->max_keys = conf.max_keys;
  rec.resource = resource;
  // scope "client": the verified TLS client identity where there is one, else the client's address.
  if (conf.scope_client) rec.scope = client_identity_.empty() ? client_ip_ : client_identity_;
  rec.key = std::move(*key);
  rec.fingerprint = fp.finish(sc_->head.method, sc_->head.target);
  rec.generation = rq.token.generation;
  rec.created_ms = unix_ms();
  rec.expires_ms = rec.created_ms + std::chrono::duration_cast<std::chrono::milliseconds>(conf.retention).count();
  rq.idem_rider = std::move(rider);
  rq.idem_body = *body;
  co_return std::nullopt;
}

task<std::optional<bool>> Session::idem_gate(RequestState& rq, Exchange& ex) {
  const config::Route& route = *rq.match.route;
  const config::Idempotency& conf = *route.idempotency;
  const bool observe = route.mode == Mode::observe;
  const std::string& resource = rq.match.resource;
  if (!rq.idem_rider) {
    if (std::optional<bool> answered = co_await idem_prepare(rq, ex, false)) co_return answered;
    if (!rq.idem_rider) co_return std::nullopt;  // unkeyed (or observe mode's malformed key)
  }
  std::shared_ptr<store::KeyRider> rider = std::move(rq.idem_rider);
  store::KeyRecord rec = std::move(rider->rec);
  // A completed key in the store's memory is answered at once (a replay or a 422: nothing to
  // record); otherwise the key is recorded in flight (or found) in the store's group commit,
  // before anything goes upstream.
  store::KeyBeginResult got;
  bool rode = false;  // recorded (or found) in the commit of the fence advance this write waited for
  {
    std::lock_guard lk(rider->mu);
    rode = rider->attached && rider->committed;
  }
  if (rode) {
    got = std::move(rider->result);
  } else if (rt_.store.key_cached(rec.resource, rec.scope, rec.key, &got.existing)) {
    got.outcome = store::KeyBegin::exists;
  } else {
    auto slot = std::make_shared<CrossThreadResult<store::KeyBeginResult>>(w_);
    rt_.store.key_begin(rec, conf.max_keys, [slot](store::KeyBeginResult r) {
      CrossThreadResult<store::KeyBeginResult>::fulfil(slot, std::move(r));
    });
    got = co_await slot->wait();
  }
  const std::uint64_t n = rq.idem_body;
  if (!got.status.ok() || got.outcome == store::KeyBegin::limit) {
    const bool limit = got.status.ok();
    if (observe) {
      log::warn("observe mode: an operation ID could not be recorded; the write is forwarded unkeyed",
                {log::kv("resource", resource), log::kv("why", limit ? "idempotency.max_keys" : got.status.message())});
      co_return std::nullopt;
    }
    ex.release();
    // (Built before the co_await: GCC 12 mishandles a conditional expression inside one.)
    if (limit) sc_->problem = idem::limit(resource, conf.max_keys);
    else sc_->problem = idem::store_failed(got.status.message());
    co_return co_await idem_refuse(rq, sc_->problem, "", IdemOutcome::kCount, n, false);
  }
  if (got.outcome == store::KeyBegin::started) {
    rec.row = got.row;  // the answer is recorded into this row
    rq.idem = keyed(conf, std::move(rec));
    co_return std::nullopt;
  }
  // The key is known.
  const store::KeyRecord& old = got.existing;
  const bool same = old.fingerprint == rec.fingerprint;
  if (observe) {
    if (old.state == store::KeyState::completed && same) {
      rt_.metrics.count(resource, IdemOutcome::would_replay);
      store::AuditRow row = keyed_row(rq, sc_->head, client_ip_, client_identity_, resource, "would_replay", "observe");
      rt_.store.append_audit(std::move(row), nullptr);
      log::info("would replay write", {log::kv("decision", "would_replay"), log::kv("resource", resource),
                                       log::kv("key", rec.key), log::kv("client", client_ip_)});
    }
    co_return std::nullopt;
  }
  if (old.state == store::KeyState::unknown && conf.forward_unknown && same) {
    rq.idem = keyed(conf, std::move(rec));
    co_return std::nullopt;
  }
  ex.release();
  if (!same) {
    sc_->problem = idem::mismatch(rec.key);
    co_return co_await idem_refuse(rq, sc_->problem, "rejected_idempotency_mismatch", IdemOutcome::mismatch, n, false);
  }
  if (old.state == store::KeyState::in_flight) {
    sc_->problem = idem::in_flight(rec.key);
    co_return co_await idem_refuse(rq, sc_->problem, "rejected_idempotency_in_flight", IdemOutcome::in_flight, n, true);
  }
  if (old.state == store::KeyState::unknown) {
    sc_->problem = idem::outcome_unknown(rec.key);
    co_return co_await idem_refuse(rq, sc_->problem, "rejected_idempotency_unknown", IdemOutcome::unknown, n, false);
  }
  // Completed, the same request: the recorded answer, without touching the upstream.
  rt_.metrics.count(resource, IdemOutcome::replayed);
  log::info("replayed write", {log::kv("decision", "replayed"), log::kv("resource", resource), log::kv("key", rec.key),
                               log::kv("status", old.status), log::kv("recorded_generation", old.generation),
                               log::kv("presented_generation", rq.token.generation), log::kv("client", client_ip_)});
  std::string replay = idem::replay_response(old, rq.client_keep_alive, rq.version, rq.fence, sc_->head_method);
  co_return co_await idem_answer(rq, std::move(replay), n);
}

void Session::idem_capture_runs(Forwarding& fw, std::size_t first) {
  for (std::size_t i = first; i < sc_->gather.size(); ++i)
    fw.keyed->cap.body(std::string_view(static_cast<const char*>(sc_->gather[i].data()), sc_->gather[i].size()));
}

void Session::idem_settle(idem::Keyed& k) {
  if (k.cap.settled) return;
  k.cap.settled = true;
  store::KeyRecord rec = std::move(k.rec);  // settled: nothing reads k.rec again
  const std::string& resource = rec.resource;
  switch (idem::fate_of(k.cap.status, k.release_statuses, k.unknown_statuses)) {
    case idem::Fate::release:
      rt_.metrics.count(resource, IdemOutcome::released);
      rt_.store.key_release(rec.resource, rec.scope, rec.key, nullptr);
      return;
    case idem::Fate::unknown:
      rt_.metrics.count(resource, IdemOutcome::unknown);
      rec.state = store::KeyState::unknown;
      rec.status = k.cap.status;
      break;
    case idem::Fate::record:
      rt_.metrics.count(resource, IdemOutcome::stored);
      rec.state = store::KeyState::completed;
      rec.status = k.cap.status;
      rec.headers = std::move(k.cap.headers);
      rec.body_kept = k.cap.kept;
      if (k.cap.kept) rec.body = std::move(k.cap.data);
      break;
  }
  rt_.store.key_settle(std::move(rec), nullptr);
}

void Session::idem_after(RequestState& rq) { idem_failed(*rq.idem); }

void Session::idem_failed(idem::Keyed& k) {
  if (k.cap.settled) return;
  k.cap.settled = true;
  const std::string& resource = k.rec.resource;
  if (!k.cap.sent) {  // nothing reached the upstream (connect failed, aborted before sending)
    rt_.metrics.count(resource, IdemOutcome::released);
    rt_.store.key_release(k.rec.resource, k.rec.scope, k.rec.key, nullptr);
    return;
  }
  // It reached the upstream and no complete answer came back: whether it acted is unknown.
  rt_.metrics.count(resource, IdemOutcome::unknown);
  log::warn("idempotency: the outcome of a keyed write is unknown (it reached the upstream, no complete answer)",
            {log::kv("decision", "outcome_unknown"), log::kv("resource", resource), log::kv("key", k.rec.key)});
  store::KeyRecord rec = k.rec;
  rec.state = store::KeyState::unknown;
  rec.status = k.cap.have_head ? k.cap.status : 0;
  rt_.store.key_settle(std::move(rec), nullptr);
}

}  // namespace fencegate::proxy
