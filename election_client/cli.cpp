// `fencegate elect` and `fencegate leader`.
//
// elect runs one *term* per loop iteration:
//   lease (LeaseKeeper) -> campaign (blocks) -> check we are the leader -> activation barrier
//   (POST the token to every --fence, each must answer 200) -> run the command -> supervise.
// The main thread never blocks for long: slow steps (campaign, fence POSTs) run on a helper
// thread while the main thread waits in sigtimedwait() in 50 ms slices, checking
// LeaseKeeper::valid() -- which reads CLOCK_MONOTONIC itself, so after a SIGSTOP/SIGCONT the
// expired deadline is seen on the first slice, whatever the keeper thread is doing.
//
// Before the command has started, losing the lease (or a failed campaign) costs nothing: elect
// gives the lease up and campaigns again. Once the command runs, losing authority (the lease, or
// the leader key deleted while the lease lives: KeyGuard) stops it
// (SIGTERM to its process group, SIGKILL after --grace-ms) and exits 75, or with --recampaign
// starts a new term.
#include "election_client/cli.h"

#include <signal.h>
#include <dirent.h>
#include <poll.h>
#include <time.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <linux/close_range.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "election_client/etcd_client.h"
#include "election_client/http_conn.h"
#include "election_client/lease_keeper.h"
#include "common/log.h"
#include "election_client/watch.h"

extern char** environ;

namespace fencegate::election {

const char* const kElectSummary =
    "  fencegate elect --etcd URLS --election NAME -- CMD...   run CMD only while leader (see `fencegate elect --help`)\n";
const char* const kLeaderSummary =
    "  fencegate leader --etcd URLS --election NAME   print the current leader and its token\n";

namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

constexpr const char* kElectUsage =
    "Usage: fencegate elect --etcd URLS --election NAME [flags] -- COMMAND [ARGS...]\n"
    "\n"
    "Campaigns for leadership of NAME in etcd and runs COMMAND only while it holds it, with the\n"
    "fencing token (the leader key's creation revision) in FENCING_TOKEN.\n"
    "\n"
    "  1. grants a lease (--ttl) and keeps it alive; campaigns with --id as the value;\n"
    "  2. once elected, POSTs {\"generation\": N, \"leader\": ID} (and Fencing-Token: N) to\n"
    "     <URL>/fence for every --fence URL and waits until each answered 200 (the activation\n"
    "     barrier). A fence that refuses (any non-200 but 5xx) or stays unreachable/5xx for\n"
    "     --fence-timeout-ms: elect resigns and exits 76, or campaigns again with --recampaign;\n"
    "  3. runs COMMAND in its own process group with FENCING_TOKEN, FENCING_ELECTION and\n"
    "     FENCING_LEADER_ID in its environment;\n"
    "  4. if the lease is lost or in jeopardy (no renewal evidence by the local deadline:\n"
    "     send time of the last renewal + TTL - max(TTL/5, 500ms), on the monotonic clock), or\n"
    "     the leader key is deleted while the lease lives (etcdctl del: the next candidate leads), it\n"
    "     sends SIGTERM to the command's process group, SIGKILL after --grace-ms (on a lost\n"
    "     lease: by the lease's earliest expiry, deadline + margin, if that comes first, so the\n"
    "     command never runs on while a successor leads), resigns and exits 75 -- or campaigns\n"
    "     again with --recampaign;\n"
    "  5. when COMMAND exits: SIGKILL to what is left of its process group, resign, revoke the\n"
    "     lease, exit with COMMAND's status (128+N if killed by signal N).\n"
    "  SIGTERM/SIGINT are passed to the command's process group (SIGHUP/SIGQUIT as SIGTERM;\n"
    "  under nohup, SIGHUP stays ignored by elect and the command;\n"
    "  SIGKILL after --grace-ms), then elect resigns and exits with the command's status;\n"
    "  SIGUSR1/SIGUSR2 are passed on and change nothing else. If elect itself dies (even by\n"
    "  SIGKILL), the command's whole process group gets SIGKILL (a guardian process watches elect);\n"
    "  so it does when the lease's earliest expiry passes while elect is stopped (SIGSTOP, Ctrl-Z).\n"
    "  Processes that leave the command's process group (setsid, a shell's job control) are not\n"
    "  stopped: keep the command's work in its group.\n"
    "\n"
    "Flags:\n"
    "  --etcd URLS              etcd client URLs, comma-separated (http://host:port), required\n"
    "  --election NAME          election name (the key prefix is NAME/), required\n"
    "  --id NAME                leader identity (FENCING_LEADER_ID); default hostname:pid\n"
    "  --ttl SECONDS            lease TTL, 2..3600 (default 10); renewals every TTL/3\n"
    "  --fence URL              a fencegate admin resource URL, e.g.\n"
    "                           http://127.0.0.1:9901/v1/resources/ledger (repeatable)\n"
    "  --fence-token-file PATH  bearer token for the fence admin APIs\n"
    "  --fence-timeout-ms MS    how long to wait for each fence, retrying while it is unreachable or 5xx\n"
    "                           (100..3600000, default 30000: above the sidecars' default drain timeout)\n"
    "  --recampaign             after losing leadership or a failed barrier, campaign again\n"
    "  --grace-ms MS            SIGTERM -> SIGKILL grace for the command (default 5000)\n"
    "  --log-level LEVEL        debug, info, warn, error (default info); JSON lines on stderr\n"
    "\n"
    "Exit codes: COMMAND's status; 1 etcd unreachable at start or COMMAND could not start;\n"
    "2 bad flags; 75 leadership lost while COMMAND ran; 76 activation barrier failed;\n"
    "128+N got signal N before COMMAND started.\n";

constexpr const char* kLeaderUsage =
    "Usage: fencegate leader --etcd URLS --election NAME\n"
    "\n"
    "Prints the current leader of the election as one JSON object:\n"
    "  {\"election\": NAME, \"leader\": ID, \"token\": N}\n"
    "where ID is the value the leader campaigned with and N its fencing token (the leader key's\n"
    "creation revision).\n"
    "\n"
    "Flags:\n"
    "  --etcd URLS        etcd client URLs, comma-separated (http://host:port), required\n"
    "  --election NAME    election name, required\n"
    "  --timeout-ms MS    how long to look for the leader, shared among the --etcd endpoints\n"
    "                     (one that hangs does not use it all; default 5000)\n"
    "\n"
    "Exit codes: 0 printed; 1 etcd unreachable or error; 2 bad flags; 3 no leader.\n";

// ------------------------------------------------------------------------------------------
// Flags

struct FlagReader {
  const std::vector<std::string>& args;
  std::size_t i = 0;
  std::vector<std::string> errors;

