// Config: the one validated, immutable description of what `fencegate serve` does.
//
// Built from (lowest to highest precedence) built-in defaults, a JSON config file
// (--config / FENCEGATE_CONFIG), FENCEGATE_* environment variables, and command-line flags.
// Validation collects every error; a Config that load_serve() returns is valid and the rest of
// the program may assume so.
//
// Thread-safety: a Config is immutable after load; share it as std::shared_ptr<const Config>.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fencegate::config {

enum class Mode { enforce, observe, off };

std::string_view to_string(Mode m);
std::optional<Mode> parse_mode(std::string_view s);

// "host:port" split. host may be an IPv4 address, "[v6]" or a name.
struct Endpoint {
  std::string host;
  std::uint16_t port = 0;
  std::string to_string() const;  // "host:port" (v6 in brackets)
};

// An election whose leader alone may write through a route (authority-linked fencing): the proxy
// watches the election's keys in etcd ("<election>/<lease-hex>"; the leader is the live key with the
// lowest create_revision) and admits only the current leader key's creation revision.
struct Authority {
  std::vector<std::string> etcd;       // "http://host:port" each, normalised; at least one
  std::string election;                // election name (etcd key prefix "<election>/")
  std::chrono::milliseconds grace{0};  // 0: the leader's lease TTL; else min(TTL, grace)
  // issue 31 (ZooKeeper and Redis token sources): "coordinator": "zk://host:port[,..][/chroot]" or
  // "redis://host:port[/db]" instead of "etcd" (an "etcd://host:port[,..]" coordinator is put into
  // `etcd` by validate() and this stays empty). Exactly one of etcd and coordinator.
  std::string coordinator;
  // issue 31: a file holding the coordinator's secret (zk: user:password for digest auth; redis:
  // password or user:password), owner-only mode; only with a zk:// or redis:// coordinator.
  std::string auth_file;
  // issue 31: "poll_ms" (redis:// only): the interval of the safety-net snapshot while Redis keyspace
  // notifications carry the view; 0 = window/3. Without notifications the poll stays window/3.
  std::chrono::milliseconds poll{0};
  // Issue 27 (tls-ctl): etcd over https and etcd users: "cacert", "cert", "key" (PEM paths),
  // "user" and "password_file" (owner-only mode; or FENCEGATE_ETCD_PASSWORD). Only for etcd.
  std::string cacert, cert, key, user, password_file;

  // Canonical text naming this authority (equal iff the settings are equal).
  std::string id() const;
  bool operator==(const Authority&) const = default;
};

// Idempotency (issue 30, docs/idempotency.md): a route's "idempotency" object; operation IDs
// (an Idempotency-Key header) make a retried write take effect once.
struct Idempotency {
  std::string header = "Idempotency-Key";                  // "header": the request field
  bool required = false;                                    // "required": a keyed write without it -> 400
  std::chrono::seconds retention{std::chrono::hours(24)};  // "retention": how long a key is kept
  std::uint64_t max_body_bytes = 65536;                     // "max_body_bytes": largest response body kept
  std::uint64_t max_keys = 1000000;                         // "max_keys": per resource; over -> 503
  std::vector<std::string> methods;                         // "methods": empty = the route's fenced methods
  bool scope_client = false;                                // "scope": "resource" (false) | "client"
  bool forward_unknown = false;                             // "on_unknown": "refuse" (false) | "forward"
  // "release_statuses": upstream answers that say it did not act (the key is released);
  // "unknown_statuses": answers after which whether it acted is unknown. Every other status is final.
  std::vector<int> release_statuses{408, 425, 429, 503};
  std::vector<int> unknown_statuses{502, 504};
  static constexpr std::uint64_t kMaxBodyLimit = 16u << 20;  // max_body_bytes is at most this
};

struct Route {
  std::string prefix;      // as configured, e.g. "/tenants/{tenant}/"
  std::string upstream;    // as configured, e.g. "http://127.0.0.1:9000" or "https://api.example.com"
  Endpoint upstream_addr;  // parsed from upstream (http://, or https:// with the fields below)
  std::string resource = "default";  // template, e.g. "tenant-{tenant}" (captures must exist in prefix)
  Mode mode = Mode::enforce;
  std::vector<std::string> write_methods{"POST", "PUT", "PATCH", "DELETE"};  // upper-case tokens
  bool fence_reads = false;
  std::optional<Authority> authority;  // authority-linked fencing (needs a restart to change)
  // Who may create a resource of this route. on_write: any fenced write (today's behaviour);
  // fenced_only: only the admin fence endpoint (the activation barrier) or a write whose
  // generation the route's election authority confirms as leader. Any other write to a resource
  // that has never been fenced is refused (409 resource-not-fenced) and creates nothing.
  bool fenced_only = false;  // "new_resources": "on_write" | "fenced_only"
  // The most resources this route's writes may create (0: only the global max_resources), so
  // one capture route cannot use up max_resources for every other route.
  std::size_t max_resources = 0;
  std::optional<Idempotency> idempotency;  // issue 30: "idempotency" (absent: off)

