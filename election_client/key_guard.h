// KeyGuard: sees the end of a term that the lease does not show -- the leader key deleted (or
// replaced) while the lease lives -- for `fencegate elect`'s supervision loop.
//
// The lease is not the only way to lose leadership: the leader key can be deleted while the
// lease lives (`etcdctl del`, a cleanup script, a buggy tool). etcd's election then hands
// leadership to the next candidate, with a higher token, and this term is over. KeyGuard
// watches the key from its creation revision on, so a deletion at any time after the campaign
// is seen, and reports it through gone(). After a watch compaction it checks the key directly
// and watches again from there. A watch stream on a member that went silent (SIGSTOPped, hung
// disk) delivers nothing and looks healthy, while the rest of the cluster, which keeps the lease
// alive, may have seen the key deleted and elected the next leader: so the guard also reads the
// key every `probe_every` (a linearizable range, which only a member with a quorum answers,
// with the client's failover to the other endpoints). A deletion is thus seen within about
// `probe_every` even when the watch is stuck. A silent quorum is the LeaseKeeper's business.
//
// Thread-safety: construct, call gone() and destroy on one (the owner) thread; the watch and
// the probe run on their own threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "election_client/etcd_client.h"
#include "election_client/watch.h"

namespace fencegate::election {

class KeyGuard {
 public:
  KeyGuard(ClientOptions options, Client& client, LeaderKey leader, std::chrono::milliseconds probe_every);
  ~KeyGuard();
  KeyGuard(const KeyGuard&) = delete;
  KeyGuard& operator=(const KeyGuard&) = delete;

  // Called by the owner thread in its supervision loop; never blocks on etcd.
  bool gone();

 private:
  struct Probe;  // the periodic read of the key (key_guard.cpp)

  void watch_from(std::int64_t revision);
  // On the watch thread, after a compaction: is the key still ours? Then watch on from there.
  void recheck();

  // Constant after construction
  const ClientOptions options_;
  Client& client_;
  const LeaderKey leader_;

  std::atomic<bool> stopping_{false}, gone_{false};
  std::atomic<std::int64_t> restart_from_{0};
  std::shared_ptr<Probe> probe_;
  // Used only on the owner thread
  std::unique_ptr<Watch> watch_;
};

}  // namespace fencegate::election
