// Authority-linked fencing (see authority.h): the watch of the election's keys, the resync and lease
// TTL reads, and the check of a presented generation against the leader etcd shows.
#include "proxy/authority.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <nlohmann/json.hpp>

#include "election_client/base64.h"
#include "election_client/etcd_json.h"

#include "common/log.h"
#include "proxy/fence.h"
#include "proxy/runtime.h"

namespace fencegate::proxy {

using namespace std::chrono_literals;

namespace {

constexpr std::chrono::milliseconds kUnknownTtlWindow{1000};  // <= any lease TTL etcd grants (whole seconds)
constexpr std::chrono::milliseconds kMinProbe{50};
constexpr std::chrono::milliseconds kMaxProbe{1000};
constexpr std::chrono::milliseconds kRequestTimeout{1000};
constexpr std::chrono::milliseconds kConnectTimeout{300};

// A leader id for logs and advanced_by: the campaign value if it is short printable text.
std::string printable_or(const std::string& v, const std::string& fallback) {
  if (v.empty() || v.size() > 256) return fallback;
  for (char c : v) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) return fallback;
  }
  return v;
}

// Logs a change of an authority's reachability, once per change.
void note_reachability(const std::string& election, const Authority::Health& s, bool& was_available, const char* up,
                       const char* down) {
  if (s.available == was_available) return;
  if (s.available) log::info(up, {log::kv("election", election), log::kv("leader", s.leader)});
  else
    log::warn(down, {log::kv("election", election), log::kv("window_ms", s.window_ms),
                     log::kv("ms_since_contact", s.ms_since_contact)});
  was_available = s.available;
}

// Issue 27 (tls-ctl): an etcd that refuses us for our TLS settings or credentials is a setting to
// fix, not a passing outage: said at error level, once per election and distinct reason.
void note_refusal(const std::string& election, const election::Status& st) {
  const std::string& m = st.message();
  if (m.find("TLS") == std::string::npos && m.find("authentication") == std::string::npos &&
      m.find("user name is empty") == std::string::npos && m.find("permission denied") == std::string::npos)
    return;
  static std::mutex mu;
  static std::map<std::string, std::string> said;  // election -> the last reason logged
  std::lock_guard lk(mu);
  std::string& last = said[election];
  if (last == m) return;
  last = m;
  log::error(
      "authority: etcd refuses the connection or the credentials (cacert, cert, key, user, password_file); "
      "fenced writes get 503",
      {log::kv("election", election), log::kv("error", st.to_string())});
}

}  // namespace

