// The admin listener under connections that stall or flood (issue 32, finding 1), against the real
// binary: 64 idle or byte-a-second connections never stop a new client's /healthz or fence from
// being answered within a second; a head sent a byte at a time is cut at admin.header_timeout_ms;
// a client that pipelines requests and never reads is cut at admin.write_timeout_ms.
#include <atomic>
#include <cstring>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/integration/ops_harness.h"

using namespace fencegate::testing;

namespace {

// A blocking TCP connection to 127.0.0.1:port from `source` (127.0.0.x: several client addresses
// on one host, so admin.max_connections_per_client does not simply refuse them). -1 on failure.
int connect_from(const std::string& source, std::uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in src{};
  src.sin_family = AF_INET;
  ::inet_pton(AF_INET, source.c_str(), &src.sin_addr);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof dst) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// n connections from 127.0.0.2, 127.0.0.3, ... (one per address).
std::vector<int> open_many(std::uint16_t port, int n) {
  std::vector<int> fds;
  for (int i = 0; i < n; ++i) {
    int fd = connect_from("127.0.0." + std::to_string(2 + i), port);
    REQUIRE_MESSAGE(fd >= 0, "connect from 127.0.0.", 2 + i, ": ", std::strerror(errno));
    fds.push_back(fd);
  }
  return fds;
}

void close_all(std::vector<int>& fds) {
  for (int fd : fds) ::close(fd);
  fds.clear();
}

// True once the peer has closed `fd` (EOF or reset), waiting at most `limit`; bytes that come are
// read and dropped.
bool closed_within(int fd, std::chrono::milliseconds limit) {
  const auto end = Clock::now() + limit;
  char buf[65536];
  while (Clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
    if (::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(left, 1))) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return true;
  }
  return false;
}

// True once the peer reset the connection, seen without reading a byte.
bool reset_within(int fd, std::chrono::milliseconds limit) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    pollfd p{fd, POLLRDHUP, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
    if (::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(left, 1))) > 0 &&
        (p.revents & (POLLERR | POLLHUP | POLLRDHUP)) != 0)
      return true;
  }
  return false;
}

json fence_config(const RecordingUpstream& up, json admin = json::object()) {
  json c = config_with_routes({route("/", up.url(), "ledger", "enforce")});
  admin["listen"] = "127.0.0.1:0";  // never the fixed default port
  c["admin"] = std::move(admin);
  return c;
}

ProxySpec spec_of(json cfg) {
  ProxySpec s;
  s.config = std::move(cfg);
  return s;
}

// /healthz and a fence, each answered within a second.
void probe_and_fence_answer_quickly(std::uint16_t admin, std::int64_t generation) {
  Timed health = timed_request(admin, "GET", "/healthz", {}, {}, 5s);
  INFO("healthz: ", describe(health.result), " after ", health.elapsed.count(), " ms");
  CHECK(health.result.ok());
  CHECK(health.result.response.status == 200);
  CHECK(health.elapsed < 1000ms);
  Timed fence = timed_request(admin, "POST", "/v1/resources/ledger/fence", {{"Content-Type", "application/json"}},
                              json{{"generation", generation}, {"leader", "probe"}}.dump(), 5s);
  INFO("fence: ", describe(fence.result), " after ", fence.elapsed.count(), " ms");
  CHECK(fence.result.ok());
  CHECK(fence.result.response.status == 200);
  CHECK(fence.elapsed < 1000ms);
}

}  // namespace

TEST_SUITE("admin_limits") {
  TEST_CASE("admin limits: 64 idle connections do not stop /healthz or a fence") {
    RecordingUpstream up;
    Proxy px(spec_of(fence_config(up)));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);
    std::vector<int> idle = open_many(admin, 64);
    std::this_thread::sleep_for(300ms);  // all accepted
    probe_and_fence_answer_quickly(admin, 1);
    close_all(idle);
  }

  TEST_CASE("admin limits: 64 byte-a-second connections do not stop /healthz or a fence") {
    RecordingUpstream up;
    Proxy px(spec_of(fence_config(up)));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);
    std::vector<int> slow = open_many(admin, 64);
    std::atomic<bool> stop{false};
    std::thread trickle([&] {
      const std::string head = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaa";
      for (std::size_t i = 0; i < head.size() && !stop; ++i) {
        for (int fd : slow) (void)::send(fd, &head[i], 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        for (int t = 0; t < 10 && !stop; ++t) std::this_thread::sleep_for(100ms);
      }
    });
    std::this_thread::sleep_for(1500ms);
    probe_and_fence_answer_quickly(admin, 1);
    std::this_thread::sleep_for(1000ms);
    probe_and_fence_answer_quickly(admin, 2);
    stop = true;
    trickle.join();
    close_all(slow);
  }

  TEST_CASE("admin limits: a head sent one byte a second is cut at admin.header_timeout_ms") {
    RecordingUpstream up;
    Proxy px(spec_of(fence_config(up, {{"header_timeout_ms", 2000}})));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);
    int fd = connect_from("127.0.0.1", admin);
    REQUIRE(fd >= 0);
    const auto t0 = Clock::now();
    const std::string head = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: 0123456789";
    bool closed = false;
    for (std::size_t i = 0; i < head.size() && !closed; ++i) {
      (void)::send(fd, &head[i], 1, MSG_NOSIGNAL);
      closed = closed_within(fd, 1000ms);  // one byte a second: every read makes progress
    }
    const auto ms = ms_between(t0, Clock::now());
    INFO("connection closed: ", closed, " after ", ms, " ms");
    CHECK(closed);
    CHECK(ms >= 1500);
    CHECK(ms < 4000);
    ::close(fd);
    CHECK(admin_get(admin, "/healthz").response.status == 200);
  }

  TEST_CASE("admin limits: a client that pipelines requests and never reads is cut at admin.write_timeout_ms") {
    RecordingUpstream up;
    Proxy px(spec_of(fence_config(up, {{"write_timeout_ms", 1000}})));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int small = 4096;
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    ::close(fd);
    fd = connect_from("127.0.0.1", admin);
    REQUIRE(fd >= 0);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    timeval send_limit{3, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_limit, sizeof send_limit);
    std::string many;
    for (int i = 0; i < 4000; ++i) many += "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";  // ~1.5 KB answers
    std::size_t sent = 0;
    while (sent < many.size()) {
      ssize_t n = ::send(fd, many.data() + sent, many.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;  // the send buffer is full (the proxy stopped reading) or it closed
      sent += static_cast<std::size_t>(n);
    }
    // Reading nothing: reading would let the proxy write on. The proxy stops when its send buffer
    // is full (how soon depends on its speed: slow under a sanitizer), then closes the connection
    // one write timeout later. It closes with requests still unread, so the close is a reset that
    // shows here without reading.
    INFO("sent ", sent, " of ", many.size(), " bytes");
    CHECK(reset_within(fd, 30000ms));
    ::close(fd);
    CHECK(admin_get(admin, "/healthz").response.status == 200);
  }

}  // TEST_SUITE

