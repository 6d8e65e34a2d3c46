// Fleet: the protocol of docs/fleet.md (read it first; the step numbers below are its own).
#include "proxy/fleet.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <nlohmann/json.hpp>

#include "common/log.h"
#include "election_client/base64.h"
#include "election_client/etcd_client.h"
#include "election_client/watch.h"
#include "proxy/fence.h"
#include "proxy/timefmt.h"

namespace fencegate::proxy {

namespace {

using json = nlohmann::json;
using election::KeyValue;
using election::TxnOp;

std::string pad20(std::int64_t g) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%020lld", static_cast<long long>(g));
  return buf;
}

// "<20 digits> <member>" -> generation (0 if malformed), *who.
std::int64_t parse_gen(const std::string& v, std::string* who = nullptr) {
  if (v.size() < 20) return 0;
  std::int64_t g = 0;
  for (int i = 0; i < 20; ++i) {
    if (v[i] < '0' || v[i] > '9') return 0;
    if (g > (INT64_MAX - (v[i] - '0')) / 10) return 0;
    g = g * 10 + (v[i] - '0');
  }
  if (who) *who = v.size() > 21 ? v.substr(21) : std::string();
  return g;
}

std::chrono::milliseconds margin_of(std::chrono::milliseconds ttl) {
  return std::max<std::chrono::milliseconds>(ttl / 5, std::chrono::milliseconds(500));
}

// Issue 27: the fleet's etcd security, as a route authority's (the files were checked by the
// config's validation; one that no longer loads throws std::invalid_argument naming the field).
election::EtcdSecurity security_of(const config::Config::Fleet& f) {
  election::EtcdSecurity s{f.cacert, f.cert, f.key, f.user, {}};
  if (auto e = election::complete_etcd_security(&s, f.password_file, f.etcd, "fleet."); !e.empty())
    throw std::invalid_argument(e);
  return s;
}

// An etcd failure in the fleet's words: which fleet.* setting to look at when etcd refused us.
std::string describe(const election::Status& st) {
  std::string m = st.to_string();
  if (m.find("client certificate") != std::string::npos)
    m += " [set fleet.cert and fleet.key: etcd requires a client certificate]";
  else if (m.find("does not verify") != std::string::npos) m += " [check fleet.cacert]";
  else if (m.find("authentication") != std::string::npos || m.find("--user") != std::string::npos)
    m += " [check fleet.user and fleet.password_file / FENCEGATE_ETCD_PASSWORD]";
  return m;
}

}  // namespace

// The Store the Fence is given in a fleet: generations in etcd, the rest in local SQLite.
class FleetStore final : public store::Store {
 public:
  FleetStore(Fleet& f, std::unique_ptr<store::Store> local) : fleet_(f), local_(std::move(local)) {}

  // The fence's starting point is etcd's fence/, not the local file (etcd is the truth; a local
  // row from before the fleet was never made durable in etcd). Fails if etcd cannot be read.
  std::vector<store::ResourceState> load_all(store::Status* status) override {
    std::vector<KeyValue> kvs;
    election::Status st =
        fleet_.client_->range(fleet_.key("fence/", ""), election::prefix_range_end(fleet_.key("fence/", "")), &kvs);
    std::vector<store::ResourceState> out;
    if (!st.ok()) {
      if (status) *status = store::Status::Error("fleet: reading fence/ from etcd failed: " + describe(st));
      return out;
    }
    const std::string p = fleet_.key("fence/", "");
    for (const KeyValue& kv : kvs) {
      store::ResourceState s;
      s.resource = kv.key.substr(p.size());
      s.generation = parse_gen(kv.value, &s.advanced_by);
      if (s.generation > 0) out.push_back(std::move(s));
    }
    if (status) *status = store::Status::OK();
    return out;
  }
  void advance(std::string resource, std::int64_t generation, std::string leader, Done done) override {
    fleet_.advance(std::move(resource), generation, std::move(leader), std::move(done));
  }
  void remove(std::string resource, Done done) override {
    (void)resource;
    if (done) done(store::Status::Error("removing a resource is not supported in a fleet yet (docs/fleet.md)"));
  }
  // Every audit row of a replica names it (issue 33: `member`).
  void append_audit(store::AuditRow row, Done done) override {
    row.member = fleet_.member_;
    local_->append_audit(std::move(row), std::move(done));
  }
  std::vector<store::AuditRecord> query_audit(const store::AuditQuery& q, store::Status* status) override {
    return local_->query_audit(q, status);
  }
  std::vector<store::UnfencedGroup> query_unfenced(const std::string& resource, std::int64_t since_ms, int limit,
                                                   store::Status* status) override {
    return local_->query_unfenced(resource, since_ms, limit, status);
  }
  void set_retention(std::int64_t max_age_ms, std::uint64_t max_rows) override {
    local_->set_retention(max_age_ms, max_rows);
  }
  void set_commit_observer(CommitObserver observer) override { local_->set_commit_observer(std::move(observer)); }
  std::size_t queue_depth() const override { return local_->queue_depth(); }
  std::uint64_t audit_rows_dropped() const override { return local_->audit_rows_dropped(); }
  void drain_and_stop() override { local_->drain_and_stop(); }
  std::uint64_t commit_count() const override { return local_->commit_count(); }
  store::Store& local() { return *local_; }

