// `fencegate serve`: the fenced reverse proxy. Asio/Beast stay behind this header.
#pragma once

#include <memory>

#include "config/config.h"

namespace fencegate::proxy {

// Runs the proxy until SIGINT/SIGTERM. Returns the process exit code: 0 after a clean stop,
// 1 when it cannot start (store owned by another process, port in use, upstream unresolvable).
int run_serve(std::shared_ptr<const config::Config> cfg);

}  // namespace fencegate::proxy
