// The fenced reverse proxy: listener, client sessions, upstream pool. The only translation unit
// that includes Asio and Beast.
//
// Threads: one io_context per worker thread (each runs single-threaded, so a session and the
// upstream pool of its worker need no locks); the Store's thread commits; the Fence's timer thread
// enforces drain timeouts. Results from those threads are posted back to the session's io_context.
#include "proxy/server.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <csignal>
#include <optional>
#include <thread>
#include <unordered_map>

#include "config/router.h"
#include "fence_store/store.h"
#include "proxy/admin.h"
#include "proxy/authority.h"
#include "proxy/fence.h"
#include "proxy/head.h"
#include "proxy/log.h"
#include "proxy/metrics.h"
#include "proxy/runtime.h"
#include "proxy/token.h"

namespace fencegate::proxy {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using net::awaitable;
using net::use_awaitable;
using config::Mode;
using namespace net::experimental::awaitable_operators;

namespace {

constexpr std::size_t kRelayBuffer = 16 * 1024;
constexpr std::size_t kMaxResponseHeader = 64 * 1024;
constexpr std::uint64_t kDiscardLimit = 64 * 1024;  // refused bodies up to this are skipped, not fatal

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

struct UpConn {
  explicit UpConn(net::io_context& ioc) : stream(ioc) {}
  beast::tcp_stream stream;
  beast::flat_buffer buf;
  std::chrono::steady_clock::time_point idle_since;
};

struct Worker {
  net::io_context ioc{1};
  // Guarded by running on ioc's single thread.
  std::unordered_map<std::string, std::vector<std::unique_ptr<UpConn>>> idle;
};

// A value produced on another thread and awaited by a session coroutine on its io_context.
template <class T>
struct Slot {
  explicit Slot(net::io_context& ioc) : timer(ioc, net::steady_timer::time_point::max()) {}
  net::steady_timer timer;
  std::optional<T> value;

  // Called from any thread: hands the value to the session's thread and wakes it.
  static void fulfil(const std::shared_ptr<Slot>& s, net::io_context& ioc, T v) {
    net::post(ioc, [s, v = std::move(v)]() mutable {
      s->value = std::move(v);
      s->timer.cancel();
    });
  }
  awaitable<T> wait() {
    while (!value) {
      boost::system::error_code ec;
      co_await timer.async_wait(net::redirect_error(use_awaitable, ec));
    }
    co_return std::move(*value);
  }
};

// One forwarded exchange; it holds the fence registration and the upstream connection.
struct Exchange {
  Exchange(Fence& f) : fence(f) {}
  ~Exchange() { release(); }
  void release() { fence.release(&node); }
  Fence& fence;
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
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Error";
  }
}

struct Problem {
  Problem(unsigned s, std::string ty, std::string ti, std::string d, std::string res = {},
          std::optional<std::int64_t> pres = std::nullopt, std::optional<std::int64_t> cur = std::nullopt)
      : status(s), type(std::move(ty)), title(std::move(ti)), detail(std::move(d)), resource(std::move(res)),
        presented(pres), current(cur) {}
  unsigned status = 400;
  std::string type;   // short slug, e.g. "stale-generation"
  std::string title;
  std::string detail;
  // Fence context (emitted when resource is set).
  std::string resource;
  std::optional<std::int64_t> presented;
  std::optional<std::int64_t> current;
};

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
};

// Named, not `{}`: GCC 12 mishandles a braced temporary bound to a reference inside co_await
// (it freed a FenceMarks' string from the wrong address).
const FenceMarks kNoMarks{};

std::string local_reply(const Problem& p, bool keep_alive, int version, const FenceMarks& marks) {
  std::string body = problem_body(p);
  std::string r = version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ";
  r += std::to_string(p.status);
  r += ' ';
  r += reason_of(p.status);
  r += "\r\nContent-Type: application/problem+json\r\nContent-Length: ";
  r += std::to_string(body.size());
  r += "\r\nCache-Control: no-store\r\n";
  if (marks.generation) r += "Fencing-Generation: " + std::to_string(*marks.generation) + "\r\n";
  if (!marks.observe.empty()) r += "Fencing-Observe: " + marks.observe + "\r\n";
  if (!keep_alive) r += "Connection: close\r\n";
  else if (version == 10) r += "Connection: keep-alive\r\n";
  r += "\r\n";
  r += body;
  return r;
}

