// The Redis backend of the election interface (backend.h): a lock with a TTL and a generation
// counter that is never reset, both changed by one Lua script each, so every acquisition gets a
// larger token.
//
//   keys    fencegate:election:<NAME>:lock        "<generation> <nonce> <id>", PX = TTL
//           fencegate:election:<NAME>:generation  INCR'd by every acquisition, never reset
//   acquire SET lock "<nonce> <id>" NX PX ttl; on success g = INCR generation and the lock's value
//           becomes "<g> <nonce> <id>" (same script: atomic)  -> token g
//   renew   PEXPIRE lock ttl iff GET lock is our value (our holder string): the lease renewal
//   resign  DEL lock iff GET lock is our value
//   leader  GET lock -> its generation and id
//
// A single Redis (or a Redis failover, which is asynchronous) is not a consensus system: a lock
// can be lost with the server's memory or handed out twice across a failover. That is the case
// fencing makes safe: the resource refuses the generation that is no longer the highest.
// The generation counter must survive Redis restarts (AOF or RDB persistence): a counter that
// starts over hands out generations the fences have already passed, so every new leader is
// refused (safe, not live) until the counter is raised above the fenced generation.
//
// Campaign: the lock is tried every 100 ms (a Redis lock has no queue). The candidacy's lease is
// the lock's PX: renewed every min(TTL/3, 1 s), deadline = send time of the last successful
// PEXPIRE + TTL - margin (renewer.h). Before the lock is held there is nothing to keep: valid().
//
// Thread-safety: each thread that talks to Redis uses its own connection (hiredis contexts are
// not thread-safe): the campaign (helper thread), the renewer thread, the owner thread.
#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/time.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "common/log.h"
#include "election_client/backend.h"
#include "election_client/backends.h"
#include "election_client/renewer.h"

namespace fencegate::election {

namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;

constexpr const char* kAcquire =
    "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then\n"
    "  local g = redis.call('INCR', KEYS[2])\n"
    "  redis.call('SET', KEYS[1], g .. ' ' .. ARGV[1], 'PX', ARGV[2])\n"
    "  return g\n"
    "end\n"
    "return 0\n";
constexpr const char* kRenew =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end\n"
    "return 0\n";
constexpr const char* kRelease =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end\n"
    "return 0\n";

std::string lock_key(const std::string& election) { return "fencegate:election:" + election + ":lock"; }
std::string generation_key(const std::string& election) { return "fencegate:election:" + election + ":generation"; }

// "<generation> <nonce> <id>" -> generation and id.
bool parse_lock_value(const std::string& v, std::int64_t* gen, std::string* id) {
  const auto sp1 = v.find(' ');
  if (sp1 == std::string::npos) return false;
  const auto sp2 = v.find(' ', sp1 + 1);
  if (sp2 == std::string::npos) return false;
  try {
    std::size_t used = 0;
    *gen = std::stoll(v.substr(0, sp1), &used);
    if (used != sp1 || *gen <= 0) return false;
  } catch (...) {
    return false;
  }
  *id = v.substr(sp2 + 1);
  return true;
}

struct ReplyDeleter {
  void operator()(redisReply* r) const {
    if (r) freeReplyObject(r);
  }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

// One connection, reconnected on the next call after an error. Not thread-safe.
class RedisConn {
 public:
  RedisConn(const Coordinator& c, milliseconds timeout) : c_(c), timeout_(timeout) {}
  ~RedisConn() { close(); }

  // The connection (connected, authenticated, the db selected): for a subscriber that drives the
  // context itself. Null with *why.
  redisContext* open(std::string* why) {
    if (!ctx_ && !connect(why)) return nullptr;
    return ctx_;
  }
  void drop() { close(); }
  int db() const { return c_.db; }

  // Runs one command; null with *why on a connection or server error.
  Reply command(const std::vector<std::string>& args, std::string* why) {
    if (!ctx_ && !connect(why)) return nullptr;
    Reply r = run(args, why);
    if (!r && ctx_ == nullptr) {
      // The connection broke (e.g. Redis restarted): one more try on a new one.
      if (!connect(why)) return nullptr;
      r = run(args, why);
    }
    return r;
  }

 private:
  Reply run(const std::vector<std::string>& args, std::string* why) {
    std::vector<const char*> argv;
    std::vector<std::size_t> lens;
    for (const auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    Reply r(static_cast<redisReply*>(redisCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), lens.data())));
    if (!r) {
      *why = ctx_->errstr[0] ? ctx_->errstr : "no reply";
      close();
      return nullptr;
    }
    if (r->type == REDIS_REPLY_ERROR) {
      *why = std::string(r->str, r->len);
      return nullptr;
    }
    return r;
  }

