// election::Client against a real etcd: leases, elections, the fencing token, watch, failover.
#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "election_client/base64.h"
#include "election_client/etcd_client.h"
#include "election_client/watch.h"
#include "tests/election/etcd_harness.h"

using namespace fencegate::election;
using namespace fencegate::testing;

TEST_CASE("base64 and prefix ranges") {
  CHECK(base64_encode("") == "");
  CHECK(base64_encode("bill") == "YmlsbA==");
  CHECK(base64_encode("bill/") == "YmlsbC8=");
  CHECK(base64_encode("ab") == "YWI=");
  CHECK(*base64_decode("YmlsbC8yMDQwYTIyOGQzMTEzZTA3") == "bill/2040a228d3113e07");
  CHECK(*base64_decode("YWI=") == "ab");
  CHECK_FALSE(base64_decode("Y!==").has_value());
  CHECK(prefix_range_end("bill/") == "bill0");
  CHECK(prefix_range_end(std::string("a\xff", 2)) == "b");
  std::vector<std::string> eps;
  std::string err;
  CHECK(parse_endpoint_list("http://127.0.0.1:2379, http://10.0.0.2:2379", &eps, &err));
  CHECK(eps == std::vector<std::string>{"http://127.0.0.1:2379", "http://10.0.0.2:2379"});
  CHECK(parse_endpoint_list("https://127.0.0.1:2379", &eps, &err));  // issue 27: etcd over TLS
  CHECK_FALSE(parse_endpoint_list("ftp://127.0.0.1:2379", &eps, &err));
  CHECK_FALSE(parse_endpoint_list("http://127.0.0.1:2379/v3", &eps, &err));
  CHECK_FALSE(parse_endpoint_list("", &eps, &err));
}

TEST_CASE("client: lease grant, keepalive, time-to-live and revoke") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  Client c(client_options(etcd));

  LeaseGrant g;
  Status st = c.grant(5, &g);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  CHECK(g.id != 0);
  CHECK(g.ttl == 5);

  std::int64_t ttl = -2;
  st = c.keepalive(g.id, &ttl, 2s);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  CHECK(ttl == 5);
  // Several renewals in a row (the pooled connection is reused).
  for (int i = 0; i < 3; ++i) CHECK(c.keepalive(g.id, &ttl, 2s).ok());
  CHECK(ttl == 5);
  std::int64_t left = 0;
  CHECK(c.time_to_live(g.id, &left).ok());
  CHECK(left > 0);

  CHECK(c.revoke(g.id, 2s).ok());
  // A gone lease: keepalive answers without TTL, time-to-live says -1, revoke is idempotent.
  st = c.keepalive(g.id, &ttl, 2s);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  CHECK(ttl == 0);
  CHECK(c.time_to_live(g.id, &left).ok());
  CHECK(left == -1);
  CHECK(c.revoke(g.id, 2s).ok());
}

TEST_CASE("client: campaign's rev is the leader key's creation revision; leader, resign, cancel") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  Client c(client_options(etcd));

  // Some unrelated history first, so revisions, lease IDs and versions all differ.
  for (int i = 0; i < 3; ++i) REQUIRE(c.put("other/" + std::to_string(i), "x").ok());

  KeyValue none;
  Status st = c.leader("billing", &none);
  CHECK_MESSAGE(st.is_no_leader(), st.to_string());

  LeaseGrant la, lb;
  REQUIRE(c.grant(10, &la).ok());
  REQUIRE(c.grant(10, &lb).ok());
  LeaderKey a;
  st = c.campaign("billing", la.id, "worker-a", &a);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  CHECK(a.name == "billing");
  CHECK(a.key.rfind("billing/", 0) == 0);
  CHECK(a.lease == la.id);
  CHECK(a.rev > 3);
  CHECK(a.rev != la.id);

  // Later writes move the store's revision, not the token.
  ResponseHeader ph;
  REQUIRE(c.put("other/later", "y", 0, &ph).ok());
  CHECK(ph.revision > a.rev);

  KeyValue lead;
  ResponseHeader lh;
  st = c.leader("billing", &lead, &lh);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  CHECK(lead.key == a.key);
  CHECK(lead.value == "worker-a");
  CHECK(lead.create_revision == a.rev);
  CHECK(lh.revision > lead.create_revision);  // the header revision is not the token
  CHECK(lead.lease == la.id);

  std::vector<KeyValue> kvs;
  REQUIRE(c.range(election_prefix("billing"), prefix_range_end(election_prefix("billing")), &kvs).ok());
  REQUIRE(kvs.size() == 1);
  CHECK(kvs[0].create_revision == a.rev);

  // B waits in line behind A...
  LeaderKey b;
  std::atomic<bool> b_done{false};
  Status b_status;
  std::thread tb([&] {
    b_status = c.campaign("billing", lb.id, "worker-b", &b);
    b_done = true;
  });
  std::this_thread::sleep_for(400ms);
  CHECK_FALSE(b_done.load());
  REQUIRE(c.range(election_prefix("billing"), prefix_range_end(election_prefix("billing")), &kvs).ok());
  CHECK(kvs.size() == 2);  // a waiting candidate's key exists, but it is not the leader
  REQUIRE(c.leader("billing", &lead).ok());
  CHECK(lead.value == "worker-a");

  // ...and wins when A resigns, with a higher token.
  st = c.resign(a, 2s);
  CHECK_MESSAGE(st.ok(), st.to_string());
  CHECK(eventually([&] { return b_done.load(); }, 5s));
  tb.join();
  REQUIRE_MESSAGE(b_status.ok(), b_status.to_string());
  CHECK(b.rev > a.rev);
  REQUIRE(c.leader("billing", &lead).ok());
  CHECK(lead.value == "worker-b");
  CHECK(lead.create_revision == b.rev);

  // A cancelled campaign returns promptly.
  LeaseGrant lc;
  REQUIRE(c.grant(10, &lc).ok());
  std::atomic<bool> cancel{false};
  LeaderKey cl;
  Status c_status;
  auto t0 = Clock::now();
  std::thread tc([&] { c_status = c.campaign("billing", lc.id, "worker-c", &cl, &cancel); });
  std::this_thread::sleep_for(200ms);
  cancel = true;
  tc.join();
  CHECK(c_status.is_cancelled());
  CHECK(Clock::now() - t0 < 1500ms);

  // Revoking B's lease ends its leadership: no leader left once C's candidacy is gone too.
  CHECK(c.revoke(lc.id, 2s).ok());
  CHECK(c.revoke(lb.id, 2s).ok());
  st = c.leader("billing", &lead);
  CHECK_MESSAGE(st.is_no_leader(), st.to_string());
}