TEST_CASE("admin limits: refused requests are counted and logged at most once per client per 10 s") {
  RecordingUpstream up;
  TempDir t("fencegate-admin-unauth");
  const std::string secret = "s3cret-Token_42-long-enough";
  write_file(t.file("admin.token"), secret + "\n");
  ::chmod(t.file("admin.token").c_str(), 0600);
  ProxySpec s;
  s.upstream = up.url();
  s.args = {"--admin-listen", "127.0.0.1:0", "--admin-token-file", t.file("admin.token")};
  Proxy px(s);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  FG_ADMIN_PORT(admin, px);
  for (int i = 0; i < 5; ++i) CHECK(admin_get(admin, "/v1/resources", bearer("wrong")).code() == 401);
  auto ss = parse_prometheus(metrics_text(admin, bearer(secret)));
  CHECK(sample(ss, "fencegate_admin_unauthorized_total") == 5.0);
  const std::string log = read_file(proxy_log_path(px));
  std::size_t lines = 0;
  for (std::size_t at = 0; (at = log.find("request refused: missing or wrong bearer token", at)) != std::string::npos;
       ++at)
    ++lines;
  CHECK(lines == 1);
}

// Hardening: the data listener's optional max_connections_per_client (default 0: no limit).
TEST_CASE("connection limits: max_connections_per_client closes a client's extra data connections at accept") {
  RecordingUpstream up;
  json c = fence_config(up);
  c["max_connections_per_client"] = 2;
  Proxy px(spec_of(c));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  FG_ADMIN_PORT(admin, px);
  HttpClient one, two, three;
  REQUIRE(one.connect(px.port()));
  REQUIRE(two.connect(px.port()));
  CHECK(is_2xx(one.request("GET", "/a")));
  CHECK(is_2xx(two.request("GET", "/b")));
  REQUIRE(three.connect(px.port()));  // the kernel completes the handshake; fencegate closes it
  CHECK(three.wait_closed(5s));
  // Another client address is not affected by this one's connections.
  int other = connect_from("127.0.0.2", px.port());
  REQUIRE(other >= 0);
  const std::string get = build_request("GET", "/c");
  REQUIRE(::send(other, get.data(), get.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(get.size()));
  char buf[16] = {};
  pollfd p{other, POLLIN, 0};
  REQUIRE(::poll(&p, 1, 5000) == 1);
  CHECK(::recv(other, buf, sizeof buf - 1, 0) > 0);
  CHECK(std::string(buf).rfind("HTTP/1.1 200", 0) == 0);
  ::close(other);
  // The two still work; once one closes, the address may connect again.
  CHECK(is_2xx(one.request("GET", "/d")));
  two.close();
  bool again = eventually(
      [&] {
        HttpClient next;
        return next.connect(px.port()) && is_2xx(next.request("GET", "/e", {}, {}, 2s));
      },
      10s);
  CHECK(again);
  auto ss = parse_prometheus(metrics_text(admin));
  CHECK(sample(ss, "fencegate_connections_refused_per_client_total") >= std::optional<double>(1));
}

// Hardening: the data listener bounds each write to a client by body_timeout_ms (no progress ->
// closed), so a client that pipelines requests and never reads its answers is cut, not kept.
TEST_CASE("connection limits: a data client that pipelines requests and never reads is cut at body_timeout_ms") {
  RecordingUpstream up([](const RecordedRequest&) {
    UpstreamAction a = UpstreamAction::respond();
    a.body = std::string(16 * 1024, 'b');  // 4,000 answers: far more than any socket buffers hold
    return a;
  });
  json c = fence_config(up);
  c["body_timeout_ms"] = 1000;
  Proxy px(spec_of(c));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  int fd = connect_from("127.0.0.1", px.port());
  REQUIRE(fd >= 0);
  int small = 4096;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  timeval send_limit{3, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_limit, sizeof send_limit);
  std::string many;
  for (int i = 0; i < 4000; ++i) many += "GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  std::size_t sent = 0;
  while (sent < many.size()) {
    ssize_t n = ::send(fd, many.data() + sent, many.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<std::size_t>(n);
  }
  INFO("sent ", sent, " of ", many.size(), " bytes");
  CHECK(reset_within(fd, 30000ms));  // reading nothing (see the admin case above)
  ::close(fd);
  CHECK(is_2xx(request(px.port(), "GET", "/after")));
}
