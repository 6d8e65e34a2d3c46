#include "tests/support/upstream.h"

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdexcept>
#include <sys/socket.h>
#include <unistd.h>

namespace fencegate::testing {

namespace {

constexpr std::size_t kMaxHead = 64 * 1024;
constexpr int kPollMs = 50;

struct ParseError {
  std::string what;
};

bool is_tchar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != '\0';
}

std::string json_escape(std::string_view s) {
  std::string r;
  for (char c : s) {
    switch (c) {
      case '"': r += "\\\""; break;
      case '\\': r += "\\\\"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char tmp[8];
          std::snprintf(tmp, sizeof tmp, "\\u%04x", c);
          r += tmp;
        } else {
          r += c;
        }
    }
  }
  return r;
}

const char* reason_for(int status) {
  switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 409: return "Conflict";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Status";
  }
}

// Parses a request head (without the final CRLF CRLF). Throws ParseError.
void parse_head(std::string_view head, RecordedRequest& r) {
  std::vector<std::string_view> lines;
  while (true) {
    auto pos = head.find("\r\n");
    if (pos == std::string_view::npos) {
      lines.push_back(head);
      break;
    }
    lines.push_back(head.substr(0, pos));
    head.remove_prefix(pos + 2);
  }
  for (auto l : lines)
    if (l.find('\n') != std::string_view::npos || l.find('\r') != std::string_view::npos)
      throw ParseError{"bare CR or LF in head"};
  std::string_view rl = lines.at(0);
  auto sp1 = rl.find(' ');
  auto sp2 = rl.rfind(' ');
  if (sp1 == std::string_view::npos || sp2 == sp1) throw ParseError{"bad request line"};
  r.method = std::string(rl.substr(0, sp1));
  r.target = std::string(rl.substr(sp1 + 1, sp2 - sp1 - 1));
  r.version = std::string(rl.substr(sp2 + 1));
  if (r.method.empty() || r.target.empty() || r.target.find(' ') != std::string::npos)
    throw ParseError{"bad request line"};
  for (char c : r.method)
    if (!is_tchar(c)) throw ParseError{"bad method"};
  if (r.version != "HTTP/1.1" && r.version != "HTTP/1.0") throw ParseError{"bad version " + r.version};
  for (std::size_t i = 1; i < lines.size(); ++i) {
    std::string_view l = lines[i];
    if (!l.empty() && (l[0] == ' ' || l[0] == '\t')) throw ParseError{"obs-fold"};
    auto colon = l.find(':');
    if (colon == std::string_view::npos || colon == 0) throw ParseError{"header without name"};
    std::string_view name = l.substr(0, colon);
    for (char c : name)
      if (!is_tchar(c)) throw ParseError{"invalid header name"};
    std::string_view value = trim_ows(l.substr(colon + 1));
    for (char c : value)
      if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f)
        throw ParseError{"control character in header value"};
    r.headers.emplace_back(std::string(name), std::string(value));
  }
}

}  // namespace

const char* to_string(Outcome o) {
  switch (o) {
    case Outcome::pending: return "pending";
    case Outcome::responded: return "responded";
    case Outcome::write_failed: return "write_failed";
    case Outcome::aborted_by_peer: return "aborted_by_peer";
    case Outcome::reset: return "reset";
    case Outcome::closed: return "closed";
    case Outcome::stopped: return "stopped";
  }
  return "?";
}

std::optional<std::int64_t> RecordedRequest::fencing_token(std::string_view name) const {
  if (!has(name)) return std::nullopt;
  std::string v(trim_ows(header(name)));
  if (v.empty() || v.size() > 19) return std::nullopt;
  std::int64_t n = 0;
  for (char c : v) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  return n;
}

RecordingUpstream::RecordingUpstream(Hook hook) : hook_(std::move(hook)) {
  listener_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!listener_.valid()) throw std::runtime_error(std::string("upstream socket: ") + std::strerror(errno));
  int one = 1;
  ::setsockopt(listener_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener_.get(), 512) != 0)
    throw std::runtime_error(std::string("upstream bind/listen: ") + std::strerror(errno));
  socklen_t len = sizeof addr;
  ::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { accept_loop(); });
}

RecordingUpstream::~RecordingUpstream() { stop(); }

void RecordingUpstream::set_hook(Hook hook) {
  std::lock_guard lk(mu_);
  hook_ = std::move(hook);
}

std::vector<RecordedRequest> RecordingUpstream::requests() const {
  std::lock_guard lk(mu_);
  return requests_;
}

std::size_t RecordingUpstream::count() const {
  std::lock_guard lk(mu_);
  return requests_.size();
}

std::vector<std::string> RecordingUpstream::parse_errors() const {
  std::lock_guard lk(mu_);
  return parse_errors_;
}

bool RecordingUpstream::wait_for_count(std::size_t n, std::chrono::milliseconds timeout) const {
  std::unique_lock lk(mu_);
  return cv_.wait_for(lk, timeout, [&] { return requests_.size() >= n; });
}

