// Issue 27 (tls-ctl): TLS on every etcd hop and on the admin API, with real parts only: certificates
// made by the openssl command line, a real etcd serving https (with --client-cert-auth, and once
// with users), real `fencegate elect` / `leader` / `serve` processes, and curl.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "election_client/etcd_client.h"
#include "tests/election/etcd_tls_harness.h"
#include "tests/election/fleet_harness.h"
#include "tests/support/http_client.h"
#include "tests/support/upstream.h"

using namespace fencegate::testing;
using json = nlohmann::json;
namespace election = fencegate::election;

namespace {

// `fencegate serve` with the admin API on https (admin.tls) and, optionally, a route authority.
struct TlsServe {
  std::unique_ptr<TempDir> dir = std::make_unique<TempDir>("fencegate-tls-serve");
  std::uint16_t port = free_port(), admin_port = free_port();
  std::unique_ptr<Process> process;

  TlsServe(const TestCerts& certs, const std::string& upstream, const json& admin_tls,
           const json& authority = nullptr) {
    while (admin_port == port) admin_port = free_port();
    json route = {{"prefix", "/"}, {"upstream", upstream}, {"resource", "ledger"}};
    if (!authority.is_null()) route["authority"] = authority;
    json admin = {{"listen", "127.0.0.1:" + std::to_string(admin_port)}};
    if (!admin_tls.is_null()) admin["tls"] = admin_tls;
    json c = {{"listen", "127.0.0.1:" + std::to_string(port)},
              {"db", dir->file("fence.db")},
              {"threads", 1},
              {"admin", admin},
              {"routes", {route}}};
    write_file(dir->file("fencegate.json"), c.dump(2));
    (void)certs;
  }
  bool start() {
    process = std::make_unique<Process>(Process::start({kFencegate, "serve", "--config", dir->file("fencegate.json")},
                                                       {dir->file("serve.log"), {}, {}}));
    return process->wait_for_port(port, 15s) && process->wait_for_port(admin_port, 15s);
  }
  std::string log() const { return read_file(dir->file("serve.log"), 16 * 1024); }
  std::string admin_url(const std::string& path) const {
    return "https://127.0.0.1:" + std::to_string(admin_port) + path;
  }
};

json tls_of(const TestCerts& c, const std::string& client_auth = "none") {
  json t = {{"cert", c.server_cert()}, {"key", c.server_key()}};
  if (client_auth != "none") {
    t["client_ca"] = c.ca();
    t["client_auth"] = client_auth;
  }
  return t;
}

std::vector<std::string> cert_flags(const TestCerts& c) {
  return {"--cacert", c.ca(), "--cert", c.client_cert(), "--key", c.client_key()};
}

// Runs a fencegate command to its end; the exit code, its output in *out.
int run_fencegate(const std::vector<std::string>& args, std::string* out, const std::vector<std::string>& env = {}) {
  TempDir d("fencegate-tls-cmd");
  std::vector<std::string> argv{kFencegate};
  argv.insert(argv.end(), args.begin(), args.end());
  Process p = Process::start(argv, {d.file("out.log"), {}, env});
  auto st = p.wait_for(30s);
  *out = read_file(d.file("out.log"), 16 * 1024);
  if (!st) {
    p.kill(SIGKILL);
    *out += "\n(still running after 30 s)";
    return -1;
  }
  return st->exited ? st->code : 128 + st->signal;
}

#define FG_REQUIRE_TLS_TOOLS()                                     \
  FG_REQUIRE_ETCD();                                               \
  do {                                                             \
    if (run_shell("command -v openssl && command -v curl") != 0) { \
      MESSAGE("SKIPPED: openssl or curl is not installed");        \
      return;                                                      \
    }                                                              \
  } while (0)

}  // namespace

