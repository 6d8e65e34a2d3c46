// `fencegate` entry point: the usage text and the dispatch to one subcommand (cmd/*.cpp).
// Exit codes: 0 ok, 1 runtime failure, 2 usage or config error (each subcommand documents more).
#include <cstdio>
#include <string>
#include <vector>

#include "cmd/cmd.h"

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
    "  fencegate status --admin URL [--token-file PATH] [--watch]\n"
    "                              the resource table of a running fencegate (see `fencegate status --help`)\n"
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

int main(int argc, char** argv) {
  using namespace fencegate;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  const std::string command = args[0];
  args.erase(args.begin());
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (command == "version" || command == "--version") {
    std::puts("fencegate 0.1.0");
    return 0;
  }
  if (command == "audit") return cmd::run_audit(args);
  if (command == "elect") return cmd::run_elect(args);
  if (command == "leader") return cmd::run_leader(args);
  if (command == "serve") return cmd::run_serve(args);
  if (command == "status") return cmd::run_status(args);
  std::fprintf(stderr, "fencegate: unknown command \"%s\"\n\n%s", command.c_str(), kUsage);
  return 2;
}