std::string_view to_string(AuthorityVerdict v) {
  switch (v) {
    case AuthorityVerdict::leader: return "leader";
    case AuthorityVerdict::stale: return "stale";
    case AuthorityVerdict::not_leader: return "not_leader";
    case AuthorityVerdict::unknown_generation: return "unknown_generation";
    case AuthorityVerdict::unavailable: return "unavailable";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// ElectionView

void ElectionView::resync(const std::vector<election::KeyValue>& kvs, std::int64_t revision) {
  saw_revision(revision);
  if (synced_ && revision <= state_rev_) return;  // the watch already took us further
  live_.clear();
  for (const auto& kv : kvs) {
    live_[kv.key] = Key{kv.create_revision, kv.lease, kv.value};
    seen_.insert(kv.create_revision);
    saw_revision(kv.mod_revision);
  }
  state_rev_ = revision;
  synced_ = true;
  recompute_leader();
}

void ElectionView::apply(const election::WatchBatch& batch) {
  saw_revision(batch.header.revision);
  for (const auto& ev : batch.events) {
    const auto& kv = ev.kv;
    saw_revision(kv.mod_revision);
    // etcd gives every event of one transaction the same revision (a `del --prefix`, a txn, a
    // lease revoke that deletes several keys): events below the reflected revision are older
    // than what the view has; those at it are applied again, which changes nothing for the
    // events a resync at that revision reflects (one event per key in a revision) and takes in
    // every other event of the revision the view got to by an earlier event of it.
    if (kv.mod_revision < state_rev_) continue;
    if (ev.type == election::WatchEvent::Type::put) {
      auto& k = live_[kv.key];
      k.create_revision = kv.create_revision;
      k.lease = kv.lease;
      k.value = kv.value;
      seen_.insert(kv.create_revision);
    } else {
      live_.erase(kv.key);
    }
    state_rev_ = std::max(state_rev_, kv.mod_revision);
  }
  recompute_leader();
}

void ElectionView::recompute_leader() {
  const Key* best = nullptr;
  for (const auto& [_, k] : live_)
    if (!best || k.create_revision < best->create_revision) best = &k;
  if (best) {
    leader_rev_ = best->create_revision;
    leader_lease_ = best->lease;
    leader_value_ = best->value;
    // Older generations are stale whatever happened to their keys: no need to remember them.
    seen_.erase(seen_.begin(), seen_.lower_bound(leader_rev_));
  } else {
    leader_rev_ = 0;
    leader_lease_ = 0;
    leader_value_.clear();
  }
  // Bound memory if candidates churn without ever leading (each entry is one key ever seen).
  while (seen_.size() > 100000) seen_.erase(seen_.begin());
}

AuthorityVerdict ElectionView::classify(std::int64_t g) const {
  if (leader_rev_ != 0 && g == leader_rev_) return AuthorityVerdict::leader;
  if (leader_rev_ != 0 && g < leader_rev_) return AuthorityVerdict::stale;
  if (g <= latest_ && seen_.contains(g)) return AuthorityVerdict::not_leader;
  return AuthorityVerdict::unknown_generation;
}

// ---------------------------------------------------------------------------------------------
// Authority

Authority::Authority(config::Authority cfg, OnNewLeader on_new_leader)
    : cfg_(std::move(cfg)),
      prefix_(election::election_prefix(cfg_.election)),
      on_new_leader_(std::move(on_new_leader)) {
  client_options_.endpoints = cfg_.etcd;
  client_options_.request_timeout = kRequestTimeout;
  client_options_.connect_timeout = kConnectTimeout;
  // Issue 27 (tls-ctl): etcd over https and etcd users (files checked by the config's validation).
  client_options_.security = election::EtcdSecurity{cfg_.cacert, cfg_.cert, cfg_.key, cfg_.user, {}};
  if (auto e = election::complete_etcd_security(&client_options_.security, cfg_.password_file, cfg_.etcd, "authority.");
      !e.empty())
    throw std::invalid_argument(e);
  if (!cfg_.coordinator.empty()) {
    // issue 31: a ZooKeeper or Redis election, observed through the election client's backend.
    election::Coordinator c;
    std::string why;
    if (!election::parse_coordinator(cfg_.coordinator, &c, &why))
      throw std::invalid_argument("authority.coordinator: " + why);
    if (!cfg_.auth_file.empty()) {
      // Checked by the config's validation; a file changed since then is reported here.
      if (auto e = election::read_coordinator_auth(cfg_.auth_file, &c); !e.empty())
        log::error("authority: the auth_file cannot be used; going on without auth",
                   {log::kv("election", cfg_.election), log::kv("error", e)});
    }
    backend_ = election::make_backend(c, &why);
    if (!backend_) throw std::invalid_argument("authority.coordinator: " + why);
    observer_ = backend_->observer();
    return;
  }
  client_ = std::make_unique<election::Client>(client_options_);
}

Authority::~Authority() { stop(); }

void Authority::start() {
  {
    std::lock_guard lk(mu_);
    stopping_ = false;
  }
  thread_ = std::thread([this] { loop(); });
  if (polled() && cfg_.coordinator.rfind("redis://", 0) == 0) feed_thread_ = std::thread([this] { feed_loop(); });
}

void Authority::stop() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (feed_thread_.joinable()) feed_thread_.join();
}

std::chrono::milliseconds Authority::window_locked() const {
  std::chrono::milliseconds w = kUnknownTtlWindow;
  if (view_.leader_lease() != 0 && ttl_lease_ == view_.leader_lease() && ttl_ms_ > 0)
    w = std::chrono::milliseconds(ttl_ms_);
  if (cfg_.grace.count() > 0) w = std::min(w, cfg_.grace);
  return w;
}

AuthorityCheck Authority::check(std::int64_t g) const {
  std::lock_guard lk(mu_);
  AuthorityCheck c;
  c.leader = view_.leader_revision();
  if (!view_.synced() || !contacted_) {
    c.verdict = AuthorityVerdict::unavailable;
    c.why = "no contact with etcd yet (election " + cfg_.election + ")";
    return c;
  }
  const auto since = Clock::now() - last_contact_;
  const auto w = window_locked();
  if (since >= w) {
    c.verdict = AuthorityVerdict::unavailable;
    c.why = "no contact with etcd for " +
            std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(since).count()) +
            " ms, more than the leader's lease window of " + std::to_string(w.count()) + " ms (election " +
            cfg_.election + ")";
    return c;
  }
  c.verdict = view_.classify(g);
  return c;
}

