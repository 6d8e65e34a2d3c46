// The send path: each I/O thread sends the answers and upstream requests of one event-loop pass
// together (one io_uring submission, `io_uring: auto`), or each on its own (`off`, or where
// io_uring is not available). What a user relies on, in both modes: every client gets exactly
// its own answers, in order, whole, however many connections share the thread, and every
// request reaches the upstream whole; large answers that do not fit a socket buffer at once too.
#include "tests/integration/harness.h"

#include <atomic>
#include <thread>

using namespace fencegate::testing;

namespace {

// The upstream's answer to a request: names it and repeats its body; every seventh is large
// (more than a loopback socket takes at once, so its send goes out in parts).
std::string answer_for(const std::string& target, const std::string& body) {
  std::string a = "answer " + target + " to " + body;
  if (target.size() && (target.back() - '0') % 7 == 0) a += std::string(3 << 20, static_cast<char>('a' + target.size() % 26));
  return a;
}

void run_clients(Proxy& px, RecordingUpstream& up, int connections, int per_connection) {
  std::atomic<int> good{0};
  std::vector<std::string> failures(static_cast<std::size_t>(connections));
  std::vector<std::thread> threads;
  for (int c = 0; c < connections; ++c) {
    threads.emplace_back([&, c] {
      HttpClient cl;
      if (!cl.connect(px.port())) {
        failures[static_cast<std::size_t>(c)] = "connect failed";
        return;
      }
      for (int i = 0; i < per_connection; ++i) {
        const std::string target = "/s/" + std::to_string(c) + "/" + std::to_string(i);
        const std::string body = "body of " + target + std::string(static_cast<std::size_t>(c * 37 + i), 'x');
        auto r = cl.request("POST", target, token(5), body, 20s);
        if (!is_2xx(r) || r.response.body != answer_for(target, body)) {
          failures[static_cast<std::size_t>(c)] =
              target + ": " + (r.ok() ? std::to_string(r.response.status) + " body of " + std::to_string(r.response.body.size()) + " bytes, starting " + r.response.body.substr(0, 80) : describe(r));
          return;
        }
        ++good;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& f : failures) CHECK_MESSAGE(f.empty(), f);
  CHECK(good.load() == connections * per_connection);
  CHECK(up.count() == static_cast<std::size_t>(connections * per_connection));
}

}  // namespace

TEST_SUITE("send path") {

TEST_CASE("send path: concurrent connections on one thread each get exactly their own answers, io_uring auto and off") {
  for (const char* mode : {"auto", "off"}) {
    CAPTURE(mode);
    RecordingUpstream up([](const RecordedRequest& r) {
      auto a = UpstreamAction::respond(200);
      a.body = answer_for(r.target, r.body);
      return a;
    });
    ProxySpec spec;
    spec.upstream = up.url();
    spec.threads = 1;  // every connection on one thread: its passes hold many sends
    spec.args = {"--io-uring", mode};
    Proxy px(spec);
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    run_clients(px, up, 16, 30);
    // The start-up log says which way the sends went; with `off` the ring is never opened.
    const std::string log = px.log();
    const bool ring = log.find("one io_uring submission") != std::string::npos;
    const bool no_ring = log.find("io_uring is not available") != std::string::npos;
    if (std::string_view(mode) == "auto") CHECK(ring != no_ring);
    else CHECK_FALSE((ring || no_ring));
    px.stop();
  }
}

}  // TEST_SUITE
