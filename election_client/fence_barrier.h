// The activation barrier of `fencegate elect`: before the elected command starts, every --fence
// (a fencegate admin resource URL) must durably advance to the new fencing token -- POST
// <URL>/fence {"generation": N, "leader": ID} with Fencing-Token: N, answered 200 with that
// generation. A refusal ends the barrier at once; an unreachable or 5xx fence is retried until
// the timeout.
//
// Thread-safety: fence_one is called on a helper thread (run_watched); `cancel` is raised by the
// main thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "election_client/http_conn.h"

namespace fencegate::election {

struct FenceBarrierOptions {
  std::string leader_id;     // "leader" in the POST body (FENCING_LEADER_ID)
  std::string bearer_token;  // Authorization: Bearer ...; "" for none
  std::int64_t timeout_ms = 30000;  // per fence, retrying while it is unreachable or 5xx
  std::string cacert;               // issue 27: CA file for https fences (elect --fence-cacert); "" = system store
};

enum class FenceResult { ok, refused, unreachable, cancelled };

// Advances one fence (`url`, `url_text` as given, for logs) to `token`. Returns ok once it
// answered 200 with the generation; refused on any other non-5xx answer (or a 200 without the
// generation: not a fencegate fence); unreachable after the timeout; cancelled when `cancel` rose.
FenceResult fence_one(const FenceBarrierOptions& f, const HttpUrl& url, const std::string& url_text, std::int64_t token,
                      const std::atomic<bool>& cancel);

}  // namespace fencegate::election
