// Config loading: what an operator sees from `fencegate serve` flags, FENCEGATE_* env and JSON files.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "config/config.h"

using namespace fencegate::config;

namespace {

// Injected environment: tests set g_env and pass fake_env to load_serve.
std::map<std::string, std::string> g_env;
const char* fake_env(const char* name) {
  auto it = g_env.find(name);
  return it == g_env.end() ? nullptr : it->second.c_str();
}
const char* empty_env(const char*) { return nullptr; }

// A JSON file under /tmp with a unique name, removed at scope exit.
class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    static std::atomic<int> n{0};
    path_ = "/tmp/fencegate_config_test_" + std::to_string(::getpid()) + "_" + std::to_string(n++) + ".json";
    std::ofstream(path_) << text;
    ::chmod(path_.c_str(), 0600);  // a token file must be its owner's only
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string joined(const std::vector<std::string>& errors) {
  std::string s;
  for (const auto& e : errors) s += e + "\n";
  return s;
}

bool has_error(const LoadResult& r, const std::string& exact) {
  return std::find(r.errors.begin(), r.errors.end(), exact) != r.errors.end();
}

bool has_error_starting(const LoadResult& r, const std::string& start) {
  return std::any_of(r.errors.begin(), r.errors.end(),
                     [&](const std::string& e) { return e.rfind(start, 0) == 0; });
}

const char* kMinimal = R"({"routes": [{"prefix": "/", "upstream": "http://127.0.0.1:9000"}]})";

}  // namespace

TEST_CASE("mode strings round-trip and unknown ones are refused") {
  CHECK(to_string(Mode::enforce) == "enforce");
  CHECK(to_string(Mode::observe) == "observe");
  CHECK(to_string(Mode::off) == "off");
  CHECK(parse_mode("observe") == Mode::observe);
  CHECK_FALSE(parse_mode("Enforce").has_value());
  CHECK_FALSE(parse_mode("").has_value());
}

TEST_CASE("Endpoint prints host:port, IPv6 in brackets") {
  CHECK(Endpoint{"127.0.0.1", 8080}.to_string() == "127.0.0.1:8080");
  CHECK(Endpoint{"::1", 9000}.to_string() == "[::1]:9000");
}

TEST_CASE("is_fenced: write methods by default, everything with fence_reads") {
  Route r;
  CHECK(r.is_fenced("POST"));
  CHECK(r.is_fenced("DELETE"));
  CHECK_FALSE(r.is_fenced("GET"));
  // Any case: an upstream that compares methods without case would apply "post" as a write.
  CHECK(r.is_fenced("post"));
  CHECK(r.is_fenced("Delete"));
  CHECK_FALSE(r.is_fenced("get"));
  r.write_methods = {"PUT"};
  CHECK_FALSE(r.is_fenced("POST"));
  r.fence_reads = true;
  CHECK(r.is_fenced("GET"));
}

TEST_CASE("minimal JSON gets the documented defaults") {
  auto r = load_json(kMinimal);
  REQUIRE_MESSAGE(r.config, joined(r.errors));
  const Config& c = *r.config;
  CHECK(c.listen.host == "127.0.0.1");
  CHECK(c.listen.port == 8080);
  CHECK(c.db == "./fence.db");
  CHECK(c.threads >= 1);
  CHECK(c.token_header == "Fencing-Token");
  CHECK(c.leader_header == "Fencing-Leader");
  CHECK(c.max_header_bytes == 16 * 1024);
  CHECK(c.max_body_bytes == (1ull << 30));
  CHECK(c.header_timeout.count() == 10000);
  CHECK(c.log_level == "info");
  CHECK(c.io_uring);  // auto
  REQUIRE(c.routes.size() == 1);
  const Route& route = c.routes[0];
  CHECK(route.resource == "default");
  CHECK(route.mode == Mode::enforce);
  CHECK(route.write_methods == std::vector<std::string>{"POST", "PUT", "PATCH", "DELETE"});
  CHECK_FALSE(route.fence_reads);
  CHECK(route.upstream_addr.host == "127.0.0.1");
  CHECK(route.upstream_addr.port == 9000);
}

TEST_CASE("every JSON key is read") {
  auto r = load_json(R"({
    "listen": "0.0.0.0:9090", "db": "/var/f.db", "threads": 3,
    "token_header": "X-Token", "leader_header": "X-Leader", "max_leader_bytes": 100,
    "max_header_bytes": 2048, "max_body_bytes": 5, "max_connections": 7, "max_resources": 11,
    "header_timeout_ms": 1, "idle_timeout_ms": 2, "body_timeout_ms": 3,
    "upstream_connect_timeout_ms": 4, "upstream_timeout_ms": 5, "drain_timeout_ms": 6,
    "upstream_idle_per_thread": 8, "log_level": "debug", "io_uring": "off",
    "routes": [{"prefix": "/t/{tenant}/", "upstream": "http://backend/", "resource": "tenant-{tenant}",
                "mode": "observe", "write_methods": ["POST", "PURGE"], "fence_reads": true}]
  })");
  REQUIRE_MESSAGE(r.config, joined(r.errors));
  const Config& c = *r.config;
  CHECK(c.listen.to_string() == "0.0.0.0:9090");
  CHECK(c.db == "/var/f.db");
  CHECK(c.threads == 3);
  CHECK(c.token_header == "X-Token");
  CHECK(c.leader_header == "X-Leader");
  CHECK(c.max_leader_bytes == 100);
  CHECK(c.max_header_bytes == 2048);
  CHECK(c.max_body_bytes == 5);
  CHECK(c.max_connections == 7);
  CHECK(c.max_resources == 11);
  CHECK(c.header_timeout.count() == 1);
  CHECK(c.idle_timeout.count() == 2);
  CHECK(c.body_timeout.count() == 3);
  CHECK(c.upstream_connect_timeout.count() == 4);
  CHECK(c.upstream_timeout.count() == 5);
  CHECK(c.drain_timeout.count() == 6);
  CHECK(c.upstream_idle_per_thread == 8);
  CHECK(c.log_level == "debug");
  CHECK_FALSE(c.io_uring);
  const Route& route = c.routes.at(0);
  CHECK(route.prefix == "/t/{tenant}/");
  CHECK(route.upstream == "http://backend/");
  CHECK(route.upstream_addr.host == "backend");
  CHECK(route.upstream_addr.port == 80);
  CHECK(route.resource == "tenant-{tenant}");
  CHECK(route.mode == Mode::observe);
  CHECK(route.write_methods == std::vector<std::string>{"POST", "PURGE"});
  CHECK(route.fence_reads);
}

TEST_CASE("threads 0 means hardware threads") {
  auto r = load_json(R"({"threads": 0, "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  REQUIRE_MESSAGE(r.config, joined(r.errors));
  CHECK(r.config->threads == static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

TEST_CASE("unknown keys are errors at top level and inside routes") {
  auto r = load_json(R"({"listn": "1.2.3.4:5", "routes": [
      {"prefix": "/", "upstream": "http://h:1"},
      {"prefix": "/a/", "upstream": "http://h:1", "frobnicate": 1}]})");
  CHECK_FALSE(r.config);
  CHECK(has_error(r, "listn: unknown key"));
  CHECK(has_error(r, "routes[1].frobnicate: unknown key"));
}

TEST_CASE("all errors are collected, each naming its field") {
  auto r = load_json(R"({
    "threads": -3, "listen": "nonsense", "db": "", "max_header_bytes": 10, "max_body_bytes": 0,
    "max_connections": 2000000, "header_timeout_ms": 0, "drain_timeout_ms": 86400001,
    "max_leader_bytes": 5000, "log_level": "verbose", "token_header": "Bad Header", "io_uring": "on",
    "routes": [
      {"prefix": "/", "upstream": "http://h:1"},
      {"prefix": "/b/", "upstream": "http://h:1", "mode": "enforse"}
    ]})");
  CHECK_FALSE(r.config);
  INFO(joined(r.errors));
  CHECK(has_error(r, "threads: must be 0 (one per hardware thread) or an integer between 1 and 256 (got -3)"));
  CHECK(has_error(r, "listen: expected \"host:port\" (got \"nonsense\")"));
  CHECK(has_error(r, "db: must not be empty"));
  CHECK(has_error(r, "max_header_bytes: must be an integer between 1024 and 1048576 (got 10)"));
  CHECK(has_error_starting(r, "max_body_bytes: must be an integer between 1 and "));
  CHECK(has_error(r, "max_connections: must be an integer between 1 and 1000000 (got 2000000)"));
  CHECK(has_error(r, "header_timeout_ms: must be an integer between 1 and 86400000 (got 0)"));
  CHECK(has_error(r, "drain_timeout_ms: must be an integer between 1 and 86400000 (got 86400001)"));
  CHECK(has_error(r, "max_leader_bytes: must be an integer between 1 and 4096 (got 5000)"));
  CHECK(has_error(r, "log_level: must be one of debug, info, warn, error (got \"verbose\")"));
  CHECK(has_error(r, "token_header: must be a valid HTTP header name (got \"Bad Header\")"));
  CHECK(has_error(r, "routes[1].mode: must be one of enforce, observe, off (got \"enforse\")"));
  CHECK(has_error(r, "io_uring: must be auto or off (got \"on\")"));
  CHECK(r.errors.size() == 13);
}

TEST_CASE("wrong JSON types name the field") {
  auto r = load_json(R"({"threads": "4", "listen": 8080, "max_body_bytes": 1.5, "routes": [
      {"prefix": 1, "upstream": "http://h:1", "fence_reads": "yes", "write_methods": "POST"},
      "not an object"]})");
  CHECK_FALSE(r.config);
  INFO(joined(r.errors));
  CHECK(has_error(r, "threads: must be 0 (one per hardware thread) or an integer between 1 and 256 (got \"4\")"));
  CHECK(has_error(r, "listen: must be a string (got 8080)"));
  CHECK(has_error(r, "max_body_bytes: must be an integer between 1 and 9223372036854775807 (got 1.5)"));
  CHECK(has_error(r, "routes[0].prefix: must be a string (got 1)"));
  CHECK(has_error(r, "routes[0].fence_reads: must be true or false (got \"yes\")"));
  CHECK(has_error(r, "routes[0].write_methods: must be an array of method names (got \"POST\")"));
  CHECK(has_error(r, "routes[1]: must be an object (got \"not an object\")"));

  auto r2 = load_json(R"({"routes": {"prefix": "/"}})");
  CHECK(has_error(r2, "routes: must be an array of route objects (got {\"prefix\":\"/\"})"));
}