  // If args[i] is --name or --name=value, takes its value into *out and returns true.
  bool value(const char* name, std::string* out) {
    const std::string& a = args[i];
    const std::string n = std::string("--") + name;
    if (a == n) {
      if (i + 1 >= args.size()) {
        errors.push_back(n + ": needs a value");
        ++i;
        return true;
      }
      *out = args[i + 1];
      i += 2;
      return true;
    }
    if (a.size() > n.size() && a.compare(0, n.size(), n) == 0 && a[n.size()] == '=') {
      *out = a.substr(n.size() + 1);
      ++i;
      return true;
    }
    return false;
  }
  bool integer(const char* name, std::int64_t lo, std::int64_t hi, std::int64_t* out) {
    std::string v;
    if (!value(name, &v)) return false;
    std::int64_t n = 0;
    auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (v.empty() || ec != std::errc() || p != v.data() + v.size() || n < lo || n > hi)
      errors.push_back(std::string("--") + name + ": must be an integer in " + std::to_string(lo) + ".." +
                       std::to_string(hi) + " (got \"" + v + "\")");
    else
      *out = n;
    return true;
  }
};

int usage_error(const char* cmd, const std::vector<std::string>& errors) {
  for (const auto& e : errors) std::fprintf(stderr, "fencegate %s: %s\n", cmd, e.c_str());
  std::fprintf(stderr, "Run `fencegate %s --help` for the flags.\n", cmd);
  return kExitUsage;
}

// A token file's token (surrounding whitespace trimmed); "" if it cannot be read or is empty.
std::string read_token_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string t = ss.str();
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.front()))) t.erase(0, 1);
  return in ? t : std::string();
}

// The names `serve` accepts for an authority's election (routes[].authority.election): an
// election elect runs must be one a sidecar can follow.
std::string election_name_error(const std::string& name) {
  if (name.empty()) return "--election: required";
  const bool printable = std::all_of(name.begin(), name.end(), [](char ch) {
    auto u = static_cast<unsigned char>(ch);
    return u > 0x20 && u < 0x7f;
  });
  if (!printable || name.size() > 256)
    return "--election: must be 1..256 printable ASCII characters without spaces (as serve's authority.election)";
  return {};
}

struct ElectFlags {
  std::vector<std::string> etcd;
  std::string election;
  std::string id;
  std::int64_t ttl = 10;
  std::vector<HttpUrl> fences;
  std::vector<std::string> fence_urls;
  std::string fence_token;
  std::string fence_token_file;  // re-read before each barrier: a rotated token is picked up
  // Longer than a sidecar's default drain_timeout_ms (10 s) and a commit: a barrier behind a stuck
  // older write is answered once the drain timeout has aborted it, not given up on just before.
  std::int64_t fence_timeout_ms = 30000;
  bool recampaign = false;
  std::int64_t grace_ms = 5000;
  std::vector<std::string> command;
};

std::string default_id() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  return std::string(host) + ":" + std::to_string(getpid());
}

// ------------------------------------------------------------------------------------------
// Signals and the child process

// Set once at start, before any thread: elect was started with SIGHUP ignored (`nohup`). Then a
// hangup is not a stop signal, for elect or its command.
bool g_hup_ignored = false;

sigset_t handled_signals() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGTERM);
  sigaddset(&s, SIGINT);
  if (!g_hup_ignored) sigaddset(&s, SIGHUP);  // a closed terminal or ssh session: stop cleanly (resign), not die
  sigaddset(&s, SIGQUIT);
  sigaddset(&s, SIGUSR1);  // passed on to the command, never fatal to elect
  sigaddset(&s, SIGUSR2);
  sigaddset(&s, SIGCHLD);
  return s;
}

// Signals that stop elect the way SIGTERM does: the command is stopped, elect resigns.
bool is_stop_signal(int sig) { return sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT; }

// Waits up to `timeout` for SIGTERM, SIGINT or SIGCHLD. Returns the signal, or 0.
int wait_signal(milliseconds timeout) {
  sigset_t s = handled_signals();
  timespec ts{static_cast<time_t>(timeout.count() / 1000), static_cast<long>((timeout.count() % 1000) * 1000000)};
  siginfo_t info;
  int sig = sigtimedwait(&s, &info, &ts);
  return sig > 0 ? sig : 0;
}

// Returns true iff the command has exited (or is gone); then SIGKILLs what is left of its
// process group -- while the group id cannot have been reused, since the leader is not reaped
// yet -- reaps it and sets *wstatus.
bool reap_command(pid_t pid, int* wstatus) {
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) return errno == ECHILD;
  if (info.si_pid != pid) return false;
  kill(-pid, SIGKILL);  // leftovers of the group lose their authority with the command
  while (waitpid(pid, wstatus, 0) < 0 && errno == EINTR) {
  }
  return true;
}

int exit_code_of(int wstatus) {
  if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
  if (WIFSIGNALED(wstatus)) return 128 + WTERMSIG(wstatus);
  return 1;
}

// Descriptors from 3 on that elect itself was started with (`3<file`, `<(...)`, socket
// activation): they are the user's, for the command. Taken at start, before elect opens any.
std::vector<int>& inherited_fds() {
  static std::vector<int> fds;
  return fds;
}

void note_inherited_fds() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return;
  const int own = dirfd(d);
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end && *end == '\0' && e->d_name[0] != '\0' && fd >= 3 && fd != own) inherited_fds().push_back(static_cast<int>(fd));
  }
  closedir(d);
}

// Marks every descriptor from 3 on close-on-exec, but those elect was given (async-signal-safe):
// the command must not inherit elect's etcd connections.
void cloexec_from_3() {
  if (::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
    struct rlimit rl {};
    const rlim_t top = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? rl.rlim_cur : 65536;
    for (rlim_t fd = 3; fd < std::min<rlim_t>(top, 1 << 20); ++fd) fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
  }
  for (int fd : inherited_fds()) fcntl(fd, F_SETFD, 0);
}

