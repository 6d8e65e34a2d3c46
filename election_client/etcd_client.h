// A client of etcd v3's JSON gateway (etcd 3.4: POST /v3/..., keys and values base64, int64 as
// JSON strings, zero values omitted, errors as HTTP 500 {"error","message","code"}).
//
// Fencing token: the leader key's *creation revision* -- LeaderKey::rev from campaign(), equal to
// KeyValue::create_revision of the leader key from leader() or range(). Not the header revision,
// not mod_revision, not the lease ID.
//
// Every call blocks the calling thread for at most ClientOptions::request_timeout (campaign():
// until elected, an error, or *cancel). Endpoints fail over as described in http_conn.h.
//
// Thread-safety: a Client is thread-safe; concurrent calls use separate pooled connections.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "election_client/status.h"

namespace fencegate::election {

class HttpConnection;
class TlsClient;

// Issue 27 (docs/tls.md): how to reach a secured etcd. https endpoints are verified against
// `cacert` (else the system store) with the host name checked; `cert`/`key` are the client
// certificate for --client-cert-auth. With `user`, every call carries a token from
// /v3/auth/authenticate (renewed when etcd rejects it: simple tokens expire after 5 minutes).
struct EtcdSecurity {
  std::string cacert, cert, key;  // PEM paths (etcdctl's --cacert, --cert, --key)
  std::string user;
  std::string password;  // read from a file or FENCEGATE_ETCD_PASSWORD, never from a flag; never logged
  bool operator==(const EtcdSecurity&) const = default;
};

// "" if `s` fits `endpoints`, else why, naming the setting (`prefix` + "cacert", ...): TLS files
// only with https:// endpoints, and their files load (a key matches its certificate).
std::string check_etcd_security(const EtcdSecurity& s, const std::vector<std::string>& endpoints,
                                const std::string& prefix);
// Reads an etcd password file: owner-only mode, one line, trimmed. "" or why (never the contents).
std::string read_etcd_password(const std::string& path, std::string* out);
// A config section's etcd settings (`prefix`: "authority.", "fleet."): with a user, s->password
// from `password_file`, else from FENCEGATE_ETCD_PASSWORD; then check_etcd_security. "" or why,
// naming the field.
std::string complete_etcd_security(EtcdSecurity* s, const std::string& password_file,
                                   const std::vector<std::string>& endpoints, const std::string& prefix);

struct ClientOptions {
  std::vector<std::string> endpoints;                 // "http://host:port" or "https://host:port", at least one
  std::chrono::milliseconds request_timeout{5000};    // per call, failover included
  std::chrono::milliseconds connect_timeout{1000};    // per endpoint
  EtcdSecurity security;                              // issue 27: TLS files and user authentication
};

// Splits "http://a:2379,https://b:2379" and checks each URL. Returns true iff all are valid
// http:// or https://host:port URLs without a path.
bool parse_endpoint_list(std::string_view csv, std::vector<std::string>* out, std::string* err);

// Issue 27: the HTTP connection settings of `o` (endpoints and the TLS context `tls`, built once by
// the caller with make_etcd_tls). For the watch's own connection.
std::shared_ptr<const TlsClient> make_etcd_tls(const ClientOptions& o);
// A token for `o.security.user` (POST /v3/auth/authenticate). OK with "" when no user is set or
// etcd has auth disabled; an etcd error saying "authentication failed" for a wrong password.
Status authenticate(const ClientOptions& o, std::string* token, const std::atomic<bool>* cancel = nullptr);

struct ResponseHeader {
  std::int64_t revision = 0;
  std::int64_t raft_term = 0;
  std::string member_id;
};

struct KeyValue {
  std::string key, value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  std::int64_t version = 0;
  std::int64_t lease = 0;
};

// etcd's election LeaderKey: `rev` is the creation revision of `key` -- the fencing token.
struct LeaderKey {
  std::string name, key;
  std::int64_t rev = 0;
  std::int64_t lease = 0;
};

struct LeaseGrant {
  std::int64_t id = 0;
  std::int64_t ttl = 0;  // seconds, as granted (may exceed the request: etcd's minimum TTL)
};

// Fleet (issue 33): a transaction's parts. A compare checks a key's mod_revision (0: the key is
// absent), or with target `lease` the lease the key is attached to (an absent key has none, so it
// fails any lease but 0); an op puts (with an optional lease), deletes a range ("" range_end: just
// `key`), or reads one (at the transaction's revision, after the ops before it).
struct TxnCompare {
  std::string key;
  std::int64_t mod_revision = 0;
  enum class Target { mod, lease } target = Target::mod;
  std::int64_t lease = 0;
};
struct TxnOp {
  enum class Type { put, del, range } type = Type::put;
  std::string key, value, range_end;
  std::int64_t lease = 0;
};

class Client {
 public:
  // REQUIRES: options.endpoints are valid (parse_endpoint_list); throws std::invalid_argument if not.
  explicit Client(ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const ClientOptions& options() const { return options_; }

  // Leases.
  // timeout 0: ClientOptions::request_timeout.
  Status grant(std::int64_t ttl_seconds, LeaseGrant* out, std::chrono::milliseconds timeout = {});
  // One renewal. *ttl_out is the TTL etcd reset the lease to; 0 means the lease is gone
  // (etcd answers a keepalive on an expired or revoked lease with no TTL).
  Status keepalive(std::int64_t lease_id, std::int64_t* ttl_out, std::chrono::milliseconds timeout);
  // Revokes; a lease that is already gone counts as revoked (OK).
  Status revoke(std::int64_t lease_id, std::chrono::milliseconds timeout);
  // Remaining TTL in seconds; -1 when the lease does not exist.
  Status time_to_live(std::int64_t lease_id, std::int64_t* ttl_out);

  // Elections. campaign() blocks until this lease's key under `name` is the oldest (elected),
  // an error, or *cancel is set (Status::Cancelled). While it waits, etcd itself keeps the lease
  // alive. An already existing candidacy of the same lease is reused (etcd's recipe).
  Status campaign(std::string_view name, std::int64_t lease_id, std::string_view value, LeaderKey* out,
                  const std::atomic<bool>* cancel = nullptr);
  // The current leader's key-value (value = what the leader campaigned with; create_revision =
  // its fencing token). Status::is_no_leader() when there is none.
  Status leader(std::string_view name, KeyValue* out, ResponseHeader* header = nullptr);
  // Deletes the leader key (if it is still this one). OK if it was already gone.
  Status resign(const LeaderKey& leader, std::chrono::milliseconds timeout);

  // KV (for watch resync and tests). range_end "" = just `key`.
  Status range(std::string_view key, std::string_view range_end, std::vector<KeyValue>* out,
               ResponseHeader* header = nullptr);
  // Several ranges in one read-only transaction: one round trip, every range at one revision
  // (linearizable, as range()). (*out)[i] holds what reads[i] = {key, range_end} found.
  Status ranges(const std::vector<std::pair<std::string, std::string>>& reads, std::vector<std::vector<KeyValue>>* out,
                ResponseHeader* header = nullptr);
  Status put(std::string_view key, std::string_view value, std::int64_t lease = 0, ResponseHeader* header = nullptr);
  Status delete_range(std::string_view key, std::string_view range_end, std::int64_t* deleted = nullptr);

  // Fleet (issue 33): if every compare holds, runs `success`, else nothing. *succeeded says which;
  // *header (optional) carries the transaction's revision; *ranges (optional) what each range op of
  // `success` found, in their order (empty when the compares failed).
  Status txn(const std::vector<TxnCompare>& compares, const std::vector<TxnOp>& success, bool* succeeded,
             ResponseHeader* header = nullptr, std::vector<std::vector<KeyValue>>* ranges = nullptr);

  // The raw call: POSTs `body` to `path` (e.g. "/v3/kv/range") and returns the JSON text of a
  // 200 answer in *out, or the etcd error. `timeout` is shared among the endpoints (an attempt
  // on one that does not answer gets an equal share of the time left, then the next is tried).
  Status call(std::string_view path, const std::string& body, std::string* out, std::chrono::milliseconds timeout,
              const std::atomic<bool>* cancel = nullptr);

 private:
  // call(); share=false gives the whole timeout to one attempt (campaign: it waits, cancellably).
  Status call_shared(std::string_view path, const std::string& body, std::string* out,
                     std::chrono::milliseconds timeout, const std::atomic<bool>* cancel, bool share);

  std::unique_ptr<HttpConnection> take();
  void give_back(std::unique_ptr<HttpConnection> c);
  // Issue 27: the auth token to send ("" without a user); `renew` drops the cached one first.
  Status token(HttpConnection& conn, bool renew, std::string* out, const std::atomic<bool>* cancel);

  // Constant after construction
  const ClientOptions options_;
  std::shared_ptr<const TlsClient> tls_;  // issue 27: built once for every https connection

  std::mutex mu_;
  // Guarded by mu_
  std::vector<std::unique_ptr<HttpConnection>> idle_;
  std::string token_;  // issue 27: the current etcd auth token (guarded by mu_)
};

// The key prefix under which an election's candidates live ("<name>/").
std::string election_prefix(std::string_view name);

}  // namespace fencegate::election
