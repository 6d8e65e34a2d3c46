// Admin API: the operators' view and steering of the fence, on its own listener and thread
// (loopback by default; a bearer token is required off loopback). Also handles SIGHUP (reload).
//
// Endpoints (each listed with a line of help at GET /):
//   GET  /healthz                      200 while the process runs
//   GET  /readyz                       200 only when it can serve safely, else 503 with the reason
//   GET  /metrics                      Prometheus text
//   GET  /v1/resources[/{id}]          generation, mode, when and by whom it last advanced
//   POST /v1/resources/{id}/fence      activation barrier: advance like a write, forward nothing
//   GET  /v1/audit                     audit rows, newest first, paginated with a stable cursor
//   GET  /v1/audit/unfenced            callers still writing without a valid token
//   POST /v1/config/reload             re-read the config file
#pragma once

#include <memory>
#include <string>

#include "config/config.h"

namespace fencegate::proxy {

class Runtime;

class AdminServer {
 public:
  // Binds `listen` and starts the admin thread. Returns nullptr and sets *error on failure.
  static std::unique_ptr<AdminServer> start(Runtime& rt, const config::Endpoint& listen, std::string* error);
  virtual ~AdminServer() = default;
  // Stops the listener and joins the thread. Idempotent.
  virtual void stop() = 0;
};

}  // namespace fencegate::proxy
