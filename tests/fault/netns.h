// A network namespace for partition tests: `fgp-<pid>-<n>`, joined to the root namespace by a
// veth pair with a private /30 (10.254.X.0/30: .1 on the root side, .2 inside), loopback up.
// Commands run inside with wrap(argv) (`ip netns exec NAME ...`). A partition is a set of
// iptables DROP rules inside the namespace -- never in the root namespace's tables -- and heal()
// removes them. The destructor deletes the namespace (its rules and the veth pair go with it),
// also when a test failed; sweep_stale() removes namespaces left by test processes that died.
//
// Needs root, `ip` and `iptables` (nf_tables or legacy backend: whichever works inside the
// namespace). available() says whether this machine can; tests skip otherwise.
// Header-only because tests/CMakeLists.txt compiles tests/fault/*_test.cpp alone.
//
// Thread-safety: a Netns is used by one thread at a time; sweep_stale() and available() are safe.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/support/process.h"

namespace fencegate::testing {

class Netns {
 public:
  // Creates the namespace, the veth pair and the addresses. Throws std::runtime_error naming the
  // command that failed (whatever was created is removed first).
  Netns() {
    static std::atomic<int> counter{0};
    const int n = counter++;
    const std::string pid = std::to_string(::getpid());
    name_ = "fgp-" + pid + "-" + std::to_string(n);
    host_if_ = "fgh" + pid + "-" + std::to_string(n);
    ns_if_ = "fgn" + pid + "-" + std::to_string(n);
    if (host_if_.size() > 15) {  // IFNAMSIZ - 1
      host_if_ = "fgh" + std::to_string(::getpid() % 100000) + "-" + std::to_string(n);
      ns_if_ = "fgn" + std::to_string(::getpid() % 100000) + "-" + std::to_string(n);
    }
    // Address choice and setup under a lock, so two test processes never pick the same /30.
    const int lock = ::open("/tmp/fencegate-netns.lock", O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    if (lock >= 0) ::flock(lock, LOCK_EX);
    try {
      const int x = pick_subnet();
      host_addr_ = "10.254." + std::to_string(x) + ".1";
      ns_addr_ = "10.254." + std::to_string(x) + ".2";
      created_ = true;
      must({ip(), "netns", "add", name_});
      must({ip(), "link", "add", host_if_, "type", "veth", "peer", "name", ns_if_});
      must({ip(), "link", "set", ns_if_, "netns", name_});
      must({ip(), "addr", "add", host_addr_ + "/30", "dev", host_if_});
      must({ip(), "link", "set", host_if_, "up"});
      must(wrap({ip(), "addr", "add", ns_addr_ + "/30", "dev", ns_if_}));
      must(wrap({ip(), "link", "set", ns_if_, "up"}));
      must(wrap({ip(), "link", "set", "lo", "up"}));
      iptables_ = pick_iptables();
    } catch (...) {
      if (lock >= 0) ::close(lock);
      teardown();
      throw;
    }
    if (lock >= 0) ::close(lock);
  }
  ~Netns() { teardown(); }
  Netns(const Netns&) = delete;
  Netns& operator=(const Netns&) = delete;

  const std::string& name() const { return name_; }
  const std::string& host_addr() const { return host_addr_; }  // root side of the veth
  const std::string& ns_addr() const { return ns_addr_; }      // inside
  const std::string& iptables() const { return iptables_; }

  // argv run inside the namespace.
  std::vector<std::string> wrap(const std::vector<std::string>& argv) const {
    std::vector<std::string> w{ip(), "netns", "exec", name_};
    w.insert(w.end(), argv.begin(), argv.end());
    return w;
  }

  // Drops TCP between the namespace and host_addr():port both ways (port 0: all traffic to and
  // from host_addr()). Rules add up until heal().
  void partition(std::uint16_t port = 0) {
    std::vector<std::vector<std::string>> rules;
    if (port == 0) {
      rules = {{"OUTPUT", "-d", host_addr_, "-j", "DROP"}, {"INPUT", "-s", host_addr_, "-j", "DROP"}};
    } else {
      const std::string p = std::to_string(port);
      rules = {{"OUTPUT", "-d", host_addr_, "-p", "tcp", "--dport", p, "-j", "DROP"},
               {"INPUT", "-s", host_addr_, "-p", "tcp", "--sport", p, "-j", "DROP"}};
    }
    for (auto& r : rules) {
      std::vector<std::string> argv{iptables_, "-w", "-A"};
      argv.insert(argv.end(), r.begin(), r.end());
      must(wrap(argv));
      rules_.push_back(r);
    }
  }

  // Removes every rule partition() added, newest first.
  void heal() {
    while (!rules_.empty()) {
      std::vector<std::string> argv{iptables_, "-w", "-D"};
      argv.insert(argv.end(), rules_.back().begin(), rules_.back().end());
      must(wrap(argv));
      rules_.pop_back();
    }
  }
  bool partitioned() const { return !rules_.empty(); }

  // `iptables -S` inside, for failure messages.
  std::string rules_text() const {
    auto r = run_command(wrap({iptables_, "-w", "-S"}), std::chrono::seconds(10));
    return r.out + r.err;
  }

  // Returns true iff this machine can create namespaces and filter inside them (root, ip,
  // iptables); *why says what is missing.
  static bool available(std::string* why) {
    if (::geteuid() != 0) {
      *why = "not root";
      return false;
    }
    if (ip().empty()) {
      *why = "no `ip` binary";
      return false;
    }
    try {
      Netns probe;
      probe.partition(1);
      probe.heal();
    } catch (const std::exception& e) {
      *why = e.what();
      return false;
    }
    return true;
  }

  // Deletes fgp-<pid>-<n> namespaces whose test process is gone. Returns how many.
  static int sweep_stale() {
    if (ip().empty()) return 0;
    auto r = run_command({ip(), "netns", "list"}, std::chrono::seconds(10));
    std::istringstream in(r.out);
    std::string line;
    int removed = 0;
    while (std::getline(in, line)) {
      std::string name = line.substr(0, line.find(' '));
      if (name.rfind("fgp-", 0) != 0) continue;
      const std::size_t dash = name.find('-', 4);
      if (dash == std::string::npos) continue;
      const long pid = std::strtol(name.substr(4, dash - 4).c_str(), nullptr, 10);
      if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)) {
        run_command({ip(), "netns", "del", name}, std::chrono::seconds(10));
        ++removed;
      }
    }
    return removed;
  }

