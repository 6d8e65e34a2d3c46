// HttpConnection over Boost.Beast: each call runs C++20 coroutines on the connection's private
// io_context, driven by the calling thread (run_for in 50 ms slices so a cancel flag is noticed).
// Timeouts are the tcp_stream's expiry (steady clock), set before every connect, write and read.
#include "election_client/http_conn.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <charconv>
#include <optional>

namespace fencegate::election {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using net::awaitable;
using net::use_awaitable;
using Clock = std::chrono::steady_clock;

bool parse_http_url(std::string_view s, HttpUrl* out, std::string* err) {
  auto fail = [&](const std::string& why) {
    if (err) *err = why + " (got \"" + std::string(s) + "\")";
    return false;
  };
  constexpr std::string_view kScheme = "http://";
  if (s.substr(0, kScheme.size()) != kScheme) return fail("must be an http:// URL");
  std::string_view rest = s.substr(kScheme.size());
  std::size_t slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  if (path.find_first_of("?# ") != std::string_view::npos) return fail("must not have a query, fragment or space");
  HttpUrl u;
  std::string_view portstr;
  if (!hostport.empty() && hostport.front() == '[') {
    std::size_t close = hostport.find(']');
    if (close == std::string_view::npos) return fail("bad IPv6 address");
    u.host = std::string(hostport.substr(1, close - 1));
    std::string_view after = hostport.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return fail("bad port");
      portstr = after.substr(1);
    }
  } else {
    std::size_t colon = hostport.rfind(':');
    u.host = std::string(hostport.substr(0, colon));
    if (colon != std::string_view::npos) portstr = hostport.substr(colon + 1);
  }
  if (u.host.empty() || u.host.find('@') != std::string::npos) return fail("needs a host");
  if (hostport.find(':') != std::string_view::npos || !portstr.empty()) {
    unsigned port = 0;
    auto [p, ec] = std::from_chars(portstr.data(), portstr.data() + portstr.size(), port);
    if (portstr.empty() || ec != std::errc() || p != portstr.data() + portstr.size() || port == 0 || port > 65535)
      return fail("bad port");
    u.port = static_cast<std::uint16_t>(port);
  }
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  if (path == "/") path = {};
  u.path = std::string(path);
  *out = std::move(u);
  return true;
}

namespace {

// How one attempt on one endpoint went.
struct Attempt {
  beast::error_code ec;
  bool responded = false;  // a response (or, for streams, a response head) was received
  bool stopped = false;    // stream: on_line asked to stop
  bool ended = false;      // stream: the server ended the body
  int status = 0;
};

}  // namespace

struct HttpConnection::Impl {
  explicit Impl(Options o) : opt(std::move(o)) {}

  // Constant after construction
  Options opt;

  net::io_context ioc;
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buf;
  std::size_t cur = 0;    // endpoint in use
  bool reused = false;    // the open connection has completed a request before

  const HttpUrl& ep() const { return opt.endpoints[cur]; }
  void advance() { cur = (cur + 1) % opt.endpoints.size(); }

  // An attempt on `origin` that got no answer: the connection is dropped and the failure added
  // to `errors`. A kept-alive connection the server had already closed is retried on the same
  // endpoint once; not after a timeout (a member that hangs would get every later call too).
  // Returns true iff there is time left for another attempt.
  bool failed(const Attempt& a, bool was_reused, const std::string& origin, std::string& errors,
              Clock::time_point deadline) {
    drop();
    if (!errors.empty()) errors += "; ";
    errors += origin + ": " + (a.ec == beast::error::timeout ? std::string("timed out") : a.ec.message());
    if (!was_reused || a.ec == beast::error::timeout) advance();
    return Clock::now() < deadline;
  }

  void drop() {
    if (stream) {
      beast::error_code ig;
      stream->socket().shutdown(tcp::socket::shutdown_both, ig);
      stream->close();
      stream.reset();
    }
    buf.consume(buf.size());
    reused = false;
  }