// The guardian of one command: a small process that outlives elect. The parent-death signal
// (PR_SET_PDEATHSIG) reaches only the command itself; its children would run on after a
// SIGKILL of elect, with the token. The guardian holds the read end of a pipe whose write end
// only elect holds: when elect dies, however it dies, the guardian reads EOF and kills the
// command's whole process group. It also holds the lease's earliest expiry on etcd, which elect
// sends it after each renewal: an elect that does not run (SIGSTOP, a Ctrl-Z, a stalled VM
// thread) cannot stop its command when its lease runs out, so the guardian kills the group at
// that moment, before etcd can elect a successor. When elect is done with the command (reaped,
// group killed), it says so first and the guardian just exits. Messages are 8-byte integers
// (atomic on a pipe): a steady-clock expiry in nanoseconds, or kGuardianDone.
struct Guardian {
  pid_t pid = -1;
  int fd = -1;  // write end
  std::int64_t sent = 0;  // the last expiry sent
};

constexpr std::int64_t kGuardianDone = -1;

std::int64_t steady_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

Guardian start_guardian(pid_t group, Clock::time_point expiry) {
  Guardian g;
  int life[2];
  if (pipe2(life, O_CLOEXEC) != 0) return g;
  const std::int64_t first = steady_ns(expiry);
  const pid_t pid = fork();
  if (pid < 0) {
    close(life[0]);
    close(life[1]);
    return g;
  }
  if (pid == 0) {
    // Only async-signal-safe calls from here on.
    close(life[1]);
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, nullptr);  // ends only through the pipe, its deadline (or SIGKILL)
    setpgid(0, 0);  // a SIGSTOP sent to elect's process group does not stop it
    if (life[0] != 3) {
      dup2(life[0], 3);
      close(life[0]);
    }
    ::close_range(4, ~0U, 0);
    std::int64_t expiry_ns = first;
    for (;;) {
      struct timespec now {};
      clock_gettime(CLOCK_MONOTONIC, &now);  // std::chrono::steady_clock's clock
      const std::int64_t now_ns = static_cast<std::int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
      if (now_ns >= expiry_ns) break;
      const std::int64_t left_ms = (expiry_ns - now_ns + 999999) / 1000000;
      struct pollfd pfd {3, POLLIN, 0};
      const int r = poll(&pfd, 1, static_cast<int>(std::min<std::int64_t>(left_ms, 60000)));
      if (r < 0 && errno != EINTR) break;
      if (r <= 0) continue;
      std::int64_t msg = 0;
      ssize_t n;
      do n = read(3, &msg, sizeof msg);
      while (n < 0 && errno == EINTR);
      if (n == static_cast<ssize_t>(sizeof msg) && msg == kGuardianDone) _exit(0);
      if (n != static_cast<ssize_t>(sizeof msg)) break;  // EOF: elect is gone
      expiry_ns = msg;
    }
    kill(-group, SIGKILL);
    _exit(0);
  }
  close(life[0]);
  fcntl(life[1], F_SETFL, fcntl(life[1], F_GETFL) | O_NONBLOCK);
  g.pid = pid;
  g.fd = life[1];
  g.sent = first;
  return g;
}

// Sets the moment the guardian kills the command's group, earlier or later than before. The
// write end is non-blocking: a guardian that does not read (stopped) never holds elect up; the
// next call sends the moment again.
void set_guardian(Guardian& g, Clock::time_point at) {
  const std::int64_t ns = steady_ns(at);
  if (g.fd >= 0 && write(g.fd, &ns, sizeof ns) == static_cast<ssize_t>(sizeof ns)) g.sent = ns;
}

// Tells the guardian the lease's new earliest expiry (after a renewal).
void extend_guardian(Guardian& g, Clock::time_point expiry) {
  if (steady_ns(expiry) > g.sent) set_guardian(g, expiry);
}

void release_guardian(Guardian& g) {
  if (g.fd >= 0) {
    [[maybe_unused]] auto n = write(g.fd, &kGuardianDone, sizeof kGuardianDone);
    close(g.fd);
    g.fd = -1;
  }
  if (g.pid > 0) {
    while (waitpid(g.pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    g.pid = -1;
  }
}

// Starts the command in its own process group with `env`, and its guardian (`*guardian`; pid -1
// if it could not be started). Returns the command's pid, or -1 (errno set; no guardian then).
// The child waits for a byte on the `go` pipe before it execs: the guardian exists before the
// command can fork anything, so a SIGKILL of elect at any moment leaves no child of the command
// running. If elect dies before the byte, the child reads EOF and exits without exec.
pid_t spawn(const std::vector<std::string>& command, const std::vector<std::string>& env, Clock::time_point expiry,
            Guardian* guardian) {
  // Everything the child needs is built before fork(): after it, only async-signal-safe calls.
  std::vector<char*> argv;
  for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  // exec's errno comes back through a close-on-exec pipe: EOF means the exec worked.
  int report[2], go[2];
  if (pipe2(report, O_CLOEXEC) != 0) return -1;
  if (pipe2(go, O_CLOEXEC) != 0) {
    const int e = errno;
    close(report[0]);
    close(report[1]);
    errno = e;
    return -1;
  }
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    for (int fd : {report[0], report[1], go[0], go[1]}) close(fd);
    errno = e;
    return -1;
  }
  if (pid == 0) {
    close(report[0]);
    close(go[1]);
    setpgid(0, 0);
    // If elect dies (even by SIGKILL), the command must not keep running on its authority.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    char c = 0;
    ssize_t g;
    do g = read(go[0], &c, 1);
    while (g < 0 && errno == EINTR);
    if (g != 1) _exit(127);  // elect is gone (or failed) before the guardian was in place
    cloexec_from_3();
    // Default dispositions for what elect passes on: a launcher's SIG_IGN (a shell starts
    // background jobs with SIGINT and SIGQUIT ignored) would make the command deaf to them.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD}) sigaction(sig, &dfl, nullptr);
    if (!g_hup_ignored) sigaction(SIGHUP, &dfl, nullptr);  // under nohup the command ignores hangups too
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    environ = envp.data();
    execvp(argv[0], argv.data());
    const int e = errno;
    [[maybe_unused]] auto n = write(report[1], &e, sizeof e);
    _exit(127);
  }
  setpgid(pid, pid);  // also in the parent: no race with the signals we may send at once
  close(report[1]);
  close(go[0]);
  *guardian = start_guardian(pid, expiry);
  {
    [[maybe_unused]] auto w = write(go[1], "g", 1);
  }
  close(go[1]);
  int child_errno = 0;
  ssize_t n;
  do n = read(report[0], &child_errno, sizeof child_errno);
  while (n < 0 && errno == EINTR);
  close(report[0]);
  if (n == static_cast<ssize_t>(sizeof child_errno)) {  // the exec failed: the child is gone
    waitpid(pid, nullptr, 0);
    release_guardian(*guardian);
    errno = child_errno;
    return -1;
  }
  return pid;
}

std::vector<std::string> child_env(const ElectFlags& f, std::int64_t token) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string_view v(*e);
    if (v.rfind("FENCING_TOKEN=", 0) == 0 || v.rfind("FENCING_ELECTION=", 0) == 0 ||
        v.rfind("FENCING_LEADER_ID=", 0) == 0)
      continue;
    env.emplace_back(v);
  }
  env.push_back("FENCING_TOKEN=" + std::to_string(token));
  env.push_back("FENCING_ELECTION=" + f.election);
  env.push_back("FENCING_LEADER_ID=" + f.id);
  return env;
}

