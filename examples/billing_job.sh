#!/usr/bin/env bash
# The daily billing job of the demo. It runs under `fencegate elect`, which gives it the fencing
# token in FENCING_TOKEN only while it leads. It charges every customer the ledger has not seen
# yet, one at a time, sending its token with every write.
#   billing_job.sh LEDGER_URL STATE_DIR customer...
set -u
ledger=$1 state=$2
shift 2
echo "$FENCING_TOKEN" >"$state/$FENCING_LEADER_ID.token"
for c in "$@"; do
  if curl -s "$ledger/ledger" | grep -q "\"/charges/$c\""; then
    continue  # someone already charged this customer
  fi
  echo "$c" >"$state/$FENCING_LEADER_ID.charging"
  sleep 1  # preparing the charge: the pause hits here
  code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Fencing-Token: $FENCING_TOKEN" \
    -H "Fencing-Leader: $FENCING_LEADER_ID" --data "charge $c" "$ledger/charges/$c")
  echo "$c $code" >>"$state/$FENCING_LEADER_ID.log"
done
echo done >>"$state/$FENCING_LEADER_ID.log"
sleep 300  # a leader holds its lease until the job ends; the demo stops it