Authority::Health Authority::health() const {
  std::lock_guard lk(mu_);
  Health s;
  s.synced = view_.synced();
  s.leader = view_.leader_revision();
  s.leader_lease = view_.leader_lease();
  s.leader_ttl_ms = ttl_lease_ == s.leader_lease ? ttl_ms_ : 0;
  s.revision = view_.revision();
  s.latest_revision = view_.latest_revision();
  s.window_ms = window_locked().count();
  if (contacted_) {
    s.ms_since_contact = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - last_contact_).count();
    s.available = s.synced && s.ms_since_contact < s.window_ms;
  }
  return s;
}

// REQUIRES: mu_ held.
void Authority::after_change_locked() {
  const std::int64_t leader = view_.leader_revision();
  if (leader != 0 && leader > pending_announce_) {
    pending_announce_ = leader;
    pending_leader_id_ = view_.leader_value();
  }
  if (view_.leader_lease() != ttl_lease_) cv_.notify_all();  // the loop looks the TTL up
}

void Authority::announce() {
  std::int64_t g;
  std::string id;
  {
    std::lock_guard lk(mu_);
    g = pending_announce_;
    id = pending_leader_id_;
  }
  if (g == 0) return;
  std::lock_guard al(announce_mu_);
  if (g <= announced_) return;
  announced_ = g;
  log::info("authority: new leader",
            {log::kv("election", cfg_.election), log::kv("generation", g), log::kv("leader", printable_or(id, ""))});
  if (on_new_leader_) on_new_leader_(g, id);
}

AuthorityCheck Authority::confirm(std::int64_t g) {
  AuthorityCheck c = check(g);
  if (c.verdict != AuthorityVerdict::not_leader && c.verdict != AuthorityVerdict::unknown_generation) return c;
  std::unique_ptr<election::Client> client;
  if (!polled()) client = std::make_unique<election::Client>(client_options_);  // the loop's is the loop thread's
  if (!(polled() ? resync_polled() : resync(*client))) {
    // Not confirmed either way: a retryable 503, never a refusal that may only be our lag.
    c.verdict = AuthorityVerdict::unavailable;
    c.why = "could not confirm generation " + std::to_string(g) + " with etcd (election " + cfg_.election + ")";
    return c;
  }
  return check(g);
}

