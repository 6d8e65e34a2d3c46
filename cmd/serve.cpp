// `fencegate serve`: loads the configuration (flags, FENCEGATE_* environment, the JSON file:
// config/config.h) and runs the fenced reverse proxy (proxy/server.h). Exit codes: 0 after a
// clean stop, 1 could not start or run, 2 bad flags or configuration.
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cmd/cmd.h"
#include "config/config.h"
#include "common/log.h"
#include "proxy/server.h"

namespace fencegate::cmd {

int run_serve(const std::vector<std::string>& args) {
  // SIGHUP means "reload" to a running sidecar; until its handler is installed (after the store
  // is open), one must not end the process (the default action).
  std::signal(SIGHUP, SIG_IGN);
  config::LoadResult r = config::load_serve(args);
  if (r.help) {
    std::fputs(config::serve_usage().c_str(), stdout);
    return 0;
  }
  if (!r.config) {
    for (const auto& e : r.errors) std::fprintf(stderr, "fencegate serve: %s\n", e.c_str());
    if (r.errors.empty()) std::fprintf(stderr, "fencegate serve: invalid configuration\n");
    std::fprintf(stderr, "Run `fencegate serve --help` for the flags.\n");
    return 2;
  }
  log::Level lvl;
  if (log::parse_level(r.config->log_level, &lvl)) log::set_level(lvl);
  for (const auto& w : r.warnings) log::warn("environment variable ignored", {log::kv("detail", w)});
  return proxy::run_serve(std::make_shared<const config::Config>(std::move(*r.config)));
}

}  // namespace fencegate::cmd
