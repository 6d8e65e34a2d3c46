// The operator's view against the real binary: GET /v1/resources paged and filtered (10,000
// resources in under a second), GET /v1/resources/{id}/readiness (the "ready to enforce" verdict
// with its evidence), and /readyz following whether the store can advance a generation.
#include <atomic>
#include <set>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fence_store/store.h"
#include "tests/integration/ops_harness.h"

using namespace fencegate::testing;

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || !defined(NDEBUG)
constexpr auto kListBound = 15s;  // sanitizer and debug builds are many times slower
#else
constexpr auto kListBound = 1s;
#endif

ProxySpec config_spec(json cfg) {
  ProxySpec s;
  s.config = std::move(cfg);
  return s;
}

// Writes `n` resources named "<prefix>NNNNN" (generation i+1) into the database at `path` before
// the proxy opens it: 10,000 through the data path would test the data path, not the listing.
void seed_resources(const std::string& path, const std::string& prefix, int n) {
  std::string err;
  auto st = fencegate::store::Store::open(path, &err);
  REQUIRE_MESSAGE(st, err);
  std::atomic<int> done{0}, failed{0};
  for (int i = 0; i < n; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "%s%05d", prefix.c_str(), i);
    st->advance(name, i + 1, "seed", [&](const fencegate::store::Status& s) {
      if (!s.ok()) failed.fetch_add(1);
      done.fetch_add(1);
    });
  }
  REQUIRE(eventually([&] { return done.load() == n; }, 60s));
  REQUIRE(failed.load() == 0);
}

}  // namespace

