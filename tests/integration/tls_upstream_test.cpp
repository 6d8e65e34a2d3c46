// https:// upstreams (issue 27, docs/tls.md "The upstream"), against the real binary: certificates
// made here with the openssl command line (tls_certs.h), a real nginx (the Debian package) serving
// https as the upstream and passing each request on to a RecordingUpstream with what it saw of the
// TLS connection in headers ($connection, $ssl_session_reused, $ssl_server_name,
// $ssl_client_verify), and curl as the client, over fencegate's TLS listener.
#include <unistd.h>

#include "tests/integration/ops_harness.h"
#include "tests/integration/tls_certs.h"

using namespace fencegate::testing;

namespace {

struct Certs : CertDir {
  Certs() {
    ca("ca");
    ca("other-ca");
    leaf("server", "ca", "localhost", "DNS:localhost,IP:127.0.0.1");            // fencegate and nginx
    leaf("other-server", "other-ca", "localhost", "DNS:localhost,IP:127.0.0.1");  // a CA fencegate does not know
    leaf("expired-server", "ca", "localhost", "DNS:localhost,IP:127.0.0.1", -1);
    leaf("wrong-name", "ca", "wrong.test", "DNS:wrong.test");
    leaf("client", "ca", "fencegate-client", "URI:spiffe://test.example/fencegate");
  }
};

const Certs& certs() {
  static Certs c;
  return c;
}

// One nginx with a server per kind of upstream certificate, each on its own loopback port, each
// proxying to `backend` (plain HTTP) with what it saw of the TLS connection in headers.
class Nginx {
 public:
  enum Server { good, other_ca, expired, wrong_name, mtls, kServers };
  explicit Nginx(std::uint16_t backend) {
    // free_port() may race with another test taking the port: a few tries with fresh ports.
    for (int attempt = 0; attempt < 3 && !start(backend); ++attempt) proc_.stop(5s);
  }
  bool start(std::uint16_t backend) {
    const Certs& c = certs();
    const char* certs_of[kServers] = {"server", "other-server", "expired-server", "wrong-name", "server"};
    std::string servers;
    for (int i = 0; i < kServers; ++i) {
      ports_[i] = free_port();
      servers += "  server {\n    listen 127.0.0.1:" + std::to_string(ports_[i]) + " ssl;\n";
      servers += "    ssl_certificate " + c.f(std::string(certs_of[i]) + ".crt") + ";\n";
      servers += "    ssl_certificate_key " + c.f(std::string(certs_of[i]) + ".key") + ";\n";
      if (i == mtls) servers += "    ssl_verify_client on;\n    ssl_client_certificate " + c.f("ca.crt") + ";\n";
      servers += "    location / {\n      proxy_pass http://127.0.0.1:" + std::to_string(backend) + ";\n";
      for (const char* h : {"X-Tls-Connection $connection", "X-Tls-Requests $connection_requests",
                            "X-Tls-Session-Reused $ssl_session_reused", "X-Tls-Server-Name $ssl_server_name",
                            "X-Tls-Client-Verify $ssl_client_verify", "X-Tls-Client-Subject $ssl_client_s_dn"})
        servers += std::string("      proxy_set_header ") + h + ";\n";
      servers += "    }\n  }\n";
    }
    const std::string d = dir_.path();
    write_file(dir_.file("nginx.conf"),
               "daemon off;\nmaster_process off;\nworker_processes 1;\nerror_log " + d + "/error.log info;\npid " + d +
                   "/nginx.pid;\nevents { worker_connections 256; }\nhttp {\n  access_log " + d +
                   "/access.log;\n  client_body_temp_path " + d + "/body;\n  proxy_temp_path " + d +
                   "/proxy;\n  fastcgi_temp_path " + d + "/fastcgi;\n  uwsgi_temp_path " + d +
                   "/uwsgi;\n  scgi_temp_path " + d +
                   "/scgi;\n  keepalive_timeout 60s;\n  keepalive_requests 1000;\n  ssl_protocols TLSv1.2 "
                   "TLSv1.3;\n" +
                   servers + "}\n");
    ProcessOptions o;
    o.log_path = dir_.file("nginx.out");
    proc_ = Process::start({"/usr/sbin/nginx", "-p", d, "-c", dir_.file("nginx.conf")}, o);
    ok_ = true;
    for (int i = 0; i < kServers; ++i) ok_ = ok_ && proc_.wait_for_port(ports_[i], 10s);
    ok_ = ok_ && proc_.running();  // a port another process held: nginx exits
    return ok_;
  }
  ~Nginx() { proc_.stop(5s); }
  bool ok() const { return ok_; }
  std::string url(Server s) const { return "https://127.0.0.1:" + std::to_string(ports_[s]); }
  std::string log() const {
    return "nginx: " + read_file(dir_.file("nginx.out"), 4096) + read_file(dir_.file("error.log"), 4096);
  }

