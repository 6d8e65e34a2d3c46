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
int run_keys(const std::vector<std::string>& args);    // cmd/keys.cpp (issue 30)

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
  // Issue 27: etcd over https and etcd users (etcdctl's flag names; the password never a flag value).
  std::string cacert, cert, key, user, password_file;
};
}  // namespace fencegate::cmd
namespace fencegate::election {
struct Coordinator;
}
namespace fencegate::cmd {
std::string coordinator_from_flags(const CoordinatorFlags& flags, election::Coordinator* out);
// Issue 27: takes --cacert, --cert, --key, --user, --password-file into *f (true), refuses
// --password (a secret in a flag value shows in ps and shell history), or returns false for others.
bool take_etcd_security_flag(const std::string& name, const std::string& value, CoordinatorFlags* f,
                             std::vector<std::string>& errors);
// The usage lines of those flags.
extern const char* const kEtcdSecurityUsage;

}  // namespace fencegate::cmd
