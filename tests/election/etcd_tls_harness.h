// Issue 27 (tls-ctl): TLS for the election tests. Throwaway certificates made with the openssl
// command line (an ECDSA P-256 CA, a server certificate for IP:127.0.0.1 and localhost, a client
// certificate), a real etcd serving https (optionally --client-cert-auth), and curl for https
// requests to the admin API.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tests/election/etcd_harness.h"

namespace fencegate::testing {

// Runs `sh -c cmd`, its stdout into *out (stderr too with `merge`). Returns the exit status.
inline int run_shell(const std::string& cmd, std::string* out = nullptr, bool merge = true) {
  std::FILE* p = ::popen(("(" + cmd + ")" + (merge ? " 2>&1" : " 2>/dev/null")).c_str(), "r");
  if (!p) return -1;
  std::string text;
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, p)) text.append(buf, n);
  int st = ::pclose(p);
  if (out) *out = text;
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// A CA and certificates it signed, in `dir`: ca.pem, server.{pem,key}, client.{pem,key}.
struct TestCerts {
  std::string dir;
  std::string ca() const { return dir + "/ca.pem"; }
  std::string server_cert() const { return dir + "/server.pem"; }
  std::string server_key() const { return dir + "/server.key"; }
  std::string client_cert() const { return dir + "/client.pem"; }
  std::string client_key() const { return dir + "/client.key"; }

  // Returns "" or openssl's output.
  std::string make() {
    const std::string d = "'" + dir + "'";
    const std::string newkey = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes";
    std::string out;
    std::string cmd =
        "set -e; cd " + d + "; " + "openssl req -x509 " + newkey +
        " -keyout ca.key -out ca.pem -days 2 -subj /CN=fencegate-test-ca; " +
        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nextendedKeyUsage=serverAuth,clientAuth\\n' > server.ext; "
        "openssl req " +
        newkey + " -keyout server.key -out server.csr -subj /CN=127.0.0.1; " +
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 "
        "-extfile server.ext; "
        "printf 'subjectAltName=DNS:fencegate-client\\nextendedKeyUsage=clientAuth\\n' > client.ext; "
        "openssl req " +
        newkey + " -keyout client.key -out client.csr -subj /CN=fencegate-client; " +
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2 "
        "-extfile client.ext; chmod 600 *.key";
    if (run_shell(cmd, &out) != 0) return out;
    return {};
  }
};

// A real single-member etcd serving https://127.0.0.1:port with the certificates of `certs`.
class TlsEtcd {
 public:
  TlsEtcd(const TestCerts& certs, bool client_cert_auth, std::vector<std::string> extra = {})
      : certs_(certs),
        client_cert_auth_(client_cert_auth),
        extra_(std::move(extra)),
        dir_(std::make_unique<TempDir>("fencegate-etcd-tls")),
        client_port_(free_port()),
        peer_port_(free_port()) {
    while (peer_port_ == client_port_) peer_port_ = free_port();
  }
  ~TlsEtcd() {
    if (process_) process_->stop(3s);
  }
  std::string url() const { return "https://127.0.0.1:" + std::to_string(client_port_); }
  std::string log() const { return read_file(dir_->file("etcd.log"), 8 * 1024); }

  bool start(std::chrono::milliseconds timeout = 20s) {
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    std::vector<std::string> argv{kEtcdBinary,
                                  "--name",
                                  "fg",
                                  "--data-dir",
                                  dir_->file("data"),
                                  "--listen-client-urls",
                                  url(),
                                  "--advertise-client-urls",
                                  url(),
                                  "--listen-peer-urls",
                                  peer,
                                  "--initial-advertise-peer-urls",
                                  peer,
                                  "--initial-cluster",
                                  "fg=" + peer,
                                  "--initial-cluster-state",
                                  "new",
                                  "--cert-file",
                                  certs_.server_cert(),
                                  "--key-file",
                                  certs_.server_key(),
                                  "--logger",
                                  "zap",
                                  "--log-level",
                                  "warn"};
    // etcd asks for client certificates once it has a trusted CA: only with client_cert_auth.
    if (client_cert_auth_) argv.insert(argv.end(), {"--trusted-ca-file", certs_.ca(), "--client-cert-auth"});
    argv.insert(argv.end(), extra_.begin(), extra_.end());
    ProcessOptions o;
    o.log_path = dir_->file("etcd.log");
    process_ = std::make_unique<Process>(Process::start(argv, o));
    if (!process_->wait_for_port(client_port_, timeout)) return false;
    election::ClientOptions co;
    co.endpoints = {url()};
    co.request_timeout = 1000ms;
    co.security.cacert = certs_.ca();
    co.security.cert = certs_.client_cert();
    co.security.key = certs_.client_key();
    election::Client c(co);
    return eventually(
        [&] {
          std::vector<election::KeyValue> kvs;
          return c.range("fencegate-test-probe", "", &kvs).ok();
        },
        timeout);
  }

  // etcdctl (v3) against this etcd with the client certificate; "" or its output on failure.
  std::string etcdctl(const std::string& args, const std::string& user = "") const {
    std::string out;
    std::string cmd = "ETCDCTL_API=3 etcdctl --endpoints " + url() + " --cacert '" + certs_.ca() + "' --cert '" +
                      certs_.client_cert() + "' --key '" + certs_.client_key() + "'" +
                      (user.empty() ? "" : " --user '" + user + "'") + " " + args;
    return run_shell(cmd, &out) == 0 ? std::string() : cmd + ": " + out;
  }

 private:
  TestCerts certs_;
  bool client_cert_auth_;
  std::vector<std::string> extra_;
  std::unique_ptr<TempDir> dir_;
  std::uint16_t client_port_, peer_port_;
  std::unique_ptr<Process> process_;
};

// curl to an https URL: "<http code>" on success, else "curl exit N: <stderr>".
inline std::string curl_https(const std::string& url, const std::vector<std::string>& args,
                              const std::string& method = "GET") {
  std::string cmd = "curl -sS --max-time 10 -o /dev/null -w '%{http_code}' -X " + method;
  for (const auto& a : args) cmd += " '" + a + "'";
  cmd += " '" + url + "'";
  std::string out;
  int rc = run_shell(cmd, &out);
  return rc == 0 ? out : "curl exit " + std::to_string(rc) + ": " + out;
}

}  // namespace fencegate::testing