bool is_hop_by_hop(std::string_view name) {
  static constexpr std::string_view kHop[] = {"Connection", "Keep-Alive", "Proxy-Connection", "TE",
                                              "Trailer", "Upgrade", "Proxy-Authenticate",
                                              "Proxy-Authorization"};
  for (auto h : kHop)
    if (iequals(name, h)) return true;
  return false;
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

// Removes hop-by-hop fields (RFC 9110 7.6.1), including those named in Connection.
template <class Fields>
void strip_hop_by_hop(Fields& fields) {
  std::vector<std::string> named;
  for (auto it = fields.find(http::field::connection); it != fields.end() && it->name() == http::field::connection; ++it)
    for_each_token(it->value(), [&](std::string_view t) { named.emplace_back(t); });
  for (auto it = fields.begin(); it != fields.end();) {
    std::string_view n = it->name_string();
    bool drop = is_hop_by_hop(n);
    for (const auto& x : named)
      if (!drop && iequals(n, x)) drop = true;
    it = drop ? fields.erase(it) : std::next(it);
  }
}

std::string joined_values(const http::fields& f, std::string_view name) {
  std::string out;
  for (auto it = f.begin(); it != f.end(); ++it) {
    if (!iequals(it->name_string(), name)) continue;
    if (!out.empty()) out += ", ";
    out += it->value();
  }
  return out;
}

void set_nodelay(tcp::socket& s) {
  boost::system::error_code ec;
  s.set_option(tcp::no_delay(true), ec);
}

// True iff an idle pooled connection still looks usable (peer has not closed it).
bool still_open(tcp::socket& s) {
  char c;
  ssize_t n = ::recv(s.native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return false;                                      // orderly close
  if (n > 0) return false;                                       // unsolicited bytes: unusable
  return errno == EAGAIN || errno == EWOULDBLOCK;
}

// ---------------------------------------------------------------------------------------------
// Session.

class Session {
 public:
  Session(ServerState& st, Worker& w, tcp::socket sock)
      : st_(st), rt_(st.rt), w_(w), client_(std::move(sock)), snap_(rt_.snapshot()) {
    boost::system::error_code ec;
    auto ep = client_.socket().remote_endpoint(ec);
    if (!ec) {
      client_ip_ = ep.address().to_string();
      client_addr_ = ep.address().is_v6() ? "[" + client_ip_ + "]:" + std::to_string(ep.port())
                                           : client_ip_ + ":" + std::to_string(ep.port());
      client_v6_ = ep.address().is_v6();
    }
    set_nodelay(client_.socket());
  }

  awaitable<void> run();

 private:
  struct Request;  // per-request state
  awaitable<bool> read_head(std::size_t* head_len, bool first);
  awaitable<bool> handle(std::size_t head_len);
  awaitable<bool> reply(const Problem& p, bool keep_alive, int version, const FenceMarks& marks);
  awaitable<store::Status> audit_sync(store::AuditRow row);
  awaitable<bool> discard(std::uint64_t n);
  awaitable<bool> forward(http::request_parser<http::buffer_body>& p, const config::Route& route,
                          const std::string& resource, bool client_keep_alive, int version, bool expect_continue,
                          std::shared_ptr<Exchange> ex, const FenceMarks& marks);
  awaitable<std::unique_ptr<UpConn>> take_upstream(const config::Route& route, std::shared_ptr<Exchange>& ex,
                                                   boost::system::error_code& ec);
  void give_back(const config::Route& route, std::unique_ptr<UpConn> c);

  const config::Config& cfg() const { return *snap_->cfg; }
  void count(const std::string& resource, Outcome o) { rt_.metrics.count(resource, o); }

  ServerState& st_;
  Runtime& rt_;
  Worker& w_;
  beast::tcp_stream client_;
  net::steady_timer head_timer_{w_.ioc};
  beast::flat_buffer buf_;
  std::shared_ptr<const Snapshot> snap_;  // the config this request runs under
  std::string client_ip_, client_addr_;
  bool client_v6_ = false;
};

awaitable<void> Session::run() {
  bool first = true;
  for (;;) {
    std::size_t head_len = 0;
    if (!co_await read_head(&head_len, first)) break;
    snap_ = rt_.snapshot();  // a reload applies from the next request on, even on this connection
    first = false;
    st_.active_requests.fetch_add(1, std::memory_order_relaxed);
    bool again = false;
    try {
      again = co_await handle(head_len);
    } catch (const std::exception& e) {
      log::error("request failed", {log::kv("error", e.what()), log::kv("client", client_addr_)});
    }
    st_.active_requests.fetch_sub(1, std::memory_order_relaxed);
    if (!again || rt_.stopping.load(std::memory_order_relaxed)) break;
  }
  boost::system::error_code ec;
  client_.socket().shutdown(tcp::socket::shutdown_send, ec);
  client_.close();
}

// Reads until buf_ holds a complete request head. Returns false when the connection should just
// close (peer closed, idle timeout, or an error reply was already sent).
awaitable<bool> Session::read_head(std::size_t* head_len, bool first) {
  const auto& cfg = this->cfg();
  std::size_t checked = 0;
  bool started = buf_.size() > 0;
  auto deadline = std::chrono::steady_clock::now() + (started || first ? cfg.header_timeout : cfg.idle_timeout);
  client_.expires_never();
  for (;;) {
    if (buf_.size() > 0) {
      std::string_view data(static_cast<const char*>(buf_.data().data()), buf_.size());
      // Cheap incremental check first; the full scan runs once the head looks complete.
      bool maybe_done = data.find("\r\n\r\n", checked > 3 ? checked - 3 : 0) != std::string_view::npos;
      if (maybe_done || head_prefix_hopeless(data, checked) || data.size() >= cfg.max_header_bytes) {
        HeadScan s = scan_request_head(data, cfg.max_header_bytes, nullptr);
        if (s.status == HeadStatus::complete) {
          *head_len = s.length;
          co_return true;
        }
        if (s.status == HeadStatus::bad) {
          co_await reply(Problem{400, "bad-request", "Bad request", s.reason}, false, 11, kNoMarks);
          co_return false;
        }
        if (s.status == HeadStatus::too_large) {
          co_await reply(Problem{431, "header-too-large", "Request header fields too large",
                                 "the request head exceeds " + std::to_string(cfg.max_header_bytes) + " bytes"},
                         false, 11, kNoMarks);
          co_return false;
        }
      }
      checked = data.size();
    }
    // The head's deadline is our own timer, not the stream's: a stream timeout closes the
    // socket, and a client whose head stalled is owed a 408.
    head_timer_.expires_at(deadline);
    if (buf_.size() == 0) {
      // An idle keep-alive connection holds no read buffer: wait until bytes arrive, then read.
      // (10,000 idle clients would otherwise pin 16 KiB each.)
      buf_.shrink_to_fit();
      auto w = co_await (client_.socket().async_wait(tcp::socket::wait_read, net::as_tuple(use_awaitable)) ||
                         head_timer_.async_wait(net::as_tuple(use_awaitable)));
      if (w.index() == 1) co_return false;  // idle timeout: nothing was sent, just close
      if (auto [wec] = std::get<0>(w); wec) co_return false;
    }
    std::size_t room = std::min<std::size_t>(cfg.max_header_bytes + 4 - buf_.size(), buf_.size() ? 16384 : 4096);
    if (room == 0) room = 1;
    auto r = co_await (client_.socket().async_read_some(buf_.prepare(room), net::as_tuple(use_awaitable)) ||
                       head_timer_.async_wait(net::as_tuple(use_awaitable)));
    if (r.index() == 1) {
      if (buf_.size() > 0)
        co_await reply(Problem{408, "request-timeout", "Request timeout", "the request head did not arrive in time"},
                       false, 11, kNoMarks);
      co_return false;
    }
    auto [ec, n] = std::get<0>(r);
    buf_.commit(n);
    if (ec) co_return false;
    if (!started) {
      started = true;
      deadline = std::chrono::steady_clock::now() + cfg.header_timeout;
    }
  }
}

awaitable<bool> Session::reply(const Problem& p, bool keep_alive, int version, const FenceMarks& marks) {
  std::string r = local_reply(p, keep_alive, version, marks);
  boost::system::error_code ec;
  client_.expires_after(cfg().body_timeout);
  co_await net::async_write(client_, net::buffer(r), net::redirect_error(use_awaitable, ec));
  co_return !ec && keep_alive;
}

// Reads and drops the next n body bytes. Returns false if they did not arrive.
awaitable<bool> Session::discard(std::uint64_t n) {
  while (buf_.size() < n) {
    boost::system::error_code ec;
    client_.expires_after(cfg().body_timeout);
    std::size_t got = co_await client_.async_read_some(buf_.prepare(n - buf_.size()), net::redirect_error(use_awaitable, ec));
    buf_.commit(got);
    if (ec) co_return false;
  }
  buf_.consume(n);
  co_return true;
}

awaitable<store::Status> Session::audit_sync(store::AuditRow row) {
  auto slot = std::make_shared<Slot<store::Status>>(w_.ioc);
  net::io_context& ioc = w_.ioc;
  rt_.store.append_audit(std::move(row), [slot, &ioc](store::Status st) { Slot<store::Status>::fulfil(slot, ioc, std::move(st)); });
  co_return co_await slot->wait();
}

enum class TokenState { ok, missing, malformed };

awaitable<bool> Session::handle(std::size_t head_len) {
  const auto& cfg = this->cfg();
  std::string_view data(static_cast<const char*>(buf_.data().data()), buf_.size());
  RequestHead head;
  scan_request_head(data, cfg.max_header_bytes, &head);
  const int version = head.version;
  Framing fr = check_framing(head);
  if (!fr.ok) co_return co_await reply(Problem{400, "bad-framing", "Bad request", fr.reason}, false, version, kNoMarks);
  const bool has_body = fr.chunked || (fr.content_length && *fr.content_length > 0);

  // Client keep-alive intent (before we touch the header).
  bool client_keep_alive = true;
  {
    bool close = false, keep = false;
    for (const auto& f : head.fields)
      if (iequals(f.name, "Connection"))
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
  auto refuse = [&](Problem p, const FenceMarks& m = kNoMarks) -> awaitable<bool> {
    const bool can_skip = client_keep_alive &&
        (!has_body || (!fr.chunked && !expect_continue && *fr.content_length <= kDiscardLimit));
    if (!co_await reply(p, can_skip, version, m)) co_return false;
    buf_.consume(head_len);
    if (has_body) co_return co_await discard(*fr.content_length);
    co_return true;
  };

  if (head.method == "CONNECT" || head.count("Upgrade"))
    co_return co_await reply(Problem{501, "not-implemented", "Not implemented",
                                     "CONNECT and protocol upgrades are not supported"},
                             false, version, kNoMarks);
  // Connection may not name end-to-end fields we rely on: stripping them would change framing
  // or drop the token on its way upstream.
  {
    bool bad_conn = false;
    for (const auto& f : head.fields) {
      if (!iequals(f.name, "Connection")) continue;
      for_each_token(f.value, [&](std::string_view t) {
        if (iequals(t, "Content-Length") || iequals(t, "Transfer-Encoding") || iequals(t, "Host") ||
            iequals(t, cfg.token_header) || iequals(t, cfg.leader_header))
          bad_conn = true;
      });
    }
    if (bad_conn)
      co_return co_await reply(Problem{400, "bad-connection-header", "Bad request",
                                       "the Connection header names an end-to-end field"},
                               false, version, kNoMarks);
  }
  {
    std::string_view ev;
    std::size_t ne = head.count("Expect", &ev);
    if (ne > 1 || (ne == 1 && !iequals(ev, "100-continue")))
      co_return co_await reply(Problem{417, "expectation-failed", "Expectation failed",
                                       "only \"Expect: 100-continue\" is supported"},
                               false, version, kNoMarks);
    expect_continue = ne == 1 && version == 11;
  }
  if (fr.content_length && *fr.content_length > cfg.max_body_bytes)
    co_return co_await reply(Problem{413, "body-too-large", "Content too large",
                                     "the body exceeds " + std::to_string(cfg.max_body_bytes) + " bytes"},
                             false, version, kNoMarks);

  // Route: the resource comes from the route and the path, never from a header.
  config::Router::Match m = snap_->router.match(head.target);
  if (m.outcome == config::Router::Outcome::bad_target)
    co_return co_await reply(Problem{400, "bad-target", "Bad request", m.reason}, false, version, kNoMarks);
  if (m.outcome == config::Router::Outcome::no_route)
    co_return co_await refuse(Problem{404, "no-route", "Not found", "no route matches this path"});
  const config::Route& route = *m.route;


  // Fence decision.
  const bool fenced = route.mode != Mode::off && route.is_fenced(head.method);
  FenceMarks marks;
  auto ex = std::make_shared<Exchange>(rt_.fence);
  if (fenced) {
    std::string_view tv, lv;
    std::size_t nt = head.count(cfg.token_header, &tv);
    std::size_t nl = head.count(cfg.leader_header, &lv);
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
    std::string leader(lv.substr(0, cfg.max_leader_bytes));
    const bool enforce = route.mode == Mode::enforce;

    auto audit_row = [&](std::string decision, std::int64_t current) {
      store::AuditRow row;
      row.resource = m.resource;
      row.decision = std::move(decision);
      row.presented_generation = g;
      row.current_generation = current;
      row.method = std::string(head.method);
      row.target = std::string(head.target.substr(0, 2048));
      row.client = client_ip_;
      row.leader = leader;
      row.mode = enforce ? "enforce" : "observe";
      std::string_view ua;
      if (head.count("User-Agent", &ua)) row.user_agent = std::string(ua.substr(0, 512));
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
        store::Status st = co_await audit_sync(audit_row(std::string("rejected_") + kind, cur));
        note(st.ok() ? (ts == TokenState::missing ? Outcome::rejected_missing : Outcome::rejected_malformed)
                     : Outcome::store_error,
             cur);
        if (!st.ok())
          co_return co_await refuse(Problem{503, "store-unavailable", "Fence store unavailable",
                                            "the audit row could not be made durable: " + st.message(),
                                            m.resource, std::nullopt, cur}, marks);
        if (ts == TokenState::missing)
          co_return co_await refuse(Problem{428, "token-required", "Fencing token required",
                                            "writes to this resource need a " + cfg.token_header + " header",
                                            m.resource, std::nullopt, cur}, marks);
        co_return co_await refuse(Problem{400, "malformed-token", "Malformed fencing token", why, m.resource,
                                          std::nullopt, cur}, marks);
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
        co_return co_await refuse(Problem{503, "authority-unavailable", "Election authority unavailable",
                                          ac->why + "; nothing was forwarded", m.resource, g, cur},
                                  marks);
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
        store::Status st = co_await audit_sync(audit_row("rejected_" + suffix, newest));
        note(st.ok() ? rejected : Outcome::store_error, newest);
        if (!st.ok())
          co_return co_await refuse(Problem{503, "store-unavailable", "Fence store unavailable",
                                            "the audit row could not be made durable: " + st.message(),
                                            m.resource, g, newest}, marks);
        co_return co_await refuse(Problem{409, type, title, detail, m.resource, g, newest}, marks);
      }
      // Observe: forwarded, but the fence is never advanced to a generation etcd says does not lead.
      marks.generation = cur;
      rt_.store.append_audit(audit_row("would_reject_" + suffix, newest), nullptr);
      note(would, newest);
      marks.observe = "would_reject_" + suffix;
    } else {
      Decision d;
      bool now;
      auto slot = std::make_shared<Slot<Decision>>(w_.ioc);
      net::io_context& ioc = w_.ioc;
      auto later = [slot, &ioc](Decision dd) { Slot<Decision>::fulfil(slot, ioc, dd); };
      if (enforce) {
        std::weak_ptr<Exchange> weak = ex;
        ex->node.abort = [weak, &ioc] {
          net::post(ioc, [weak] {
            if (auto e = weak.lock()) {
              e->aborted = true;
              if (e->up) {
                boost::system::error_code ec;
                e->up->stream.socket().shutdown(tcp::socket::shutdown_both, ec);
                e->up->stream.socket().close(ec);
              }
            }
          });
        };
        now = rt_.fence.admit(m.resource, g, leader, &ex->node, &d, later);
      } else {
        now = rt_.fence.observe(m.resource, g, leader, &d, later);
      }
      if (!now) d = co_await slot->wait();
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
          store::Status st = co_await audit_sync(audit_row("rejected_stale", d.newest));
          note(st.ok() ? Outcome::rejected_stale : Outcome::store_error, d.newest);
          if (!st.ok())
            co_return co_await refuse(Problem{503, "store-unavailable", "Fence store unavailable",
                                              "the audit row could not be made durable: " + st.message(),
                                              m.resource, g, d.newest}, marks);
          co_return co_await refuse(Problem{409, "stale-generation", "Stale fencing token",
                                            "generation " + std::to_string(g) + " is older than generation " +
                                                std::to_string(d.newest) + " of resource " + m.resource,
                                            m.resource, g, d.newest}, marks);
        }
        case Verdict::store_error:
          note(Outcome::store_error, d.current);
          if (enforce)
            co_return co_await refuse(Problem{503, "store-unavailable", "Fence store unavailable",
                                              "the new generation could not be made durable; nothing was forwarded",
                                              m.resource, g, d.current}, marks);
          log::warn("observe mode: could not store generation", {log::kv("resource", m.resource)});
          break;
        case Verdict::overloaded:
          co_return co_await refuse(Problem{503, "too-many-resources", "Too many resources",
                                            "the fence holds its maximum number of resources", m.resource, g,
                                            std::nullopt}, marks);
      }
    }
  }

  // Hand the head to Beast for body framing and serialization (it was already validated).
  http::request_parser<http::buffer_body> p;
  p.eager(false);
  p.header_limit(static_cast<std::uint32_t>(cfg.max_header_bytes + 64));
  p.body_limit(cfg.max_body_bytes);
  {
    boost::system::error_code ec;
    std::size_t used = p.put(net::buffer(buf_.data().data(), head_len), ec);
    if (ec || !p.is_header_done() || used != head_len) {
      co_return co_await reply(Problem{400, "bad-request", "Bad request",
                                       "unparseable request head" + (ec ? ": " + ec.message() : std::string())},
                               false, version, marks);
    }
    buf_.consume(head_len);
  }
  co_return co_await forward(p, route, m.resource, client_keep_alive, version, expect_continue, std::move(ex), marks);
}

