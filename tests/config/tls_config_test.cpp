// TLS settings of the data listener (issue 27): the "tls" block, its flags, allowed_clients and
// client_identity_header, and the errors that name the field.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.h"

using namespace fencegate::config;

namespace {

const char* no_env(const char*) { return nullptr; }

class File {
 public:
  explicit File(const std::string& text, const std::string& ext = ".pem") {
    static std::atomic<int> n{0};
    path_ = "/tmp/fencegate_tls_config_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++) + ext;
    std::ofstream(path_) << text;
  }
  ~File() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string joined(const std::vector<std::string>& errors) {
  std::string s;
  for (const auto& e : errors) s += e + "\n";
  return s;
}

bool has_error_starting(const LoadResult& r, const std::string& start) {
  return std::any_of(r.errors.begin(), r.errors.end(), [&](const std::string& e) { return e.rfind(start, 0) == 0; });
}

}  // namespace

TEST_CASE("tls: off by default; the JSON block and its sni list are read") {
  auto off = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://127.0.0.1:9000"}]})");
  REQUIRE(off.config);
  CHECK_FALSE(off.config->tls.enabled());
  CHECK(off.config->client_identity_header == "Fencing-Client-Identity");

  File cert("cert"), key("key"), ca("ca"), c2("c2"), k2("k2");
  auto r = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://127.0.0.1:9000",
                                     "allowed_clients": ["spiffe://a/x", "spiffe://b/*"]}],
                        "client_identity_header": "X-Client-Id",
                        "tls": {"cert": ")" +
                     cert.path() + R"(", "key": ")" + key.path() + R"(", "client_ca": ")" + ca.path() +
                     R"(", "client_auth": "required", "min_version": "1.3",
                                "sni": [{"names": ["a.example", "*.b.example"], "cert": ")" +
                     c2.path() + R"(", "key": ")" + k2.path() + R"("}]}})");
  INFO(joined(r.errors));
  REQUIRE(r.config);
  const Config& c = *r.config;
  CHECK(c.tls.enabled());
  CHECK(c.tls.cert == cert.path());
  CHECK(c.tls.client_auth == ClientAuth::required);
  CHECK(c.tls.min_version == "1.3");
  CHECK(c.tls.session_resumption);  // the default
  REQUIRE(c.tls.sni.size() == 1);
  CHECK(c.tls.sni[0].names == std::vector<std::string>{"a.example", "*.b.example"});
  CHECK(c.tls.sni[0].key == k2.path());
  CHECK(c.client_identity_header == "X-Client-Id");
  CHECK(c.routes[0].allowed_clients == std::vector<std::string>{"spiffe://a/x", "spiffe://b/*"});
}

