// HttpConnection over Boost.Beast: each call runs C++20 coroutines on the connection's private
// io_context, driven by the calling thread (run_for in 50 ms slices so a cancel flag is noticed).
// Timeouts are the tcp_stream's expiry (steady clock), set before every connect, write and read.
// https endpoints (issue 27): a Beast ssl_stream over the same tcp_stream, from one shared
// OpenSSL context (TlsClient, built once), peer verification always on, SNI and host name check.
#include "election_client/http_conn.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509_vfy.h>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <optional>

namespace fencegate::election {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using net::awaitable;
using net::use_awaitable;
using Clock = std::chrono::steady_clock;

// Issue 27: the shared client context.
class TlsClient {
 public:
  TlsClient() : ctx(net::ssl::context::tls_client) {}
  mutable net::ssl::context ctx;  // only read after build (SSL_new takes a reference)
};

namespace {

std::string openssl_error() {
  unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  return buf;
}

// "" if `path` can be opened for reading, else why.
std::string unreadable(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return "cannot read " + path + ": " + std::strerror(errno);
  std::fclose(f);
  return {};
}

}  // namespace

std::shared_ptr<const TlsClient> make_tls_client(const TlsFiles& files, std::string* err) {
  auto t = std::make_shared<TlsClient>();
  SSL_CTX* c = t->ctx.native_handle();
  auto fail = [&](const std::string& why) {
    if (err) *err = why;
    return std::shared_ptr<const TlsClient>();
  };
  SSL_CTX_set_min_proto_version(c, TLS1_2_VERSION);
  SSL_CTX_set_options(c, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  if (!files.cacert.empty()) {
    if (auto e = unreadable(files.cacert); !e.empty()) return fail("cacert: " + e);
    if (SSL_CTX_load_verify_locations(c, files.cacert.c_str(), nullptr) != 1)
      return fail("cacert: " + files.cacert + " holds no PEM CA certificate (" + openssl_error() + ")");
  } else if (SSL_CTX_set_default_verify_paths(c) != 1) {
    return fail("cacert: the system CA store does not load (" + openssl_error() + "); give a CA file");
  }
  if (files.cert.empty() != files.key.empty())
    return fail(files.cert.empty() ? "cert: required with key (the client certificate of that key)"
                                   : "key: required with cert (the client certificate's private key)");
  if (!files.cert.empty()) {
    if (auto e = unreadable(files.cert); !e.empty()) return fail("cert: " + e);
    if (auto e = unreadable(files.key); !e.empty()) return fail("key: " + e);
    if (SSL_CTX_use_certificate_chain_file(c, files.cert.c_str()) != 1)
      return fail("cert: " + files.cert + " holds no PEM certificate (" + openssl_error() + ")");
    if (SSL_CTX_use_PrivateKey_file(c, files.key.c_str(), SSL_FILETYPE_PEM) != 1)
      return fail("key: " + files.key + " holds no PEM private key (" + openssl_error() + ")");
    if (SSL_CTX_check_private_key(c) != 1)
      return fail("key: " + files.key + " does not match the certificate in " + files.cert);
  }
  SSL_CTX_set_verify(c, SSL_VERIFY_PEER, nullptr);
  ERR_clear_error();
  return t;
}

bool parse_http_url(std::string_view s, HttpUrl* out, std::string* err, bool allow_https) {
  auto fail = [&](const std::string& why) {
    if (err) *err = why + " (got \"" + std::string(s) + "\")";
    return false;
  };
  constexpr std::string_view kScheme = "http://", kTlsScheme = "https://";
  const bool tls = allow_https && s.substr(0, kTlsScheme.size()) == kTlsScheme;
  if (!tls && s.substr(0, kScheme.size()) != kScheme)
    return fail(allow_https ? "must be an http:// or https:// URL" : "must be an http:// URL");
  std::string_view rest = s.substr(tls ? kTlsScheme.size() : kScheme.size());
  std::size_t slash = rest.find('/');
  std::string_view hostport = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  if (path.find_first_of("?# ") != std::string_view::npos) return fail("must not have a query, fragment or space");
  HttpUrl u;
  u.tls = tls;
  if (tls) u.port = 443;
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

using TlsStream = beast::ssl_stream<beast::tcp_stream>;

// Issue 27: a TLS failure in words an operator can act on (the flag or setting to check).
std::string describe_tls(const beast::error_code& ec, long verify_result) {
  std::string m = ec.message();
  if (verify_result != X509_V_OK)
    return "TLS handshake failed: the server's certificate does not verify: " +
           std::string(X509_verify_cert_error_string(verify_result)) +
           " (check the CA file, --cacert / cacert, and that the certificate names this host)";
  if (m.find("certificate required") != std::string::npos || m.find("bad certificate") != std::string::npos ||
      m.find("unknown ca") != std::string::npos || m.find("handshake failure") != std::string::npos ||
      m.find("certificate unknown") != std::string::npos)
    return "TLS: the server refused the connection (" + m +
           "): it requires a client certificate it trusts (--cert/--key, or cert/key)";
  if (m.find("wrong version number") != std::string::npos || m.find("packet length too long") != std::string::npos ||
      m.find("record layer failure") != std::string::npos)
    return "TLS handshake failed (" + m + "): is the endpoint plain http?";
  return "TLS: " + m;
}

}  // namespace

struct HttpConnection::Impl {
  explicit Impl(Options o) : opt(std::move(o)) {
    for (const auto& e : opt.endpoints)
      if (e.tls && !opt.tls) {
        std::string why;
        opt.tls = make_tls_client(TlsFiles{}, &why);  // the system store; verification on
        break;
      }
  }

  // Constant after construction
  Options opt;

  net::io_context ioc;
  std::optional<beast::tcp_stream> stream;  // plain http
  std::optional<TlsStream> tls_stream;      // https (issue 27)
  beast::flat_buffer buf;
  std::size_t cur = 0;    // endpoint in use
  bool reused = false;    // the open connection has completed a request before
  std::string tls_why;    // the last handshake failure in words (describe_tls)

  const HttpUrl& ep() const { return opt.endpoints[cur]; }
  void advance() { cur = (cur + 1) % opt.endpoints.size(); }
  bool open() const { return stream.has_value() || tls_stream.has_value(); }
  beast::tcp_stream& lowest() { return tls_stream ? beast::get_lowest_layer(*tls_stream) : *stream; }

  std::string explain(const beast::error_code& ec) {
    if (ec == beast::error::timeout) return "timed out";
    if (!tls_why.empty()) return std::exchange(tls_why, std::string());
    if (ec.category() == net::error::get_ssl_category() || ec == net::ssl::error::stream_truncated)
      return describe_tls(ec, X509_V_OK);
    return ec.message();
  }

  // An attempt on `origin` that got no answer: the connection is dropped and the failure added
  // to `errors`. A kept-alive connection the server had already closed is retried on the same
  // endpoint once; not after a timeout (a member that hangs would get every later call too).
  // Returns true iff there is time left for another attempt.
  bool failed(const Attempt& a, bool was_reused, const std::string& origin, std::string& errors,
              Clock::time_point deadline) {
    drop();
    if (!errors.empty()) errors += "; ";
    errors += origin + ": " + explain(a.ec);
    if (!was_reused || a.ec == beast::error::timeout) advance();
    return Clock::now() < deadline;
  }

  void drop() {
    if (open()) {
      beast::error_code ig;
      lowest().socket().shutdown(tcp::socket::shutdown_both, ig);
      lowest().close();
    }
    tls_stream.reset();
    stream.reset();
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
        if (open()) lowest().cancel();
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
    if (ep().tls) {
      if (!opt.tls) {
        stream.reset();
        tls_why = "TLS: no usable CA store for https (give a CA file)";
        co_return net::error::no_protocol_option;
      }
      tls_stream.emplace(std::move(*stream), opt.tls->ctx);
      stream.reset();
      SSL* ssl = tls_stream->native_handle();
      // The host name check: a DNS name (also sent as SNI), or an IP address in the SAN.
      const std::string& host = ep().host;
      beast::error_code aec;
      net::ip::make_address(host, aec);
      if (aec) {
        SSL_set_tlsext_host_name(ssl, host.c_str());
        SSL_set1_host(ssl, host.c_str());
      } else {
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host.c_str());
      }
      beast::get_lowest_layer(*tls_stream).expires_at(std::min(deadline, Clock::now() + opt.connect_timeout));
      auto [hec] = co_await tls_stream->async_handshake(net::ssl::stream_base::client, net::as_tuple(use_awaitable));
      if (hec) {
        tls_why = hec == beast::error::timeout ? std::string("TLS handshake timed out")
                                               : describe_tls(hec, SSL_get_verify_result(ssl));
        drop();
        co_return hec;
      }
    }
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

  // Connects if needed; the deadline covers it.
  awaitable<beast::error_code> ensure_open(Clock::time_point deadline) {
    if (open()) co_return beast::error_code{};
    co_return co_await connect(deadline);
  }

  template <class S>
  awaitable<beast::error_code> send(S& s, std::string_view target, std::string_view body, const HttpHeaders& headers,
                                    Clock::time_point deadline) {
    auto req = make_request(target, body, headers);
    lowest().expires_at(deadline);
    auto [wec, wn] = co_await http::async_write(s, req, net::as_tuple(use_awaitable));
    co_return wec;
  }

  awaitable<Attempt> unary(std::string target, std::string body, HttpHeaders headers, Clock::time_point deadline,
                           HttpResponse* out) {
    Attempt a;
    a.ec = co_await ensure_open(deadline);
    if (a.ec) co_return a;
    if (tls_stream) co_return co_await unary_on(*tls_stream, target, body, headers, deadline, out);
    co_return co_await unary_on(*stream, target, body, headers, deadline, out);
  }

  template <class S>
  awaitable<Attempt> unary_on(S& s, const std::string& target, const std::string& body, const HttpHeaders& headers,
                              Clock::time_point deadline, HttpResponse* out) {
    Attempt a;
    a.ec = co_await send(s, target, body, headers, deadline);
    if (a.ec) co_return a;
    http::response_parser<http::string_body> p;
    p.header_limit(64 * 1024);
    p.body_limit(opt.max_body_bytes);
    auto [rec, rn] = co_await http::async_read(s, buf, p, net::as_tuple(use_awaitable));
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
      lowest().expires_never();
      reused = true;
    }
    co_return a;
  }

  awaitable<Attempt> streaming(std::string target, std::string body, HttpHeaders headers,
                               Clock::time_point head_deadline, std::chrono::milliseconds idle,
                               const std::function<bool(std::string_view)>* on_line, HttpResponse* error_out) {
    Attempt a;
    a.ec = co_await ensure_open(head_deadline);
    if (a.ec) co_return a;
    if (tls_stream)
      co_return co_await streaming_on(*tls_stream, target, body, headers, head_deadline, idle, on_line, error_out);
    co_return co_await streaming_on(*stream, target, body, headers, head_deadline, idle, on_line, error_out);
  }

  template <class S>
  awaitable<Attempt> streaming_on(S& s, const std::string& target, const std::string& body, const HttpHeaders& headers,
                                  Clock::time_point head_deadline, std::chrono::milliseconds idle,
                                  const std::function<bool(std::string_view)>* on_line, HttpResponse* error_out) {
    Attempt a;
    a.ec = co_await send(s, target, body, headers, head_deadline);
    if (a.ec) co_return a;
    http::response_parser<http::string_body> p;
    p.header_limit(64 * 1024);
    p.body_limit(boost::none);  // the stream is consumed line by line below
    auto [hec, hn] = co_await http::async_read_header(s, buf, p, net::as_tuple(use_awaitable));
    if (hec) {
      a.ec = hec;
      co_return a;
    }
    a.responded = true;
    a.status = p.get().result_int();
    if (a.status != 200) {
      p.body_limit(opt.max_body_bytes);
      auto [bec, bn] = co_await http::async_read(s, buf, p, net::as_tuple(use_awaitable));
      if (error_out) {
        error_out->status = a.status;
        error_out->body = bec ? std::string() : std::move(p.get().body());
      }
      drop();
      co_return a;
    }
    for (;;) {
      if (idle.count() > 0) lowest().expires_after(idle);
      else lowest().expires_never();
      auto [rec, rn] = co_await http::async_read_some(s, buf, p, net::as_tuple(use_awaitable));
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
    const bool was_reused = m.open() && m.reused;
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
                              HttpResponse* error_response, const HttpHeaders& headers) {
  Impl& m = *impl_;
  const auto deadline = Clock::now() + head_timeout;
  const std::size_t tries = m.opt.endpoints.size() + 1;
  std::string errors;
  for (std::size_t i = 0; i < tries; ++i) {
    const bool was_reused = m.open() && m.reused;
    const std::string origin = m.ep().origin();
    bool cancelled = false;
    Attempt a = m.run(m.streaming(std::string(target), std::string(body), headers, deadline, idle_timeout, &on_line,
                                  error_response),
                      cancel, &cancelled);
    if (cancelled) {
      m.drop();
      return Status::Cancelled();
    }
    if (a.responded) {
      if (a.status != 200) return Status::Http(a.status, "stream refused by " + origin);
      if (a.stopped) return Status::OK();
      if (a.ended) return Status::Unavailable(origin + ": stream ended");
      return Status::Unavailable(origin + ": stream broke: " +
                                 (a.ec == beast::error::timeout ? std::string("idle timeout") : m.explain(a.ec)));
    }
    if (!m.failed(a, was_reused, origin, errors, deadline)) break;
  }
  return Status::Unavailable(errors);
}

}  // namespace fencegate::election