// ------------------------------------------------------------------------------------------
// Running a slow step while watching signals and the lease

enum class Interrupt { none, signal, lease };

struct Waited {
  Interrupt why = Interrupt::none;
  int sig = 0;
};

// Runs work(cancel) on a helper thread; meanwhile waits for SIGTERM/SIGINT and checks the lease
// (if `keeper`). On either, raises cancel and waits for work to return.
Waited run_watched(const std::function<void(const std::atomic<bool>&)>& work, const LeaseKeeper* keeper) {
  std::atomic<bool> cancel{false}, done{false};
  const pthread_t waiter = pthread_self();
  std::thread t([&] {
    work(cancel);
    done = true;
    pthread_kill(waiter, SIGCHLD);  // wake the sigtimedwait below now rather than at its next slice
  });
  Waited w;
  while (!done) {
    int sig = wait_signal(50ms);
    if (w.why != Interrupt::none) continue;
    if (is_stop_signal(sig)) {
      w = {Interrupt::signal, sig};
      cancel = true;
    } else if (keeper && !keeper->valid()) {
      w = {Interrupt::lease, 0};
      cancel = true;
    }
  }
  t.join();
  return w;
}

// Sleeps up to `d`, returning early with the signal if SIGTERM/SIGINT arrives (else 0).
int sleep_watching(milliseconds d) {
  auto until = Clock::now() + d;
  while (Clock::now() < until) {
    auto left = std::chrono::duration_cast<milliseconds>(until - Clock::now());
    int sig = wait_signal(std::min(left, milliseconds(50)) + 1ms);
    if (is_stop_signal(sig)) return sig;
  }
  return 0;
}

// ------------------------------------------------------------------------------------------
// The leader key itself

// The lease is not the only way to lose leadership: the leader key can be deleted while the
// lease lives (`etcdctl del`, a cleanup script, a buggy tool). etcd's election then hands
// leadership to the next candidate, with a higher token, and this term is over. KeyGuard
// watches the key from its creation revision on, so a deletion at any time after the campaign
// is seen, and reports it through gone(). After a watch compaction it checks the key directly
// and watches again from there. A watch stream on a member that went silent (SIGSTOPped, hung
// disk) delivers nothing and looks healthy, while the rest of the cluster, which keeps the lease
// alive, may have seen the key deleted and elected the next leader: so the guard also reads the
// key every `probe_every` (a linearizable range, which only a member with a quorum answers,
// with the client's failover to the other endpoints). A deletion is thus seen within about
// `probe_every` even when the watch is stuck. A silent quorum is the LeaseKeeper's business.
class KeyGuard {
 public:
  KeyGuard(ClientOptions options, Client& client, LeaderKey leader, std::chrono::milliseconds probe_every)
      : options_(std::move(options)), client_(client), leader_(std::move(leader)) {
    watch_from(leader_.rev + 1);
    // The probe has its own client and state and is not joined: a read stuck on a silent member
    // must not hold up the end of a term (the process may exit while it waits).
    ClientOptions po = options_;
    po.request_timeout = std::max<std::chrono::milliseconds>(probe_every * 2, 1000ms);
    probe_ = std::make_shared<Probe>(po, leader_);
    std::thread([p = probe_, probe_every] { p->loop(probe_every); }).detach();
  }
  ~KeyGuard() {
    stopping_ = true;
    probe_->stop();
    watch_.reset();
  }
  KeyGuard(const KeyGuard&) = delete;
  KeyGuard& operator=(const KeyGuard&) = delete;

  // Called by the owner thread in its supervision loop; never blocks on etcd.
  bool gone() {
    if (std::int64_t r = restart_from_.exchange(0); r > 0 && !gone_) watch_from(r);
    return gone_.load() || probe_->gone.load();
  }