TEST_CASE(
    "etcd TLS: elect campaigns over TLS with a client certificate, fences an https admin API, the authority "
    "watch follows it; without the client certificate each fails with a clear error") {
  FG_REQUIRE_TLS_TOOLS();
  TempDir cdir("fencegate-certs");
  TestCerts certs{cdir.path()};
  const std::string made = certs.make();
  REQUIRE_MESSAGE(made.empty(), made);
  TlsEtcd etcd(certs, /*client_cert_auth=*/true);
  REQUIRE_MESSAGE(etcd.start(), etcd.log());

  RecordingUpstream upstream;
  json authority = {{"etcd", {etcd.url()}},
                    {"election", "ledger"},
                    {"cacert", certs.ca()},
                    {"cert", certs.client_cert()},
                    {"key", certs.client_key()}};
  TlsServe serve(certs, upstream.url(), tls_of(certs), authority);
  REQUIRE_MESSAGE(serve.start(), serve.log());
  INFO(serve.log());

  // The admin API speaks only TLS now, verified against our CA.
  CHECK(curl_https(serve.admin_url("/healthz"), {"--cacert", certs.ca()}) == "200");
  CHECK(curl_https("http://127.0.0.1:" + std::to_string(serve.admin_port) + "/healthz", {}) != "200");

  // elect over TLS: campaigns, fences the https admin API (--fence-cacert), then runs its command.
  TempDir dir("fencegate-tls-elect");
  std::vector<std::string> flags{"--etcd",         etcd.url(),
                                 "--election",     "ledger",
                                 "--id",           "worker-a",
                                 "--ttl",          "5",
                                 "--fence",        serve.admin_url("/v1/resources/ledger"),
                                 "--fence-cacert", certs.ca()};
  for (auto& f : cert_flags(certs)) flags.push_back(f);
  Contender a = start_contender(dir.path(), "a", flags);
  INFO(a.log());
  REQUIRE(eventually([&] { return a.started_command(); }, 20s));
  const std::int64_t token = a.token();
  CHECK(token > 0);

  // `fencegate leader` over TLS sees the same token.
  std::string out;
  std::vector<std::string> leader_args{"leader", "--etcd", etcd.url(), "--election", "ledger"};
  for (auto& f : cert_flags(certs)) leader_args.push_back(f);
  CHECK(run_fencegate(leader_args, &out) == 0);
  CHECK(out.find("\"token\":" + std::to_string(token)) != std::string::npos);

  // The fence was advanced over https, and the authority (watching etcd over TLS) admits the leader.
  std::string gen;
  run_shell("curl -sS --cacert '" + certs.ca() + "' " + serve.admin_url("/v1/resources/ledger"), &gen, false);
  CHECK(gen.find("\"generation\":" + std::to_string(token)) != std::string::npos);
  CHECK(eventually(
      [&] {
        return request(serve.port, "POST", "/ledger/charge", {{"Fencing-Token", std::to_string(token)}}, "{}", 5s)
                   .code() == 200;
      },
      15s));
  CHECK(
      request(serve.port, "POST", "/ledger/charge", {{"Fencing-Token", std::to_string(token - 1)}}, "{}", 5s).code() ==
      409);

  // Without the client certificate: leader and elect fail at once, saying a certificate is needed.
  CHECK(run_fencegate({"leader", "--etcd", etcd.url(), "--election", "ledger", "--cacert", certs.ca()}, &out) == 1);
  CHECK_MESSAGE(out.find("client certificate") != std::string::npos, out);
  CHECK(run_fencegate({"elect", "--etcd", etcd.url(), "--election", "ledger", "--cacert", certs.ca(), "--", "true"},
                      &out) == 1);
  CHECK_MESSAGE(out.find("client certificate") != std::string::npos, out);
  // Without our CA the server's certificate does not verify (the system store does not know it).
  CHECK(run_fencegate({"leader", "--etcd", etcd.url(), "--election", "ledger"}, &out) == 1);
  CHECK_MESSAGE(out.find("does not verify") != std::string::npos, out);
  // Bad flags: a password is never a flag value; a key without its certificate; http with TLS files.
  CHECK(run_fencegate({"leader", "--etcd", etcd.url(), "--election", "x", "--user", "u", "--password", "p"}, &out) ==
        2);
  CHECK(out.find("--password-file") != std::string::npos);
  CHECK(run_fencegate({"leader", "--etcd", etcd.url(), "--election", "x", "--key", certs.client_key()}, &out) == 2);
  CHECK(out.find("--cert: required with key") != std::string::npos);

  // A serve whose authority has no client certificate: its writes are refused (503), and its log
  // says that etcd wants a client certificate.
  json bare = {{"etcd", {etcd.url()}}, {"election", "ledger"}, {"cacert", certs.ca()}};
  TlsServe serve2(certs, upstream.url(), nullptr, bare);
  REQUIRE_MESSAGE(serve2.start(), serve2.log());
  CHECK(request(serve2.port, "POST", "/ledger/charge", {{"Fencing-Token", std::to_string(token)}}, "{}", 10s).code() ==
        503);
  CHECK_MESSAGE(eventually([&] { return serve2.log().find("client certificate") != std::string::npos; }, 15s),
                serve2.log());
  a.process->stop(5s);
}