bool RecordingUpstream::wait_for_outcome(std::size_t index, std::chrono::milliseconds timeout) const {
  std::unique_lock lk(mu_);
  return cv_.wait_for(lk, timeout,
                      [&] { return index < requests_.size() && requests_[index].outcome != Outcome::pending; });
}

void RecordingUpstream::stop() {
  if (stopping_.exchange(true)) {
    // Another caller is stopping or has stopped; wait for it by joining nothing more.
    return;
  }
  if (acceptor_.joinable()) acceptor_.join();
  std::list<std::thread> threads;
  {
    std::lock_guard lk(mu_);
    for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
    threads.swap(threads_);
  }
  for (auto& t : threads) t.join();
  listener_.reset();
  std::lock_guard lk(mu_);
  stopped_ = true;
}

void RecordingUpstream::accept_loop() {
  std::uint64_t next_id = 1;
  while (!stopping_.load()) {
    pollfd p{listener_.get(), POLLIN, 0};
    int n = ::poll(&p, 1, kPollMs);
    if (n <= 0) continue;
    int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    connections_.fetch_add(1);
    std::uint64_t id = next_id++;
    std::lock_guard lk(mu_);
    open_fds_.push_back(fd);
    threads_.emplace_back([this, fd, id] { serve(fd, id); });
  }
}

std::size_t RecordingUpstream::record(RecordedRequest r) {
  std::lock_guard lk(mu_);
  r.index = requests_.size();
  requests_.push_back(std::move(r));
  cv_.notify_all();
  return requests_.size() - 1;
}

void RecordingUpstream::finish(std::size_t index, Outcome o, Clock::time_point t) {
  std::lock_guard lk(mu_);
  requests_[index].outcome = o;
  requests_[index].completion = t;
  cv_.notify_all();
}

bool RecordingUpstream::watchful_wait(int fd, int ms, bool* peer_gone) {
  *peer_gone = false;
  auto deadline = Clock::now() + std::chrono::milliseconds(ms < 0 ? 0 : ms);
  while (!stopping_.load()) {
    int wait = kPollMs;
    if (ms >= 0) {
      auto left = remaining(deadline).count();
      if (left <= 0) return true;
      wait = int(std::min<long long>(left, kPollMs));
    }
    pollfd p{fd, POLLRDHUP, 0};
    int n = ::poll(&p, 1, wait);
    if (stopping_.load()) return false;  // stop() shuts sockets down; that is not the peer
    if (n > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
      *peer_gone = true;
      return false;
    }
  }
  return false;
}

