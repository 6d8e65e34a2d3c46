// Test seams of the fence store: only tests include this header; the product never fails its own
// commits on purpose.
//
// Thread-safety: as Store (every method is thread-safe).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "fence_store/store.h"

namespace fencegate::store {

// An owning store whose commits can be made to fail. Store::open's stores are all of this kind;
// open_testable() hands one out with the seam reachable.
class TestableStore : public Store {
 public:
  // While set, every commit fails as a real I/O error would (for fail-closed tests): the batch is
  // rolled back and its completions get an error naming the database ("... injected commit
  // failure"); fire-and-forget audit rows are kept for a later batch, as after a real failure.
  virtual void inject_commit_failure(bool on) = 0;
};

// Store::open, returning the store with its seam. nullptr and *error as Store::open.
std::unique_ptr<TestableStore> open_testable(const std::string& path, std::string* error);

// How many times a store's paced writes (a retention chunk's, issue 29) have had the kernel start
// writing their pages back, in this process so far.
std::uint64_t paced_writebacks();

}  // namespace fencegate::store