TEST_CASE(
    "etcd TLS: users: elect with --user and --password-file, a wrong password says authentication failed, an "
    "expired token is renewed") {
  FG_REQUIRE_TLS_TOOLS();
  if (run_shell("command -v etcdctl") != 0) {
    MESSAGE("SKIPPED: etcdctl is not installed (etcd-client)");
    return;
  }
  TempDir cdir("fencegate-certs");
  TestCerts certs{cdir.path()};
  const std::string made = certs.make();
  REQUIRE_MESSAGE(made.empty(), made);
  // https without client certificates (etcd would take a certificate's CN as the user), simple
  // tokens that expire after 2 s.
  TlsEtcd etcd(certs, /*client_cert_auth=*/false, {"--auth-token-ttl", "2"});
  REQUIRE_MESSAGE(etcd.start(), etcd.log());
  for (const char* cmd : {"user add root:rootpw", "user add fg:fgpw", "user grant-role fg root", "auth enable"})
    REQUIRE_MESSAGE(etcd.etcdctl(cmd).empty(), etcd.etcdctl(cmd));

  TempDir dir("fencegate-tls-auth");
  write_file(dir.file("pw"), "fgpw\n");
  write_file(dir.file("bad"), "nope\n");
  ::chmod(dir.file("pw").c_str(), 0600);
  ::chmod(dir.file("bad").c_str(), 0600);

  std::string out;
  // No user: etcd wants one, and the error says so.
  CHECK(run_fencegate({"leader", "--etcd", etcd.url(), "--election", "jobs", "--cacert", certs.ca()}, &out) == 1);
  CHECK_MESSAGE(out.find("--user") != std::string::npos, out);
  // A wrong password: authentication failed, not a hang.
  CHECK(run_fencegate({"elect", "--etcd", etcd.url(), "--election", "jobs", "--cacert", certs.ca(), "--user", "fg",
                       "--password-file", dir.file("bad"), "--", "true"},
                      &out) == 1);
  CHECK_MESSAGE(out.find("authentication failed") != std::string::npos, out);
  // The right one (from the file, and from the environment).
  Contender a = start_contender(dir.path(), "a",
                                {"--etcd", etcd.url(), "--election", "jobs", "--id", "worker-a", "--ttl", "5",
                                 "--cacert", certs.ca(), "--user", "fg", "--password-file", dir.file("pw")});
  INFO(a.log());
  REQUIRE(eventually([&] { return a.started_command(); }, 20s));
  CHECK(run_fencegate({"leader", "--etcd", etcd.url(), "--election", "jobs", "--cacert", certs.ca(), "--user", "fg"},
                      &out, {"FENCEGATE_ETCD_PASSWORD=fgpw"}) == 0);
  CHECK_MESSAGE(out.find("\"token\":" + std::to_string(a.token())) != std::string::npos, out);

  // The client authenticates again once its token expired (3 s idle > the 2 s token TTL).
  election::ClientOptions co;
  co.endpoints = {etcd.url()};
  co.security.cacert = certs.ca();
  co.security.user = "fg";
  co.security.password = "fgpw";
  election::Client c(co);
  CHECK(c.put("fencegate-tls/k", "v1").ok());
  std::this_thread::sleep_for(3s);
  election::Status st = c.put("fencegate-tls/k", "v2");
  CHECK_MESSAGE(st.ok(), st.to_string());
  a.process->stop(5s);
}