 private:
  void watch_from(std::int64_t revision) {
    watch_.reset();  // the previous watch has returned (compacted): this joins at once
    Watch::Options wo;
    wo.client = options_;
    wo.prefix = leader_.key;
    wo.start_revision = revision;
    watch_ = std::make_unique<Watch>(
        wo,
        [this](const WatchBatch& b) {
          for (const auto& e : b.events)  // the prefix also covers longer keys: only ours counts
            if (e.kv.key == leader_.key &&
                (e.type == WatchEvent::Type::del || (e.kv.create_revision != 0 && e.kv.create_revision != leader_.rev)))
              gone_ = true;
        },
        [this](Watch::State s, std::int64_t, const Status&) {
          if (s == Watch::State::compacted) recheck();
        });
    watch_->start();
  }
  struct Probe {
    Probe(ClientOptions o, LeaderKey k) : client(std::move(o)), leader(std::move(k)) {}
    void stop() {
      {
        std::lock_guard lk(mu);
        stopping = true;
      }
      cv.notify_all();
    }
    void loop(std::chrono::milliseconds every) {
      std::unique_lock lk(mu);
      while (!stopping && !gone) {
        cv.wait_for(lk, every, [this] { return stopping; });
        if (stopping) return;
        lk.unlock();
        std::vector<KeyValue> kvs;
        const bool absent = client.range(leader.key, "", &kvs).ok() &&
                            (kvs.empty() || kvs.front().create_revision != leader.rev);
        lk.lock();
        if (absent && !stopping) {
          gone = true;
          log::warn("a read of the leader key finds it gone (its watch did not report it)", {log::kv("key", leader.key)});
        }
      }
    }
    Client client;
    const LeaderKey leader;
    std::atomic<bool> gone{false};
    std::mutex mu;
    std::condition_variable cv;
    bool stopping = false;  // guarded by mu
  };
  // On the watch thread, after a compaction: is the key still ours? Then watch on from there.
  void recheck() {
    while (!stopping_) {
      std::vector<KeyValue> kvs;
      ResponseHeader h;
      if (client_.range(leader_.key, "", &kvs, &h).ok()) {
        if (kvs.empty() || kvs.front().create_revision != leader_.rev) gone_ = true;
        else restart_from_ = h.revision + 1;
        return;
      }
      for (int i = 0; i < 25 && !stopping_; ++i) std::this_thread::sleep_for(20ms);
    }
  }

  // Constant after construction
  const ClientOptions options_;
  Client& client_;
  const LeaderKey leader_;

  std::atomic<bool> stopping_{false}, gone_{false};
  std::atomic<std::int64_t> restart_from_{0};
  std::shared_ptr<Probe> probe_;
  // Used only on the owner thread
  std::unique_ptr<Watch> watch_;
};

// ------------------------------------------------------------------------------------------
// The activation barrier

enum class FenceResult { ok, refused, unreachable, cancelled };

FenceResult fence_one(const ElectFlags& f, const HttpUrl& url, const std::string& url_text, std::int64_t token,
                      const std::atomic<bool>& cancel) {
  HttpConnection::Options o;
  o.endpoints = {url};
  o.connect_timeout = 1000ms;
  HttpConnection conn(o);
  const std::string target = url.path + "/fence";
  const std::string body =
      json{{"generation", token}, {"leader", f.id}}.dump(-1, ' ', false, json::error_handler_t::replace);
  HttpHeaders headers = {{"Fencing-Token", std::to_string(token)}};
  if (!f.fence_token.empty()) headers.push_back({"Authorization", "Bearer " + f.fence_token});
  const auto deadline = Clock::now() + milliseconds(f.fence_timeout_ms);
  std::string last;
  for (int attempt = 1;; ++attempt) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    if (left <= 0ms) break;
    HttpResponse r;
    Status st = conn.post(target, body, left, &r, &cancel, headers);
    if (st.is_cancelled()) return FenceResult::cancelled;
    if (st.ok() && r.status == 200) {
      // A fencegate fence answers with the generation it made durable: anything else (a plain
      // upstream, a wrong URL that happens to say 200) has fenced nothing.
      json j = json::parse(r.body, nullptr, false);
      if (!j.is_object() || !j.contains("generation") || !j["generation"].is_number_integer() ||
          j["generation"].get<std::int64_t>() != token) {
        log::error("fence answered 200 without making the token durable (is it a fencegate admin URL?)",
                   {log::kv("fence", url_text), log::kv("token", token), log::kv("body", r.body.substr(0, 500))});
        return FenceResult::refused;
      }
      log::info("fence advanced", {log::kv("fence", url_text), log::kv("token", token), log::kv("attempt", attempt)});
      return FenceResult::ok;
    }
    if (st.ok() && r.status < 500) {
      log::error("fence refused the token", {log::kv("fence", url_text), log::kv("token", token),
                                             log::kv("status", r.status), log::kv("body", r.body.substr(0, 500))});
      return FenceResult::refused;
    }
    last = st.ok() ? "HTTP " + std::to_string(r.status) + " " + r.body.substr(0, 200) : st.to_string();
    log::warn("fence not reached, retrying", {log::kv("fence", url_text), log::kv("attempt", attempt), log::kv("error", last)});
    for (auto until = std::min(deadline, Clock::now() + 250ms); Clock::now() < until && !cancel;)
      std::this_thread::sleep_for(10ms);
    if (cancel) return FenceResult::cancelled;
  }
  log::error("fence unreachable", {log::kv("fence", url_text), log::kv("token", token),
                                   log::kv("timeout_ms", f.fence_timeout_ms), log::kv("error", last)});
  return FenceResult::unreachable;
}

// ------------------------------------------------------------------------------------------
// One elect run

class Elect {
 public:
  explicit Elect(ElectFlags f) : f_(std::move(f)), client_(client_options()) {}

  int run();

 private:
  ClientOptions client_options() const {
    ClientOptions o;
    o.endpoints = f_.etcd;
    o.request_timeout = 5000ms;
    o.connect_timeout = 1000ms;
    return o;
  }
  // Best effort: resign (if leading) and revoke the lease, each bounded.
  void give_up(LeaseKeeper& keeper, const std::optional<LeaderKey>& leader);
  // Stops the command's process group: SIGTERM (or `first`), SIGKILL after the grace period, or
  // at `kill_by` if that comes first. Returns the command's wait status.
  int stop_command(pid_t pid, int first, bool* reaped_status_valid,
                   Clock::time_point kill_by = Clock::time_point::max());

  // Revokes the leases whose revoke failed before (etcd was down): their keys would otherwise wait
  // in the election as zombies, and lead for up to a TTL with no process behind them.
  void revoke_leftovers();

  // Constant after construction
  ElectFlags f_;  // fence_token changes when its file is re-read (each term)
  Client client_;
  std::vector<std::int64_t> leftover_leases_;  // revoke failed; tried again before each campaign
};

void Elect::give_up(LeaseKeeper& keeper, const std::optional<LeaderKey>& leader) {
  if (leader) {
    Status st = client_.resign(*leader, 2000ms);
    if (st.ok()) log::info("resigned", {log::kv("token", leader->rev)});
    else log::warn("resign failed (the lease will expire)", {log::kv("error", st.to_string())});
  }
  Status st = keeper.revoke(2000ms);
  if (!st.ok()) {
    log::warn("lease revoke failed (tried again before the next campaign; else it expires)",
              {log::kv("lease", keeper.lease_id()), log::kv("error", st.to_string())});
    if (keeper.lease_id() != 0) leftover_leases_.push_back(keeper.lease_id());
  }
}

