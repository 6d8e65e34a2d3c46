// CLI contract: --help on the binary and on `serve`, exit code 2 with a message naming the field
// for bad flags, bad config values and unknown config keys.
#include "tests/integration/harness.h"

using namespace fencegate::testing;

namespace {

bool mentions(const CommandResult& r, const std::string& s) {
  return r.out.find(s) != std::string::npos || r.err.find(s) != std::string::npos;
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

}  // TEST_SUITE