 private:
  Fleet& fleet_;
  std::unique_ptr<store::Store> local_;
};

Fleet::Fleet(const config::Config& cfg)
    : prefix_("fencegate/fleet/" + cfg.fleet.name + "/"),
      name_(cfg.fleet.name),
      member_(cfg.fleet.member),
      ttl_(cfg.fleet.ttl),
      margin_(margin_of(cfg.fleet.ttl)),
      drain_timeout_(cfg.drain_timeout) {
  election::ClientOptions o;
  o.endpoints = cfg.fleet.etcd;
  o.security = security_of(cfg.fleet);  // issue 27: https and etcd users
  // A call must not outlast a renewal interval: a round that hangs is a failed round.
  o.request_timeout = std::min<std::chrono::milliseconds>(ttl_ / 3, std::chrono::milliseconds(2000));
  o.connect_timeout = std::min<std::chrono::milliseconds>(o.request_timeout, std::chrono::milliseconds(500));
  client_ = std::make_unique<election::Client>(o);
}

// Guarantee 5 (docs/fleet.md, "Reading the fleet"): a put of fence/<r> or intent/<r> reaches
// the Fence as soon as etcd sends it.
void Fleet::start_watch() {
  if (watch_) watch_->stop();
  election::Watch::Options o;
  o.client = client_->options();
  o.prefix = prefix_;
  o.reconnect = true;
  o.reconnect_backoff = std::chrono::milliseconds(100);
  // A stream silent this long is taken as stuck (a black-holed connection) and opened again.
  o.idle_timeout = 3 * ttl_;
  watch_dead_.store(false);
  watch_ = std::make_unique<election::Watch>(
      o, [this](const election::WatchBatch& b) { on_watch(b); },
      [this](election::Watch::State s, std::int64_t, const election::Status&) {
        if (s == election::Watch::State::compacted || s == election::Watch::State::stopped) watch_dead_.store(true);
      });
  watch_->start();
}

void Fleet::on_watch(const election::WatchBatch& b) {
  const std::string fp = key("fence/", ""), ip = key("intent/", ""), mp = key("members/", "");
  {
    // An advance waiting for acknowledgements (or for another's commit) looks again at once.
    std::lock_guard lk(mu_);
    ++watch_events_;
    for (const auto& e : b.events) {
      const std::string& k = e.kv.key;
      const bool put = e.type == election::WatchEvent::Type::put;
      if (k.size() > fp.size() && k.starts_with(fp)) {  // a commit: it deleted intent/r too
        const std::int64_t g = put ? parse_gen(e.kv.value) : 0;
        if (g > 0) last_commit_[k.substr(fp.size())] = LastCommit{g, e.kv.mod_revision};
        else last_commit_.erase(k.substr(fp.size()));
      } else if (put && k.size() > ip.size() && k.starts_with(ip)) {
        last_commit_.erase(k.substr(ip.size()));
      }
      for (AckWait* w : ack_waits_) {
        if (put && k.size() > w->acks.size() && k.starts_with(w->acks)) {
          w->put[k.substr(w->acks.size())] = e.kv.lease;
        } else if (k.size() > mp.size() && k.starts_with(mp)) {
          if (!put) {
            std::int64_t& at = w->gone[k.substr(mp.size())];
            at = std::max(at, e.kv.mod_revision);
          } else {
            auto& [rev, lease] = w->relet[k.substr(mp.size())];
            if (e.kv.mod_revision > rev) rev = e.kv.mod_revision, lease = e.kv.lease;
          }
        } else if (k == w->intent) {
          w->intent_rev = std::max(w->intent_rev, e.kv.mod_revision);
        }
      }
    }
  }
  cv_.notify_all();
  if (!fence_) return;
  for (const auto& e : b.events) {
    if (e.kv.key.starts_with(mp)) members_dirty_.store(true);  // the fleet thread reads members/ again
    if (e.type != election::WatchEvent::Type::put) continue;
    const std::string& k = e.kv.key;
    if (k.starts_with(fp)) {
      std::string who;
      if (std::int64_t g = parse_gen(e.kv.value, &who); g > 0) on_committed(k.substr(fp.size()), g, who);
    } else if (k.starts_with(ip)) {
      std::string who;
      if (std::int64_t g = parse_gen(e.kv.value, &who); g > 0) on_intent(k.substr(ip.size()), g, who);
    }
  }
}