TEST_CASE("invalid JSON names the source and position") {
  auto r = load_json("{\n  \"threads\": 4,\n  oops\n}", "fg.json");
  CHECK_FALSE(r.config);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].rfind("fg.json: invalid JSON (byte ", 0) == 0);
  CHECK(r.errors[0].find("line 3") != std::string::npos);

  auto arr = load_json("[1, 2]", "fg.json");
  REQUIRE(arr.errors.size() == 1);
  CHECK(arr.errors[0] == "fg.json: must be a JSON object (got array)");
}

TEST_CASE("a config nested absurdly deep is refused with its field named, without costing gigabytes") {
  // Memory used to grow with the square of the depth: 200 KB of brackets took gigabytes.
  const std::size_t depth = 100000;
  std::string text = "{\"threads\": 1, \"zz\": " + std::string(depth, '[') + std::string(depth, ']') + "}";
  auto r = load_json(text, "fg.json");
  CHECK_FALSE(r.config);
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0] == "fg.json: zz: nested more than 32 levels deep (no setting nests more than a few)");
  // A real config's depth (routes -> route -> write_methods) is far below the limit.
  auto ok = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://h:1", "write_methods": ["POST"]}]})");
  CHECK(ok.config);
}

TEST_CASE("duplicate JSON keys are errors, not silently last-wins") {
  auto r = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://h:1"},
      {"prefix": "/a/", "upstream": "http://h:1", "mode": "enforce", "mode": "off"}], "db": "a", "db": "b"})");
  CHECK_FALSE(r.config);
  INFO(joined(r.errors));
  CHECK(has_error(r, "routes[1].mode: duplicate key"));
  CHECK(has_error(r, "db: duplicate key"));
}

// A stray newline (from a secret, a heredoc, `echo` into an env file) or space would open a
// different, empty store, and every stored generation would be silently gone.
TEST_CASE("a db path with a newline, a control character or a space at either end is refused") {
  auto nl = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://h:1"}], "db": "/var/lib/fence.db\n"})");
  INFO(joined(nl.errors));
  CHECK_FALSE(nl.config);
  CHECK(has_error(nl, "db: must not contain control characters such as a newline (got \"/var/lib/fence.db\\n\")"));
  auto sp = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://h:1"}], "db": "/var/lib/fence.db "})");
  CHECK_FALSE(sp.config);
  CHECK(has_error(sp, "db: must not start or end with a space (got \"/var/lib/fence.db \")"));
  auto ok = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://h:1"}], "db": "/var/lib/my fence.db"})");
  CHECK(ok.config);
}

TEST_CASE("a NUL character in a config string is an error naming the field") {
  auto r = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://h:1"}], "db": "/var/lib/a\u0000b.db",
      "admin": {"token_file": "/run/t\u0000"}})");
  CHECK_FALSE(r.config);
  INFO(joined(r.errors));
  CHECK(has_error(r, "db: must not contain a NUL character (\\u0000)"));
  CHECK(has_error(r, "admin.token_file: must not contain a NUL character (\\u0000)"));
}

