// `fencegate` command-line dispatch. Exit codes: 0 ok, 1 runtime failure, 2 usage or config error.
#include <csignal>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "config/config.h"
#include "election_client/cli.h"
#include "proxy/audit_cli.h"
#include "proxy/log.h"
#include "proxy/server.h"

namespace fencegate::proxy {

namespace {

constexpr const char* kUsage =
    "fencegate: a fencing sidecar. It sits in front of an HTTP resource and lets a write through\n"
    "only when its fencing token (the leadership generation) is current.\n"
    "\n"
    "Usage:\n"
    "  fencegate serve [flags]     run the fenced reverse proxy (see `fencegate serve --help`)\n"
    "  fencegate audit --db PATH   print the audit log of refused writes (see `fencegate audit --help`)\n"
    "  fencegate elect --etcd URLS --election NAME -- CMD...\n"
    "                              run CMD only while elected in etcd, with its fencing token\n"
    "                              (see `fencegate elect --help`)\n"
    "  fencegate leader --etcd URLS --election NAME\n"
    "                              print an election's leader and token (see `fencegate leader --help`)\n"
    "  fencegate version           print the version\n"
    "  fencegate --help            this text\n"
    "\n"
    "Examples:\n"
    "  fencegate serve --listen 127.0.0.1:8080 --upstream http://127.0.0.1:9000 --db ./fence.db\n"
    "  fencegate serve --config fencegate.json\n"
    "\n"
    "Exit codes: 0 success, 1 could not start or run (store owned by another fencegate, port in use),\n"
    "2 bad flags or configuration.\n";

}  // namespace

int run_cli(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string& cmd = args[0];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (cmd == "version" || cmd == "--version") {
    std::puts("fencegate 0.1.0");
    return 0;
  }
  if (cmd == "audit") return run_audit_cli(std::vector<std::string>(args.begin() + 1, args.end()));
  if (cmd == "elect") return election::run_elect(std::vector<std::string>(args.begin() + 1, args.end()));
  if (cmd == "leader") return election::run_leader(std::vector<std::string>(args.begin() + 1, args.end()));
  if (cmd == "serve") {
    // SIGHUP means "reload" to a running sidecar; until its handler is installed (after the store
    // is open), one must not end the process (the default action).
    std::signal(SIGHUP, SIG_IGN);
    std::vector<std::string> rest(args.begin() + 1, args.end());
    config::LoadResult r = config::load_serve(rest);
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
    return run_serve(std::make_shared<const config::Config>(std::move(*r.config)));
  }
  std::fprintf(stderr, "fencegate: unknown command \"%s\"\n\n%s", cmd.c_str(), kUsage);
  return 2;
}

}  // namespace fencegate::proxy
