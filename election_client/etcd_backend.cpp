// The etcd backend of the election interface (backend.h): a LeaseKeeper's lease is the TTL, etcd's
// election API the campaign, the leader key's creation revision the token, KeyGuard the watch on
// our own leader key. The behaviour is the one `fencegate elect` always had on etcd.
#include <algorithm>
#include <memory>
#include <optional>

#include "common/log.h"
#include "election_client/backend.h"
#include "election_client/backends.h"
#include "election_client/etcd_client.h"
#include "election_client/base64.h"
#include "election_client/key_guard.h"
#include "election_client/lease_keeper.h"
#include "election_client/leader_lookup.h"

namespace fencegate::election {

namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;

class EtcdBackend;

class EtcdCandidacy final : public Candidacy {
 public:
  EtcdCandidacy(EtcdBackend& backend, CandidacyOptions o, std::unique_ptr<LeaseKeeper> keeper)
      : backend_(backend), o_(std::move(o)), keeper_(std::move(keeper)) {}
  ~EtcdCandidacy() override { guard_.reset(); }

  bool valid() const override { return keeper_->valid(); }
  Clock::time_point deadline() const override { return keeper_->deadline(); }
  milliseconds margin() const override { return keeper_->margin(); }
  std::int64_t ttl_ms() const override { return keeper_->ttl_seconds() * 1000; }
  std::string state() const override { return LeaseKeeper::to_string(keeper_->state()); }
  std::string handle() const override {
    return "lease " + std::to_string(keeper_->lease_id()) + (lk_.key.empty() ? "" : " key " + lk_.key);
  }
  Status campaign(const std::atomic<bool>& cancel, std::int64_t* token) override;
  Status confirm(std::int64_t token) override;
  void guard() override;
  bool gone() override { return guard_ && guard_->gone(); }
  void give_up(bool leading) override;

 private:
  EtcdBackend& backend_;
  const CandidacyOptions o_;
  std::unique_ptr<LeaseKeeper> keeper_;
  LeaderKey lk_;
  std::unique_ptr<KeyGuard> guard_;
};

class EtcdObserver final : public Observer {
 public:
  explicit EtcdObserver(ClientOptions o) : client_(std::move(o)) {}
  Status snapshot(const std::string& election, milliseconds, ElectionSnapshot* out) override {
    const std::string prefix = election_prefix(election);
    std::vector<KeyValue> kvs;
    ResponseHeader h;
    Status st = client_.range(prefix, prefix_range_end(prefix), &kvs, &h);
    if (!st.ok()) return st;
    out->candidates.clear();
    for (auto& kv : kvs) out->candidates.push_back({kv.key, kv.create_revision, kv.value});
    out->revision = h.revision;
    return Status::OK();
  }

 private:
  Client client_;
};

class EtcdBackend final : public Backend {
 public:
  std::unique_ptr<Observer> observer() override { return std::make_unique<EtcdObserver>(client_options()); }
  EtcdBackend(std::vector<std::string> endpoints, EtcdSecurity security)
      : endpoints_(std::move(endpoints)), security_(std::move(security)), client_(client_options()) {}

  ClientOptions client_options() const {
    ClientOptions o;
    o.endpoints = endpoints_;
    o.security = security_;  // issue 27
    o.request_timeout = 5000ms;
    o.connect_timeout = 1000ms;
    return o;
  }
  Client& client() { return client_; }

  Status start(const CandidacyOptions& o, std::unique_ptr<Candidacy>* out) override {
    LeaseKeeper::Options ko;
    ko.client = client_options();
    ko.ttl_seconds = o.ttl_s;
    auto keeper = std::make_unique<LeaseKeeper>(ko, [](LeaseKeeper::State s, const std::string& why) {
      if (s == LeaseKeeper::State::active) log::info("lease renewed after jeopardy", {log::kv("why", why)});
      else log::warn("lease state", {log::kv("state", LeaseKeeper::to_string(s)), log::kv("why", why)});
    });
    Status st = keeper->start();
    if (!st.ok()) return st;
    log::info("lease granted", {log::kv("lease", keeper->lease_id()), log::kv("ttl_s", keeper->ttl_seconds()),
                                log::kv("margin_ms", keeper->margin().count()),
                                log::kv("renew_every_ms", keeper->renew_every().count())});
    *out = std::make_unique<EtcdCandidacy>(*this, o, std::move(keeper));
    return Status::OK();
  }

  Status leader(const std::string& election, milliseconds timeout, LeaderInfo* out) override {
    KeyValue kv;
    Status st = lookup_leader(endpoints_, election, timeout, &kv, security_);
    if (st.ok()) *out = LeaderInfo{kv.value, kv.create_revision};
    return st;
  }

  // Revokes the leases whose revoke failed before (etcd was down): their keys would otherwise wait
  // in the election as zombies, and lead for up to a TTL with no process behind them.
  void revoke_leftovers() {
    std::vector<std::int64_t> still;
    for (std::int64_t id : leftover_leases_) {
      Status st = client_.revoke(id, 2000ms);
      // A lease etcd no longer has (expired, or forgotten by a restore) is gone as well.
      if (st.ok() || st.to_string().find("not found") != std::string::npos) {
        log::info("revoked a lease left over from an earlier campaign", {log::kv("lease", id)});
      } else {
        still.push_back(id);
      }
    }
    leftover_leases_.swap(still);
  }
  void add_leftover(std::int64_t id) { leftover_leases_.push_back(id); }

 private:
  const std::vector<std::string> endpoints_;
  const EtcdSecurity security_;  // issue 27: TLS files and user
  Client client_;
  std::vector<std::int64_t> leftover_leases_;  // revoke failed; tried again before each campaign
};

Status EtcdCandidacy::campaign(const std::atomic<bool>& cancel, std::int64_t* token) {
  backend_.revoke_leftovers();
  Status st = backend_.client().campaign(o_.election, keeper_->lease_id(), o_.id, &lk_, &cancel);
  if (st.ok()) *token = lk_.rev;
  return st;
}

Status EtcdCandidacy::confirm(std::int64_t token) {
  // Belt and braces: the leader key is ours and the token is its creation revision.
  KeyValue cur;
  Status st = backend_.client().leader(o_.election, &cur);
  if (!st.ok()) return st;
  if (cur.key != lk_.key || cur.create_revision != token)
    return Status::Error("leader key " + cur.key + " rev " + std::to_string(cur.create_revision));
  return Status::OK();
}

void EtcdCandidacy::guard() {
  guard_ = std::make_unique<KeyGuard>(backend_.client_options(), backend_.client(), lk_,
                                      std::min<milliseconds>(1000ms, milliseconds(keeper_->ttl_seconds() * 1000 / 3)));
}

void EtcdCandidacy::give_up(bool leading) {
  guard_.reset();
  if (leading && lk_.rev != 0) {
    Status st = backend_.client().resign(lk_, 2000ms);
    if (st.ok()) log::info("resigned", {log::kv("token", lk_.rev)});
    else log::warn("resign failed (the lease will expire)", {log::kv("error", st.to_string())});
  }
  Status st = keeper_->revoke(2000ms);
  if (!st.ok()) {
    log::warn("lease revoke failed (tried again before the next campaign; else it expires)",
              {log::kv("lease", keeper_->lease_id()), log::kv("error", st.to_string())});
    if (keeper_->lease_id() != 0) backend_.add_leftover(keeper_->lease_id());
  }
}

}  // namespace

std::unique_ptr<Backend> make_etcd_backend(const Coordinator& c) {
  return std::make_unique<EtcdBackend>(c.endpoints, c.etcd_security);
}

}  // namespace fencegate::election
