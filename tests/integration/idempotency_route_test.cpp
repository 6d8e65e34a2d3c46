// Issue 30: operation IDs, the second round (docs/idempotency.md): a keyed write that advances the
// fence records its key in the advance's commit (one fsync); a store that cannot commit them
// refuses and forwards nothing; the final statuses of a route; every outcome counted and the
// bytes held; scope "client" with TLS client identities.
#include <unistd.h>

#include <thread>

#include "tests/integration/harness.h"
#include "tests/integration/ops_harness.h"

using namespace fencegate::testing;

namespace {

json keyed_route(const std::string& upstream, json idem = json::object(), const std::string& resource = "ledger",
                 const std::string& mode = "enforce", const std::string& prefix = "/") {
  json r = route(prefix, upstream, resource, mode);
  r["idempotency"] = std::move(idem);
  return r;
}

json with_admin(json cfg, std::uint16_t admin) {
  cfg["admin"] = {{"listen", "127.0.0.1:" + std::to_string(admin)}};
  return cfg;
}

Headers keyed(std::int64_t g, const std::string& key, Headers more = {}) {
  more.emplace_back("Idempotency-Key", "\"" + key + "\"");
  return token(g, std::move(more));
}

std::string problem_type(const ReadResult& r) {
  try {
    return body_json(r).value("type", "");
  } catch (...) {
    return "";
  }
}

double metric(std::uint16_t admin, const std::string& name, const std::map<std::string, std::string>& labels = {}) {
  return sample(parse_prometheus(metrics_text(admin)), name, labels).value_or(-1);
}

// Waits until the admin API shows `key` of `resource` in `state` ("" = gone); returns whether it did.
bool key_becomes(std::uint16_t admin, const std::string& resource, const std::string& key, const std::string& state) {
  for (int i = 0; i < 200; ++i) {
    auto r = request(admin, "GET", "/v1/resources/" + resource + "/idempotency/" + key);
    if (state.empty() ? r.code() == 404 : r.code() == 200 && body_json(r).value("state", "") == state) return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

// Store commits so far, once the count has stood still for a moment (nothing still queued).
double settled_commits(std::uint16_t admin) {
  double last = -2;
  for (int i = 0; i < 100; ++i) {
    const double now = metric(admin, "fencegate_store_commit_seconds_count");
    if (now == last) return now;
    last = now;
    std::this_thread::sleep_for(150ms);
  }
  return last;
}

// run_command execs a path: find a tool on PATH.
std::string tool(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  for (std::size_t b = 0; b <= dirs.size();) {
    std::size_t e = dirs.find(':', b);
    if (e == std::string::npos) e = dirs.size();
    const std::string f = dirs.substr(b, e - b) + "/" + name;
    if (::access(f.c_str(), X_OK) == 0) return f;
    b = e + 1;
  }
  return "/usr/bin/" + name;
}

void openssl_cmd(const std::vector<std::string>& args) {
  std::vector<std::string> argv{tool("openssl")};
  argv.insert(argv.end(), args.begin(), args.end());
  CommandResult r = run_command(argv, 30s);
  REQUIRE_MESSAGE(r.code() == 0, "openssl failed: ", r.err);
}

// A throwaway CA, a server certificate for 127.0.0.1 and two client certificates (EC P-256).
struct Certs {
  TempDir dir{"fencegate-idem-certs"};
  std::string f(const std::string& n) const { return dir.file(n); }
  void leaf(const std::string& name, const std::string& cn, const std::string& san) {
    openssl_cmd({"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f(name + ".key"),
                 "-out", f(name + ".csr"), "-subj", "/CN=" + cn});
    write_file(f(name + ".ext"), "subjectAltName=" + san + "\n");
    openssl_cmd({"x509", "-req", "-in", f(name + ".csr"), "-CA", f("ca.crt"), "-CAkey", f("ca.key"), "-CAcreateserial",
                 "-out", f(name + ".crt"), "-days", "2", "-extfile", f(name + ".ext")});
  }
  Certs() {
    openssl_cmd({"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
                 f("ca.key"), "-out", f("ca.crt"), "-subj", "/CN=ca", "-days", "2"});
    leaf("server", "localhost", "DNS:localhost,IP:127.0.0.1");
    leaf("a", "a", "URI:spiffe://test.example/worker-a");
    leaf("b", "b", "URI:spiffe://test.example/worker-b");
  }
};

// A keyed POST over https with client certificate `client` ("" none): the status and whether it was a replay.
std::pair<int, bool> tls_post(const Certs& c, std::uint16_t port, const std::string& client, const std::string& key) {
  std::vector<std::string> argv{tool("curl"), "-sS",
                                "--max-time", "10",
                                "--cacert",   c.f("ca.crt"),
                                "-X",         "POST",
                                "-H",         "Fencing-Token: 1",
                                "-H",         "Idempotency-Key: \"" + key + "\"",
                                "--data",     "x",
                                "-o",         "/dev/null",
                                "-D",         "-",
                                "-w",         "\n%{http_code}"};
  if (!client.empty()) argv.insert(argv.end(), {"--cert", c.f(client + ".crt"), "--key", c.f(client + ".key")});
  argv.push_back("https://127.0.0.1:" + std::to_string(port) + "/op");
  CommandResult r = run_command(argv, 20s);
  INFO(r.out, r.err);
  const auto nl = r.out.rfind('\n');
  const int status = nl == std::string::npos ? 0 : std::atoi(r.out.c_str() + nl + 1);
  return {status, r.out.find("Idempotent-Replayed: true") != std::string::npos};
}

}  // namespace

TEST_SUITE("idempotency") {
  TEST_CASE("idempotency: a keyed write that advances the fence records its key in the advance's commit") {
    RecordingUpstream up;
    const auto admin = free_port();
    Proxy px(ProxySpec{.config = with_admin(config_with_routes({keyed_route(up.url())}), admin)});
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    REQUIRE(is_2xx(request(px.port(), "POST", "/warm", token(1))));
    const double c0 = settled_commits(admin);
    // An unkeyed write that advances: one commit (the advance).
    REQUIRE(is_2xx(request(px.port(), "POST", "/a", token(2))));
    const double c1 = settled_commits(admin);
    CHECK(c1 - c0 == 1);
    // A keyed write that advances: the advance and the key in flight in one commit, then the
    // answer's record in another. (Apart, it was three.)
    auto k = request(px.port(), "POST", "/k", keyed(3, "adv-1"), "x");
    INFO(describe(k));
    REQUIRE(is_2xx(k));
    REQUIRE(key_becomes(admin, "ledger", "adv-1", "completed"));
    const double c2 = settled_commits(admin);
    CHECK(c2 - c1 == 2);
    // The same at the stored generation (no advance): the key, then the answer.
    REQUIRE(is_2xx(request(px.port(), "POST", "/k", keyed(3, "plain-1"), "x")));
    REQUIRE(key_becomes(admin, "ledger", "plain-1", "completed"));
    CHECK(settled_commits(admin) - c2 == 2);
    // Fencing first: a stale keyed write is refused, and its key is not held.
    auto stale = request(px.port(), "POST", "/k", keyed(2, "stale-1"), "x");
    CHECK(stale.code() == 409);
    CHECK(request(admin, "GET", "/v1/resources/ledger/idempotency/stale-1").code() == 404);
    // The replay of a key recorded with an advance, by the next leader (which advances too).
    auto again = request(px.port(), "POST", "/k", keyed(4, "adv-1"), "x");
    INFO(describe(again));
    CHECK(again.response.header("Idempotent-Replayed") == "true");
    CHECK(up.count() == 4);
  }

  TEST_CASE(
      "idempotency: keyed writes that advance fail closed when the store cannot commit (503, nothing forwarded)") {
    RecordingUpstream up;
    ProxySpec spec{.config = config_with_routes({keyed_route(up.url())})};
    spec.fsize_limit = 512 * 1024;
    Proxy px(spec);
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    std::int64_t failed_at = 0;
    ReadResult failure;
    HttpClient c;
    for (std::int64_t g = 1; g <= 4000 && !failed_at; ++g) {
      if (!c.connected()) REQUIRE(c.connect(px.port()));
      auto r = c.request("POST", "/adv/" + std::to_string(g), keyed(g, "op-" + std::to_string(g)), "x", 15s);
      INFO("generation ", g, ": ", describe(r));
      REQUIRE(r.ok());
      if (r.response.status == 503) {
        failed_at = g;
        failure = r;
      } else {
        REQUIRE(is_2xx(r));
      }
    }
    REQUIRE_MESSAGE(failed_at > 0, "no 503 before the limit");
    INFO(describe(failure));
    // Either the advance (with its key) or, once the fence is ahead, the key alone failed.
    const std::string type = problem_type(failure);
    CHECK((type == "urn:fencegate:problem:store-unavailable" || type.find("store") != std::string::npos));
    for (const auto& r : up.requests()) {
      CAPTURE(r.target);
      CHECK(r.fencing_token().value_or(0) < failed_at);
    }
    CHECK(px.running());
  }

  TEST_CASE("idempotency: a route's release_statuses and unknown_statuses decide which answers are final") {
    std::atomic<int> calls{0};
    RecordingUpstream up([&](const RecordedRequest& r) {
      const int n = ++calls;
      if (r.target == "/fail") return UpstreamAction::respond(n == 1 ? 500 : 201);
      if (r.target == "/busy") return UpstreamAction::respond(503);
      if (r.target == "/gw") return UpstreamAction::respond(502);
      return UpstreamAction::respond(200);
    });
    json idem{{"release_statuses", {500}}, {"unknown_statuses", {503}}};
    Proxy px(ProxySpec{.config = config_with_routes({keyed_route(up.url(), idem)})});
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    // 500 releases here: the retry is forwarded, and its 201 recorded.
    CHECK(request(px.port(), "POST", "/fail", keyed(1, "f"), "x").code() == 500);
    auto f2 = request(px.port(), "POST", "/fail", keyed(1, "f"), "x");
    CHECK(f2.code() == 201);
    CHECK_FALSE(f2.response.has("Idempotent-Replayed"));
    CHECK(request(px.port(), "POST", "/fail", keyed(1, "f"), "x").response.header("Idempotent-Replayed") == "true");
    // 503 is an unknown outcome here: the retry is refused.
    CHECK(request(px.port(), "POST", "/busy", keyed(1, "b"), "x").code() == 503);
    auto b2 = request(px.port(), "POST", "/busy", keyed(1, "b"), "x");
    INFO(describe(b2));
    CHECK(b2.code() == 409);
    CHECK(problem_type(b2) == "urn:fencegate:problem:idempotency-outcome-unknown");
    // 502 is final here: recorded and replayed.
    CHECK(request(px.port(), "POST", "/gw", keyed(1, "g"), "x").code() == 502);
    auto g2 = request(px.port(), "POST", "/gw", keyed(1, "g"), "x");
    CHECK(g2.code() == 502);
    CHECK(g2.response.header("Idempotent-Replayed") == "true");
    CHECK(up.count() == 4);
  }

  TEST_CASE("idempotency: a bad status list stops serve with exit 2 naming the field") {
    json cfg = config_with_routes({keyed_route("http://127.0.0.1:9", {{"unknown_statuses", {502, 503}}})});
    Proxy px(ProxySpec{.config = cfg});
    CHECK_FALSE(px.start(10s));
    auto st = px.process().wait();
    CHECK(st.exited);
    CHECK(st.code == 2);
    CHECK(px.log().find("routes[0].idempotency.unknown_statuses: 503 is also in release_statuses") !=
          std::string::npos);
  }

  TEST_CASE("idempotency: every outcome is counted; the bytes kept for replay are a gauge") {
    std::atomic<int> busy{0};
    RecordingUpstream up([&](const RecordedRequest& r) {
      if (r.target.ends_with("/slow")) return UpstreamAction::respond(200, 1500);
      if (r.target.ends_with("/reset")) return UpstreamAction::reset_connection();
      if (r.target.ends_with("/busy")) return UpstreamAction::respond(++busy == 1 ? 429 : 200);
      UpstreamAction a = UpstreamAction::respond(201);
      a.headers = {{"Content-Type", "text/plain"}};
      a.body = "0123456789";  // 10 bytes, and "Content-Type: text/plain\r\n" (26) kept with it
      return a;
    });
    const auto admin = free_port();
    json cfg = with_admin(config_with_routes({keyed_route(up.url(), json::object(), "ledger", "enforce", "/l/"),
                                              keyed_route(up.url(), json::object(), "shadow", "observe", "/o/")}),
                          admin);
    Proxy px(ProxySpec{.config = cfg});
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    auto outcome = [&](const std::string& resource, const std::string& o) {
      return metric(admin, "fencegate_idempotency_total", {{"resource", resource}, {"outcome", o}});
    };
    REQUIRE(request(px.port(), "POST", "/l/a", keyed(1, "s1"), "x").code() == 201);  // stored
    CHECK(request(px.port(), "POST", "/l/a", keyed(1, "s1"), "x").code() == 201);    // replayed
    CHECK(request(px.port(), "POST", "/l/a", keyed(1, "s1"), "y").code() == 422);    // mismatch
    ReadResult slow;
    std::thread t([&] { slow = request(px.port(), "POST", "/l/slow", keyed(1, "w1"), "x", 20s); });
    REQUIRE(up.wait_for_count(2, 10s));
    CHECK(request(px.port(), "POST", "/l/slow", keyed(1, "w1"), "x").code() == 409);  // in_flight
    t.join();
    CHECK(request(px.port(), "POST", "/l/reset", keyed(1, "r1"), "x").code() == 502);  // unknown
    CHECK(request(px.port(), "POST", "/l/busy", keyed(1, "b1"), "x").code() == 429);   // released
    REQUIRE(request(px.port(), "POST", "/o/a", keyed(1, "o1"), "x").code() == 201);    // observe
    CHECK(request(px.port(), "POST", "/o/a", keyed(1, "o1"), "x").code() == 201);      // would_replay
    CHECK(outcome("ledger", "stored") == 2);  // s1 and w1
    CHECK(outcome("ledger", "replayed") == 1);
    CHECK(outcome("ledger", "mismatch") == 1);
    CHECK(outcome("ledger", "in_flight") == 1);
    CHECK(outcome("ledger", "unknown") == 1);
    CHECK(outcome("ledger", "released") == 1);
    CHECK(outcome("shadow", "would_replay") == 1);
    CHECK(outcome("shadow", "stored") == 1);  // observe mode records the first; the duplicate is forwarded
    // Bytes held: the recorded answers' bodies and their body-describing fields (r1, unknown,
    // holds none). s1's: "0123456789" and "Content-Type: text/plain\r\n".
    REQUIRE(key_becomes(admin, "ledger", "r1", "unknown"));
    CHECK(metric(admin, "fencegate_idempotency_keys", {{"resource", "ledger"}}) == 3);  // s1, w1, r1
    const double held = metric(admin, "fencegate_idempotency_bytes", {{"resource", "ledger"}});
    CHECK(request(admin, "DELETE", "/v1/resources/ledger/idempotency/s1").code() == 200);
    const double less = metric(admin, "fencegate_idempotency_bytes", {{"resource", "ledger"}});
    CHECK(held - less == 10 + 26);
    CHECK(less > 0);  // w1's
    CHECK(request(admin, "DELETE", "/v1/resources/ledger/idempotency/w1").code() == 200);
    CHECK(metric(admin, "fencegate_idempotency_bytes", {{"resource", "ledger"}}) == -1);  // none held: no series
    CHECK(metric(admin, "fencegate_idempotency_keys", {{"resource", "ledger"}}) == 1);
  }

  TEST_CASE("idempotency: scope client keys per verified TLS identity, else per address") {
    static const Certs certs;
    RecordingUpstream up;
    const auto admin = free_port();
    json cfg = with_admin(config_with_routes({keyed_route(up.url(), {{"scope", "client"}})}), admin);
    cfg["tls"] = {{"cert", certs.f("server.crt")},
                  {"key", certs.f("server.key")},
                  {"client_ca", certs.f("ca.crt")},
                  {"client_auth", "optional"}};
    Proxy px(ProxySpec{.config = cfg});
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    CHECK(tls_post(certs, px.port(), "a", "k") == std::pair<int, bool>{200, false});
    CHECK(tls_post(certs, px.port(), "a", "k") == std::pair<int, bool>{200, true});   // a's key: replayed
    CHECK(tls_post(certs, px.port(), "b", "k") == std::pair<int, bool>{200, false});  // b's own key
    CHECK(tls_post(certs, px.port(), "", "k") == std::pair<int, bool>{200, false});   // no identity: the address
    CHECK(tls_post(certs, px.port(), "", "k") == std::pair<int, bool>{200, true});
    CHECK(up.count() == 3);
    const std::string path = "/v1/resources/ledger/idempotency/k?client=";
    auto got = request(admin, "GET", path + "spiffe%3A%2F%2Ftest.example%2Fworker-a");
    INFO(describe(got));
    REQUIRE(got.code() == 200);
    CHECK(body_json(got)["client"] == "spiffe://test.example/worker-a");
    CHECK(request(admin, "GET", path + "127.0.0.1").code() == 200);
    CHECK(request(admin, "GET", "/v1/resources/ledger/idempotency/k").code() == 404);  // no unscoped key
  }
}  // TEST_SUITE