  // TLS (issue 27): the verified client identities that may send requests through this route
  // (exact, or "prefix*"); empty: anyone. Others get 403 client-not-allowed (docs/tls.md).
  std::vector<std::string> allowed_clients;

  // TLS to the upstream (issue 27, docs/tls.md "The upstream"): an "https://" upstream. Verified by
  // default (against upstream_ca, else the system's CAs; the name is upstream_server_name, else the
  // upstream's host); upstream_cert/upstream_key: a client certificate for an upstream that asks.
  bool upstream_tls = false;  // set by validate(): the upstream is https://
  std::string upstream_ca, upstream_cert, upstream_key, upstream_server_name;
  bool upstream_verify = true;  // false only when set explicitly (a warning at start)

  // Returns true iff `method` (case-sensitive, as on the wire) is fenced on this route.
  bool is_fenced(std::string_view method) const;
  // Issue 30: true iff the route keys `method` by operation ID (its idempotency methods, else its
  // fenced methods).
  bool is_keyed(std::string_view method) const;
};

// TLS on the data listener (issue 27, docs/tls.md).
enum class ClientAuth { none, optional, required };
struct TlsSni {
  std::vector<std::string> names;  // server names (exact, or "*.example.com")
  std::string cert, key;           // PEM paths
};
struct Tls {
  std::string cert, key;      // PEM: certificate chain and its private key
  std::string client_ca;      // PEM bundle of CAs client certificates must chain to
  ClientAuth client_auth = ClientAuth::none;
  std::string min_version = "1.2";  // "1.2" | "1.3"
  std::vector<TlsSni> sni;    // more certificates, chosen by the client's server name
  // Session resumption (TLS 1.3 tickets, TLS 1.2 tickets and session IDs). Off: every connection
  // makes a full handshake (no ticket is sent, no session is cached).
  bool session_resumption = true;
  bool enabled() const { return !cert.empty() || !key.empty(); }
};
// True iff `identity` is allowed by `patterns` (exact names, or "prefix*").
bool client_allowed(const std::vector<std::string>& patterns, std::string_view identity);

struct Config {
  Endpoint listen{"127.0.0.1", 8080};
  std::string db = "./fence.db";
  int threads = 0;  // 0 in input means "hardware threads"; after load it is >= 1
  std::vector<Route> routes;

  // Token headers.
  std::string token_header = "Fencing-Token";
  std::string leader_header = "Fencing-Leader";
  std::size_t max_leader_bytes = 256;

  // Limits.
  std::size_t max_header_bytes = 16 * 1024;            // request line + headers; over -> 431
  std::uint64_t max_body_bytes = 1ull << 30;            // declared or streamed body; over -> 413
  std::size_t max_connections = 10000;                  // concurrent client connections
  std::size_t max_connections_per_client = 0;           // per client address; more closed at accept; 0: off
  std::size_t max_resources = 100000;                   // distinct fenced resources held in memory

  // Timeouts.
  std::chrono::milliseconds header_timeout{10000};       // time to receive a request head -> 408
  std::chrono::milliseconds idle_timeout{60000};         // keep-alive idle between requests
  std::chrono::milliseconds body_timeout{30000};         // no body progress from the client
  std::chrono::milliseconds upstream_connect_timeout{3000};  // -> 502
  std::chrono::milliseconds upstream_timeout{30000};     // no upstream progress -> 504
  std::chrono::milliseconds drain_timeout{10000};        // older in-flight writes -> aborted, 504

  std::size_t upstream_idle_per_thread = 64;             // pooled idle upstream connections

  std::string log_level = "info";                        // debug|info|warn|error

  // "auto": each worker sends a reactor pass's writes in one io_uring submission where the
  // kernel allows it (else one sendmsg each); false ("off"): always one sendmsg each.
  bool io_uring = true;