TEST_CASE("client: watch on a prefix sees puts and deletes under it, and only those") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  Client c(client_options(etcd));

  std::mutex mu;
  std::condition_variable cv;
  std::vector<WatchEvent> events;
  std::int64_t created_rev = -1;
  Watch::Options wo;
  wo.client = client_options(etcd);
  wo.prefix = "jobs/";
  Watch w(
      wo,
      [&](const WatchBatch& b) {
        std::lock_guard lk(mu);
        for (const auto& e : b.events) events.push_back(e);
        cv.notify_all();
      },
      [&](Watch::State s, std::int64_t rev, const Status&) {
        std::lock_guard lk(mu);
        if (s == Watch::State::watching) created_rev = rev;
        cv.notify_all();
      });
  w.start();
  {
    std::unique_lock lk(mu);
    REQUIRE(cv.wait_for(lk, 5s, [&] { return created_rev >= 0; }));
  }
  ResponseHeader h1, h2;
  REQUIRE(c.put("jobs/a", "1", 0, &h1).ok());
  REQUIRE(c.put("jobsx", "outside", 0).ok());
  REQUIRE(c.put("other/b", "outside", 0).ok());
  std::int64_t deleted = 0;
  REQUIRE(c.delete_range("jobs/a", "", &deleted).ok());
  CHECK(deleted == 1);
  REQUIRE(c.put("jobs/b", "2", 0, &h2).ok());
  {
    std::unique_lock lk(mu);
    REQUIRE_MESSAGE(cv.wait_for(lk, 5s, [&] { return events.size() >= 3; }), "events seen: ", events.size());
    REQUIRE(events.size() == 3);
    CHECK(events[0].type == WatchEvent::Type::put);
    CHECK(events[0].kv.key == "jobs/a");
    CHECK(events[0].kv.value == "1");
    CHECK(events[0].kv.create_revision == h1.revision);
    CHECK(events[1].type == WatchEvent::Type::del);
    CHECK(events[1].kv.key == "jobs/a");
    CHECK(events[2].kv.key == "jobs/b");
    CHECK(events[2].kv.mod_revision == h2.revision);
  }
  CHECK(w.next_revision() == h2.revision + 1);
  w.stop();

  // A watch from a past revision replays history.
  std::vector<WatchEvent> replay;
  Watch::Options wo2 = wo;
  wo2.start_revision = h1.revision;
  Watch w2(wo2, [&](const WatchBatch& b) {
    std::lock_guard lk(mu);
    for (const auto& e : b.events) replay.push_back(e);
    cv.notify_all();
  });
  w2.start();
  {
    std::unique_lock lk(mu);
    CHECK(cv.wait_for(lk, 5s, [&] { return replay.size() >= 3; }));
  }
  w2.stop();
}

