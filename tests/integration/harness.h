// Integration-test harness: runs the real fencegate binary (FENCEGATE_BINARY) in front of a
// RecordingUpstream, with its own port, temp dir and database, and helpers for the assertions
// every test file shares (problem+json, audit rows).
//
// On failure, tests print the proxy's log: put FG_LOG_ON_FAILURE(proxy) at the top of a test
// (a lazy doctest INFO, evaluated only when an assertion fails).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "fence_store/store.h"
#include "tests/support/http_client.h"
#include "tests/support/process.h"
#include "tests/support/upstream.h"

#ifndef FENCEGATE_BINARY
#error "FENCEGATE_BINARY must name the fencegate binary"
#endif

namespace fencegate::testing {

using json = nlohmann::json;
using namespace std::chrono_literals;

inline const std::string kFencegate = FENCEGATE_BINARY;

// How to run one proxy. Either the flag form (upstream set) or the config-file form (config set:
// a JSON object with "routes" and any other keys; "listen", "db" and "threads" are filled in).
struct ProxySpec {
  std::string upstream;                // --upstream URL (flag form)
  std::vector<std::string> args;       // extra flags after `serve`
  std::optional<json> config;          // config-file form
  std::optional<rlim_t> fsize_limit;   // RLIMIT_FSIZE for the proxy process
  int threads = 2;
};

class Proxy {
 public:
  explicit Proxy(ProxySpec spec)
      : spec_(std::move(spec)), dir_(std::make_unique<TempDir>("fencegate-itest")), port_(free_port()) {}
  ~Proxy() { process_.reset(); }

  // Starts the binary and waits until it accepts connections. Returns true iff it does. On its
  // first start, a port another test process took meanwhile (free_port() only picks one that is
  // free at the time) is given up for another one, a few times.
  bool start(std::chrono::milliseconds timeout = 15s) {
    for (int attempt = 0;; ++attempt) {
      if (start_once(timeout)) return true;
      if (starts_ > 1 || attempt >= 3 || process_->running() ||
          log().find("Address already in use") == std::string::npos)
        return false;
      starts_ = 0;
      port_ = free_port();
    }
  }

 private:
  bool start_once(std::chrono::milliseconds timeout) {
    std::vector<std::string> argv{kFencegate, "serve"};
    if (spec_.config) {
      json c = *spec_.config;
      c["listen"] = "127.0.0.1:" + std::to_string(port_);
      c["db"] = db();
      if (!c.contains("threads")) c["threads"] = spec_.threads;
      if (!c.contains("admin")) c["admin"] = json::object({{"listen", "127.0.0.1:0"}});  // never the fixed default port
      write_file(dir_->file("fencegate.json"), c.dump(2));
      argv.insert(argv.end(), {"--config", dir_->file("fencegate.json")});
    } else {
      argv.insert(argv.end(), {"--listen", "127.0.0.1:" + std::to_string(port_), "--upstream", spec_.upstream,
                               "--db", db(), "--threads", std::to_string(spec_.threads),
                               // The admin API is not under test here; keep it off the fixed default port.
                               "--admin-listen", "127.0.0.1:0"});
    }
    argv.insert(argv.end(), spec_.args.begin(), spec_.args.end());
    ProcessOptions o;
    o.log_path = dir_->file("fencegate.log");
    o.fsize_limit = spec_.fsize_limit;
    std::string cmd;
    for (const auto& a : argv) cmd += a + " ";
    write_file(dir_->file("command.txt"), cmd + "\n");
    process_ = std::make_unique<Process>(Process::start(argv, o));
    ++starts_;
    return process_->wait_for_port(port_, timeout);
  }

 public:

  // SIGTERM and wait (SIGKILL after 5 s).
  ExitStatus stop() { return process_ ? process_->stop(5s) : ExitStatus{}; }
  // kill -9 and reap.
  ExitStatus kill9() {
    if (!process_) return {};
    process_->kill(SIGKILL);
    return process_->wait();
  }
  Process& process() { return *process_; }
  bool running() { return process_ && process_->running(); }

  std::uint16_t port() const { return port_; }
  std::string db() const { return dir_->file("fence.db"); }
  const TempDir& dir() const { return *dir_; }
  std::string log(std::size_t max = 16 * 1024) const { return read_file(dir_->file("fencegate.log"), max); }
  std::string log_for_failure() const {
    return "fencegate command: " + read_file(dir_->file("command.txt")) + "fencegate log (" +
           dir_->file("fencegate.log") + ", last 16 KiB):\n" + log();
  }

