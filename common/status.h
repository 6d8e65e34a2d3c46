// Status: the outcome of a call that can fail, cheap to copy (leveldb style): a kind, a code and
// a message, with named constructors. The one status type of the libraries: the fence store's
// (store::Status) and the election client's (election::Status) are this type.
//
//   ok           success (also what a default-constructed Status holds).
//   error        a failure described by its message alone: the fence store's commit or query
//                failed (SQLite's reason), or the store refused a write (read-only, shutting down).
//   unavailable  no endpoint could be reached, or the connection broke, or the call timed out:
//                the request may or may not have taken effect.
//   etcd_error   etcd answered with an error ({"error","message","code"}, HTTP 500); code() is the
//                gRPC code and message() etcd's text ("election: no leader", "lease not found").
//   http_error   a non-etcd HTTP peer answered with an unexpected status (code() is that status).
//   protocol     the answer could not be parsed.
//   cancelled    the caller's cancel flag was raised.
//
// Thread-safety: immutable value type.
#pragma once

#include <string>
#include <utility>

namespace fencegate {

class Status {
 public:
  enum class Kind { ok, error, unavailable, etcd_error, http_error, protocol, cancelled };

  Status() = default;
  static Status OK() { return Status(); }
  // An empty message becomes "unknown error": a failure always says something.
  static Status Error(std::string msg) {
    return Status(Kind::error, 0, msg.empty() ? std::string("unknown error") : std::move(msg));
  }
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
  int code() const { return code_; }  // gRPC code (etcd_error) or HTTP status (http_error); else 0
  const std::string& message() const { return msg_; }  // "" when ok()
  // The kind and the message, for logs and operators ("ok" when ok()).
  std::string to_string() const;

 private:
  Status(Kind k, int code, std::string msg) : kind_(k), code_(code), msg_(std::move(msg)) {}
  Kind kind_ = Kind::ok;
  int code_ = 0;
  std::string msg_;
};

}  // namespace fencegate
