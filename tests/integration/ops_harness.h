// Helpers for the operations tests (admin API, reload, shutdown): finding the admin port a proxy
// bound (it runs with --admin-listen 127.0.0.1:0 and logs the address), reading Prometheus text,
// editing a running proxy's config file, polling.
//
// Kept apart from harness.h so the shared harness stays as it is; everything here builds on it.
#pragma once

#include <cctype>
#include <cstdio>
#include <ctime>
#include <map>
#include <sstream>

#include "tests/integration/harness.h"

namespace fencegate::testing {

// Returns true iff pred() holds within timeout (polled every 20 ms).
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout = 10s) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return pred();
}

inline std::string proxy_log_path(const Proxy& px) { return px.dir().file("fencegate.log"); }

// Size of the proxy's log now: pass it to admin_port() after a restart so the previous run's
// "admin listening" line is not taken.
inline std::size_t log_size(const Proxy& px) { return read_file(proxy_log_path(px)).size(); }

// Port of the admin listener, from the `{"msg":"admin listening","address":"HOST:PORT"}` log line
// written at or after byte `from` of the log. 0 if none appears within timeout.
inline std::uint16_t admin_port(const Proxy& px, std::size_t from = 0, std::chrono::milliseconds timeout = 15s) {
  std::uint16_t port = 0;
  eventually(
      [&] {
        std::string log = read_file(proxy_log_path(px));
        if (log.size() <= from) return false;
        std::istringstream in(log.substr(from));
        for (std::string line; std::getline(in, line);) {
          if (line.find("\"admin listening\"") == std::string::npos) continue;
          json j = json::parse(line, nullptr, false);
          if (!j.is_object() || !j.contains("address") || !j["address"].is_string()) continue;
          std::string a = j["address"];
          auto colon = a.rfind(':');
          if (colon == std::string::npos) continue;
          port = static_cast<std::uint16_t>(std::stoi(a.substr(colon + 1)));
          return port != 0;
        }
        return false;
      },
      timeout);
  return port;
}

#define FG_ADMIN_PORT(var, proxy, ...)                    \
  const std::uint16_t var = admin_port(proxy __VA_OPT__(,) __VA_ARGS__); \
  REQUIRE_MESSAGE(var != 0, "no \"admin listening\" line in the log\n", (proxy).log_for_failure())

inline Headers bearer(const std::string& token, Headers more = {}) {
  more.emplace_back("Authorization", "Bearer " + token);
  return more;
}

// GET on the admin listener.
inline ReadResult admin_get(std::uint16_t port, const std::string& target, const Headers& h = {}) {
  return request(port, "GET", target, h, {}, 20s);
}

// GET returning the JSON body; fails the test unless the status is `status`.
inline json admin_json(std::uint16_t port, const std::string& target, int status = 200, const Headers& h = {}) {
  auto r = admin_get(port, target, h);
  INFO("GET ", target, " -> ", describe(r));
  REQUIRE(r.ok());
  CHECK(r.response.status == status);
  json j = body_json(r);
  CHECK(j.is_object());
  return j;
}

// --- Prometheus text ---------------------------------------------------------------------------

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// Parses the sample lines of a Prometheus text exposition (comments skipped). Label values here
// never contain `"` or `,` escapes, which keeps the parser small.
inline std::vector<Sample> parse_prometheus(const std::string& text) {
  std::vector<Sample> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    Sample s;
    std::size_t brace = line.find('{');
    std::size_t space;
    if (brace != std::string::npos && brace < line.find(' ')) {
      s.name = line.substr(0, brace);
      std::size_t close = line.find('}', brace);
      if (close == std::string::npos) continue;
      std::string body = line.substr(brace + 1, close - brace - 1);
      std::size_t p = 0;
      while (p < body.size()) {
        std::size_t eq = body.find('=', p);
        if (eq == std::string::npos || eq + 1 >= body.size() || body[eq + 1] != '"') break;
        std::size_t endq = body.find('"', eq + 2);
        if (endq == std::string::npos) break;
        s.labels[body.substr(p, eq - p)] = body.substr(eq + 2, endq - eq - 2);
        p = endq + 1;
        if (p < body.size() && body[p] == ',') ++p;
      }
      space = close + 1;
    } else {
      space = line.find(' ');
      if (space == std::string::npos) continue;
      s.name = line.substr(0, space);
    }
    try {
      s.value = std::stod(line.substr(space + 1));
    } catch (...) {
      continue;
    }
    out.push_back(std::move(s));
  }
  return out;
}

// The value of the sample `name` whose labels include all of `labels`; nullopt if absent.
inline std::optional<double> sample(const std::vector<Sample>& ss, const std::string& name,
                                    const std::map<std::string, std::string>& labels = {}) {
  for (const auto& s : ss) {
    if (s.name != name) continue;
    bool all = true;
    for (const auto& [k, v] : labels) {
      auto it = s.labels.find(k);
      if (it == s.labels.end() || it->second != v) all = false;
    }
    if (all) return s.value;
  }
  return std::nullopt;
}

inline std::string metrics_text(std::uint16_t admin, const Headers& h = {}) {
  auto r = admin_get(admin, "/metrics", h);
  INFO(describe(r));
  REQUIRE(r.code() == 200);
  return r.response.body;
}

// --- Config file -------------------------------------------------------------------------------

inline std::string config_path(const Proxy& px) { return px.dir().file("fencegate.json"); }

inline json read_config(const Proxy& px) {
  json j = json::parse(read_file(config_path(px)), nullptr, false);
  REQUIRE_MESSAGE(j.is_object(), "cannot parse ", config_path(px));
  return j;
}

inline void write_config(const Proxy& px, const json& j) { write_file(config_path(px), j.dump(2)); }

// --- Time ---------------------------------------------------------------------------------------

inline std::int64_t wall_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

// "2026-11-29T10:00:00.123Z"
inline std::string rfc3339_ms(std::int64_t unix_ms) {
  std::time_t secs = static_cast<std::time_t>(unix_ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(unix_ms % 1000));
  return buf;
}

// Percent-encodes a query parameter value ('+' and ':' included).
inline std::string qenc(const std::string& v) {
  std::string o;
  for (unsigned char c : v) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      o += static_cast<char>(c);
    } else {
      char b[4];
      std::snprintf(b, sizeof b, "%%%02X", c);
      o += b;
    }
  }
  return o;
}

}  // namespace fencegate::testing
