// TLS on the data listener (issue 27, docs/tls.md), against the real binary: certificates are made
// here with the openssl command line (a throwaway CA, a server certificate for 127.0.0.1 and
// localhost, client certificates with SPIFFE IDs, an expired one and one from another CA), curl is
// the client, and a small OpenSSL client holds a keep-alive connection across a reload.
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <vector>

#include "tests/integration/ops_harness.h"
#include "tests/integration/tls_certs.h"

using namespace fencegate::testing;

namespace {

const char* const kWriter = "spiffe://test.example/ns/a/sa/writer";
const char* const kReader = "spiffe://test.example/ns/b/sa/reader";

// Certificates for every case, made once (EC P-256: fast); ca() and leaf() in tls_certs.h.
struct Certs : CertDir {
  Certs() {
    ca("ca");
    ca("other-ca");
    leaf("server", "ca", "localhost", "DNS:localhost,IP:127.0.0.1");
    leaf("server2", "other-ca", "localhost", "DNS:localhost,IP:127.0.0.1");
    leaf("writer", "ca", "writer", std::string("URI:") + kWriter);
    leaf("reader", "ca", "reader", std::string("URI:") + kReader);
    leaf("cn-only", "ca", "batch-job", "");
    leaf("expired", "ca", "expired", std::string("URI:") + kWriter, -1);
    leaf("stranger", "other-ca", "stranger", std::string("URI:") + kWriter);
    leaf("sni", "other-ca", "api.other.test", "DNS:api.other.test");
  }
};

const Certs& certs() {
  static Certs c;
  return c;
}

json tls_block(const std::string& client_auth, const std::string& min_version = "1.2") {
  const Certs& c = certs();
  json t{{"cert", c.f("server.crt")}, {"key", c.f("server.key")}, {"min_version", min_version}};
  if (client_auth != "none") {
    t["client_ca"] = c.f("ca.crt");
    t["client_auth"] = client_auth;
  }
  return t;
}

// A proxy spec of one route `r` with the listener's TLS (tls_block's arguments).
ProxySpec tls_spec(json r, const std::string& client_auth, const std::string& min_version = "1.2") {
  ProxySpec spec;
  spec.config = config_with_routes({std::move(r)});
  (*spec.config)["tls"] = tls_block(client_auth, min_version);
  return spec;
}

struct Curl {
  int exit = -1;
  int status = 0;
  std::string body, err;
};

// curl over https to the proxy; `client` names a certificate of certs() ("" none).
Curl curl(std::uint16_t port, const std::string& method, const std::string& path, const std::string& client,
          std::vector<std::string> extra = {}, const std::string& ca = "ca") {
  const Certs& c = certs();
  std::vector<std::string> argv{tool("curl"), "-sS",  "--max-time", "10", "--cacert", c.f(ca + ".crt"),
                                "-X",         method, "-o",         "-",  "-w",       "\n%{http_code}"};
  if (!client.empty()) argv.insert(argv.end(), {"--cert", c.f(client + ".crt"), "--key", c.f(client + ".key")});
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back("https://127.0.0.1:" + std::to_string(port) + path);
  CommandResult r = run_command(argv, 20s);
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

double tls_failures(std::uint16_t admin, const std::string& reason) {
  auto v =
      sample(parse_prometheus(metrics_text(admin)), "fencegate_tls_handshake_failures_total", {{"reason", reason}});
  return v.value_or(-1);
}

// A blocking TLS 1.3 client on one keep-alive connection (for the reload case).
class TlsConn {
 public:
  // `max_fragment`: an OpenSSL TLSEXT_max_fragment_length_* code, 0 for none (records of 16 KiB).
  TlsConn(std::uint16_t port, const std::string& ca, const std::string& cert, const std::string& key,
          std::uint8_t max_fragment = 0) {
    ctx_ = SSL_CTX_new(TLS_client_method());
    SSL_CTX_set_min_proto_version(ctx_, TLS1_3_VERSION);
    SSL_CTX_load_verify_locations(ctx_, ca.c_str(), nullptr);
    SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER, nullptr);
    SSL_CTX_use_certificate_chain_file(ctx_, cert.c_str());
    SSL_CTX_use_PrivateKey_file(ctx_, key.c_str(), SSL_FILETYPE_PEM);
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    timeval tv{10, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
    ssl_ = SSL_new(ctx_);
    SSL_set_fd(ssl_, fd_);
    SSL_set1_host(ssl_, "127.0.0.1");
    if (max_fragment) SSL_set_tlsext_max_fragment_length(ssl_, max_fragment);
    ok_ = SSL_connect(ssl_) == 1;
  }
  ~TlsConn() {
    if (ssl_) SSL_free(ssl_);
    if (fd_ >= 0) ::close(fd_);
    SSL_CTX_free(ctx_);
  }
  bool ok() const { return ok_; }
  // One request; the response's status (0: none), its body in *body.
  int roundtrip(const std::string& req, std::string* body) { return send(req) ? read_response(body) : 0; }
  // The head of the last response read_response returned.
  const std::string& head() const { return head_; }
  // Writes `bytes` as one TLS record (or as many as it takes past 16 KiB).
  bool send(const std::string& bytes) {
    return ok_ && SSL_write(ssl_, bytes.data(), static_cast<int>(bytes.size())) == static_cast<int>(bytes.size());
  }
  // The next response (Content-Length framed); its status (0: none), its body in *body. Bytes
  // past it stay for the next call.
  int read_response(std::string* body) {
    char buf[16384];
    for (;;) {
      const auto he = in_.find("\r\n\r\n");
      if (he != std::string::npos) {
        std::size_t len = 0;
        std::string lower;
        for (char ch : in_.substr(0, he)) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        if (auto p = lower.find("content-length:"); p != std::string::npos) len = std::stoul(lower.substr(p + 15));
        if (in_.size() >= he + 4 + len) {
          head_ = in_.substr(0, he);
          *body = in_.substr(he + 4, len);
          const int status = std::atoi(in_.c_str() + 9);
          in_.erase(0, he + 4 + len);
          return status;
        }
      }
      const int n = ok_ ? SSL_read(ssl_, buf, sizeof buf) : 0;
      if (n <= 0) return 0;
      in_.append(buf, static_cast<std::size_t>(n));
    }
  }

 private:
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
  int fd_ = -1;
  bool ok_ = false;
  std::string in_;    // read, not yet returned
  std::string head_;  // the last response's head
};

// A keep-alive TLS connection presenting the writer's certificate.
TlsConn writer_conn(std::uint16_t port) {
  const Certs& c = certs();
  return TlsConn(port, c.f("ca.crt"), c.f("writer.crt"), c.f("writer.key"));
}

}  // namespace

TEST_SUITE("tls") {
  TEST_CASE("tls: a fenced write over TLS 1.3 carries the verified identity; a forged identity header is dropped") {
    RecordingUpstream up;
    Proxy px(tls_spec(route("/", up.url(), "ledger"), "required", "1.3"));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);

    Curl r = curl(px.port(), "POST", "/orders", "writer",
                  {"--tlsv1.3", "-H", "Fencing-Token: 1", "-H", "Fencing-Client-Identity: spiffe://forged/admin", "-H",
                   "fencing_client_identity: spiffe://forged/underscore", "-d", "hello"});
    INFO(describe(r));
    CHECK(r.exit == 0);
    CHECK(r.status == 200);
    REQUIRE(up.count() == 1);
    const RecordedRequest rec = up.requests()[0];
    CHECK(rec.body == "hello");
    CHECK(rec.headers_named("Fencing-Client-Identity") == std::vector<std::string>{kWriter});
    CHECK(rec.header("fencing_client_identity").empty());
    CHECK(rec.header("X-Forwarded-For") == "127.0.0.1");

    // A refused write's log line names the identity.
    Curl no_token = curl(px.port(), "POST", "/orders", "writer", {"-d", "x"});
    CHECK(no_token.status == 428);
    CHECK(eventually([&] {
      return px.log(64 * 1024).find(std::string("\"client_identity\":\"") + kWriter + "\"") != std::string::npos;
    }));

    // A subject CN is the identity when the certificate has no SAN URI or DNS name.
    Curl cn = curl(px.port(), "POST", "/orders", "cn-only", {"-H", "Fencing-Token: 1"});
    INFO(describe(cn));
    CHECK(cn.status == 200);
    REQUIRE(up.count() == 2);
    CHECK(up.requests()[1].header("Fencing-Client-Identity") == "batch-job");

    // min_version 1.3: a TLS 1.2 client does not get in.
    Curl old = curl(px.port(), "POST", "/orders", "writer", {"--tls-max", "1.2", "-H", "Fencing-Token: 1"});
    INFO(describe(old));
    CHECK(old.exit != 0);
    CHECK(up.count() == 2);
  }

