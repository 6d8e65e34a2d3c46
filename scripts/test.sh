#!/usr/bin/env bash
# Builds fencegate and runs every test suite (unit and integration; the integration tests start
# their own upstreams and proxies on 127.0.0.1 with ephemeral ports).
#   scripts/test.sh              normal build in build/
#   scripts/test.sh --sanitize   ASan+UBSan build in build-asan/
#   scripts/test.sh --tsan       TSan build in build-tsan/
#   scripts/test.sh --tsan-core  TSan build of the multi-threaded core only (fence, store, config
#                                unit tests): quick enough for every CI run
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh

build=build
type=RelWithDebInfo
sanitize=""
targets=""
tests=""
case "${1:-}" in
  --sanitize) build=build-asan; type=Debug; sanitize="address,undefined" ;;
  --tsan) build=build-tsan; type=Debug; sanitize="thread" ;;
  --tsan-core) build=build-tsan; type=Debug; sanitize="thread"
    targets="--target test_proxy test_fence_store test_config"; tests="-R ^(proxy|fence_store|config)$" ;;
  "") ;;
  *) echo "usage: scripts/test.sh [--sanitize|--tsan|--tsan-core]" >&2; exit 2 ;;
esac

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE="$type" -DFENCEGATE_SANITIZE="$sanitize" >/dev/null
cmake --build "$build" $targets

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
export TSAN_OPTIONS="${TSAN_OPTIONS:-halt_on_error=1}"
ctest --test-dir "$build" --output-on-failure $tests
