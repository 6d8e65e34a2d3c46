// Internal to fence_store/: completed idempotency keys kept in memory, so that a replay (or a
// 422 for another request under the same key) needs no store round trip. Bounded by entries
// and bytes, the least recently used evicted first (the database still has it). Thread-safe.
#pragma once

#include <cstddef>
#include <iterator>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

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
    std::lock_guard lk(mu_);
    auto it = map_.find(key_of(resource, scope, key));
    if (it == map_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return it->second->second;
  }
  void drop(const std::string& resource, const std::string& scope, const std::string& key) {
    std::lock_guard lk(mu_);
    auto it = map_.find(key_of(resource, scope, key));
    if (it != map_.end()) erase(it->second);
  }
  void clear() {
    std::lock_guard lk(mu_);
    map_.clear();
    order_.clear();
    bytes_ = 0;
  }
  std::size_t size() const {
    std::lock_guard lk(mu_);
    return map_.size();
  }

  // At most kEntries keys, whose bodies are at most 16 MiB each by config and kBytes together.
  static constexpr std::size_t kEntries = 10000;
  static constexpr std::size_t kBytes = 64u << 20;

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const KeyRecord>>;
  using Order = std::list<Entry>;  // most recently used first
  static std::string key_of(const std::string& resource, const std::string& scope, const std::string& key) {
    std::string k;
    k.reserve(resource.size() + scope.size() + key.size() + 2);
    k.append(resource).append(1, '\0').append(scope).append(1, '\0').append(key);
    return k;
  }
  void keep(std::shared_ptr<const KeyRecord> p) {  // (the copy or move is made before the lock)
    std::lock_guard lk(mu_);
    std::string k = key_of(p->resource, p->scope, p->key);
    if (auto it = map_.find(k); it != map_.end()) {
      bytes_ -= it->second->second->body.size();
      it->second->second = std::move(p);
      bytes_ += it->second->second->body.size();
      order_.splice(order_.begin(), order_, it->second);
    } else {
      order_.emplace_front(std::move(k), std::move(p));
      map_.emplace(std::string_view(order_.front().first), order_.begin());
      bytes_ += order_.front().second->body.size();
    }
    // The least recently used go first; never the entry just put (a hot key must stay hot).
    while ((map_.size() > kEntries || bytes_ > kBytes) && map_.size() > 1) erase(std::prev(order_.end()));
  }
  void erase(Order::iterator e) {  // mu_ held
    bytes_ -= e->second->body.size();
    map_.erase(std::string_view(e->first));
    order_.erase(e);
  }

  mutable std::mutex mu_;
  Order order_;                                                 // guarded by mu_
  // Keyed by views of the entries' own strings (a list node never moves): one copy of each key.
  std::unordered_map<std::string_view, Order::iterator> map_;  // guarded by mu_
  std::size_t bytes_ = 0;                                       // guarded by mu_
};

}  // namespace fencegate::store::detail
