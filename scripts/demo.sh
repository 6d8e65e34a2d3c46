#!/usr/bin/env bash
# The README's first command: builds fencegate and plays the failure it exists for, live.
#
# A real etcd on loopback, a small ledger upstream, `fencegate serve` in front of it (its embedded
# default: flag-only form, one route "/" -> the ledger, resource "ledger", enforce mode), and two
# `fencegate elect` workers running the daily billing job. Worker A is elected and fences the
# ledger; A is paused (SIGSTOP) past its lease, as in a GC pause; B is elected with a higher token,
# fences the ledger and charges the rest; A resumes and its charge is rejected with 409, and its job
# is stopped when it notices it lost the lease. The audit log shows the rejected write; the ledger
# shows each customer charged exactly once.
#
# Then the design's second failure, "candidate is elected before catch-up" (issue 30): worker-b
# runs December's billing with operation IDs (Idempotency-Key "charge:<customer>:<period>") and
# dies after two charges; worker-c is elected, restores an old checkpoint and re-runs every
# customer. Fencing admits worker-c's writes (it is the leader); idempotency replays the results of
# the charges worker-b already made; the ledger shows every customer charged once for December.
# Cleans up after itself; exits 0 iff that all held.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build --target fencegate
if ! command -v etcd >/dev/null; then
  echo "demo: etcd is missing; install it with: apt-get install etcd-server (scripts/setup.sh does)" >&2
  exit 1
fi

fg=$PWD/build/fencegate
work=$(mktemp -d /tmp/fencegate-demo.XXXXXX)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
etcd_port=$(free_port); peer_port=$(free_port); up_port=$(free_port); fg_port=$(free_port); admin_port=$(free_port)
etcd_url="http://127.0.0.1:$etcd_port"; ledger="http://127.0.0.1:$fg_port"; admin="http://127.0.0.1:$admin_port"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

say() { printf '\n\033[1m%s\033[0m\n' "$*"; }
wait_for() { # seconds condition...
  local t=$1; shift
  for _ in $(seq $((t * 20))); do if "$@"; then return 0; fi; sleep 0.05; done
  echo "demo: timed out waiting for: $*" >&2; exit 1
}
generation() { curl -s "$admin/v1/resources/ledger" | python3 -c 'import json,sys; print(json.load(sys.stdin)["generation"])'; }

etcd --name demo --data-dir "$work/etcd" --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
  --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
  --initial-cluster "demo=http://127.0.0.1:$peer_port" >"$work/etcd.log" 2>&1 & pids+=($!)
python3 examples/ledger_upstream.py "$up_port" & pids+=($!)
# One route "/" -> the ledger, resource "ledger", enforce mode; operation IDs on (issue 30:
# "idempotency": {} keys writes that carry an Idempotency-Key; writes without one pass as before).
cat >"$work/fencegate.json" <<JSON
{"listen": "127.0.0.1:$fg_port", "db": "$work/fence.db", "admin": {"listen": "127.0.0.1:$admin_port"},
 "routes": [{"prefix": "/", "upstream": "http://127.0.0.1:$up_port", "resource": "ledger", "idempotency": {}}]}
JSON
"$fg" serve --config "$work/fencegate.json" 2>"$work/fencegate.log" & pids+=($!)
wait_for 20 curl -sf -o /dev/null "$etcd_url/health"
wait_for 10 curl -sf -o /dev/null "$ledger/ledger"
mkdir -p "$work/state"

worker() { # id
  "$fg" elect --etcd "$etcd_url" --election billing --id "$1" --ttl 2 --fence "$admin/v1/resources/ledger" \
    -- examples/billing_job.sh "$ledger" "$work/state" alice bob carol dave 2>"$work/$1.log" &
}

say "1. worker-a campaigns in etcd, wins, and fences the ledger before its billing job starts."
worker worker-a; a_pid=$!; pids+=($a_pid)
wait_for 20 test -s "$work/state/worker-a.token"
a_token=$(cat "$work/state/worker-a.token")
echo "   worker-a holds token $a_token; the sidecar's generation for 'ledger' is $(generation)."
say "2. worker-b campaigns too and waits in line."
worker worker-b; b_pid=$!; pids+=($b_pid)
wait_for 20 grep -qs "^alice 200" "$work/state/worker-a.log"
echo "   worker-a charged alice -> 200."
wait_for 10 grep -qs bob "$work/state/worker-a.charging"
a_job=$(pgrep -P "$a_pid" | head -n1)
kill -STOP "$a_pid"; kill -STOP -- "-$a_job" 2>/dev/null || kill -STOP "$a_job"
say "3. worker-a is about to charge bob when it pauses (SIGSTOP, like a long GC pause) past its 2 s lease."
wait_for 30 test -s "$work/state/worker-b.token"
b_token=$(cat "$work/state/worker-b.token")
echo "   etcd expired worker-a's lease; worker-b is elected with token $b_token and fenced the ledger:"
echo "   the sidecar's generation is now $(generation)."
wait_for 30 grep -qs "^done" "$work/state/worker-b.log"
sed 's/^/   worker-b charged /; s/ \([0-9]*\)$/ -> \1/' "$work/state/worker-b.log" | grep -v "charged done"
say "4. worker-a resumes, still believing it leads, and sends the charge for bob it had prepared."
kill -CONT -- "-$a_job" 2>/dev/null || kill -CONT "$a_job"; kill -CONT "$a_pid"
set +e
wait "$a_pid"; a_exit=$?
set -e
if grep -q "^bob " "$work/state/worker-a.log" 2>/dev/null; then
  echo "   worker-a's job: $(grep '^bob ' "$work/state/worker-a.log" | sed 's/ / -> /')"
