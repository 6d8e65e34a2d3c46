// Status (see status.h): the predicates on etcd's answers and the operator-facing text.
#include "common/status.h"

namespace fencegate {

bool Status::is_no_leader() const { return kind_ == Kind::etcd_error && msg_.find("no leader") != std::string::npos; }

bool Status::is_lease_not_found() const {
  return kind_ == Kind::etcd_error && msg_.find("lease not found") != std::string::npos;
}

std::string Status::to_string() const {
  switch (kind_) {
    case Kind::ok: return "ok";
    case Kind::error: return msg_;
    case Kind::unavailable: return "unavailable: " + msg_;
    case Kind::etcd_error: return "etcd error " + std::to_string(code_) + ": " + msg_;
    case Kind::http_error: return "HTTP " + std::to_string(code_) + ": " + msg_;
    case Kind::protocol: return "protocol error: " + msg_;
    case Kind::cancelled: return "cancelled";
  }
  return msg_;
}

}  // namespace fencegate