  bool connect(std::string* why) {
    close();
    const auto colon = c_.endpoints.front().rfind(':');
    const std::string host = c_.endpoints.front().substr(0, colon);
    const int port = std::stoi(c_.endpoints.front().substr(colon + 1));
    timeval tv{static_cast<time_t>(timeout_.count() / 1000),
               static_cast<suseconds_t>((timeout_.count() % 1000) * 1000)};
    ctx_ = redisConnectWithTimeout(host.c_str(), port, tv);
    if (!ctx_ || ctx_->err) {
      *why = ctx_ ? std::string("connect: ") + ctx_->errstr : "connect: out of memory";
      close();
      return false;
    }
    redisSetTimeout(ctx_, tv);
    if (!c_.auth.empty()) {
      std::vector<std::string> auth{"AUTH"};
      if (auto colon2 = c_.auth.find(':'); colon2 != std::string::npos) {
        auth.push_back(c_.auth.substr(0, colon2));
        auth.push_back(c_.auth.substr(colon2 + 1));
      } else {
        auth.push_back(c_.auth);
      }
      if (!run(auth, why)) {
        *why = "AUTH refused: " + *why;  // Redis's message, never the password
        close();
        return false;
      }
    }
    if (c_.db != 0 && !run({"SELECT", std::to_string(c_.db)}, why)) {
      *why = "SELECT " + std::to_string(c_.db) + ": " + *why;
      close();
      return false;
    }
    return true;
  }

  void close() {
    if (ctx_) redisFree(ctx_);
    ctx_ = nullptr;
  }

  const Coordinator c_;
  const milliseconds timeout_;
  redisContext* ctx_ = nullptr;
};

std::string random_nonce() {
  std::random_device rd;
  std::uniform_int_distribution<std::uint64_t> dist;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(dist(rd)));
  return buf;
}

class RedisCandidacy final : public Candidacy {
 public:
  RedisCandidacy(const Coordinator& c, CandidacyOptions o)
      : c_(c),
        o_(std::move(o)),
        ttl_(milliseconds(o_.ttl_s * 1000)),
        io_timeout_(std::max(ttl_ / 6, milliseconds(250))),
        holder_(random_nonce() + " " + o_.id),
        campaign_conn_(c, io_timeout_),
        owner_conn_(c, io_timeout_),
        renewer_("redis lock " + lock_key(o_.election), ttl_, std::min<milliseconds>(ttl_ / 3, 1000ms),
                 [this, conn = std::make_shared<RedisConn>(c, io_timeout_)](std::string* why) {
                   std::string w;
                   Reply r =
                       conn->command({"EVAL", kRenew, "1", lock_key(o_.election), value_, std::to_string(ttl_.count())},
                                     &w);
                   if (!r) {
                     *why = w;
                     return Renewer::Result::failed;
                   }
                   if (r->type == REDIS_REPLY_INTEGER && r->integer == 1) return Renewer::Result::renewed;
                   *why = "the lock is no longer ours (expired or taken)";
                   return Renewer::Result::lost;
                 }) {}
  ~RedisCandidacy() override { renewer_.stop(); }

  bool valid() const override { return !renewer_.started() || renewer_.valid(); }
  Clock::time_point deadline() const override {
    return renewer_.started() ? renewer_.deadline() : Clock::now() + ttl_ - renewer_.margin();
  }
  milliseconds margin() const override { return renewer_.margin(); }
  std::int64_t ttl_ms() const override { return ttl_.count(); }
  std::string state() const override { return renewer_.started() ? renewer_.state() : "waiting"; }
  std::string handle() const override { return lock_key(o_.election) + " = " + value_; }

  Status campaign(const std::atomic<bool>& cancel, std::int64_t* token) override {
    const std::string lk = lock_key(o_.election), gk = generation_key(o_.election);
    std::string last_error;
    while (!cancel) {
      const auto sent = Clock::now();
      std::string why;
      Reply r = campaign_conn_.command({"EVAL", kAcquire, "2", lk, gk, holder_, std::to_string(ttl_.count())}, &why);
      if (r && r->type == REDIS_REPLY_INTEGER && r->integer > 0) {
        value_ = std::to_string(r->integer) + " " + holder_;
        token_ = r->integer;
        *token = token_;
        renewer_.start(sent);
        return Status::OK();
      }
      if (!r && why != last_error) {
        log::warn("redis: cannot try the lock; trying again", {log::kv("error", why)});
        last_error = why;
      }
      for (int i = 0; i < 5 && !cancel; ++i) std::this_thread::sleep_for(20ms);
    }
    return Status::Cancelled();
  }