else
  # elect stopped the job before its curl ran; the request it had prepared still arrives late.
  code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Fencing-Token: $a_token" -H "Fencing-Leader: worker-a" \
    --data "charge bob" "$ledger/charges/bob")
  echo "   worker-a's delayed charge for bob (token $a_token) -> $code"
fi
echo "   fencegate elect noticed the lost lease on resume, stopped worker-a's job and exited $a_exit."
say "5. The audit log of rejected writes (fencegate audit, read-only while the sidecar runs):"
"$fg" audit --db "$work/fence.db" | sed 's/^/   /'
say "6. The ledger: each customer charged exactly once."
curl -s "$ledger/ledger" | python3 -c '
import json, sys, collections
rows = json.load(sys.stdin)["ledger"]
for r in rows: print("   %-16s token %-3s by %s" % (r["target"], r["token"], r["leader"]))
counts = collections.Counter(r["target"] for r in rows)
bad = {t: n for t, n in counts.items() if n != 1}
want = {"/charges/" + c for c in ("alice", "bob", "carol", "dave")}
if bad or set(counts) != want:
    print("   NOT exactly once:", bad or sorted(want - set(counts))); sys.exit(1)'
[ "$a_exit" -eq 75 ] || { echo "demo: worker-a should have exited 75 (lost leadership), got $a_exit" >&2; exit 1; }
"$fg" audit --db "$work/fence.db" --json --decision rejected_stale | grep -q '"leader":"worker-a"' ||
  { echo "demo: the rejected write is missing from the audit log" >&2; exit 1; }

say "7. The second failure: a candidate elected before it caught up. worker-b runs December's billing,"
echo "   now with operation IDs: each charge carries Idempotency-Key \"charge:<customer>:2026-12\"."
for c in alice bob; do
  code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Fencing-Token: $b_token" -H "Fencing-Leader: worker-b" \
    -H "Idempotency-Key: \"charge:$c:2026-12\"" --data "charge $c 2026-12" "$ledger/charges/$c?period=2026-12")
  echo "   worker-b charged $c for 2026-12 -> $code"
done
echo "   worker-b checkpoints only every hour, and crashes before its next checkpoint."
kill "$b_pid"; wait "$b_pid" 2>/dev/null || true
say "8. worker-c is elected, fences the ledger, restores the hour-old checkpoint (nobody charged for"
echo "   December yet) and re-runs every customer with the same operation IDs."
"$fg" elect --etcd "$etcd_url" --election billing --id worker-c --ttl 2 --fence "$admin/v1/resources/ledger" \
  -- examples/billing_rerun.sh "$ledger" "$work/state" 2026-12 alice bob carol dave 2>"$work/worker-c.log" &
c_pid=$!; pids+=($c_pid)
wait_for 30 grep -qs "^done" "$work/state/worker-c.log"
c_token=$(cat "$work/state/worker-c.token")
echo "   worker-c holds token $c_token (the sidecar's generation is $(generation)): fencing admits its writes."
grep -v "^done" "$work/state/worker-c.log" | sed 's/^\([a-z]*\) \([0-9]*\)/   worker-c charged \1 -> \2/'
echo "   alice and bob were answered with worker-b's recorded results (Idempotent-Replayed: true),"
echo "   without reaching the ledger; carol and dave were charged."
say "9. The ledger for December: every customer charged once, whoever led."
curl -s "$ledger/ledger" | python3 -c '
import json, sys, collections
rows = [r for r in json.load(sys.stdin)["ledger"] if r["target"].endswith("?period=2026-12")]
for r in rows: print("   %-30s token %-3s by %s" % (r["target"], r["token"], r["leader"]))
counts = collections.Counter(r["target"] for r in rows)
want = {"/charges/%s?period=2026-12" % c for c in ("alice", "bob", "carol", "dave")}
bad = {t: n for t, n in counts.items() if n != 1}
if bad or set(counts) != want:
    print("   NOT exactly once:", bad or sorted(want - set(counts))); sys.exit(1)'
grep -q "^alice 200 (replayed)" "$work/state/worker-c.log" && grep -q "^bob 200 (replayed)" "$work/state/worker-c.log" ||
  { echo "demo: worker-c's re-run of alice and bob should have been replayed" >&2; exit 1; }
echo "   The operation IDs the sidecar holds (fencegate keys, read-only while it runs):"
"$fg" keys --db "$work/fence.db" | sed 's/^/   /'
say "Done: the stale leader's write never reached the ledger, and the new leader's re-run charged nobody twice."