  static const std::string& ip() {
    static const std::string path = [] {
      for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
        if (::access(p, X_OK) == 0) return std::string(p);
      return std::string();
    }();
    return path;
  }

 private:
  void must(const std::vector<std::string>& argv) {
    auto r = run_command(argv, std::chrono::seconds(15));
    if (r.code() != 0) {
      std::string cmd;
      for (const auto& a : argv) cmd += a + " ";
      throw std::runtime_error("netns: `" + cmd + "` failed (" + r.status.describe() + "): " + r.err + r.out);
    }
  }

  // A third octet X such that no address or route of the root namespace is in 10.254.X.0/24.
  static int pick_subnet() {
    auto a = run_command({ip(), "-4", "-o", "addr", "show"}, std::chrono::seconds(10));
    auto r = run_command({ip(), "-4", "route", "show", "table", "all"}, std::chrono::seconds(10));
    const std::string text = a.out + "\n" + r.out;
    std::set<int> used;
    for (std::size_t p = text.find("10.254."); p != std::string::npos; p = text.find("10.254.", p + 1))
      used.insert(std::atoi(text.c_str() + p + 7));
    std::mt19937 rng(static_cast<unsigned>(::getpid()) * 2654435761u ^
                     static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
    for (int tries = 0; tries < 1000; ++tries) {
      int x = 16 + static_cast<int>(rng() % 224);
      if (!used.count(x)) return x;
    }
    throw std::runtime_error("netns: no free 10.254.X.0/24");
  }

  std::string pick_iptables() {
    for (const char* p : {"/usr/sbin/iptables", "/usr/sbin/iptables-legacy", "/sbin/iptables", "/usr/sbin/iptables-nft"}) {
      if (::access(p, X_OK) != 0) continue;
      auto r = run_command(wrap({p, "-w", "-S"}), std::chrono::seconds(10));
      if (r.code() == 0) return p;
    }
    throw std::runtime_error("netns: no working iptables inside the namespace (tried iptables, iptables-legacy)");
  }

  void teardown() {
    if (!created_) return;
    created_ = false;
    rules_.clear();
    run_command({ip(), "netns", "del", name_}, std::chrono::seconds(10));
    // The veth pair dies with the namespace; if the namespace was never made, remove the host end.
    run_command({ip(), "link", "del", host_if_}, std::chrono::seconds(10));
  }

  std::string name_, host_if_, ns_if_, host_addr_, ns_addr_, iptables_;
  std::vector<std::vector<std::string>> rules_;
  bool created_ = false;
};

}  // namespace fencegate::testing
