// Issue 30: the admin API's idempotency-key endpoints (docs/idempotency.md), Asio-free; admin.cpp
// dispatches to them.
//
//   GET    /v1/resources/{id}/idempotency/{key}   the key's row: {"key", "state", "status",
//          "created_at", "expires_at", "generation", ...}; 404 if the resource holds no such key
//   DELETE /v1/resources/{id}/idempotency/{key}   clears it (an operator who has checked what the
//          upstream did with an "unknown" operation); a retry is then forwarded as new
//
// {key} is percent-encoded; ?client=ADDRESS names the client of a route with "scope": "client".
//
// Thread-safety: as the store (every call is thread-safe). DELETE waits for the store's commit.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "fence_store/store.h"

namespace fencegate::proxy {

struct AdminAnswer {
  unsigned status = 200;
  std::string content_type = "application/json";
  std::string body;
};

// `rest`: the path after "/v1/resources/" ("{id}/idempotency/{key}"); `q`: the query's parameters.
AdminAnswer idempotency_endpoint(store::Store& store, std::string_view method, std::string_view rest,
                                 const std::map<std::string, std::string>& q);

// The key row as the admin API and `fencegate keys --json` print it (one JSON object).
std::string key_json(const store::KeyRecord& r);

// Decodes %XX escapes (and nothing else). False if an escape is malformed.
bool percent_decode(std::string_view in, std::string* out);

}  // namespace fencegate::proxy
