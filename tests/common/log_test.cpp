// Tests for common/log.h: the level parser, field encoding, and the line written to stderr (one
// JSON object with ts, level, msg and the fields, UTF-8 as it is).
#include "common/log.h"

#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace fglog = fencegate::log;  // not `log`: ::log is the C library's

namespace {

// Runs `f` with stderr sent to a temporary file; returns what was written.
template <class F>
std::string capture_stderr(F f) {
  char path[] = "/tmp/fg-log-test-XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  ::unlink(path);
  const int saved = ::dup(2);
  ::dup2(fd, 2);
  f();
  ::dup2(saved, 2);
  ::close(saved);
  std::string out(1 << 16, '\0');
  const ssize_t n = ::pread(fd, out.data(), out.size(), 0);
  ::close(fd);
  out.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  return out;
}

}  // namespace

TEST_CASE("log: parse_level takes the four level names and nothing else") {
  fglog::Level l = fglog::Level::info;
  CHECK(fglog::parse_level("debug", &l));
  CHECK(l == fglog::Level::debug);
  CHECK(fglog::parse_level("warn", &l));
  CHECK(l == fglog::Level::warn);
  CHECK(fglog::parse_level("error", &l));
  CHECK(l == fglog::Level::error);
  CHECK(fglog::parse_level("info", &l));
  CHECK(l == fglog::Level::info);
  for (const char* bad : {"", "INFO", "warning", "info ", "trace"}) {
    CAPTURE(bad);
    CHECK_FALSE(fglog::parse_level(bad, &l));
  }
  CHECK(l == fglog::Level::info);  // untouched by a refusal
}

TEST_CASE("log: fields are strings, numbers as they are, booleans as true/false") {
  CHECK(fglog::kv("k", "v").value == "v");
  CHECK_FALSE(fglog::kv("k", std::string("v")).raw);
  CHECK(fglog::kv("n", 42).value == "42");
  CHECK(fglog::kv("n", 42).raw);
  CHECK(fglog::kv("n", std::int64_t{-7}).value == "-7");
  CHECK(fglog::kv("b", true).value == "true");
  CHECK(fglog::kv("b", false).value == "false");
  CHECK(fglog::kv("b", true).raw);
}

TEST_CASE("log: a line is one JSON object with ts, level, msg and the fields, UTF-8 intact") {
  std::string out = capture_stderr([] {
    fglog::warn("rejected write", {fglog::kv("leader", "leader-\xC3\xA9"), fglog::kv("bad", "x\xFFy"),
                                 fglog::kv("current_generation", 5), fglog::kv("synced", true)});
  });
  REQUIRE(!out.empty());
  CHECK(out.back() == '\n');
  CHECK(out.find('\n') == out.size() - 1);
  CHECK(out.find("leader-\xC3\xA9") != std::string::npos);  // raw UTF-8, not \u00c3\u00a9
  auto j = nlohmann::json::parse(out);
  CHECK(j["level"] == "warn");
  CHECK(j["msg"] == "rejected write");
  CHECK(j["ts"].get<std::string>().size() == 24);  // 2026-01-02T03:04:05.678Z
  CHECK(j["ts"].get<std::string>().back() == 'Z');
  CHECK(j["leader"] == "leader-\xC3\xA9");
  CHECK(j["bad"] == "x\xEF\xBF\xBDy");
  CHECK(j["current_generation"] == 5);
  CHECK(j["synced"] == true);
}

TEST_CASE("log: lines below the level are not written") {
  fglog::set_level(fglog::Level::warn);
  std::string out = capture_stderr([] {
    fglog::info("quiet");
    fglog::debug("quieter");
    fglog::error("loud");
  });
  fglog::set_level(fglog::Level::info);
  CHECK(out.find("quiet") == std::string::npos);
  CHECK(out.find("loud") != std::string::npos);
}
