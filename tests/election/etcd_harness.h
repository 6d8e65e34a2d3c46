// Election-test harness: a real single-member etcd (/usr/bin/etcd) on 127.0.0.1 with free client
// and peer ports and a temporary data dir, removed afterwards; restartable on the same ports and
// data dir; pausable with SIGSTOP. Plus helpers to run `fencegate elect` / `fencegate leader`.
//
// Tests call FG_REQUIRE_ETCD() first: without /usr/bin/etcd they are skipped with a message.
#pragma once

#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <functional>
#include <memory>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "election_client/etcd_client.h"
#include "tests/support/process.h"

#ifndef FENCEGATE_BINARY
#error "FENCEGATE_BINARY must name the fencegate binary"
#endif

namespace fencegate::testing {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

inline const std::string kFencegate = FENCEGATE_BINARY;
inline const std::string kEtcdBinary = "/usr/bin/etcd";

inline bool etcd_available() { return ::access(kEtcdBinary.c_str(), X_OK) == 0; }

#define FG_REQUIRE_ETCD()                                                                    \
  do {                                                                                       \
    if (!::fencegate::testing::etcd_available()) {                                           \
      MESSAGE("SKIPPED: /usr/bin/etcd is not installed (apt-get install etcd-server)");      \
      return;                                                                                \
    }                                                                                        \
  } while (0)

// Polls `pred` every 20 ms until it is true or `timeout` passes. Returns its last value.
inline bool eventually(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  const auto until = Clock::now() + timeout;
  for (;;) {
    if (pred()) return true;
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(20ms);
  }
}

inline bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

// Returns true iff a process with this pid exists and is not a zombie (an orphan's zombie may
// wait for a PID 1 that does not reap).
inline bool pid_alive(pid_t pid) {
  if (pid <= 0 || (::kill(pid, 0) != 0 && errno != EPERM)) return false;
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  std::size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return true;
  return stat[close + 2] != 'Z' && stat[close + 2] != 'X';
}

class EtcdServer {
 public:
  EtcdServer() : dir_(std::make_unique<TempDir>("fencegate-etcd")), client_port_(free_port()), peer_port_(free_port()) {
    while (peer_port_ == client_port_) peer_port_ = free_port();
  }
  ~EtcdServer() {
    if (process_) {
      process_->kill(SIGCONT);
      process_->stop(3s);
    }
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(client_port_); }
  std::uint16_t client_port() const { return client_port_; }
  pid_t pid() const { return process_ ? process_->pid() : -1; }

  // Starts etcd (again, same ports and data dir) and waits until it serves requests.
  bool start(std::chrono::milliseconds timeout = 20s) {
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_port_);
    std::vector<std::string> argv{kEtcdBinary,
                                  "--name", "fg",
                                  "--data-dir", dir_->file("data"),
                                  "--listen-client-urls", url(),
                                  "--advertise-client-urls", url(),
                                  "--listen-peer-urls", peer,
                                  "--initial-advertise-peer-urls", peer,
                                  "--initial-cluster", "fg=" + peer,
                                  "--initial-cluster-state", "new",
                                  "--logger", "zap",
                                  "--log-level", "warn"};
    ProcessOptions o;
    o.log_path = dir_->file("etcd.log");
    process_ = std::make_unique<Process>(Process::start(argv, o));
    if (!process_->wait_for_port(client_port_, timeout)) return false;
    election::ClientOptions co;
    co.endpoints = {url()};
    co.request_timeout = 1000ms;
    election::Client c(co);
    return eventually(
        [&] {
          std::vector<election::KeyValue> kvs;
          return c.range("fencegate-test-probe", "", &kvs).ok();
        },
        timeout);
  }

  // SIGTERM and wait.
  void stop() {
    if (process_) {
      process_->kill(SIGCONT);
      process_->stop(5s);
      process_.reset();
    }
  }
  // Removes the data dir (stopped first): the next start() is an etcd that has forgotten
  // everything, back at revision 1, on the same ports (as after a restore from an old snapshot).
  void wipe() {
    stop();
    std::filesystem::remove_all(dir_->file("data"));
  }
  void pause() { process_->kill(SIGSTOP); }
  void resume() { process_->kill(SIGCONT); }

  std::string log() const { return read_file(dir_->file("etcd.log"), 8 * 1024); }

 private:
  std::unique_ptr<TempDir> dir_;
  std::uint16_t client_port_, peer_port_;
  std::unique_ptr<Process> process_;
};

#define FG_START_ETCD(etcd) REQUIRE_MESSAGE((etcd).start(), "etcd did not start:\n", (etcd).log())

inline election::ClientOptions client_options(const EtcdServer& etcd) {
  election::ClientOptions o;
  o.endpoints = {etcd.url()};
  o.request_timeout = 3000ms;
  o.connect_timeout = 500ms;
  return o;
}

// A `fencegate elect` contender whose command records its environment into files in `dir`:
//   <name>.pid   the command's pid (it then execs sleep)
//   <name>.token FENCING_TOKEN, <name>.env FENCING_ELECTION and FENCING_LEADER_ID
struct Contender {
  std::string name;
  std::string dir;
  std::unique_ptr<Process> process;

  std::string file(const std::string& ext) const { return dir + "/" + name + "." + ext; }
  bool started_command() const { return file_exists(file("token")); }
  std::int64_t token() const {
    std::string t = read_file(file("token"));
    return t.empty() ? 0 : std::stoll(t);
  }
  pid_t child_pid() const {
    std::string t = read_file(file("pid"));
    return t.empty() ? -1 : static_cast<pid_t>(std::stol(t));
  }
  std::string log() const { return read_file(file("log"), 16 * 1024); }
};

// Starts `fencegate elect` with `flags` and a recording command that sleeps `sleep_s`.
inline Contender start_contender(const std::string& dir, const std::string& name, const std::vector<std::string>& flags,
                                 int sleep_s = 60) {
  Contender c;
  c.name = name;
  c.dir = dir;
  std::vector<std::string> argv{kFencegate, "elect"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  const std::string script = "echo $$ > '" + c.file("pid") + "'; echo \"$FENCING_ELECTION $FENCING_LEADER_ID\" > '" +
                             c.file("env") + "'; echo $FENCING_TOKEN > '" + c.file("token.tmp") + "' && mv '" +
                             c.file("token.tmp") + "' '" + c.file("token") + "'; exec sleep " +
                             std::to_string(sleep_s);
  argv.insert(argv.end(), {"--", "sh", "-c", script});
  ProcessOptions o;
  o.log_path = c.file("log");
  c.process = std::make_unique<Process>(Process::start(argv, o));
  return c;
}

}  // namespace fencegate::testing
