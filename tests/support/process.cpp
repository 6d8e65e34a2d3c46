#include "tests/support/process.h"

#include <arpa/inet.h>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <netinet/in.h>
#include <poll.h>
#include <mutex>
#include <random>
#include <vector>
#include <sstream>
#include <stdexcept>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "tests/support/net_util.h"

extern char** environ;

namespace fencegate::testing {

namespace {

ExitStatus decode(int wstatus) {
  ExitStatus s;
  if (WIFEXITED(wstatus)) {
    s.exited = true;
    s.code = WEXITSTATUS(wstatus);
  } else if (WIFSIGNALED(wstatus)) {
    s.signaled = true;
    s.signal = WTERMSIG(wstatus);
  }
  return s;
}

// Everything the child needs, prepared before fork (only async-signal-safe calls after it).
struct ExecPlan {
  std::vector<std::string> argv_s, env_s;
  std::vector<char*> argv, env;
  ExecPlan(const std::vector<std::string>& args, const std::vector<std::string>& extra_env) : argv_s(args) {
    for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
    for (const auto& e : extra_env) env_s.push_back(e);
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env_s) env.push_back(e.data());
    env.push_back(nullptr);
  }
};

// In the child: default signal dispositions and an empty mask, die with the parent.
void child_common() {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int s : {SIGPIPE, SIGTERM, SIGINT, SIGXFSZ, SIGCHLD, SIGHUP}) ::signal(s, SIG_DFL);
}

}  // namespace

std::string ExitStatus::describe() const {
  if (exited) return "exit code " + std::to_string(code);
  if (signaled) return std::string("killed by signal ") + std::to_string(signal) + " (" + strsignal(signal) + ")";
  return "unknown";
}

TempDir::TempDir(const std::string& prefix) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/" + prefix + "-XXXXXX";
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp: " + std::string(std::strerror(errno)));
  path_ = tmpl;
}

TempDir::~TempDir() {
  if (std::getenv("FENCEGATE_KEEP_TMP")) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

Process Process::start(const std::vector<std::string>& argv, const ProcessOptions& options) {
  if (argv.empty()) throw std::runtime_error("Process::start: empty argv");
  ExecPlan plan(argv, options.env);
  int log_fd = ::open(options.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) throw std::runtime_error("open " + options.log_path + ": " + std::strerror(errno));
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log_fd);
    throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    child_common();
    ::setpgid(0, 0);
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    if (options.fsize_limit) {
      // The soft limit only: a test may lift it on the running process (prlimit) to model a
      // disk that has room again.
      rlimit rl{};
      ::getrlimit(RLIMIT_FSIZE, &rl);
      rl.rlim_cur = *options.fsize_limit;
      ::setrlimit(RLIMIT_FSIZE, &rl);
    }
    ::execve(plan.argv[0], plan.argv.data(), plan.env.data());
    const char msg[] = "Process::start: execve failed\n";
    (void)!::write(2, msg, sizeof msg - 1);
    ::_exit(127);
  }
  ::close(log_fd);
  Process p;
  p.pid_ = pid;
  p.log_path_ = options.log_path;
  return p;
}

Process::Process(Process&& o) noexcept
    : pid_(std::exchange(o.pid_, -1)), log_path_(std::move(o.log_path_)), status_(std::move(o.status_)) {}

Process& Process::operator=(Process&& o) noexcept {
  if (this != &o) {
    if (pid_ > 0 && !status_) {
      ::kill(pid_, SIGKILL);
      reap(true);
    }
    pid_ = std::exchange(o.pid_, -1);
    log_path_ = std::move(o.log_path_);
    status_ = std::move(o.status_);
  }
  return *this;
}

Process::~Process() {
  if (pid_ > 0 && !status_) {
    ::kill(pid_, SIGKILL);
    reap(true);
  }
}

