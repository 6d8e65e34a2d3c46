// The ZooKeeper backend of the election interface (backend.h), on the multithreaded C client
// (libzookeeper-mt). The recipe:
//
//   - the election is the node /<NAME> (under the URL's chroot); each candidate creates an
//     EPHEMERAL_SEQUENTIAL child "n_<session id>-<sequence>" holding its --id;
//   - the child with the lowest sequence leads; every other candidate watches only its
//     predecessor (exists-watch), so when the leader goes exactly one candidate wakes (no herd);
//   - the token is the leader node's czxid: the zxid of the transaction that created it, 64 bits,
//     totally ordered across the ensemble (the epoch is in its high 32 bits, so a new leader of
//     the ensemble only ever produces larger zxids). Not the sequence number: that is a signed
//     32-bit counter of the parent node, which wraps and starts over at 0 when the parent is
//     deleted and created again, so a later leader could get a smaller or equal number;
//   - the session is the lease: its (negotiated) timeout is the TTL. Every answered request on the
//     session is renewal evidence (the server counts the timeout from the last request it heard):
//     an exists() of our node every TTL/3 (renewer.h: deadline = send time + TTL - margin). A
//     session-expired event is loss; our node missing while the session lives is `gone`.
//   - the session id in the node's name lets a campaign cut off mid-create (connection loss)
//     find the node it may have created, instead of queueing a second one that would lead with
//     no process behind it.
//
// Digest auth (`--zk-auth FILE`, user:password): the session adds it, and the nodes it creates
// get the creator-only ACL (so other users of a shared ensemble cannot delete them).
//
// Thread-safety: the zhandle is thread-safe (the mt client serialises requests); the watcher runs
// on the client's completion thread and only touches atomics and the condition variable.
#include <zookeeper/zookeeper.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/log.h"
#include "election_client/backend.h"
#include "election_client/backends.h"
#include "election_client/renewer.h"

namespace fencegate::election {

namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;

void zk_log(const char* message) { log::debug("zookeeper client", {log::kv("message", message)}); }

std::string zerr(int rc) { return std::string(zerror(rc)) + " (" + std::to_string(rc) + ")"; }

// An error code that says nothing from the server reached us (no renewal evidence).
bool no_answer(int rc) {
  return rc == ZCONNECTIONLOSS || rc == ZOPERATIONTIMEOUT || rc == ZSESSIONEXPIRED || rc == ZINVALIDSTATE ||
         rc == ZCLOSING || rc == ZSYSTEMERROR || rc == ZMARSHALLINGERROR;
}

std::string election_path(const std::string& election) { return "/" + election; }

// The sequence number at the end of a child's name ("n_<session>-0000000007" -> 7); -1 if none.
long long sequence_of(const std::string& name) {
  if (name.size() < 10) return -1;
  const std::string tail = name.substr(name.size() - 10);
  if (!std::all_of(tail.begin(), tail.end(), [](char c) { return c >= '0' && c <= '9'; })) return -1;
  return std::stoll(tail);
}

struct Children {
  std::vector<std::string> names;  // candidates, lowest sequence first
};

// A session: the handle, its connected/expired state, and the watch events it saw.
class Session {
 public:
  Session() = default;
  ~Session() { close(); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Connects (`hosts` includes the chroot) and waits up to `timeout` for the session; adds auth.
  Status open(const std::string& hosts, milliseconds session_timeout, const std::string& auth, milliseconds timeout) {
    zh_ = zookeeper_init2(hosts.c_str(), &Session::watcher, static_cast<int>(session_timeout.count()), nullptr, this, 0,
                          &zk_log);
    if (!zh_) return Status::Unavailable("zookeeper " + hosts + ": " + std::strerror(errno));
    {
      std::unique_lock lk(mu_);
      if (!cv_.wait_for(lk, timeout, [this] { return connected_ || expired_; }) || expired_)
        return Status::Unavailable("zookeeper " + hosts + ": no session within " + std::to_string(timeout.count()) +
                                   " ms");
    }
    if (!auth.empty()) {
      struct Done {
        std::mutex mu;
        std::condition_variable cv;
        bool done = false;
        int rc = 0;
      };
      auto done = std::make_shared<Done>();
      auto* keep = new std::shared_ptr<Done>(done);  // freed by the completion
      int rc = zoo_add_auth(
          zh_, "digest", auth.data(), static_cast<int>(auth.size()),
          [](int rc2, const void* data) {
            auto* p = static_cast<std::shared_ptr<Done>*>(const_cast<void*>(data));
            {
              std::lock_guard lk((*p)->mu);
              (*p)->done = true;
              (*p)->rc = rc2;
            }
            (*p)->cv.notify_all();
            delete p;
          },
          keep);
      if (rc != ZOK) {
        delete keep;
        return Status::Unavailable("zookeeper: adding auth: " + zerr(rc));
      }
      std::unique_lock lk(done->mu);
      if (!done->cv.wait_for(lk, timeout, [&] { return done->done; }))
        return Status::Unavailable("zookeeper: no answer to the digest auth");
      if (done->rc != ZOK) return Status::Error("zookeeper: digest auth refused: " + zerr(done->rc));
      authed_ = true;
    }
    return Status::OK();
  }

  void close() {
    if (zh_) zookeeper_close(zh_);
    zh_ = nullptr;
  }

  zhandle_t* zh() const { return zh_; }
  struct ACL_vector* acl() const { return authed_ ? &ZOO_CREATOR_ALL_ACL : &ZOO_OPEN_ACL_UNSAFE; }
  milliseconds timeout() const { return milliseconds(zh_ ? zoo_recv_timeout(zh_) : 0); }
  std::string session_hex() const {
    const clientid_t* id = zoo_client_id(zh_);
    char buf[24];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(id ? id->client_id : 0));
    return buf;
  }
  bool expired() const { return expired_.load(); }