TEST_SUITE("operator_view") {
  TEST_CASE("operator view: /v1/resources pages 10,000 resources by name, filters by prefix and mode, fast") {
    RecordingUpstream up;
    json cfg = config_with_routes(
        {route("/e/{id}/", up.url(), "e-{id}", "enforce"), route("/o/{id}/", up.url(), "o-{id}", "observe")});
    Proxy px(config_spec(cfg));
    FG_LOG_ON_FAILURE(px);
    seed_resources(px.db(), "e-", 7000);
    seed_resources(px.db(), "o-", 3000);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);

  // Unpaged (no limit): every resource at once, as before paging; no next_cursor.
    const auto t0 = Clock::now();
    auto all = admin_get(admin, "/v1/resources");
    const auto took = Clock::now() - t0;
    REQUIRE(all.code() == 200);
    json j = body_json(all);
    REQUIRE(j["resources"].size() == 10000);
    CHECK_FALSE(j.contains("next_cursor"));
    MESSAGE("10,000 resources listed in ", std::chrono::duration_cast<std::chrono::milliseconds>(took).count(), " ms");
    CHECK(took < kListBound);
    const json& first = j["resources"][0];
    CHECK(first["resource"] == "e-00000");
    CHECK(first["generation"] == 1);
    CHECK(first["mode"] == "enforce");
    CHECK(first["advanced_by"] == "seed");
    CHECK(first.contains("in_flight"));
    CHECK(first.contains("advanced_at"));

  // Paged: 1000 at a time, in name order, each name once, the last page without next_cursor.
    std::set<std::string> seen;
    std::string cursor, prev;
    int pages = 0;
    const auto t1 = Clock::now();
    for (;;) {
      json page = admin_json(admin, "/v1/resources?limit=1000" + (cursor.empty() ? "" : "&cursor=" + qenc(cursor)));
      ++pages;
      for (const auto& r : page["resources"]) {
        const std::string name = r["resource"];
        CHECK(name > prev);
        prev = name;
        seen.insert(name);
      }
      if (!page.contains("next_cursor")) break;
      CHECK(page["resources"].size() == 1000);
      cursor = page["next_cursor"];
      REQUIRE(pages < 20);
    }
    CHECK(Clock::now() - t1 < 10 * kListBound);
    CHECK(pages == 10);
    CHECK(seen.size() == 10000);

  // Filters: prefix and mode, with paging.
    json obs = admin_json(admin, "/v1/resources?mode=observe&limit=1000");
    CHECK(obs["resources"].size() == 1000);
    CHECK(obs["resources"][0]["resource"] == "o-00000");
    CHECK(obs.contains("next_cursor"));
    json pre = admin_json(admin, "/v1/resources?prefix=e-0699");
    REQUIRE(pre["resources"].size() == 10);
    CHECK(pre["resources"][9]["resource"] == "e-06999");
    CHECK_FALSE(pre.contains("next_cursor"));
    json last = admin_json(admin, "/v1/resources?prefix=o-&limit=5&cursor=o-02997");
    REQUIRE(last["resources"].size() == 2);  // o-02998, o-02999: the last page
    CHECK_FALSE(last.contains("next_cursor"));
    CHECK(admin_json(admin, "/v1/resources?mode=off")["resources"].empty());
    CHECK(admin_json(admin, "/v1/resources?mode=enforce&prefix=o-")["resources"].empty());

  // Bad queries name the parameter.
    for (const char* bad : {"/v1/resources?limit=0", "/v1/resources?limit=1001", "/v1/resources?limit=x",
                            "/v1/resources?mode=strict", "/v1/resources?sort=name"}) {
      auto r = admin_get(admin, bad);
      INFO(bad, " -> ", describe(r));
      CHECK(r.code() == 400);
    }
  }

  TEST_CASE("operator view: writes and refusals per resource are counted in the listing") {
    RecordingUpstream up;
    Proxy px(config_spec(config_with_routes({route("/", up.url(), "ledger", "enforce")})));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);
    HttpClient c;
    REQUIRE(c.connect(px.port()));
    for (int i = 0; i < 3; ++i) CHECK(is_2xx(c.request("POST", "/w", token(5))));
    CHECK(c.request("POST", "/w", token(4)).code() == 409);
    CHECK(c.request("POST", "/w").code() == 428);
    json r = admin_json(admin, "/v1/resources/ledger");
    CHECK(r["writes"] == 5);
    CHECK(r["refusals"] == 2);
    CHECK(r["generation"] == 5);
  }

  TEST_CASE("operator view: readiness says an observe route is not ready while stale or tokenless writes come in") {
    RecordingUpstream up;
    json cfg =
        config_with_routes({route("/clean/", up.url(), "clean", "observe"), route("/", up.url(), "ledger", "observe")});
    Proxy px(config_spec(cfg));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);

    HttpClient c;
    REQUIRE(c.connect(px.port()));
    CHECK(is_2xx(c.request("POST", "/clean/a", token(3))));
    CHECK(is_2xx(c.request("POST", "/a", token(7, {{"User-Agent", "good/1"}}))));
    for (int i = 0; i < 2; ++i) CHECK(is_2xx(c.request("POST", "/a", {{"User-Agent", "legacy/0.9"}})));  // no token
    CHECK(is_2xx(c.request("POST", "/a", token(6, {{"User-Agent", "zombie/2"}, {"Fencing-Leader", "old-b"}}))));

    json ready;
    REQUIRE(eventually(
        [&] {
          ready = admin_json(admin, "/v1/resources/ledger/readiness");
          return ready.value("missing", 0) == 2 && ready.value("stale", 0) == 1;
        },
        15s));
    INFO(ready.dump(1));
    CHECK(ready["ready"] == false);
    CHECK(ready["window"] == "24h");
    CHECK(ready["mode"] == "observe");
    REQUIRE(ready["callers"].size() == 2);
    std::map<std::string, json> by;
    for (const auto& k : ready["callers"]) by[k["user_agent"]] = k;
    CHECK(by["legacy/0.9"]["missing"] == 2);
    CHECK(by["legacy/0.9"]["stale"] == 0);
    CHECK(by["zombie/2"]["stale"] == 1);
    CHECK(by["zombie/2"]["leader"] == "old-b");
    CHECK(by["zombie/2"]["last_seen"].is_string());
    CHECK(ready["last_seen"].is_string());

    json clean = admin_json(admin, "/v1/resources/clean/readiness?window=1h");
    CHECK(clean["ready"] == true);
    CHECK(clean["missing"] == 0);
    CHECK(clean["stale"] == 0);
    CHECK(clean["callers"].empty());

  // A window that ended before the writes: nothing in it, ready.
    std::this_thread::sleep_for(1100ms);
    CHECK(admin_json(admin, "/v1/resources/ledger/readiness?window=1s")["ready"] == true);

    for (const char* bad : {"?window=0h", "?window=24", "?window=h", "?window=-1h", "?window=2w", "?since=1"}) {
      auto r = admin_get(admin, std::string("/v1/resources/ledger/readiness") + bad);
      INFO(bad, " -> ", describe(r));
      CHECK(r.code() == 400);
    }
    CHECK(request(admin, "POST", "/v1/resources/ledger/readiness", {}, {}, 10s).code() == 405);
  }

}  // TEST_SUITE operator_view