  Status confirm(std::int64_t token) override {
    std::string why;
    Reply r = owner_conn_.command({"GET", lock_key(o_.election)}, &why);
    if (!r) return Status::Unavailable("redis: " + why);
    if (r->type != REDIS_REPLY_STRING || std::string(r->str, r->len) != value_ || token != token_)
      return Status::Error("the lock is not ours");
    return Status::OK();
  }

  // The renewer's PEXPIRE (every TTL/3, at most 1 s) compares the holder first: a lock deleted or
  // taken while we lead is seen by it as lost.
  void guard() override {}
  bool gone() override { return false; }

  void give_up(bool leading) override {
    renewer_.stop();
    if (!leading || value_.empty()) return;
    std::string why;
    Reply r = owner_conn_.command({"EVAL", kRelease, "1", lock_key(o_.election), value_}, &why);
    if (r && r->type == REDIS_REPLY_INTEGER && r->integer == 1) log::info("resigned", {log::kv("token", token_)});
    else if (!r) log::warn("resign failed (the lock will expire)", {log::kv("error", why)});
  }

 private:
  const Coordinator c_;
  const CandidacyOptions o_;
  const milliseconds ttl_, io_timeout_;
  const std::string holder_;  // "<nonce> <id>"
  RedisConn campaign_conn_, owner_conn_;
  // Set by campaign() before renewer_ starts (its thread reads it after start()).
  std::string value_;  // "<generation> <nonce> <id>"
  std::int64_t token_ = 0;
  Renewer renewer_;
};

class RedisObserver final : public Observer {
 public:
  explicit RedisObserver(const Coordinator& c) : conn_(c, 1000ms) {}
  Status snapshot(const std::string& election, milliseconds, ElectionSnapshot* out) override {
    std::string why;
    Reply r = conn_.command({"MGET", lock_key(election), generation_key(election)}, &why);
    if (!r) return Status::Unavailable("redis: " + why);
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2) return Status::Protocol("redis: MGET answered oddly");
    out->candidates.clear();
    out->revision = 0;
    const redisReply* lock = r->element[0];
    const redisReply* gen = r->element[1];
    if (gen->type == REDIS_REPLY_STRING) {
      try {
        out->revision = std::stoll(std::string(gen->str, gen->len));
      } catch (...) {
        return Status::Protocol("redis: " + generation_key(election) + " is not a number");
      }
    }
    if (lock->type == REDIS_REPLY_STRING) {
      ElectionSnapshot::Candidate c;
      c.key = lock_key(election);
      if (!parse_lock_value(std::string(lock->str, lock->len), &c.token, &c.id))
        return Status::Protocol("redis: " + lock_key(election) + " does not hold a fencegate lock");
      out->candidates.push_back(std::move(c));
    }
    return Status::OK();
  }

 private:
  RedisConn conn_;
};

// issue 31: keyspace notifications of the lock and the counter, on a connection of their own
// (a subscribed connection takes no other commands). Only used when the server already sends
// them (notify-keyspace-events with K and the generic, string and expired classes): fencegate
// never changes the server's configuration.
class RedisFeed final : public ChangeFeed {
 public:
  explicit RedisFeed(const Coordinator& c) : conn_(c, 1000ms) {}

  std::string start(const std::string& election) {
    std::string why;
    Reply cfg = conn_.command({"CONFIG", "GET", "notify-keyspace-events"}, &why);
    if (!cfg) return "CONFIG GET notify-keyspace-events: " + why;
    std::string flags;
    if (cfg->type == REDIS_REPLY_ARRAY && cfg->elements == 2 && cfg->element[1]->type == REDIS_REPLY_STRING)
      flags.assign(cfg->element[1]->str, cfg->element[1]->len);
    auto has = [&](char f) { return flags.find(f) != std::string::npos; };
    // K: keyspace channels; g: DEL; $: SET, INCR; x: expired. A = all classes.
    if (!has('K') || !(has('A') || (has('g') && has('$') && has('x'))))
      return "notify-keyspace-events is \"" + flags + "\" (needs K with A, or with g$x)";
    redisContext* ctx = conn_.open(&why);
    if (!ctx) return why;
    const std::string prefix = "__keyspace@" + std::to_string(conn_.db()) + "__:";
    const std::string lock = prefix + lock_key(election), gen = prefix + generation_key(election);
    const char* argv[] = {"SUBSCRIBE", lock.c_str(), gen.c_str()};
    const std::size_t lens[] = {9, lock.size(), gen.size()};
    if (redisAppendCommandArgv(ctx, 3, argv, lens) != REDIS_OK) return "SUBSCRIBE: out of memory";
    for (int confirmed = 0; confirmed < 2;) {  // one confirmation per channel
      void* r = nullptr;
      if (redisGetReply(ctx, &r) != REDIS_OK || !r) {
        why = ctx->errstr[0] ? ctx->errstr : "no reply";
        conn_.drop();
        return "SUBSCRIBE: " + why;
      }
      Reply rep(static_cast<redisReply*>(r));
      if (rep->type == REDIS_REPLY_ERROR) return "SUBSCRIBE: " + std::string(rep->str, rep->len);
      ++confirmed;
    }
    ctx_ = ctx;
    // From here the socket is driven with poll(): no blocking read waits past wait()'s timeout.
    timeval none{0, 0};
    redisSetTimeout(ctx_, none);
    return {};
  }

