// The elected command's process and its guardian (see guardian.h): fork/exec in its own process
// group behind a start barrier, the guardian process that kills the group when elect dies or its
// lease's earliest expiry passes, and reaping.
#include "election_client/guardian.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "election_client/elect_signals.h"

extern char** environ;

namespace fencegate::election {

using Clock = GuardianClock;

namespace {

// Descriptors from 3 on that elect itself was started with (`3<file`, `<(...)`, socket
// activation): they are the user's, for the command. Taken at start, before elect opens any.
std::vector<int>& inherited_fds() {
  static std::vector<int> fds;
  return fds;
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

constexpr std::int64_t kGuardianDone = -1;

std::int64_t boot_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// Writes `text` to `path` (async-signal-safe). Returns true iff all of it was written.
bool write_text(const char* path, const char* text, std::size_t len) {
  const int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n;
  do n = write(fd, text, len);
  while (n < 0 && errno == EINTR);
  close(fd);
  return n == static_cast<ssize_t>(len);
}

Guardian start_guardian(pid_t group, Clock::time_point expiry, const std::string& cgroup) {
  Guardian g;
  // The cgroup's kill file, built before fork() (the guardian only makes async-signal-safe calls).
  const std::string kill_file = cgroup.empty() ? std::string() : cgroup + "/cgroup.kill";
  int life[2];
  if (pipe2(life, O_CLOEXEC) != 0) return g;
  const std::int64_t first = boot_ns(expiry);
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
    // poll()'s timeout is monotonic and sleeps through a suspension: a CLOCK_BOOTTIME timerfd
    // armed at the expiry wakes the guardian on resume instead. Without one (an old kernel), the
    // poll is cut into kMaxBootClockWait slices.
    const int timer = timerfd_create(CLOCK_BOOTTIME, TFD_CLOEXEC);
    std::int64_t expiry_ns = first;
    std::int64_t armed_ns = -1;
    for (;;) {
      const std::int64_t now_ns = BootClock::now_ns();
      if (now_ns >= expiry_ns) break;
      if (timer >= 0 && armed_ns != expiry_ns) {
        struct itimerspec at {};
        at.it_value.tv_sec = static_cast<time_t>(expiry_ns / 1000000000);
        at.it_value.tv_nsec = static_cast<long>(expiry_ns % 1000000000);
        armed_ns = timerfd_settime(timer, TFD_TIMER_ABSTIME, &at, nullptr) == 0 ? expiry_ns : -1;
      }
      const std::int64_t left_ms = (expiry_ns - now_ns + 999999) / 1000000;
      const std::int64_t slice_ms = armed_ns == expiry_ns ? 60000 : kMaxBootClockWait.count();
      struct pollfd pfd[2] = {{3, POLLIN, 0}, {timer, POLLIN, 0}};
      const int r = poll(pfd, timer >= 0 ? 2 : 1, static_cast<int>(std::min<std::int64_t>(left_ms, slice_ms)));
      if (r < 0 && errno != EINTR) break;
      if (r <= 0 || !(pfd[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;  // the clock decides
      std::int64_t msg = 0;
      ssize_t n;
      do n = read(3, &msg, sizeof msg);
      while (n < 0 && errno == EINTR);
      if (n == static_cast<ssize_t>(sizeof msg) && msg == kGuardianDone) _exit(0);
      if (n != static_cast<ssize_t>(sizeof msg)) break;  // EOF: elect is gone
      expiry_ns = msg;
    }
    kill(-group, SIGKILL);
    if (!kill_file.empty()) write_text(kill_file.c_str(), "1", 1);  // what left the group, too
    _exit(0);
  }
  close(life[0]);
  fcntl(life[1], F_SETFL, fcntl(life[1], F_GETFL) | O_NONBLOCK);
  g.pid = pid;
  g.fd = life[1];
  g.sent = first;
  return g;
}

}  // namespace

void note_inherited_fds() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return;
  const int own = dirfd(d);
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end && *end == '\0' && e->d_name[0] != '\0' && fd >= 3 && fd != own)
      inherited_fds().push_back(static_cast<int>(fd));
  }
  closedir(d);
}

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

// Sets the moment the guardian kills the command's group, earlier or later than before. The
// write end is non-blocking: a guardian that does not read (stopped) never holds elect up; the
// next call sends the moment again.
void set_guardian(Guardian& g, Clock::time_point at) {
  const std::int64_t ns = boot_ns(at);
  if (g.fd >= 0 && write(g.fd, &ns, sizeof ns) == static_cast<ssize_t>(sizeof ns)) g.sent = ns;
}

// Tells the guardian the lease's new earliest expiry (after a renewal).
void extend_guardian(Guardian& g, Clock::time_point expiry) {
  if (boot_ns(expiry) > g.sent) set_guardian(g, expiry);
}

bool become_subreaper() { return prctl(PR_SET_CHILD_SUBREAPER, 1) == 0; }

namespace {

// The parent pid of `pid` from /proc/<pid>/stat, or -1.
pid_t parent_of(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[512];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  const char* close_paren = std::strrchr(buf, ')');
  if (!close_paren) return -1;
  char state = 0;
  int ppid = -1;
  if (std::sscanf(close_paren + 1, " %c %d", &state, &ppid) != 2) return -1;
  return static_cast<pid_t>(ppid);
}

std::vector<pid_t> descendants(pid_t root) {
  std::vector<std::pair<pid_t, pid_t>> all;  // pid, parent
  if (DIR* d = opendir("/proc")) {
    while (dirent* e = readdir(d)) {
      char* end = nullptr;
      long v = std::strtol(e->d_name, &end, 10);
      if (!end || *end != '\0' || v <= 0) continue;
      const auto pid = static_cast<pid_t>(v);
      all.emplace_back(pid, parent_of(pid));
    }
    closedir(d);
  }
  std::vector<pid_t> out{root};
  for (std::size_t i = 0; i < out.size(); ++i)
    for (const auto& [pid, parent] : all)
      if (parent == out[i] && pid != root) out.push_back(pid);
  out.erase(out.begin());
  return out;
}

}  // namespace

int kill_descendants(std::chrono::milliseconds within) {
  const pid_t self = getpid();
  const auto until = std::chrono::steady_clock::now() + within;
  int killed = 0;
  for (;;) {
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
    const std::vector<pid_t> left = descendants(self);
    if (left.empty() || std::chrono::steady_clock::now() >= until) return killed;
    for (pid_t p : left)
      if (kill(p, SIGKILL) == 0) ++killed;
    struct timespec ts {
      0, 10 * 1000 * 1000
    };
    nanosleep(&ts, nullptr);
  }
}

std::string command_cgroup_parent(std::string* why) {
  if (const char* off = std::getenv("FENCEGATE_ELECT_CGROUP"); off && std::strcmp(off, "0") == 0) {
    *why = "FENCEGATE_ELECT_CGROUP=0";
    return {};
  }
  // Our own cgroup v2: the "0::<path>" line (the only line on a pure v2 host).
  std::string own;
  if (FILE* f = std::fopen("/proc/self/cgroup", "re")) {
    char line[4096];
    while (std::fgets(line, sizeof line, f))
      if (std::strncmp(line, "0::", 3) == 0) {
        own = line + 3;
        while (!own.empty() && (own.back() == '\n' || own.back() == '\r')) own.pop_back();
      }
    std::fclose(f);
  }
  if (own.empty() || own.find("(deleted)") != std::string::npos) {
    *why = "no cgroup v2 entry in /proc/self/cgroup";
    return {};
  }
  // The cgroup2 mount: /sys/fs/cgroup on a unified host, /sys/fs/cgroup/unified on a hybrid one.
  // A mountinfo line: id parent major:minor root mountpoint options... - fstype source options.
  std::string mount;
  if (FILE* f = std::fopen("/proc/self/mountinfo", "re")) {
    char line[8192];
    while (std::fgets(line, sizeof line, f)) {
      const char* dash = std::strstr(line, " - cgroup2 ");
      if (!dash) continue;
      char root[4096], point[4096];
      if (std::sscanf(line, "%*s %*s %*s %4095s %4095s", root, point) != 2) continue;
      if (std::strcmp(root, "/") != 0) continue;  // a mount of a subtree (a container's view) is not ours to map
      mount = point;
      break;
    }
    std::fclose(f);
  }
  if (mount.empty()) {
    *why = "no cgroup2 file system mounted";
    return {};
  }
  std::string dir = mount + (own == "/" ? std::string() : own);
  if (access((dir + "/cgroup.procs").c_str(), W_OK) != 0) {
    *why = dir + " is not writable";
    return {};
  }
  // Probe: make a cgroup there and remove it again (a read-only mount, no delegation).
  const std::string probe = dir + "/fencegate-elect-probe-" + std::to_string(getpid());
  if (mkdir(probe.c_str(), 0755) != 0) {
    *why = "cannot create a cgroup in " + dir + ": " + std::strerror(errno);
    return {};
  }
  const bool has_kill = access((probe + "/cgroup.kill").c_str(), W_OK) == 0;
  rmdir(probe.c_str());
  (void)has_kill;  // without cgroup.kill (kernel < 5.14) each pid of cgroup.procs is killed
  return dir;
}

std::string make_command_cgroup(const std::string& dir) {
  if (mkdir(dir.c_str(), 0755) == 0) return {};
  if (errno != EEXIST) return "cannot create " + dir + ": " + std::strerror(errno);
  if (kill_command_cgroup(dir, std::chrono::milliseconds(2000)) < 0) return dir + " exists and cannot be emptied";
  if (mkdir(dir.c_str(), 0755) != 0) return "cannot create " + dir + ": " + std::strerror(errno);
  return {};
}

namespace {

std::vector<pid_t> cgroup_pids(const std::string& dir) {
  std::vector<pid_t> out;
  if (FILE* f = std::fopen((dir + "/cgroup.procs").c_str(), "re")) {
    int p;
    while (std::fscanf(f, "%d", &p) == 1) out.push_back(static_cast<pid_t>(p));
    std::fclose(f);
  }
  return out;
}

}  // namespace

int kill_command_cgroup(const std::string& dir, std::chrono::milliseconds within) {
  const auto until = std::chrono::steady_clock::now() + within;
  const std::vector<pid_t> first = cgroup_pids(dir);
  const std::string kill_file = dir + "/cgroup.kill";
  const bool can_kill = access(kill_file.c_str(), W_OK) == 0;
  for (;;) {
    std::vector<pid_t> left = cgroup_pids(dir);
    if (!left.empty()) {
      if (!can_kill || !write_text(kill_file.c_str(), "1", 1))
        for (pid_t p : left) kill(p, SIGKILL);
    }
    while (waitpid(-1, nullptr, WNOHANG) > 0) {  // orphans we are the subreaper of
    }
    if (left.empty() && rmdir(dir.c_str()) == 0) return static_cast<int>(first.size());
    if (left.empty() && errno == ENOENT) return static_cast<int>(first.size());
    if (std::chrono::steady_clock::now() >= until) return -1;
    struct timespec ts {
      0, 10 * 1000 * 1000
    };
    nanosleep(&ts, nullptr);
  }
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
            Guardian* guardian, std::string* cgroup) {
  // Everything the child needs is built before fork(): after it, only async-signal-safe calls.
  std::vector<char*> argv;
  argv.reserve(command.size() + 1);
  for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  envp.reserve(env.size() + 1);
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
  const bool keep_hup_ignored = hup_ignored();
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
    if (!keep_hup_ignored) sigaction(SIGHUP, &dfl, nullptr);  // under nohup the command ignores hangups too
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
  // Into its own cgroup before it may exec (it waits for the go byte): everything it starts is
  // born there.
  if (cgroup && !cgroup->empty()) {
    const std::string p = std::to_string(pid);
    if (!write_text((*cgroup + "/cgroup.procs").c_str(), p.c_str(), p.size())) {
      rmdir(cgroup->c_str());  // unused: the command runs without (the subreaper remains)
      cgroup->clear();
    }
  }
  *guardian = start_guardian(pid, expiry, cgroup ? *cgroup : std::string());
  { [[maybe_unused]] auto w = write(go[1], "g", 1); }
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

}  // namespace fencegate::election
