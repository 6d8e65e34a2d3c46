// election::Status: the outcome of one etcd or HTTP call. It is fencegate::Status (common/status.h),
// whose kinds unavailable, etcd_error, http_error, protocol and cancelled are the election
// client's, with is_no_leader() and is_lease_not_found() for etcd's answers.
//
// Thread-safety: immutable value type.
#pragma once

#include "common/status.h"

namespace fencegate::election {

using Status = fencegate::Status;

}  // namespace fencegate::election