  TEST_CASE("tls: sni picks the certificate by server name; others get the main one") {
    const Certs& c = certs();
    RecordingUpstream up;
    ProxySpec spec;
    spec.config = config_with_routes({route("/", up.url(), "ledger")});
    json t = tls_block("none");
    t["sni"] = json::array(
        {json{{"names", json::array({"*.other.test"})}, {"cert", c.f("sni.crt")}, {"key", c.f("sni.key")}}});
    (*spec.config)["tls"] = t;
    Proxy px(spec);
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    const std::string resolve = "api.other.test:" + std::to_string(px.port()) + ":127.0.0.1";
    const std::string url = "https://api.other.test:" + std::to_string(px.port()) + "/x";
    CommandResult named = run_command({tool("curl"), "-sS", "--max-time", "10", "--cacert", c.f("other-ca.crt"),
                                       "--resolve", resolve, "-o", "/dev/null", "-w", "%{http_code}", url},
                                      20s);
    INFO(named.err);
    CHECK(named.out == "200");
    // The main certificate (another CA) is not what api.other.test gets ...
    CommandResult wrong = run_command({tool("curl"), "-sS", "--max-time", "10", "--cacert", c.f("ca.crt"), "--resolve",
                                       resolve, "-o", "/dev/null", url},
                                      20s);
    CHECK(wrong.code() != 0);
    // ... and a client naming no listed server gets the main one.
    CHECK(curl(px.port(), "GET", "/y", "").status == 200);
  }

