// Issue 30: the store's in-memory cache of completed keys, which answers replays without a store
// round trip. It is bounded; what it evicts must be what was used least recently, so that a key
// clients keep retrying stays answerable from memory while a flood of new keys completes.
#include <doctest/doctest.h>

#include <list>
#include <map>
#include <random>
#include <string>

#include "fence_store/replay_cache.h"

using fencegate::store::KeyRecord;
using fencegate::store::KeyState;
using fencegate::store::detail::ReplayCache;

namespace {

KeyRecord completed(const std::string& key, std::size_t body = 2) {
  KeyRecord r;
  r.resource = "res";
  r.key = key;
  r.state = KeyState::completed;
  r.status = 201;
  r.body.assign(body, 'b');
  return r;
}

}  // namespace

TEST_CASE("replay cache: only completed keys are kept") {
  ReplayCache c;
  KeyRecord r = completed("a");
  r.state = KeyState::in_flight;
  c.put(r);
  CHECK(c.get("res", "", "a") == nullptr);
  r.state = KeyState::unknown;
  c.put(r);
  CHECK(c.get("res", "", "a") == nullptr);
  c.put(completed("a"));
  REQUIRE(c.get("res", "", "a") != nullptr);
  CHECK(c.get("res", "", "a")->status == 201);
  CHECK(c.get("other", "", "a") == nullptr);  // scoped per resource
  CHECK(c.get("res", "client-1", "a") == nullptr);  // and per scope
}

TEST_CASE("replay cache: a key retried all along survives a flood of new keys; the unused go first") {
  ReplayCache c;
  c.put(completed("hot"));
  c.put(completed("cold"));
  const std::size_t flood = ReplayCache::kEntries * 3;
  for (std::size_t i = 0; i < flood; ++i) {
    c.put(completed("k" + std::to_string(i)));
    if (i % 100 == 0) REQUIRE(c.get("res", "", "hot") != nullptr);  // retried now and then
    REQUIRE(c.get("res", "", "k" + std::to_string(i)) != nullptr);  // the key just put is there
  }
  CHECK(c.size() == ReplayCache::kEntries);
  CHECK(c.get("res", "", "hot") != nullptr);
  CHECK(c.get("res", "", "cold") == nullptr);
  CHECK(c.get("res", "", "k0") == nullptr);
  CHECK(c.get("res", "", "k" + std::to_string(flood - 1)) != nullptr);
}

TEST_CASE("replay cache: the byte bound evicts the least recently used, never the entry just put") {
  ReplayCache c;
  const std::size_t big = ReplayCache::kBytes / 3 + 1;  // three do not fit
  c.put(completed("a", big));
  c.put(completed("b", big));
  REQUIRE(c.get("res", "", "a") != nullptr);  // a is now the more recently used
  c.put(completed("c", big));
  CHECK(c.get("res", "", "b") == nullptr);
  CHECK(c.get("res", "", "a") != nullptr);
  CHECK(c.get("res", "", "c") != nullptr);
  c.put(completed("huge", ReplayCache::kBytes + 1));  // alone over the bound: kept, the rest goes
  CHECK(c.size() == 1);
  CHECK(c.get("res", "", "huge") != nullptr);
  c.drop("res", "", "huge");
  CHECK(c.size() == 0);
}

TEST_CASE("replay cache: random puts, gets and drops agree with a plain LRU list") {
  // A small key space over many evictions: the index's probe runs fill, wrap and close up again.
  ReplayCache c;
  std::list<std::string> lru;  // the model: most recently used first
  std::map<std::string, std::pair<int, std::list<std::string>::iterator>> held;
  std::mt19937 rng(30);
  auto touch = [&](const std::string& k) {
    if (auto it = held.find(k); it != held.end()) lru.erase(it->second.second);
    lru.push_front(k);
    return lru.begin();
  };
  for (int step = 0; step < 60000; ++step) {
    const std::string k = "k" + std::to_string(rng() % (ReplayCache::kEntries + 2000));
    const unsigned op = rng() % 10;
    if (op < 5) {
      KeyRecord r = completed(k);
      r.status = 200 + step % 300;
      c.put(std::move(r));
      held[k] = {200 + step % 300, touch(k)};
      if (lru.size() > ReplayCache::kEntries) {
        held.erase(lru.back());
        lru.pop_back();
      }
    } else if (op < 9) {
      auto got = c.get("res", "", k);
      auto it = held.find(k);
      REQUIRE((got != nullptr) == (it != held.end()));
      if (got) {
        CHECK(got->status == it->second.first);
        it->second.second = touch(k);
      }
    } else {
      c.drop("res", "", k);
      if (auto it = held.find(k); it != held.end()) {
        lru.erase(it->second.second);
        held.erase(it);
      }
    }
    if (step % 1000 == 0) REQUIRE(c.size() == lru.size());
  }
  for (const auto& k : lru) CHECK(c.get("res", "", k) != nullptr);
}