 private:
  TempDir dir_{"fencegate-nginx"};
  std::uint16_t ports_[kServers] = {};
  Process proc_;
  bool ok_ = false;
};

// fencegate's TLS listener (the client side is TLS too: curl -> fencegate -> nginx).
json listener_tls() {
  const Certs& c = certs();
  return json{{"cert", c.f("server.crt")}, {"key", c.f("server.key")}};
}

json tls_route(const std::string& prefix, const std::string& upstream, const std::string& resource,
               json extra = json::object()) {
  json r = route(prefix, upstream, resource);
  r["upstream_ca"] = certs().f("ca.crt");
  for (auto& [k, v] : extra.items()) r[k] = v;
  return r;
}

struct Curl {
  int exit = -1;
  int status = 0;
  std::string body, err;
};

Curl curl(std::uint16_t port, const std::string& method, const std::string& path, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv{tool("curl"), "-sS",  "--max-time", "20", "--cacert", certs().f("ca.crt"),
                                "-X",         method, "-o",         "-",  "-w",       "\n%{http_code}"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back("https://127.0.0.1:" + std::to_string(port) + path);
  CommandResult r = run_command(argv, 30s);
  Curl out;
  out.exit = r.code();
  out.err = r.err;
  const auto nl = r.out.rfind('\n');
  if (nl != std::string::npos) {
    out.body = r.out.substr(0, nl);
    out.status = std::atoi(r.out.c_str() + nl + 1);
  }
  return out;
}

std::string describe(const Curl& c) {
  return "curl exit " + std::to_string(c.exit) + ", status " + std::to_string(c.status) + ", body " + c.body +
         ", stderr " + c.err;
}

double upstream_tls_failures(std::uint16_t admin, const std::string& reason) {
  return sample(parse_prometheus(metrics_text(admin)), "fencegate_upstream_tls_failures_total", {{"reason", reason}})
      .value_or(-1);
}

Curl fenced_post(std::uint16_t port, const std::string& path, int token, const std::string& body = "x") {
  return curl(port, "POST", path, {"-H", "Fencing-Token: " + std::to_string(token), "-d", body});
}

}  // namespace

TEST_SUITE("tls_upstream") {
  TEST_CASE("tls upstream: a fenced write over TLS both ways reaches nginx's backend; one pooled TLS connection") {
    RecordingUpstream backend;
    Nginx nginx(backend.port());
    INFO(nginx.log());
    REQUIRE(nginx.ok());
    ProxySpec spec;
    spec.config = config_with_routes({tls_route("/", nginx.url(Nginx::good), "ledger")});
    (*spec.config)["tls"] = listener_tls();
    (*spec.config)["threads"] = 1;  // one worker: one pool
    Proxy px(spec);
    FG_LOG_ON_FAILURE(px);
    FG_START(px);

    for (int i = 0; i < 3; ++i) {
      Curl r = fenced_post(px.port(), "/orders/" + std::to_string(i), 7, "payment-" + std::to_string(i));
      INFO(describe(r));
      CHECK(r.exit == 0);
      CHECK(r.status == 200);
    }
    REQUIRE(backend.count() == 3);
    const auto reqs = backend.requests();
    for (int i = 0; i < 3; ++i) {
      CAPTURE(i);
      CHECK(reqs[i].body == "payment-" + std::to_string(i));
      CHECK(reqs[i].target == "/orders/" + std::to_string(i));
      CHECK(reqs[i].header("Fencing-Token") == "7");
      // Keep-alive: the three requests came on one TLS connection to nginx, its 1st, 2nd and 3rd.
      CHECK(reqs[i].header("X-Tls-Connection") == reqs[0].header("X-Tls-Connection"));
      CHECK(reqs[i].header("X-Tls-Requests") == std::to_string(i + 1));
    }
    // The upstream's host is an IP address: checked against the certificate's IP SAN, not sent as SNI.
    CHECK(reqs[0].header("X-Tls-Server-Name").empty());
  }

  TEST_CASE("tls upstream: without a pool each new TLS connection resumes the cached session") {
    RecordingUpstream backend;
    Nginx nginx(backend.port());
    INFO(nginx.log());
    REQUIRE(nginx.ok());
    ProxySpec spec;
    spec.config = config_with_routes({tls_route("/", nginx.url(Nginx::good), "ledger")});
    (*spec.config)["upstream_idle_per_thread"] = 0;  // a new upstream connection per request
    (*spec.config)["threads"] = 1;
    Proxy px(spec);
    FG_LOG_ON_FAILURE(px);
    FG_START(px);

    for (int i = 0; i < 3; ++i) {
      ReadResult r = request(px.port(), "POST", "/a", token(3), "x");
      INFO(describe(r));
      CHECK(r.code() == 200);
    }
    REQUIRE(backend.count() == 3);
    const auto reqs = backend.requests();
    CHECK(reqs[0].header("X-Tls-Session-Reused") == ".");  // a full handshake first ...
    for (int i = 1; i < 3; ++i) {
      CAPTURE(i);
      CHECK(reqs[i].header("X-Tls-Connection") != reqs[i - 1].header("X-Tls-Connection"));
      CHECK(reqs[i].header("X-Tls-Session-Reused") == "r");  // ... then resumed ones
    }
  }

  TEST_CASE("tls upstream: unknown CA, name mismatch, expired, a stalled handshake: 502 with the reason, counted") {
    RecordingUpstream backend;
    Nginx nginx(backend.port());
    INFO(nginx.log());
    REQUIRE(nginx.ok());
    // A port that accepts TCP (the kernel's backlog) but never speaks TLS.
    std::uint16_t silent_port = 0;
    Fd silent = listen_loopback(&silent_port);
    REQUIRE(silent.valid());
    ProxySpec spec;
    spec.config = config_with_routes(
        {tls_route("/unknown/", nginx.url(Nginx::other_ca), "unknown"),
         tls_route("/name/", nginx.url(Nginx::wrong_name), "name"),
         tls_route("/expired/", nginx.url(Nginx::expired), "expired"),
         tls_route("/silent/", "https://127.0.0.1:" + std::to_string(silent_port), "silent"),
         // upstream_server_name: the name sent (SNI) and checked instead of the host.
         tls_route("/renamed/", nginx.url(Nginx::wrong_name), "renamed", {{"upstream_server_name", "wrong.test"}})});
    (*spec.config)["tls"] = listener_tls();
    (*spec.config)["upstream_connect_timeout_ms"] = 700;
    (*spec.config)["drain_timeout_ms"] = 20000;
    Proxy px(spec);
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);

    for (const auto& [path, reason] : {std::pair{"/unknown/x", "unknown-ca"}, std::pair{"/name/x", "name-mismatch"},
                                       std::pair{"/expired/x", "expired"}, std::pair{"/silent/x", "timeout"}}) {
      CAPTURE(path);
      const auto t0 = Clock::now();
      Curl r = fenced_post(px.port(), path, 5);
      INFO(describe(r));
      CHECK(r.status == 502);
      CHECK(r.body.find("urn:fencegate:problem:upstream-error") != std::string::npos);
      CHECK(r.body.find(std::string("TLS handshake failed (") + reason + ")") != std::string::npos);
      CHECK(ms_between(t0, Clock::now()) < 10000);  // never a hang
      CHECK(upstream_tls_failures(admin, reason) == 1);
    }
    CHECK(backend.count() == 0);  // nothing reached the upstream
    CHECK(px.log(64 * 1024).find("upstream TLS handshake failed") != std::string::npos);

    // The fence: the write of generation 5 was admitted, and its advance made durable, before the
    // upstream was connected (as for any fenced write); the failed handshake changes nothing of
    // that and advances nothing more. Generation 5 is stored, so 4 is stale now ...
    CHECK(admin_json(admin, "/v1/resources/unknown")["generation"] == 5);
    Curl stale = fenced_post(px.port(), "/unknown/x", 4);
    INFO(describe(stale));
    CHECK(stale.status == 409);
    // ... a read through the failing upstream leaves the fence alone ...
    Curl get = curl(px.port(), "GET", "/unknown/x");
    CHECK(get.status == 502);
    CHECK(admin_json(admin, "/v1/resources/unknown")["generation"] == 5);
    // ... and the failed exchange is not in flight: generation 6 is admitted at once (no drain
    // wait for it: drain_timeout_ms is 20 s), advancing to 6 and failing the handshake again.
    const auto t0 = Clock::now();
    Curl next = fenced_post(px.port(), "/unknown/x", 6);
    INFO(describe(next));
    CHECK(next.status == 502);
    CHECK(ms_between(t0, Clock::now()) < 8000);  // well below the drain timeout, even under sanitizers
    CHECK(admin_json(admin, "/v1/resources/unknown")["generation"] == 6);
    CHECK(upstream_tls_failures(admin, "unknown-ca") == 3);

    // The same nginx server through the name its certificate has: it gets through, SNI and all.
    Curl renamed = fenced_post(px.port(), "/renamed/x", 1, "ok");
    INFO(describe(renamed));
    CHECK(renamed.status == 200);
    REQUIRE(backend.count() == 1);
    CHECK(backend.requests()[0].header("X-Tls-Server-Name") == "wrong.test");
    CHECK(backend.requests()[0].body == "ok");
  }