  TEST_CASE("tls: client_auth required: no certificate, another CA's, an expired one fail the handshake") {
    RecordingUpstream up;
    Proxy px(tls_spec(route("/", up.url(), "ledger"), "required"));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);

    for (const char* who : {"", "stranger", "expired"}) {
      CAPTURE(who);
      Curl r = curl(px.port(), "POST", "/orders", who, {"-H", "Fencing-Token: 1", "-d", "x"});
      INFO(describe(r));
      CHECK(r.exit != 0);
      CHECK(r.status == 0);
    }
    CHECK(eventually([&] {
      return tls_failures(admin, "no_client_certificate") >= 1 && tls_failures(admin, "unknown_ca") >= 1 &&
             tls_failures(admin, "certificate_expired") >= 1;
    }));
    CHECK(up.count() == 0);
    CHECK(px.log(64 * 1024).find("TLS handshake failed") != std::string::npos);
    // And the right certificate still works on the same listener.
    Curl ok = curl(px.port(), "POST", "/orders", "writer", {"-H", "Fencing-Token: 1", "-d", "x"});
    INFO(describe(ok));
    CHECK(ok.status == 200);
    CHECK(up.count() == 1);
  }

  TEST_CASE("tls: allowed_clients refuses other identities with 403 client-not-allowed, audited") {
    RecordingUpstream up;
    ProxySpec spec;
    json r = route("/ledger/", up.url(), "ledger");
    r["allowed_clients"] = json::array({"spiffe://test.example/ns/a/*"});
    spec.config = config_with_routes({r, route("/open/", up.url(), "open")});
    (*spec.config)["tls"] = tls_block("optional");
    Proxy px(spec);
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);

    Curl denied = curl(px.port(), "POST", "/ledger/x", "reader", {"-H", "Fencing-Token: 5", "-d", "x"});
    INFO(describe(denied));
    CHECK(denied.status == 403);
    CHECK(denied.body.find("urn:fencegate:problem:client-not-allowed") != std::string::npos);
    CHECK(denied.body.find(kReader) != std::string::npos);
    // client_auth optional: a client without a certificate has no identity and is refused too.
    Curl anon = curl(px.port(), "POST", "/ledger/x", "", {"-H", "Fencing-Token: 5", "-d", "x"});
    INFO(describe(anon));
    CHECK(anon.status == 403);
    // optional still verifies a certificate that is presented: another CA's fails the handshake.
    Curl stranger = curl(px.port(), "POST", "/open/x", "stranger", {"-H", "Fencing-Token: 1"});
    INFO(describe(stranger));
    CHECK(stranger.exit != 0);
    CHECK(up.count() == 0);
    // Refused before the fence: generation 5 was not stored, so generation 1 still gets in.
    Curl allowed = curl(px.port(), "POST", "/ledger/x", "writer", {"-H", "Fencing-Token: 1", "-d", "x"});
    INFO(describe(allowed));
    CHECK(allowed.status == 200);
    // Routes without allowed_clients take anyone the handshake let in.
    CHECK(curl(px.port(), "POST", "/open/x", "", {"-H", "Fencing-Token: 1"}).status == 200);
    CHECK(up.count() == 2);

    json rows = admin_json(admin, "/v1/audit?decision=rejected_client_not_allowed");
    INFO(rows.dump());
    REQUIRE(rows.contains("rows"));
    CHECK(rows["rows"].size() == 2);
    for (const auto& row : rows["rows"]) CHECK(row["resource"] == "ledger");
    // The rows name the identity (newest first: the client without a certificate, then the reader).
    CHECK(rows["rows"][0]["client_identity"] == "");
    CHECK(rows["rows"][1]["client_identity"] == kReader);
    CHECK(sample(parse_prometheus(metrics_text(admin)), "fencegate_requests_total",
                 {{"resource", "ledger"}, {"decision", "rejected_client_not_allowed"}}) == 2);
  }

  TEST_CASE("tls: a client resumes its session with the ticket it got; with session_resumption false it cannot") {
    const Certs& c = certs();
    RecordingUpstream up;
    TempDir dir("fencegate-tls-resume");
    for (const bool on : {true, false}) {
      CAPTURE(on);
      ProxySpec spec;
      spec.config = config_with_routes({route("/", up.url(), "ledger")});
      json t = tls_block("none", "1.3");
      if (!on) t["session_resumption"] = false;
      (*spec.config)["tls"] = t;
      Proxy px(spec);
      FG_LOG_ON_FAILURE(px);
      FG_START(px);
      // openssl s_client, one GET each, kept open a second for the server's tickets (OpenSSL sends
      // them with its first write after the handshake); the first saves its session, the second
      // offers it.
      const std::string sess = dir.file(on ? "on.sess" : "off.sess");
      auto connect = [&](const std::string& sess_flag) {
        return run_command({"/bin/sh", "-c",
                            "(printf 'GET /x HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\n\\r\\n'; sleep 1) | " +
                                tool("openssl") + " s_client -connect 127.0.0.1:" + std::to_string(px.port()) +
                                " -tls1_3 -CAfile " + c.f("ca.crt") +
                                (sess_flag.empty() ? "" : " " + sess_flag + " " + sess) + " 2>&1"},
                           20s);
      };
      CommandResult first = connect("-sess_out");
      INFO(first.out);
      CHECK(first.out.find("HTTP/1.1 200") != std::string::npos);
      CHECK(first.out.find("New, TLSv1.3") != std::string::npos);
      CHECK((first.out.find("New Session Ticket arrived") != std::string::npos) == on);
      // (With nothing resumable s_client may save no session at all: then it offers none.)
      CommandResult second = connect(std::filesystem::exists(sess) ? "-sess_in" : "");
      INFO(second.out);
      CHECK(second.out.find("HTTP/1.1 200") != std::string::npos);
      CHECK((second.out.find("Reused, TLSv1.3") != std::string::npos) == on);
      CHECK((second.out.find("New, TLSv1.3") != std::string::npos) == !on);
    }
  }

  TEST_CASE("tls: plain HTTP sent to the TLS port gets a plaintext 400 and a close") {
    RecordingUpstream up;
    Proxy px(tls_spec(route("/", up.url(), "ledger"), "none"));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);

    ReadResult r = request(px.port(), "POST", "/orders", token(1), "x");
    INFO(describe(r));
    CHECK(r.code() == 400);
    CHECK(r.response.body.find("TLS") != std::string::npos);
    CHECK(up.count() == 0);
    CHECK(tls_failures(admin, "plaintext_http") == 1);
    // client_auth none: a client without a certificate is served, with no identity header.
    Curl ok = curl(px.port(), "POST", "/orders", "", {"-H", "Fencing-Token: 1", "-H", "Fencing-Client-Identity: x"});
    INFO(describe(ok));
    CHECK(ok.status == 200);
    REQUIRE(up.count() == 1);
    CHECK_FALSE(up.requests()[0].has("Fencing-Client-Identity"));
  }

  TEST_CASE("tls: a stalled handshake is cut at header_timeout_ms while other clients are served") {
    RecordingUpstream up;
    ProxySpec spec;
    spec.config = config_with_routes({route("/", up.url(), "ledger")});
    (*spec.config)["tls"] = tls_block("none");
    (*spec.config)["header_timeout_ms"] = 600;
    Proxy px(spec);
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);

    auto connect_raw = [&] {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(px.port());
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
      timeval tv{10, 0};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      return fd;
    };
    const int silent = connect_raw();
    const int partial = connect_raw();
    REQUIRE(::send(partial, "\x16\x03\x01", 3, MSG_NOSIGNAL) == 3);  // a ClientHello that never ends
    // Meanwhile a real client is served.
    Curl ok = curl(px.port(), "POST", "/orders", "", {"-H", "Fencing-Token: 1"});
    INFO(describe(ok));
    CHECK(ok.status == 200);
    // Both stalled ones are closed by the proxy (read returns 0 or a reset), within the timeout + slack.
    for (int fd : {silent, partial}) {
      char b[64];
      const ssize_t n = ::recv(fd, b, sizeof b, 0);
      CHECK(n <= 0);
      CHECK((n == 0 || errno != EAGAIN));
      ::close(fd);
    }
    CHECK(eventually([&] { return tls_failures(admin, "timeout") == 2; }));
  }

  TEST_CASE("tls: a missing certificate file or a key that is not the certificate's exits 2 naming the file") {
    const Certs& c = certs();
    TempDir dir("fencegate-tls-bad");
    auto serve = [&](const std::string& cert, const std::string& key) {
      return run_command({kFencegate, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--db",
                          dir.file("fence.db"), "--upstream", "http://127.0.0.1:9", "--tls-cert", cert, "--tls-key",
                          key},
                         20s);
    };
    CommandResult missing = serve(dir.file("nope.crt"), c.f("server.key"));
    INFO(missing.err);
    CHECK(missing.code() == 2);
    CHECK(missing.err.find("--tls-cert") != std::string::npos);
    CHECK(missing.err.find(dir.file("nope.crt")) != std::string::npos);

    CommandResult mismatch = serve(c.f("server.crt"), c.f("writer.key"));
    INFO(mismatch.err);
    CHECK(mismatch.code() == 2);
    CHECK(mismatch.err.find(c.f("writer.key")) != std::string::npos);

    CommandResult bad_auth =
        run_command({kFencegate, "serve", "--db", dir.file("fence.db"), "--upstream", "http://127.0.0.1:9",
                     "--tls-cert", c.f("server.crt"), "--tls-key", c.f("server.key"), "--tls-client-auth", "required"},
                    20s);
    INFO(bad_auth.err);
    CHECK(bad_auth.code() == 2);
    CHECK(bad_auth.err.find("tls.client_ca") != std::string::npos);
  }

  TEST_CASE("tls: new certificates on reload; an open keep-alive connection keeps working") {
    const Certs& c = certs();
    RecordingUpstream up;
    Proxy px(tls_spec(route("/", up.url(), "ledger"), "required"));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);

    TlsConn conn = writer_conn(px.port());
    REQUIRE(conn.ok());
    std::string body;
    const std::string req = "POST /a HTTP/1.1\r\nHost: x\r\nFencing-Token: 1\r\nContent-Length: 1\r\n\r\nx";
    CHECK(conn.roundtrip(req, &body) == 200);

    // A key that does not match: the reload fails naming the file, the old certificate stays.
    json cfg = read_config(px);
    cfg["tls"]["cert"] = c.f("server2.crt");
    cfg["tls"]["key"] = c.f("server.key");
    write_config(px, cfg);
    ReadResult bad = request(admin, "POST", "/v1/config/reload", {}, {}, 30s);
    INFO(describe(bad));
    CHECK(bad.code() == 422);
    CHECK(bad.response.body.find("server.key") != std::string::npos);
    CHECK(sample(parse_prometheus(metrics_text(admin)), "fencegate_config_reloads_total", {{"result", "rejected"}}) ==
          1);
    CHECK(curl(px.port(), "POST", "/b", "writer", {"-H", "Fencing-Token: 1"}).status == 200);

    // The server's new certificate comes from another CA.
    cfg["tls"]["key"] = c.f("server2.key");
    write_config(px, cfg);
    ReadResult good = request(admin, "POST", "/v1/config/reload", {}, {}, 30s);
    INFO(describe(good));
    REQUIRE(good.code() == 200);
    Curl old_ca = curl(px.port(), "POST", "/c", "writer", {"-H", "Fencing-Token: 1"});
    CHECK(old_ca.exit != 0);  // the new certificate is served to new connections ...
    Curl new_ca = curl(px.port(), "POST", "/c", "writer", {"-H", "Fencing-Token: 1"}, "other-ca");
    INFO(describe(new_ca));
    CHECK(new_ca.status == 200);
    CHECK(conn.roundtrip(req, &body) == 200);  // ... and the open connection goes on
    CHECK(up.count() == 4);
    // A graceful stop with the TLS connection still open.
    const ExitStatus st = px.stop();
    CHECK(st.exited);
    CHECK(st.code == 0);
  }

  TEST_CASE("tls: one connection's records: pipelined requests, large bodies both ways, a parked connection woken") {
    const std::string big(300000, 'b');
    RecordingUpstream up([&](const RecordedRequest& r) {
      UpstreamAction a;
      if (r.target == "/big") a.body = big;
      return a;
    });
    Proxy px(tls_spec(route("/", up.url(), "ledger"), "required"));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);

    TlsConn conn = writer_conn(px.port());
    REQUIRE(conn.ok());
    auto post = [](const std::string& path, const std::string& body) {
      return "POST " + path +
             " HTTP/1.1\r\nHost: x\r\nFencing-Token: 1\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
             body;
    };
    std::string body;
    // Two requests in one record, then two records sent back to back: OpenSSL reads ahead, so the
    // second request may sit in its buffer, where no socket readiness announces it.
    REQUIRE(conn.send(post("/p1", "a") + post("/p2", "b")));
    CHECK(conn.read_response(&body) == 200);
    CHECK(conn.read_response(&body) == 200);
    REQUIRE(conn.send(post("/p3", "c")));
    REQUIRE(conn.send(post("/p4", "d")));
    CHECK(conn.read_response(&body) == 200);
    CHECK(conn.read_response(&body) == 200);
    REQUIRE(up.wait_for_count(4, 5s));
    // A body over many records, and an answer over many records.
    std::string upload(200 * 1024, '\0');
    for (std::size_t i = 0; i < upload.size(); ++i) upload[i] = static_cast<char>('a' + i % 26);
    CHECK(conn.roundtrip(post("/upload", upload), &body) == 200);
    REQUIRE(up.wait_for_count(5, 5s));
    CHECK(up.requests()[4].body == upload);
    CHECK(conn.roundtrip("GET /big HTTP/1.1\r\nHost: x\r\n\r\n", &body) == 200);
    CHECK(body == big);
    // A client that asked for records of at most 512 bytes (max_fragment_length) gets them.
    TlsConn small(px.port(), certs().f("ca.crt"), certs().f("writer.crt"), certs().f("writer.key"),
                  TLSEXT_max_fragment_length_512);
    REQUIRE(small.ok());
    CHECK(small.roundtrip("GET /big HTTP/1.1\r\nHost: x\r\n\r\n", &body) == 200);
    CHECK(body == big);
    CHECK(small.roundtrip(post("/small-records", upload.substr(0, 3000)), &body) == 200);
    // Idle past the hot wait (50 ms): the connection parks without its buffers; its next request
    // wakes it.
    std::this_thread::sleep_for(300ms);
    CHECK(conn.roundtrip(post("/after-idle", "e"), &body) == 200);
    REQUIRE(up.count() == 9);
    CHECK(up.requests()[8].target == "/after-idle");
    for (const RecordedRequest& r : up.requests()) CHECK(r.header("Fencing-Client-Identity") == kWriter);
  }

  TEST_CASE("tls: more keep-alive connections waiting than keep OpenSSL's buffers: every one keeps working") {
    RecordingUpstream up([](const RecordedRequest&) { return UpstreamAction{}; });
    Proxy px(tls_spec(route("/", up.url(), "ledger"), "required"));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    // Past 64 connections of a worker waiting for their next request, a waiting connection gives
    // OpenSSL's record buffers back (session_tls.cpp); its next request has them allocated again.
    const Certs& c = certs();
    const std::string post = "POST /w HTTP/1.1\r\nHost: x\r\nFencing-Token: 1\r\nContent-Length: 2\r\n\r\nab";
    std::string body;
    std::vector<std::unique_ptr<TlsConn>> conns;
    for (int i = 0; i < 100; ++i) {
      conns.push_back(std::make_unique<TlsConn>(px.port(), c.f("ca.crt"), c.f("writer.crt"), c.f("writer.key")));
      REQUIRE(conns.back()->ok());
      REQUIRE(conns.back()->roundtrip(post, &body) == 200);
    }
    // Each in turn, quickly: all 100 wait hot between their requests.
    for (int round = 0; round < 3; ++round)
      for (auto& conn : conns) REQUIRE(conn->roundtrip(post, &body) == 200);
    // Past the hot wait (parked), and once more.
    std::this_thread::sleep_for(300ms);
    for (auto& conn : conns) CHECK(conn->roundtrip(post, &body) == 200);
    CHECK(up.wait_for_count(500, 5s));
  }

  TEST_CASE("tls: a keyed write's replay and 100-continue answers go out as TLS records") {
    RecordingUpstream up;
    json r = route("/", up.url(), "ledger");
    r["idempotency"] = json::object();
    Proxy px(tls_spec(r, "required"));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);

    TlsConn conn = writer_conn(px.port());
    REQUIRE(conn.ok());
    auto keyed = [](const std::string& key, const std::string& extra, const std::string& body) {
      return "POST /charge HTTP/1.1\r\nHost: x\r\nFencing-Token: 1\r\nIdempotency-Key: \"" + key + "\"\r\n" + extra +
             "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    };
    std::string body;
    REQUIRE(conn.roundtrip(keyed("charge:c1:2026-12", "", "abc"), &body) == 200);
    const std::string first = body;
    // The replay is answered by fencegate itself, from the store, over the same TLS connection.
    REQUIRE(conn.roundtrip(keyed("charge:c1:2026-12", "", "abc"), &body) == 200);
    CHECK(body == first);
    std::string head = conn.head();
    for (char& ch : head) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    CHECK(head.find("idempotent-replayed: true") != std::string::npos);
    CHECK(up.count() == 1);

    // Expect: 100-continue, keyed (the key path reads the body itself) and not keyed.
    const std::string expect = "Expect: 100-continue\r\n";
    std::string req = keyed("charge:c2:2026-12", expect, "hello");
    REQUIRE(conn.send(req.substr(0, req.size() - 5)));
    CHECK(conn.read_response(&body) == 100);
    REQUIRE(conn.send("hello"));
    CHECK(conn.read_response(&body) == 200);
    req = "POST /plain HTTP/1.1\r\nHost: x\r\nFencing-Token: 1\r\n" + expect + "Content-Length: 5\r\n\r\n";
    REQUIRE(conn.send(req));
    CHECK(conn.read_response(&body) == 100);
    REQUIRE(conn.send("world"));
    CHECK(conn.read_response(&body) == 200);
    REQUIRE(up.count() == 3);
    CHECK(up.requests()[1].body == "hello");
    CHECK(up.requests()[2].body == "world");
  }
}