bool Authority::resync(election::Client& client) {
  const auto sent = Clock::now();
  std::int64_t floor;  // a revision etcd reported before this range was sent
  {
    std::lock_guard lk(mu_);
    floor = view_.latest_revision();
  }
  std::vector<election::KeyValue> kvs;
  election::ResponseHeader h;
  election::Status st = client.range(prefix_, election::prefix_range_end(prefix_), &kvs, &h);
  if (!st.ok()) {
    log::debug("authority: range failed", {log::kv("election", cfg_.election), log::kv("error", st.to_string())});
    note_refusal(cfg_.election, st);  // issue 27 (tls-ctl)
    return false;
  }
  std::int64_t before;
  {
    std::lock_guard lk(mu_);
    before = view_.leader_revision();
    if (h.revision < floor && view_.latest_revision() >= floor) {
      // A range is served at etcd's revision when it arrives, so it cannot be below one etcd
      // reported before it was sent, unless etcd went back: restored from a snapshot, or
      // replaced. The view (and the watch, which waits for revisions that came before) start
      // over from what etcd says now.
      log::warn("authority: etcd's revision went backwards (restored from a snapshot?); the election view starts over",
                {log::kv("election", cfg_.election), log::kv("was", floor), log::kv("now", h.revision)});
      view_.reset();
      restart_watch_ = true;
    }
    view_.resync(kvs, h.revision);
    if (!contacted_ || sent > last_contact_) last_contact_ = sent;
    contacted_ = true;
    after_change_locked();
    if (view_.leader_revision() < before && view_.leader_revision() != 0)
      log::warn("authority: the leader's generation went backwards (etcd restored from a snapshot?)",
                {log::kv("election", cfg_.election), log::kv("was", before), log::kv("now", view_.leader_revision())});
  }
  announce();
  return true;
}

void Authority::fetch_ttl() {
  std::int64_t lease;
  {
    std::lock_guard lk(mu_);
    lease = view_.leader_lease();
    if (lease == 0 || lease == ttl_lease_) return;
  }
  std::string text;
  election::Status st = client_->call("/v3/lease/timetolive", nlohmann::json{{"ID", std::to_string(lease)}}.dump(),
                                      &text, kRequestTimeout);
  auto j = st.ok() ? nlohmann::json::parse(text, nullptr, false) : nlohmann::json();
  if (!j.is_object()) {  // retried on the next turn of the loop
    log::debug("authority: lease TTL lookup failed",
               {log::kv("election", cfg_.election), log::kv("lease", lease),
                log::kv("error", st.ok() ? text.substr(0, 200) : st.to_string())});
    return;
  }
  std::int64_t granted = election::detail::i64(j, "grantedTTL");
  std::int64_t remaining = election::detail::i64(j, "TTL");
  std::lock_guard lk(mu_);
  if (view_.leader_lease() != lease) return;
  ttl_lease_ = lease;
  // A lease that is already gone (TTL -1) leaves no window at all: its key is about to go.
  ttl_ms_ = remaining < 0 ? 1 : granted * 1000;
  if (ttl_ms_ <= 0) ttl_ms_ = 1;
  log::info("authority: leader lease",
            {log::kv("election", cfg_.election), log::kv("lease", lease), log::kv("granted_ttl_s", granted),
             log::kv("window_ms", window_locked().count())});
}

void Authority::on_batch(const election::WatchBatch& b) {
  {
    std::lock_guard lk(mu_);
    view_.apply(b);
    // Not contact: a watch message says nothing of when etcd sent it. Over a slow link it may
    // describe a leader etcd deleted seconds ago, and counting its arrival as contact would
    // stretch the leader's window past its lease. Contact is what resync() proves, from the
    // moment its range was sent.
    after_change_locked();
  }
  announce();
}

void Authority::on_watch_state(election::Watch::State s, std::int64_t revision, const election::Status& why) {
  using S = election::Watch::State;
  if (s == S::watching) {
    std::lock_guard lk(mu_);
    view_.saw_revision(revision);  // (not contact either: see on_batch)
  } else if (s == S::compacted) {
    log::warn("authority: watch compacted; resyncing",
              {log::kv("election", cfg_.election), log::kv("compact_revision", revision)});
    {
      std::lock_guard lk(mu_);
      compacted_ = true;
    }
    cv_.notify_all();
  } else if (s == S::broken) {
    log::debug("authority: watch broken", {log::kv("election", cfg_.election), log::kv("error", why.to_string())});
  }
}

