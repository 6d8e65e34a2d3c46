// Internal to fence_store/: completed idempotency keys kept in memory, so that a replay (or a
// 422 for another request under the same key) needs no store round trip. Bounded by entries
// and bytes; any entry may be evicted (the database still has it). Thread-safe.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "fence_store/store.h"

namespace fencegate::store::detail {

class ReplayCache {
 public:
  // Keeps `r` if it is completed (others are not replayable).
  void put(const KeyRecord& r) {
    if (r.state != KeyState::completed) return;
    auto p = std::make_shared<const KeyRecord>(r);
    std::lock_guard lk(mu_);
    auto& slot = map_[key_of(r.resource, r.scope, r.key)];
    if (slot) bytes_ -= slot->body.size();
    slot = std::move(p);
    bytes_ += slot->body.size();
    while ((map_.size() > kEntries || bytes_ > kBytes) && !map_.empty()) {
      auto victim = map_.begin();
      bytes_ -= victim->second->body.size();
      map_.erase(victim);
    }
  }
  // The completed key, or nullptr.
  std::shared_ptr<const KeyRecord> get(const std::string& resource, const std::string& scope,
                                       const std::string& key) const {
    std::lock_guard lk(mu_);
    auto it = map_.find(key_of(resource, scope, key));
    return it == map_.end() ? nullptr : it->second;
  }
  void drop(const std::string& resource, const std::string& scope, const std::string& key) {
    std::lock_guard lk(mu_);
    auto it = map_.find(key_of(resource, scope, key));
    if (it == map_.end()) return;
    bytes_ -= it->second->body.size();
    map_.erase(it);
  }
  void clear() {
    std::lock_guard lk(mu_);
    map_.clear();
    bytes_ = 0;
  }

 private:
  // At most kEntries keys, whose bodies are at most 16 MiB each by config and kBytes together.
  static constexpr std::size_t kEntries = 10000;
  static constexpr std::size_t kBytes = 64u << 20;
  static std::string key_of(const std::string& resource, const std::string& scope, const std::string& key) {
    std::string k;
    k.reserve(resource.size() + scope.size() + key.size() + 2);
    k.append(resource).append(1, '\0').append(scope).append(1, '\0').append(key);
    return k;
  }

  mutable std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<const KeyRecord>> map_;  // guarded by mu_
  std::size_t bytes_ = 0;                                                  // guarded by mu_
};

}  // namespace fencegate::store::detail