void Elect::revoke_leftovers() {
  std::vector<std::int64_t> still;
  for (std::int64_t id : leftover_leases_) {
    Status st = client_.revoke(id, 2000ms);
    // A lease etcd no longer has (expired, or forgotten by a restore) is gone as well.
    if (st.ok() || st.to_string().find("not found") != std::string::npos) {
      log::info("revoked a lease left over from an earlier campaign", {log::kv("lease", id)});
    } else {
      still.push_back(id);
    }
  }
  leftover_leases_.swap(still);
}

int Elect::stop_command(pid_t pid, int first, bool* have_status, Clock::time_point kill_by) {
  kill(-pid, first);
  const auto kill_at = std::min(Clock::now() + milliseconds(f_.grace_ms), kill_by);
  bool killed = false;
  int wstatus = 0;
  *have_status = false;
  for (;;) {
    if (reap_command(pid, &wstatus)) {
      *have_status = true;
      break;
    }
    if (!killed && Clock::now() >= kill_at) {
      log::warn("command still running after the grace period: SIGKILL", {log::kv("pid", pid), log::kv("grace_ms", f_.grace_ms)});
      kill(-pid, SIGKILL);
      killed = true;
    }
    wait_signal(20ms);  // SIGCHLD wakes us early; a second SIGTERM/SIGINT is absorbed here
  }
  return wstatus;
}

