#!/usr/bin/env bash
# Produce throughput with the default ledgers (50,000 entries) side by side
# with small ledgers that roll over every 1,000 and every 100 entries, in
# the same run, alternating, ROUNDS times (default 3): what a ledger
# rollover costs the produce path. Each run: a fresh 1-shard broker, 200,000
# × 1 KiB messages, 1,000 in flight.
#
#   cargo build --release -p magnetar && bench/scripts/rollover_vs_default.sh [ROUNDS] [DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-3}
BASE=${2:-$PWD/target/rollover-bench}
M=$PWD/target/release/magnetar
source bench/scripts/broker_lib.sh
trap 'stop_broker KILL' EXIT
run() { # label extra-args...
  local label=$1; shift
  local d=$BASE/$label; rm -rf "$d"; mkdir -p "$d"
  start_broker "$d/broker" --data-dir "$d/data" --shards 1 --no-pin --disk-refuse-pct 100 "$@"
  local line; line=$("$M" produce bench-t --count 200000 --size 1024 --max-pending 1000 --url "$BROKER_ADDR" 2>&1 | grep "msg/s" | tail -1)
  echo "$label: $(grep -c 'ledger rolled over' "$d/broker.err" || true) rollovers; ${line%%, last id*}"
  stop_broker
  rm -rf "$d"
}
for _ in $(seq "$ROUNDS"); do
  run default
  run ledger1000 --ledger-max-entries 1000 --ledger-min-rollover-s 0
  run ledger100 --ledger-max-entries 100 --ledger-min-rollover-s 0
done
