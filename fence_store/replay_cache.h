// Internal to fence_store/: completed idempotency keys kept in memory, so that a replay (or a
// 422 for another request under the same key) needs no store round trip. Bounded by entries
// and bytes, the least recently used evicted first (the database still has it). Thread-safe.
//
// Every keyed write asks it (a miss, for a new key) and every completed one is put in it, so
// its index is an open-addressing table (a hash and a list position per slot, at most a third
// full, linear probing): a lookup reads one slot, where a node-based map read the bucket, the
// node before the bucket's first and that node, a cache miss each (issue 30's cost work).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <iterator>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "fence_store/store.h"

namespace fencegate::store::detail {

class ReplayCache {
 public:
  // Keeps `r` if it is completed (others are not replayable), as the most recently used entry.
  void put(const KeyRecord& r) {
    if (r.state == KeyState::completed) keep(std::make_shared<const KeyRecord>(r));
  }
  // The same, taking `r` over (no copy of its strings).
  void put(KeyRecord&& r) {
    if (r.state == KeyState::completed) keep(std::make_shared<const KeyRecord>(std::move(r)));
  }
  // The completed key, or nullptr; a hit makes it the most recently used.
  std::shared_ptr<const KeyRecord> get(const std::string& resource, const std::string& scope, const std::string& key) {
    const std::string k = key_of(resource, scope, key);
    const std::uint64_t h = hash_of(k);
    std::lock_guard lk(mu_);
    const std::size_t i = find(k, h);
    if (i == kNone) return nullptr;
    order_.splice(order_.begin(), order_, slots_[i].at);
    return slots_[i].at->rec;
  }
  void drop(const std::string& resource, const std::string& scope, const std::string& key) {
    const std::string k = key_of(resource, scope, key);
    const std::uint64_t h = hash_of(k);
    std::lock_guard lk(mu_);
    if (const std::size_t i = find(k, h); i != kNone) erase(i);
  }
  void clear() {
    std::lock_guard lk(mu_);
    slots_.clear();
    slots_.shrink_to_fit();
    order_.clear();
    bytes_ = 0;
  }
  std::size_t size() const {
    std::lock_guard lk(mu_);
    return order_.size();
  }

  // At most kEntries keys, whose bodies are at most 16 MiB each by config and kBytes together.
  static constexpr std::size_t kEntries = 10000;
  static constexpr std::size_t kBytes = 64u << 20;

 private:
  struct Entry {
    std::string key;  // key_of(resource, scope, key)
    std::uint64_t hash;
    std::shared_ptr<const KeyRecord> rec;
  };
  using Order = std::list<Entry>;  // most recently used first
  struct Slot {
    std::uint64_t hash = 0;  // 0: empty (hash_of is never 0)
    Order::iterator at;
  };
  // A power of two at least three times kEntries + 1 (an entry is put before the oldest goes).
  static constexpr std::size_t kSlots = 32768;
  static_assert(kSlots >= 3 * (kEntries + 1) && (kSlots & (kSlots - 1)) == 0);
  static constexpr std::size_t kNone = ~std::size_t{0};

  static std::string key_of(const std::string& resource, const std::string& scope, const std::string& key) {
    std::string k;
    k.reserve(resource.size() + scope.size() + key.size() + 2);
    k.append(resource).append(1, '\0').append(scope).append(1, '\0').append(key);
    return k;
  }
  static std::uint64_t hash_of(std::string_view k) {
    const std::uint64_t h = std::hash<std::string_view>{}(k);
    return h != 0 ? h : 1;
  }

  // The slot holding `k`, or kNone. mu_ held.
  std::size_t find(const std::string& k, std::uint64_t h) const {
    if (slots_.empty()) return kNone;
    for (std::size_t i = h & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
      const Slot& s = slots_[i];
      if (s.hash == 0) return kNone;
      if (s.hash == h && s.at->key == k) return i;
    }
  }

  void keep(std::shared_ptr<const KeyRecord> p) {  // (the copy or move is made before the lock)
    std::string k = key_of(p->resource, p->scope, p->key);
    const std::uint64_t h = hash_of(k);
    std::lock_guard lk(mu_);
    if (const std::size_t i = find(k, h); i != kNone) {
      bytes_ -= slots_[i].at->rec->body.size();
      slots_[i].at->rec = std::move(p);
      bytes_ += slots_[i].at->rec->body.size();
      order_.splice(order_.begin(), order_, slots_[i].at);
    } else {
      if (slots_.empty()) slots_.resize(kSlots);  // on first use: a store without keys holds none
      bytes_ += p->body.size();
      order_.push_front(Entry{std::move(k), h, std::move(p)});
      std::size_t j = h & (kSlots - 1);
      while (slots_[j].hash != 0) j = (j + 1) & (kSlots - 1);
      slots_[j] = Slot{h, order_.begin()};
    }
    // The least recently used go first; never the entry just put (a hot key must stay hot).
    while ((order_.size() > kEntries || bytes_ > kBytes) && order_.size() > 1) {
      const Entry& oldest = order_.back();
      erase(find(oldest.key, oldest.hash));
    }
  }

  // Removes the entry of slot `i`, and closes the gap: a later slot of the same probe run whose
  // home is not cyclically in (i, j] moves into it (backward-shift deletion). mu_ held.
  void erase(std::size_t i) {
    bytes_ -= slots_[i].at->rec->body.size();
    order_.erase(slots_[i].at);
    for (std::size_t j = i;;) {
      slots_[i].hash = 0;
      for (;;) {
        j = (j + 1) & (kSlots - 1);
        if (slots_[j].hash == 0) return;
        const std::size_t home = slots_[j].hash & (kSlots - 1);
        const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (!stays) break;
      }
      slots_[i] = slots_[j];
      i = j;
    }
  }

  mutable std::mutex mu_;
  Order order_;              // guarded by mu_
  std::vector<Slot> slots_;  // guarded by mu_; kSlots once the first entry is put
  std::size_t bytes_ = 0;    // guarded by mu_
};

}  // namespace fencegate::store::detail