bool Process::reap(bool block) {
  if (pid_ <= 0 || status_) return true;
  int ws = 0;
  pid_t r;
  do {
    r = ::waitpid(pid_, &ws, block ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == pid_) {
    status_ = decode(ws);
    return true;
  }
  return false;
}

std::string Process::log(std::size_t max_bytes) const { return read_file(log_path_, max_bytes); }

bool Process::running() { return pid_ > 0 && !reap(false); }

namespace {

// Whether process `pid` holds the socket listening on 127.0.0.1:`port` (/proc/net/tcp's LISTEN
// entry, matched by inode against the process's descriptors). Suites run in parallel: a port
// picked free can be taken by another process before ours binds it, and a connect alone would
// then mistake that process for ours.
bool listens_on(pid_t pid, std::uint16_t port) {
  std::ifstream tcp("/proc/net/tcp");
  std::string line;
  char want[16];
  std::snprintf(want, sizeof want, "0100007F:%04X", port);
  std::vector<std::string> inodes;
  std::getline(tcp, line);  // header
  while (std::getline(tcp, line)) {
    std::istringstream in(line);
    std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
    in >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
    if (local == want && state == "0A") inodes.push_back("socket:[" + inode + "]");
  }
  if (inodes.empty()) return false;
  std::error_code ec;
  for (const auto& d : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code lec;
    const std::string target = std::filesystem::read_symlink(d.path(), lec).string();
    for (const auto& i : inodes)
      if (target == i) return true;
  }
  return false;
}

}  // namespace

bool Process::wait_for_port(std::uint16_t port, std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (!running()) return false;
    Fd fd = connect_loopback(port, 200ms);
    if (fd.valid() && listens_on(pid_, port)) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

void Process::kill(int signal) {
  if (pid_ > 0 && !status_) ::kill(pid_, signal);
}

ExitStatus Process::wait() {
  reap(true);
  return status_.value_or(ExitStatus{});
}

std::optional<ExitStatus> Process::wait_for(std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (true) {
    if (reap(false)) return status_;
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(10ms);
  }
}

ExitStatus Process::stop(std::chrono::milliseconds grace) {
  if (pid_ <= 0) return {};
  kill(SIGTERM);
  if (auto s = wait_for(grace)) return *s;
  kill(SIGKILL);
  return wait();
}

std::uint16_t free_port() {
  // Below the kernel's ephemeral range, so that the port-0 binds of the processes under test
  // (admin listeners, client sockets) never land on a port picked here before it is bound.
  int low = 32768, high = 60999;
  {
    std::ifstream r("/proc/sys/net/ipv4/ip_local_port_range");
    r >> low >> high;
  }
  if (low > 12000) {
    static std::mt19937 rng(static_cast<unsigned>(::getpid()) * 2654435761u ^
                            static_cast<unsigned>(Clock::now().time_since_epoch().count()));
    static std::mutex rng_mu;
    std::lock_guard lk(rng_mu);
    std::uniform_int_distribution<int> pick(10000, low - 1);
    for (int attempt = 0; attempt < 200; ++attempt) {
      Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(static_cast<std::uint16_t>(pick(rng)));
      if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return ntohs(addr.sin_port);
    }
  }
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    throw std::runtime_error(std::string("free_port bind: ") + std::strerror(errno));
  socklen_t len = sizeof addr;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.sin_port);
}

CommandResult run_command(const std::vector<std::string>& argv, std::chrono::milliseconds timeout) {
  CommandResult res;
  ExecPlan plan(argv, {});
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    child_common();
    int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    ::execve(plan.argv[0], plan.argv.data(), plan.env.data());
    const char msg[] = "run_command: execve failed\n";
    (void)!::write(2, msg, sizeof msg - 1);
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  Fd out_fd(out_pipe[0]), err_fd(err_pipe[0]);
  auto deadline = Clock::now() + timeout;
  bool out_open = true, err_open = true;
  while (out_open || err_open) {
    auto left = remaining(deadline);
    if (left.count() == 0) {
      res.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd p[2] = {{out_open ? out_fd.get() : -1, POLLIN, 0}, {err_open ? err_fd.get() : -1, POLLIN, 0}};
    int n = ::poll(p, 2, int(left.count()));
    if (n < 0 && errno != EINTR) break;
    char buf[4096];
    for (int i = 0; i < 2; ++i) {
      if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t r = ::read(p[i].fd, buf, sizeof buf);
      if (r <= 0) {
        (i == 0 ? out_open : err_open) = false;
      } else {
        (i == 0 ? res.out : res.err).append(buf, std::size_t(r));
      }
    }
  }
  int ws = 0;
  while (::waitpid(pid, &ws, 0) < 0 && errno == EINTR) {}
  res.status = decode(ws);
  return res;
}

std::string read_file(const std::string& path, std::size_t max_tail_bytes) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string s = ss.str();
  if (max_tail_bytes && s.size() > max_tail_bytes) s = "...\n" + s.substr(s.size() - max_tail_bytes);
  return s;
}

void write_file(const std::string& path, const std::string& content) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << content;
  if (!f) throw std::runtime_error("cannot write " + path);
}

}  // namespace fencegate::testing
