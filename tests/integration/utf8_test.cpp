// UTF-8 end to end (issue 26): request bytes that are UTF-8 come out as the same characters in
// every JSON the product writes about them -- the log line on stderr, the problem+json body, the
// audit row in the admin API and `fencegate audit --json` -- and not as \u00c3-style escapes of
// single bytes; bytes that are not UTF-8 come out as U+FFFD in JSON that parses.
//
// What can carry UTF-8 today: the leader id (Fencing-Leader) and the User-Agent, which the log
// line and the audit row record. A resource name cannot: route templates and captured segments are
// limited to [A-Za-z0-9._~:-] and the router refuses targets with bytes >= 0x80 (config/router.h),
// so the data path's problem body (written by the JSON writer, common/json.h) is checked to be
// strict JSON with its resource intact, and the target carries percent-encoded UTF-8
// ("/caf%C3%A9"), which stays as sent. A problem body that does echo UTF-8 is the admin API's
// fence endpoint naming an unknown key of its JSON body.
#include <sstream>

#include "tests/integration/ops_harness.h"

using namespace fencegate::testing;

namespace {

const std::string kFffd = "\xEF\xBF\xBD";  // U+FFFD

ProxySpec billing_spec(const RecordingUpstream& up) {
  ProxySpec s;
  s.config = config_with_routes({route("/", up.url(), "billing")});
  return s;
}

// The log line of the write refused with `decision`, parsed (a strict parser: it fails on
// invalid UTF-8); an empty object if none appears within a few seconds.
json rejection_log_line(const Proxy& px, const std::string& decision) {
  json found = json::object();
  eventually(
      [&] {
        std::istringstream in(px.log(1 << 20));
        for (std::string line; std::getline(in, line);) {
          if (line.find("\"rejected write\"") == std::string::npos) continue;
          json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
          REQUIRE_MESSAGE(!j.is_discarded(), "log line is not valid JSON: ", line);
          if (j.value("decision", "") != decision) continue;
          found = j;
          found["_raw"] = line;
          return true;
        }
        return false;
      },
      5s);
  return found;
}

// The audit rows of the admin API (newest first), with the admin body checked to be strict JSON.
std::vector<json> admin_audit(std::uint16_t admin) {
  auto r = admin_get(admin, "/v1/audit?limit=10");
  REQUIRE(r.ok());
  REQUIRE(r.response.status == 200);
  json j = json::parse(r.response.body, nullptr, /*allow_exceptions=*/false);
  REQUIRE_MESSAGE(!j.is_discarded(), "admin audit body is not valid JSON: ", r.response.body);
  std::vector<json> rows;
  for (auto& row : j["rows"]) rows.push_back(row);
  return rows;
}

// `fencegate audit --json` on the proxy's database: one strict-JSON object per line.
std::vector<json> cli_audit(const Proxy& px) {
  auto r = run_command({kFencegate, "audit", "--db", px.db(), "--json"}, 20s);
  REQUIRE_FALSE(r.timed_out);
  INFO(r.err);
  REQUIRE(r.code() == 0);
  std::vector<json> rows;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    REQUIRE_MESSAGE(!j.is_discarded(), "fencegate audit --json line is not valid JSON: ", line);
    rows.push_back(j);
  }
  return rows;
}

// Advances "billing" to 5, then sends a stale write (generation 3) with these header values.
ReadResult stale_write(const Proxy& px, const std::string& leader, const std::string& user_agent,
                       const std::string& target) {
  REQUIRE(is_2xx(request(px.port(), "PUT", "/item", token(5, {{"Fencing-Leader", "L5"}}), "x")));
  return request(px.port(), "PUT", target, token(3, {{"Fencing-Leader", leader}, {"User-Agent", user_agent}}), "x");
}

}  // namespace

TEST_SUITE("utf8") {

TEST_CASE("utf8: a UTF-8 leader id and user agent come out intact in the log, the problem, the audit row and audit --json") {
  RecordingUpstream up;
  Proxy px(billing_spec(up));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  FG_ADMIN_PORT(admin, px);

  const std::string leader = "leader-\xC3\xA9-\xE2\x82\xAC-\xF0\x9F\x98\x80";  // é, €, U+1F600
  const std::string agent = "agent-caf\xC3\xA9/1.0";
  const std::string target = "/caf%C3%A9";
  auto r = stale_write(px, leader, agent, target);

  // The problem body: strict JSON (check_problem parses it), the resource intact.
  check_problem(r, 409, std::string("billing"), 3, 5);
  CHECK(r.response.body.find("\\u00") == std::string::npos);

  // The log line.
  json line = rejection_log_line(px, "rejected_stale");
  REQUIRE_MESSAGE(line.contains("leader"), "no rejected_stale log line");
  CHECK(line["leader"] == leader);
  CHECK(line["resource"] == "billing");
  CHECK(line["target"] == target);
  CHECK(line["_raw"].get<std::string>().find(leader) != std::string::npos);  // raw bytes, not \u escapes
  CHECK(line["_raw"].get<std::string>().find("\\u00") == std::string::npos);

  // The audit row, in the admin API and in `fencegate audit --json`.
  auto rows = admin_audit(admin);
  REQUIRE(!rows.empty());
  CHECK(rows[0]["decision"] == "rejected_stale");
  CHECK(rows[0]["leader"] == leader);
  CHECK(rows[0]["user_agent"] == agent);
  CHECK(rows[0]["target"] == target);

  // A problem body that carries request text: the fence endpoint names the unknown key.
  auto fence = request(admin, "POST", "/v1/resources/billing/fence", {{"Content-Type", "application/json"}},
                       "{\"generation\": 9, \"caf\xC3\xA9\": 1}", 20s);
  check_problem(fence, 400, std::nullopt, std::nullopt, std::nullopt, /*full_fence_members=*/false);
  CHECK(body_json(fence).value("detail", "") == "unknown key \"caf\xC3\xA9\"");

  auto cli = cli_audit(px);
  REQUIRE(!cli.empty());
  CHECK(cli[0]["decision"] == "rejected_stale");
  CHECK(cli[0]["leader"] == leader);
  CHECK(cli[0]["user_agent"] == agent);
  CHECK(cli[0]["resource"] == "billing");
}

TEST_CASE("utf8: invalid UTF-8 in logged and audited header values becomes U+FFFD in valid JSON") {
  RecordingUpstream up;
  Proxy px(billing_spec(up));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  FG_ADMIN_PORT(admin, px);

  const std::string leader = "bad-\xFF-leader";  // 0xFF is never UTF-8
  const std::string agent = "agent-\xC0\xAF-x";  // an overlong '/': two maximal subparts
  auto r = stale_write(px, leader, agent, "/item");
  check_problem(r, 409, std::string("billing"), 3, 5);

  const std::string leader_read = "bad-" + kFffd + "-leader";
  const std::string agent_read = "agent-" + kFffd + kFffd + "-x";

  json line = rejection_log_line(px, "rejected_stale");  // parsed strictly: valid UTF-8 throughout
  REQUIRE_MESSAGE(line.contains("leader"), "no rejected_stale log line");
  CHECK(line["leader"] == leader_read);

  auto rows = admin_audit(admin);  // the row keeps the bytes as sent; its JSON replaces them
  REQUIRE(!rows.empty());
  CHECK(rows[0]["leader"] == leader_read);
  CHECK(rows[0]["user_agent"] == agent_read);

  auto cli = cli_audit(px);
  REQUIRE(!cli.empty());
  CHECK(cli[0]["leader"] == leader_read);
  CHECK(cli[0]["user_agent"] == agent_read);
}

}  // TEST_SUITE("utf8")
