#!/usr/bin/env bash
# The demo's second failure (issue 30): a billing job that restored an old checkpoint. It runs
# under `fencegate elect` (its fencing token in FENCING_TOKEN) and charges every customer its
# checkpoint says is still due -- which, the checkpoint being old, includes customers the previous
# leader already charged. Each charge carries an operation ID, "charge:<customer>:<period>", in
# the Idempotency-Key header, so fencegate replays the earlier result instead of charging twice.
#   billing_rerun.sh LEDGER_URL STATE_DIR PERIOD customer...
set -u
ledger=$1 state=$2 period=$3
shift 3
echo "$FENCING_TOKEN" >"$state/$FENCING_LEADER_ID.token"
for c in "$@"; do
  code=$(curl -s -o /dev/null -D "$state/$FENCING_LEADER_ID.$c.head" -w '%{http_code}' -X POST \
    -H "Fencing-Token: $FENCING_TOKEN" -H "Fencing-Leader: $FENCING_LEADER_ID" \
    -H "Idempotency-Key: \"charge:$c:$period\"" --data "charge $c $period" "$ledger/charges/$c?period=$period")
  replayed=""
  grep -qi '^Idempotent-Replayed: true' "$state/$FENCING_LEADER_ID.$c.head" && replayed=" (replayed)"
  echo "$c $code$replayed" >>"$state/$FENCING_LEADER_ID.log"
done
echo done >>"$state/$FENCING_LEADER_ID.log"
sleep 300  # a leader holds its lease until the job ends; the demo stops it
