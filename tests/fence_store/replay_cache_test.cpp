// Issue 30: the store's in-memory cache of completed keys, which answers replays without a store
// round trip. It is bounded; what it evicts must be what was used least recently, so that a key
// clients keep retrying stays answerable from memory while a flood of new keys completes.
#include <doctest/doctest.h>

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
