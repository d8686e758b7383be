#!/usr/bin/env bash
# Side-by-side, on the same disk and in one run: fio's O_DIRECT sequential write
# with an fdatasync after every write (the disk's own limit for durable appends),
# then `magnetar produce` of 1 KiB messages from one producer against a fresh
# standalone broker whose data directory is on that disk. Prints the broker's
# MB/s as a ratio of fio's at each block size.
#
# Usage: bench/scripts/produce_vs_fio.sh [DIR_ON_DISK] [COUNT] [MAX_PENDING]
# Needs fio (apt-get install fio). Takes about a minute.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-$PWD/target/bench-disk}
COUNT=${2:-200000}
PENDING=${3:-1000}
command -v fio >/dev/null || { echo "fio is not installed: apt-get install fio" >&2; exit 2; }
cargo build --release --bin magnetar >&2
M=$PWD/target/release/magnetar
mkdir -p "$DIR"
WORK=$(mktemp -d "$DIR/run.XXXXXX")
source bench/scripts/broker_lib.sh
trap 'stop_broker KILL; rm -rf "$WORK"' EXIT

source bench/scripts/fio_lib.sh
declare -A FIO
fio_write_limits "$WORK" 256m 4k 64k 1m

start_broker "$WORK/broker" --data-dir "$WORK/data"
ADDR=$BROKER_ADDR
SUMMARY=$("$M" produce persistent://public/default/bench --url "$ADDR" --count "$COUNT" --size 1024 \
  --max-pending "$PENDING" 2>&1 >/dev/null | tail -1)
echo "magnetar produce 1 KiB x $COUNT, max-pending $PENDING: $SUMMARY"
MBPS=$(echo "$SUMMARY" | sed -n 's/.* \([0-9.]*\) MB\/s.*/\1/p')
for bs in 4k 64k 1m; do
  python3 -c "print('ratio to fio bs=$bs: %.3f' % ($MBPS / ${FIO[$bs]% *}))"
done

# One message in flight at a time: publish latency against the disk's own
# 4 KiB write + fdatasync.
SUMMARY1=$("$M" produce persistent://public/default/bench-1 --url "$ADDR" --count 5000 --size 1024 \
  --max-pending 1 2>&1 >/dev/null | tail -1)
echo "magnetar produce 1 KiB x 5000, max-pending 1: $SUMMARY1"
P50=$(echo "$SUMMARY1" | sed -n 's/.*p50 \([0-9.]*\).*/\1/p')
python3 -c "print('publish p50 %.0f us vs fio 4k write+fdatasync p50 ${FIO[4k]#* } us' % ($P50*1000))"