void RecordingUpstream::serve(int fd, std::uint64_t conn_id) {
  std::string buf;
  // Reads more into buf; returns false on EOF/error/stop.
  auto fill = [&](bool* eof) {
    *eof = false;
    while (!stopping_.load()) {
      IoStatus s = read_some(fd, buf, std::chrono::milliseconds(kPollMs));
      if (s == IoStatus::data) return true;
      if (s == IoStatus::timeout) continue;
      *eof = true;
      return false;
    }
    return false;
  };
  auto fail = [&](std::string why) {
    {
      std::lock_guard lk(mu_);
      parse_errors_.push_back("connection " + std::to_string(conn_id) + ": " + why);
      cv_.notify_all();
    }
    write_all(fd, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  };

  bool keep_alive = true;
  while (keep_alive && !stopping_.load()) {
    // 1. The head.
    std::size_t head_end;
    bool eof = false;
    while ((head_end = buf.find("\r\n\r\n")) == std::string::npos) {
      if (buf.find("\n\n") != std::string::npos) break;
      if (buf.size() > kMaxHead) break;
      if (!fill(&eof)) break;
    }
    if (head_end == std::string::npos) {
      if (buf.find("\n\n") != std::string::npos) fail("bare LF line endings");
      else if (buf.size() > kMaxHead) fail("head too large");
      else if (eof && !buf.empty()) fail("connection closed inside a request head (" + std::to_string(buf.size()) + " bytes)");
      break;
    }
    RecordedRequest r;
    r.arrival = Clock::now();
    r.connection_id = conn_id;
    r.raw_head = buf.substr(0, head_end + 4);
    buf.erase(0, head_end + 4);
    try {
      parse_head(std::string_view(r.raw_head).substr(0, head_end), r);
      // 2. The body framing, strictly.
      auto te = r.headers_named("Transfer-Encoding");
      auto cl = r.headers_named("Content-Length");
      if (!te.empty() && !cl.empty()) throw ParseError{"both Content-Length and Transfer-Encoding"};
      if (te.size() > 1 || (te.size() == 1 && !iequals(te[0], "chunked")))
        throw ParseError{"unsupported Transfer-Encoding"};
      if (cl.size() > 1) throw ParseError{"several Content-Length headers"};
      if (te.size() == 1) {
        r.chunked = true;
        std::size_t pos = 0;  // parse position in buf
        auto need_line = [&]() -> std::string {
          std::size_t e;
          while ((e = buf.find("\r\n", pos)) == std::string::npos) {
            bool eof2;
            if (!fill(&eof2)) throw ParseError{"connection closed inside a chunked body"};
          }
          std::string line = buf.substr(pos, e - pos);
          pos = e + 2;
          return line;
        };
        while (true) {
          std::string line = need_line();
          std::string size_part = line.substr(0, line.find(';'));
          if (size_part.empty() || size_part.size() > 15) throw ParseError{"bad chunk size"};
          std::size_t size = 0;
          for (char c : size_part) {
            int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                  : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
            if (d < 0) throw ParseError{"bad chunk size"};
            size = size * 16 + std::size_t(d);
          }
          if (size == 0) {
            while (!need_line().empty()) {}  // trailers
            break;
          }
          while (buf.size() < pos + size + 2) {
            bool eof2;
            if (!fill(&eof2)) throw ParseError{"connection closed inside a chunk"};
          }
          if (buf.compare(pos + size, 2, "\r\n") != 0) throw ParseError{"chunk not followed by CRLF"};
          r.body.append(buf, pos, size);
          pos += size + 2;
        }
        r.raw_body = buf.substr(0, pos);
        buf.erase(0, pos);
      } else if (cl.size() == 1) {
        const std::string& v = cl[0];
        if (v.empty() || v.size() > 15 || v.find_first_not_of("0123456789") != std::string::npos)
          throw ParseError{"bad Content-Length " + v};
        std::size_t n = std::stoull(v);
        while (buf.size() < n) {
          bool eof2;
          if (!fill(&eof2)) throw ParseError{"connection closed inside a body (" + std::to_string(buf.size()) + "/" + v + ")"};
        }
        r.body = buf.substr(0, n);
        r.raw_body = r.body;
        buf.erase(0, n);
      }
    } catch (const ParseError& e) {
      fail(e.what + " in request " + r.method + " " + r.target);
      break;
    }

    std::string conn = to_lower(r.header("Connection"));
    if (conn.find("close") != std::string::npos || (r.version == "HTTP/1.0" && conn.find("keep-alive") == std::string::npos))
      keep_alive = false;

    Hook hook;
    {
      std::lock_guard lk(mu_);
      hook = hook_;
    }
    RecordedRequest copy = r;
    std::size_t index = record(std::move(r));
    copy.index = index;
    UpstreamAction action = hook ? hook(copy) : UpstreamAction{};

    bool peer_gone = false;
    if (action.kind == UpstreamAction::Kind::hang) {
      watchful_wait(fd, -1, &peer_gone);
      finish(index, peer_gone ? Outcome::aborted_by_peer : Outcome::stopped, Clock::now());
      break;
    }
    if (action.kind == UpstreamAction::Kind::reset) {
      linger lg{1, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
      finish(index, Outcome::reset, Clock::now());
      break;
    }
    if (action.kind == UpstreamAction::Kind::close) {
      finish(index, Outcome::closed, Clock::now());
      ::shutdown(fd, SHUT_RDWR);
      break;
    }
    bool waited = true;
    if (!action.interim.empty()) write_all(fd, action.interim);
    for (int left = action.delay_ms; left > 0 && waited;) {
      const int slice = action.interim_every_ms > 0 ? std::min(left, action.interim_every_ms) : left;
      waited = watchful_wait(fd, slice, &peer_gone);
      left -= slice;
      if (waited && left > 0 && !action.interim.empty() && action.interim_every_ms > 0) write_all(fd, action.interim);
    }
    if (!waited) {
      finish(index, peer_gone ? Outcome::aborted_by_peer : Outcome::stopped, Clock::now());
      break;
    }
    std::string body = action.body ? *action.body
                                   : "{\"method\":\"" + json_escape(copy.method) + "\",\"target\":\"" +
                                         json_escape(copy.target) + "\",\"index\":" + std::to_string(index) + "}";
    std::string resp = "HTTP/1.1 " + std::to_string(action.status) + " " + reason_for(action.status) + "\r\n";
    bool has_ct = false;
    for (const auto& [k, v] : action.headers) {
      resp += k + ": " + v + "\r\n";
      if (iequals(k, "Content-Type")) has_ct = true;
      if (iequals(k, "Connection") && to_lower(v).find("close") != std::string::npos) keep_alive = false;
    }
    if (!has_ct && !action.body) resp += "Content-Type: application/json\r\n";
    bool no_body = copy.method == "HEAD" || action.status == 204 || action.status == 304;
    if (action.status != 204 && action.status != 304) resp += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    if (!keep_alive && !has_header(action.headers, "Connection")) resp += "Connection: close\r\n";
    resp += "\r\n";
    if (!no_body) resp += body;
    // Completion is stamped before the write: the proxy cannot hold the whole response earlier.
    finish(index, Outcome::responded, Clock::now());
    if (!write_all(fd, resp)) {
      std::lock_guard lk(mu_);
      requests_[index].outcome = Outcome::write_failed;
      break;
    }
  }
  {
    std::lock_guard lk(mu_);
    std::erase(open_fds_, fd);
  }
  ::close(fd);
}

}  // namespace fencegate::testing