void Authority::start_watch_locked_out(std::int64_t from) {
  election::Watch::Options o;
  o.client = client_options_;
  o.prefix = prefix_;
  o.start_revision = from;
  o.reconnect = true;
  o.reconnect_backoff = 250ms;
  watch_ = std::make_unique<election::Watch>(
      o, [this](const election::WatchBatch& b) { on_batch(b); },
      [this](election::Watch::State s, std::int64_t rev, const election::Status& why) { on_watch_state(s, rev, why); });
  watch_->start();
}

// issue 31: the election as the coordinator shows it now; contact counts from the request's sending.
bool Authority::resync_polled() {
  std::lock_guard ol(observer_mu_);  // one snapshot at a time, applied in the order taken
  std::int64_t notices_before;       // every notice received so far is reflected by this snapshot
  {
    std::lock_guard lk(mu_);
    notices_before = notices_;
  }
  const auto sent = Clock::now();
  election::ElectionSnapshot snap;
  election::Status st = observer_->snapshot(cfg_.election, kRequestTimeout, &snap);
  if (!st.ok()) {
    log::debug("authority: snapshot failed", {log::kv("election", cfg_.election), log::kv("error", st.to_string())});
    return false;
  }
  std::vector<election::KeyValue> kvs;
  for (const auto& cand : snap.candidates) {
    election::KeyValue kv;
    kv.key = cand.key;
    kv.create_revision = cand.token;
    kv.mod_revision = cand.token;
    kv.value = cand.id;
    kvs.push_back(std::move(kv));
  }
  {
    std::lock_guard lk(mu_);
    view_.resync(kvs, ++polls_);
    notices_synced_ = std::max(notices_synced_, notices_before);
    if (!contacted_ || sent > last_contact_) last_contact_ = sent;
    contacted_ = true;
    after_change_locked();
  }
  announce();
  return true;
}

void Authority::polled_loop() {
  log::info("authority: polling election",
            {log::kv("election", cfg_.election), log::kv("coordinator", cfg_.coordinator)});
  bool was_available = true;
  for (;;) {
    {
      std::lock_guard lk(mu_);
      if (stopping_) break;
    }
    resync_polled();
    note_reachability(cfg_.election, health(), was_available, "authority: coordinator reachable",
                      "authority: coordinator unreachable beyond the window; fenced writes get 503");
    std::unique_lock lk(mu_);
    // While keyspace notifications carry the view (and its contact), the poll only backs them up.
    const auto every = std::clamp(window_locked() / 3, kMinProbe, kMaxProbe);
    const bool backup_only = feed_active_ && cfg_.poll > every;
    cv_.wait_for(lk, backup_only ? cfg_.poll : every,
                 [&] { return stopping_ || kick_ || (backup_only && !feed_active_); });
    kick_ = false;
  }
}