TEST_CASE("tls: flags, and errors that name the field and the file") {
  File cert("cert"), key("key");
  auto ok =
      load_serve({"--upstream", "http://127.0.0.1:9000", "--db", "/tmp/fencegate_tls_cfg.db", "--tls-cert", cert.path(),
                  "--tls-key", key.path(), "--tls-min-version", "1.3", "--tls-session-resumption", "false"},
                 no_env);
  INFO(joined(ok.errors));
  REQUIRE(ok.config);
  CHECK(ok.config->tls.min_version == "1.3");
  CHECK_FALSE(ok.config->tls.session_resumption);
  auto off = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://127.0.0.1:9000"}],
                           "tls": {"cert": ")" +
                       cert.path() + R"(", "key": ")" + key.path() + R"(", "session_resumption": false}})");
  INFO(joined(off.errors));
  REQUIRE(off.config);
  CHECK_FALSE(off.config->tls.session_resumption);
  auto flag_word = load_serve({"--upstream", "http://127.0.0.1:9000", "--db", "/tmp/fencegate_tls_cfg.db", "--tls-cert",
                               cert.path(), "--tls-key", key.path(), "--tls-session-resumption", "no"},
                              no_env);
  INFO(joined(flag_word.errors));
  CHECK(has_error_starting(flag_word, "--tls-session-resumption: must be true or false (got \"no\")"));

  auto missing = load_serve({"--upstream", "http://127.0.0.1:9000", "--db", "/tmp/fencegate_tls_cfg.db", "--tls-cert",
                             "/nonexistent/server.crt", "--tls-key", key.path()},
                            no_env);
  INFO(joined(missing.errors));
  CHECK_FALSE(missing.config);
  CHECK(joined(missing.errors).find("/nonexistent/server.crt") != std::string::npos);

  auto only_key = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://127.0.0.1:9000"}],
                               "tls": {"key": ")" +
                            key.path() + R"("}})");
  CHECK(has_error_starting(only_key, "tls.cert: required"));

  auto bad = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://127.0.0.1:9000"}],
                           "tls": {"cert": ")" +
                       cert.path() + R"(", "key": ")" + key.path() +
                       R"(", "client_auth": "sometimes", "min_version": "1.1", "sni": [{"cert": "/x"}],
                             "session_resumption": "no"}})");
  INFO(joined(bad.errors));
  CHECK(has_error_starting(bad, "tls.client_auth: must be one of none, optional, required"));
  CHECK(has_error_starting(bad, "tls.min_version: must be \"1.2\" or \"1.3\""));
  CHECK(has_error_starting(bad, "tls.sni[0].names: must list at least one"));
  CHECK(has_error_starting(bad, "tls.session_resumption: must be true or false (got \"no\")"));

  auto no_ca = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://127.0.0.1:9000"}],
                             "tls": {"cert": ")" +
                         cert.path() + R"(", "key": ")" + key.path() + R"(", "client_auth": "optional"}})");
  CHECK(has_error_starting(no_ca, "tls.client_ca: required"));
}

TEST_CASE("allowed_clients: needs client certificates; patterns are exact or prefix*") {
  auto no_tls = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://127.0.0.1:9000",
                                          "allowed_clients": ["spiffe://a/x"]}]})");
  CHECK(has_error_starting(no_tls, "routes[0].allowed_clients: needs tls"));
  auto bad = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://127.0.0.1:9000",
                                       "allowed_clients": ["*", "a*b", "with space"]}]})");
  INFO(joined(bad.errors));
  CHECK(has_error_starting(bad, "routes[0].allowed_clients[0]: an identity"));
  CHECK(has_error_starting(bad, "routes[0].allowed_clients[1]: an identity"));
  CHECK(has_error_starting(bad, "routes[0].allowed_clients[2]: an identity"));
  auto same = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://127.0.0.1:9000"}],
                            "client_identity_header": "fencing-token"})");
  CHECK(has_error_starting(same, "client_identity_header: must differ"));

  CHECK(client_allowed({"spiffe://a/x"}, "spiffe://a/x"));
  CHECK_FALSE(client_allowed({"spiffe://a/x"}, "spiffe://a/xy"));
  CHECK(client_allowed({"spiffe://a/*"}, "spiffe://a/anything"));
  CHECK_FALSE(client_allowed({"spiffe://a/*"}, "spiffe://b/x"));
  CHECK_FALSE(client_allowed({"spiffe://a/*"}, ""));
}