namespace {

// A small tmpfs mounted for one test (needs root and a kernel that lets us mount), unmounted at
// the end. ok() false when it could not be mounted.
class SmallFs {
 public:
  SmallFs(const std::string& at, const char* size) : at_(at) {
    ::mkdir(at.c_str(), 0700);
    ok_ = std::system(
              ("mount -t tmpfs -o size=" + std::string(size) + " fencegate-test " + at + " 2>/dev/null").c_str()) == 0;
  }
  ~SmallFs() {
    if (ok_) (void)std::system(("umount -l " + at_).c_str());
  }
  bool ok() const { return ok_; }

 private:
  std::string at_;
  bool ok_ = false;
};

// Fills the file system at `dir` with one file until it is full.
void fill(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "w");
  REQUIRE(f);
  std::string block(64 * 1024, 'x');
  while (std::fwrite(block.data(), 1, block.size(), f) == block.size()) {
  }
  std::fclose(f);
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND);
  while (fd >= 0 && ::write(fd, "x", 1) == 1) {
  }
  if (fd >= 0) ::close(fd);
}

}  // namespace

TEST_SUITE("operator_view") {
  TEST_CASE(
      "operator view: /readyz is 503 with the reason while the store cannot advance (disk full), 200 again after") {
    RecordingUpstream up;
    Proxy px(config_spec(config_with_routes({route("/{id}", up.url(), "{id}", "enforce")})));
    FG_LOG_ON_FAILURE(px);
    SmallFs fs(px.dir().file("mnt"), "8m");  // room for the WAL sized up front (~4 MiB)
    if (!fs.ok()) {
      MESSAGE("skipped: cannot mount a tmpfs here (needs root); /readyz under a full disk is not tested");
      return;
    }
    write_file(px.dir().file("mnt/fence.db"), "");  // (the store opens a symlink only to what exists)
    REQUIRE(::symlink(px.dir().file("mnt/fence.db").c_str(), px.db().c_str()) == 0);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);
    HttpClient c;
    REQUIRE(c.connect(px.port()));
    CHECK(is_2xx(c.request("POST", "/first", token(1))));
    CHECK(admin_get(admin, "/readyz").code() == 200);

    fill(px.dir().file("mnt/filler"));
    // New resources until one cannot be committed: the WAL, sized up front, takes commits until a
    // checkpoint must grow the database file.
    int refused = 0;
    HttpClient w;
    REQUIRE(w.connect(px.port()));
    for (int i = 0; i < 6000 && refused == 0; ++i) {
      auto r = w.request("POST", "/new" + std::to_string(i) + std::string(200, 'n'), token(1));
      if (r.code() == 503) ++refused;
      else REQUIRE_MESSAGE(is_2xx(r), describe(r));
    }
    REQUIRE(refused > 0);
    auto rz = admin_get(admin, "/readyz");
    INFO(describe(rz));
    CHECK(rz.code() == 503);
    CHECK(body_json(rz).value("reason", std::string()).find("store") != std::string::npos);
    // It stays not ready while advances still fail (the store's idle check must not call it healthy).
    std::this_thread::sleep_for(2500ms);
    CHECK(admin_get(admin, "/readyz").code() == 503);
    ::unlink(px.dir().file("mnt/filler").c_str());
    CHECK(eventually([&] { return admin_get(admin, "/readyz").code() == 200; }, 20s));
    HttpClient after;
    REQUIRE(after.connect(px.port()));
    CHECK(is_2xx(after.request("POST", "/after", token(1))));
  }

}  // TEST_SUITE operator_view

