#!/usr/bin/env bash
# Start time of two broker binaries on the same data directory, alternately
# (A B A B ...), run on purpose (not CI). Each start: the broker opens DIR,
# its "broker ready start_ms" is read from its log, then (after WAIT_S
# seconds, default 5, for background work after a start) it is stopped with
# SIGTERM, a clean shutdown, so that every start finds the same state. Also
# reported, when the log has them: each shard's "live entries per segment
# counted" (the background count after open: until it ends no garbage
# collection or compaction runs) and "entry log opened" elapsed_ms.
# The binaries must read the same on-disk format. SHARDS (default 2) must be
# what DIR was written with; BROKER_ARGS adds flags to every start.
#
#   bench/scripts/restart_ab.sh DIR ROUNDS BROKER_A BROKER_B
#
# Make DIR with bench/scripts/scale.sh --keep (its data is under DIR/data:
# pass that).
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=$1; ROUNDS=$2; A=$3; B=$4
[ -d "$DIR" ] || { echo "no data directory $DIR" >&2; exit 2; }
SHARDS=${SHARDS:-2}
OUT=$(mktemp -d "${TMPDIR:-/tmp}/restart-ab.XXXXXX")
source bench/scripts/broker_lib.sh
trap 'stop_broker KILL' EXIT
field() { # log, line text, field
  sed 's/\x1b\[[0-9;]*m//g' "$1" | grep "$2" | sed -n "s/.*$3=\([0-9]*\).*/\1/p" | tr '\n' ' '
}
for r in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    M=$A; [ $side = B ] && M=$B
    log=$OUT/$side-$r
    # shellcheck disable=SC2086 # BROKER_ARGS is a list of flags
    BROKER_WAIT_S=900 start_broker "$log" --data-dir "$DIR" --shards "$SHARDS" --no-pin --disk-refuse-pct 100 ${BROKER_ARGS:-}
    sleep "${WAIT_S:-5}"
    stop_broker TERM
    echo "$side round $r: start_ms $(field "$log.err" 'broker ready' start_ms)" \
      "| log opened elapsed_ms $(field "$log.err" "entry log opened" elapsed_ms)" \
      "| live counted elapsed_ms $(field "$log.err" 'live entries per segment counted' elapsed_ms)"
  done
done
echo "logs: $OUT"
