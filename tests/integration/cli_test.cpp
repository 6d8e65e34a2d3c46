// CLI contract: --help on the binary and on `serve`, exit code 2 with a message naming the field
// for bad flags, bad config values and unknown config keys.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/integration/harness.h"
#include "tests/support/net_util.h"

using namespace fencegate::testing;

namespace {

bool mentions(const CommandResult& r, const std::string& s) {
  return r.out.find(s) != std::string::npos || r.err.find(s) != std::string::npos;
}

bool fs_exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

std::string show(const CommandResult& r) {
  return r.status.describe() + (r.timed_out ? " (timed out: it did not exit)" : "") + "\nstdout:\n" + r.out +
         "\nstderr:\n" + r.err;
}

// Runs `fencegate serve` with a config file holding `config`; db and listen are valid.
CommandResult serve_with_config(const TempDir& dir, const json& config) {
  write_file(dir.file("bad.json"), config.dump(2));
  return run_command({kFencegate, "serve", "--config", dir.file("bad.json")}, 10s);
}

json valid_config(const TempDir& dir) {
  json route;
  route["prefix"] = "/tenants/{tenant}/";
  route["upstream"] = "http://127.0.0.1:9";
  route["resource"] = "tenant-{tenant}";
  route["mode"] = "enforce";
  route["write_methods"] = json::array({"POST", "PUT"});
  route["fence_reads"] = false;
  json c;
  c["listen"] = "127.0.0.1:" + std::to_string(free_port());
  c["db"] = dir.file("fence.db");
  c["threads"] = 1;
  c["routes"] = json::array({route});
  c["admin"] = json::object({{"listen", "127.0.0.1:0"}});  // not the fixed default port
  return c;
}

}  // namespace