TEST_SUITE("operator_view") {
  TEST_CASE("operator view: GET /ui is one self-contained page; only its own same-origin reads are let in") {
    RecordingUpstream up;
    Proxy px(config_spec(config_with_routes({route("/", up.url(), "ledger", "enforce")})));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);
    const std::string host = "127.0.0.1:" + std::to_string(admin);

    auto page = admin_get(admin, "/ui", {{"Sec-Fetch-Site", "none"}});  // typed into the address bar
    REQUIRE(page.code() == 200);
    CHECK(page.response.header("Content-Type").find("text/html") == 0);
    const std::string csp = page.response.header("Content-Security-Policy");
    CHECK(csp.find("default-src 'none'") != std::string::npos);
    CHECK(csp.find("connect-src 'self'") != std::string::npos);
    CHECK(csp.find("frame-ancestors 'none'") != std::string::npos);
    CHECK(page.response.header("X-Frame-Options") == "DENY");
  // No external assets: nothing is loaded from anywhere but the page itself.
    for (const char* ext : {"http://", "https://", "//cdn", "src=\"", "href=\"", "@import", "url("})
      CHECK_MESSAGE(page.response.body.find(ext) == std::string::npos, "the page refers to ", ext);

  // The page's own reads: same-origin, with or without an Origin of this very host.
    CHECK(admin_get(admin, "/v1/resources", {{"Sec-Fetch-Site", "same-origin"}}).code() == 200);
    CHECK(
        admin_get(admin, "/v1/audit", {{"Host", host}, {"Sec-Fetch-Site", "same-origin"}, {"Origin", "http://" + host}})
            .code() == 200);
  // Anything else a browser marks stays refused.
    CHECK(admin_get(admin, "/v1/resources", {{"Sec-Fetch-Site", "cross-site"}}).code() == 403);
    CHECK(admin_get(admin, "/v1/resources", {{"Sec-Fetch-Site", "same-site"}}).code() == 403);
    CHECK(admin_get(admin, "/ui", {{"Sec-Fetch-Site", "cross-site"}}).code() == 403);
    CHECK(
        admin_get(admin, "/v1/audit", {{"Sec-Fetch-Site", "same-origin"}, {"Origin", "http://evil.example"}}).code() ==
        403);
    CHECK(admin_get(admin, "/v1/audit", {{"Origin", "http://" + host}}).code() == 403);  // no Sec-Fetch-Site
  // A DNS-rebinding page is same-origin to the browser, but its Host is its own name.
    CHECK(admin_get(admin, "/ui", {{"Host", "evil.example:" + std::to_string(admin)}}).code() == 403);
    CHECK(admin_get(admin, "/v1/resources", {{"Host", "evil.example"}, {"Sec-Fetch-Site", "same-origin"}}).code() ==
          403);
  // A write from the page, even with the custom header: no token is configured, so never.
    const Headers ui_write{{"Host", host},
                           {"Sec-Fetch-Site", "same-origin"},
                           {"Origin", "http://" + host},
                           {"Fencegate-UI", "1"}};
    auto w = request(admin, "POST", "/v1/resources/ledger/fence", ui_write, R"({"generation": 9})", 10s);
    CHECK(w.code() == 403);
    CHECK(admin_json(admin, "/v1/resources")["resources"].empty());  // nothing was fenced
    CHECK(request(admin, "POST", "/ui", {}, {}, 10s).code() == 405);
  }

  TEST_CASE(
      "operator view: with an admin token the page loads without it, reads need it, a write needs it and the header") {
    RecordingUpstream up;
    TempDir t("fencegate-ui-token");
    write_file(t.file("admin.token"), "s3cret-token-for-ui-tests\n");
    ::chmod(t.file("admin.token").c_str(), 0600);
    json cfg = config_with_routes({route("/", up.url(), "ledger", "enforce")});
    cfg["admin"] = {{"listen", "127.0.0.1:0"}, {"token_file", t.file("admin.token")}};
    Proxy px(config_spec(cfg));
    FG_LOG_ON_FAILURE(px);
    FG_START(px);
    FG_ADMIN_PORT(admin, px);
    const std::string host = "127.0.0.1:" + std::to_string(admin);
    const std::string tok = "s3cret-token-for-ui-tests";

    CHECK(admin_get(admin, "/ui").code() == 200);  // static: no data in it
    CHECK(admin_get(admin, "/v1/resources", {{"Sec-Fetch-Site", "same-origin"}}).code() == 401);
    CHECK(admin_get(admin, "/v1/resources", bearer(tok, {{"Sec-Fetch-Site", "same-origin"}})).code() == 200);
    const Headers page{{"Host", host}, {"Sec-Fetch-Site", "same-origin"}, {"Origin", "http://" + host}};
  // Token but no custom header: refused (a cross-site form cannot add a header; neither can this).
    CHECK(request(admin, "POST", "/v1/resources/ledger/fence", bearer(tok, page), R"({"generation": 9})", 10s).code() ==
          403);
    Headers with_header = page;
    with_header.emplace_back("Fencegate-UI", "1");
  // Header but no token: 401.
    CHECK(request(admin, "POST", "/v1/resources/ledger/fence", with_header, R"({"generation": 9})", 10s).code() == 401);
  // Both: the fence is made.
    auto ok =
        request(admin, "POST", "/v1/resources/ledger/fence", bearer(tok, with_header), R"({"generation": 9})", 30s);
    INFO(describe(ok));
    CHECK(ok.code() == 200);
    CHECK(admin_json(admin, "/v1/resources/ledger", 200, bearer(tok))["generation"] == 9);
  }

}  // TEST_SUITE operator_view

