#include "election_client/log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>

namespace fencegate::election::log {

namespace {
std::atomic<int> g_level{static_cast<int>(Level::info)};
const char* name(Level l) {
  switch (l) {
    case Level::debug: return "debug";
    case Level::info: return "info";
    case Level::warn: return "warn";
    case Level::error: return "error";
  }
  return "info";
}
}  // namespace

void set_level(Level l) { g_level.store(static_cast<int>(l)); }

std::string json_quote(std::string_view s) {
  std::string o;
  o.reserve(s.size() + 2);
  o += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\r': o += "\\r"; break;
      case '\t': o += "\\t"; break;
      default:
        if (c < 0x20 || c >= 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          o += buf;
        } else {
          o += static_cast<char>(c);
        }
    }
  }
  o += '"';
  return o;
}

void write(Level l, std::string_view msg, std::initializer_list<Field> fields) {
  if (static_cast<int>(l) < g_level.load(std::memory_order_relaxed)) return;
  using namespace std::chrono;
  auto now = system_clock::now();
  std::time_t t = system_clock::to_time_t(now);
  auto ms = duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char ts[80];
  std::snprintf(ts, sizeof ts, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  std::string line = "{\"ts\":\"";
  line += ts;
  line += "\",\"level\":\"";
  line += name(l);
  line += "\",\"msg\":";
  line += json_quote(msg);
  for (const auto& f : fields) {
    line += ',';
    line += json_quote(f.key);
    line += ':';
    line += f.raw ? f.value : json_quote(f.value);
  }
  line += "}\n";
  [[maybe_unused]] auto n = ::write(2, line.data(), line.size());
}

}  // namespace fencegate::election::log
