// The `fencegate` subcommands, each in its own file under cmd/ (main.cpp dispatches to them):
// flags, usage text and exit codes here; the work itself in the libraries.
#pragma once

#include <string>
#include <vector>

namespace fencegate::cmd {

// Each takes the arguments after the subcommand's name and returns the process exit code.
int run_serve(const std::vector<std::string>& args);   // cmd/serve.cpp
int run_elect(const std::vector<std::string>& args);   // cmd/elect.cpp
int run_leader(const std::vector<std::string>& args);  // cmd/leader.cpp
int run_audit(const std::vector<std::string>& args);   // cmd/audit.cpp
int run_status(const std::vector<std::string>& args);  // cmd/status.cpp

// Shared by elect and leader (cmd/elect.cpp).

// Prints "fencegate CMD: ERROR" for each error and where to find the flags; returns 2.
int usage_error(const char* cmd, const std::vector<std::string>& errors);

// "" if `name` is an election name `serve` accepts for an authority (routes[].authority.election):
// an election elect runs must be one a sidecar can follow; else the message.
std::string election_name_error(const std::string& name);

// --coordinator URL or --etcd URLS (exactly one), plus --zk-auth / --redis-auth FILE: the
// coordinator (election_client/backend.h). Returns "" with *out set, or the error naming the flag.
struct CoordinatorFlags {
  std::string coordinator, etcd, zk_auth, redis_auth;
};
}  // namespace fencegate::cmd
namespace fencegate::election {
struct Coordinator;
}
namespace fencegate::cmd {
std::string coordinator_from_flags(const CoordinatorFlags& flags, election::Coordinator* out);

}  // namespace fencegate::cmd