// The fast acknowledgement (docs/fleet.md, "Acknowledging"): another member's intent of x, and
// nothing of r below x in flight here: seen is raised to x under the resource's lock (nothing
// below x is admitted from then on) and the ack is put at once, from this thread, on the member
// key's own lease. Anything else (a drain needed, an advance of r under way here, not a member,
// the put failed) takes the slow path: Fence::note_remote, then the decorator's advance().
void Fleet::on_intent(const std::string& r, std::int64_t x, const std::string& who) {
  const std::int64_t lease = lease_.load();
  if (who == member_ || lease == 0 || !member() || stopping_.load()) {
    fence_->note_remote(r, x);
    return;
  }
  if (!fence_->note_intent(r, x)) return;  // the slow path runs (or x is old news)
  if (!client_->put(ack_key(r, x, member_), "", lease).ok()) {
    fence_->note_remote(r, x);  // x == seen > stored: the advance (and its ack) is tried again
    return;
  }
  fast_acks_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lk(mu_);
  acked_[r] = std::max(acked_[r], x);
}

// A commit of g (fence/<r>) the watch delivered: durable in etcd (a watch sends only applied
// revisions). With nothing in the way the fence takes it at once, and the local copy follows
// (within kLocalCopyEvery); else the slow path reads it again.
void Fleet::on_committed(const std::string& r, std::int64_t g, const std::string& who) {
  if (fence_->note_committed(r, g)) copy_local(r, g, who);
  std::lock_guard lk(mu_);
  if (auto it = acked_.find(r); it != acked_.end() && it->second <= g) acked_.erase(it);
}

Fleet::~Fleet() { stop(); }

std::string Fleet::key(std::string_view kind, std::string_view rest) const {
  std::string k = prefix_;
  k += kind;
  k += rest;
  return k;
}

std::string Fleet::ack_key(const std::string& r, std::int64_t x, std::string_view member) const {
  return key("acks/", r + "/" + pad20(x) + "/" + std::string(member));
}

std::unique_ptr<store::Store> Fleet::wrap(std::unique_ptr<store::Store> local) {
  local_ = local.get();
  return std::make_unique<FleetStore>(*this, std::move(local));
}

void Fleet::attach(Fence& fence) {
  fence_ = &fence;
  fence.set_gate(&deadline_ns_);
}

void Fleet::start() {
  loop_ = std::thread([this] { loop(); });
  guard_ = std::thread([this] { guard_loop(); });
}

void Fleet::stop() {
  if (stopping_.exchange(true)) return;
  cv_.notify_all();
  if (loop_.joinable()) loop_.join();
  if (watch_) watch_->stop();
  if (guard_.joinable()) guard_.join();
  {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [this] { return advances_running_ == 0; });
  }
  flush_local();  // before the local store drains (stop() comes first)
  deadline_ns_.store(0);
  if (std::int64_t l = lease_.exchange(0)) (void)client_->revoke(l, std::chrono::milliseconds(1000));
}

bool Fleet::member() const { return BootClock::now_ns() < deadline_ns_.load(std::memory_order_acquire); }

bool Fleet::wait_event(std::uint64_t since, std::chrono::milliseconds d) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, d, [&] { return stopping_.load() || watch_events_ != since; });
  return !stopping_.load();
}

std::uint64_t Fleet::events() const {
  std::lock_guard lk(mu_);
  return watch_events_;
}

bool Fleet::sleep_for(std::chrono::milliseconds d) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, d, [this] { return stopping_.load(); });
  return !stopping_.load();
}

// Aborts what is in flight whenever this replica is not a member (admission refuses meanwhile,
// so anything in flight then was admitted before the lapse). Wakes every 10 ms: after a pause
// (SIGSTOP, a suspended host) the abort follows the resume within about that.
void Fleet::guard_loop() {
  bool was = false;
  while (!stopping_.load()) {
    const bool m = member();
    if (!m && fence_) {
      const std::size_t n = fence_->abort_inflight();
      if (was) {
        unavailable_.fetch_add(1, std::memory_order_relaxed);
        log::error(
            "fleet: membership lapsed (etcd lease not renewed in time): fenced writes get 503 and "
            "in-flight fenced exchanges are aborted",
            {log::kv("fleet", name_), log::kv("member", member_), log::kv("aborted", n)});
      }
    }
    was = m;
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, std::chrono::milliseconds(10), [this] { return stopping_.load(); });
  }
}