  TEST_CASE("tls upstream: an upstream that requires a client certificate gets upstream_cert") {
    const Certs& c = certs();
    RecordingUpstream backend;
    Nginx nginx(backend.port());
    INFO(nginx.log());
    REQUIRE(nginx.ok());
    ProxySpec spec;
    spec.config =
        config_with_routes({tls_route("/with/", nginx.url(Nginx::mtls), "with",
                                      {{"upstream_cert", c.f("client.crt")}, {"upstream_key", c.f("client.key")}}),
                            tls_route("/without/", nginx.url(Nginx::mtls), "without")});
    Proxy px(spec);
    FG_LOG_ON_FAILURE(px);
    FG_START(px);

    ReadResult with = request(px.port(), "POST", "/with/x", token(2), "signed");
    INFO(describe(with));
    CHECK(with.code() == 200);
    REQUIRE(backend.count() == 1);
    CHECK(backend.requests()[0].header("X-Tls-Client-Verify") == "SUCCESS");
    CHECK(backend.requests()[0].header("X-Tls-Client-Subject").find("CN=fencegate-client") != std::string::npos);
    CHECK(backend.requests()[0].body == "signed");
    // Without one, nginx refuses the request (its 400 is relayed) and its backend sees nothing.
    ReadResult without = request(px.port(), "POST", "/without/x", token(2), "unsigned");
    INFO(describe(without));
    CHECK(without.code() == 400);
    CHECK(backend.count() == 1);
  }

