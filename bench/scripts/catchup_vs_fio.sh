#!/usr/bin/env bash
# Catch-up read throughput of a ~1 GiB backlog that is not in memory, as a
# ratio of fio's sequential O_DIRECT read, on one disk in one run (issue #3):
#  1. fio --rw=read --direct=1 (one request at a time, psync) at 1 MiB and
#     64 KiB blocks over a 1 GiB file in the run directory;
#  2. the entry log's catchup example: 1 GiB of 1 KiB entries (1,048,576)
#     and of 64 KiB entries (16,384) written to one ledger, log closed and
#     reopened (write cache empty), every entry read in order, timed.
# Ratios use payload bytes for the log (record headers, 48 B per entry, are
# read but not counted) and file bytes for fio.
#
# Usage: bench/scripts/catchup_vs_fio.sh [DIR_ON_DISK]
# Needs fio (apt-get install fio). About 15 s a round; needs ~2.5 GiB free.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-$PWD/target/bench-disk}
command -v fio >/dev/null || { echo "fio is not installed: apt-get install fio" >&2; exit 2; }
cargo build --release -p magnetar-storage --example catchup >&2
EX=$PWD/target/release/examples
mkdir -p "$DIR"
WORK=$(mktemp -d "$DIR/run.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# The disk is shared (other processes' I/O moves single figures by 2x), so
# ROUNDS rounds (default 3) each measure fio and the log back to back, the
# ratio is taken within a round, and the median ratio is printed at the end.
ROUNDS=${ROUNDS:-3}
source bench/scripts/fio_lib.sh
declare -A RATIOS
for round in $(seq 1 "$ROUNDS"); do
  echo "round $round:"
  declare -A FIO
  fio_read_limits "$WORK" 1g 1m 64k
  for spec in "1048576 1024" "16384 65536"; do
    set -- $spec
    OUT=$("$EX/catchup" "$1" "$2" "$WORK/c-$2")
    echo "$OUT" | sed 's/^/  /'
    MBPS=$(echo "$OUT" | sed -n 's/.*read .* \([0-9.]*\) MB\/s;.*/\1/p')
    for bs in 1m 64k; do
      R=$(python3 -c "print('%.2f' % ($MBPS / ${FIO[$bs]}))")
      echo "    entry size $2: catch-up read / fio read bs=$bs: $R"
      RATIOS[$2-$bs]="${RATIOS[$2-$bs]:-} $R"
    done
    rm -rf "$WORK/c-$2"
  done
done
echo "median over $ROUNDS rounds:"
for key in 1024-1m 1024-64k 65536-1m 65536-64k; do
  python3 -c "import statistics,sys; v=[float(x) for x in sys.argv[2:]]; print('  entry size %s / fio bs=%s: %.2f  (rounds: %s)' % (*sys.argv[1].split('-'), statistics.median(v), ' '.join(sys.argv[2:])))" "$key" ${RATIOS[$key]}
done
