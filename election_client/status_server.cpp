// elect's /readyz and /metrics (see status_server.h).
#include "election_client/status_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace fencegate::election {

namespace {

constexpr double kMarginBounds[] = {0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60};

std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

void ElectMetrics::campaign() {
  std::lock_guard lk(mu_);
  ++campaigns_;
}

void ElectMetrics::loss(const std::string& reason) {
  std::lock_guard lk(mu_);
  ++losses_[reason];
}

void ElectMetrics::stage(const std::string& stage, std::chrono::nanoseconds d) {
  std::lock_guard lk(mu_);
  stages_[stage] = std::chrono::duration<double>(d).count();
}

void ElectMetrics::renewal_margin(std::chrono::nanoseconds left) {
  const double s = std::chrono::duration<double>(left).count();
  std::lock_guard lk(mu_);
  if (margin_buckets_.empty()) margin_buckets_.assign(std::size(kMarginBounds), 0);
  for (std::size_t i = 0; i < std::size(kMarginBounds); ++i)
    if (s <= kMarginBounds[i]) {
      ++margin_buckets_[i];
      break;
    }
  ++margin_count_;
  margin_sum_ += s;
}

void ElectMetrics::set_ready(bool ready, std::int64_t generation) {
  std::lock_guard lk(mu_);
  if (ready && !ready_) since_ = std::chrono::steady_clock::now();
  ready_ = ready;
  if (generation) generation_ = generation;
}

bool ElectMetrics::ready() const {
  std::lock_guard lk(mu_);
  return ready_;
}

std::string ElectMetrics::render() const {
  std::lock_guard lk(mu_);
  std::string o;
  o += "# HELP fencegate_elect_leader 1 while this process leads with its activation barrier complete.\n"
       "# TYPE fencegate_elect_leader gauge\n";
  o += "fencegate_elect_leader " + std::string(ready_ ? "1" : "0") + "\n";
  o += "# HELP fencegate_elect_generation The fencing token of the current or last term.\n"
       "# TYPE fencegate_elect_generation gauge\n";
  o += "fencegate_elect_generation " + std::to_string(generation_) + "\n";
  o += "# HELP fencegate_elect_leadership_seconds How long the current term has been active (0: not leading).\n"
       "# TYPE fencegate_elect_leadership_seconds gauge\n";
  o += "fencegate_elect_leadership_seconds " +
       fmt(ready_ ? std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count() : 0.0) + "\n";
  o += "# HELP fencegate_elect_campaigns_total Campaigns started.\n# TYPE fencegate_elect_campaigns_total counter\n";
  o += "fencegate_elect_campaigns_total " + std::to_string(campaigns_) + "\n";
  o += "# HELP fencegate_elect_losses_total Terms that ended without the command's own exit, by reason.\n"
       "# TYPE fencegate_elect_losses_total counter\n";
  for (const char* r : {"jeopardy", "lost", "deleted", "catch_up", "fence"}) {
    auto it = losses_.find(r);
    o += std::string("fencegate_elect_losses_total{reason=\"") + r + "\"} " +
         std::to_string(it == losses_.end() ? 0 : it->second) + "\n";
  }
  o += "# HELP fencegate_elect_renewal_margin_seconds Time left to the lease deadline when a renewal moved it.\n"
       "# TYPE fencegate_elect_renewal_margin_seconds histogram\n";
  std::uint64_t cum = 0;
  for (std::size_t i = 0; i < std::size(kMarginBounds); ++i) {
    cum += margin_buckets_.empty() ? 0 : margin_buckets_[i];
    o += "fencegate_elect_renewal_margin_seconds_bucket{le=\"" + fmt(kMarginBounds[i]) + "\"} " + std::to_string(cum) +
         "\n";
  }
  o += "fencegate_elect_renewal_margin_seconds_bucket{le=\"+Inf\"} " + std::to_string(margin_count_) + "\n";
  o += "fencegate_elect_renewal_margin_seconds_sum " + fmt(margin_sum_) + "\n";
  o += "fencegate_elect_renewal_margin_seconds_count " + std::to_string(margin_count_) + "\n";
  o += "# HELP fencegate_elect_stage_seconds Duration of each stage of the last activation.\n"
       "# TYPE fencegate_elect_stage_seconds gauge\n";
  for (const auto& [stage, s] : stages_) o += "fencegate_elect_stage_seconds{stage=\"" + stage + "\"} " + fmt(s) + "\n";
  return o;
}

std::string parse_listen_addr(const std::string& addr, std::string* host, std::uint16_t* port) {
  const auto colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0) return "must be host:port (got \"" + addr + "\")";
  const std::string p = addr.substr(colon + 1);
  if (p.empty() || p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos || std::stol(p) > 65535)
    return "bad port in \"" + addr + "\"";
  *host = addr.substr(0, colon);
  *port = static_cast<std::uint16_t>(std::stol(p));
  return {};
}

StatusServer::~StatusServer() { stop(); }

std::string StatusServer::start(const std::string& addr) {
  std::string host;
  std::uint16_t port = 0;
  if (auto e = parse_listen_addr(addr, &host, &port); !e.empty()) return e;
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0)
    return "cannot resolve \"" + host + "\": " + gai_strerror(rc);
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd_ < 0 || bind(fd_, res->ai_addr, res->ai_addrlen) != 0 || listen(fd_, 16) != 0) {
    std::string e = std::string("cannot listen on ") + addr + ": " + std::strerror(errno);
    freeaddrinfo(res);
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    return e;
  }
  freeaddrinfo(res);
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len);
  port_ = ntohs(sa.sin_port);
  thread_ = std::thread([this] { loop(); });
  return {};
}

void StatusServer::stop() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

void StatusServer::loop() {
  while (!stopping_) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    timeval tv{1, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    std::string req;
    char buf[1024];
    while (req.find("\r\n\r\n") == std::string::npos && req.find("\n\n") == std::string::npos && req.size() < 8192) {
      ssize_t n = recv(c, buf, sizeof buf, 0);
      if (n <= 0) break;
      req.append(buf, static_cast<std::size_t>(n));
    }
    const auto sp1 = req.find(' ');
    const auto sp2 = sp1 == std::string::npos ? std::string::npos : req.find(' ', sp1 + 1);
    const std::string method = req.substr(0, sp1);
    std::string target = sp2 == std::string::npos ? "" : req.substr(sp1 + 1, sp2 - sp1 - 1);
    if (auto q = target.find('?'); q != std::string::npos) target.resize(q);
    int code = 404;
    std::string body = "not found\n", type = "text/plain; charset=utf-8";
    if (method != "GET" && method != "HEAD") {
      code = 405;
      body = "method not allowed\n";
    } else if (target == "/readyz") {
      const bool ready = m_.ready();
      code = ready ? 200 : 503;
      body = ready ? "ready\n" : "not leading\n";
    } else if (target == "/metrics") {
      code = 200;
      body = m_.render();
      type = "text/plain; version=0.0.4; charset=utf-8";
    }
    const char* reason = code == 200   ? "OK"
                         : code == 503 ? "Service Unavailable"
                         : code == 405 ? "Method Not Allowed"
                                       : "Not Found";
    std::string resp = "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
                       "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
    if (method != "HEAD") resp += body;
    std::size_t off = 0;
    while (off < resp.size()) {
      ssize_t n = send(c, resp.data() + off, resp.size() - off, MSG_NOSIGNAL);
      if (n <= 0) break;
      off += static_cast<std::size_t>(n);
    }
    close(c);
  }
}

}  // namespace fencegate::election