  // The count of node watch events (not session events) seen so far, and a wait for the next.
  std::uint64_t events() const { return events_.load(); }
  // Waits up to `d` for a node event after `seen`, or an expiry.
  void wait_event(std::uint64_t seen, milliseconds d) {
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, d, [&] { return events_.load() != seen || expired_; });
  }

  // Called on the completion thread, under the session's lock: the session expired; a watched
  // node was deleted.
  void set_handlers(std::function<void()> expired, std::function<void(const std::string&)> deleted) {
    std::lock_guard lk(mu_);
    on_expired = std::move(expired);
    on_deleted = std::move(deleted);
    if (expired_ && on_expired) on_expired();
  }

 private:
  static void watcher(zhandle_t*, int type, int state, const char* path, void* ctx) {
    auto* self = static_cast<Session*>(ctx);
    if (type == ZOO_SESSION_EVENT) {
      std::lock_guard lk(self->mu_);
      if (state == ZOO_CONNECTED_STATE) self->connected_ = true;
      if (state == ZOO_EXPIRED_SESSION_STATE || state == ZOO_AUTH_FAILED_STATE) {
        self->expired_ = true;
        if (self->on_expired) self->on_expired();
      }
    } else {
      // Each contender logs the watch events it gets: the herd test counts these lines.
      log::debug("zookeeper watch fired", {log::kv("type", type), log::kv("path", path ? path : "")});
      std::lock_guard lk(self->mu_);
      ++self->events_;
      if (type == ZOO_DELETED_EVENT && self->on_deleted && path) self->on_deleted(path);
    }
    self->cv_.notify_all();
  }

  zhandle_t* zh_ = nullptr;
  bool authed_ = false;
  std::function<void()> on_expired;                    // guarded by mu_
  std::function<void(const std::string&)> on_deleted;  // guarded by mu_
  std::mutex mu_;
  std::condition_variable cv_;
  bool connected_ = false;  // guarded by mu_
  std::atomic<bool> expired_{false};
  std::atomic<std::uint64_t> events_{0};
};

// Creates every element of `path` that is missing (persistent, the session's ACL).
int ensure_path(Session& s, const std::string& path) {
  std::size_t at = 1;
  for (;;) {
    const auto slash = path.find('/', at);
    const std::string part = path.substr(0, slash);
    int rc = zoo_create(s.zh(), part.c_str(), nullptr, -1, s.acl(), ZOO_PERSISTENT, nullptr, 0);
    if (rc != ZOK && rc != ZNODEEXISTS) return rc;
    if (slash == std::string::npos) return ZOK;
    at = slash + 1;
  }
}

int list_candidates(Session& s, const std::string& dir, Children* out) {
  String_vector sv{};
  int rc = zoo_get_children(s.zh(), dir.c_str(), 0, &sv);
  if (rc != ZOK) return rc;
  std::vector<std::pair<long long, std::string>> v;
  for (int i = 0; i < sv.count; ++i) {
    std::string n = sv.data[i];
    if (n.rfind("n_", 0) == 0 && sequence_of(n) >= 0) v.emplace_back(sequence_of(n), n);
  }
  deallocate_String_vector(&sv);
  std::sort(v.begin(), v.end());
  out->names.clear();
  for (auto& p : v) out->names.push_back(std::move(p.second));
  return ZOK;
}

