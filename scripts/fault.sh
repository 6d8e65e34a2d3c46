#!/usr/bin/env bash
# Seeded fault schedules against the real binary, checked by the history checker
# (tests/fault/README.md). Builds in build-fault/ and runs the "fault schedules" test cases.
#   scripts/fault.sh                  quick profile: what CI runs (ctest "fault_schedules"), ~1 minute
#   scripts/fault.sh --long [N]       long profile: N schedules (default 2000, about 2.5 s each);
#                                     writes the summary to tests/fault/LAST_LONG_RUN.md
#   scripts/fault.sh --seed S         replay one schedule (the seed a failure printed)
# FG_FAULT_BASE_SEED=S fixes the first seed of a run (default: random, printed).
# Exit status: 0 iff no schedule violated the contract.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

mode=quick
count=""
case "${1:-}" in
  --long) mode=long; count="${2:-2000}" ;;
  --seed) mode=seed; [ -n "${2:-}" ] || { echo "usage: scripts/fault.sh --seed S" >&2; exit 2; }; export FG_FAULT_SEED="$2" ;;
  "") ;;
  *) echo "usage: scripts/fault.sh [--long [N] | --seed S]" >&2; exit 2 ;;
esac
case "$count" in *[!0-9]*) echo "usage: scripts/fault.sh --long [N]" >&2; exit 2 ;; esac

./scripts/setup.sh
commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!tests/fault/LAST_LONG_RUN.md' || echo "+local changes")

cmake -S . -B build-fault -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fault --target test_fault fencegate -j "${FAULT_BUILD_JOBS:-2}"

bin=build-fault/tests/test_fault
if [ "$mode" != long ]; then
  exec "$bin" -tc='fault schedules*'
fi

export FG_FAULT_SCHEDULES="$count"
summary=$(mktemp "${TMPDIR:-/tmp}/fencegate-fault.XXXXXX.md")
log=build-fault/fault-long.log
trap 'rm -f "$summary"' EXIT
export FG_FAULT_SUMMARY="$summary"
echo "== fault schedules, long profile: $count schedules (log: $log)"
rc=0
"$bin" -tc='fault schedules: seeded*' >"$log" 2>&1 || rc=$?
grep -E 'MESSAGE: fault schedules' "$log" | sed 's/^.*MESSAGE: /   /' || true
out=tests/fault/LAST_LONG_RUN.md
{
  cat "$summary"
  echo
  echo "Run: \`scripts/fault.sh --long $count\` on $(date -u +%Y-%m-%d) at commit $commit (built at start)," \
       "$(nproc) CPU(s), exit status $rc."
} >"$out"
echo "== summary: $out"
[ "$rc" -eq 0 ] || { echo "failures: see $log (each failing schedule prints its seed and trace)"; }
exit "$rc"
