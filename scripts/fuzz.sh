#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/<target>_fuzz.cpp) with clang in build-fuzz/ and runs
# each for a bounded time on a temporary copy of its seed corpus (tests/fuzz/corpus/<target>/).
#   scripts/fuzz.sh [seconds-per-target]     default 60
#   FUZZ_TARGETS="token head" scripts/fuzz.sh 10      a subset
#   FUZZ_JOBS=1 scripts/fuzz.sh                       one target at a time (default: one per core)
# A crash, sanitizer report, broken invariant, timeout or OOM fails the run (exit 1); the input is
# saved as tests/fuzz/crashes/<target>/crash-<sha1> (or timeout-/oom-/leak-...). Reproduce with
#   build-fuzz/tests/fuzz/<target>_fuzz tests/fuzz/crashes/<target>/<file>
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

seconds="${1:-60}"
case "$seconds" in
  '' | *[!0-9]*) echo "usage: scripts/fuzz.sh [seconds-per-target]" >&2; exit 2 ;;
esac
targets=(${FUZZ_TARGETS:-token head body router config time idempotency_key})

./scripts/setup.sh

# A separate build directory: clang, every library instrumented (see tests/fuzz/CMakeLists.txt),
# no test suites; only the fuzz targets are built (not the Boost/Beast fencegate executable).
# clang 16, not bookworm's default clang 14: the product uses C++20 lambda captures of structured
# bindings (config/config_file.cpp), which clang supports from 16 on.
# -O1 -gline-tables-only: the usual fuzzing build (quick to compile, file:line in reports).
CC=clang-16 CXX=clang++-16 cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_COMPILER=clang++-16 -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
  -DFENCEGATE_FUZZ=ON -DFENCEGATE_TESTS=OFF >/dev/null
cmake --build build-fuzz --target "${targets[@]/%/_fuzz}"

work=$(mktemp -d "${TMPDIR:-/tmp}/fencegate-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}"
if [ -x /usr/lib/llvm-16/bin/llvm-symbolizer ]; then
  export ASAN_SYMBOLIZER_PATH="${ASAN_SYMBOLIZER_PATH:-/usr/lib/llvm-16/bin/llvm-symbolizer}"
fi
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

# Targets run FUZZ_JOBS at a time (default: one per core), each on its own copy of its corpus.
jobs_max="${FUZZ_JOBS:-$(nproc)}"
run_target() {
  local t=$1 crashes="$root/tests/fuzz/crashes/$1"
  mkdir -p "$crashes" "$work/$t"
  cp -R "tests/fuzz/corpus/$t/." "$work/$t/"
  local args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
              -artifact_prefix="$crashes/")
  [ -f "tests/fuzz/$t.dict" ] && args+=(-dict="tests/fuzz/$t.dict")
  local rc=0
  "build-fuzz/tests/fuzz/${t}_fuzz" "${args[@]}" "$work/$t" >"$work/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$work/$t.rc"
}
echo "== fuzz ${targets[*]}: ${seconds}s each, $jobs_max at a time"
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
  run_target "$t" &
done
wait

failed=()
for t in "${targets[@]}"; do
  bin="build-fuzz/tests/fuzz/${t}_fuzz"
  log="$work/$t.log"
  rc=$(cat "$work/$t.rc" 2>/dev/null || echo 1)
  echo "== fuzz $t"
  if [ "$rc" = 0 ]; then
    grep -E '^stat::number_of_executed_units|^stat::new_units_added' "$log" | sed 's/^/   /' || true
    grep -E '^#[0-9]+ +DONE' "$log" | tail -1 | sed 's/^/   /' || true
  else
    # From the first report line (broken invariant, sanitizer, uncaught exception) on.
    first=$(grep -n -m 1 -E '^==== fuzz invariant|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|^terminate called' \
      "$log" | cut -d: -f1 || true)
    if [ -n "$first" ]; then tail -n "+$first" "$log" | head -n 150; else tail -n 60 "$log"; fi
    saved=$(sed -n 's/.*Test unit written to //p' "$log" | tail -n 1)
    if [ -n "$saved" ]; then
      saved=${saved#"$root/"}
      echo "!! fuzz $t FAILED (exit $rc); input saved as $saved"
      echo "!! reproduce: $bin $saved"
    else
      echo "!! fuzz $t FAILED (exit $rc); no input was saved (see the log above)"
    fi
    failed+=("$t")
  fi
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "== fuzz FAILED: ${failed[*]}"
  exit 1
fi
echo "== fuzz passed: ${targets[*]} (${seconds}s each)"
