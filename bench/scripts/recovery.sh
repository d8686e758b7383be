#!/usr/bin/env bash
# Broker restart time (issue #3: "recovery time after kill -9 with 1 GiB of
# data"; "restart time is reported in the log and grows with the unflushed
# tail, not with total data").
#
# One broker (SHARDS shards, default 2), one data directory, unbounded
# retention on public/default, 64 KiB messages on 4 topics in parallel:
#   1. fill GIB GiB (default 1), kill -9 at once, restart   -> kill9-1x
#   2. SIGTERM (clean shutdown), restart                     -> clean-1x
#   3. fill GIB GiB more (2x in all), kill -9 at once, restart -> kill9-2x
#   4. SIGTERM, restart                                      -> clean-2x
#   5. kill -9 while idle (nothing written since the clean start), restart
#                                                            -> kill9-2x-idle
#   6. fill GIB GiB more (3x), wait 35 s (a checkpoint passes), kill -9,
#      restart                                              -> kill9-3x-ckpt
# Per restart: the broker's "broker ready start_ms" (whole start: every
# shard's recovery, then the mesh and the listener) and each shard's
# "recovered entry log" line (clean, scanned_bytes = the tail scanned since
# the last checkpoint, entries_replayed, elapsed_ms). Checkpoints are taken
# every 30 s, so a kill -9 right after a fill leaves up to 30 s of writes
# to scan whatever the total.
#
#   cargo build --release -p magnetar && bench/scripts/recovery.sh [GIB] [DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
GIB=${1:-1}
BASE=${2:-$PWD/target/recovery-bench}
SHARDS=${SHARDS:-2}
M=$PWD/target/release/magnetar
D=$BASE/data
rm -rf "$BASE"; mkdir -p "$BASE"
source bench/scripts/broker_lib.sh
trap 'stop_broker KILL; rm -rf "$BASE"' EXIT

start() { # label
  BROKER_WAIT_S=600 start_broker "$BASE/$1" --data-dir "$D" --shards "$SHARDS" --no-pin --disk-refuse-pct 100 || exit 1
  PID=$BROKER_PID ADDR=$BROKER_ADDR
}
report() { # label
  local log; log=$(sed 's/\x1b\[[0-9;]*m//g' "$BASE/$1.err")
  local ready; ready=$(grep "broker ready" <<<"$log" | sed -n 's/.*start_ms=\([0-9]*\).*/\1/p')
  printf '%-14s data %6s MiB  start %6s ms |' "$1" "$(( $(du -sm "$D" | cut -f1) ))" "$ready"
  grep "recovered entry log" <<<"$log" | while read -r l; do
    local f; f() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$l"; }
    printf ' shard %s: clean=%s scanned %s MiB, %s entries, %s ms |' "$(f shard)" "$(f clean)" \
      "$(( $(f scanned_bytes) / 1048576 ))" "$(f entries_replayed)" "$(f elapsed_ms)"
  done
  echo
}
fill() {
  local per=$(( GIB * 1024 * 1024 / 64 / 4 )) i
  for i in 0 1 2 3; do
    "$M" produce "recovery-$i" --count "$per" --size 65536 --max-pending 64 --url "$ADDR" > /dev/null 2>&1 &
  done
  wait $(jobs -p | grep -v "^$PID\$") 2>/dev/null || true
}
kill9() { stop_broker KILL; }
term() { stop_broker TERM; }

start fresh
"$M" admin --url "$ADDR" namespaces set-retention public/default --minutes -1 --size-mb -1
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg) (shared: figures are indicative)"
fill; kill9; start kill9-1x; report kill9-1x
term; start clean-1x; report clean-1x
fill; kill9; start kill9-2x; report kill9-2x
term; start clean-2x; report clean-2x
kill9; start kill9-2x-idle; report kill9-2x-idle
fill; sleep 35; kill9; start kill9-3x-ckpt; report kill9-3x-ckpt
term
