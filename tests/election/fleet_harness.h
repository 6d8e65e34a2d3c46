// The fleet's test harness (issue 33): `fencegate serve` replicas with "fleet" in their config
// (Replica) and a three-member etcd cluster on loopback with its own data dirs and ephemeral ports
// (EtcdCluster). Shared by tests/election/fleet_test.cpp and tests/fault/fleet_schedule_test.cpp.
// Header-only (each suite is one binary of its folder's *_test.cpp).
#pragma once

#include <signal.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/election/etcd_harness.h"
#include "tests/support/http_client.h"

namespace fencegate::testing {

// The replicas' ttl_ms: the smallest the config allows, so a lapse shows within ~2 s.
constexpr int kFleetTtlMs = 2000;

class Replica {
 public:
  Replica(const EtcdServer& etcd, const std::string& upstream, const std::string& fleet, const std::string& member,
          int drain_ms = 8000)
      : Replica(std::vector<std::string>{etcd.url()}, upstream, fleet, member, drain_ms) {}
  Replica(const std::vector<std::string>& etcd, const std::string& upstream, const std::string& fleet,
          const std::string& member, int drain_ms = 8000)
      : Replica(etcd, fleet, member,
                nlohmann::json::array(
                    {{{"prefix", "/"}, {"upstream", upstream}, {"resource", "ledger"}, {"mode", "enforce"}}}),
                {{"drain_timeout_ms", drain_ms}}) {}
  // Any routes; `extra` is merged into the top level of the config (timeouts, ...).
  Replica(const std::vector<std::string>& etcd, const std::string& fleet, const std::string& member,
          nlohmann::json routes, nlohmann::json extra)
      : dir_(std::make_unique<TempDir>("fencegate-fleet")), port_(free_port()), admin_port_(free_port()) {
    while (admin_port_ == port_) admin_port_ = free_port();
    nlohmann::json c = {{"listen", "127.0.0.1:" + std::to_string(port_)},
                        {"db", dir_->file("fence.db")},
                        {"threads", 2},
                        {"drain_timeout_ms", 8000},
                        {"admin", {{"listen", "127.0.0.1:" + std::to_string(admin_port_)}}},
                        {"routes", std::move(routes)},
                        {"fleet", {{"etcd", etcd}, {"name", fleet}, {"member", member}, {"ttl_ms", kFleetTtlMs}}}};
    for (auto& [k, v] : extra.items()) c[k] = v;
    write_file(dir_->file("fencegate.json"), c.dump(2));
  }
  bool start() {
    ProcessOptions o;
    o.log_path = dir_->file("fencegate.log");
    process_ =
        std::make_unique<Process>(Process::start({kFencegate, "serve", "--config", dir_->file("fencegate.json")}, o));
    return process_->wait_for_port(port_, 15s) && process_->wait_for_port(admin_port_, 15s) &&
           eventually([&] { return admin("/readyz").code() == 200; }, 15s);
  }
  void signal(int sig) { process_->kill(sig); }
  void kill9() {
    process_->kill(SIGKILL);
    process_->stop(3s);
  }
  bool running() { return process_ && process_->running(); }
  // SIGTERM: a graceful stop (what it had queued for its store is committed first).
  int stop() { return process_->stop(10s).code; }
  std::string db() const { return dir_->file("fence.db"); }
  std::string config_path() const { return dir_->file("fencegate.json"); }
  std::uint16_t admin_port() const { return admin_port_; }
  std::uint16_t port() const { return port_; }
  std::string log() const { return "fencegate log:\n" + read_file(dir_->file("fencegate.log"), 16 * 1024); }

  ReadResult write(std::int64_t g, std::chrono::milliseconds timeout = 15s) const {
    return request(port_, "POST", "/ledger/charge", {{"Fencing-Token", std::to_string(g)}}, "{\"amount\": 1}", timeout);
  }
  ReadResult admin(const std::string& target) const { return request(admin_port_, "GET", target, {}, {}, 5s); }
  // A metric's value from /metrics (-1 if absent).
  double metric(const std::string& name) const {
    ReadResult r = admin("/metrics");
    if (!r.ok()) return -1;
    const std::string& b = r.response.body;
    for (std::size_t at = b.find(name + " "); at != std::string::npos; at = b.find(name + " ", at + 1))
      if (at == 0 || b[at - 1] == '\n') return std::stod(b.substr(at + name.size() + 1));
    return -1;
  }