// issue 31: a Redis election's keyspace notifications, where the server sends them (never
// switched on here). Reconnects after a break; the loop polls every window/3 meanwhile.
void Authority::feed_loop() {
  bool told_off = false;
  auto pause = [&](std::chrono::milliseconds d) {
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, d, [&] { return stopping_; });
    return !stopping_;
  };
  for (;;) {
    {
      std::lock_guard lk(mu_);
      if (stopping_) return;
    }
    std::string why;
    std::unique_ptr<election::ChangeFeed> feed = backend_->changes(cfg_.election, &why);
    if (!feed) {
      if (!told_off)
        log::info("authority: no Redis keyspace notifications; polling the election",
                  {log::kv("election", cfg_.election), log::kv("why", why)});
      told_off = true;
      if (!pause(5000ms)) return;
      continue;
    }
    told_off = false;
    log::info("authority: following Redis keyspace notifications of the election",
              {log::kv("election", cfg_.election), log::kv("poll_ms", cfg_.poll.count())});
    {
      std::lock_guard lk(mu_);
      feed_active_ = true;
      ++notices_;  // what changed before the subscription: only a snapshot sent after it knows
      kick_ = true;
    }
    cv_.notify_all();
    Clock::time_point ping_sent{}, last_ping{};
    bool ping_out = false;
    for (;;) {
      std::chrono::milliseconds every;
      {
        std::lock_guard lk(mu_);
        if (stopping_) break;
        every = std::clamp(window_locked() / 3, kMinProbe, kMaxProbe);
      }
      if (!ping_out && Clock::now() - last_ping >= every) {
        ping_sent = last_ping = Clock::now();
        if (!feed->ping()) break;
        ping_out = true;
      }
      const auto ev = feed->wait(50ms);
      if (ev == election::ChangeFeed::Event::broken) break;
      if (ev == election::ChangeFeed::Event::changed) {
        {
          std::lock_guard lk(mu_);
          ++notices_;
          kick_ = true;
        }
        cv_.notify_all();
      } else if (ev == election::ChangeFeed::Event::pong) {
        ping_out = false;
        // Every notice Redis sent before it answered the ping came before the pong: if a snapshot
        // sent after the last of them is applied, the view was current when the ping was sent.
        std::lock_guard lk(mu_);
        if (contacted_ && notices_synced_ >= notices_ && ping_sent > last_contact_) last_contact_ = ping_sent;
      }
    }
    {
      std::lock_guard lk(mu_);
      feed_active_ = false;
      if (stopping_) return;
    }
    cv_.notify_all();
    log::warn("authority: Redis keyspace notifications broke off; polling until they are back",
              {log::kv("election", cfg_.election)});
    if (!pause(250ms)) return;
  }
}

void Authority::loop() {
  if (polled()) {
    polled_loop();
    return;
  }
  log::info("authority: watching election", {log::kv("election", cfg_.election), log::kv("prefix", prefix_),
                                             log::kv("etcd", cfg_.etcd.empty() ? std::string() : cfg_.etcd.front())});
  bool was_available = true;
  for (;;) {
    bool compacted;
    {
      std::lock_guard lk(mu_);
      if (stopping_) break;
      compacted = compacted_;
      compacted_ = false;
    }
    if (compacted && watch_) {
      watch_->stop();
      watch_.reset();
    }
    // Probe and resync in one: a range of the prefix proves etcd is alive and gives the truth.
    const bool answered = resync();
    bool restart;
    {
      std::lock_guard lk(mu_);
      restart = restart_watch_;
      restart_watch_ = false;
    }
    if (restart && watch_) {
      watch_->stop();
      watch_.reset();
    }
    if (answered && !watch_) {
      std::int64_t from;
      {
        std::lock_guard lk(mu_);
        from = view_.revision() + 1;
      }
      start_watch_locked_out(from);
    }
    fetch_ttl();

    note_reachability(cfg_.election, health(), was_available, "authority: etcd reachable",
                      "authority: etcd unreachable beyond the leader's lease window; fenced writes get 503");

    std::unique_lock lk(mu_);
    auto every = std::clamp(window_locked() / 3, kMinProbe, kMaxProbe);
    cv_.wait_for(lk, every, [&] {
      return stopping_ || compacted_ || (view_.leader_lease() != 0 && view_.leader_lease() != ttl_lease_);
    });
    // A TTL lookup wakes us at once; avoid spinning if it keeps failing.
    if (!stopping_ && !compacted_ && view_.leader_lease() != ttl_lease_)
      cv_.wait_for(lk, kMinProbe, [&] { return stopping_; });
  }
  if (watch_) {
    watch_->stop();
    watch_.reset();
  }
}

// ---------------------------------------------------------------------------------------------
// Authorities

Authorities::Authorities(Runtime& rt) : rt_(rt) {}