void Fleet::loop() {
  auto next_round = std::chrono::steady_clock::now();
  auto next_copy = next_round + kLocalCopyEvery;
  while (!stopping_.load()) {
    if (std::chrono::steady_clock::now() >= next_copy) {
      flush_local();
      next_copy = std::chrono::steady_clock::now() + kLocalCopyEvery;
    }
    if (lease_.load() == 0) {
      if (!join()) {
        if (!sleep_for(std::chrono::milliseconds(250))) return;
        continue;
      }
      next_round = std::chrono::steady_clock::now() + ttl_ / 3;
      if (!watch_ || watch_dead_.load()) start_watch();
    } else if (std::chrono::steady_clock::now() >= next_round) {
      next_round = std::chrono::steady_clock::now() + (renew() ? ttl_ / 3 : std::chrono::milliseconds(100));
      if (watch_dead_.load()) start_watch();
    } else if (members_dirty_.exchange(false)) {
      (void)poll();  // a member joined or left: GET /v1/fleet shows it at once
    }
    if (!sleep_for(kPollEvery)) return;
  }
}

// Grant, member key, read fence/ and intent/: a member only after all of it.
bool Fleet::join() {
  // Whatever a previous lease admitted is aborted: its key may be gone already.
  if (fence_) fence_->abort_inflight();
  const auto sent = BootClock::now();
  election::LeaseGrant g;
  const std::int64_t secs = (ttl_.count() + 999) / 1000;
  election::Status st = client_->grant(secs, &g);
  if (!st.ok()) {
    log::warn("fleet: cannot join (lease grant failed)", {log::kv("fleet", name_), log::kv("error", describe(st))});
    return false;
  }
  json v = {{"member", member_}, {"started_ms", now_unix_ms()}, {"ttl_ms", ttl_.count()}};
  st = client_->put(key("members/", member_), v.dump(), g.id);
  if (!st.ok() || !poll()) {
    (void)client_->revoke(g.id, std::chrono::milliseconds(500));
    log::warn("fleet: cannot join", {log::kv("fleet", name_), log::kv("error", describe(st))});
    return false;
  }
  lease_.store(g.id);
  deadline_ns_.store((sent + ttl_ - margin_).time_since_epoch().count(), std::memory_order_release);
  log::info("fleet: joined", {log::kv("fleet", name_), log::kv("member", member_), log::kv("lease", g.id)});
  return true;
}

// One renewal round: keepalive AND a read of intent/ (and fence/), both successful.
bool Fleet::renew() {
  const auto sent = BootClock::now();
  std::int64_t ttl = 0;
  election::Status st =
      client_->keepalive(lease_.load(), &ttl,
                         std::min<std::chrono::milliseconds>(ttl_ / 3, std::chrono::milliseconds(2000)));
  if (st.ok() && ttl == 0) {
    log::warn("fleet: the lease is gone in etcd; joining again", {log::kv("fleet", name_), log::kv("member", member_)});
    deadline_ns_.store(0, std::memory_order_release);
    lease_.store(0);
    return false;
  }
  if (!st.ok() || !poll()) return false;
  const std::int64_t d = (sent + ttl_ - margin_).time_since_epoch().count();
  if (d > deadline_ns_.load()) deadline_ns_.store(d, std::memory_order_release);
  return true;
}

// Reads fence/, intent/ and members/; raises the fence's seen for what it finds.
bool Fleet::poll() {
  std::vector<KeyValue> fences, intents, members;
  const std::string fp = key("fence/", ""), ip = key("intent/", ""), mp = key("members/", "");
  if (!client_->range(ip, election::prefix_range_end(ip), &intents).ok()) return false;
  if (!client_->range(fp, election::prefix_range_end(fp), &fences).ok()) return false;
  if (!client_->range(mp, election::prefix_range_end(mp), &members).ok()) return false;
  if (fence_) {
    std::map<std::string, std::int64_t> committed;
    for (const KeyValue& kv : fences)
      if (std::int64_t g = parse_gen(kv.value); g > 0) {
        committed[kv.key.substr(fp.size())] = g;
        fence_->note_remote(kv.key.substr(fp.size()), g);
      }
    for (const KeyValue& kv : intents)
      if (std::int64_t g = parse_gen(kv.value); g > 0) fence_->note_remote(kv.key.substr(ip.size()), g);
    // An intent acknowledged by the fast path and not committed yet (its advancer slow, or gone
    // with its lease): the slow path takes it over, as it would have without the fast path (it
    // waits for the commit, or completes the advance itself once the intent is gone).
    std::map<std::string, std::int64_t> open;
    {
      std::lock_guard lk(mu_);
      open.swap(acked_);
    }
    for (const auto& [r, x] : open)
      if (auto it = committed.find(r); it == committed.end() || it->second < x) fence_->note_remote(r, x);
  }
  const std::int64_t now = now_unix_ms();
  std::lock_guard lk(mu_);
  std::vector<MemberView> next;
  for (const KeyValue& kv : members) {
    MemberView m;
    m.member = kv.key.substr(mp.size());
    json j = json::parse(kv.value, nullptr, false);
    if (j.is_object() && j.contains("ttl_ms") && j["ttl_ms"].is_number_integer())
      m.ttl_ms = j["ttl_ms"].get<std::int64_t>();
    m.last_seen_ms = now;
    next.push_back(std::move(m));
  }
  members_ = std::move(next);
  return true;
}