TEST_CASE("route validation") {
  auto errs = [](const std::string& route) {
    return load_json(R"({"routes": [{"prefix": "/", "upstream": "http://h:1"}, )" + route + "]}");
  };
  CHECK(has_error(errs(R"({"upstream": "http://h:1"})"), "routes[1].prefix: required"));
  CHECK(has_error(errs(R"({"prefix": "/x/"})"), "routes[1].upstream: required"));
  CHECK(has_error(errs(R"({"prefix": "x/", "upstream": "http://h:1"})"),
                  "routes[1].prefix: must start with \"/\" (got \"x/\")"));
  CHECK(has_error(errs(R"({"prefix": "/", "upstream": "http://h:2"})"),
                  "routes[1].prefix: same as routes[0].prefix (\"/\")"));
  CHECK(has_error_starting(errs(R"({"prefix": "/x/", "upstream": "ftp://h:1"})"), "routes[1].upstream: expected"));
  CHECK(has_error_starting(errs(R"({"prefix": "/x/", "upstream": "h:1"})"), "routes[1].upstream: expected"));
  CHECK(has_error(errs(R"({"prefix": "/x/", "upstream": "http://u:p@h:1"})"),
                  "routes[1].upstream: userinfo (\"user@\") is not allowed"));
  CHECK(has_error_starting(errs(R"({"prefix": "/x/", "upstream": "http://h:1/api"})"),
                           "routes[1].upstream: a path is not supported"));
  CHECK(has_error_starting(errs(R"({"prefix": "/x/", "upstream": "http://h:1/?a=b"})"),
                           "routes[1].upstream: a query or fragment is not allowed"));
  CHECK(has_error_starting(errs(R"({"prefix": "/x/", "upstream": "http://h:0"})"),
                           "routes[1].upstream: port must be between 1 and 65535"));
  CHECK(has_error(errs(R"({"prefix": "/x/", "upstream": "http://h:1", "write_methods": []})"),
                  "routes[1].write_methods: must list at least one method"));
  CHECK(has_error(errs(R"({"prefix": "/x/", "upstream": "http://h:1", "write_methods": ["POST", "put"]})"),
                  "routes[1].write_methods[1]: must be an upper-case HTTP method such as \"POST\" (got \"put\")"));
  CHECK(has_error(errs(R"({"prefix": "/x/", "upstream": "http://h:1", "resource": "t-{tenant}"})"),
                  "routes[1].resource: uses {tenant}, which the prefix does not capture"));
  CHECK(has_error(errs(R"({"prefix": "/x/", "upstream": "http://h:1", "resource": ""})"),
                  "routes[1].resource: must not be empty"));
  // Same shape with differently named captures is the same prefix.
  auto dup = load_json(R"({"routes": [{"prefix": "/t/{a}/", "upstream": "http://h:1"},
                                      {"prefix": "/t/{b}/", "upstream": "http://h:1"}]})");
  CHECK(has_error(dup, "routes[1].prefix: same as routes[0].prefix (\"/t/{a}/\")"));

  auto none = load_json(R"({"routes": []})");
  CHECK(has_error(none, "routes: at least one route is required"));
  auto ok = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://[::1]:9000/"}]})");
  REQUIRE_MESSAGE(ok.config, joined(ok.errors));
  CHECK(ok.config->routes[0].upstream_addr.host == "::1");
  CHECK(ok.config->routes[0].upstream_addr.port == 9000);
}

TEST_CASE("routes that can name one resource must agree on its mode and authority") {
  auto two = [](const std::string& a, const std::string& b) {
    return load_json(R"({"routes": [)" + a + ", " + b + "]}");
  };
  // Both default to resource "default": the observe route would forward what enforce refuses.
  auto r = two(R"({"prefix": "/a/", "upstream": "http://h:1"})", R"({"prefix": "/b/", "upstream": "http://h:1", "mode": "observe"})");
  CHECK(has_error_starting(r, "routes[1].mode: observe, but its resource \"default\" can be the resource \"default\" "
                              "of routes[0] (\"/a/\"), which is enforced"));
  // A template that can produce the other's name.
  r = two(R"({"prefix": "/t/{t}/", "upstream": "http://h:1", "mode": "observe", "resource": "tenant-{t}"})",
          R"({"prefix": "/acme/", "upstream": "http://h:1", "resource": "tenant-acme"})");
  CHECK(has_error_starting(r, "routes[1].mode: enforce, but its resource \"tenant-acme\" can be the resource "
                              "\"tenant-{t}\" of routes[0] (\"/t/{t}/\"), which is observed"));
  r = two(R"({"prefix": "/t/{t}/", "upstream": "http://h:1", "mode": "observe", "resource": "{t}-x"})",
          R"({"prefix": "/u/{u}/", "upstream": "http://h:1", "resource": "a-{u}"})");
  CHECK(has_error_starting(r, "routes[1].mode: enforce"));
  // A plain route that can name an election's resource: a forged token through it would lock
  // the election's leaders out.
  const std::string billing = R"("authority": {"etcd": ["http://127.0.0.1:2379"], "election": "billing"})";
  r = two(R"({"prefix": "/t/{t}/", "upstream": "http://h:1", "resource": "t-{t}", )" + billing + "}",
          R"({"prefix": "/x/{name}/", "upstream": "http://h:1", "resource": "{name}"})");
  CHECK(has_error_starting(r, "routes[1].authority: no election, but its resource \"{name}\" can be the resource "
                              "\"t-{t}\" of routes[0] (\"/t/{t}/\"), fenced under election \"billing\""));
  r = two(R"({"prefix": "/t/{name}/", "upstream": "http://h:1", "resource": "{name}", )" + billing + "}",
          R"({"prefix": "/ledger/", "upstream": "http://h:1", "resource": "ledger", "authority": {"etcd": ["http://127.0.0.1:2379"], "election": "payroll"}})");
  CHECK(has_error_starting(r, "routes[1].authority: election \"payroll\" at http://127.0.0.1:2379, but"));
  // One tenant ahead of the others, but through a longer prefix: /tenants/acme/other still goes
  // to the template route and is named tenant-acme there.
  r = two(R"({"prefix": "/tenants/{tenant}/", "upstream": "http://h:1", "mode": "observe", "resource": "tenant-{tenant}"})",
          R"({"prefix": "/tenants/acme/orders/", "upstream": "http://h:1", "resource": "tenant-acme"})");
  CHECK(has_error_starting(r, "routes[1].mode: enforce"));
  // A template route that does not use all its captures names one resource from many paths.
  r = two(R"({"prefix": "/t/{a}/{b}/", "upstream": "http://h:1", "mode": "observe", "resource": "t-{a}"})",
          R"({"prefix": "/t/x/y/", "upstream": "http://h:1", "resource": "t-x"})");
  CHECK(has_error_starting(r, "routes[1].mode: enforce"));
  // Disjoint names, an off route, or the same mode and authority: fine.
  for (const auto& [a, b] : std::vector<std::pair<std::string, std::string>>{
           {R"({"prefix": "/a/", "upstream": "http://h:1", "resource": "ledger"})",
            R"({"prefix": "/b/", "upstream": "http://h:1", "mode": "observe"})"},
           {R"({"prefix": "/t/{t}/", "upstream": "http://h:1", "resource": "t-{t}"})",
            R"({"prefix": "/u/{u}/", "upstream": "http://h:1", "mode": "observe", "resource": "u-{u}"})"},
           {R"({"prefix": "/t/{t}/", "upstream": "http://h:1", "resource": "t-{t}"})",
            R"({"prefix": "/b/", "upstream": "http://h:1", "mode": "observe", "resource": "t-a:b"})"},
           {R"({"prefix": "/a/", "upstream": "http://h:1"})", R"({"prefix": "/b/", "upstream": "http://h:1", "mode": "off"})"},
           {R"({"prefix": "/a/", "upstream": "http://h:1", "mode": "observe"})",
            R"({"prefix": "/b/", "upstream": "http://h:1", "mode": "observe"})"},
           // One tenant migrated to enforce ahead of the others: every /tenants/acme path goes to
           // the literal route, so the template route never names tenant-acme.
           {R"({"prefix": "/tenants/{tenant}/", "upstream": "http://h:1", "mode": "observe", "resource": "tenant-{tenant}"})",
            R"({"prefix": "/tenants/acme/", "upstream": "http://h:1", "resource": "tenant-acme"})"},
           {R"({"prefix": "/tenants/acme/", "upstream": "http://h:1", "resource": "tenant-acme", )" + billing + "}",
            R"({"prefix": "/tenants/{tenant}/", "upstream": "http://h:1", "resource": "tenant-{tenant}"})"},
           // The same election: endpoint order and grace_ms do not make another authority.
           {R"({"prefix": "/t/{t}/", "upstream": "http://h:1", "resource": "t-{t}", "authority": {"etcd": ["http://a:1", "http://b:1"], "election": "e", "grace_ms": 500}})",
            R"({"prefix": "/v2/t/{t}/", "upstream": "http://h:1", "resource": "t-{t}", "authority": {"etcd": ["http://b:1", "http://a:1"], "election": "e"}})"},
           {R"({"prefix": "/t/{t}/", "upstream": "http://h:1", "resource": "t-{t}", )" + billing + "}",
            R"({"prefix": "/v2/t/{t}/", "upstream": "http://h:1", "resource": "t-{t}", )" + billing + "}"},
           {R"({"prefix": "/t/{t}/", "upstream": "http://h:1", "resource": "t-{t}", )" + billing + "}",
            R"({"prefix": "/", "upstream": "http://h:1", "resource": "other"})"}}) {
    auto ok = two(a, b);
    CHECK_MESSAGE(ok.config, a, " + ", b, ": ", joined(ok.errors));
  }
}

TEST_CASE("admin.listen may not be the data listener's address") {
  auto r = load_json(R"({"listen": "127.0.0.1:8080", "admin": {"listen": "127.0.0.1:8080"},
                         "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  CHECK(has_error(r, "admin.listen: must differ from listen (both are \"127.0.0.1:8080\")"));
  r = load_json(R"({"listen": "0.0.0.0:8080", "admin": {"listen": "127.0.0.1:8080"},
                    "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  CHECK(has_error_starting(r, "admin.listen: must differ from listen"));  // the wildcard takes the port
  auto ok = load_json(R"({"listen": "127.0.0.1:0", "admin": {"listen": "127.0.0.1:0"},
                          "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  CHECK_MESSAGE(ok.config, joined(ok.errors));  // two free ports, picked apart
}

TEST_CASE("token and leader headers must differ case-insensitively") {
  auto r = load_json(R"({"token_header": "X-Fence", "leader_header": "x-fence",
                         "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  CHECK(has_error(r, "leader_header: must differ from token_header (both are \"x-fence\")"));
}

TEST_CASE("token and leader headers cannot be fields the proxy frames, routes or rewrites") {
  for (const char* name : {"Host", "content-length", "Transfer_Encoding", "Connection", "TE", "Expect",
                           "X-Forwarded-For", "Forwarded", "Upgrade"}) {
    CAPTURE(name);
    auto r = load_json(std::string(R"({"token_header": ")") + name + R"(", "leader_header": "X-L",
                         "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
    CHECK(has_error(r, std::string("token_header: must not be \"") + name +
                           "\", a field the proxy itself frames, routes or rewrites"));
    auto l = load_json(std::string(R"({"leader_header": ")") + name + R"(",
                         "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
    CHECK(has_error(l, std::string("leader_header: must not be \"") + name +
                           "\", a field the proxy itself frames, routes or rewrites"));
  }
}

TEST_CASE("validate() catches bad values in a Config built in code") {
  Config c;
  c.routes.push_back(Route{});
  c.routes[0].prefix = "/";
  c.routes[0].upstream = "http://h:1";
  c.threads = 999;
  c.max_header_bytes = 10;
  std::vector<std::string> errors;
  validate(c, errors);
  INFO(joined(errors));
  CHECK(errors == std::vector<std::string>{
                      "threads: must be 0 (one per hardware thread) or an integer between 1 and 256 (got 999)",
                      "max_header_bytes: must be an integer between 1024 and 1048576 (got 10)"});
  CHECK(c.routes[0].upstream_addr.port == 1);
}

// --- load_serve: flags, env, file ---

TEST_CASE("--help and -h ask for usage") {
  CHECK(load_serve({"--help"}, empty_env).help);
  CHECK(load_serve({"--listen", "x:1", "-h"}, empty_env).help);
  CHECK_FALSE(load_serve({"--help"}, empty_env).config);
}

TEST_CASE("flag-only form builds one catch-all route") {
  auto r = load_serve({"--upstream", "http://127.0.0.1:9000", "--resource=orders", "--mode", "observe",
                       "--listen=0.0.0.0:7000", "--threads", "2", "--db", "/tmp/x.db"},
                      empty_env);
  REQUIRE_MESSAGE(r.config, joined(r.errors));
  const Config& c = *r.config;
  CHECK(c.config_file.empty());
  CHECK(c.listen.to_string() == "0.0.0.0:7000");
  CHECK(c.threads == 2);
  CHECK(c.db == "/tmp/x.db");
  REQUIRE(c.routes.size() == 1);
  CHECK(c.routes[0].prefix == "/");
  CHECK(c.routes[0].upstream_addr.port == 9000);
  CHECK(c.routes[0].resource == "orders");
  CHECK(c.routes[0].mode == Mode::observe);

  auto d = load_serve({"--upstream", "http://h"}, empty_env);
  REQUIRE_MESSAGE(d.config, joined(d.errors));
  CHECK(d.config->routes[0].resource == "default");
  CHECK(d.config->routes[0].mode == Mode::enforce);
  CHECK(d.config->routes[0].upstream_addr.port == 80);
}

TEST_CASE("every numeric and string flag is applied, in both spellings") {
  auto r = load_serve({"--upstream=http://h:1", "--max-connections", "5", "--max-header-bytes=4096",
                       "--max-body-bytes", "9", "--header-timeout-ms", "11", "--idle-timeout-ms=12",
                       "--upstream-timeout-ms", "13", "--upstream-connect-timeout-ms", "14",
                       "--drain-timeout-ms", "15", "--body-timeout-ms", "16", "--max-resources", "17",
                       "--max-leader-bytes", "18", "--upstream-idle-per-thread", "0",
                       "--token-header", "T", "--leader-header=L", "--log-level", "warn"},
                      empty_env);
  REQUIRE_MESSAGE(r.config, joined(r.errors));
  const Config& c = *r.config;
  CHECK(c.max_connections == 5);
  CHECK(c.max_header_bytes == 4096);
  CHECK(c.max_body_bytes == 9);
  CHECK(c.header_timeout.count() == 11);
  CHECK(c.idle_timeout.count() == 12);
  CHECK(c.upstream_timeout.count() == 13);
  CHECK(c.upstream_connect_timeout.count() == 14);
  CHECK(c.drain_timeout.count() == 15);
  CHECK(c.body_timeout.count() == 16);
  CHECK(c.max_resources == 17);
  CHECK(c.max_leader_bytes == 18);
  CHECK(c.upstream_idle_per_thread == 0);
  CHECK(c.token_header == "T");
  CHECK(c.leader_header == "L");
  CHECK(c.log_level == "warn");
}

TEST_CASE("flag errors name the flag") {
  auto r = load_serve({"--upstream", "http://h:1", "--threads", "many", "--max-body-bytes", "0",
                       "--listen", "nocolon", "--bogus", "1", "--mode", "strict", "stray", "--db"},
                      empty_env);
  CHECK_FALSE(r.config);
  INFO(joined(r.errors));
  CHECK(has_error(r, "--threads: must be 0 (one per hardware thread) or an integer between 1 and 256 (got \"many\")"));
  CHECK(has_error_starting(r, "--max-body-bytes: must be an integer between 1 and "));
  CHECK(has_error(r, "--listen: expected \"host:port\" (got \"nocolon\")"));
  CHECK(has_error(r, "--bogus: unknown flag (see --help)"));
  CHECK(has_error(r, "--mode: must be one of enforce, observe, off (got \"strict\")"));
  CHECK(has_error_starting(r, "unexpected argument \"1\""));
  CHECK(has_error_starting(r, "unexpected argument \"stray\""));
  CHECK(has_error(r, "--db: missing value"));

  auto u = load_serve({"--upstream", "ftp://h"}, empty_env);
  CHECK(has_error_starting(u, "--upstream: expected"));
  auto res = load_serve({"--upstream", "http://h", "--resource", "a b"}, empty_env);
  CHECK(has_error_starting(res, "--resource: character ' ' not allowed"));
  auto missing = load_serve({"--listen", "--db", "x"}, empty_env);
  CHECK(has_error(missing, "--listen: missing value"));
  CHECK(has_error(load_serve({"--config="}, empty_env), "--config: missing value"));
}

TEST_CASE("no upstream and no config") {
  auto r = load_serve({}, empty_env);
  CHECK_FALSE(r.config);
  CHECK(r.errors == std::vector<std::string>{"no upstream: give --upstream URL or --config FILE"});
}

TEST_CASE("environment variables apply and their errors name the variable") {
  g_env = {{"FENCEGATE_UPSTREAM", "http://envhost:81"}, {"FENCEGATE_LISTEN", "1.2.3.4:5"},
           {"FENCEGATE_DB", "/env.db"}, {"FENCEGATE_THREADS", "6"}, {"FENCEGATE_MODE", "off"},
           {"FENCEGATE_RESOURCE", "envres"}, {"FENCEGATE_LOG_LEVEL", "error"}, {"FENCEGATE_IO_URING", "off"}};
  auto r = load_serve({}, fake_env);
  REQUIRE_MESSAGE(r.config, joined(r.errors));
  CHECK_FALSE(r.config->io_uring);
  CHECK(r.config->listen.to_string() == "1.2.3.4:5");
  CHECK(r.config->db == "/env.db");
  CHECK(r.config->threads == 6);
  CHECK(r.config->log_level == "error");
  CHECK(r.config->routes[0].upstream_addr.host == "envhost");
  CHECK(r.config->routes[0].mode == Mode::off);
  CHECK(r.config->routes[0].resource == "envres");

  g_env = {{"FENCEGATE_UPSTREAM", "ftp://x"}, {"FENCEGATE_THREADS", "-1"}, {"FENCEGATE_MODE", "x"},
           {"FENCEGATE_LOG_LEVEL", "loud"}};
  auto bad = load_serve({}, fake_env);
  INFO(joined(bad.errors));
  CHECK(has_error(bad, "FENCEGATE_THREADS: must be 0 (one per hardware thread) or an integer between 1 and 256 (got -1)"));
  CHECK(has_error(bad, "FENCEGATE_MODE: must be one of enforce, observe, off (got \"x\")"));
  CHECK(has_error(bad, "FENCEGATE_LOG_LEVEL: must be one of debug, info, warn, error (got \"loud\")"));
  CHECK(has_error_starting(bad, "FENCEGATE_UPSTREAM: expected \"http://host[:port]\""));
  g_env.clear();
}

TEST_CASE("precedence: flags over env over file over defaults") {
  TempFile f(R"({"listen": "10.0.0.1:1000", "db": "/file.db", "threads": 3, "log_level": "warn",
                 "max_connections": 50,
                 "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  g_env = {{"FENCEGATE_CONFIG", f.path()}, {"FENCEGATE_DB", "/env.db"}, {"FENCEGATE_THREADS", "4"}};
  auto r = load_serve({"--threads", "5"}, fake_env);
  g_env.clear();
  REQUIRE_MESSAGE(r.config, joined(r.errors));
  const Config& c = *r.config;
  CHECK(c.config_file == f.path());
  CHECK(c.listen.to_string() == "10.0.0.1:1000");  // file
  CHECK(c.db == "/env.db");                         // env over file
  CHECK(c.threads == 5);                            // flag over env over file
  CHECK(c.log_level == "warn");                     // file over default
  CHECK(c.max_connections == 50);
  CHECK(c.max_header_bytes == 16 * 1024);           // default

  // --config beats FENCEGATE_CONFIG.
  TempFile g(R"({"db": "/g.db", "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  g_env = {{"FENCEGATE_CONFIG", f.path()}};
  auto r2 = load_serve({"--config=" + g.path()}, fake_env);
  g_env.clear();
  REQUIRE_MESSAGE(r2.config, joined(r2.errors));
  CHECK(r2.config->db == "/g.db");
  CHECK(r2.config->config_file == g.path());
}

TEST_CASE("--config cannot be combined with --upstream, --mode or --resource") {
  TempFile f(kMinimal);
  auto r = load_serve({"--config", f.path(), "--upstream", "http://h:2", "--mode", "off", "--resource", "r"},
                      empty_env);
  CHECK_FALSE(r.config);
  INFO(joined(r.errors));
  CHECK(has_error_starting(r, "--upstream: cannot be combined with --config (routes"));
  CHECK(has_error_starting(r, "--mode: cannot be combined with --config (each route"));
  CHECK(has_error_starting(r, "--resource: cannot be combined with --config (each route"));
}

TEST_CASE("config file errors: unreadable file, bad contents") {
  auto r = load_serve({"--config", "/nonexistent/fencegate.json"}, empty_env);
  CHECK_FALSE(r.config);
  CHECK(r.errors == std::vector<std::string>{
                        "/nonexistent/fencegate.json: cannot read (No such file or directory)"});
  auto empty = load_serve({"--config", ""}, empty_env);
  CHECK(empty.errors == std::vector<std::string>{"--config: must name a config file (got \"\")"});

  TempFile bad(R"({"routes": [{"prefix": "/", "upstream": "http://h:1", "mode": "enforse"}], "thread": 2})");
  auto b = load_serve({"--config", bad.path()}, empty_env);
  CHECK_FALSE(b.config);
  INFO(joined(b.errors));
  CHECK(has_error(b, "routes[0].mode: must be one of enforce, observe, off (got \"enforse\")"));
  CHECK(has_error(b, "thread: unknown key"));

  TempFile broken("{");
  auto j = load_serve({"--config", broken.path()}, empty_env);
  REQUIRE(j.errors.size() == 1);
  CHECK(j.errors[0].rfind(broken.path() + ": invalid JSON", 0) == 0);
}

TEST_CASE("serve_usage documents every flag, its env variable and default") {
  std::string u = serve_usage();
  for (const char* s :
       {"--config", "--listen", "--upstream", "--db", "--resource", "--mode", "--threads", "--max-connections",
        "--max-header-bytes", "--max-body-bytes", "--header-timeout-ms", "--idle-timeout-ms",
        "--upstream-timeout-ms", "--upstream-connect-timeout-ms", "--drain-timeout-ms", "--token-header",
        "--leader-header", "--log-level", "--help", "FENCEGATE_CONFIG", "FENCEGATE_LISTEN", "FENCEGATE_DB",
        "FENCEGATE_THREADS", "FENCEGATE_UPSTREAM", "FENCEGATE_MODE", "FENCEGATE_RESOURCE",
        "FENCEGATE_LOG_LEVEL", "--io-uring", "FENCEGATE_IO_URING", "(default \"auto\")", "(default \"127.0.0.1:8080\")", "(default \"Fencing-Token\")",
        "(default 16384)", "write_methods", "fence_reads", "routes"}) {
    CHECK_MESSAGE(u.find(s) != std::string::npos, s);
  }
}

// --- admin listener, audit retention, port 0, reload ---

TEST_CASE("admin and audit defaults: loopback admin without a token, retention 90d and 10,000,000 rows") {
  auto r = load_json(kMinimal);
  REQUIRE_MESSAGE(r.config, joined(r.errors));
  CHECK(r.config->admin.listen.to_string() == "127.0.0.1:9901");
  CHECK(r.config->admin.token_file.empty());
  CHECK(r.config->admin.token.empty());
  // Limited by default (issue 32, finding 7): a flood of refusals must not fill the disk.
  CHECK(r.config->audit.max_age == std::chrono::hours(24 * 90));
  CHECK(r.config->audit.max_rows == 10000000);
  auto flags = load_serve({"--upstream", "http://h:1"}, empty_env);
  REQUIRE_MESSAGE(flags.config, joined(flags.errors));
  CHECK(flags.config->audit.max_age == std::chrono::hours(24 * 90));
  CHECK(flags.config->audit.max_rows == 10000000);
  // 0 still means keep everything.
  auto zero = load_json(R"({"audit": {"max_age": "0", "max_rows": 0}, "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  REQUIRE_MESSAGE(zero.config, joined(zero.errors));
  CHECK(zero.config->audit.max_age.count() == 0);
  CHECK(zero.config->audit.max_rows == 0);
  // serve --help shows the defaults.
  const std::string u = serve_usage();
  CHECK(u.find("(default 90d)") != std::string::npos);
  CHECK(u.find("(default 10000000)") != std::string::npos);
}

TEST_CASE("JSON admin and audit objects are read; the token file is read and trimmed") {
  TempFile token("  s3cr3t-Tok3n-0123456789\n\n");
  auto r = load_json(R"({"admin": {"listen": "0.0.0.0:9999", "token_file": ")" + token.path() + R"("},
                         "audit": {"max_age": "30d", "max_rows": 1000000},
                         "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  REQUIRE_MESSAGE(r.config, joined(r.errors));
  const Config& c = *r.config;
  CHECK(c.admin.listen.to_string() == "0.0.0.0:9999");
  CHECK(c.admin.token_file == token.path());
  CHECK(c.admin.token == "s3cr3t-Tok3n-0123456789");
  CHECK(c.audit.max_age == std::chrono::hours(24 * 30));
  CHECK(c.audit.max_rows == 1000000);
}

TEST_CASE("a non-loopback admin listener requires a token file") {
  auto admin = [](const std::string& listen) {
    return load_json(R"({"admin": {"listen": ")" + listen +
                     R"("}, "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  };
  auto r = admin("0.0.0.0:9901");
  CHECK_FALSE(r.config);
  CHECK(r.errors == std::vector<std::string>{
                        "admin.listen: binding the admin API to a non-loopback address (0.0.0.0) "
                        "requires admin.token_file"});
  for (const char* bad : {"[::]:9901", "10.0.0.1:9901", "example.com:9901", "[::2]:1", "127.example.com:1"}) {
    CHECK_MESSAGE(has_error_starting(admin(bad), "admin.listen: binding the admin API to a non-loopback"), bad);
  }
  for (const char* ok : {"127.0.0.1:9901", "127.1.2.3:1", "[::1]:9901", "[0:0:0:0:0:0:0:1]:1", "localhost:1",
                         "LocalHost:1", "[::ffff:127.0.0.1]:1"}) {
    auto o = admin(ok);
    CHECK_MESSAGE(o.config.has_value(), ok, " ", joined(o.errors));
  }

  // From a flag or variable, the message names it and the matching way to give a token file.
  auto f = load_serve({"--upstream", "http://h:1", "--admin-listen", "0.0.0.0:9901"}, empty_env);
  CHECK(f.errors == std::vector<std::string>{
                        "--admin-listen: binding the admin API to a non-loopback address (0.0.0.0) "
                        "requires --admin-token-file"});
  g_env = {{"FENCEGATE_UPSTREAM", "http://h:1"}, {"FENCEGATE_ADMIN_LISTEN", "[::]:9901"}};
  auto e = load_serve({}, fake_env);
  g_env.clear();
  CHECK(e.errors == std::vector<std::string>{
                        "FENCEGATE_ADMIN_LISTEN: binding the admin API to a non-loopback address (::) "
                        "requires FENCEGATE_ADMIN_TOKEN_FILE"});

  // With a token file from any source it loads.
  TempFile token("tok-0123456789abcdef\n");
  auto ok = load_serve({"--upstream", "http://h:1", "--admin-listen=0.0.0.0:9901", "--admin-token-file",
                        token.path()},
                       empty_env);
  REQUIRE_MESSAGE(ok.config, joined(ok.errors));
  CHECK(ok.config->admin.token == "tok-0123456789abcdef");
  g_env = {{"FENCEGATE_UPSTREAM", "http://h:1"}, {"FENCEGATE_ADMIN_LISTEN", "0.0.0.0:9901"},
           {"FENCEGATE_ADMIN_TOKEN_FILE", token.path()}};
  auto ok_env = load_serve({}, fake_env);
  g_env.clear();
  REQUIRE_MESSAGE(ok_env.config, joined(ok_env.errors));
  CHECK(ok_env.config->admin.token == "tok-0123456789abcdef");
  CHECK(ok_env.config->admin.token_file == token.path());

  // A Config built in code may carry the token directly.
  Config c;
  c.routes.push_back(Route{});
  c.routes[0].prefix = "/";
  c.routes[0].upstream = "http://h:1";
  c.admin.listen = {"0.0.0.0", 9901};
  std::vector<std::string> errors;
  validate(c, errors);
  CHECK(errors.size() == 1);
  errors.clear();
  c.admin.token = "in-code";
  validate(c, errors);
  CHECK_MESSAGE(errors.empty(), joined(errors));
}

TEST_CASE("token file problems name the file and never the token") {
  auto with_token_file = [](const std::string& path) {
    return load_json(R"({"admin": {"token_file": ")" + path +
                     R"("}, "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  };
  auto missing = with_token_file("/nonexistent/fencegate.token");
  CHECK(missing.errors == std::vector<std::string>{
                              "admin.token_file: cannot read /nonexistent/fencegate.token: No such file or directory"});
  auto dir = with_token_file("/tmp");
  CHECK(dir.errors == std::vector<std::string>{"admin.token_file: cannot read /tmp: Is a directory"});

  TempFile empty("");
  CHECK(with_token_file(empty.path()).errors ==
        std::vector<std::string>{"admin.token_file: " + empty.path() + " is empty"});
  TempFile blank(" \n\t\r\n");
  CHECK(with_token_file(blank.path()).errors ==
        std::vector<std::string>{"admin.token_file: " + blank.path() + " is empty"});

  TempFile two("topsecret1\ntopsecret2\n");
  auto t = with_token_file(two.path());
  REQUIRE(t.errors.size() == 1);
  CHECK(t.errors[0].rfind("admin.token_file: " + two.path() + " must hold a single token", 0) == 0);
  CHECK(t.errors[0].find("topsecret") == std::string::npos);

  CHECK(has_error(load_json(R"({"admin": {"token_file": ""}, "routes": [{"prefix": "/", "upstream": "http://h:1"}]})"),
                  "admin.token_file: must not be empty"));

  // From a flag, the flag is named.
  auto flag = load_serve({"--upstream", "http://h:1", "--admin-token-file", "/nonexistent/t"}, empty_env);
  CHECK(flag.errors == std::vector<std::string>{
                           "--admin-token-file: cannot read /nonexistent/t: No such file or directory"});
  CHECK(has_error(load_serve({"--upstream", "http://h:1", "--admin-token-file="}, empty_env),
                  "--admin-token-file: missing value"));
}

TEST_CASE("admin token file: refused when group or others may read or write it, or under 16 bytes") {
  auto with_token_file = [](const std::string& path) {
    return load_json(R"({"admin": {"token_file": ")" + path +
                     R"("}, "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  };
  TempFile token("0123456789abcdef\n");  // 16 bytes: the shortest accepted
  auto ok = with_token_file(token.path());
  REQUIRE_MESSAGE(ok.config, joined(ok.errors));
  CHECK(ok.config->admin.token == "0123456789abcdef");
  ::chmod(token.path().c_str(), 0400);
  CHECK_MESSAGE(with_token_file(token.path()).config, "0400 is the owner's only");

  // Any group or other bit: refused, naming the file and its mode, never the token.
  for (auto [mode, shown] : {std::pair{0644, "0644"}, {0640, "0640"}, {0604, "0604"}, {0620, "0620"}, {0602, "0602"},
                             {0666, "0666"}}) {
    ::chmod(token.path().c_str(), static_cast<mode_t>(mode));
    auto r = with_token_file(token.path());
    CHECK_FALSE(r.config);
    CHECK_MESSAGE(r.errors == std::vector<std::string>{"admin.token_file: " + token.path() + " has mode " + shown +
                                                       ": group or others may read or write it (chmod 600 " +
                                                       token.path() + ")"},
                  joined(r.errors));
  }
  ::chmod(token.path().c_str(), 0644);
  auto flag = load_serve({"--upstream", "http://h:1", "--admin-token-file", token.path()}, empty_env);
  CHECK(has_error(flag, "--admin-token-file: " + token.path() + " has mode 0644: group or others may read or write it (chmod 600 " +
                            token.path() + ")"));

  TempFile short_token("  0123456789abcde\n");  // 15 bytes after trimming
  auto s15 = with_token_file(short_token.path());
  CHECK_FALSE(s15.config);
  CHECK(s15.errors == std::vector<std::string>{"admin.token_file: the token in " + short_token.path() +
                                               " has 15 bytes; at least 16 are required (e.g. openssl rand -hex 32)"});
  TempFile one("x");
  CHECK(has_error(with_token_file(one.path()),
                  "admin.token_file: the token in " + one.path() + " has 1 bytes; at least 16 are required (e.g. openssl rand -hex 32)"));
}

namespace {
// A directory of its own under /tmp, removed with what is in it.
struct DbDir {
  std::string path;
  DbDir() {
    char tmpl[] = "/tmp/fencegate_config_db_XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~DbDir() { std::system(("rm -rf '" + path + "'").c_str()); }
};
LoadResult with_db(const std::string& db) {
  return load_json(R"({"db": ")" + db + R"(", "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
}
}  // namespace

TEST_CASE("db: a directory other users may write to without the sticky bit is refused (StrictModes)") {
  DbDir d;
  const std::string db = d.path + "/fence.db";
  CHECK_MESSAGE(with_db(db).config, "a mkdtemp directory (0700) is fine");
  ::chmod(d.path.c_str(), 0755);
  CHECK(with_db(db).config);
  CHECK(with_db("/tmp/fencegate_config_test_not_there.db").config);  // /tmp: world-writable but sticky

  for (auto [mode, shown] : {std::pair{0777, "0777"}, {0775, "0775"}, {0757, "0757"}}) {
    ::chmod(d.path.c_str(), static_cast<mode_t>(mode));
    auto r = with_db(db);
    CHECK_FALSE(r.config);
    CHECK_MESSAGE(r.errors == std::vector<std::string>{"db: database " + db + ": its directory " + d.path + " has mode " +
                                                       shown +
                                                       ": other users may write to it (group or others, without the "
                                                       "sticky bit) and could replace the database or plant links "
                                                       "beside it (chmod go-w " +
                                                       d.path + ")"},
                  joined(r.errors));
  }
  ::chmod(d.path.c_str(), 01777);  // sticky: others cannot remove or rename what is not theirs
  CHECK(with_db(db).config);

  // A link the operator made is resolved first: the checks apply to the real directory.
  ::chmod(d.path.c_str(), 0700);
  DbDir other;
  ::chmod(other.path.c_str(), 0777);
  std::ofstream(other.path + "/fence.db").flush();
  REQUIRE(::symlink((other.path + "/fence.db").c_str(), db.c_str()) == 0);
  auto linked = with_db(db);
  CHECK_FALSE(linked.config);
  CHECK(has_error_starting(linked, "db: database " + db + " (" + other.path + "/fence.db): its directory " +
                                       other.path + " has mode 0777"));
  ::chmod(other.path.c_str(), 0700);
  CHECK(with_db(db).config);
}

TEST_CASE("db: a database file, or a file beside it, owned by another user is refused") {
  if (::geteuid() != 0) {
    MESSAGE("skipped: needs root to give a file to another user");
    return;
  }
  DbDir d;
  const std::string db = d.path + "/fence.db";
  std::ofstream(db).flush();
  CHECK(with_db(db).config);
  REQUIRE(::chown(db.c_str(), 65534, 65534) == 0);
  auto r = with_db(db);
  CHECK_FALSE(r.config);
  CHECK(r.errors == std::vector<std::string>{"db: database " + db +
                                             " is owned by uid 65534, not by the user fencegate runs as (uid 0): that "
                                             "user could read or change the fence"});
  REQUIRE(::chown(db.c_str(), 0, 0) == 0);
  std::ofstream(db + ".lock").flush();
  REQUIRE(::chown((db + ".lock").c_str(), 65534, 65534) == 0);
  CHECK(has_error(with_db(db), "db: database " + db + ": " + db +
                                   ".lock is owned by uid 65534, not by the user fencegate runs as (uid 0): that "
                                   "user could read or change the fence"));
  ::unlink((db + ".lock").c_str());
  REQUIRE(::symlink("/etc/passwd", (db + "-wal").c_str()) == 0);
  CHECK(has_error(with_db(db), "db: database " + db + ": " + db +
                                   "-wal is a symbolic link; fencegate does not create or open the files beside the "
                                   "database through a link (remove it)"));
}

TEST_CASE("audit.max_age: integer + s|m|h|d, or 0 for unlimited") {
  auto age = [](const std::string& json_value) {
    return load_json(R"({"audit": {"max_age": )" + json_value +
                     R"(}, "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  };
  const std::pair<const char*, long long> good[] = {
      {R"("90s")", 90},       {R"("15m")", 900},     {R"("12h")", 43200}, {R"("30d")", 2592000},
      {R"("0")", 0},          {"0", 0},              {R"("0s")", 0},      {R"("1s")", 1},
      {R"("36500d")", 36500LL * 86400}};
  for (const auto& [in, secs] : good) {
    auto r = age(in);
    REQUIRE_MESSAGE(r.config, in, " ", joined(r.errors));
    CHECK_MESSAGE(r.config->audit.max_age.count() == secs, in);
  }
  const std::string hint = "audit.max_age: must be a duration such as \"90s\", \"15m\", \"12h\" or \"30d\", "
                           "or 0 for unlimited (got ";
  for (const char* bad : {R"("30")", R"("30x")", R"("d")", R"("")", R"("-1d")", R"("1.5h")", R"("30D")",
                          R"(" 30d")", R"("30d ")", R"("+5m")", R"("5ms")", "5", "-1", "1.5", "true", "null"}) {
    auto r = age(bad);
    CHECK_FALSE_MESSAGE(r.config, bad);
    CHECK_MESSAGE(r.errors == std::vector<std::string>{hint + bad + ")"}, bad, " ", joined(r.errors));
  }
  CHECK(has_error(age(R"("36501d")"), "audit.max_age: must be at most 36500d (got \"36501d\")"));
  CHECK(has_error(age(R"("99999999999999999999s")"),
                  "audit.max_age: must be at most 36500d (got \"99999999999999999999s\")"));

  auto flag = load_serve({"--upstream", "http://h:1", "--audit-max-age", "12h"}, empty_env);
  REQUIRE_MESSAGE(flag.config, joined(flag.errors));
  CHECK(flag.config->audit.max_age.count() == 43200);
  CHECK(has_error(load_serve({"--upstream", "http://h:1", "--audit-max-age", "12"}, empty_env),
                  "--audit-max-age: must be a duration such as \"90s\", \"15m\", \"12h\" or \"30d\", "
                  "or 0 for unlimited (got \"12\")"));
  g_env = {{"FENCEGATE_UPSTREAM", "http://h:1"}, {"FENCEGATE_AUDIT_MAX_AGE", "15m"}};
  auto env = load_serve({}, fake_env);
  g_env.clear();
  REQUIRE_MESSAGE(env.config, joined(env.errors));
  CHECK(env.config->audit.max_age.count() == 900);
}

TEST_CASE("admin connection limits: defaults, JSON, flags, environment, ranges") {
  auto d = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  REQUIRE_MESSAGE(d.config, joined(d.errors));
  CHECK(d.config->admin.header_timeout == std::chrono::milliseconds(10000));
  CHECK(d.config->admin.write_timeout == std::chrono::milliseconds(10000));
  CHECK(d.config->admin.max_connections == 64);
  CHECK(d.config->admin.max_connections_per_client == 8);
  auto j = load_json(R"({"admin": {"header_timeout_ms": 2000, "write_timeout_ms": 3000, "max_connections": 16,
                       "max_connections_per_client": 2}, "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  REQUIRE_MESSAGE(j.config, joined(j.errors));
  CHECK(j.config->admin.header_timeout == std::chrono::milliseconds(2000));
  CHECK(j.config->admin.write_timeout == std::chrono::milliseconds(3000));
  CHECK(j.config->admin.max_connections == 16);
  CHECK(j.config->admin.max_connections_per_client == 2);
  auto flag = load_serve({"--upstream", "http://h:1", "--admin-header-timeout-ms=500", "--admin-max-connections", "4"},
                         empty_env);
  REQUIRE_MESSAGE(flag.config, joined(flag.errors));
  CHECK(flag.config->admin.header_timeout == std::chrono::milliseconds(500));
  CHECK(flag.config->admin.max_connections == 4);
  CHECK(has_error_starting(load_serve({"--upstream", "http://h:1", "--admin-write-timeout-ms", "0"}, empty_env),
                           "--admin-write-timeout-ms: must be an integer between 1 and"));
  CHECK(has_error(
      load_json(
          R"({"admin": {"max_connections_per_client": "8"}, "routes": [{"prefix": "/", "upstream": "http://h:1"}]})"),
      "admin.max_connections_per_client: must be an integer (got \"8\")"));
  g_env = {{"FENCEGATE_UPSTREAM", "http://h:1"}, {"FENCEGATE_ADMIN_MAX_CONNECTIONS_PER_CLIENT", "3"}};
  auto env = load_serve({}, fake_env);
  g_env.clear();
  REQUIRE_MESSAGE(env.config, joined(env.errors));
  CHECK(env.config->admin.max_connections_per_client == 3);
}

TEST_CASE("audit.max_rows: integer >= 0, 0 for unlimited") {
  auto rows = [](const std::string& json_value) {
    return load_json(R"({"audit": {"max_rows": )" + json_value +
                     R"(}, "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  };
  auto zero = rows("0");
  REQUIRE_MESSAGE(zero.config, joined(zero.errors));
  CHECK(zero.config->audit.max_rows == 0);
  auto big = rows("9223372036854775807");
  REQUIRE_MESSAGE(big.config, joined(big.errors));
  CHECK(big.config->audit.max_rows == 9223372036854775807ull);
  for (const char* bad : {"-1", "1.5", R"("10")", "9223372036854775808", "null"}) {
    CHECK_MESSAGE(has_error(rows(bad), std::string("audit.max_rows: must be an integer between 0 and "
                                                   "9223372036854775807, 0 for unlimited (got ") +
                                           bad + ")"),
                  bad);
  }
  auto flag = load_serve({"--upstream", "http://h:1", "--audit-max-rows=500"}, empty_env);
  REQUIRE_MESSAGE(flag.config, joined(flag.errors));
  CHECK(flag.config->audit.max_rows == 500);
  CHECK(has_error_starting(load_serve({"--upstream", "http://h:1", "--audit-max-rows", "-1"}, empty_env),
                           "--audit-max-rows: must be an integer between 0 and"));
  g_env = {{"FENCEGATE_UPSTREAM", "http://h:1"}, {"FENCEGATE_AUDIT_MAX_ROWS", "lots"}};
  auto env = load_serve({}, fake_env);
  g_env.clear();
  CHECK(has_error_starting(env, "FENCEGATE_AUDIT_MAX_ROWS: must be an integer between 0 and"));
}

TEST_CASE("admin and audit: unknown keys, wrong types, duplicates") {
  auto r = load_json(R"({"admin": {"lsiten": "127.0.0.1:1", "token": "x"}, "audit": {"max_ages": "1d"},
                         "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  CHECK_FALSE(r.config);
  INFO(joined(r.errors));
  CHECK(has_error(r, "admin.lsiten: unknown key"));
  CHECK(has_error(r, "admin.token: unknown key"));
  CHECK(has_error(r, "audit.max_ages: unknown key"));
  CHECK(r.errors.size() == 3);

  auto t = load_json(R"({"admin": "127.0.0.1:1", "audit": [], "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  CHECK(has_error(t, "admin: must be an object (got \"127.0.0.1:1\")"));
  CHECK(has_error(t, "audit: must be an object (got [])"));

  auto l = load_json(R"({"admin": {"listen": 9901}, "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  CHECK(has_error(l, "admin.listen: must be a string (got 9901)"));
  auto n = load_json(R"({"admin": {"listen": "nocolon"}, "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  CHECK(has_error(n, "admin.listen: expected \"host:port\" (got \"nocolon\")"));

  auto d = load_json(R"({"audit": {"max_rows": 1, "max_rows": 2}, "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  CHECK(has_error(d, "audit.max_rows: duplicate key"));

  // Section fields exist only inside their object, not as dotted top-level keys.
  auto dotted = load_json(R"({"admin.listen": "127.0.0.1:1", "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  CHECK(has_error(dotted, "admin.listen: unknown key"));
}

TEST_CASE("port 0 (any free port) is accepted for listen and admin.listen, not for upstreams") {
  auto r = load_json(R"({"listen": "127.0.0.1:0", "admin": {"listen": "[::1]:0"},
                         "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  REQUIRE_MESSAGE(r.config, joined(r.errors));
  CHECK(r.config->listen.port == 0);
  CHECK(r.config->admin.listen.port == 0);
  CHECK(r.config->admin.listen.host == "::1");

  auto f = load_serve({"--upstream", "http://h:1", "--listen", "0.0.0.0:0", "--admin-listen", "localhost:0"},
                      empty_env);
  REQUIRE_MESSAGE(f.config, joined(f.errors));
  CHECK(f.config->listen.to_string() == "0.0.0.0:0");
  CHECK(f.config->admin.listen.to_string() == "localhost:0");

  auto high = load_serve({"--upstream", "http://h:1", "--listen", "h:65536", "--admin-listen", "h:-1"}, empty_env);
  INFO(joined(high.errors));
  CHECK(has_error(high, "--listen: port must be between 0 and 65535, 0 meaning any free port (got \"65536\")"));
  CHECK(has_error(high, "--admin-listen: port must be between 0 and 65535, 0 meaning any free port (got \"-1\")"));
  CHECK(has_error_starting(load_serve({"--upstream", "http://h:0"}, empty_env),
                           "--upstream: port must be between 1 and 65535"));
}

TEST_CASE("Config::args records the load_serve arguments, so reload can load the same way") {
  TempFile f(R"({"listen": "127.0.0.1:8080", "routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  std::vector<std::string> args = {"--config", f.path(), "--threads", "2", "--audit-max-rows=7"};
  auto r = load_serve(args, empty_env);
  REQUIRE_MESSAGE(r.config, joined(r.errors));
  CHECK(r.config->args == args);
  auto again = load_serve(r.config->args, empty_env);
  REQUIRE_MESSAGE(again.config, joined(again.errors));
  CHECK(again.config->threads == 2);
  CHECK(again.config->audit.max_rows == 7);
  CHECK(reload_incompatibilities(*r.config, *again.config).empty());

  auto flag_only = load_serve({"--upstream", "http://h:1"}, empty_env);
  REQUIRE(flag_only.config);
  CHECK(flag_only.config->args == std::vector<std::string>{"--upstream", "http://h:1"});
  CHECK(load_json(kMinimal).config->args.empty());
}

TEST_CASE("reload_incompatibilities: listen, db, threads and admin.listen need a restart") {
  auto base = load_json(kMinimal);
  REQUIRE(base.config);
  const Config& cur = *base.config;
  CHECK(reload_incompatibilities(cur, cur).empty());

  // Everything else may change on a live process.
  Config next = cur;
  next.routes.push_back(next.routes[0]);
  next.routes[1].prefix = "/b/";
  next.routes[0].mode = Mode::observe;
  next.max_body_bytes = 5;
  next.max_connections = 3;
  next.upstream_timeout = std::chrono::milliseconds(1);
  next.drain_timeout = std::chrono::milliseconds(2);
  next.token_header = "X-T";
  next.leader_header = "X-L";
  next.log_level = "debug";
  next.audit.max_age = std::chrono::seconds(60);
  next.audit.max_rows = 10;
  next.admin.token_file = "/other";
  next.admin.token = "rotated";
  CHECK(reload_incompatibilities(cur, next).empty());

  next.listen = {"127.0.0.1", 8081};
  next.db = "/other.db";
  next.threads = cur.threads + 1;
  next.admin.listen = {"::1", 9901};
  auto errors = reload_incompatibilities(cur, next);
  INFO(joined(errors));
  CHECK(errors == std::vector<std::string>{
                      "listen: changing it needs a restart (127.0.0.1:8080 -> 127.0.0.1:8081)",
                      "db: changing it needs a restart (./fence.db -> /other.db)",
                      "threads: changing it needs a restart (" + std::to_string(cur.threads) + " -> " +
                          std::to_string(cur.threads + 1) + ")",
                      "admin.listen: changing it needs a restart (127.0.0.1:9901 -> [::1]:9901)"});

  // Reloading an edited file: a route change is fine, a listen change is reported.
  TempFile f(R"({"routes": [{"prefix": "/", "upstream": "http://h:1"}]})");
  auto first = load_serve({"--config", f.path()}, empty_env);
  REQUIRE_MESSAGE(first.config, joined(first.errors));
  std::ofstream(f.path()) << R"({"listen": "127.0.0.1:8081", "audit": {"max_age": "1d"},
                                 "routes": [{"prefix": "/", "upstream": "http://h:2"}]})";
  auto second = load_serve(first.config->args, empty_env);
  REQUIRE_MESSAGE(second.config, joined(second.errors));
  CHECK(second.config->routes[0].upstream_addr.port == 2);
  CHECK(reload_incompatibilities(*first.config, *second.config) ==
        std::vector<std::string>{"listen: changing it needs a restart (127.0.0.1:8080 -> 127.0.0.1:8081)"});
}

TEST_CASE("serve_usage documents the admin and audit settings") {
  std::string u = serve_usage();
  for (const char* s : {"--admin-listen", "FENCEGATE_ADMIN_LISTEN", "--admin-token-file", "FENCEGATE_ADMIN_TOKEN_FILE",
                        "--audit-max-age", "FENCEGATE_AUDIT_MAX_AGE", "--audit-max-rows", "FENCEGATE_AUDIT_MAX_ROWS",
                        "(default \"127.0.0.1:9901\")", "\"admin\"", "\"audit\"", "30d", "port 0", "token file"}) {
    CHECK_MESSAGE(u.find(s) != std::string::npos, s);
  }
}

TEST_CASE("route authority: JSON object read and normalised; bad values and unknown keys name the field") {
  auto r = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://h:1", "resource": "ledger",
      "authority": {"etcd": ["http://127.0.0.1:2379", "http://etcd-b:2379/"], "election": "billing", "grace_ms": 1500}},
      {"prefix": "/x/", "upstream": "http://h:1"}]})");
  REQUIRE_MESSAGE(r.config, joined(r.errors));
  REQUIRE(r.config->routes[0].authority);
  const Authority& a = *r.config->routes[0].authority;
  CHECK(a.etcd == std::vector<std::string>{"http://127.0.0.1:2379", "http://etcd-b:2379"});
  CHECK(a.election == "billing");
  CHECK(a.grace == std::chrono::milliseconds(1500));
  CHECK_FALSE(r.config->routes[1].authority);
  auto dflt = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://h:1",
      "authority": {"etcd": ["http://127.0.0.1:2379"], "election": "billing"}}]})");
  REQUIRE_MESSAGE(dflt.config, joined(dflt.errors));
  CHECK(dflt.config->routes[0].authority->grace == std::chrono::milliseconds(0));

  auto bad = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://h:1",
      "authority": {"etcd": ["ftp://x:1", "http://a:2379", "http://a:2379"], "election": "", "grace_ms": -1, "ttl": 3}},
      {"prefix": "/b/", "upstream": "http://h:1", "authority": {"election": "e"}},
      {"prefix": "/c/", "upstream": "http://h:1", "authority": {"etcd": [], "election": 5}},
      {"prefix": "/d/", "upstream": "http://h:1", "authority": "etcd"},
      {"prefix": "/e/", "upstream": "http://h:1", "authority": {"etcd": ["http://a:1"], "election": "has space"}}]})");
  INFO(joined(bad.errors));
  CHECK_FALSE(bad.config);
  CHECK(has_error(bad, "routes[0].authority.ttl: unknown key"));
  CHECK(has_error_starting(bad, "routes[0].authority.grace_ms: must be 0 (the leader's lease TTL) or an integer between 200 and 86400000"));
  // A window of a few ms would fail closed with etcd healthy (it is probed every 50 ms at most).
  auto tiny = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://h:1",
      "authority": {"etcd": ["http://a:2379"], "election": "e", "grace_ms": 30}}]})");
  CHECK_FALSE(tiny.config);
  CHECK(has_error_starting(tiny, "routes[0].authority.grace_ms: must be 0 (the leader's lease TTL) or an integer between 200"));
  CHECK(has_error(bad, "routes[0].authority.etcd[0]: must be an etcd client URL \"http://host:port\" or \"https://host:port\" (got \"ftp://x:1\")"));
  CHECK(has_error(bad, "routes[0].authority.etcd[2]: listed twice (\"http://a:2379\")"));
  CHECK(has_error(bad, "routes[0].authority.election: must not be empty"));
  CHECK(has_error(bad, "routes[1].authority.etcd: required"));
  CHECK(has_error(bad, "routes[2].authority.etcd: must list at least one etcd URL"));
  CHECK(has_error(bad, "routes[2].authority.election: must be a string (got 5)"));
  CHECK(has_error_starting(bad, "routes[3].authority: must be an object"));
  CHECK(has_error_starting(bad, "routes[4].authority.election: must be 1..256 printable ASCII characters"));
}

TEST_CASE("route authority: flag-only form and its environment variables; both or neither") {
  auto r = load_serve({"--upstream", "http://h:1", "--authority-etcd", "http://e1:2379, http://e2:2379",
                       "--authority-election", "billing", "--authority-grace-ms", "250"},
                      empty_env);
  REQUIRE_MESSAGE(r.config, joined(r.errors));
  REQUIRE(r.config->routes.size() == 1);
  REQUIRE(r.config->routes[0].authority);
  CHECK(r.config->routes[0].authority->etcd == std::vector<std::string>{"http://e1:2379", "http://e2:2379"});
  CHECK(r.config->routes[0].authority->election == "billing");
  CHECK(r.config->routes[0].authority->grace == std::chrono::milliseconds(250));

  g_env = {{"FENCEGATE_AUTHORITY_ETCD", "http://e:2379"}, {"FENCEGATE_AUTHORITY_ELECTION", "jobs"}};
  auto env = load_serve({"--upstream", "http://h:1"}, fake_env);
  g_env.clear();
  REQUIRE_MESSAGE(env.config, joined(env.errors));
  CHECK(env.config->routes[0].authority->election == "jobs");

  auto none = load_serve({"--upstream", "http://h:1"}, empty_env);
  REQUIRE(none.config);
  CHECK_FALSE(none.config->routes[0].authority);

  auto half = load_serve({"--upstream", "http://h:1", "--authority-etcd", "http://e:2379"}, empty_env);
  CHECK(has_error(half, "--authority-etcd: needs --authority-election too (or FENCEGATE_AUTHORITY_ELECTION)"));
  auto other_half = load_serve({"--upstream", "http://h:1", "--authority-election", "x"}, empty_env);
  CHECK(has_error(other_half, "--authority-election: needs --authority-etcd too (or FENCEGATE_AUTHORITY_ETCD)"));
  auto bad = load_serve({"--upstream", "http://h:1", "--authority-etcd", "ftp://e:2379", "--authority-election",
                         "x", "--authority-grace-ms", "soon"},
                        empty_env);
  INFO(joined(bad.errors));
  CHECK(has_error_starting(bad, "--authority-grace-ms: must be 0 (the leader's lease TTL) or an integer between 200 and 86400000"));
  CHECK(has_error(bad, "--authority-etcd: must be an etcd client URL \"http://host:port\" or \"https://host:port\" (got \"ftp://e:2379\")"));

  TempFile f(kMinimal);
  auto mixed = load_serve({"--config", f.path(), "--authority-election", "x"}, empty_env);
  CHECK(has_error_starting(mixed, "--authority-election: cannot be combined with --config"));
}

TEST_CASE("reload_incompatibilities: a route's authority needs a restart") {
  auto base = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://h:1",
      "authority": {"etcd": ["http://e:2379"], "election": "billing"}}]})");
  REQUIRE_MESSAGE(base.config, joined(base.errors));
  const Config& cur = *base.config;
  Config next = cur;
  next.routes.push_back(next.routes[0]);
  next.routes[1].prefix = "/plain/";
  next.routes[1].authority.reset();
  next.routes[0].mode = Mode::observe;
  CHECK(reload_incompatibilities(cur, next).empty());  // routes without an authority may come and go

  next.routes[0].authority->election = "other";
  auto errors = reload_incompatibilities(cur, next);
  REQUIRE(errors.size() == 1);
  CHECK(errors[0].find("authority: changing it needs a restart") != std::string::npos);
  next.routes[0].authority.reset();
  CHECK(reload_incompatibilities(cur, next).size() == 1);
  Config added = cur;
  added.routes.push_back(cur.routes[0]);
  added.routes[1].prefix = "/new/";
  CHECK(reload_incompatibilities(cur, added).size() == 1);
}

TEST_CASE("serve_usage documents the authority flags") {
  std::string u = serve_usage();
  for (const char* s : {"--authority-etcd", "FENCEGATE_AUTHORITY_ETCD", "--authority-election",
                        "FENCEGATE_AUTHORITY_ELECTION", "--authority-grace-ms", "FENCEGATE_AUTHORITY_GRACE_MS",
                        "\"authority\"", "rejected_not_leader", "rejected_unknown_generation"}) {
    CHECK_MESSAGE(u.find(s) != std::string::npos, s);
  }
}

TEST_CASE("a number JSON cannot represent is a config error, not a crash (found by the config fuzzer)") {
  // A reload of such a file once killed the running sidecar.
  auto r = fencegate::config::load_json(R"({"threads": 1e400, "routes": [{"prefix": "/", "upstream": "http://127.0.0.1:1"}]})");
  CHECK_FALSE(r.config.has_value());
  REQUIRE_FALSE(r.errors.empty());
  CHECK(r.errors[0].find("invalid JSON") != std::string::npos);
  CHECK(r.errors[0].find("in threads:") != std::string::npos);  // the field is named
  r = fencegate::config::load_json(
      R"({"routes": [{"prefix": "/", "upstream": "http://127.0.0.1:1", "write_methods": ["POST", -1e999]}]})");
  REQUIRE_FALSE(r.errors.empty());
  CHECK(r.errors[0].find("in routes[0].write_methods[1]:") != std::string::npos);
}

TEST_CASE("an unknown FENCEGATE_* environment variable is a warning that suggests the near name") {
  auto w = unknown_env_warnings({"FENCEGATE_MODEE", "FENCEGATE_MODE", "FENCEGATE_ADMIN_LISTEN", "FENCEGATE_TRHEADS",
                                 "FENCEGATE_NOTHING_LIKE_IT", "PATH", "FENCING_TOKEN"});
  REQUIRE(w.size() == 3);
  CHECK(w[0] == "FENCEGATE_MODEE: unknown environment variable, ignored (did you mean FENCEGATE_MODE?)");
  CHECK(w[1] == "FENCEGATE_TRHEADS: unknown environment variable, ignored (did you mean FENCEGATE_THREADS?)");
  CHECK(w[2] == "FENCEGATE_NOTHING_LIKE_IT: unknown environment variable, ignored");
  // Every variable the help lists is known: none of them warns.
  std::vector<std::string> listed;
  const std::string usage = serve_usage();
  for (std::size_t at = usage.find("env FENCEGATE_"); at != std::string::npos;
       at = usage.find("env FENCEGATE_", at + 1)) {
    const std::size_t b = at + 4, e = usage.find_first_of(" \n", b);
    listed.push_back(usage.substr(b, e - b));
  }
  CHECK(listed.size() > 20);
  CHECK(unknown_env_warnings(listed).empty());
}

TEST_CASE("load_serve reads the process environment's FENCEGATE_* names for warnings; injected ones do not") {
  ::setenv("FENCEGATE_LOG_LEVLE", "debug", 1);
  LoadResult real = load_serve({"--upstream", "http://127.0.0.1:9"});
  ::unsetenv("FENCEGATE_LOG_LEVLE");
  REQUIRE(real.config);
  // (The test's own environment may hold other FENCEGATE_* names, e.g. FENCEGATE_TEST_JOBS.)
  CHECK(std::count(real.warnings.begin(), real.warnings.end(),
                   "FENCEGATE_LOG_LEVLE: unknown environment variable, ignored (did you mean FENCEGATE_LOG_LEVEL?)") == 1);
  LoadResult injected = load_serve({"--upstream", "http://127.0.0.1:9"}, [](const char*) -> const char* { return nullptr; });
  CHECK(injected.warnings.empty());
}

// --- fleet (issue 33, docs/fleet.md) ---

TEST_CASE("fleet: the JSON block, the flags, and errors that name the field") {
  auto r = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://h:1"}],
    "fleet": {"etcd": ["http://127.0.0.1:2379", "http://10.0.0.2:2379/"], "name": "pay", "member": "gw-a", "ttl_ms": 3000}})");
  REQUIRE_MESSAGE(r.config, joined(r.errors));
  CHECK(r.config->fleet.enabled());
  CHECK(r.config->fleet.etcd == std::vector<std::string>{"http://127.0.0.1:2379", "http://10.0.0.2:2379"});
  CHECK(r.config->fleet.name == "pay");
  CHECK(r.config->fleet.member == "gw-a");
  CHECK(r.config->fleet.ttl.count() == 3000);

  auto none = load_json(kMinimal);
  REQUIRE(none.config);
  CHECK_FALSE(none.config->fleet.enabled());  // without "fleet" nothing changes

  auto f = load_serve({"--upstream", "http://h:1", "--fleet-etcd", "http://127.0.0.1:2379,http://127.0.0.1:2380",
                       "--fleet-name", "pay", "--fleet-member", "b", "--fleet-ttl-ms", "4000"},
                      empty_env);
  REQUIRE_MESSAGE(f.config, joined(f.errors));
  CHECK(f.config->fleet.etcd.size() == 2);
  CHECK(f.config->fleet.member == "b");
  CHECK(f.config->fleet.ttl.count() == 4000);

  auto bad = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://h:1"}],
    "fleet": {"etcd": ["tcp://h:1"], "name": "a/b", "ttl_ms": 100}})");
  CHECK_FALSE(bad.config);
  const std::string e = joined(bad.errors);
  CHECK(e.find("fleet.etcd") != std::string::npos);
  CHECK(e.find("fleet.name") != std::string::npos);
  CHECK(e.find("fleet.ttl_ms") != std::string::npos);

  auto missing = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://h:1"}],
    "fleet": {"etcd": ["http://h:1"], "name": "x"}})");
  CHECK_FALSE(missing.config);
  CHECK(joined(missing.errors).find("fleet.member: required") != std::string::npos);
}

// TLS to the upstream (issue 27): https:// routes and their upstream_* settings.
TEST_CASE("https upstreams: default port 443, the upstream_* keys and flags, and their errors") {
  auto ok = load_json(R"({"routes": [{"prefix": "/", "upstream": "https://api.example.com"},
    {"prefix": "/b/", "upstream": "https://[::1]:8443/", "upstream_server_name": "b.example",
     "upstream_verify": false}]})");
  REQUIRE_MESSAGE(ok.config, joined(ok.errors));
  const auto& r0 = ok.config->routes[0];
  CHECK(r0.upstream_tls);
  CHECK(r0.upstream_addr.port == 443);
  CHECK(r0.upstream_verify);
  const auto& r1 = ok.config->routes[1];
  CHECK(r1.upstream_addr.port == 8443);
  CHECK(r1.upstream_server_name == "b.example");
  CHECK_FALSE(r1.upstream_verify);
  auto ipv6 = load_json(R"({"routes": [{"prefix": "/", "upstream": "https://[::1]"}]})");
  REQUIRE_MESSAGE(ipv6.config, joined(ipv6.errors));
  CHECK(ipv6.config->routes[0].upstream_addr.port == 443);

  auto bad = load_json(R"({"routes": [{"prefix": "/", "upstream": "http://h:1", "upstream_ca": "/x"},
    {"prefix": "/b/", "upstream": "https://h", "upstream_cert": "/nonexistent/c.crt", "upstream_verify": "no"},
    {"prefix": "/c/", "upstream": "https://h", "upstream_server_name": "a b"}]})");
  CHECK_FALSE(bad.config);
  CHECK(has_error(bad, "routes[0].upstream_ca: only for an https:// upstream (got \"http://h:1\")"));
  CHECK(has_error_starting(bad, "routes[1].upstream_cert: cannot read /nonexistent/c.crt"));
  CHECK(has_error_starting(bad, "routes[1].upstream_key: upstream_cert and upstream_key go together"));
  CHECK(has_error_starting(bad, "routes[1].upstream_verify: must be true or false"));
  CHECK(has_error_starting(bad, "routes[2].upstream_server_name: not a host name"));

  auto flags = load_serve({"--upstream", "https://h:9443", "--upstream-server-name", "h.example", "--upstream-verify",
                           "false"},
                          empty_env);
  REQUIRE_MESSAGE(flags.config, joined(flags.errors));
  CHECK(flags.config->routes[0].upstream_tls);
  CHECK(flags.config->routes[0].upstream_addr.port == 9443);
  CHECK(flags.config->routes[0].upstream_server_name == "h.example");
  CHECK_FALSE(flags.config->routes[0].upstream_verify);
  auto bad_flags = load_serve({"--upstream", "https://h", "--upstream-verify", "maybe", "--upstream-ca", "/nonexistent/ca"},
                              empty_env);
  CHECK(has_error(bad_flags, "--upstream-verify: must be true or false (got \"maybe\")"));
  CHECK(has_error_starting(bad_flags, "--upstream-ca: cannot read /nonexistent/ca"));
  auto with_file = load_serve({"--config", "/nonexistent/f.json", "--upstream-ca", "/x"}, empty_env);
  CHECK(has_error_starting(with_file, "--upstream-ca: cannot be combined with --config"));
}