std::string hosts_of(const Coordinator& c, bool with_chroot) {
  std::string h;
  for (const auto& e : c.endpoints) h += (h.empty() ? "" : ",") + e;
  return with_chroot ? h + c.chroot : h;
}

class ZkCandidacy final : public Candidacy {
 public:
  ZkCandidacy(CandidacyOptions o, std::unique_ptr<Session> s)
      : o_(std::move(o)),
        dir_(election_path(o_.election)),
        s_(std::move(s)),
        renewer_("zookeeper session " + s_->session_hex(), s_->timeout(), s_->timeout() / 3,
                 [this](std::string* why) { return renew(why); }) {
    s_->set_handlers([this] { renewer_.mark_lost("the ZooKeeper session expired"); },
                     [this](const std::string& path) {
                       std::lock_guard lk(mu_);
                       if (guarding_ && !node_.empty() && path == dir_ + "/" + node_) gone_ = true;
                     });
  }
  ~ZkCandidacy() override {
    renewer_.stop();
    s_->close();
  }

  void start(Clock::time_point sent) { renewer_.start(sent); }

  bool valid() const override { return renewer_.valid() && !s_->expired(); }
  Clock::time_point deadline() const override { return renewer_.deadline(); }
  milliseconds margin() const override { return renewer_.margin(); }
  std::int64_t ttl_ms() const override { return renewer_.ttl().count(); }
  std::string state() const override { return s_->expired() ? "lost" : renewer_.state(); }
  std::string handle() const override {
    std::lock_guard lk(mu_);
    return "session " + s_->session_hex() + (node_.empty() ? "" : " node " + dir_ + "/" + node_);
  }

  Status campaign(const std::atomic<bool>& cancel, std::int64_t* token) override;
  Status confirm(std::int64_t token) override;
  void guard() override {
    std::string node;
    {
      std::lock_guard lk(mu_);
      guarding_ = true;
      node = node_;
    }
    struct Stat st {};
    int rc = zoo_exists(s_->zh(), (dir_ + "/" + node).c_str(), 1, &st);  // the watch: the session watcher
    if (rc == ZNONODE) {
      std::lock_guard lk(mu_);
      gone_ = true;
    }
  }
  bool gone() override {
    std::lock_guard lk(mu_);
    return gone_ || renewer_.gone();
  }
  void give_up(bool) override {
    renewer_.stop();
    std::string node;
    {
      std::lock_guard lk(mu_);
      node = node_;
    }
    // Our candidacy (leading or in line) goes with the node; closing the session would remove it
    // as well, but only once the server processes the close.
    if (!node.empty() && !s_->expired()) {
      int rc = zoo_delete(s_->zh(), (dir_ + "/" + node).c_str(), -1);
      if (rc == ZOK) log::info("resigned", {log::kv("node", dir_ + "/" + node), log::kv("token", czxid_)});
      else if (rc != ZNONODE)
        log::warn("resign failed (the session's end removes the node)", {log::kv("error", zerr(rc))});
    }
    s_->close();
  }

 private:
  Renewer::Result renew(std::string* why) {
    std::string node;
    {
      std::lock_guard lk(mu_);
      node = node_;
    }
    struct Stat st {};
    const std::string path = node.empty() ? std::string("/") : dir_ + "/" + node;
    int rc = zoo_exists(s_->zh(), path.c_str(), 0, &st);
    if (rc == ZSESSIONEXPIRED) {
      *why = "the ZooKeeper session expired";
      return Renewer::Result::lost;
    }
    if (no_answer(rc)) {
      *why = zerr(rc);
      return Renewer::Result::failed;
    }
    if (!node.empty() && rc == ZNONODE) {
      *why = "our node " + path + " was deleted while the session lives";
      return Renewer::Result::gone;
    }
    return Renewer::Result::renewed;
  }

  // Our node: adopts one this session created before (a create cut off by a connection loss), else creates it.
  int ensure_node();

  const CandidacyOptions o_;
  const std::string dir_;
  std::unique_ptr<Session> s_;
  mutable std::mutex mu_;
  // Guarded by mu_
  std::string node_;  // our child's name ("" before it exists)
  std::int64_t czxid_ = 0;
  bool guarding_ = false, gone_ = false;
  bool parent_made_ = false;  // only the campaign thread
  Renewer renewer_;
};