awaitable<std::unique_ptr<UpConn>> Session::take_upstream(const config::Route& route, std::shared_ptr<Exchange>& ex,
                                                          boost::system::error_code& ec) {
  auto& pool = w_.idle[route.upstream];
  while (!pool.empty()) {
    auto c = std::move(pool.back());
    pool.pop_back();
    if (still_open(c->stream.socket()) && c->buf.size() == 0) co_return c;
  }
  auto c = std::make_unique<UpConn>(w_.ioc);
  ex->up = std::move(c);  // visible to a drain abort while connecting
  ex->up->stream.expires_after(cfg().upstream_connect_timeout);
  std::vector<tcp::endpoint> endpoints;
  for (const auto& a : snap_->upstreams[snap_->route_index(&route)]) {
    boost::system::error_code aec;
    auto addr = net::ip::make_address(a.ip, aec);
    if (!aec) endpoints.emplace_back(addr, a.port);
  }
  co_await ex->up->stream.async_connect(endpoints, net::redirect_error(use_awaitable, ec));
  c = std::move(ex->up);
  if (!ec) set_nodelay(c->stream.socket());
  co_return c;
}

void Session::give_back(const config::Route& route, std::unique_ptr<UpConn> c) {
  auto& pool = w_.idle[route.upstream];
  if (pool.size() >= cfg().upstream_idle_per_thread) return;
  c->stream.expires_never();
  c->idle_since = std::chrono::steady_clock::now();
  pool.push_back(std::move(c));
}