 private:
  std::unique_ptr<TempDir> dir_;
  std::uint16_t port_, admin_port_;
  std::unique_ptr<Process> process_;
};

// A three-member etcd cluster on loopback (own data dirs, ephemeral ports).
class EtcdCluster {
 public:
  static constexpr int kSize = 3;
  EtcdCluster() : dir_(std::make_unique<TempDir>("fencegate-etcd3")) {
    for (int i = 0; i < kSize; ++i) {
      client_[i] = free_port();
      peer_[i] = free_port();
    }
  }
  ~EtcdCluster() {
    for (auto& p : procs_)
      if (p) {
        p->kill(SIGCONT);
        p->stop(3s);
      }
  }
  std::string url(int i) const { return "http://127.0.0.1:" + std::to_string(client_[i]); }
  std::vector<std::string> urls() const { return {url(0), url(1), url(2)}; }
  std::uint16_t client_port(int i) const { return client_[i]; }
  bool running(int i) const { return procs_[i] != nullptr; }
  void start_member(int i, bool fresh) {
    std::string cluster;
    for (int k = 0; k < kSize; ++k)
      cluster +=
          (k ? "," : "") + std::string("e") + std::to_string(k) + "=http://127.0.0.1:" + std::to_string(peer_[k]);
    const std::string peer = "http://127.0.0.1:" + std::to_string(peer_[i]);
    ProcessOptions o;
    o.log_path = dir_->file("etcd" + std::to_string(i) + ".log");
    procs_[i] = std::make_unique<Process>(Process::start({kEtcdBinary,
                                                          "--name",
                                                          "e" + std::to_string(i),
                                                          "--data-dir",
                                                          dir_->file("data" + std::to_string(i)),
                                                          "--listen-client-urls",
                                                          url(i),
                                                          "--advertise-client-urls",
                                                          url(i),
                                                          "--listen-peer-urls",
                                                          peer,
                                                          "--initial-advertise-peer-urls",
                                                          peer,
                                                          "--initial-cluster",
                                                          cluster,
                                                          "--initial-cluster-state",
                                                          fresh ? "new" : "existing",
                                                          "--initial-cluster-token",
                                                          "fg-fleet",
                                                          "--logger",
                                                          "zap",
                                                          "--log-level",
                                                          "warn"},
                                                         o));
  }
  bool start() {
    for (int i = 0; i < kSize; ++i) start_member(i, true);
    return healthy(20s);
  }
  bool healthy(std::chrono::milliseconds timeout) const {
    fencegate::election::ClientOptions co;
    co.endpoints = urls();
    co.request_timeout = 1000ms;
    fencegate::election::Client c(co);
    return eventually(
        [&] {
          std::vector<election::KeyValue> kvs;
          return c.put("fencegate-test-probe", "x").ok() && c.range("fencegate-test-probe", "", &kvs).ok();
        },
        timeout);
  }
  // The member that leads now (-1 if none answers).
  int leader() const {
    for (int i = 0; i < kSize; ++i) {
      if (!procs_[i]) continue;
      fencegate::election::ClientOptions co;
      co.endpoints = {url(i)};
      co.request_timeout = 1000ms;
      fencegate::election::Client c(co);
      std::string out;
      if (!c.call("/v3/maintenance/status", "{}", &out, 1000ms).ok()) continue;
      nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
      if (j.is_object() && j.contains("leader") && j.contains("header") && j["header"].contains("member_id") &&
          j["leader"] == j["header"]["member_id"])
        return i;
    }
    return -1;
  }
  void kill9(int i) {
    procs_[i]->kill(SIGKILL);
    procs_[i]->stop(3s);
    procs_[i].reset();
  }
  std::string log(int i) const { return read_file(dir_->file("etcd" + std::to_string(i) + ".log"), 4096); }

 private:
  std::unique_ptr<TempDir> dir_;
  std::uint16_t client_[kSize], peer_[kSize];
  std::unique_ptr<Process> procs_[kSize];
};

}  // namespace fencegate::testing