  // Runs `a` on ioc to completion, polling *cancel. Sets *cancelled if it was raised.
  Attempt run(awaitable<Attempt> a, const std::atomic<bool>* cancel, bool* cancelled) {
    std::optional<Attempt> result;
    net::co_spawn(ioc, std::move(a), [&](std::exception_ptr e, Attempt r) {
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const boost::system::system_error& se) {
          r.ec = se.code();
        } catch (...) {
          r.ec = net::error::fault;
        }
      }
      result = r;
    });
    *cancelled = false;
    while (!result) {
      if (ioc.stopped()) ioc.restart();
      ioc.run_for(std::chrono::milliseconds(50));
      if (!*cancelled && cancel && cancel->load()) {
        *cancelled = true;
        if (stream) stream->cancel();
      }
    }
    return *result;
  }

  awaitable<beast::error_code> connect(Clock::time_point deadline) {
    tcp::resolver resolver(ioc);
    auto [rec, results] =
        co_await resolver.async_resolve(ep().host, std::to_string(ep().port), net::as_tuple(use_awaitable));
    if (rec) co_return rec;
    stream.emplace(ioc);
    stream->expires_at(std::min(deadline, Clock::now() + opt.connect_timeout));
    auto [cec, _] = co_await stream->async_connect(results, net::as_tuple(use_awaitable));
    if (cec) {
      stream.reset();
      co_return cec;
    }
    beast::error_code ig;
    stream->socket().set_option(tcp::no_delay(true), ig);
    reused = false;
    co_return beast::error_code{};
  }

  http::request<http::string_body> make_request(std::string_view target, std::string_view body,
                                                const HttpHeaders& headers) {
    http::request<http::string_body> req{http::verb::post, target, 11};
    // An IPv6 literal goes in brackets (RFC 9110 7.2): "::1:9901" is no host[:port].
    const std::string& h = ep().host;
    req.set(http::field::host,
            (h.find(':') != std::string::npos ? "[" + h + "]" : h) + ":" + std::to_string(ep().port));
    req.set(http::field::content_type, "application/json");
    req.set(http::field::user_agent, "fencegate-election");
    for (const auto& [k, v] : headers) req.set(k, v);
    req.body() = std::string(body);
    req.prepare_payload();
    req.keep_alive(true);
    return req;
  }

  // Connects if needed and writes one POST; the deadline covers both.
  awaitable<beast::error_code> send(std::string_view target, std::string_view body, const HttpHeaders& headers,
                                    Clock::time_point deadline) {
    if (!stream) {
      beast::error_code cec = co_await connect(deadline);
      if (cec) co_return cec;
    }
    auto req = make_request(target, body, headers);
    stream->expires_at(deadline);
    auto [wec, wn] = co_await http::async_write(*stream, req, net::as_tuple(use_awaitable));
    co_return wec;
  }

  awaitable<Attempt> unary(std::string target, std::string body, HttpHeaders headers, Clock::time_point deadline,
                           HttpResponse* out) {
    Attempt a;
    a.ec = co_await send(target, body, headers, deadline);
    if (a.ec) co_return a;
    http::response_parser<http::string_body> p;
    p.header_limit(64 * 1024);
    p.body_limit(opt.max_body_bytes);
    auto [rec, rn] = co_await http::async_read(*stream, buf, p, net::as_tuple(use_awaitable));
    if (rec) {
      a.ec = rec;
      co_return a;
    }
    a.responded = true;
    out->status = p.get().result_int();
    out->body = std::move(p.get().body());
    if (!p.get().keep_alive()) {
      drop();
    } else {
      stream->expires_never();
      reused = true;
    }
    co_return a;
  }

  awaitable<Attempt> streaming(std::string target, std::string body, Clock::time_point head_deadline,
                               std::chrono::milliseconds idle, const std::function<bool(std::string_view)>* on_line,
                               HttpResponse* error_out) {
    Attempt a;
    a.ec = co_await send(target, body, {}, head_deadline);
    if (a.ec) co_return a;
    http::response_parser<http::string_body> p;
    p.header_limit(64 * 1024);
    p.body_limit(boost::none);  // the stream is consumed line by line below
    auto [hec, hn] = co_await http::async_read_header(*stream, buf, p, net::as_tuple(use_awaitable));
    if (hec) {
      a.ec = hec;
      co_return a;
    }
    a.responded = true;
    a.status = p.get().result_int();
    if (a.status != 200) {
      p.body_limit(opt.max_body_bytes);
      auto [bec, bn] = co_await http::async_read(*stream, buf, p, net::as_tuple(use_awaitable));
      if (error_out) {
        error_out->status = a.status;
        error_out->body = bec ? std::string() : std::move(p.get().body());
      }
      drop();
      co_return a;
    }
    for (;;) {
      if (idle.count() > 0) stream->expires_after(idle);
      else stream->expires_never();
      auto [rec, rn] = co_await http::async_read_some(*stream, buf, p, net::as_tuple(use_awaitable));
      std::string& b = p.get().body();
      std::size_t start = 0, nl;
      while ((nl = b.find('\n', start)) != std::string::npos) {
        std::string_view line(b.data() + start, nl - start);
        start = nl + 1;
        if (!line.empty() && line.find_first_not_of(" \r\t") != std::string_view::npos && !(*on_line)(line)) {
          a.stopped = true;
          drop();
          co_return a;
        }
      }
      b.erase(0, start);
      if (rec) {
        a.ec = rec;
        drop();
        co_return a;
      }
      if (p.is_done()) {
        if (!b.empty() && !(*on_line)(b)) a.stopped = true;
        a.ended = !a.stopped;
        drop();
        co_return a;
      }
    }
  }
};