  TEST_CASE("tls upstream: upstream_verify false reaches an unverifiable upstream and warns at start") {
    RecordingUpstream backend;
    Nginx nginx(backend.port());
    INFO(nginx.log());
    REQUIRE(nginx.ok());
    ProxySpec spec;
    json r = route("/", nginx.url(Nginx::other_ca), "ledger");
    r["upstream_verify"] = false;
    spec.config = config_with_routes({r});
    Proxy px(spec);
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    CHECK(eventually([&] { return px.log().find("upstream_verify is false") != std::string::npos; }));
    ReadResult ok = request(px.port(), "POST", "/x", token(1), "y");
    INFO(describe(ok));
    CHECK(ok.code() == 200);
    CHECK(backend.count() == 1);
  }

  TEST_CASE("tls upstream: a fenced write that times out stays in flight over TLS until the drain aborts it") {
    // The backend (behind nginx) never answers /slow: fencegate's client gets its 504, but the
    // write may still be applied upstream, so a newer generation waits for it (the drain) exactly
    // as with a plaintext upstream: the TLS connection is held open, not dropped.
    RecordingUpstream backend([](const RecordedRequest& r) {
      return r.target.rfind("/slow", 0) == 0 ? UpstreamAction::hang() : UpstreamAction::respond();
    });
    Nginx nginx(backend.port());
    INFO(nginx.log());
    REQUIRE(nginx.ok());
    ProxySpec spec;
    spec.config = config_with_routes({tls_route("/", nginx.url(Nginx::good), "ledger")});
    (*spec.config)["upstream_timeout_ms"] = 600;
    (*spec.config)["drain_timeout_ms"] = 2500;
    Proxy px(spec);
    FG_LOG_ON_FAILURE(px);
    FG_START(px);

    ReadResult slow = request(px.port(), "POST", "/slow", token(1), "a");
    INFO(describe(slow));
    CHECK(slow.code() == 504);
    REQUIRE(backend.wait_for_count(1, 10s));
    const auto t0 = Clock::now();
    ReadResult next = request(px.port(), "POST", "/fast", token(2), "b", 30s);
    INFO(describe(next));
    CHECK(next.code() == 200);
    CHECK(ms_between(t0, Clock::now()) >= 1500);  // it waited for the lingering write's drain
    CHECK(backend.count() == 2);
  }

