#include "tests/support/net_util.h"

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace fencegate::testing {

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) reset(o.release());
  return *this;
}

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    auto lo = [](char c) { return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c; };
    if (lo(a[i]) != lo(b[i])) return false;
  }
  return true;
}

std::string to_lower(std::string_view s) {
  std::string r(s);
  for (char& c : r)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return r;
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string header_value(const Headers& h, std::string_view name) {
  for (const auto& [k, v] : h)
    if (iequals(k, name)) return v;
  return {};
}

std::vector<std::string> header_values(const Headers& h, std::string_view name) {
  std::vector<std::string> r;
  for (const auto& [k, v] : h)
    if (iequals(k, name)) r.push_back(v);
  return r;
}

bool has_header(const Headers& h, std::string_view name) {
  for (const auto& [k, v] : h)
    if (iequals(k, name)) return true;
  return false;
}

std::chrono::milliseconds remaining(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() < 0 ? std::chrono::milliseconds(0) : left;
}

Fd listen_loopback(std::uint16_t* port, int backlog) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return {};
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0 || ::listen(fd.get(), backlog) != 0)
    return {};
  *port = ntohs(a.sin_port);
  return fd;
}

Fd connect_loopback(std::uint16_t port, std::chrono::milliseconds timeout, std::string* error) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    if (error) *error = std::string("socket: ") + std::strerror(errno);
    return {};
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int flags = ::fcntl(fd.get(), F_GETFL);
  ::fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK);
  int rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  if (rc != 0 && errno != EINPROGRESS) {
    if (error) *error = std::string("connect: ") + std::strerror(errno);
    return {};
  }
  if (rc != 0) {
    pollfd p{fd.get(), POLLOUT, 0};
    int n = ::poll(&p, 1, int(timeout.count()));
    if (n <= 0) {
      if (error) *error = n == 0 ? "connect: timeout" : std::string("poll: ") + std::strerror(errno);
      return {};
    }
    int soerr = 0;
    socklen_t len = sizeof soerr;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &soerr, &len);
    if (soerr != 0) {
      if (error) *error = std::string("connect: ") + std::strerror(soerr);
      return {};
    }
  }
  ::fcntl(fd.get(), F_SETFL, flags);
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(std::size_t(n));
  }
  return true;
}

IoStatus read_some(int fd, std::string& buf, std::chrono::milliseconds timeout, int* err) {
  pollfd p{fd, POLLIN, 0};
  int n;
  do {
    n = ::poll(&p, 1, int(timeout.count()));
  } while (n < 0 && errno == EINTR);
  if (n == 0) return IoStatus::timeout;
  if (n < 0) {
    if (err) *err = errno;
    return IoStatus::error;
  }
  char tmp[16384];
  ssize_t r;
  do {
    r = ::recv(fd, tmp, sizeof tmp, 0);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return IoStatus::eof;
  if (r < 0) {
    if (err) *err = errno;
    return IoStatus::error;
  }
  buf.append(tmp, std::size_t(r));
  return IoStatus::data;
}

}  // namespace fencegate::testing