void Fleet::advance(std::string resource, std::int64_t w, std::string leader, Done done) {
  {
    std::lock_guard lk(mu_);
    if (stopping_.load()) {
      if (done) done(store::Status::Error("fleet: stopping"));
      return;
    }
    ++advances_running_;
  }
  std::thread([this, resource = std::move(resource), w, leader = std::move(leader), done = std::move(done)]() mutable {
    store::Status st = run_advance(resource, w);
    if (st.ok()) copy_local(resource, w, std::move(leader));  // best effort: etcd holds the fence
    if (done) done(st);
    std::lock_guard lk(mu_);
    --advances_running_;
    cv_.notify_all();
  }).detach();
}

struct Fleet::AckWaitScope {
  AckWaitScope(Fleet& f, AckWait& w) : f_(f), w_(w) {
    std::lock_guard lk(f_.mu_);
    f_.ack_waits_.push_back(&w_);
  }
  ~AckWaitScope() {
    std::lock_guard lk(f_.mu_);
    std::erase(f_.ack_waits_, &w_);
  }
  AckWaitScope(const AckWaitScope&) = delete;
  AckWaitScope& operator=(const AckWaitScope&) = delete;

 private:
  Fleet& f_;
  AckWait& w_;
};

void Fleet::copy_local(const std::string& r, std::int64_t g, std::string by) {
  if (!local_) return;
  std::lock_guard lk(local_mu_);
  auto& [gen, who] = local_pending_[r];
  if (g > gen) gen = g, who = std::move(by);
}

void Fleet::flush_local() {
  std::map<std::string, std::pair<std::int64_t, std::string>> out;
  {
    std::lock_guard lk(local_mu_);
    out.swap(local_pending_);
  }
  for (auto& [r, v] : out) local_->advance(r, v.first, std::move(v.second), nullptr);
}

bool Fleet::put_ack(const std::string& r, std::int64_t x) {
  return client_->put(ack_key(r, x, member_), "", lease_.load()).ok();
}