Authorities::~Authorities() { stop(); }

void Authorities::start(const config::Config& cfg) {
  std::map<std::string, Authority*> by_id;
  for (const auto& r : cfg.routes) {
    if (!r.authority) continue;
    const std::string id = r.authority->id();
    auto it = by_id.find(id);
    if (it == by_id.end()) {
      config::Authority a = *r.authority;
      auto au = std::make_unique<Authority>(a, [this, a](std::int64_t g, const std::string& leader_id) {
        advance(a, g, leader_id);
      });
      it = by_id.emplace(id, au.get()).first;
      all_.push_back(std::move(au));
    }
    by_prefix_[r.prefix] = it->second;
  }
  for (auto& a : all_) a->start();
}

void Authorities::stop() {
  for (auto& a : all_) a->stop();
}

void Authorities::advance(const config::Authority& a, std::int64_t g, const std::string& leader_id) {
  auto snap = rt_.snapshot();
  const std::string leader = printable_or(leader_id, "authority:" + a.election);
  const std::string lead = leader.substr(0, snap->cfg->max_leader_bytes);
  std::vector<ResourceView> held;
  bool have_held = false;
  // A held resource that another route (another election's, or one with none) may also name is
  // not this election's to advance. Config validation refuses such overlaps but one: a literal
  // route that takes every path of one of the template's names ("/tenants/acme/" ->
  // "tenant-acme" beside "/tenants/{t}/" -> "tenant-{t}"), so that tenant is the literal route's.
  auto claimed_elsewhere = [&](const std::string& name) {
    for (const auto& o : snap->cfg->routes) {
      if (o.mode == config::Mode::off || (o.authority && *o.authority == a)) continue;
      if (o.resource.find('{') == std::string::npos ? o.resource == name : resource_matches_template(o.resource, name))
        return true;
    }
    return false;
  };
  for (const auto& r : snap->cfg->routes) {
    if (!r.authority || !(*r.authority == a) || r.mode == config::Mode::off) continue;
    std::vector<std::string> resources;
    if (r.resource.find('{') == std::string::npos) {
      resources.push_back(r.resource);
    } else {
      if (!have_held) {
        held = rt_.fence.snapshot();
        have_held = true;
      }
      for (const auto& v : held)
        if (resource_matches_template(r.resource, v.name) && !claimed_elsewhere(v.name)) resources.push_back(v.name);
    }
    for (const auto& res : resources) {
      // Fire and forget: the decision arrives on the store or timer thread; the node lives until
      // then (a drain may take drain_timeout) and is released at once after an admission.
      Fence& fence = rt_.fence;
      const std::string election = a.election;
      auto done = [&fence, res, g, election](std::shared_ptr<InflightNode> node, Decision d) {
        if (d.verdict == Verdict::admit) {
          if (node) fence.release(node.get());
          log::info("authority: fenced the new leader's generation",
                    {log::kv("election", election), log::kv("resource", res), log::kv("generation", d.current)});
        } else if (d.verdict == Verdict::stale) {
          log::warn("authority: the fence already holds a higher generation than the new leader's",
                    {log::kv("election", election), log::kv("resource", res), log::kv("generation", g),
                     log::kv("current_generation", d.newest)});
        } else {
          log::error("authority: could not fence the new leader's generation",
                     {log::kv("election", election), log::kv("resource", res), log::kv("generation", g),
                      log::kv("verdict", d.verdict == Verdict::store_error ? "store_error" : "overloaded")});
        }
      };
      Decision d;
      if (r.mode == config::Mode::enforce) {
        auto node = std::make_shared<InflightNode>();
        if (fence.admit(res, g, lead, node.get(), &d, [done, node](Decision dd) { done(node, dd); })) done(node, d);
      } else {
        if (fence.observe(res, g, lead, &d, [done](Decision dd) { done(nullptr, dd); })) done(nullptr, d);
      }
    }
  }
}

}  // namespace fencegate::proxy