  bool ping() override {
    if (!ctx_) return false;
    if (redisAppendCommand(ctx_, "PING") != REDIS_OK) return broken();
    int done = 0;
    while (!done)
      if (redisBufferWrite(ctx_, &done) != REDIS_OK) return broken();
    return true;
  }

  Event wait(milliseconds timeout) override {
    if (!ctx_) return Event::broken;
    for (;;) {
      void* r = nullptr;
      if (redisReaderGetReply(ctx_->reader, &r) != REDIS_OK) return fail();
      if (r) {
        Reply rep(static_cast<redisReply*>(r));
        // ["message", channel, event] or, for a PING while subscribed, ["pong", ""].
        if (rep->type == REDIS_REPLY_ARRAY && rep->elements >= 1 && rep->element[0]->type == REDIS_REPLY_STRING) {
          const std::string kind(rep->element[0]->str, rep->element[0]->len);
          if (kind == "pong") return Event::pong;
          if (kind == "message") return Event::changed;
        }
        continue;  // anything else (a late subscribe confirmation): not a change
      }
      pollfd p{ctx_->fd, POLLIN, 0};
      const int n = ::poll(&p, 1, static_cast<int>(timeout.count()));
      if (n == 0) return Event::timeout;
      if (n < 0) return errno == EINTR ? Event::timeout : fail();
      if (redisBufferRead(ctx_) != REDIS_OK) return fail();
      timeout = 0ms;  // what arrived is read; the next turn returns it or times out at once
    }
  }

 private:
  Event fail() {
    broken();
    return Event::broken;
  }
  bool broken() {
    conn_.drop();
    ctx_ = nullptr;
    return false;
  }

  RedisConn conn_;
  redisContext* ctx_ = nullptr;  // conn_'s, once subscribed
};

class RedisBackend final : public Backend {
 public:
  explicit RedisBackend(Coordinator c) : c_(std::move(c)) {}
  std::unique_ptr<Observer> observer() override { return std::make_unique<RedisObserver>(c_); }

  Status start(const CandidacyOptions& o, std::unique_ptr<Candidacy>* out) override {
    // Reach Redis once (and check AUTH/SELECT) so that a wrong address fails at start.
    RedisConn probe(c_, 2000ms);
    std::string why;
    if (!probe.command({"PING"}, &why)) return Status::Unavailable("redis " + c_.endpoints.front() + ": " + why);
    log::info("lease granted", {log::kv("backend", "redis"), log::kv("ttl_s", o.ttl_s),
                                log::kv("margin_ms", Renewer::margin_for(milliseconds(o.ttl_s * 1000)).count())});
    *out = std::make_unique<RedisCandidacy>(c_, o);
    return Status::OK();
  }

  std::unique_ptr<ChangeFeed> changes(const std::string& election, std::string* why) override {
    auto feed = std::make_unique<RedisFeed>(c_);
    if (std::string e = feed->start(election); !e.empty()) {
      *why = e;
      return nullptr;
    }
    return feed;
  }

  Status leader(const std::string& election, milliseconds timeout, LeaderInfo* out) override {
    RedisConn conn(c_, timeout);
    std::string why;
    Reply r = conn.command({"GET", lock_key(election)}, &why);
    if (!r) return Status::Unavailable("redis " + c_.endpoints.front() + ": " + why);
    if (r->type == REDIS_REPLY_NIL) return no_leader_status();
    LeaderInfo li;
    if (r->type != REDIS_REPLY_STRING || !parse_lock_value(std::string(r->str, r->len), &li.token, &li.id))
      return Status::Protocol("redis: " + lock_key(election) + " does not hold a fencegate lock");
    *out = std::move(li);
    return Status::OK();
  }

 private:
  const Coordinator c_;
};

}  // namespace

std::unique_ptr<Backend> make_redis_backend(const Coordinator& c, std::string*) {
  return std::make_unique<RedisBackend>(c);
}

}  // namespace fencegate::election
