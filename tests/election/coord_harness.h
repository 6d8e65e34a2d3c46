// Election-test harness for the ZooKeeper and Redis backends: a real standalone ZooKeeper (the
// Debian 3.8 server, run in the foreground with java and a config written into a temp dir:
// clientPort on a free port, tickTime 200 ms so that 2 s sessions are allowed, admin server off)
// and a real redis-server (no persistence, its own dir), each on 127.0.0.1, stopped and removed
// afterwards; both restartable on the same port and pausable with SIGSTOP.
//
// Tests call FG_REQUIRE_ZK() / FG_REQUIRE_REDIS() first: without the server they are skipped.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "tests/election/etcd_harness.h"
#include "tests/support/process.h"

namespace fencegate::testing {

inline const std::string kZkJar = "/usr/share/java/zookeeper.jar";
inline const std::string kJava = "/usr/bin/java";
inline const std::string kRedisServer = "/usr/bin/redis-server";

inline bool zk_available() { return ::access(kZkJar.c_str(), R_OK) == 0 && ::access(kJava.c_str(), X_OK) == 0; }
inline bool redis_available() { return ::access(kRedisServer.c_str(), X_OK) == 0; }

#define FG_REQUIRE_ZK()                                                                                  \
  do {                                                                                                   \
    if (!::fencegate::testing::zk_available()) {                                                         \
      MESSAGE("SKIPPED: the ZooKeeper server is not installed (apt-get install zookeeper default-jre)"); \
      return;                                                                                            \
    }                                                                                                    \
  } while (0)

#define FG_REQUIRE_REDIS()                                                              \
  do {                                                                                  \
    if (!::fencegate::testing::redis_available()) {                                     \
      MESSAGE("SKIPPED: redis-server is not installed (apt-get install redis-server)"); \
      return;                                                                           \
    }                                                                                   \
  } while (0)

// A single-server ZooKeeper. Sessions may be 400 ms .. 60 s (tickTime 200 ms).
class ZkServer {
 public:
  ZkServer() : dir_(std::make_unique<TempDir>("fencegate-zk")), port_(free_port()) {}
  ~ZkServer() { stop(); }

  std::uint16_t port() const { return port_; }
  std::string hostport() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string url(const std::string& chroot = "") const { return "zk://" + hostport() + chroot; }
  pid_t pid() const { return process_ ? process_->pid() : -1; }

  bool start(std::chrono::milliseconds timeout = 30s) {
    write_file(dir_->file("zoo.cfg"), "tickTime=200\ndataDir=" + dir_->file("data") +
                                          "\nclientPort=" + std::to_string(port_) +
                                          "\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
                                          "maxSessionTimeout=60000\n4lw.commands.whitelist=\n");
    ProcessOptions o;
    o.log_path = dir_->file("zk.log");
    process_ = std::make_unique<Process>(
        Process::start({kJava, "-Xmx128m", "-XX:TieredStopAtLevel=1", "-Xshare:auto", "-Djava.net.preferIPv4Stack=true",
                        "-Dzookeeper.admin.enableServer=false", "-cp", "/etc/zookeeper/conf:" + kZkJar,
                        "org.apache.zookeeper.server.ZooKeeperServerMain", dir_->file("zoo.cfg")},
                       o));
    if (!process_->wait_for_port(port_, timeout)) {
      last_probe_ = "port " + std::to_string(port_) + " never opened";
      return false;
    }
    // Serving once `fencegate leader` gets an answer (no leader: exit 3).
    return eventually(
        [&] {
          auto r =
              run_command({kFencegate, "leader", "--coordinator", url(), "--election", "probe", "--timeout-ms", "2000"},
                          10s);
          last_probe_ = r.err;
          return r.code() == 3;
        },
        timeout);
  }
  void stop() {
    if (process_) {
      process_->kill(SIGCONT);
      process_->stop(5s);
      process_.reset();
    }
  }
  std::string log() const { return last_probe_ + "\n" + read_file(dir_->file("zk.log"), 8 * 1024); }

 private:
  std::unique_ptr<TempDir> dir_;
  std::uint16_t port_;
  std::unique_ptr<Process> process_;
  std::string last_probe_;
};

#define FG_START_ZK(zk) REQUIRE_MESSAGE((zk).start(), "ZooKeeper did not start:\n", (zk).log())

class RedisServer {
 public:
  RedisServer() : dir_(std::make_unique<TempDir>("fencegate-redis")), port_(free_port()) {}
  ~RedisServer() { stop(); }

  std::uint16_t port() const { return port_; }
  std::string url(int db = 0) const {
    return "redis://127.0.0.1:" + std::to_string(port_) + (db ? "/" + std::to_string(db) : "");
  }

  // `extra`: more redis-server arguments (e.g. {"--requirepass", "..."}).
  bool start(const std::vector<std::string>& extra = {}, std::chrono::milliseconds timeout = 15s) {
    std::vector<std::string> argv{kRedisServer, "--port",       std::to_string(port_),
                                  "--bind",     "127.0.0.1",    "--save",
                                  "",           "--appendonly", "no",
                                  "--dir",      dir_->path(),   "--daemonize",
                                  "no"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    ProcessOptions o;
    o.log_path = dir_->file("redis.log");
    process_ = std::make_unique<Process>(Process::start(argv, o));
    return process_->wait_for_port(port_, timeout);
  }
  void stop() {
    if (process_) {
      process_->kill(SIGCONT);
      process_->stop(5s);
      process_.reset();
    }
  }
  void pause() { process_->kill(SIGSTOP); }
  void resume() { process_->kill(SIGCONT); }
  std::string log() const { return read_file(dir_->file("redis.log"), 8 * 1024); }

 private:
  std::unique_ptr<TempDir> dir_;
  std::uint16_t port_;
  std::unique_ptr<Process> process_;
};

#define FG_START_REDIS(r, ...) REQUIRE_MESSAGE((r).start(__VA_ARGS__), "redis-server did not start:\n", (r).log())

}  // namespace fencegate::testing
