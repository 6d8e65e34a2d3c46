// Running the real fencegate binary (or any command) from tests.
//
// Process: fork/exec with stdout+stderr appended to a log file, optional RLIMIT_FSIZE, signals,
// waiting. The child gets PR_SET_PDEATHSIG(SIGKILL) so a crashed test run leaves no proxy behind.
// TempDir: a fresh directory, removed at destruction unless FENCEGATE_KEEP_TMP is set.
//
// Thread-safety: a Process or TempDir is used by one thread at a time; free functions are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <sys/resource.h>
#include <sys/types.h>
#include <vector>

namespace fencegate::testing {

using namespace std::chrono_literals;

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "fencegate-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct ExitStatus {
  bool exited = false;    // normal exit; `code` is valid
  int code = -1;
  bool signaled = false;  // killed by `signal`
  int signal = 0;
  std::string describe() const;
};

struct ProcessOptions {
  std::string log_path;                  // stdout+stderr go here (appended); required
  std::optional<rlim_t> fsize_limit;     // RLIMIT_FSIZE (soft) for the child, bytes
  std::vector<std::string> env;          // extra "NAME=value" entries
};

class Process {
 public:
  // Starts argv[0] (a path) with argv. Throws std::runtime_error if fork fails; an exec failure
  // shows up as exit code 127 and a line in the log.
  static Process start(const std::vector<std::string>& argv, const ProcessOptions& options);

  Process() = default;
  Process(Process&& o) noexcept;
  Process& operator=(Process&& o) noexcept;
  ~Process();  // SIGKILL and reap if still running

  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }
  // The whole log (or its last `max_bytes`).
  std::string log(std::size_t max_bytes = 64 * 1024) const;
  // Returns true iff the process has not exited (reaps it if it has).
  bool running();
  // Returns true iff a TCP connect to 127.0.0.1:port succeeds within timeout; gives up early
  // (false) if the process exits.
  bool wait_for_port(std::uint16_t port, std::chrono::milliseconds timeout = 10s);
  void kill(int signal);
  // Blocks until exit.
  ExitStatus wait();
  // Waits up to timeout; nullopt if still running.
  std::optional<ExitStatus> wait_for(std::chrono::milliseconds timeout);
  // SIGTERM, wait up to `grace`, then SIGKILL. Returns the exit status.
  ExitStatus stop(std::chrono::milliseconds grace = 5s);
  std::optional<ExitStatus> exit_status() const { return status_; }

 private:
  bool reap(bool block);

  pid_t pid_ = -1;
  std::string log_path_;
  std::optional<ExitStatus> status_;
};

// A port that was free a moment ago on 127.0.0.1 (bind 0, read, close).
std::uint16_t free_port();

struct CommandResult {
  ExitStatus status;
  std::string out, err;
  bool timed_out = false;
  int code() const { return status.exited ? status.code : -1; }
};
// Runs argv to completion (killed after timeout), capturing stdout and stderr.
CommandResult run_command(const std::vector<std::string>& argv, std::chrono::milliseconds timeout = 30s);

std::string read_file(const std::string& path, std::size_t max_tail_bytes = 0);
void write_file(const std::string& path, const std::string& content);

}  // namespace fencegate::testing
