#!/usr/bin/env bash
# fencegate benchmark: fencegate vs nginx vs HAProxy on loopback, in one run. See bench/README.md.
#
#   bench/run.sh                      # full run (~11-12 min, every part), prints the summary
#   bench/run.sh --write-results      # ... and makes it the newest run in bench/RESULTS.md (the
#                                     # run it replaces moves to bench/HISTORY.md)
#   BENCH_DURATION=3 BENCH_REPS=1 bench/run.sh            # quick look (~6 min; BENCH_SCALE_AUDIT_ROWS=1000000 for less)
#   bench/run.sh --parts throughput --note "after X"      # one part, labelled
#   BENCH_FENCEGATE=/path/to/fencegate bench/run.sh       # bench another binary
#
# Installs nginx-light, haproxy, wrk and linux-perf from Debian if missing (apt-get only then), builds
# build/fencegate (RelWithDebInfo, cmake + ninja) if it is missing, and benches a copy of it.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"

need=()
command -v nginx >/dev/null || need+=(nginx-light)
command -v haproxy >/dev/null || need+=(haproxy)
command -v wrk >/dev/null || need+=(wrk)
command -v python3 >/dev/null || need+=(python3)
command -v cc >/dev/null || need+=(gcc libc6-dev)
command -v perf >/dev/null || need+=(linux-perf)  # system calls per request (optional: the run goes on without)
if [ ${#need[@]} -gt 0 ]; then
  echo -n "bench: "
  "$root/scripts/apt-install.sh" "${need[@]}"
fi

fencegate="${BENCH_FENCEGATE:-$root/build/fencegate}"
if [ ! -x "$fencegate" ]; then
  if [ -n "${BENCH_FENCEGATE:-}" ]; then
    echo "bench: BENCH_FENCEGATE=$fencegate is not an executable" >&2
    exit 2
  fi
  echo "bench: building $fencegate (RelWithDebInfo)"
  "$root/scripts/setup.sh"
  cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  ninja -C "$root/build" fencegate
fi

export BENCH_COMMAND="bench/run.sh $*"
exec python3 "$here/bench.py" --fencegate "$fencegate" "$@"
