// Fuzz target: config/config.h load_json on arbitrary bytes.
//
// Properties: never crashes and never lets an exception out; the result is either a config or at
// least one (non-empty) error, never both; a returned config satisfies what the rest of the
// program assumes (at least one route, every route template valid, threads 1..256, a Router can
// be built from it and match).
//
// admin.token_file makes load_json read a file. So that the fuzzer cannot make it read /dev/zero
// or block on a FIFO, inputs are skipped unless every token_file is a plain file name (read from
// the working directory) or a file in kFixtures, which holds a few token files (the seeds use them).
#include <sys/stat.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "config/router.h"
#include "tests/fuzz/fuzz_check.h"

using fencegate::fuzz::show;

namespace {

constexpr std::string_view kFixtures = "/tmp/fencegate-config-fuzz/";

void write(const char* name, const char* text) {
  const std::string path = std::string(kFixtures) + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  std::fputs(text, f);
  std::fclose(f);
  chmod(path.c_str(), 0600);  // else every token file is refused for its mode before it is read
}

// True iff every "token_file" string in the document is a harmless path (see above).
bool token_files_safe(std::string_view text) {
  bool safe = true;
  std::string last_key;
  auto cb = [&](int /*depth*/, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    if (ev == nlohmann::json::parse_event_t::key) {
      last_key = parsed.is_string() ? parsed.get<std::string>() : std::string();
    } else if (ev == nlohmann::json::parse_event_t::value && last_key == "token_file") {
      if (parsed.is_string()) {
        const std::string p = parsed.get<std::string>();
        std::string_view name = p;
        if (name.substr(0, kFixtures.size()) == kFixtures) name.remove_prefix(kFixtures.size());
        if (name.empty() || name.find('/') != std::string_view::npos || name == "." || name == ".." ||
            name.find('\0') != std::string_view::npos)
          safe = false;
      }
      last_key.clear();
    } else {
      last_key.clear();
    }
    return true;
  };
  try {
    (void)nlohmann::json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true);
  } catch (const nlohmann::json::exception&) {
    // Not JSON (or not parseable by this plain parser): load_json will refuse it before any
    // file is read, unless its own parser differs; stay on the safe side only if the raw bytes
    // do not mention token_file at all.
    return text.find("token_file") == std::string_view::npos && text.find("\\u") == std::string_view::npos;
  }
  return safe;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  if (mkdir(std::string(kFixtures).c_str(), 0700) != 0 && errno != EEXIST) std::abort();
  write("token", "s3cret-admin-token\n");
  write("empty", "");
  write("spaced", "two words\n");
  write("ctl", "a\x01b");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (!token_files_safe(text)) return 0;

  // An exception escaping here terminates the process: libFuzzer records it as a crash.
  fencegate::config::LoadResult r = fencegate::config::load_json(text, "fuzz.json");

  const std::string in = "input " + show(text.substr(0, 400));
  FUZZ_CHECK(!r.help, in);
  FUZZ_CHECK(r.config.has_value() != !r.errors.empty(),
             std::string(r.config ? "a config and errors, first: " + r.errors.front() : "neither a config nor an error") +
                 "; " + in);
  for (const std::string& e : r.errors) FUZZ_CHECK(!e.empty(), "empty error message; " + in);
  if (!r.config) return 0;

  const fencegate::config::Config& c = *r.config;
  FUZZ_CHECK(!c.routes.empty(), "config without routes; " + in);
  FUZZ_CHECK(c.threads >= 1 && c.threads <= 256, "threads " + std::to_string(c.threads) + "; " + in);
  FUZZ_CHECK(!c.db.empty() && !c.listen.host.empty(), in);
  for (const auto& route : c.routes) {
    const std::string err = fencegate::config::check_route_template(route);
    FUZZ_CHECK(err.empty(), "loaded route " + show(route.prefix) + " fails check_route_template: " + err + "; " + in);
    FUZZ_CHECK(!route.upstream_addr.host.empty(), "route without an upstream host; " + in);
  }
  const fencegate::config::Router router(c.routes);
  for (const auto& route : c.routes) (void)router.match(route.prefix);
  (void)router.match("/");
  return 0;
}