HttpConnection::HttpConnection(Options options) : impl_(std::make_unique<Impl>(std::move(options))) {}
HttpConnection::~HttpConnection() { impl_->drop(); }

void HttpConnection::close() { impl_->drop(); }

std::string HttpConnection::current_endpoint() const { return impl_->ep().origin(); }

Status HttpConnection::post(std::string_view target, std::string_view body, std::chrono::milliseconds timeout,
                            HttpResponse* out, const std::atomic<bool>* cancel, const HttpHeaders& headers) {
  Impl& m = *impl_;
  const auto deadline = Clock::now() + timeout;
  const std::size_t tries = m.opt.endpoints.size() + 1;
  std::string errors;
  for (std::size_t i = 0; i < tries; ++i) {
    const bool was_reused = m.stream.has_value() && m.reused;
    const std::string origin = m.ep().origin();
    bool cancelled = false;
    Attempt a = m.run(m.unary(std::string(target), std::string(body), headers, deadline, out), cancel, &cancelled);
    if (cancelled) {
      m.drop();
      return Status::Cancelled();
    }
    if (!a.ec && a.responded) return Status::OK();
    if (!m.failed(a, was_reused, origin, errors, deadline)) break;
  }
  return Status::Unavailable(errors);
}

Status HttpConnection::stream(std::string_view target, std::string_view body, std::chrono::milliseconds head_timeout,
                              std::chrono::milliseconds idle_timeout,
                              const std::function<bool(std::string_view)>& on_line, const std::atomic<bool>* cancel,
                              HttpResponse* error_response) {
  Impl& m = *impl_;
  const auto deadline = Clock::now() + head_timeout;
  const std::size_t tries = m.opt.endpoints.size() + 1;
  std::string errors;
  for (std::size_t i = 0; i < tries; ++i) {
    const bool was_reused = m.stream.has_value() && m.reused;
    const std::string origin = m.ep().origin();
    bool cancelled = false;
    Attempt a =
        m.run(m.streaming(std::string(target), std::string(body), deadline, idle_timeout, &on_line, error_response),
              cancel, &cancelled);
    if (cancelled) {
      m.drop();
      return Status::Cancelled();
    }
    if (a.responded) {
      if (a.status != 200) return Status::Http(a.status, "stream refused by " + origin);
      if (a.stopped) return Status::OK();
      if (a.ended) return Status::Unavailable(origin + ": stream ended");
      return Status::Unavailable(
          origin + ": stream broke: " + (a.ec == beast::error::timeout ? std::string("idle timeout") : a.ec.message()));
    }
    if (!m.failed(a, was_reused, origin, errors, deadline)) break;
  }
  return Status::Unavailable(errors);
}

}  // namespace fencegate::election
