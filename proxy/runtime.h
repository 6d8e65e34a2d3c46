// Runtime: the state `fencegate serve` shares between the data path and the admin API.
// No Asio or Beast here: this header is included by both sides.
//
// Thread-safety: all members are thread-safe; the config snapshot is replaced whole on reload
// (requests in flight keep the snapshot they started with).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "config/config.h"
#include "config/router.h"
#include "common/log.h"
#include "proxy/tls_upstream.h"

namespace fencegate::store {
class Store;
}

namespace fencegate::proxy {

class Fence;
class Metrics;
class Authorities;
class Fleet;

struct UpstreamAddr {
  std::string ip;
  std::uint16_t port = 0;
};

// One loaded configuration, with what is derived from it. Immutable.
struct Snapshot {
  explicit Snapshot(std::shared_ptr<const config::Config> c) : cfg(std::move(c)), router(cfg->routes) {}
  std::shared_ptr<const config::Config> cfg;
  config::Router router;                            // points into cfg->routes
  std::vector<std::vector<UpstreamAddr>> upstreams; // resolved, by route index
  // TLS to the upstream (issue 27): the client context of each https:// route (else nullptr), by
  // route index, built with the snapshot (at start and at each reload).
  std::vector<std::shared_ptr<const UpstreamTls>> upstream_tls;
  std::size_t route_index(const config::Route* r) const { return static_cast<std::size_t>(r - cfg->routes.data()); }
};

// Counts the fence's resources per route under `snap`'s routes (a route's max_resources): at
// start and after each reload.
void recount_routes(Fence& fence, const Snapshot& snap);

// Resolves every route's upstream and builds the TLS contexts of https:// upstreams; returns
// nullptr and sets *error if one cannot be resolved or a TLS file does not load (then *tls_error,
// if given, is set: a start exits 2 for it).
std::shared_ptr<const Snapshot> make_snapshot(std::shared_ptr<const config::Config> cfg, std::string* error,
                                              bool* tls_error = nullptr);

class Runtime {
 public:
  Runtime(store::Store& s, Fence& f, Metrics& m) : store(s), fence(f), metrics(m) {}

  store::Store& store;
  Fence& fence;
  Metrics& metrics;
  std::atomic<bool> stopping{false};
  Authorities* authorities = nullptr;  // election authorities of routes; set before traffic
  // TLS (issue 27): rebuilds the data listener's certificates on reload; returns "" or why not
  // (the reload then fails and the running certificates stay). Unset without tls. Set before traffic.
  std::function<std::string(const config::Config&)> reload_tls;
  // Issue 27 (tls-ctl): the same for admin.tls (set by the admin server when it serves TLS).
  std::function<std::string(const config::Config&)> reload_admin_tls;
  Fleet* fleet = nullptr;  // fleet (docs/fleet.md); nullptr without "fleet"; set before traffic

  std::shared_ptr<const Snapshot> snapshot() const {
    std::lock_guard lk(mu_);
    return snap_;
  }
  void install(std::shared_ptr<const Snapshot> s) {
    std::lock_guard lk(mu_);
    snap_ = std::move(s);
    snap_version_.fetch_add(1, std::memory_order_release);
  }
  // Changes with every install(): sessions reload their snapshot only when it moved.
  std::uint64_t snapshot_version() const { return snap_version_.load(std::memory_order_acquire); }

  // Store health, from the commit observer: false after a failed commit until one succeeds.
  // Logs each change of health, with SQLite's reason (disk full, I/O error): per-request lines
  // only say store_error.
  void store_result(bool ok, const std::string& error) {
    std::lock_guard lk(mu_);
    if (ok != store_ok_) {
      if (!ok)
        log::error("store: a commit failed; fenced writes that need the store fail closed (503)",
                   {log::kv("error", error)});
      else log::info("store: commits succeed again");
    }
    store_ok_ = ok;
    if (!ok) store_error_ = error;
  }
  bool store_ok(std::string* why) const {
    std::lock_guard lk(mu_);
    if (!store_ok_ && why) *why = store_error_;
    return store_ok_;
  }

  // Re-reads the config file (with the flags and environment of the start) and installs it.
  // Returns the errors; on any error the running config stays. Thread-safe (serialised).
  std::vector<std::string> reload();

 private:
  mutable std::mutex mu_;
  std::atomic<std::uint64_t> snap_version_{0};
  std::shared_ptr<const Snapshot> snap_;  // Guarded by mu_
  bool store_ok_ = true;                   // Guarded by mu_
  std::string store_error_;                // Guarded by mu_
  std::mutex reload_mu_;                   // serialises reloads
};

}  // namespace fencegate::proxy