  TEST_CASE("tls upstream: a reload builds new contexts; one whose files do not load keeps the old") {
    const Certs& c = certs();
    RecordingUpstream backend;
    Nginx nginx(backend.port());
    INFO(nginx.log());
    REQUIRE(nginx.ok());
    ProxySpec spec;
    spec.config = config_with_routes({tls_route("/", nginx.url(Nginx::good), "ledger")});
    (*spec.config)["threads"] = 1;
    Proxy px(spec);
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);
    auto reload = [&] { return request(admin, "POST", "/v1/config/reload", {}, {}, 30s); };
    auto post = [&] {
      ReadResult r = request(px.port(), "POST", "/x", token(1), "y");
      INFO(describe(r));
      return r.code();
    };
    auto last_connection = [&] { return backend.requests().back().header("X-Tls-Connection"); };

    CHECK(post() == 200);
    const std::string first = last_connection();
    // The same settings reloaded: a new context, so the pooled connection of the old one is not reused.
    REQUIRE(reload().code() == 200);
    CHECK(post() == 200);
    const std::string second = last_connection();
    CHECK(second != first);
    // A CA file that does not load: the reload fails naming it; the running context (and its pooled
    // connection) stay.
    json cfg = read_config(px);
    write_file(c.f("junk-ca.crt"), "junk\n");
    cfg["routes"][0]["upstream_ca"] = c.f("junk-ca.crt");
    write_config(px, cfg);
    ReadResult bad = reload();
    INFO(describe(bad));
    CHECK(bad.code() == 422);
    CHECK(bad.response.body.find("routes[0].upstream_ca") != std::string::npos);
    CHECK(post() == 200);
    CHECK(last_connection() == second);
    // A CA that does not sign nginx's certificate: new connections fail the handshake.
    cfg["routes"][0]["upstream_ca"] = c.f("other-ca.crt");
    write_config(px, cfg);
    REQUIRE(reload().code() == 200);
    CHECK(post() == 502);
    CHECK(backend.count() == 3);
  }

  TEST_CASE("tls upstream: bad settings and files exit 2 naming the field and the file") {
    const Certs& c = certs();
    TempDir dir("fencegate-tls-up-bad");
    auto serve = [&](const std::string& upstream, std::vector<std::string> more) {
      std::vector<std::string> argv{kFencegate,    "serve", "--listen",           "127.0.0.1:0", "--admin-listen",
                                    "127.0.0.1:0", "--db",  dir.file("fence.db"), "--upstream",  upstream};
      argv.insert(argv.end(), more.begin(), more.end());
      return run_command(argv, 20s);
    };
    const std::string https = "https://127.0.0.1:9";
    CommandResult missing = serve(https, {"--upstream-ca", dir.file("nope.crt")});
    INFO(missing.err);
    CHECK(missing.code() == 2);
    CHECK(missing.err.find("--upstream-ca") != std::string::npos);
    CHECK(missing.err.find(dir.file("nope.crt")) != std::string::npos);

    write_file(dir.file("junk.crt"), "not a certificate\n");
    CommandResult junk = serve(https, {"--upstream-ca", dir.file("junk.crt")});
    INFO(junk.err);
    CHECK(junk.code() == 2);
    CHECK(junk.err.find("upstream_ca") != std::string::npos);
    CHECK(junk.err.find(dir.file("junk.crt")) != std::string::npos);

    CommandResult mismatch = serve(https, {"--upstream-cert", c.f("client.crt"), "--upstream-key", c.f("server.key")});
    INFO(mismatch.err);
    CHECK(mismatch.code() == 2);
    CHECK(mismatch.err.find("upstream_key") != std::string::npos);
    CHECK(mismatch.err.find(c.f("server.key")) != std::string::npos);

    CommandResult half = serve(https, {"--upstream-cert", c.f("client.crt")});
    INFO(half.err);
    CHECK(half.code() == 2);
    CHECK(half.err.find("upstream_key") != std::string::npos);

    CommandResult plain = serve("http://127.0.0.1:9", {"--upstream-ca", c.f("ca.crt")});
    INFO(plain.err);
    CHECK(plain.code() == 2);
    CHECK(plain.err.find("only for an https:// upstream") != std::string::npos);

    CommandResult verify = serve(https, {"--upstream-verify", "maybe"});
    INFO(verify.err);
    CHECK(verify.code() == 2);
    CHECK(verify.err.find("--upstream-verify") != std::string::npos);

    // A config file's route: the same checks, named by the route's field.
    json cfg = config_with_routes({route("/", https, "r")});
    cfg["routes"][0]["upstream_cert"] = c.f("client.crt");
    cfg["routes"][0]["upstream_key"] = dir.file("gone.key");
    cfg["listen"] = "127.0.0.1:0";
    cfg["db"] = dir.file("fence.db");
    write_file(dir.file("fencegate.json"), cfg.dump());
    CommandResult file = run_command({kFencegate, "serve", "--config", dir.file("fencegate.json")}, 20s);
    INFO(file.err);
    CHECK(file.code() == 2);
    CHECK(file.err.find("routes[0].upstream_key") != std::string::npos);
    CHECK(file.err.find(dir.file("gone.key")) != std::string::npos);
  }
}
