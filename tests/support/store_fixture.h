// Test fixtures for code that needs a real fence store: a fresh directory for the database and
// an open-or-fail helper. Header-only; used by the store and fence unit tests.
#pragma once

#include <doctest/doctest.h>

#include <memory>
#include <string>

#include "fence_store/store.h"
#include "fence_store/store_testing.h"
#include "tests/support/process.h"

namespace fencegate::testing {

// A fresh directory under /tmp holding fence.db, removed at the end of the test.
struct StoreDir {
  explicit StoreDir(const std::string& prefix = "fg-store-test") : tmp(prefix), dir(tmp.path()) {}
  std::string db() const { return dir + "/fence.db"; }
  TempDir tmp;
  std::string dir;
};

// Opens (owning) the store at `path`, with its test seam (store_testing.h); fails the test with the
// store's reason if it cannot.
inline std::unique_ptr<store::TestableStore> must_open(const std::string& path) {
  std::string err;
  auto s = store::open_testable(path, &err);
  INFO(err);
  REQUIRE(s != nullptr);
  return s;
}

}  // namespace fencegate::testing
