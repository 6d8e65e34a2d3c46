// The backends behind make_backend() (backend.h), one translation unit each: etcd_backend.cpp,
// zk_backend.cpp (libzookeeper-mt), redis_backend.cpp (hiredis). Only backend.cpp includes this.
#pragma once

#include <memory>
#include <string>

#include "election_client/backend.h"

namespace fencegate::election {

std::unique_ptr<Backend> make_etcd_backend(const Coordinator& c);
std::unique_ptr<Backend> make_zk_backend(const Coordinator& c, std::string* why);
std::unique_ptr<Backend> make_redis_backend(const Coordinator& c, std::string* why);

// The "no leader" answer every backend gives (Status::is_no_leader()).
Status no_leader_status();

}  // namespace fencegate::election
