// Looking up an election's current leader over the etcd endpoints (see leader_lookup.h).
#include "election_client/leader_lookup.h"

#include <algorithm>

namespace fencegate::election {

Status lookup_leader(const std::vector<std::string>& endpoints, const std::string& election,
                     std::chrono::milliseconds timeout, KeyValue* out, const EtcdSecurity& security) {
  using std::chrono::milliseconds;
  ClientOptions o;
  o.endpoints = endpoints;
  o.security = security;  // issue 27: TLS and user authentication
  o.request_timeout = std::max(timeout / static_cast<long>(endpoints.size()), std::min(milliseconds(200), timeout));
  Client c(o);
  const auto until = std::chrono::steady_clock::now() + timeout;
  Status st = c.leader(election, out);
  for (std::size_t tried = 1;
       st.is_unavailable() && tried < endpoints.size() && std::chrono::steady_clock::now() < until; ++tried)
    st = c.leader(election, out);
  return st;
}

}  // namespace fencegate::election
