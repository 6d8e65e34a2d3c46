// `fencegate audit`: prints the audit log of a fencegate database (who was refused, when, and
// with which token), reading it read-only so it works while the sidecar runs.
//
// Thread-safety: run_audit_cli is meant for the process's main thread; with --follow it installs
// SIGINT/SIGTERM handlers for its own duration.
#pragma once

#include <string>
#include <vector>

namespace fencegate::proxy {

// Runs `fencegate audit` with the arguments after "audit" (see `fencegate audit --help`).
// Returns the exit code: 0 success (also when nothing matches, and on SIGINT/SIGTERM while
// following), 1 the database cannot be opened or read, 2 bad arguments.
int run_audit_cli(const std::vector<std::string>& args);

}  // namespace fencegate::proxy
