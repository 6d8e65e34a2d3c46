// `fencegate elect --status-listen ADDR`: readiness and metrics of one elect process.
//
//   GET /readyz   200 "ready" only while this process leads with its activation barrier complete
//                 (catch-up done, every fence up, the command started) and its lease valid;
//                 else 503 (for a Kubernetes readiness probe or a load balancer).
//   GET /metrics  Prometheus text:
//     fencegate_elect_leader                        1 while ready as above, else 0
//     fencegate_elect_generation                    the token of the current (or last) term
//     fencegate_elect_leadership_seconds            how long the current term has been active
//     fencegate_elect_campaigns_total               campaigns started
//     fencegate_elect_losses_total{reason}          terms ended without the command's own exit:
//                                                   jeopardy, lost, deleted, catch_up, fence
//     fencegate_elect_renewal_margin_seconds        histogram: time left to the lease deadline
//                                                   when a renewal moved it (seen while leading)
//     fencegate_elect_stage_seconds{stage}          the last activation's stages: acquire (win
//                                                   -> confirmed), catch_up, fence, start
//
// A tiny blocking HTTP/1.0 server on its own thread (one request per connection; no Beast).
//
// Thread-safety: ElectMetrics is updated by elect's main thread and read by the server thread
// under its mutex.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace fencegate::election {

class ElectMetrics {
 public:
  void campaign();
  void loss(const std::string& reason);
  void stage(const std::string& stage, std::chrono::nanoseconds d);
  void renewal_margin(std::chrono::nanoseconds left);
  // Leading with the barrier complete (ready) from now, with `generation`; or not any more.
  void set_ready(bool ready, std::int64_t generation = 0);
  bool ready() const;

  std::string render() const;  // Prometheus text format

 private:
  mutable std::mutex mu_;
  bool ready_ = false;
  std::int64_t generation_ = 0;
  std::chrono::steady_clock::time_point since_{};
  std::uint64_t campaigns_ = 0;
  std::map<std::string, std::uint64_t> losses_;
  std::map<std::string, double> stages_;
  std::vector<std::uint64_t> margin_buckets_;  // parallel to kMarginBounds, cumulative at render
  std::uint64_t margin_count_ = 0;
  double margin_sum_ = 0;
};

class StatusServer {
 public:
  explicit StatusServer(ElectMetrics& m) : m_(m) {}
  ~StatusServer();  // stop()
  StatusServer(const StatusServer&) = delete;
  StatusServer& operator=(const StatusServer&) = delete;

  // Listens on "host:port" (IPv4 or a name; port 0: any). Returns "" or the error.
  std::string start(const std::string& addr);
  void stop();
  std::uint16_t port() const { return port_; }

 private:
  void loop();

  ElectMetrics& m_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// Splits "host:port" for --status-listen; "" or the error.
std::string parse_listen_addr(const std::string& addr, std::string* host, std::uint16_t* port);

}  // namespace fencegate::election
