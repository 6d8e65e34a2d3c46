// `fencegate elect` and `fencegate leader` (dispatched from proxy/cli.cpp).
//
// fencegate elect --etcd URLS --election NAME [--id NAME] [--ttl S] [--fence URL ...]
//                 [--fence-token-file PATH] [--fence-timeout-ms MS] [--recampaign] [--grace-ms MS]
//                 [--log-level L] -- COMMAND [ARGS...]
//   Exit codes: the command's exit status (128+N if it was killed by signal N) after it ended on
//   its own or after SIGTERM/SIGINT was passed to it; 1 etcd unreachable at start or the command
//   could not be started; 2 bad flags; 75 leadership lost (lease jeopardy or loss) while the
//   command ran -- it was stopped; 76 the activation barrier failed (a --fence refused or stayed
//   unreachable), without --recampaign; 128+N elect got SIGTERM/SIGINT before the command started.
//
// fencegate leader --etcd URLS --election NAME
//   Prints {"election": NAME, "leader": ID, "token": N}. Exit codes: 0 printed, 1 etcd
//   unreachable or error, 2 bad flags, 3 the election has no leader.
#pragma once

#include <string>
#include <vector>

namespace fencegate::election {

// Exit codes of `fencegate elect` besides the command's own status.
constexpr int kExitUnavailable = 1;
constexpr int kExitUsage = 2;
constexpr int kExitNoLeader = 3;          // `fencegate leader`
constexpr int kExitLeadershipLost = 75;   // EX_TEMPFAIL: lost the lease while the command ran
constexpr int kExitFenceFailed = 76;      // the activation barrier could not be established

// args: everything after the subcommand name.
int run_elect(const std::vector<std::string>& args);
int run_leader(const std::vector<std::string>& args);

// One-line summaries for `fencegate --help`.
extern const char* const kElectSummary;
extern const char* const kLeaderSummary;

}  // namespace fencegate::election
