#!/usr/bin/env bash
# Builds fencegate and runs `fencegate serve` on its embedded default (flag-only form: one route
# "/" -> a ledger upstream, resource "default", mode enforce), then walks through the failure the
# product exists for: an old leader's delayed write after a new leader took over. Cleans up.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build --target fencegate

work=$(mktemp -d /tmp/fencegate-demo.XXXXXX)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
up_port=$(free_port); fg_port=$(free_port)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

python3 examples/ledger_upstream.py "$up_port" & pids+=($!)
for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$up_port/ledger" && break; sleep 0.05; done
./build/fencegate serve --listen "127.0.0.1:$fg_port" --upstream "http://127.0.0.1:$up_port" \
  --db "$work/fence.db" 2>"$work/fencegate.log" & pids+=($!)
for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$fg_port/ledger" && break; sleep 0.05; done

say() { printf '\n\033[1m%s\033[0m\n' "$*"; }
charge() { # leader token customer
  local code
  code=$(curl -s -o "$work/body" -w '%{http_code}' -X POST -H "Fencing-Token: $2" -H "Fencing-Leader: $1" \
    --data "charge $3" "http://127.0.0.1:$fg_port/charges/$3")
  printf '  %-9s token %-3s POST /charges/%-6s -> %s  %s\n' "$1" "$2" "$3" "$code" "$(tr -d '\n' <"$work/body" | cut -c1-110)"
}

say "1. worker-a is elected with generation 40 and charges alice."
charge worker-a 40 alice
say "2. worker-a pauses (GC, VM suspend) past its lease; worker-b is elected with 41 and charges bob."
charge worker-b 41 bob
say "3. worker-a wakes up, still believing it leads, and retries alice: the fence rejects it."
charge worker-a 40 alice
say "4. A writer without a token is refused too (428); worker-b keeps working (41 == current)."
curl -s -o /dev/null -w '  no token          POST /charges/carol  -> %{http_code}\n' -X POST --data x "http://127.0.0.1:$fg_port/charges/carol"
charge worker-b 41 carol
say "5. The ledger: each customer charged exactly once; the stale retry never arrived."
curl -s "http://127.0.0.1:$fg_port/ledger" | python3 -m json.tool
say "6. The durable audit log of refused writes (SQLite, read while the sidecar runs):"
sqlite3 -header -column "$work/fence.db" \
  "SELECT decision, resource, presented_generation AS presented, current_generation AS current, method, target, leader FROM audit ORDER BY id"
say "Done: the stale write never reached the ledger."