TEST_CASE(
    "admin TLS: client_auth required refuses a client without a certificate at the handshake; with one the "
    "API answers; a key that does not load exits 2 naming admin.tls.key") {
  FG_REQUIRE_TLS_TOOLS();
  TempDir cdir("fencegate-certs");
  TestCerts certs{cdir.path()};
  const std::string made = certs.make();
  REQUIRE_MESSAGE(made.empty(), made);
  RecordingUpstream upstream;
  TlsServe serve(certs, upstream.url(), tls_of(certs, "required"));
  REQUIRE_MESSAGE(serve.start(), serve.log());
  INFO(serve.log());
  const std::string url = serve.admin_url("/v1/resources");
  const std::string no_cert = curl_https(url, {"--cacert", certs.ca()});
  CHECK_MESSAGE(no_cert.rfind("curl exit", 0) == 0, no_cert);  // no HTTP answer at all
  CHECK(curl_https(url, {"--cacert", certs.ca(), "--cert", certs.client_cert(), "--key", certs.client_key()}) == "200");
  // A certificate from another CA is refused too.
  TempDir odir("fencegate-certs-other");
  TestCerts other{odir.path()};
  REQUIRE(other.make().empty());
  CHECK(curl_https(url, {"--cacert", certs.ca(), "--cert", other.client_cert(), "--key", other.client_key()})
            .rfind("curl exit", 0) == 0);
  // Each refused handshake is counted by its reason (the page is read with a good certificate).
  std::string metrics;
  REQUIRE(run_shell("curl -sS --max-time 10 --cacert '" + certs.ca() + "' --cert '" + certs.client_cert() +
                        "' --key '" + certs.client_key() + "' '" + serve.admin_url("/metrics") + "'",
                    &metrics) == 0);
  CHECK_MESSAGE(metrics.find("fencegate_admin_tls_handshake_failures_total{reason=\"no_client_certificate\"} 1\n") !=
                    std::string::npos,
                metrics);
  CHECK_MESSAGE(metrics.find("fencegate_admin_tls_handshake_failures_total{reason=\"unknown_ca\"} 1\n") !=
                    std::string::npos,
                metrics);

  // SIGHUP with a certificate that no longer loads keeps the running one.
  write_file(serve.dir->file("fencegate.json"), [&] {
    json c = json::parse(read_file(serve.dir->file("fencegate.json")));
    c["admin"]["tls"]["key"] = other.server_key();  // not the key of server.pem
    return c.dump();
  }());
  serve.process->kill(SIGHUP);
  CHECK(eventually([&] { return serve.log().find("admin.tls.key") != std::string::npos; }, 10s));
  CHECK(curl_https(url, {"--cacert", certs.ca(), "--cert", certs.client_cert(), "--key", certs.client_key()}) == "200");

  // At start: exit 2 naming the field.
  std::string out;
  TlsServe bad(certs, upstream.url(), json{{"cert", certs.server_cert()}, {"key", other.server_key()}});
  CHECK(run_fencegate({"serve", "--config", bad.dir->file("fencegate.json")}, &out) == 2);
  CHECK_MESSAGE(out.find("admin.tls.key") != std::string::npos, out);
  TlsServe missing(certs, upstream.url(), json{{"cert", certs.server_cert()}, {"key", cdir.file("nope.key")}});
  CHECK(run_fencegate({"serve", "--config", missing.dir->file("fencegate.json")}, &out) == 2);
  CHECK_MESSAGE(out.find("admin.tls.key") != std::string::npos, out);

  // A route authority's etcd TLS file that is missing, or TLS files for http:// endpoints: exit 2.
  TlsServe auth_bad(certs, upstream.url(), nullptr,
                    json{{"etcd", {"https://127.0.0.1:1"}}, {"election", "e"}, {"cacert", cdir.file("nope.pem")}});
  CHECK(run_fencegate({"serve", "--config", auth_bad.dir->file("fencegate.json")}, &out) == 2);
  CHECK_MESSAGE(out.find("routes[0].authority.cacert") != std::string::npos, out);
  TlsServe auth_http(certs, upstream.url(), nullptr,
                     json{{"etcd", {"http://127.0.0.1:1"}}, {"election", "e"}, {"cacert", certs.ca()}});
  CHECK(run_fencegate({"serve", "--config", auth_http.dir->file("fencegate.json")}, &out) == 2);
  CHECK_MESSAGE(out.find("https://") != std::string::npos, out);
}

