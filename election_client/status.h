// Status: the outcome of one etcd or HTTP call, cheap to copy (leveldb style).
//
//   unavailable  no endpoint could be reached, or the connection broke, or the call timed out:
//                the request may or may not have taken effect.
//   etcd_error   etcd answered with an error ({"error","message","code"}, HTTP 500); code() is the
//                gRPC code and message() etcd's text ("election: no leader", "lease not found").
//   http_error   a non-etcd HTTP peer answered with an unexpected status (http_status()).
//   protocol     the answer could not be parsed.
//   cancelled    the caller's cancel flag was raised.
//
// Thread-safety: immutable value type.
#pragma once

#include <string>

namespace fencegate::election {

class Status {
 public:
  enum class Kind { ok, unavailable, etcd_error, http_error, protocol, cancelled };

  Status() = default;
  static Status OK() { return Status(); }
  static Status Unavailable(std::string msg) { return Status(Kind::unavailable, 0, std::move(msg)); }
  static Status Etcd(int grpc_code, std::string msg) { return Status(Kind::etcd_error, grpc_code, std::move(msg)); }
  static Status Http(int http_status, std::string msg) { return Status(Kind::http_error, http_status, std::move(msg)); }
  static Status Protocol(std::string msg) { return Status(Kind::protocol, 0, std::move(msg)); }
  static Status Cancelled() { return Status(Kind::cancelled, 0, "cancelled"); }

  bool ok() const { return kind_ == Kind::ok; }
  Kind kind() const { return kind_; }
  bool is_unavailable() const { return kind_ == Kind::unavailable; }
  bool is_cancelled() const { return kind_ == Kind::cancelled; }
  bool is_etcd_error() const { return kind_ == Kind::etcd_error; }
  // Returns true iff etcd said the election has no leader.
  bool is_no_leader() const;
  // Returns true iff etcd said the lease does not exist (expired or revoked).
  bool is_lease_not_found() const;
  int code() const { return code_; }  // gRPC code (etcd_error) or HTTP status (http_error)
  const std::string& message() const { return msg_; }
  std::string to_string() const;

 private:
  Status(Kind k, int code, std::string msg) : kind_(k), code_(code), msg_(std::move(msg)) {}
  Kind kind_ = Kind::ok;
  int code_ = 0;
  std::string msg_;
};

}  // namespace fencegate::election