TEST_SUITE("cli") {

TEST_CASE("fencegate --help and serve --help exit 0 and describe the flags") {
  auto top = run_command({kFencegate, "--help"});
  INFO(show(top));
  CHECK(top.code() == 0);
  CHECK(mentions(top, "serve"));

  auto serve = run_command({kFencegate, "serve", "--help"});
  INFO(show(serve));
  CHECK(serve.code() == 0);
  for (const char* flag : {"--listen", "--upstream", "--db", "--config", "--mode", "--resource", "--threads",
                           "--max-connections", "--drain-timeout-ms"}) {
    CAPTURE(flag);
    CHECK(mentions(serve, flag));
  }
}

TEST_CASE("bad flags exit 2 with a message naming the flag") {
  TempDir dir;
  std::string db = dir.file("fence.db");
  std::string listen = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::string> base{kFencegate, "serve", "--listen", listen, "--upstream", "http://127.0.0.1:9", "--db", db};
  struct Case {
    std::vector<std::string> extra;
    std::string must_mention;
  };
  std::vector<Case> cases{
      {{"--bogus-flag", "1"}, "bogus-flag"},
      {{"--mode", "enforse"}, "mode"},
      {{"--threads", "abc"}, "threads"},
      {{"--threads", "-3"}, "threads"},
      {{"--drain-timeout-ms", "soon"}, "drain"},
      {{"--max-connections", "0"}, "connections"},
  };
  for (const auto& c : cases) {
    auto argv = base;
    argv.insert(argv.end(), c.extra.begin(), c.extra.end());
    auto r = run_command(argv, 10s);
    CAPTURE(c.extra[0]);
    INFO(show(r));
    CHECK(r.code() == 2);
    CHECK(mentions(r, c.must_mention));
  }

  SUBCASE("a bad --listen or --upstream value is named") {
    auto r1 = run_command({kFencegate, "serve", "--listen", "nonsense", "--upstream", "http://127.0.0.1:9", "--db", db}, 10s);
    INFO(show(r1));
    CHECK(r1.code() == 2);
    CHECK(mentions(r1, "listen"));
    auto r2 = run_command({kFencegate, "serve", "--listen", listen, "--upstream", "ftp://127.0.0.1:9", "--db", db}, 10s);
    INFO(show(r2));
    CHECK(r2.code() == 2);
    CHECK(mentions(r2, "upstream"));
  }
  SUBCASE("an unknown subcommand exits 2") {
    auto r = run_command({kFencegate, "frobnicate"}, 10s);
    INFO(show(r));
    CHECK(r.code() == 2);
  }
}

TEST_CASE("every subcommand's flag syntax errors keep their own wording (one parser, four contracts)") {
  struct Case {
    std::vector<std::string> args;  // after the binary
    std::string stderr_line;        // a whole line of stderr
  };
  const std::vector<Case> cases{
      // serve: every problem is listed; a value that starts with "--" is the next flag.
      {{"serve", "--db", "--threads", "2"}, "fencegate serve: --db: missing value"},
      {{"serve", "--db="}, "fencegate serve: --db: missing value"},
      {{"serve", "--bogus=1"}, "fencegate serve: --bogus: unknown flag (see --help)"},
      {{"serve", "stray"}, "fencegate serve: unexpected argument \"stray\" (flags look like --name value)"},
      {{"serve", "--"}, "fencegate serve: --: unknown flag (see --help)"},
      // elect: `--` ends the flags; a value is the next argument, whatever it looks like.
      {{"elect", "--recampaign=1", "--", "true"}, "fencegate elect: unknown flag \"--recampaign=1\""},
      {{"elect", "stray", "--", "true"}, "fencegate elect: unknown flag \"stray\" (put the command after --)"},
      {{"elect", "--ttl"}, "fencegate elect: --ttl: needs a value"},
      {{"elect", "--ttl"}, "fencegate elect: --ttl: must be an integer in 2..3600 (got \"\")"},
      {{"elect", "--ttl", "--", "true"}, "fencegate elect: --ttl: must be an integer in 2..3600 (got \"--\")"},
      {{"elect", "--log-level", "loud", "--", "true"},
       "fencegate elect: --log-level: must be one of debug, info, warn, error (got \"loud\")"},
      // leader
      {{"leader", "--"}, "fencegate leader: unknown flag \"--\""},
      {{"leader", "--timeout-ms=0"}, "fencegate leader: --timeout-ms: must be an integer in 1..600000 (got \"0\")"},
      // audit: the first problem ends it; a value may start with '-'.
      {{"audit", "--json=1"}, "fencegate audit: --json takes no value"},
      {{"audit", "--db"}, "fencegate audit: --db needs a value"},
      {{"audit", "--db="}, "fencegate audit: --db needs a value (got an empty one)"},
      {{"audit", "--"}, "fencegate audit: unexpected argument \"--\" (flags start with --)"},
      {{"audit", "--bogus", "--help"}, "fencegate audit: unknown flag --bogus"},
      {{"audit", "--db", "x", "--since", "-1h", "--until", "-2h"}, "fencegate audit: --since "},
  };
  for (const auto& c : cases) {
    std::vector<std::string> argv{kFencegate};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    auto r = run_command(argv, 10s);
    CAPTURE(c.stderr_line);
    INFO(show(r));
    CHECK(r.code() == 2);
    CHECK(("\n" + r.err).find("\n" + c.stderr_line) != std::string::npos);
  }
  // --help where a flag may stand wins over earlier problems (serve, elect), not as a value.
  for (const char* sub : {"serve", "elect", "leader", "audit"}) {
    auto r = run_command({kFencegate, sub, "-h"}, 10s);
    CAPTURE(sub);
    CHECK(r.code() == 0);
    CHECK(r.out.rfind("Usage: fencegate " + std::string(sub), 0) == 0);
  }
  CHECK(run_command({kFencegate, "serve", "--bogus", "--help"}, 10s).code() == 0);
  CHECK(run_command({kFencegate, "elect", "--bogus", "--help"}, 10s).code() == 0);
}

TEST_CASE("serve refuses files another local user could read or tamper with: exit 2 naming the path and why") {
  TempDir dir;
  const std::string tf = dir.file("admin.token");
  auto with_token = [&](const std::string& text, mode_t mode) {
    write_file(tf, text);
    REQUIRE(::chmod(tf.c_str(), mode) == 0);
    json c = valid_config(dir);
    c["admin"]["token_file"] = tf;
    return serve_with_config(dir, c);
  };
  SUBCASE("an admin token file group or others may read") {
    auto r = with_token("0123456789abcdef-admin\n", 0644);
    INFO(show(r));
    CHECK(r.code() == 2);
    CHECK(mentions(r, "admin.token_file: " + tf + " has mode 0644: group or others may read or write it"));
    CHECK_FALSE(mentions(r, "0123456789abcdef-admin"));
  }
  SUBCASE("an admin token of 15 bytes") {
    auto r = with_token("0123456789abcde\n", 0600);
    INFO(show(r));
    CHECK(r.code() == 2);
    CHECK(mentions(r, "admin.token_file: the token in " + tf + " has 15 bytes; at least 16 are required"));
  }
  SUBCASE("a database directory others may write to, without the sticky bit") {
    TempDir open_dir("fencegate-open-dir");
    REQUIRE(::chmod(open_dir.path().c_str(), 0777) == 0);
    json c = valid_config(dir);
    c["db"] = open_dir.file("fence.db");
    auto r = serve_with_config(dir, c);
    INFO(show(r));
    CHECK(r.code() == 2);
    CHECK(mentions(r, "db: database " + open_dir.file("fence.db") + ": its directory " + open_dir.path() +
                          " has mode 0777: other users may write to it"));
    CHECK_FALSE(fs_exists(open_dir.file("fence.db")));
    CHECK_FALSE(fs_exists(open_dir.file("fence.db.lock")));
  }
  SUBCASE("a database file owned by another user") {
    if (::geteuid() != 0) return;  // needs root to give the file away
    write_file(dir.file("fence.db"), "");
    REQUIRE(::chown(dir.file("fence.db").c_str(), 65534, 65534) == 0);
    auto r = serve_with_config(dir, valid_config(dir));
    INFO(show(r));
    CHECK(r.code() == 2);
    CHECK(mentions(r, "db: database " + dir.file("fence.db") + " is owned by uid 65534, not by the user fencegate runs as"));
  }
  SUBCASE("a symbolic link planted at the lock file's name") {
    REQUIRE(::symlink(dir.file("elsewhere").c_str(), dir.file("fence.db.lock").c_str()) == 0);
    auto r = serve_with_config(dir, valid_config(dir));
    INFO(show(r));
    CHECK(r.code() == 2);
    CHECK(mentions(r, dir.file("fence.db.lock") + " is a symbolic link"));
    CHECK_FALSE(fs_exists(dir.file("elsewhere")));
  }
}

TEST_CASE("config file: unknown keys and bad values exit 2 naming the field") {
  TempDir dir;
  SUBCASE("unknown top-level key (a typo must not pass)") {
    json c = valid_config(dir);
    c["listne"] = "127.0.0.1:1";
    auto r = serve_with_config(dir, c);
    INFO(show(r));
    CHECK(r.code() == 2);
    CHECK(mentions(r, "listne"));
  }
  SUBCASE("unknown route key") {
    json c = valid_config(dir);
    c["routes"][0]["prefx"] = "/x/";
    auto r = serve_with_config(dir, c);
    INFO(show(r));
    CHECK(r.code() == 2);
    CHECK(mentions(r, "prefx"));
  }
  SUBCASE("bad route mode") {
    json c = valid_config(dir);
    c["routes"][0]["mode"] = "enforse";
    auto r = serve_with_config(dir, c);
    INFO(show(r));
    CHECK(r.code() == 2);
    CHECK(mentions(r, "mode"));
  }
  SUBCASE("write_methods of the wrong type") {
    json c = valid_config(dir);
    c["routes"][0]["write_methods"] = "POST";
    auto r = serve_with_config(dir, c);
    INFO(show(r));
    CHECK(r.code() == 2);
    CHECK(mentions(r, "write_methods"));
  }
  SUBCASE("fence_reads of the wrong type") {
    json c = valid_config(dir);
    c["routes"][0]["fence_reads"] = "yes";
    auto r = serve_with_config(dir, c);
    INFO(show(r));
    CHECK(r.code() == 2);
    CHECK(mentions(r, "fence_reads"));
  }
  SUBCASE("resource template uses a capture the prefix does not have") {
    json c = valid_config(dir);
    c["routes"][0]["resource"] = "tenant-{tnant}";
    auto r = serve_with_config(dir, c);
    INFO(show(r));
    CHECK(r.code() == 2);
    CHECK(mentions(r, "resource"));
  }
  SUBCASE("threads of the wrong type") {
    json c = valid_config(dir);
    c["threads"] = "two";
    auto r = serve_with_config(dir, c);
    INFO(show(r));
    CHECK(r.code() == 2);
    CHECK(mentions(r, "threads"));
  }
  SUBCASE("not JSON") {
    write_file(dir.file("bad.json"), "{ \"listen\": ");
    auto r = run_command({kFencegate, "serve", "--config", dir.file("bad.json")}, 10s);
    INFO(show(r));
    CHECK(r.code() == 2);
  }
  SUBCASE("missing config file") {
    auto r = run_command({kFencegate, "serve", "--config", dir.file("nope.json")}, 10s);
    INFO(show(r));
    CHECK(r.code() == 2);
    CHECK(mentions(r, "nope.json"));
  }
  SUBCASE("a valid config file starts (control for the cases above)") {
    json c = valid_config(dir);
    write_file(dir.file("good.json"), c.dump(2));
    ProcessOptions o;
    o.log_path = dir.file("good.log");
    auto p = Process::start({kFencegate, "serve", "--config", dir.file("good.json")}, o);
    std::string listen = c["listen"];
    auto port = std::uint16_t(std::stoi(listen.substr(listen.rfind(':') + 1)));
    INFO("log:\n", p.log());
    CHECK(p.wait_for_port(port, 15s));
    auto st = p.stop();
    CHECK(st.exited);
    CHECK(st.code == 0);
  }
}

TEST_CASE("harness: a proxy whose port another process took before its first start moves to another port") {
  RecordingUpstream up;
  ProxySpec spec;
  spec.upstream = up.url();
  Proxy px(spec);
  const std::uint16_t taken = px.port();
  // Bound, not listening: fencegate's bind fails, and nothing answers on the port meanwhile.
  Fd squatter(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(taken);
  REQUIRE(::bind(squatter.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  CHECK(px.port() != taken);
  CHECK(request(px.port(), "GET", "/x").code() == 200);
}

}  // TEST_SUITE