  // Admin listener (operations API). Binding off loopback requires a bearer token.
  struct Admin {
    Endpoint listen{"127.0.0.1", 9901};
    std::string token_file;  // path; "" = no token (only allowed on a loopback bind)
    std::string token;       // read from token_file at load (trimmed, >= 16 bytes), never logged
    // Connections that stall or flood must not starve probes and fences (docs/security.md).
    std::chrono::milliseconds header_timeout{10000};  // total for one request's head and body
    std::chrono::milliseconds write_timeout{10000};   // one answer's write; over -> connection closed
    std::size_t max_connections = 64;                 // at the cap the longest-idle one is closed
    std::size_t max_connections_per_client = 8;       // per client address; more are closed at accept
    // Issue 27 (tls-ctl): TLS on the admin listener, the same keys as the top-level `tls` (no sni);
    // off while tls.cert is empty. The bearer token is still required as without TLS.
    Tls tls;
  } admin;

  // Audit retention, pruned in the background (off the request path). 0 = unlimited. Limited by
  // default: every refusal writes a row, so an unbounded log would let a flood fill the disk
  // (docs/security.md).
  struct Audit {
    std::chrono::seconds max_age{std::chrono::hours(24 * 90)};
    std::uint64_t max_rows = 10'000'000;
  } audit;

  // TLS on the data listener (issue 27): off while tls.cert is empty. The verified client
  // identity goes to the upstream in client_identity_header (a client's own is always dropped).
  Tls tls;
  std::string client_identity_header = "Fencing-Client-Identity";
  // Fleet (issue 33, docs/fleet.md): one fence shared by several replicas on etcd. Off (the
  // single-sidecar fence in SQLite) unless `etcd` is given; then name and member are required.
  struct Fleet {
    std::vector<std::string> etcd;  // "http://host:port" or "https://host:port" each
    std::string name;               // the fleet: keys under fencegate/fleet/<name>/
    std::string member;             // this replica's id, unique in the fleet
    std::chrono::milliseconds ttl{5000};
    // Issue 27: etcd over https and etcd users, as an authority's (docs/fleet.md, docs/tls.md):
    // "cacert", "cert", "key" (PEM paths), "user" and "password_file" (owner-only mode; or
    // FENCEGATE_ETCD_PASSWORD). TLS files only with https:// endpoints.
    std::string cacert, cert, key, user, password_file;
    bool enabled() const { return !etcd.empty(); }
  } fleet;

  // Where the config came from (for reload and messages); empty for flag-only.
  std::string config_file;

  // The serve arguments this config was loaded from; reload re-runs load_serve(args) so flags
  // and environment keep overriding the file exactly as at start.
  std::vector<std::string> args;
};

// Checks that `next` may replace `current` on a live process: listen, db, threads,
// admin.listen and the routes' authorities need a restart. Returns the errors (empty if fine).
std::vector<std::string> reload_incompatibilities(const Config& current, const Config& next);

// Result of loading: either a valid config, or every error found (each names the field).
struct LoadResult {
  std::optional<Config> config;
  std::vector<std::string> errors;  // e.g. "routes[0].mode: must be one of enforce, observe, off (got \"enforse\")"
  bool help = false;                // --help was given: print serve_usage() and exit 0
  // Not errors: e.g. "FENCEGATE_MODEE: unknown environment variable, ignored (did you mean
  // FENCEGATE_MODE?)". The caller logs them; a typo in a variable's name would otherwise leave a
  // setting at its default without a word.
  std::vector<std::string> warnings;
};

// Parses `fencegate serve` arguments (argv after the subcommand), the environment (FENCEGATE_*)
// and, if given, the JSON file; validates; returns the result. `env` is a lookup function so tests
// can inject an environment; nullptr means the process environment.
using EnvLookup = const char* (*)(const char*);
LoadResult load_serve(const std::vector<std::string>& args, EnvLookup env = nullptr);

// Warnings for the FENCEGATE_* names in `present` (variable names, without values) that no setting
// reads: each says it is ignored and, if a known name is one or two edits away, suggests it.
// load_serve calls it with the process environment's names when it reads the real environment.
std::vector<std::string> unknown_env_warnings(const std::vector<std::string>& present);

// Parses and validates a JSON document (the config file's contents). `source` names it in errors.
LoadResult load_json(std::string_view json_text, std::string_view source = "config");

// Validates a fully built Config (used by both loaders); appends errors.
void validate(Config& c, std::vector<std::string>& errors);

// Help text for `fencegate serve --help`: every flag, its env variable and default.
std::string serve_usage();

}  // namespace fencegate::config