int ZkCandidacy::ensure_node() {
  {
    std::lock_guard lk(mu_);
    if (!node_.empty()) return ZOK;
  }
  if (!parent_made_) {
    if (int rc = ensure_path(*s_, dir_); rc != ZOK) return rc;
    parent_made_ = true;
  }
  const std::string prefix = "n_" + s_->session_hex() + "-";
  Children ch;
  if (int rc = list_candidates(*s_, dir_, &ch); rc != ZOK) return rc;
  std::string mine;
  for (const auto& n : ch.names)
    if (n.rfind(prefix, 0) == 0) mine = n;
  struct Stat st {};
  if (mine.empty()) {
    char buf[1024];
    int rc = zoo_create2(s_->zh(), (dir_ + "/" + prefix).c_str(), o_.id.data(), static_cast<int>(o_.id.size()),
                         s_->acl(), ZOO_EPHEMERAL_SEQUENTIAL, buf, sizeof buf, &st);
    if (rc != ZOK) return rc;
    std::string full = buf;
    mine = full.substr(full.rfind('/') + 1);
  } else if (int rc = zoo_exists(s_->zh(), (dir_ + "/" + mine).c_str(), 0, &st); rc != ZOK) {
    return rc;
  }
  std::lock_guard lk(mu_);
  node_ = mine;
  czxid_ = st.czxid;
  log::info("candidate node", {log::kv("node", dir_ + "/" + mine), log::kv("czxid", st.czxid)});
  return ZOK;
}

Status ZkCandidacy::campaign(const std::atomic<bool>& cancel, std::int64_t* token) {
  if (int rc = ensure_node(); rc != ZOK)
    return Status::Unavailable("zookeeper: creating our candidate node: " + zerr(rc));
  std::string mine;
  {
    std::lock_guard lk(mu_);
    mine = node_;
  }
  while (!cancel) {
    if (s_->expired()) return Status::Unavailable("zookeeper: the session expired while campaigning");
    const std::uint64_t seen = s_->events();
    Children ch;
    if (int rc = list_candidates(*s_, dir_, &ch); rc != ZOK) return Status::Unavailable("zookeeper: " + zerr(rc));
    auto it = std::find(ch.names.begin(), ch.names.end(), mine);
    if (it == ch.names.end()) {
      std::lock_guard lk(mu_);
      node_.clear();
      return Status::Unavailable("zookeeper: our candidate node " + dir_ + "/" + mine + " is gone");
    }
    if (it == ch.names.begin()) {
      std::lock_guard lk(mu_);
      *token = czxid_;
      return Status::OK();
    }
    // Watch only the predecessor: when it goes, only we wake.
    const std::string pred = dir_ + "/" + *(it - 1);
    struct Stat st {};
    int rc = zoo_exists(s_->zh(), pred.c_str(), 1, &st);
    if (rc == ZNONODE) continue;  // gone already: look again
    if (rc != ZOK) return Status::Unavailable("zookeeper: watching " + pred + ": " + zerr(rc));
    log::debug("waiting for the predecessor", {log::kv("predecessor", pred)});
    while (!cancel && s_->events() == seen && !s_->expired()) s_->wait_event(seen, 100ms);
  }
  return Status::Cancelled();
}

Status ZkCandidacy::confirm(std::int64_t token) {
  Children ch;
  if (int rc = list_candidates(*s_, dir_, &ch); rc != ZOK) return Status::Unavailable("zookeeper: " + zerr(rc));
  std::lock_guard lk(mu_);
  if (ch.names.empty() || ch.names.front() != node_ || token != czxid_)
    return Status::Error("the lowest candidate is " + (ch.names.empty() ? std::string("none") : ch.names.front()));
  return Status::OK();
}