TEST_SUITE("operator_view") {

TEST_CASE("operator view: a request's W3C traceparent is kept in its audit row and its log line") {
  RecordingUpstream up;
  Proxy px(config_spec(config_with_routes(
      {route("/obs/", up.url(), "obs", "observe"), route("/", up.url(), "ledger", "enforce")})));
  FG_LOG_ON_FAILURE(px);
  FG_START(px);
  FG_ADMIN_PORT(admin, px);
  const std::string tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  HttpClient c;
  REQUIRE(c.connect(px.port()));
  CHECK(is_2xx(c.request("POST", "/w", token(5))));
  CHECK(c.request("POST", "/w", token(4, {{"traceparent", tp}})).code() == 409);  // durable audit
  CHECK(is_2xx(c.request("POST", "/obs/w", {{"traceparent", tp}})));               // observe: background audit
  CHECK(c.request("POST", "/w", token(3, {{"traceparent", "00-not-a-trace"}})).code() == 409);
  CHECK(c.request("POST", "/w", token(3, {{"traceparent", tp}, {"traceparent", tp}})).code() == 409);

  json rows;
  REQUIRE(eventually(
      [&] {
        rows = admin_json(admin, "/v1/audit")["rows"];
        return rows.size() == 4;
      },
      15s));
  INFO(rows.dump(1));
  // Newest first: two stale writes with a bad or repeated traceparent, then observe's, then the first stale one.
  CHECK(rows[0]["traceparent"] == "");
  CHECK(rows[1]["traceparent"] == "");
  std::set<std::string> with;
  for (const auto& r : rows)
    if (r["traceparent"] == tp) with.insert(r["decision"].get<std::string>());
  CHECK(with == std::set<std::string>{"rejected_stale", "would_reject_missing"});
  // Findable from the trace in the log too.
  CHECK(eventually([&] { return px.log().find("\"traceparent\":\"" + tp + "\"") != std::string::npos; }));
  // And in `fencegate audit --json`.
  auto cli = run_command({kFencegate, "audit", "--db", px.db(), "--json", "--decision", "rejected_stale"});
  INFO(cli.out, cli.err);
  CHECK(cli.code() == 0);
  CHECK(cli.out.find("\"traceparent\":\"" + tp + "\"") != std::string::npos);
}

TEST_CASE("operator view: a database from before traceparent gains the column when opened, old rows read empty") {
  TempDir t("fencegate-tp-migrate");
  const std::string db = t.file("fence.db");
  // The schema as it was (version 1, no traceparent column), with one audit row.
  auto made = run_command(
      {"/usr/bin/sqlite3", db,
       "CREATE TABLE resources(resource TEXT PRIMARY KEY, generation INTEGER NOT NULL, advanced_at_ms INTEGER NOT "
       "NULL, advanced_by TEXT NOT NULL);"
       "CREATE TABLE audit(id INTEGER PRIMARY KEY AUTOINCREMENT, time_ms INTEGER NOT NULL, resource TEXT NOT NULL, "
       "decision TEXT NOT NULL, presented_generation INTEGER NOT NULL, current_generation INTEGER NOT NULL, method "
       "TEXT NOT NULL, target TEXT NOT NULL, client TEXT NOT NULL, leader TEXT NOT NULL, mode TEXT NOT NULL, "
       "user_agent TEXT NOT NULL);"
       "CREATE INDEX audit_resource_id ON audit(resource, id); CREATE INDEX audit_decision_id ON audit(decision, id);"
       "CREATE INDEX audit_time ON audit(time_ms);"
       "INSERT INTO audit VALUES(1, 1740823200000, 'ledger', 'rejected_stale', 3, 5, 'POST', '/w', '127.0.0.1', '', "
       "'enforce', 'old/1');"
       "PRAGMA user_version = 1;"},
      10s);
  REQUIRE_MESSAGE(made.code() == 0, made.err);
  // Read-only first (fencegate audit): the old rows read with an empty traceparent.
  auto before = run_command({kFencegate, "audit", "--db", db, "--json"});
  INFO(before.out, before.err);
  CHECK(before.code() == 0);
  CHECK(before.out.find("\"traceparent\":\"\"") != std::string::npos);
  // Opened for writing: the column is added, the old row kept, new rows carry the value.
  std::string err;
  {
    auto st = fencegate::store::Store::open(db, &err);
    REQUIRE_MESSAGE(st, err);
    fencegate::store::AuditRow row;
    row.resource = "ledger";
    row.decision = "rejected_stale";
    row.traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    std::atomic<bool> done{false};
    st->append_audit(row, [&](const fencegate::store::Status& s) {
      CHECK(s.ok());
      done = true;
    });
    REQUIRE(eventually([&] { return done.load(); }));
    fencegate::store::Status qs = fencegate::store::Status::OK();
    auto rows = st->query_audit({}, &qs);
    REQUIRE(qs.ok());
    REQUIRE(rows.size() == 2);
    CHECK(rows[0].row.traceparent == row.traceparent);
    CHECK(rows[1].row.traceparent.empty());
    CHECK(rows[1].row.user_agent == "old/1");
  }
  auto cols = run_command({"/usr/bin/sqlite3", "-readonly", db, "SELECT count(*) FROM pragma_table_info('audit') WHERE "
                                                                "name = 'traceparent'; PRAGMA user_version;"},
                          10s);
  CHECK(cols.out == "1\n1\n");
}

}  // TEST_SUITE operator_view