TEST_CASE("client: fails over to the next endpoint when the first is a closed port") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  ClientOptions o = client_options(etcd);
  o.endpoints = {"http://127.0.0.1:" + std::to_string(free_port()), etcd.url()};
  Client c(o);
  LeaseGrant g;
  auto t0 = Clock::now();
  Status st = c.grant(5, &g);
  REQUIRE_MESSAGE(st.ok(), st.to_string());
  CHECK(Clock::now() - t0 < 2s);
  std::int64_t ttl = 0;
  CHECK(c.keepalive(g.id, &ttl, 2s).ok());
  CHECK(ttl == 5);

  // Every endpoint dead: unavailable, quickly, naming them.
  ClientOptions dead = o;
  dead.endpoints = {"http://127.0.0.1:" + std::to_string(free_port()),
                    "http://127.0.0.1:" + std::to_string(free_port())};
  Client d(dead);
  t0 = Clock::now();
  st = d.grant(5, &g);
  CHECK(st.is_unavailable());
  CHECK(st.message().find("127.0.0.1") != std::string::npos);
  CHECK(Clock::now() - t0 < 2s);
}

// Issue 33: the fleet reads fence/, intent/, members/ and acks/ in one round trip.
TEST_CASE("client: ranges reads several ranges in one transaction, one result per range, empty ones too") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  Client c(client_options(etcd));
  REQUIRE(c.put("rs/a", "1").ok());
  REQUIRE(c.put("rs/p/x", "2").ok());
  REQUIRE(c.put("rs/p/y", "3").ok());
  std::vector<std::vector<KeyValue>> out;
  ResponseHeader h;
  REQUIRE(c.ranges({{"rs/a", ""}, {"rs/p/", prefix_range_end("rs/p/")}, {"rs/none", ""}}, &out, &h).ok());
  REQUIRE(out.size() == 3);
  REQUIRE(out[0].size() == 1);
  CHECK(out[0][0].value == "1");
  REQUIRE(out[1].size() == 2);
  CHECK(out[1][0].key == "rs/p/x");
  CHECK(out[1][1].value == "3");
  CHECK(out[2].empty());
  CHECK(h.revision >= out[1][1].mod_revision);
  CHECK(out[1][1].mod_revision > out[1][0].mod_revision);
}

// Issue 33: the fleet's intent transaction reads members/ and acks/ at its own revision, and its
// commit checks an acknowledgement's lease (an absent key has none).
TEST_CASE("client: txn reads ranges after its puts and compares a key's lease") {
  FG_REQUIRE_ETCD();
  EtcdServer etcd;
  FG_START_ETCD(etcd);
  Client c(client_options(etcd));
  LeaseGrant g, other;
  REQUIRE(c.grant(30, &g).ok());
  REQUIRE(c.grant(30, &other).ok());
  REQUIRE(c.put("tx/m/a", "member a", g.id).ok());
  bool ok = false;
  ResponseHeader h;
  std::vector<std::vector<KeyValue>> got;
  const std::vector<TxnOp> ops = {
      TxnOp{TxnOp::Type::put, "tx/ack/a", "", "", g.id},
      TxnOp{TxnOp::Type::range, "tx/m/", "", prefix_range_end("tx/m/"), 0},
      TxnOp{TxnOp::Type::range, "tx/ack/", "", prefix_range_end("tx/ack/"), 0},
  };
  REQUIRE(c.txn({{"tx/none", 0}}, ops, &ok, &h, &got).ok());
  REQUIRE(ok);
  REQUIRE(got.size() == 2);
  REQUIRE(got[0].size() == 1);
  CHECK(got[0][0].lease == g.id);
  CHECK(got[0][0].create_revision < h.revision);
  REQUIRE(got[1].size() == 1);  // the put before the range, in the same transaction
  CHECK(got[1][0].key == "tx/ack/a");
  CHECK(got[1][0].mod_revision == h.revision);

  // A failed compare: nothing done, nothing read.
  REQUIRE(c.txn({{"tx/none", 1}}, ops, &ok, nullptr, &got).ok());
  CHECK_FALSE(ok);
  CHECK(got.empty());

  const auto lease_is = [](std::string k, std::int64_t l) {
    return TxnCompare{std::move(k), 0, TxnCompare::Target::lease, l};
  };
  const std::vector<TxnOp> mark = {TxnOp{TxnOp::Type::put, "tx/mark", "1", "", 0}};
  REQUIRE(c.txn({lease_is("tx/ack/a", other.id)}, mark, &ok).ok());
  CHECK_FALSE(ok);  // another lease
  REQUIRE(c.txn({lease_is("tx/ack/b", g.id)}, mark, &ok).ok());
  CHECK_FALSE(ok);  // absent: no lease
  REQUIRE(c.txn({lease_is("tx/ack/a", g.id), {"tx/mark", 0}}, mark, &ok).ok());
  CHECK(ok);
  // The lease gone, its keys go with it: the compare fails again.
  REQUIRE(c.revoke(g.id, 2s).ok());
  REQUIRE(c.txn({lease_is("tx/ack/a", g.id)}, mark, &ok).ok());
  CHECK_FALSE(ok);
}
