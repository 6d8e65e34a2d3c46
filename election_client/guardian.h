// The elected command's process and its guardian: `fencegate elect` starts the command in its own
// process group with the fencing token in its environment, and a guardian process that kills
// that whole group when elect dies (however it dies) or when the lease's earliest expiry passes
// while elect cannot act (stopped). Also: which descriptors the command inherits, and reaping.
//
// Thread-safety: meant for elect's main thread (fork() from a process with helper threads; only
// async-signal-safe calls run in the children).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/boot_clock.h"

namespace fencegate::election {

// The clock of the guardian's expiry: the lease's clock (LeaseKeeper::Clock).
using GuardianClock = BootClock;

// Notes the descriptors from 3 on that elect was started with (`3<file`, `<(...)`, socket
// activation): they are the user's and the command inherits them; every other descriptor is
// closed on exec. REQUIRES: called at start, before elect opens any descriptor.
void note_inherited_fds();

// The guardian of one command: a small process that outlives elect. The parent-death signal
// (PR_SET_PDEATHSIG) reaches only the command itself; its children would run on after a
// SIGKILL of elect, with the token. The guardian holds the read end of a pipe whose write end
// only elect holds: when elect dies, however it dies, the guardian reads EOF and kills the
// command's whole process group. It also holds the lease's earliest expiry on etcd, which elect
// sends it after each renewal: an elect that does not run (SIGSTOP, a Ctrl-Z, a stalled VM
// thread) cannot stop its command when its lease runs out, so the guardian kills the group at
// that moment, before etcd can elect a successor. When elect is done with the command (reaped,
// group killed), it says so first and the guardian just exits. Messages are 8-byte integers
// (atomic on a pipe): an expiry in nanoseconds on CLOCK_BOOTTIME, or kGuardianDone.
//
// The clock (GuardianClock, common/boot_clock.h) counts a host suspension: the lease runs out at
// etcd during one, so the guardian kills the group at once on resume, not after the time the
// expiry had left when the host went down. The guardian is forked, never exec'd, and reads the
// same system-wide clock as elect, so an absolute boot-clock time means the same moment to both;
// it waits on a CLOCK_BOOTTIME timerfd, which fires on resume if the expiry passed meanwhile.
struct Guardian {
  pid_t pid = -1;
  int fd = -1;  // write end
  std::int64_t sent = 0;  // the last expiry sent
};

// cgroup v2 per command (issue 31): where the cgroup v2 hierarchy is writable, the command (and
// the catch-up) runs in a cgroup of its own, <mount>/<elect's own cgroup>/fencegate-elect-<pid>,
// so that every process it starts -- in its process group or not (setsid, a double fork), even
// one that outlives elect -- is killed with `cgroup.kill` (or each pid of cgroup.procs where the
// kernel has no cgroup.kill, before 5.14). The guardian kills the cgroup too, so this holds while
// elect is stopped and after elect is SIGKILLed. Elsewhere, the child subreaper below.
//
// The directory commands' cgroups are made in: elect's own cgroup v2 (from /proc/self/cgroup,
// "0::<path>", under the cgroup2 mount in /proc/self/mountinfo), if this process may create a
// cgroup there and move a process into it. "" with *why otherwise (no cgroup v2, read-only,
// not delegated). FENCEGATE_ELECT_CGROUP=0 turns it off (the subreaper alone).
std::string command_cgroup_parent(std::string* why);

// Creates (or empties and reuses) the cgroup `dir`. Returns "" or the reason.
std::string make_command_cgroup(const std::string& dir);

// Kills every process in the cgroup `dir` (cgroup.kill, else SIGKILL to each pid in cgroup.procs),
// reaps those that are this process's children, waits until it is empty (at most `within`) and
// removes it. Returns how many processes it found there; -1 if it could not be emptied.
int kill_command_cgroup(const std::string& dir, std::chrono::milliseconds within);

// Starts the command in its own process group with `env`, and its guardian (`*guardian`; pid -1
// if it could not be started). Returns the command's pid, or -1 (errno set; no guardian then).
// The child waits for a byte on the `go` pipe before it execs: the guardian exists before the
// command can fork anything, so a SIGKILL of elect at any moment leaves no child of the command
// running. If elect dies before the byte, the child reads EOF and exits without exec.
// `cgroup`: a cgroup made by make_command_cgroup() for the command ("" for none): the command is
// moved into it before it may exec, and the guardian kills it with the process group. If the move
// fails, *cgroup is cleared (the command runs without; the subreaper remains).
pid_t spawn(const std::vector<std::string>& command, const std::vector<std::string>& env,
            GuardianClock::time_point expiry, Guardian* guardian, std::string* cgroup = nullptr);

// Sets the moment the guardian kills the command's group, earlier or later than before. The
// write end is non-blocking: a guardian that does not read (stopped) never holds elect up; the
// next call sends the moment again.
void set_guardian(Guardian& g, GuardianClock::time_point at);

// Tells the guardian the lease's new earliest expiry (after a renewal).
void extend_guardian(Guardian& g, GuardianClock::time_point expiry);

// Tells the guardian the command is done with (reaped, its group killed): it exits; reaps it.
void release_guardian(Guardian& g);

// Returns true iff the command has exited (or is gone); then SIGKILLs what is left of its
// process group -- while the group id cannot have been reused, since the leader is not reaped
// yet -- reaps it and sets *wstatus.
bool reap_command(pid_t pid, int* wstatus);

// Processes that leave the command's process group (setsid, a daemonizing double fork) are not
// reached by killing the group. elect makes itself a child subreaper (PR_SET_CHILD_SUBREAPER):
// such a process, once its parent exits, becomes elect's child instead of init's, so elect can
// find it. Returns false if the kernel refused.
bool become_subreaper();

// SIGKILLs every descendant of this process (found by walking /proc's parent links) and reaps
// them, until none is left or `within` passed. Call only once the command, the catch-up and their
// guardians are reaped (it reaps any child). Returns how many it killed.
int kill_descendants(std::chrono::milliseconds within);

// The exit code a wait status stands for: the exit status, or 128+N if killed by signal N.
int exit_code_of(int wstatus);

}  // namespace fencegate::election