// The loop of docs/fleet.md, "An advance to w". REQUIRES (the Fence's): nothing of r is in flight
// here, and nothing of r is admitted here until this returns.
store::Status Fleet::run_advance(const std::string& r, std::int64_t w) {
  const auto give_up = BootClock::now() + drain_timeout_ + 2 * ttl_ + std::chrono::seconds(10);
  const std::string fk = key("fence/", r), ik = key("intent/", r);
  std::int64_t acked = 0;  // the highest generation acknowledged by this call
  // The first pass may take step 1 from the last commit the watch delivered (fence/r at its
  // revision, no intent/r): the intent transaction compares both, so a stale one only fails it.
  LastCommit last;
  const char* step1 = "read";
  {
    std::lock_guard lk(mu_);
    if (auto it = last_commit_.find(r); it != last_commit_.end() && it->second.generation < w) last = it->second;
  }
  for (;;) {
    if (stopping_.load()) return store::Status::Error("fleet: stopping");
    if (!member()) return store::Status::Error("fleet-unavailable: not a member of fleet " + name_);
    if (BootClock::now() > give_up) return store::Status::Error("fleet: the advance did not complete in time");
    // 1. read
    const std::uint64_t seen_events = events();
    const bool from_watch = last.mod_revision > 0;
    std::vector<std::vector<KeyValue>> got(2);  // fence/r, intent/r: one round trip, one revision
    if (from_watch) {
      step1 = "watch";
      got[0].push_back(KeyValue{fk, pad20(last.generation), 0, last.mod_revision, 0, 0});
      last = {};
    } else if (!client_->ranges({{fk, ""}, {ik, ""}}, &got).ok()) {
      if (!sleep_for(std::chrono::milliseconds(20))) continue;
      continue;
    }
    const std::vector<KeyValue>& f = got[0];
    const std::vector<KeyValue>& i = got[1];
    const std::int64_t F = f.empty() ? 0 : parse_gen(f[0].value);
    const std::int64_t fmod = f.empty() ? 0 : f[0].mod_revision;
    // 2. committed already
    if (F >= w) {
      if (F > w && fence_) fence_->note_remote(r, F);
      return store::Status::OK();
    }
    std::string who;
    const std::int64_t X = i.empty() ? 0 : parse_gen(i[0].value, &who);
    const std::int64_t imod = i.empty() ? 0 : i[0].mod_revision;
    // 3. an intent >= w: acknowledge it (nothing below it is in flight here); commit it if ours
    if (X >= w) {
      if (fence_) fence_->note_remote(r, X);
      if (acked < X && put_ack(r, X)) acked = X;
      if (who == member_ && i[0].lease == lease_.load()) {
        // Committed: fence/r = X is durable (our transaction's compares held), X >= w.
        if (wait_and_commit(r, X, imod, fmod, give_up, std::chrono::steady_clock::now())) return store::Status::OK();
        continue;
      }
      (void)wait_event(seen_events, std::chrono::milliseconds(50));  // its commit comes through the watch
      continue;
    }
    // 4. no intent, or a lower one (acknowledged first): put ours
    if (X > 0 && acked < X && put_ack(r, X)) acked = X;
    bool won = false;
    election::ResponseHeader h;
    const auto intent_at = std::chrono::steady_clock::now();
    const std::int64_t lease = lease_.load();
    // The transaction also reads members/ and acks/r/w/ at its own revision I (step 5's first
    // read, without a round trip of its own); the acknowledgements that come after it are
    // counted from the watch, registered before the intent can be seen.
    AckWait aw;
    aw.acks = key("acks/", r + "/" + pad20(w) + "/");
    aw.intent = ik;
    const AckWaitScope registered(*this, aw);
    const std::string mp = key("members/", "");
    std::vector<TxnOp> ops = {
        TxnOp{TxnOp::Type::put, ik, pad20(w) + " " + member_, "", lease},
        TxnOp{TxnOp::Type::put, ack_key(r, w, member_), "", "", lease},
        TxnOp{TxnOp::Type::range, mp, "", election::prefix_range_end(mp), 0},
        TxnOp{TxnOp::Type::range, aw.acks, "", election::prefix_range_end(aw.acks), 0},
    };
    std::vector<std::vector<KeyValue>> at_intent;
    if (!client_->txn({{ik, imod}, {fk, fmod}}, ops, &won, &h, &at_intent).ok() || !won) {
      if (from_watch) {  // the watch's view was stale (or the outcome is unknown): read
        step1 = "stale";
        continue;
      }
      if (!sleep_for(std::chrono::milliseconds(5))) continue;
      continue;
    }
    acked = w;
    intent_done_ = std::chrono::steady_clock::now();
    // Committed: fence/r = w is durable (our transaction's compares held); no read to confirm it.
    if (wait_and_commit(r, w, h.revision, fmod, give_up, intent_at, &aw, at_intent.size() == 2 ? &at_intent : nullptr,
                        step1))
      return store::Status::OK();
  }
}

