#!/usr/bin/env bash
# What the topic record costs as ledgers pile up (issue #3 follow-up): each
# rollover rewrites the topic's whole ledger list (48 B a ledger) into the
# log, so without retention the bytes written grow with the square of the
# ledger count. Same data, side by side: COUNT (default 20,000) × SIZE
# (default 100) B messages, unbounded retention, with the default ledgers
# (no rollover) and with ledgers of 1,000 / 100 / 10 entries
# (--ledger-min-rollover-s 0). Reports the broker's bytes written to disk
# (/proc/PID/io write_bytes, so group-commit padding and checkpoints are in)
# and the predicted topic-record bytes, sum over rollovers of 5 + 48·n.
#
#   cargo build --release -p magnetar && bench/scripts/topic_record_growth.sh [COUNT] [SIZE]
set -euo pipefail
cd "$(dirname "$0")/../.."
COUNT=${1:-20000}
SIZE=${2:-100}
BASE=$PWD/target/record-growth
M=$PWD/target/release/magnetar
source bench/scripts/broker_lib.sh
trap 'stop_broker KILL; rm -rf "$BASE"' EXIT
run() { # label extra-args...
  local label=$1; shift
  local d=$BASE/$label; rm -rf "$d"; mkdir -p "$d"
  start_broker "$d/broker" --data-dir "$d/data" --shards 1 --no-pin --disk-refuse-pct 100 "$@"
  local pid=$BROKER_PID addr=$BROKER_ADDR
  "$M" admin --url "$addr" namespaces set-retention public/default --minutes -1 --size-mb -1
  local before; before=$(sed -n 's/^write_bytes: //p' "/proc/$pid/io")
  "$M" produce growth --count "$COUNT" --size "$SIZE" --max-pending 1000 --url "$addr" > /dev/null 2>&1
  local after; after=$(sed -n 's/^write_bytes: //p' "/proc/$pid/io")
  local rolls; rolls=$(grep -c 'ledger rolled over' "$d/broker.err" || true)
  # Rollover k (k = 1..rolls) writes a record of k+1 ledgers.
  local predicted=$(( rolls * 5 + 48 * ((rolls + 1) * (rolls + 2) / 2 - 1) ))
  printf '%-12s %6d rollovers  written %8.1f MiB  topic records %8.1f MiB  payload %6.1f MiB\n' \
    "$label" "$rolls" "$(echo "($after - $before) / 1048576" | bc -l)" "$(echo "$predicted / 1048576" | bc -l)" \
    "$(echo "$COUNT * $SIZE / 1048576" | bc -l)"
  stop_broker
  rm -rf "$d"
}
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg) (shared)"
run default
run ledger1000 --ledger-max-entries 1000 --ledger-min-rollover-s 0
run ledger100 --ledger-max-entries 100 --ledger-min-rollover-s 0
run ledger10 --ledger-max-entries 10 --ledger-min-rollover-s 0