int Elect::run() {
  bool first_term = true;
  milliseconds backoff = 500ms;
  for (;;) {
    // --- 1. Lease.
    LeaseKeeper::Options ko;
    ko.client = client_options();
    ko.ttl_seconds = f_.ttl;
    auto keeper = std::make_unique<LeaseKeeper>(ko, [](LeaseKeeper::State s, const std::string& why) {
      if (s == LeaseKeeper::State::active) log::info("lease renewed after jeopardy", {log::kv("why", why)});
      else log::warn("lease state", {log::kv("state", LeaseKeeper::to_string(s)), log::kv("why", why)});
    });
    Status st;
    Waited w = run_watched([&](const std::atomic<bool>&) { st = keeper->start(); }, nullptr);
    if (w.why == Interrupt::signal) {
      if (st.ok()) keeper->revoke(2000ms);
      return 128 + w.sig;
    }
    if (!st.ok()) {
      log::error("could not grant a lease", {log::kv("etcd", f_.etcd.front()), log::kv("error", st.to_string())});
      if (first_term) return kExitUnavailable;
      if (int sig = sleep_watching(backoff)) return 128 + sig;
      backoff = std::min(backoff * 2, milliseconds(5000));
      continue;
    }
    first_term = false;
    const std::int64_t lease = keeper->lease_id();
    log::info("lease granted", {log::kv("lease", lease), log::kv("ttl_s", keeper->ttl_seconds()),
                                log::kv("margin_ms", keeper->margin().count()),
                                log::kv("renew_every_ms", keeper->renew_every().count())});

    // --- 2. Campaign (blocks until elected).
    revoke_leftovers();
    log::info("campaigning", {log::kv("election", f_.election), log::kv("id", f_.id)});
    LeaderKey lk;
    Status cst;
    for (;;) {
      w = run_watched([&](const std::atomic<bool>& cancel) { cst = client_.campaign(f_.election, lease, f_.id, &lk, &cancel); },
                      keeper.get());
      // A campaign cut off (etcd restarted, a broken connection) while the lease is still valid
      // campaigns again with it: etcd takes up the lease's key where it is in line. A new lease
      // would queue a second key behind the first, which leads with no process behind it.
      if (w.why == Interrupt::none && !cst.ok() && keeper->valid()) {
        log::warn("campaign interrupted; campaigning again with the same lease", {log::kv("error", cst.to_string())});
        if (int sig = sleep_watching(backoff)) {
          give_up(*keeper, std::nullopt);
          return 128 + sig;
        }
        backoff = std::min(backoff * 2, milliseconds(5000));
        continue;
      }
      break;
    }
    if (w.why == Interrupt::signal) {
      log::info("signal while campaigning: giving up", {log::kv("signal", w.sig)});
      give_up(*keeper, std::nullopt);
      return 128 + w.sig;
    }
    if (w.why == Interrupt::lease || !cst.ok()) {
      log::warn("campaign ended without leadership; starting over",
                {log::kv("error", w.why == Interrupt::lease ? std::string("lease not valid") : cst.to_string())});
      give_up(*keeper, std::nullopt);
      if (int sig = sleep_watching(backoff)) return 128 + sig;
      backoff = std::min(backoff * 2, milliseconds(5000));
      continue;
    }
    // Belt and braces: the leader key is ours and the token is its creation revision.
    KeyValue cur;
    Status lst = client_.leader(f_.election, &cur);
    if (!lst.ok() || cur.key != lk.key || cur.create_revision != lk.rev || !keeper->valid()) {
      log::warn("elected, but the leader key is not ours any more; starting over",
                {log::kv("error", lst.ok() ? std::string("leader key ") + cur.key + " rev " + std::to_string(cur.create_revision)
                                           : lst.to_string())});
      give_up(*keeper, lk);
      if (int sig = sleep_watching(backoff)) return 128 + sig;
      continue;
    }
    backoff = 500ms;
    const std::int64_t token = lk.rev;
    log::info("elected", {log::kv("election", f_.election), log::kv("id", f_.id), log::kv("token", token),
                          log::kv("key", lk.key), log::kv("lease", lease)});
    KeyGuard guard(client_options(), client_, lk, std::min<milliseconds>(1000ms, milliseconds(f_.ttl * 1000 / 3)));

    // --- 3. Activation barrier: every fence has durably advanced to `token`.
    if (!f_.fence_token_file.empty()) {  // rotated since the last term? (kept if unreadable now)
      if (std::string t = read_token_file(f_.fence_token_file); !t.empty() && t != f_.fence_token) {
        f_.fence_token = std::move(t);
        log::info("re-read the fence token file: the token changed", {log::kv("file", f_.fence_token_file)});
      }
    }
    FenceResult fr = FenceResult::ok;
    w = run_watched(
        [&](const std::atomic<bool>& cancel) {
          for (std::size_t i = 0; i < f_.fences.size() && fr == FenceResult::ok; ++i)
            fr = fence_one(f_, f_.fences[i], f_.fence_urls[i], token, cancel);
        },
        keeper.get());
    if (w.why == Interrupt::signal) {
      give_up(*keeper, lk);
      return 128 + w.sig;
    }
    if (w.why == Interrupt::lease || !keeper->valid()) {
      log::warn("lease not valid before the command started; starting over");
      give_up(*keeper, lk);
      continue;
    }
    if (fr != FenceResult::ok) {
      give_up(*keeper, lk);
      if (!f_.recampaign) {
        log::error("activation barrier failed: not starting the command", {log::kv("exit_code", kExitFenceFailed)});
        return kExitFenceFailed;
      }
      log::warn("activation barrier failed: campaigning again");
      if (int sig = sleep_watching(2000ms)) return 128 + sig;
      continue;
    }

    // --- 4. Run the command while the lease is valid and the leader key is ours.
    if (guard.gone()) {
      log::warn("the leader key was deleted before the command started; starting over", {log::kv("key", lk.key)});
      give_up(*keeper, std::nullopt);
      continue;
    }
    if (!keeper->valid()) {
      give_up(*keeper, lk);
      continue;
    }
    Guardian guardian;
    pid_t pid = spawn(f_.command, child_env(f_, token), keeper->deadline() + keeper->margin(), &guardian);
    if (pid < 0) {
      log::error("could not start the command",
                 {log::kv("command", f_.command.front()), log::kv("error", std::strerror(errno))});
      give_up(*keeper, lk);
      return kExitUnavailable;
    }
    log::info("command started", {log::kv("pid", pid), log::kv("token", token), log::kv("command", f_.command.front())});
    if (guardian.pid < 0) log::warn("could not start the command's guardian: if elect is killed, the command's children may outlive it");
    int wstatus = 0;
    bool exited = false, lost = false;
    int forwarded = 0;
    Clock::time_point kill_at{};
    while (!exited) {
      int sig = wait_signal(50ms);
      if (reap_command(pid, &wstatus)) {
        exited = true;
        if (!keeper->valid()) {
          // Its guardian killed it at the lease's earliest expiry, while elect was not running.
          log::error("leadership lost: the lease ran out while elect was stopped; the command was killed at its expiry",
                     {log::kv("token", token), log::kv("pid", pid), log::kv("status", exit_code_of(wstatus))});
          lost = true;
        }
        break;
      }
      if (keeper->valid()) extend_guardian(guardian, keeper->deadline() + keeper->margin());
      if (!keeper->valid()) {
        log::error("leadership lost: stopping the command",
                   {log::kv("state", LeaseKeeper::to_string(keeper->state())), log::kv("token", token), log::kv("pid", pid),
                    log::kv("late_ms", std::chrono::duration_cast<milliseconds>(Clock::now() - keeper->deadline()).count())});
        // etcd may expire the lease (and elect the next leader) from deadline + margin on: the
        // command gets SIGKILL by then if --grace-ms would run past it, so that it never runs on
        // while a successor leads.
        const auto expiry = keeper->deadline() + keeper->margin();
        if (Clock::now() + milliseconds(f_.grace_ms) > expiry)
          log::warn("the grace period is cut to the lease's earliest expiry",
                    {log::kv("grace_ms", f_.grace_ms),
                     log::kv("left_ms", std::max<std::int64_t>(
                                            0, std::chrono::duration_cast<milliseconds>(expiry - Clock::now()).count()))});
        bool have = false;
        wstatus = stop_command(pid, SIGTERM, &have, expiry);
        lost = true;
        break;
      }
      // After the lease (a paused elect sees its deadline passed first, whatever the watch says).
      if (guard.gone()) {
        log::error("leadership lost: the leader key was deleted; stopping the command",
                   {log::kv("key", lk.key), log::kv("token", token), log::kv("pid", pid)});
        // The lease still lives, but the term is over: the guardian's SIGKILL moves to the end of
        // the grace (so it holds even if elect stops now), not the lease's expiry.
        set_guardian(guardian, Clock::now() + milliseconds(f_.grace_ms));
        bool have = false;
        wstatus = stop_command(pid, SIGTERM, &have);
        lost = true;
        break;
      }
      if (sig == SIGUSR1 || sig == SIGUSR2) kill(-pid, sig);  // the command's own business
      if (is_stop_signal(sig)) {
        // SIGHUP and SIGQUIT stop the command as SIGTERM does (to a daemon SIGHUP may mean
        // "reload", which would not stop it before the SIGKILL).
        const int pass = sig == SIGHUP || sig == SIGQUIT ? SIGTERM : sig;
        if (!forwarded) {
          log::info("passing the signal to the command", {log::kv("signal", sig), log::kv("sent", pass), log::kv("pid", pid)});
          forwarded = pass;
          kill_at = Clock::now() + milliseconds(f_.grace_ms);
        }
        kill(-pid, pass);
      }
      if (forwarded && Clock::now() >= kill_at) {
        log::warn("command still running after the grace period: SIGKILL", {log::kv("pid", pid)});
        kill(-pid, SIGKILL);
        kill_at = Clock::time_point::max();
      }
    }
    release_guardian(guardian);  // the command is reaped and its group killed

    // --- 5. Resign and revoke.
    if (lost) {
      log::info("command stopped", {log::kv("pid", pid), log::kv("status", exit_code_of(wstatus))});
      give_up(*keeper, lk);
      if (f_.recampaign) {
        log::info("campaigning again (--recampaign)");
        if (int sig = sleep_watching(500ms)) return 128 + sig;
        continue;
      }
      log::error("exiting: leadership lost", {log::kv("exit_code", kExitLeadershipLost)});
      return kExitLeadershipLost;
    }
    const int code = exit_code_of(wstatus);
    log::info("command exited", {log::kv("pid", pid), log::kv("exit_code", code)});
    give_up(*keeper, lk);
    return code;
  }
}

}  // namespace