// Snapshots over one session, opened again when it expired or could not be opened.
class ZkObserver final : public Observer {
 public:
  explicit ZkObserver(Coordinator c) : c_(std::move(c)) {}
  Status snapshot(const std::string& election, milliseconds timeout, ElectionSnapshot* out) override {
    if (!s_ || s_->expired()) {
      s_ = std::make_unique<Session>();
      if (Status st = s_->open(hosts_of(c_, true), 4000ms, c_.auth, std::max(timeout, milliseconds(1000))); !st.ok()) {
        s_.reset();
        return st;
      }
    }
    const std::string dir = election_path(election);
    String_vector sv{};
    struct Stat dst {};
    out->candidates.clear();
    out->revision = 0;
    int rc = zoo_get_children2(s_->zh(), dir.c_str(), 0, &sv, &dst);
    if (rc == ZNONODE) return Status::OK();
    if (rc != ZOK) return Status::Unavailable("zookeeper: " + zerr(rc));
    out->revision = dst.pzxid;
    std::vector<std::string> names;
    names.reserve(static_cast<std::size_t>(std::max(sv.count, 0)));
    for (int i = 0; i < sv.count; ++i) names.emplace_back(sv.data[i]);
    deallocate_String_vector(&sv);
    for (const auto& n : names) {
      if (n.rfind("n_", 0) != 0 || sequence_of(n) < 0) continue;
      char buf[1024];
      int len = sizeof buf;
      struct Stat st {};
      rc = zoo_get(s_->zh(), (dir + "/" + n).c_str(), 0, buf, &len, &st);
      if (rc == ZNONODE) continue;  // went meanwhile
      if (rc != ZOK) return Status::Unavailable("zookeeper: " + zerr(rc));
      out->candidates.push_back({n, st.czxid, std::string(buf, len > 0 ? static_cast<std::size_t>(len) : 0)});
    }
    return Status::OK();
  }

 private:
  const Coordinator c_;
  std::unique_ptr<Session> s_;
};

class ZkBackend final : public Backend {
 public:
  explicit ZkBackend(Coordinator c) : c_(std::move(c)) { zoo_set_debug_level(ZOO_LOG_LEVEL_WARN); }
  std::unique_ptr<Observer> observer() override { return std::make_unique<ZkObserver>(c_); }

  Status start(const CandidacyOptions& o, std::unique_ptr<Candidacy>* out) override {
    if (Status st = make_chroot(); !st.ok()) return st;
    auto s = std::make_unique<Session>();
    const auto sent = Clock::now();
    Status st = s->open(hosts_of(c_, true), milliseconds(o.ttl_s * 1000), c_.auth,
                        std::max<milliseconds>(milliseconds(o.ttl_s * 1000), 2000ms));
    if (!st.ok()) return st;
    log::info("lease granted", {log::kv("backend", "zookeeper"), log::kv("session", s->session_hex()),
                                log::kv("session_timeout_ms", s->timeout().count()),
                                log::kv("margin_ms", Renewer::margin_for(s->timeout()).count())});
    auto cand = std::make_unique<ZkCandidacy>(o, std::move(s));
    // The session's timeout counts from no earlier than the connect request's sending.
    cand->start(sent);
    *out = std::move(cand);
    return Status::OK();
  }

  Status leader(const std::string& election, milliseconds timeout, LeaderInfo* out) override {
    // A read: a chroot that does not exist holds no election (no leader), it is not made here.
    Session s;
    if (Status st = s.open(hosts_of(c_, true), std::max(timeout, milliseconds(4000)), c_.auth, timeout); !st.ok())
      return st;
    const std::string dir = election_path(election);
    for (int attempt = 0; attempt < 3; ++attempt) {
      Children ch;
      int rc = list_candidates(s, dir, &ch);
      if (rc == ZNONODE || (rc == ZOK && ch.names.empty())) return no_leader_status();
      if (rc != ZOK) return Status::Unavailable("zookeeper: " + zerr(rc));
      char buf[1024];
      int len = sizeof buf;
      struct Stat st {};
      rc = zoo_get(s.zh(), (dir + "/" + ch.names.front()).c_str(), 0, buf, &len, &st);
      if (rc == ZNONODE) continue;  // it just went: look again
      if (rc != ZOK) return Status::Unavailable("zookeeper: " + zerr(rc));
      *out = LeaderInfo{std::string(buf, len > 0 ? static_cast<std::size_t>(len) : 0), st.czxid};
      return Status::OK();
    }
    return Status::Unavailable("zookeeper: the leader kept changing");
  }

 private:
  using Clock = Candidacy::Clock;
  // The chroot must exist before a chrooted session can create under it: made once, on a session
  // without the chroot.
  Status make_chroot() {
    if (c_.chroot.empty() || chroot_made_) return Status::OK();
    Session s;
    if (Status st = s.open(hosts_of(c_, false), 4000ms, c_.auth, 4000ms); !st.ok()) return st;
    if (int rc = ensure_path(s, c_.chroot); rc != ZOK)
      return Status::Unavailable("zookeeper: creating the chroot " + c_.chroot + ": " + zerr(rc));
    chroot_made_ = true;
    return Status::OK();
  }

  const Coordinator c_;
  bool chroot_made_ = false;
};

}  // namespace

std::unique_ptr<Backend> make_zk_backend(const Coordinator& c, std::string*) { return std::make_unique<ZkBackend>(c); }

}  // namespace fencegate::election