// 5. and 6. from the intent's own read and the watch, step 5's rule with no read of its own:
// each member the intent transaction found (created before I) without an acknowledgement on its
// member key's lease either puts one since (seen on the watch, on the lease its member key has
// now: the commit's compares check that it is still there) or loses its member key after I.
// Anything else (the intent changed, a compare failed, not done within kWatchCommitWait: a watch
// opened again after a compaction may have missed events) leaves it to the read path.
int Fleet::commit_from_watch(const std::string& r, std::int64_t x, std::int64_t intent_mod, std::int64_t fence_mod,
                             BootClock::time_point give_up, const AckWait& aw,
                             const std::vector<std::vector<KeyValue>>& at_intent,
                             std::chrono::steady_clock::time_point* acks_done, std::vector<std::string>* counted) {
  constexpr std::chrono::milliseconds kWatchCommitWait{1000};
  const std::string fk = key("fence/", r), ik = key("intent/", r), mp = key("members/", "");
  std::map<std::string, std::int64_t> need;  // member -> the lease its ack must be on
  for (const KeyValue& m : at_intent[0]) {
    if (m.create_revision >= intent_mod || m.key.size() <= mp.size()) continue;
    const std::string id = m.key.substr(mp.size());
    const bool acked = std::any_of(at_intent[1].begin(), at_intent[1].end(), [&](const KeyValue& a) {
      return a.key.size() > aw.acks.size() && a.key.substr(aw.acks.size()) == id && a.lease == m.lease;
    });
    need[id] = acked ? 0 : m.lease;  // 0: acknowledged at I, unless its member key is put again
    if (!acked && id != member_) {
      counted->push_back(id);
      acks_waited_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  const auto until = std::chrono::steady_clock::now() + kWatchCommitWait;
  std::vector<election::TxnCompare> cmps = {{ik, intent_mod}, {fk, fence_mod}};
  for (;;) {
    if (stopping_.load() || !member() || BootClock::now() > give_up) return -1;
    std::uint64_t seen_events;
    bool all = true;
    {
      std::lock_guard lk(mu_);
      seen_events = watch_events_;
      if (aw.intent_rev > intent_mod) return 0;  // superseded, committed or gone: the read path tells
      std::vector<election::TxnCompare> acks;
      for (const auto& [id, at_i] : need) {
        if (auto g = aw.gone.find(id); g != aw.gone.end() && g->second > intent_mod) continue;  // gone
        std::int64_t l = at_i;  // the lease its ack must be on: its member key's as of now
        if (auto re = aw.relet.find(id); re != aw.relet.end() && re->second.first > intent_mod) l = re->second.second;
        if (l == 0) continue;  // acknowledged at I, member key untouched since
        if (auto p = aw.put.find(id); p == aw.put.end() || p->second != l) {
          all = false;
          if (l != at_i && id != member_ && std::find(counted->begin(), counted->end(), id) == counted->end()) {
            counted->push_back(id);
            acks_waited_.fetch_add(1, std::memory_order_relaxed);
          }
          break;
        }
        acks.push_back({ack_key(r, x, id), 0, election::TxnCompare::Target::lease, l});
      }
      if (all) cmps.insert(cmps.end(), acks.begin(), acks.end());
    }
    if (all) break;
    if (std::chrono::steady_clock::now() >= until) return 0;
    if (!wait_event(seen_events, std::chrono::milliseconds(50))) return -1;
  }
  *acks_done = std::chrono::steady_clock::now();
  bool won = false;
  if (!client_->txn(cmps, commit_ops(r, x), &won).ok() || !won) return 0;  // unknown or refused: the read path tells
  watch_commits_.fetch_add(1, std::memory_order_relaxed);
  return 1;
}

// Step 6's operations: put fence/r = x, delete intent/r and the acknowledgements of x.
std::vector<TxnOp> Fleet::commit_ops(const std::string& r, std::int64_t x) const {
  const std::string ap = key("acks/", r + "/" + pad20(x) + "/");
  return {
      TxnOp{TxnOp::Type::put, key("fence/", r), pad20(x) + " " + member_, "", 0},
      TxnOp{TxnOp::Type::del, key("intent/", r), "", "", 0},
      TxnOp{TxnOp::Type::del, ap, "", election::prefix_range_end(ap), 0},
  };
}

void Fleet::record_commit(const std::string& r, std::int64_t x, std::chrono::steady_clock::time_point started,
                          std::chrono::steady_clock::time_point acks_done, const char* step1) {
  const auto now = std::chrono::steady_clock::now();
  advance_seconds_.observe(std::chrono::duration<double>(now - started).count());
  // How the advance's time divides (bench/bench.py's fleet part reads this line).
  auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
  const auto intent_done = std::max(started, std::min(intent_done_.load(), acks_done));
  log::info("fleet: advance committed",
            {log::kv("resource", r), log::kv("generation", x), log::kv("intent_ms", ms(intent_done - started)),
             log::kv("acks_ms", ms(acks_done - intent_done)), log::kv("commit_ms", ms(now - acks_done)),
             log::kv("step1", step1)});
}

// 5. and 6.
bool Fleet::wait_and_commit(const std::string& r, std::int64_t x, std::int64_t intent_mod, std::int64_t fence_mod,
                            BootClock::time_point give_up, std::chrono::steady_clock::time_point started,
                            const AckWait* aw, const std::vector<std::vector<KeyValue>>* at_intent, const char* step1) {
  const std::string fk = key("fence/", r), ik = key("intent/", r), mp = key("members/", "");
  const std::string ap = key("acks/", r + "/" + pad20(x) + "/");
  std::vector<std::string> counted;  // members this advance waited for (counted once)
  std::chrono::steady_clock::time_point acks_done{};
  if (aw && at_intent) {
    const int c = commit_from_watch(r, x, intent_mod, fence_mod, give_up, *aw, *at_intent, &acks_done, &counted);
    if (c > 0) {
      record_commit(r, x, started, acks_done, step1);
      return true;
    }
    if (c < 0) return false;
    acks_done = {};
  }
  for (;;) {
    if (stopping_.load() || !member() || BootClock::now() > give_up) return false;
    const std::uint64_t seen_events = events();
    // intent/r, members/, acks/r/x/: one round trip, one revision.
    std::vector<std::vector<KeyValue>> got;
    if (!client_->ranges({{ik, ""}, {mp, election::prefix_range_end(mp)}, {ap, election::prefix_range_end(ap)}}, &got)
             .ok()) {
      if (!sleep_for(std::chrono::milliseconds(20))) return false;
      continue;
    }
    const std::vector<KeyValue>& i = got[0];
    const std::vector<KeyValue>& members = got[1];
    const std::vector<KeyValue>& acks = got[2];
    if (i.empty() || i[0].mod_revision != intent_mod) return false;  // superseded or gone
    bool all = true;
    for (const KeyValue& m : members) {
      if (m.create_revision >= intent_mod) continue;  // joined after the intent: read it at join
      const std::string id = m.key.substr(mp.size());
      const bool ok = std::any_of(acks.begin(), acks.end(), [&](const KeyValue& a) {
        return a.key.substr(ap.size()) == id && a.lease == m.lease;  // an ack of this incarnation
      });
      if (!ok) {
        all = false;
        if (id != member_ && std::find(counted.begin(), counted.end(), id) == counted.end()) {
          counted.push_back(id);
          acks_waited_.fetch_add(1, std::memory_order_relaxed);
        }
      }
    }
    if (!all) {
      // The acknowledgements (and member keys going) come through the watch; 50 ms if it lags.
      if (!wait_event(seen_events, std::chrono::milliseconds(50))) return false;
      continue;
    }
    if (acks_done == std::chrono::steady_clock::time_point{}) acks_done = std::chrono::steady_clock::now();
    bool won = false;
    if (!client_->txn({{ik, intent_mod}, {fk, fence_mod}}, commit_ops(r, x), &won).ok()) {
      if (!sleep_for(std::chrono::milliseconds(20))) return false;
      continue;  // unknown outcome: the next read tells
    }
    if (won) {
      read_commits_.fetch_add(1, std::memory_order_relaxed);
      record_commit(r, x, started, acks_done, step1);
    }
    return won;
  }
}

std::string Fleet::status_json() const {
  json members = json::array();
  {
    std::lock_guard lk(mu_);
    for (const MemberView& m : members_)
      members.push_back(
          {{"member", m.member}, {"lease_ttl_ms", m.ttl_ms}, {"last_seen", format_rfc3339_ms(m.last_seen_ms)}});
  }
  return json{{"name", name_},
              {"member", member_},
              {"members", members},
              {"state", member() ? "member" : "unavailable"}}
      .dump();
}

void Fleet::render_metrics(std::string& out) const {
  out += "# HELP fencegate_fleet_member 1 while this replica is a member of its fleet.\n";
  out += "# TYPE fencegate_fleet_member gauge\n";
  out += std::string("fencegate_fleet_member ") + (member() ? "1" : "0") + "\n";
  out += "# HELP fencegate_fleet_advance_seconds Fleet advances committed by this replica, intent to commit.\n";
  out += "# TYPE fencegate_fleet_advance_seconds histogram\n";
  advance_seconds_.render(out, "fencegate_fleet_advance_seconds");
  out += "# HELP fencegate_fleet_acks_waited_total Other members an advance had to wait for.\n";
  out += "# TYPE fencegate_fleet_acks_waited_total counter\n";
  out += "fencegate_fleet_acks_waited_total " + std::to_string(acks_waited_.load()) + "\n";
  out += "# HELP fencegate_fleet_fast_acks_total Intents acknowledged straight from the watch (nothing to drain).\n";
  out += "# TYPE fencegate_fleet_fast_acks_total counter\n";
  out += "fencegate_fleet_fast_acks_total " + std::to_string(fast_acks_.load()) + "\n";
  out +=
      "# HELP fencegate_fleet_commits_total Advances this replica committed, by how it knew every member had "
      "acknowledged: from its intent's own read and the watch, or from reads.\n";
  out += "# TYPE fencegate_fleet_commits_total counter\n";
  out += "fencegate_fleet_commits_total{path=\"watch\"} " + std::to_string(watch_commits_.load()) + "\n";
  out += "fencegate_fleet_commits_total{path=\"read\"} " + std::to_string(read_commits_.load()) + "\n";
  out += "# HELP fencegate_fleet_unavailable_total Times this replica's membership lapsed.\n";
  out += "# TYPE fencegate_fleet_unavailable_total counter\n";
  out += "fencegate_fleet_unavailable_total " + std::to_string(unavailable_.load()) + "\n";
}

}  // namespace fencegate::proxy
