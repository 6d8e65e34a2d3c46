// `fencegate status --admin URL [--token-file PATH] [--watch]`: the status page's resource table in a
// terminal, for hosts without a browser. Reads GET /readyz and GET /v1/resources?limit= of a running
// sidecar's admin API (one screen: as many rows as the terminal has); --watch refreshes it every
// 2 s with writes and refusals per second. Exit codes: 0 shown, 1 the admin API could not be read
// (unreachable, or an answer other than 200), 2 bad flags or token file.
#include <netdb.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cmd/cmd.h"
#include "common/file_checks.h"
#include "common/flags.h"
#include "election_client/http_conn.h"

namespace fencegate::cmd {

namespace {

using json = nlohmann::json;

constexpr const char* kStatusUsage =
    "Usage: fencegate status --admin URL [--token-file PATH] [--watch]\n"
    "\n"
    "Prints the resource table of a running fencegate (as its status page, GET /ui, shows it): per\n"
    "resource its mode, generation, leader, when it advanced, in-flight writes, and with --watch the\n"
    "writes and refusals per second. One screen: as many resources as the terminal has rows.\n"
    "\n"
    "  --admin URL         the admin API, e.g. http://127.0.0.1:9901\n"
    "  --token-file PATH   the admin bearer token (as admin.token_file: mode 0600 or 0400)\n"
    "  --watch             refresh every 2 s until interrupted\n"
    "\n"
    "Exit codes: 0 shown, 1 the admin API could not be read, 2 bad flags or token file.\n";

constexpr flags::Flag kStatusFlags[] = {
    flags::Flag{"--admin"},
    flags::Flag{"--token-file"},
    flags::Flag{"--watch", flags::Arity::none},
};

struct Answer {
  int status = 0;  // 0: no answer
  std::string body;
  std::string error;
};

// One GET over a fresh connection (the admin API answers with Content-Length; Connection: close
// ends it). Blocking, with a 10 s limit on each send and receive.
Answer http_get(const election::HttpUrl& url, const std::string& target, const std::string& token) {
  Answer a;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = ::getaddrinfo(url.host.c_str(), std::to_string(url.port).c_str(), &hints, &res); rc != 0) {
    a.error = std::string("cannot resolve ") + url.host + ": " + ::gai_strerror(rc);
    return a;
  }
  int fd = -1;
  for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd < 0) {
    a.error = "cannot connect to " + url.origin();
    return a;
  }
  std::string req = "GET " + url.path + target + " HTTP/1.1\r\nHost: " + url.host + ":" + std::to_string(url.port) +
                    "\r\nUser-Agent: fencegate-status\r\nAccept: application/json\r\nConnection: close\r\n";
  if (!token.empty()) req += "Authorization: Bearer " + token + "\r\n";
  req += "\r\n";
  for (std::size_t sent = 0; sent < req.size();) {
    const ssize_t n = ::send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      ::close(fd);
      a.error = "cannot send to " + url.origin();
      return a;
    }
    sent += static_cast<std::size_t>(n);
  }
  std::string in;
  char buf[16384];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) in.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  const std::size_t head_end = in.find("\r\n\r\n");
  if (in.compare(0, 9, "HTTP/1.1 ") != 0 || head_end == std::string::npos || in.size() < 12) {
    a.error = "no HTTP answer from " + url.origin();
    return a;
  }
  a.status = std::atoi(in.c_str() + 9);
  a.body = in.substr(head_end + 4);
  return a;
}

int terminal_rows() {
  winsize ws{};
  if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0) return ws.ws_row;
  return 24;
}

std::string text_of(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return "-";
  std::string s = j[key].is_string() ? j[key].get<std::string>() : j[key].dump();
  return s.empty() ? "-" : s;
}

std::string clip(std::string s, std::size_t n) {
  if (s.size() > n) s = s.substr(0, n - 1) + "~";
  return s;
}

struct Counts {
  double writes = -1, refusals = -1;
};

