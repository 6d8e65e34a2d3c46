// The elector behind `fencegate elect`: campaigns in an etcd election and runs a command only
// while it leads, with its fencing token (cmd/elect.cpp parses the flags into ElectOptions).
//
// One *term* per loop iteration:
//   lease (LeaseKeeper) -> campaign (blocks) -> check we are the leader -> activation barrier
//   (fence_barrier.h: POST the token to every fence, each must answer 200) -> run the command
//   (guardian.h) -> supervise.
// The main thread never blocks for long: slow steps (campaign, fence POSTs) run on a helper
// thread while the main thread waits in sigtimedwait() in 50 ms slices (elect_signals.h),
// checking LeaseKeeper::valid() -- which reads CLOCK_BOOTTIME itself, so after a SIGSTOP/SIGCONT
// or a host suspension the expired deadline is seen on the first slice, whatever the keeper
// thread is doing (the slices are short: a suspension costs at most one more slice).
//
// Before the command has started, losing the lease (or a failed campaign) costs nothing: elect
// gives the lease up and campaigns again. Once the command runs, losing authority (the lease, or
// the leader key deleted while the lease lives: KeyGuard) stops it
// (SIGTERM to its process group, SIGKILL after grace_ms) and exits 75, or with recampaign
// starts a new term.
//
// Thread-safety: run_elect owns the process's signals; call it once, from the main thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "election_client/backend.h"
#include "election_client/http_conn.h"

namespace fencegate::election {

// Exit codes of `fencegate elect` and `fencegate leader` besides the command's own status.
constexpr int kExitUnavailable = 1;
constexpr int kExitUsage = 2;
constexpr int kExitNoLeader = 3;          // `fencegate leader`
constexpr int kExitLeadershipLost = 75;   // EX_TEMPFAIL: lost the lease while the command ran
constexpr int kExitFenceFailed = 76;      // the activation barrier could not be established

// What one elect run does; validated by the caller (cmd/elect.cpp).
struct ElectOptions {
  Coordinator coordinator;  // etcd, ZooKeeper or Redis (backend.h)
  std::string election;
  std::string id;  // FENCING_LEADER_ID; never empty
  std::int64_t ttl = 10;
  std::vector<HttpUrl> fences;
  std::vector<std::string> fence_urls;  // as given, for logs (parallel to fences)
  std::string fence_token;
  std::string fence_token_file;  // re-read before each barrier: a rotated token is picked up
  std::string fence_cacert;      // issue 27: CA file for https --fence URLs (--fence-cacert)
  // Longer than a sidecar's default drain_timeout_ms (10 s) and a commit: a barrier behind a stuck
  // older write is answered once the drain timeout has aborted it, not given up on just before.
  std::int64_t fence_timeout_ms = 30000;
  bool recampaign = false;
  std::int64_t grace_ms = 5000;
  std::vector<std::string> command;  // non-empty
  // The activation barrier's catch-up (issue 31): `sh -c catch_up` with the token in its
  // environment, after winning and before the fences; must exit 0 within catch_up_timeout_ms.
  std::string catch_up;
  std::int64_t catch_up_timeout_ms = 60000;
  std::string status_listen;  // "host:port": /readyz and /metrics (status_server.h); "" for none
};

// Runs elect until the command ends, leadership is lost (without recampaign), or a stop signal.
// Returns the exit code (see cmd/elect.cpp's usage). Installs elect's signal handling first
// (install_elect_signals). REQUIRES: no other thread exists yet; note_inherited_fds() was called
// at start.
int run_elect(ElectOptions options);

// Reads the fence token file: the token is the file's text with surrounding whitespace trimmed.
// Refused (docs/security.md): a file group or others may read or write (mode & 077), a token
// shorter than 16 bytes, and a token with a control byte inside (a CR or LF would go into the
// Authorization header). Returns "" with *token set, or the reason (naming the file, never the
// token).
std::string load_token_file(const std::string& path, std::string* token);

// load_token_file's token; "" if it is refused or cannot be read (for the re-read before each
// barrier, which keeps the token it has).
std::string read_token_file(const std::string& path);

// The default leader identity: hostname:pid.
std::string default_id();

}  // namespace fencegate::election
