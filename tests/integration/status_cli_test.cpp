// `fencegate status` end to end: the real binary reading a running sidecar's admin API (the same
// resource table as GET /v1/resources), the bearer token from a file checked like admin.token_file,
// and its exit codes.
#include <sys/stat.h>

#include "tests/integration/ops_harness.h"

using namespace fencegate::testing;

namespace {

ProxySpec config_spec(json cfg) {
  ProxySpec s;
  s.config = std::move(cfg);
  return s;
}

}  // namespace

TEST_SUITE("status_cli") {
  TEST_CASE("status: prints the resource table of a running sidecar, as /v1/resources has it") {
    RecordingUpstream up;
    Proxy px(config_spec(
        config_with_routes({route("/obs/", up.url(), "obs", "observe"), route("/", up.url(), "ledger", "enforce")})));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);
    HttpClient c;
    REQUIRE(c.connect(px.port()));
    CHECK(is_2xx(c.request("POST", "/w", token(41, {{"Fencing-Leader", "node-a"}}))));
    CHECK(is_2xx(c.request("POST", "/obs/w", token(7))));

    auto r = run_command({kFencegate, "status", "--admin", "http://127.0.0.1:" + std::to_string(admin)});
    INFO("stdout:\n", r.out, "\nstderr:\n", r.err);
    CHECK(r.code() == 0);
    CHECK(r.out.find("ready") != std::string::npos);
    CHECK(r.out.find("RESOURCE") != std::string::npos);
    const json api = admin_json(admin, "/v1/resources");
    REQUIRE(api["resources"].size() == 2);
    for (const auto& res : api["resources"]) {
      const std::string name = res["resource"];
      auto at = r.out.find("\n" + name + " ");
      REQUIRE_MESSAGE(at != std::string::npos, name, " is not in the table");
      const std::string line = r.out.substr(at + 1, r.out.find('\n', at + 1) - at - 1);
      CHECK(line.find(" " + res["mode"].get<std::string>() + " ") != std::string::npos);
      CHECK(line.find(" " + std::to_string(res["generation"].get<std::int64_t>()) + " ") != std::string::npos);
      CHECK(line.find(res["advanced_at"].get<std::string>()) != std::string::npos);
    }
    CHECK(r.out.find("node-a") != std::string::npos);

    // --watch redraws the screen every 2 s, with rates from the second screen on (killed here).
    auto w =
        run_command({kFencegate, "status", "--admin", "http://127.0.0.1:" + std::to_string(admin), "--watch"}, 5s);
    INFO("watch stdout:\n", w.out);
    CHECK(w.timed_out);
    std::size_t screens = 0;
    for (std::size_t at = 0; (at = w.out.find("\033[H\033[2J", at)) != std::string::npos; ++at) ++screens;
    CHECK(screens >= 2);
    CHECK(w.out.find(" 0.0 ") != std::string::npos);  // a rate, once two screens were read
  }

  TEST_CASE("status: the token file is checked like admin.token_file; a wrong or missing token is exit 1") {
    RecordingUpstream up;
    TempDir t("fencegate-status-token");
    const std::string secret = "status-cli-token-0123456789";
    write_file(t.file("admin.token"), secret + "\n");
    ::chmod(t.file("admin.token").c_str(), 0600);
    json cfg = config_with_routes({route("/", up.url(), "ledger", "enforce")});
    cfg["admin"] = {{"listen", "127.0.0.1:0"}, {"token_file", t.file("admin.token")}};
    Proxy px(config_spec(cfg));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);
    const std::string url = "http://127.0.0.1:" + std::to_string(admin);

    auto ok = run_command({kFencegate, "status", "--admin", url, "--token-file", t.file("admin.token")});
    INFO(ok.out, ok.err);
    CHECK(ok.code() == 0);
    CHECK(ok.out.find("no resources yet") != std::string::npos);

    auto none = run_command({kFencegate, "status", "--admin", url});
    CHECK(none.code() == 1);
    CHECK(none.err.find("401") != std::string::npos);

    write_file(t.file("open.token"), secret + "\n");
    ::chmod(t.file("open.token").c_str(), 0644);
    auto open = run_command({kFencegate, "status", "--admin", url, "--token-file", t.file("open.token")});
    CHECK(open.code() == 2);
    CHECK(open.err.find("--token-file") != std::string::npos);
    CHECK(open.err.find("0644") != std::string::npos);
  }

  TEST_CASE("status: bad flags are exit 2, an unreachable admin API exit 1") {
    CHECK(run_command({kFencegate, "status"}).code() == 2);
    CHECK(run_command({kFencegate, "status", "--admin", "ftp://x"}).code() == 2);
    CHECK(run_command({kFencegate, "status", "--admin", "http://127.0.0.1:1", "--bogus"}).code() == 2);
    auto help = run_command({kFencegate, "status", "--help"});
    CHECK(help.code() == 0);
    CHECK(help.out.find("--watch") != std::string::npos);
    auto down = run_command({kFencegate, "status", "--admin", "http://127.0.0.1:" + std::to_string(free_port())});
    CHECK(down.code() == 1);
    CHECK(down.err.find("cannot connect") != std::string::npos);
  }

}  // TEST_SUITE status_cli
