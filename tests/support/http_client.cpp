#include "tests/support/http_client.h"

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <netinet/in.h>
#include <sys/socket.h>

namespace fencegate::testing {

const char* to_string(ReadStatus s) {
  switch (s) {
    case ReadStatus::ok: return "ok";
    case ReadStatus::closed: return "closed";
    case ReadStatus::reset: return "reset";
    case ReadStatus::timeout: return "timeout";
    case ReadStatus::invalid: return "invalid";
  }
  return "?";
}

bool HttpClient::connect(std::uint16_t port, std::chrono::milliseconds timeout) {
  buf_.clear();
  eof_ = false;
  fd_ = connect_loopback(port, timeout, &error_);
  return fd_.valid();
}

std::uint16_t HttpClient::local_port() const {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (!fd_.valid() || ::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) return 0;
  return ntohs(a.sin_port);
}

bool HttpClient::send(std::string_view bytes) {
  if (!fd_.valid()) {
    error_ = "send: not connected";
    return false;
  }
  if (!write_all(fd_.get(), bytes)) {
    error_ = std::string("send: ") + std::strerror(errno);
    return false;
  }
  return true;
}

void HttpClient::shutdown_write() {
  if (fd_.valid()) ::shutdown(fd_.get(), SHUT_WR);
}

void HttpClient::close() { fd_.reset(); }

bool HttpClient::fill(Clock::time_point deadline, ReadStatus* status) {
  if (eof_) {
    *status = ReadStatus::closed;
    return false;
  }
  int err = 0;
  IoStatus s = read_some(fd_.get(), buf_, remaining(deadline), &err);
  switch (s) {
    case IoStatus::data: return true;
    case IoStatus::eof:
      eof_ = true;
      *status = ReadStatus::closed;
      error_ = "connection closed";
      return false;
    case IoStatus::timeout:
      *status = ReadStatus::timeout;
      error_ = "timeout";
      return false;
    case IoStatus::error:
      *status = ReadStatus::reset;
      error_ = std::string("read: ") + std::strerror(err);
      return false;
  }
  return false;
}

bool HttpClient::wait_closed(std::chrono::milliseconds timeout) {
  if (!fd_.valid()) return true;
  auto deadline = Clock::now() + timeout;
  while (true) {
    ReadStatus st;
    if (fill(deadline, &st)) continue;
    return st == ReadStatus::closed || st == ReadStatus::reset;
  }
}

bool HttpClient::stays_silent(std::chrono::milliseconds for_how_long) {
  std::size_t before = buf_.size();
  ReadStatus st;
  bool got = fill(Clock::now() + for_how_long, &st);
  return !got && st == ReadStatus::timeout && buf_.size() == before;
}

ReadResult HttpClient::read_response(std::chrono::milliseconds timeout, bool expect_no_body) {
  ReadResult out;
  if (!fd_.valid()) {
    out.status = ReadStatus::closed;
    out.error = "not connected";
    return out;
  }
  auto deadline = Clock::now() + timeout;
  auto fail = [&](ReadStatus st, std::string why) {
    out.status = st;
    out.error = std::move(why);
    if (!buf_.empty()) out.error += " (partial: " + buf_.substr(0, 200) + ")";
    return out;
  };
  while (true) {  // loops over 1xx interim responses
    std::size_t head_end;
    while ((head_end = buf_.find("\r\n\r\n")) == std::string::npos) {
      ReadStatus st;
      if (!fill(deadline, &st)) {
        if (st == ReadStatus::closed && !buf_.empty()) st = ReadStatus::reset;  // truncated
        return fail(st, error_);
      }
    }
    Response r;
    std::string_view head(buf_.data(), head_end);
    std::size_t line_end = head.find("\r\n");
    std::string_view status_line = head.substr(0, line_end);
    auto sp1 = status_line.find(' ');
    if (sp1 == std::string_view::npos || status_line.size() < sp1 + 4)
      return fail(ReadStatus::invalid, "bad status line: " + std::string(status_line));
    r.version = std::string(status_line.substr(0, sp1));
    std::string code(status_line.substr(sp1 + 1, 3));
    if (code.find_first_not_of("0123456789") != std::string::npos)
      return fail(ReadStatus::invalid, "bad status code: " + std::string(status_line));
    r.status = std::stoi(code);
    if (status_line.size() > sp1 + 5) r.reason = std::string(status_line.substr(sp1 + 5));
    if (line_end != std::string_view::npos) {
      std::string_view rest = head.substr(line_end + 2);
      while (!rest.empty()) {
        auto e = rest.find("\r\n");
        std::string_view line = rest.substr(0, e);
        rest = e == std::string_view::npos ? std::string_view{} : rest.substr(e + 2);
        auto colon = line.find(':');
        if (colon == std::string_view::npos) return fail(ReadStatus::invalid, "bad header line: " + std::string(line));
        r.headers.emplace_back(std::string(line.substr(0, colon)), std::string(trim_ows(line.substr(colon + 1))));
      }
    }
    buf_.erase(0, head_end + 4);
    if (r.status >= 100 && r.status < 200 && r.status != 101) continue;  // interim

    bool no_body = expect_no_body || r.status == 204 || r.status == 304 || (r.status >= 100 && r.status < 200);
    std::string te = to_lower(r.header("Transfer-Encoding"));
    if (no_body) {
    } else if (!te.empty()) {
      if (te.find("chunked") == std::string::npos) return fail(ReadStatus::invalid, "unsupported Transfer-Encoding " + te);
      std::size_t pos = 0;
      auto line = [&](std::string* l) -> bool {
        std::size_t e;
        while ((e = buf_.find("\r\n", pos)) == std::string::npos) {
          ReadStatus st;
          if (!fill(deadline, &st)) {
            out.status = st == ReadStatus::closed ? ReadStatus::reset : st;
            return false;
          }
        }
        *l = buf_.substr(pos, e - pos);
        pos = e + 2;
        return true;
      };
      while (true) {
        std::string l;
        if (!line(&l)) return fail(out.status, "inside chunked body: " + error_);
        std::size_t size = std::stoul(l.substr(0, l.find(';')), nullptr, 16);
        if (size == 0) {
          while (true) {
            if (!line(&l)) return fail(out.status, "inside trailers: " + error_);
            if (l.empty()) break;
          }
          break;
        }
        while (buf_.size() < pos + size + 2) {
          ReadStatus st;
          if (!fill(deadline, &st)) return fail(st == ReadStatus::closed ? ReadStatus::reset : st, "inside chunk: " + error_);
        }
        r.body.append(buf_, pos, size);
        pos += size + 2;
      }
      buf_.erase(0, pos);
    } else if (r.has("Content-Length")) {
      std::size_t n = std::stoull(r.header("Content-Length"));
      while (buf_.size() < n) {
        ReadStatus st;
        if (!fill(deadline, &st)) return fail(st == ReadStatus::closed ? ReadStatus::reset : st, "inside body: " + error_);
      }
      r.body = buf_.substr(0, n);
      buf_.erase(0, n);
    } else {
      // Close-delimited.
      while (true) {
        ReadStatus st;
        if (!fill(deadline, &st)) {
          if (st != ReadStatus::closed) return fail(st, "inside close-delimited body: " + error_);
          break;
        }
      }
      r.body = std::move(buf_);
      buf_.clear();
    }
    out.status = ReadStatus::ok;
    out.response = std::move(r);
    return out;
  }
}

ReadResult HttpClient::request(std::string_view method, std::string_view target, const Headers& headers,
                               std::string_view body, std::chrono::milliseconds timeout) {
  if (!send(build_request(method, target, headers, body))) {
    ReadResult r;
    r.status = ReadStatus::reset;
    r.error = error_;
    return r;
  }
  return read_response(timeout, method == "HEAD");
}

std::string build_request(std::string_view method, std::string_view target, const Headers& headers,
                          std::string_view body) {
  std::string s;
  s.append(method).append(" ").append(target).append(" HTTP/1.1\r\n");
  if (!has_header(headers, "Host")) s += "Host: 127.0.0.1\r\n";
  for (const auto& [k, v] : headers) s += k + ": " + v + "\r\n";
  bool framed = has_header(headers, "Content-Length") || has_header(headers, "Transfer-Encoding");
  if (!framed && (!body.empty() || method == "POST" || method == "PUT" || method == "PATCH"))
    s += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  s += "\r\n";
  s.append(body);
  return s;
}

ReadResult request(std::uint16_t port, std::string_view method, std::string_view target, const Headers& headers,
                   std::string_view body, std::chrono::milliseconds timeout) {
  HttpClient c;
  if (!c.connect(port)) {
    ReadResult r;
    r.status = ReadStatus::reset;
    r.error = c.last_error();
    return r;
  }
  return c.request(method, target, headers, body, timeout);
}

ReadResult send_raw(HttpClient& c, std::uint16_t port, std::string_view bytes, std::chrono::milliseconds timeout) {
  ReadResult r;
  if (!c.connect(port)) {
    r.status = ReadStatus::reset;
    r.error = c.last_error();
    return r;
  }
  if (!c.send(bytes)) {
    r.status = ReadStatus::reset;
    r.error = c.last_error();
    return r;
  }
  return c.read_response(timeout);
}

std::string chunked(std::string_view body, std::size_t chunk) {
  std::string s;
  char hex[32];
  while (!body.empty()) {
    std::size_t n = std::min(chunk, body.size());
    std::snprintf(hex, sizeof hex, "%zx\r\n", n);
    s += hex;
    s.append(body.substr(0, n)).append("\r\n");
    body.remove_prefix(n);
  }
  s += "0\r\n\r\n";
  return s;
}

std::string describe(const ReadResult& r) {
  if (!r.ok()) return std::string(to_string(r.status)) + ": " + r.error;
  std::string s = std::to_string(r.response.status) + " " + r.response.reason;
  for (const auto& [k, v] : r.response.headers) s += "\n  " + k + ": " + v;
  s += "\n  " + r.response.body.substr(0, 500);
  return s;
}

}  // namespace fencegate::testing