awaitable<bool> Session::forward(http::request_parser<http::buffer_body>& p, const config::Route& route,
                                 const std::string& resource, bool client_keep_alive, int version,
                                 bool expect_continue, std::shared_ptr<Exchange> ex, const FenceMarks& marks) {
  const auto& cfg = this->cfg();
  boost::system::error_code ec;
  const auto started = std::chrono::steady_clock::now();
  count(resource, Outcome::forwarded);
  auto exchange_over = [&] {
    if (ex->node.resource || !ex->aborted) {
      rt_.metrics.upstream_latency.observe(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    }
    ex->release();
  };

  auto upstream_failed = [&](boost::system::error_code e, const char* stage) -> awaitable<bool> {
    ex->release();
    count(resource, Outcome::upstream_error);
    log::warn("upstream exchange failed", {log::kv("upstream", route.upstream), log::kv("stage", stage),
                                           log::kv("error", e.message()), log::kv("aborted_by_drain", ex->aborted ? 1 : 0)});
    if (ex->aborted || e == beast::error::timeout) {
      std::string detail = ex->aborted ? "a newer generation's drain timed out; this exchange was aborted"
                                       : std::string("the upstream did not answer in time (") + stage + ")";
      co_return co_await reply(Problem{504, "upstream-timeout", "Gateway timeout", detail}, false, version, marks);
    }
    co_return co_await reply(Problem{502, "upstream-error", "Bad gateway",
                                     std::string("upstream ") + route.upstream + ": " + stage + ": " + e.message()},
                             false, version, marks);
  };

  // Upstream connection.
  std::unique_ptr<UpConn> conn = co_await take_upstream(route, ex, ec);
  if (ec || ex->aborted) co_return co_await upstream_failed(ec ? ec : net::error::operation_aborted, "connect");
  ex->up = std::move(conn);
  UpConn& up = *ex->up;

  // Transform the header: hop-by-hop fields go, X-Forwarded-For and Forwarded are appended.
  auto& req = p.get();
  strip_hop_by_hop(req.base());
  req.erase(http::field::expect);
  {
    std::string xff = joined_values(req.base(), "X-Forwarded-For");
    req.erase("X-Forwarded-For");
    req.set("X-Forwarded-For", xff.empty() ? client_ip_ : xff + ", " + client_ip_);
    std::string fwd = joined_values(req.base(), "Forwarded");
    req.erase(http::field::forwarded);
    std::string me = client_v6_ ? "for=\"[" + client_ip_ + "]\"" : "for=" + client_ip_;
    req.set(http::field::forwarded, fwd.empty() ? me : fwd + ", " + me);
  }
  req.version(11);
  req.keep_alive(true);

  if (expect_continue) {
    static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    client_.expires_after(cfg.body_timeout);
    co_await net::async_write(client_, net::buffer(kContinue), net::redirect_error(use_awaitable, ec));
    if (ec) co_return false;
  }

  // Request: header, then the body streamed in fixed buffers.
  {
    char tmp[kRelayBuffer];
    http::serializer<true, http::buffer_body> sr{req};
    up.stream.expires_after(cfg.upstream_timeout);
    co_await http::async_write_header(up.stream, sr, net::redirect_error(use_awaitable, ec));
    if (ec) co_return co_await upstream_failed(ec, "send");
    do {
      if (!p.is_done()) {
        req.body().data = tmp;
        req.body().size = sizeof tmp;
        client_.expires_after(cfg.body_timeout);
        co_await http::async_read(client_, buf_, p, net::redirect_error(use_awaitable, ec));
        if (ec == http::error::need_buffer) ec = {};
        if (ec) {
          ex->release();
          if (ec == http::error::body_limit)
            co_await reply(Problem{413, "body-too-large", "Content too large",
                                   "the body exceeds " + std::to_string(cfg.max_body_bytes) + " bytes"},
                           false, version, marks);
          else if (ec == beast::error::timeout)
            co_await reply(Problem{408, "request-timeout", "Request timeout", "the request body stalled"}, false,
                           version, marks);
          else if (ec != http::error::end_of_stream && ec != net::error::eof && ec != http::error::partial_message)
            co_await reply(Problem{400, "bad-body", "Bad request", "malformed request body: " + ec.message()}, false,
                           version, marks);
          co_return false;
        }
        req.body().size = sizeof tmp - req.body().size;
        req.body().data = tmp;
        req.body().more = !p.is_done();
      } else {
        req.body().data = nullptr;
        req.body().size = 0;
        req.body().more = false;
      }
      up.stream.expires_after(cfg.upstream_timeout);
      co_await http::async_write(up.stream, sr, net::redirect_error(use_awaitable, ec));
      if (ec == http::error::need_buffer) ec = {};
      if (ec) co_return co_await upstream_failed(ec, "send");
    } while (!p.is_done() || !sr.is_done());
  }

  // Response: skip interim 1xx, then relay header and body.
  const bool head_req = req.method() == http::verb::head;
  std::optional<http::response_parser<http::buffer_body>> rp;
  for (;;) {
    rp.emplace();
    rp->header_limit(kMaxResponseHeader);
    rp->body_limit(boost::none);
    if (head_req) rp->skip(true);
    up.stream.expires_after(cfg.upstream_timeout);
    co_await http::async_read_header(up.stream, up.buf, *rp, net::redirect_error(use_awaitable, ec));
    if (ec) co_return co_await upstream_failed(ec, "response");
    unsigned s = rp->get().result_int();
    if (s >= 100 && s < 200 && s != 101) continue;
    break;
  }
  auto& res = rp->get();
  if (res.result_int() == 101) {
    ex->release();
    co_return co_await reply(Problem{502, "upstream-error", "Bad gateway", "the upstream switched protocols"}, false,
                             version, marks);
  }
  const bool upstream_reusable_hdr = res.keep_alive() && !rp->need_eof();
  bool keep = client_keep_alive && !rt_.stopping.load(std::memory_order_relaxed);
  strip_hop_by_hop(res.base());
  if (marks.generation) res.set("Fencing-Generation", std::to_string(*marks.generation));
  if (!marks.observe.empty()) res.set("Fencing-Observe", marks.observe);
  const bool bodyless = head_req || res.result_int() == 204 || res.result_int() == 304;
  if (!bodyless && !res.has_content_length() && !res.chunked()) {
    // Close-delimited upstream body: chunk it for HTTP/1.1 clients, close after for 1.0.
    if (version == 11) res.chunked(true);
    else keep = false;
  }
  if (version == 10 && res.chunked()) {
    res.chunked(false);
    keep = false;
  }
  res.version(version);
  res.keep_alive(keep);

  {
    char tmp[kRelayBuffer];
    http::serializer<false, http::buffer_body> sr{res};
    client_.expires_after(cfg.body_timeout);
    co_await http::async_write_header(client_, sr, net::redirect_error(use_awaitable, ec));
    if (ec) co_return false;
    do {
      if (!rp->is_done()) {
        res.body().data = tmp;
        res.body().size = sizeof tmp;
        up.stream.expires_after(cfg.upstream_timeout);
        co_await http::async_read(up.stream, up.buf, *rp, net::redirect_error(use_awaitable, ec));
        if (ec == http::error::need_buffer) ec = {};
        if (ec) {
          // The response header is already out: all we can do is cut the client connection.
          log::warn("upstream response body failed", {log::kv("upstream", route.upstream), log::kv("error", ec.message())});
          co_return false;
        }
        res.body().size = sizeof tmp - res.body().size;
        res.body().data = tmp;
        res.body().more = !rp->is_done();
        if (rp->is_done()) exchange_over();  // the upstream exchange is over
      } else {
        exchange_over();
        res.body().data = nullptr;
        res.body().size = 0;
        res.body().more = false;
      }
      client_.expires_after(cfg.body_timeout);
      co_await http::async_write(client_, sr, net::redirect_error(use_awaitable, ec));
      if (ec == http::error::need_buffer) ec = {};
      if (ec) co_return false;
    } while (!rp->is_done() || !sr.is_done());
  }
  ex->release();
  if (upstream_reusable_hdr && !ex->aborted && up.buf.size() == 0) give_back(route, std::move(ex->up));
  co_return keep;
}

// ---------------------------------------------------------------------------------------------
// Server.

awaitable<void> accept_loop(ServerState& st, tcp::acceptor& acceptor, std::vector<std::unique_ptr<Worker>>& workers) {
  std::size_t next = 0;
  for (;;) {
    Worker& w = *workers[next];
    next = (next + 1) % workers.size();
    boost::system::error_code ec;
    tcp::socket sock = co_await acceptor.async_accept(w.ioc, net::redirect_error(use_awaitable, ec));
    if (ec) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) co_return;
      if (ec == net::error::no_descriptors || ec == net::error::no_buffer_space) {
        log::warn("accept failed; backing off", {log::kv("error", ec.message())});
        net::steady_timer t(acceptor.get_executor(), std::chrono::milliseconds(50));
        co_await t.async_wait(net::redirect_error(use_awaitable, ec));
      }
      continue;
    }
    if (st.connections.load(std::memory_order_relaxed) >= st.rt.snapshot()->cfg->max_connections) {
      // Over the limit: close at once so the client sees it; the sidecar stays up for the rest.
      sock.close(ec);
      continue;
    }
    st.connections.fetch_add(1, std::memory_order_relaxed);
    st.rt.metrics.open_connections.fetch_add(1, std::memory_order_relaxed);
    net::co_spawn(
        w.ioc,
        [&st, &w, s = std::move(sock)]() mutable -> awaitable<void> {
          Session session(st, w, std::move(s));
          co_await session.run();
        },
        [&st](std::exception_ptr e) {
          st.connections.fetch_sub(1, std::memory_order_relaxed);
          st.rt.metrics.open_connections.fetch_sub(1, std::memory_order_relaxed);
          if (e) {
            try {
              std::rethrow_exception(e);
            } catch (const std::exception& x) {
              log::error("session ended with an error", {log::kv("error", x.what())});
            }
          }
        });
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
  store->set_commit_observer([&metrics, &rt](double s, std::size_t, bool ok) {
    metrics.store_commit.observe(s);
    if (!ok) metrics.store_commit_failures.fetch_add(1, std::memory_order_relaxed);
    rt.store_result(ok, ok ? std::string() : "the last store commit failed");
  });
  ServerState st(rt);
  st.authorities = &authorities;
  rt.authorities = &authorities;

  std::vector<std::unique_ptr<Worker>> workers;
  for (int i = 0; i < std::max(1, cfg->threads); ++i) workers.push_back(std::make_unique<Worker>());

  tcp::acceptor acceptor(workers[0]->ioc);
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
    log::info("listening", {log::kv("address", bound.address().to_string() + ":" + std::to_string(bound.port())),
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

  // SIGINT/SIGTERM: readiness turns 503, stop accepting, let requests in flight finish (bounded),
  // then stop. (SIGHUP, a reload, is handled by the admin server's thread.)
  net::signal_set signals(workers[0]->ioc, SIGINT, SIGTERM);
  net::steady_timer grace(workers[0]->ioc);
  std::chrono::steady_clock::time_point deadline;
  std::function<void()> poll_stop = [&] {
    if (st.active_requests.load() == 0 || std::chrono::steady_clock::now() >= deadline) {
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
  store->set_commit_observer(nullptr);
  store.reset();
  fence->shutdown();
  log::info("stopped");
  return 0;
}

}  // namespace fencegate::proxy