// Issue 27 for the fleet (docs/fleet.md): replicas reach their etcd over https with a client
// certificate; without one a replica does not start, and says which setting is missing.
TEST_CASE(
    "fleet over etcd TLS: two replicas with client certificates admit a write and advance; a replica without "
    "fleet.cert fails closed naming it") {
  FG_REQUIRE_TLS_TOOLS();
  TempDir cdir("fencegate-certs");
  TestCerts certs{cdir.path()};
  const std::string made = certs.make();
  REQUIRE_MESSAGE(made.empty(), made);
  TlsEtcd etcd(certs, /*client_cert_auth=*/true);
  REQUIRE_MESSAGE(etcd.start(), etcd.log());
  RecordingUpstream up;
  const json routes =
      json::array({{{"prefix", "/"}, {"upstream", up.url()}, {"resource", "ledger"}, {"mode", "enforce"}}});
  auto fleet_of = [&](const std::string& member, bool with_cert) {
    json f = {
        {"etcd", {etcd.url()}}, {"name", "tls"}, {"member", member}, {"ttl_ms", kFleetTtlMs}, {"cacert", certs.ca()}};
    if (with_cert) {
      f["cert"] = certs.client_cert();
      f["key"] = certs.client_key();
    }
    return json{{"fleet", f}};
  };
  Replica a({etcd.url()}, "tls", "a", routes, fleet_of("a", true));
  Replica b({etcd.url()}, "tls", "b", routes, fleet_of("b", true));
  REQUIRE_MESSAGE(a.start(), a.log());
  REQUIRE_MESSAGE(b.start(), b.log());
  INFO(a.log());
  INFO(b.log());

  auto r = a.write(1);
  CHECK_MESSAGE(r.code() == 200, describe(r));
  r = b.write(2);  // an advance: intent, a's acknowledgement, commit, all over TLS
  CHECK_MESSAGE(r.code() == 200, describe(r));
  CHECK(a.write(1).code() == 409);
  CHECK(a.write(2).code() == 200);
  election::ClientOptions co;
  co.endpoints = {etcd.url()};
  co.security.cacert = certs.ca();
  co.security.cert = certs.client_cert();
  co.security.key = certs.client_key();
  election::Client c(co);
  std::vector<election::KeyValue> kvs;
  REQUIRE(c.range("fencegate/fleet/tls/fence/ledger", "", &kvs).ok());
  REQUIRE(kvs.size() == 1);
  CHECK(kvs[0].value.substr(0, 20) == "00000000000000000002");
  CHECK(a.admin("/readyz").code() == 200);

  // Without the client certificate etcd refuses the handshake: the replica cannot read the fence,
  // so it does not start (exit 1, as with an unreachable etcd), and its error names fleet.cert.
  Replica bare({etcd.url()}, "tls", "c", routes, fleet_of("c", false));
  std::string out;
  CHECK(run_fencegate({"serve", "--config", bare.config_path()}, &out) == 1);
  CHECK_MESSAGE(out.find("fleet.cert") != std::string::npos, out);
  CHECK_MESSAGE(out.find("client certificate") != std::string::npos, out);
  // TLS files for http:// endpoints, or a CA file that is not there: exit 2 naming the field.
  json http_fleet = fleet_of("d", true);
  http_fleet["fleet"]["etcd"] = {"http://127.0.0.1:1"};
  Replica http({"http://127.0.0.1:1"}, "tls", "d", routes, http_fleet);
  CHECK(run_fencegate({"serve", "--config", http.config_path()}, &out) == 2);
  CHECK_MESSAGE(out.find("fleet.cacert") != std::string::npos, out);
  json gone = fleet_of("e", true);
  gone["fleet"]["cacert"] = cdir.file("nope.pem");
  Replica missing({etcd.url()}, "tls", "e", routes, gone);
  CHECK(run_fencegate({"serve", "--config", missing.config_path()}, &out) == 2);
  CHECK_MESSAGE(out.find("fleet.cacert") != std::string::npos, out);
  std::vector<std::int64_t> seen;
  for (const auto& q : up.requests()) seen.push_back(q.fencing_token().value_or(-1));
  CHECK(seen == std::vector<std::int64_t>{1, 2, 2});  // the stale write never reached the upstream
  // b acknowledges a's intents straight from its watch (over TLS) when it has nothing in flight:
  // a's advances count there (the first intent may have come before b's watch was up).
  std::int64_t g = 2;
  CHECK(
      eventually([&] { return a.write(++g).code() == 200 && b.metric("fencegate_fleet_fast_acks_total") >= 1; }, 10s));
}

