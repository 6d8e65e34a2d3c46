// An index of objects by their `name` member, for a set that only grows (the fence's resources
// are never erased; proxy/fence.cpp). Open addressing with linear probing: each slot holds the
// name's hash and a pointer, and the table is at most half full. A lookup usually reads one slot
// and the object it points at, where a node-based hash map reads a bucket, the node before the
// bucket's first and that node: with 100,000 resources written to at random, each of those reads
// is a cache miss on the data path (issue 29, bench/RESULTS.md). Not thread-safe: the owner locks.
#pragma once

#include <cstddef>
#include <functional>
#include <string_view>
#include <vector>

namespace fencegate::proxy {

template <class T>
class NameIndex {
 public:
  T* find(std::string_view name) const {
    if (slots_.empty()) return nullptr;
    const std::size_t h = hash_of(name);
    for (std::size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (!s.item) return nullptr;
      if (s.hash == h && s.item->name == name) return s.item;
    }
  }
  // `item` (not null) must not be indexed yet: callers find() its name first.
  void insert(T* item) {
    if ((size_ + 1) * 2 > slots_.size()) grow();
    place(item, hash_of(item->name));
    ++size_;
  }
  std::size_t size() const { return size_; }

 private:
  struct Slot {
    std::size_t hash = 0;
    T* item = nullptr;
  };
  static std::size_t hash_of(std::string_view s) { return std::hash<std::string_view>{}(s); }
  void place(T* item, std::size_t h) {
    std::size_t i = h & mask_;
    while (slots_[i].item) i = (i + 1) & mask_;
    slots_[i] = Slot{h, item};
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.empty() ? 16 : old.size() * 2, Slot{});
    mask_ = slots_.size() - 1;
    for (const Slot& s : old)
      if (s.item) place(s.item, s.hash);
  }

  std::vector<Slot> slots_;  // a power of two in size, or empty
  std::size_t mask_ = 0;
  std::size_t size_ = 0;
};

}  // namespace fencegate::proxy