// Issue 27 for the fleet (docs/fleet.md): https etcd endpoints, the fleet.cacert / cert / key / user /
// password_file keys and flags, and errors that name the field.
TEST_CASE("fleet etcd TLS: https endpoints, the keys and their flags, errors naming fleet.*") {
  File ca("ca"), cert("cert"), key("key"), pw("secret\n", ".pw");
  ::chmod(pw.path().c_str(), 0600);
  const std::string base = R"({"routes": [{"prefix": "/", "upstream": "http://127.0.0.1:9000"}], "fleet": )";
  auto ok = load_json(base + R"({"etcd": ["https://127.0.0.1:2379", "https://10.0.0.2:2379/"], "name": "pay",
    "member": "gw-a", "cacert": ")" +
                      ca.path() + R"(", "cert": ")" + cert.path() + R"(", "key": ")" + key.path() +
                      R"(", "user": "fg", "password_file": ")" + pw.path() + R"("}})");
  REQUIRE_MESSAGE(ok.config, joined(ok.errors));
  const auto& f = ok.config->fleet;
  CHECK(f.etcd == std::vector<std::string>{"https://127.0.0.1:2379", "https://10.0.0.2:2379"});
  CHECK(f.cacert == ca.path());
  CHECK(f.cert == cert.path());
  CHECK(f.key == key.path());
  CHECK(f.user == "fg");
  CHECK(f.password_file == pw.path());

  auto flags = load_serve({"--upstream",
                           "http://127.0.0.1:9000",
                           "--db",
                           "/tmp/fencegate_tls_cfg.db",
                           "--fleet-etcd",
                           "https://127.0.0.1:2379",
                           "--fleet-name",
                           "pay",
                           "--fleet-member",
                           "b",
                           "--fleet-cacert",
                           ca.path(),
                           "--fleet-cert",
                           cert.path(),
                           "--fleet-key",
                           key.path(),
                           "--fleet-user",
                           "fg",
                           "--fleet-password-file",
                           pw.path()},
                          no_env);
  REQUIRE_MESSAGE(flags.config, joined(flags.errors));
  CHECK(flags.config->fleet.cacert == ca.path());
  CHECK(flags.config->fleet.cert == cert.path());
  CHECK(flags.config->fleet.key == key.path());
  CHECK(flags.config->fleet.user == "fg");
  CHECK(flags.config->fleet.password_file == pw.path());
  // A password is never a flag value.
  auto pw_flag = load_serve({"--upstream", "http://127.0.0.1:9000", "--fleet-password", "secret"}, no_env);
  CHECK_FALSE(pw_flag.config);

  // TLS files with http:// endpoints; a key without its certificate; a missing file; user without a password.
  auto http = load_json(base + R"({"etcd": ["http://127.0.0.1:2379"], "name": "p", "member": "a", "cacert": ")" +
                        ca.path() + R"("}})");
  INFO(joined(http.errors));
  CHECK(has_error_starting(http, "fleet.cacert: TLS files need https:// etcd endpoints"));
  auto half = load_json(base + R"({"etcd": ["https://127.0.0.1:2379"], "name": "p", "member": "a", "key": ")" +
                        key.path() + R"("}})");
  INFO(joined(half.errors));
  CHECK(has_error_starting(half, "fleet.cert: required"));
  auto missing = load_json(
      base + R"({"etcd": ["https://127.0.0.1:2379"], "name": "p", "member": "a", "cacert": "/nonexistent/ca.pem"}})");
  CHECK(has_error_starting(missing, "fleet.cacert: "));
  auto no_pw = load_json(base + R"({"etcd": ["https://127.0.0.1:2379"], "name": "p", "member": "a", "user": "fg"}})");
  CHECK(has_error_starting(no_pw, "fleet.password_file: required with user"));
  auto no_user = load_json(base + R"({"etcd": ["https://127.0.0.1:2379"], "name": "p", "member": "a",
    "password_file": ")" + pw.path() +
                           R"("}})");
  CHECK(has_error_starting(no_user, "fleet.user: required with password_file"));
  auto empty = load_json(base + R"({"etcd": ["https://127.0.0.1:2379"], "name": "p", "member": "a", "cert": ""}})");
  CHECK(has_error_starting(empty, "fleet.cert: must not be empty"));
  // Without fleet.etcd the security keys are an error, not silently unused.
  auto alone = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://127.0.0.1:9000"}],
    "fleet": {"cacert": ")" +
                         ca.path() + R"("}})");
  CHECK(has_error_starting(alone, "fleet.etcd: required"));
  auto scheme = load_json(base + R"({"etcd": ["ftp://127.0.0.1:2379"], "name": "p", "member": "a"}})");
  CHECK(has_error_starting(scheme, "fleet.etcd: each endpoint must be http://host:port or https://host:port"));
}