int run_elect(const std::vector<std::string>& args) {
  note_inherited_fds();
  ElectFlags f;
  FlagReader r{args, 0, {}};
  std::string etcd, level = "info", token_file;
  bool have_command = false;
  bool id_given = false;
  while (r.i < args.size()) {
    const std::string& a = args[r.i];
    std::string v;
    if (a == "--help" || a == "-h") {
      std::fputs(kElectUsage, stdout);
      return 0;
    }
    if (a == "--") {
      f.command.assign(args.begin() + static_cast<std::ptrdiff_t>(r.i) + 1, args.end());
      have_command = true;
      break;
    }
    if (a == "--recampaign") {
      f.recampaign = true;
      ++r.i;
    } else if (r.value("etcd", &etcd) || r.value("election", &f.election) || (r.value("id", &f.id) && (id_given = true)) ||
               r.integer("ttl", 2, 3600, &f.ttl) || r.value("fence-token-file", &token_file) ||
               r.integer("fence-timeout-ms", 100, 3600000, &f.fence_timeout_ms) ||
               r.integer("grace-ms", 0, 3600000, &f.grace_ms) || r.value("log-level", &level)) {
    } else if (r.value("fence", &v)) {
      HttpUrl u;
      std::string why;
      if (!parse_http_url(v, &u, &why)) r.errors.push_back("--fence: " + why);
      else {
        f.fences.push_back(u);
        f.fence_urls.push_back(v);
      }
    } else {
      r.errors.push_back("unknown flag \"" + a + "\"" + (a.rfind("--", 0) == 0 ? "" : " (put the command after --)"));
      ++r.i;
    }
  }
  std::string why;
  if (etcd.empty()) r.errors.push_back("--etcd: required (e.g. http://127.0.0.1:2379)");
  else if (!parse_endpoint_list(etcd, &f.etcd, &why)) r.errors.push_back("--etcd: " + why);
  if (std::string e = election_name_error(f.election); !e.empty()) r.errors.push_back(e);
  if (id_given && f.id.empty()) r.errors.push_back("--id: must not be empty (leave it out for hostname:pid)");
  if (f.id.size() > 256)  // the sidecars would refuse it as Fencing-Leader (max_leader_bytes) after winning
    r.errors.push_back("--id: at most 256 bytes (got " + std::to_string(f.id.size()) + ")");
  else if (std::any_of(f.id.begin(), f.id.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
    r.errors.push_back("--id: must not contain control characters (the sidecars refuse them as a leader identity)");
  if (!have_command || f.command.empty()) r.errors.push_back("a command is required after --");
  if (level == "debug") log::set_level(log::Level::debug);
  else if (level == "info") log::set_level(log::Level::info);
  else if (level == "warn") log::set_level(log::Level::warn);
  else if (level == "error") log::set_level(log::Level::error);
  else r.errors.push_back("--log-level: must be one of debug, info, warn, error (got \"" + level + "\")");
  if (!token_file.empty()) {
    f.fence_token = read_token_file(token_file);
    if (f.fence_token.empty()) r.errors.push_back("--fence-token-file: cannot read a token from \"" + token_file + "\"");
    f.fence_token_file = token_file;
  }
  if (!r.errors.empty()) return usage_error("elect", r.errors);
  if (f.id.empty()) f.id = default_id();

  // The handled signals are taken with sigtimedwait(); block them before any thread exists
  // so every thread inherits the mask.
  struct sigaction hup {};
  g_hup_ignored = sigaction(SIGHUP, nullptr, &hup) == 0 && hup.sa_handler == SIG_IGN;
  // A launcher's ignored SIGCHLD would have the kernel reap the command itself, and its exit
  // status would be lost (elect would report 0).
  signal(SIGCHLD, SIG_DFL);
  sigset_t s = handled_signals();
  pthread_sigmask(SIG_BLOCK, &s, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return Elect(std::move(f)).run();
}

int run_leader(const std::vector<std::string>& args) {
  FlagReader r{args, 0, {}};
  std::string etcd, election;
  std::int64_t timeout_ms = 5000;
  while (r.i < args.size()) {
    const std::string& a = args[r.i];
    if (a == "--help" || a == "-h") {
      std::fputs(kLeaderUsage, stdout);
      return 0;
    }
    if (r.value("etcd", &etcd) || r.value("election", &election) || r.integer("timeout-ms", 1, 600000, &timeout_ms)) continue;
    r.errors.push_back("unknown flag \"" + a + "\"");
    ++r.i;
  }
  std::vector<std::string> eps;
  std::string why;
  if (etcd.empty()) r.errors.push_back("--etcd: required (e.g. http://127.0.0.1:2379)");
  else if (!parse_endpoint_list(etcd, &eps, &why)) r.errors.push_back("--etcd: " + why);
  if (std::string e = election_name_error(election); !e.empty()) r.errors.push_back(e);
  if (!r.errors.empty()) return usage_error("leader", r.errors);
  signal(SIGPIPE, SIG_IGN);
  // The time is shared among the endpoints: a call that times out ends there and the next one
  // starts on the next endpoint, so one hung member must not use all of it.
  ClientOptions o;
  o.endpoints = eps;
  o.request_timeout = std::max(milliseconds(timeout_ms) / static_cast<long>(eps.size()),
                               std::min(milliseconds(200), milliseconds(timeout_ms)));
  Client c(o);
  KeyValue kv;
  const auto until = std::chrono::steady_clock::now() + milliseconds(timeout_ms);
  Status st = c.leader(election, &kv);
  for (std::size_t tried = 1; st.is_unavailable() && tried < eps.size() && std::chrono::steady_clock::now() < until;
       ++tried)
    st = c.leader(election, &kv);
  if (st.is_no_leader()) {
    std::fprintf(stderr, "fencegate leader: election \"%s\" has no leader\n", election.c_str());
    return kExitNoLeader;
  }
  if (!st.ok()) {
    std::fprintf(stderr, "fencegate leader: %s\n", st.to_string().c_str());
    return kExitUnavailable;
  }
  json out = {{"election", election}, {"leader", kv.value}, {"token", kv.create_revision}};
  std::printf("%s\n", out.dump(-1, ' ', false, json::error_handler_t::replace).c_str());
  return 0;
}

}  // namespace fencegate::election
