// The election backend interface: what `fencegate elect` and `fencegate leader` need from a
// coordinator, whichever it is (etcd, ZooKeeper, Redis), chosen by the coordinator URL.
//
//   Backend      one per process: opens candidacies and looks up the leader ("observe").
//   Candidacy    one per term: the lease or session that is the TTL ("keep/renew"), the
//                candidate's place in the election ("campaign"), the check after winning that
//                the election's leader is us with our token ("confirm"), the watch on our own
//                leadership once we lead ("guard"/"gone"), and giving it all up ("resign").
//
// Lease safety is the same rule for every backend: a renewal (etcd keepalive, ZooKeeper request
// on the session, Redis PEXPIRE of our lock) SENT at t, once answered, keeps the candidacy valid
// until t + TTL - margin on the boot clock (common/boot_clock.h); no renewal evidence by then is
// jeopardy. valid() reads the clock itself. deadline() + margin() is the earliest moment the
// coordinator can have expired us and let a successor lead: the guardian's kill time.
//
// Thread-safety: a Candidacy's valid()/deadline()/margin()/state() may be called from any thread;
// campaign() runs on elect's helper thread (run_watched) while the main thread reads valid();
// everything else is called from the owner (elect's main) thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/boot_clock.h"
#include "election_client/etcd_client.h"
#include "election_client/status.h"

namespace fencegate::election {

// A coordinator URL, parsed (parse_coordinator):
//   etcd://host:port[,host:port]           (or the --etcd list of http://host:port)
//   zk://host:port[,host:port][/chroot]
//   redis://host:port[/db]
struct Coordinator {
  enum class Kind { etcd, zookeeper, redis };
  Kind kind = Kind::etcd;
  std::vector<std::string> endpoints;  // etcd: http://host:port; zk and redis: host:port
  std::string chroot;                  // zk: "" or "/a/b"
  int db = 0;                          // redis: SELECT db
  // The secret read from --zk-auth / --redis-auth (read_coordinator_auth), never from a flag value:
  // zk: user:password (digest scheme); redis: password, or user:password (ACL user). Never logged.
  std::string auth;
  std::string text;                    // as given (logs)
  // Issue 27 (tls-ctl): etcd's TLS files and user (--cacert, --cert, --key, --user, --password-file).
  EtcdSecurity etcd_security;
};

const char* kind_name(Coordinator::Kind k);

// Why a rediss:// coordinator is refused: this build's hiredis has no TLS.
std::string rediss_refusal();

// Parses a coordinator URL. Returns true with *out set, or false with *why (no leading field name).
bool parse_coordinator(const std::string& url, Coordinator* out, std::string* why);

// Reads the auth file of a ZooKeeper or Redis coordinator into c->auth: owner-only mode (as the
// fence token file), one line, surrounding whitespace trimmed; zk needs user:password. Returns ""
// or the reason (naming the file, never its contents).
std::string read_coordinator_auth(const std::string& path, Coordinator* c);

// The leader of an election as the coordinator shows it.
struct LeaderInfo {
  std::string id;          // the value the leader campaigned with (--id)
  std::int64_t token = 0;  // its fencing token
};

class Candidacy {
 public:
  using Clock = BootClock;
  virtual ~Candidacy() = default;

  // The lease/session: true iff neither in jeopardy nor lost and now < deadline() (reads the clock).
  virtual bool valid() const = 0;
  virtual Clock::time_point deadline() const = 0;
  virtual std::chrono::milliseconds margin() const = 0;
  virtual std::int64_t ttl_ms() const = 0;
  virtual std::string state() const = 0;  // for logs: active, jeopardy, lost, ...
  // For logs: what identifies this candidacy at the coordinator (lease id, session, node, lock).
  virtual std::string handle() const = 0;

  // Blocks until this candidate leads; then *token is its fencing token. May be called again
  // after a failure while valid() (keeps its place in line). `cancel` ends it early.
  virtual Status campaign(const std::atomic<bool>& cancel, std::int64_t* token) = 0;
  // After campaign(): the election's leader is this candidate, with `token`.
  virtual Status confirm(std::int64_t token) = 0;
  // After confirm(): watch our leadership (node/key deleted, lock taken while the session lives).
  virtual void guard() = 0;
  // True once guard() saw our leadership end while the lease/session may still be valid.
  virtual bool gone() = 0;
  // Best effort and bounded: resign (when `leading`) and end the lease/session.
  virtual void give_up(bool leading) = 0;
};

struct CandidacyOptions {
  std::string election;
  std::string id;
  std::int64_t ttl_s = 10;
};

// What an observer (authority-linked fencing in the proxy) sees of an election at one moment:
// every candidate that holds a token (etcd and ZooKeeper: every key/node in line, the leader the
// one with the lowest token; Redis: the lock's holder only), and a number that grows with every
// change the coordinator made (etcd: the header revision; ZooKeeper: the election node's pzxid;
// Redis: the generation counter).
struct ElectionSnapshot {
  struct Candidate {
    std::string key;  // the candidate's key, node name or lock
    std::int64_t token = 0;
    std::string id;
  };
  std::vector<Candidate> candidates;
  std::int64_t revision = 0;
};

// A persistent connection for repeated snapshots of elections. Thread-safety: one caller at a time.
class Observer {
 public:
  virtual ~Observer() = default;
  virtual Status snapshot(const std::string& election, std::chrono::milliseconds timeout, ElectionSnapshot* out) = 0;
};

// Change notices pushed by the coordinator for one election (issue 31: Redis keyspace
// notifications), for an observer that otherwise polls: each notice means "take a snapshot now".
// A ping's answer arrives in order after every notice the coordinator sent before it processed
// the ping, so a pong with no notice left unsnapshotted proves the observer's view was current
// when the ping was sent. Thread-safety: one caller at a time.
class ChangeFeed {
 public:
  enum class Event { timeout, changed, pong, broken };
  virtual ~ChangeFeed() = default;
  // Sends a ping; its answer is a later Event::pong. False if the connection broke.
  virtual bool ping() = 0;
  // Waits up to `timeout` for the next notice or pong.
  virtual Event wait(std::chrono::milliseconds timeout) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // A feed of change notices for `election`; null with *why if the backend has none or the
  // coordinator does not send them (Redis: notify-keyspace-events off; never changed here).
  virtual std::unique_ptr<ChangeFeed> changes(const std::string& election, std::string* why) {
    (void)election;
    *why = "this coordinator pushes no change notices";
    return nullptr;
  }
  // A connection for snapshots of elections (observe the leader and everyone in line).
  virtual std::unique_ptr<Observer> observer() = 0;
  // Opens a lease/session for one term (blocking, bounded) and starts keeping it alive.
  virtual Status start(const CandidacyOptions& o, std::unique_ptr<Candidacy>* out) = 0;
  // The election's current leader (no-leader: Status::is_no_leader()).
  virtual Status leader(const std::string& election, std::chrono::milliseconds timeout, LeaderInfo* out) = 0;
};

// The backend for a coordinator. Returns null with *why when it cannot be made (e.g. an auth file
// that is refused).
std::unique_ptr<Backend> make_backend(const Coordinator& c, std::string* why);

}  // namespace fencegate::election
