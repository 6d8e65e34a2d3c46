// Looking up an election's current leader with a bounded time spread over the etcd endpoints
// (`fencegate leader`; cmd/leader.cpp prints it).
//
// Thread-safety: a plain blocking call; safe from any thread.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "election_client/etcd_client.h"
#include "election_client/status.h"

namespace fencegate::election {

// Reads `election`'s leader key into *out. The time is shared among the `endpoints`: a call that
// times out ends there and the next one starts on the next endpoint, so one hung member does not
// use all of it. Returns ok, no-leader (is_no_leader()), or the last error.
// REQUIRES: endpoints are valid and non-empty (parse_endpoint_list).
Status lookup_leader(const std::vector<std::string>& endpoints, const std::string& election,
                     std::chrono::milliseconds timeout, KeyValue* out, const EtcdSecurity& security = {});

}  // namespace fencegate::election