// Prints one screen. Returns 0, or 1 when the admin API could not be read.
int show(const election::HttpUrl& url, const std::string& token, bool watch, std::map<std::string, Counts>* last,
         std::chrono::steady_clock::time_point* last_at) {
  const int rows = terminal_rows();
  const int limit = std::max(1, std::min(1000, rows - 5));
  Answer ready = http_get(url, "/readyz", token);
  Answer res = http_get(url, "/v1/resources?limit=" + std::to_string(limit), token);
  if (res.status != 200) {
    std::string why = res.status == 0 ? res.error : "GET /v1/resources answered " + std::to_string(res.status);
    json p = json::parse(res.body, nullptr, false);
    if (p.is_object() && p.contains("detail") && p["detail"].is_string()) why += ": " + p["detail"].get<std::string>();
    std::fprintf(stderr, "fencegate status: %s\n", why.c_str());
    return 1;
  }
  json j = json::parse(res.body, nullptr, false);
  if (!j.is_object() || !j.contains("resources") || !j["resources"].is_array()) {
    std::fprintf(stderr, "fencegate status: GET /v1/resources: not the expected JSON\n");
    return 1;
  }
  std::string readiness = "ready";
  if (ready.status != 200) {
    json r = json::parse(ready.body, nullptr, false);
    readiness = "NOT READY" + (r.is_object() && r.contains("reason") ? ": " + text_of(r, "reason") : std::string());
  }
  const auto now = std::chrono::steady_clock::now();
  const double dt = last_at->time_since_epoch().count() ? std::chrono::duration<double>(now - *last_at).count() : 0;
  std::map<std::string, Counts> seen;
  std::string out;
  if (watch) out += "\033[H\033[2J";  // home, clear: one screen, redrawn
  char stamp[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%H:%M:%S", std::localtime(&t));
  out += "fencegate " + url.origin() + "  " + readiness + "  " + stamp + "\n\n";
  char line[512];
  std::snprintf(line, sizeof line, "%-28s %-8s %12s %-16s %-24s %8s %9s %10s\n", "RESOURCE", "MODE", "GENERATION",
                "LEADER", "ADVANCED AT", "INFLIGHT", "WRITES/S", "REFUSALS/S");
  out += line;
  for (const auto& r : j["resources"]) {
    const std::string name = text_of(r, "resource");
    Counts c;
    if (r.contains("writes") && r["writes"].is_number()) c.writes = r["writes"].get<double>();
    if (r.contains("refusals") && r["refusals"].is_number()) c.refusals = r["refusals"].get<double>();
    seen[name] = c;
    auto rate = [&](double Counts::*field) {
      auto it = last->find(name);
      if (dt <= 0 || it == last->end() || it->second.*field < 0 || c.*field < 0) return std::string("-");
      char b[32];
      std::snprintf(b, sizeof b, "%.1f", (c.*field - it->second.*field) / dt);
      return std::string(b);
    };
    std::snprintf(line, sizeof line, "%-28s %-8s %12s %-16s %-24s %8s %9s %10s\n", clip(name, 28).c_str(),
                  text_of(r, "mode").c_str(), text_of(r, "generation").c_str(),
                  clip(text_of(r, "advanced_by"), 16).c_str(), text_of(r, "advanced_at").c_str(),
                  text_of(r, "in_flight").c_str(), rate(&Counts::writes).c_str(), rate(&Counts::refusals).c_str());
    out += line;
  }
  if (j["resources"].empty()) out += "(no resources yet)\n";
  if (j.contains("next_cursor"))
    out += "... more resources than fit this screen (GET /v1/resources?limit=&cursor= pages through them)\n";
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
  *last = std::move(seen);
  *last_at = now;
  return 0;
}

}  // namespace

int run_status(const std::vector<std::string>& args) {
  std::vector<std::string> errors;
  std::string admin, token_file;
  bool watch = false;
  const flags::Parsed parsed = flags::parse(args, kStatusFlags);
  for (const flags::Item& item : parsed.items) {
    switch (item.kind) {
      case flags::Kind::help: std::fputs(kStatusUsage, stdout); return 0;
      case flags::Kind::unknown_flag: errors.push_back("unknown flag " + item.name); break;
      case flags::Kind::value_on_boolean: errors.push_back(item.name + " takes no value"); break;
      case flags::Kind::not_a_flag: errors.push_back("unexpected argument \"" + item.arg + "\""); break;
      case flags::Kind::missing_value: errors.push_back(item.name + ": needs a value"); break;
      case flags::Kind::flag:
        if (item.name == "--admin") admin = item.value;
        else if (item.name == "--token-file") token_file = item.value;
        else if (item.name == "--watch") watch = true;
        break;
    }
  }
  election::HttpUrl url;
  std::string why;
  if (admin.empty()) errors.push_back("--admin: required (the admin API's URL, e.g. http://127.0.0.1:9901)");
  else if (!election::parse_http_url(admin, &url, &why)) errors.push_back("--admin: " + why);
  if (!url.path.empty() && url.path.back() == '/') url.path.pop_back();
  std::string token;
  if (!token_file.empty()) {
    std::string text;
    if (std::string e = files::read_secret_file(token_file, &text); !e.empty()) {
      errors.push_back("--token-file: " + e);
    } else {
      const char* ws = " \t\r\n\f\v";
      const std::size_t b = text.find_first_not_of(ws), e2 = text.find_last_not_of(ws);
      token = b == std::string::npos ? std::string() : text.substr(b, e2 - b + 1);
      if (token.empty()) errors.push_back("--token-file: " + token_file + " is empty");
      else if (token.find_first_of(" \t\r\n") != std::string::npos)
        errors.push_back("--token-file: " + token_file + " holds more than one token");
    }
  }
  if (!errors.empty()) {
    for (const auto& e : errors) std::fprintf(stderr, "fencegate status: %s\n", e.c_str());
    std::fputs("(see fencegate status --help)\n", stderr);
    return 2;
  }
  std::map<std::string, Counts> last;
  std::chrono::steady_clock::time_point last_at{};
  for (;;) {
    const int rc = show(url, token, watch, &last, &last_at);
    if (!watch) return rc;
    std::this_thread::sleep_for(std::chrono::seconds(2));  // with --watch a failed read is retried
  }
}

}  // namespace fencegate::cmd
