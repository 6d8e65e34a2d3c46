#!/usr/bin/env bash
# Builds fencegate and runs every test suite (unit and integration; the integration tests start
# their own upstreams and proxies on 127.0.0.1 with ephemeral ports).
#   scripts/test.sh              normal build in build/
#   scripts/test.sh --sanitize   ASan+UBSan build in build-asan/: the unit and integration tests,
#                                the hostile-input corpus and the history checker; CI runs this
#   scripts/test.sh --sanitize-all  ASan+UBSan, every suite (election, fault schedules too)
#   scripts/test.sh --tsan       TSan build in build-tsan/: the unit tests and the integration
#                                tests (the real binary under TSan); CI runs this
#   scripts/test.sh --tsan-all   TSan build of everything, every suite (election, fault too)
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh

build=build
type=RelWithDebInfo
sanitize=""
targets=""
tests=""
# ctest entries (suites and their shards, see tests/CMakeLists.txt) run this many at a time: they
# mostly wait on the real binary, so three on two cores take less than half the serial time.
jobs="${FENCEGATE_TEST_JOBS:-3}"
case "${1:-}" in
  --sanitize) build=build-asan; type=Debug; sanitize="address,undefined"
    targets="--target fencegate test_proxy test_fence_store test_config test_integration test_fault"
    tests="-R ^(proxy|fence_store|config|integration.*|fault_hostile)$" ;;
  --sanitize-all) build=build-asan; type=Debug; sanitize="address,undefined" ;;
  --tsan) build=build-tsan; type=Debug; sanitize="thread"
    targets="--target fencegate test_proxy test_fence_store test_config test_integration"
    tests="-R ^(proxy|fence_store|config|integration.*)$" ;;
  --tsan-all) build=build-tsan; type=Debug; sanitize="thread" ;;
  "") ;;
  *) echo "usage: scripts/test.sh [--sanitize|--sanitize-all|--tsan|--tsan-all]" >&2; exit 2 ;;
esac

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="$type" -DFENCEGATE_SANITIZE="$sanitize" >/dev/null
cmake --build "$build" $targets

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1}"
ctest --test-dir "$build" --output-on-failure -j "$jobs" $tests