 private:
  ProxySpec spec_;
  std::unique_ptr<TempDir> dir_;
  std::uint16_t port_;
  std::unique_ptr<Process> process_;
  int starts_ = 0;
};

#define FG_LOG_ON_FAILURE(proxy) INFO((proxy).log_for_failure())
#define FG_START(proxy) REQUIRE_MESSAGE((proxy).start(), "fencegate did not start listening\n", (proxy).log_for_failure())

// One route object for a config file.
inline json route(const std::string& prefix, const std::string& upstream, const std::string& resource,
                  const std::string& mode = "enforce") {
  json r;
  r["prefix"] = prefix;
  r["upstream"] = upstream;
  r["resource"] = resource;
  r["mode"] = mode;
  return r;
}

inline json config_with_routes(std::vector<json> routes) {
  json c;
  c["routes"] = json::array();
  for (auto& r : routes) c["routes"].push_back(std::move(r));
  return c;
}

inline Headers token(std::int64_t g, Headers more = {}) {
  more.emplace_back("Fencing-Token", std::to_string(g));
  return more;
}

// Returns true iff the response is 2xx.
inline bool is_2xx(const ReadResult& r) { return r.ok() && r.response.status >= 200 && r.response.status < 300; }

// Parses a problem+json body; an empty object if it does not parse.
inline json body_json(const ReadResult& r) {
  return json::parse(r.response.body, nullptr, /*allow_exceptions=*/false);
}

// Checks an RFC 9457 rejection: status, content type, required members and, when given, the
// resource and generations (presented: nullopt = not checked; 0 = "none": null or 0 accepted).
inline void check_problem(const ReadResult& r, int status, std::optional<std::string> resource = std::nullopt,
                          std::optional<std::int64_t> presented = std::nullopt,
                          std::optional<std::int64_t> current = std::nullopt, bool full_fence_members = true) {
  INFO("response: ", describe(r));
  REQUIRE(r.ok());
  CHECK(r.response.status == status);
  CHECK(r.response.header("Content-Type").rfind("application/problem+json", 0) == 0);
  json j = body_json(r);
  REQUIRE_MESSAGE(j.is_object(), "body is not a JSON object");
  for (const char* k : {"type", "title", "status", "detail"}) CHECK_MESSAGE(j.contains(k), "missing member ", k);
  if (j.contains("status")) CHECK(j["status"] == status);
  if (full_fence_members)
    for (const char* k : {"resource", "presented_generation", "current_generation"})
      CHECK_MESSAGE(j.contains(k), "missing member ", k);
  if (resource && j.contains("resource")) CHECK(j["resource"] == *resource);
  if (presented && j.contains("presented_generation")) {
    if (*presented == 0)
      CHECK((j["presented_generation"].is_null() || j["presented_generation"] == 0));
    else
      CHECK(j["presented_generation"] == *presented);
  }
  if (current && j.contains("current_generation")) CHECK(j["current_generation"] == *current);
  if (current) CHECK(r.response.header("Fencing-Generation") == std::to_string(*current));
}

// Every audit row in the database, oldest first (read-only open; works while the proxy runs).
inline std::vector<store::AuditRow> read_audit(const std::string& db) {
  std::string err;
  auto s = store::Store::open_readonly(db, &err);
  REQUIRE_MESSAGE(s != nullptr, "open_readonly(", db, "): ", err);
  std::vector<store::AuditRow> rows;
  store::AuditQuery q;
  q.limit = 1000;
  while (true) {
    store::Status st = store::Status::OK();
    auto page = s->query_audit(q, &st);
    REQUIRE_MESSAGE(st.ok(), "query_audit: ", st.message());
    for (auto& rec : page) rows.push_back(rec.row);
    if (page.size() < std::size_t(q.limit)) break;
    q.before_id = page.back().id;
  }
  std::reverse(rows.begin(), rows.end());
  return rows;
}

inline std::vector<store::ResourceState> read_resources(const std::string& db) {
  std::string err;
  auto s = store::Store::open_readonly(db, &err);
  REQUIRE_MESSAGE(s != nullptr, "open_readonly(", db, "): ", err);
  return s->load_all();
}

inline std::string describe(const store::AuditRow& r) {
  return r.decision + " resource=" + r.resource + " presented=" + std::to_string(r.presented_generation) +
         " current=" + std::to_string(r.current_generation) + " " + r.method + " " + r.target + " leader=" +
         r.leader + " mode=" + r.mode + " client=" + r.client;
}

inline std::string describe(const std::vector<store::AuditRow>& rows) {
  std::string s;
  for (const auto& r : rows) s += "  " + describe(r) + "\n";
  return s;
}

// Sends one request and returns how long the response took.
struct Timed {
  ReadResult result;
  std::chrono::milliseconds elapsed{};
};
inline Timed timed_request(std::uint16_t port, std::string method, std::string target, Headers h = {},
                           std::string body = {}, std::chrono::milliseconds timeout = 15s) {
  auto t0 = Clock::now();
  Timed t;
  t.result = request(port, method, target, h, body, timeout);
  t.elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0);
  return t;
}

inline std::int64_t ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}

}  // namespace fencegate::testing