// Issue 27 for the fleet: etcd users (fleet.user, fleet.password_file or FENCEGATE_ETCD_PASSWORD).
TEST_CASE("fleet over etcd TLS with users: replicas log in and advance; a wrong password fails closed naming it") {
  FG_REQUIRE_TLS_TOOLS();
  if (run_shell("command -v etcdctl") != 0) {
    MESSAGE("SKIPPED: etcdctl is not installed (etcd-client)");
    return;
  }
  TempDir cdir("fencegate-certs");
  TestCerts certs{cdir.path()};
  const std::string made = certs.make();
  REQUIRE_MESSAGE(made.empty(), made);
  TlsEtcd etcd(certs, /*client_cert_auth=*/false);
  REQUIRE_MESSAGE(etcd.start(), etcd.log());
  for (const char* cmd : {"user add root:rootpw", "user add fg:fgpw", "user grant-role fg root", "auth enable"})
    REQUIRE_MESSAGE(etcd.etcdctl(cmd).empty(), etcd.etcdctl(cmd));
  TempDir dir("fencegate-fleet-auth");
  write_file(dir.file("pw"), "fgpw\n");
  write_file(dir.file("bad"), "nope\n");
  ::chmod(dir.file("pw").c_str(), 0600);
  ::chmod(dir.file("bad").c_str(), 0600);
  RecordingUpstream up;
  const json routes =
      json::array({{{"prefix", "/"}, {"upstream", up.url()}, {"resource", "ledger"}, {"mode", "enforce"}}});
  auto fleet_of = [&](const std::string& member, const std::string& pw) {
    return json{{"fleet",
                 {{"etcd", {etcd.url()}},
                  {"name", "auth"},
                  {"member", member},
                  {"ttl_ms", kFleetTtlMs},
                  {"cacert", certs.ca()},
                  {"user", "fg"},
                  {"password_file", pw}}}};
  };
  Replica a({etcd.url()}, "auth", "a", routes, fleet_of("a", dir.file("pw")));
  Replica b({etcd.url()}, "auth", "b", routes, fleet_of("b", dir.file("pw")));
  REQUIRE_MESSAGE(a.start(), a.log());
  REQUIRE_MESSAGE(b.start(), b.log());
  INFO(a.log());
  INFO(b.log());
  auto r = a.write(1);
  CHECK_MESSAGE(r.code() == 200, describe(r));
  r = b.write(2);
  CHECK_MESSAGE(r.code() == 200, describe(r));
  CHECK(a.write(1).code() == 409);
  CHECK(a.write(2).code() == 200);

  // b acknowledges a's intents straight from its watch (over TLS) when it has nothing in flight:
  // a's advances count there (the first intent may have come before b's watch was up).
  std::int64_t g = 2;
  CHECK(
      eventually([&] { return a.write(++g).code() == 200 && b.metric("fencegate_fleet_fast_acks_total") >= 1; }, 10s));

  Replica wrong({etcd.url()}, "auth", "c", routes, fleet_of("c", dir.file("bad")));
  std::string out;
  CHECK(run_fencegate({"serve", "--config", wrong.config_path()}, &out) == 1);
  CHECK_MESSAGE(out.find("authentication failed") != std::string::npos, out);
  CHECK_MESSAGE(out.find("fleet.user") != std::string::npos, out);
}
