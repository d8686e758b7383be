#!/usr/bin/env bash
# Storage-level benchmarks for issue #3, side by side on one disk in one run:
#  1. fio O_DIRECT sequential write with fdatasync after each write, at the
#     sizes of the log's group-commit batches (1 MiB and 4 MiB), then the
#     entry log's append example (group commit, fdatasync per batch) at
#     1 KiB and 64 KiB entries; prints each as a ratio of fio.
#  2. Recovery time after an abort (what kill -9 leaves: no checkpoint, no
#     clean-shutdown marker) with ~1 GiB of data, and a clean reopen.
#
# Usage: bench/scripts/append_vs_fio.sh [DIR_ON_DISK]
# Needs fio (apt-get install fio). Takes a few minutes; writes ~1.5 GiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-$PWD/target/bench-disk}
command -v fio >/dev/null || { echo "fio is not installed: apt-get install fio" >&2; exit 2; }
cargo build --release -p magnetar-storage --example append --example recover >&2
EX=$PWD/target/release/examples
mkdir -p "$DIR"
WORK=$(mktemp -d "$DIR/run.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

source bench/scripts/fio_lib.sh
declare -A FIO
fio_write_limits "$WORK" 512m 1m 4m

for spec in "200000 1024 256" "8192 65536 64"; do
  set -- $spec
  OUT=$("$EX/append" "$1" "$2" "$3" "$WORK/a-$2")
  echo "$OUT"
  MBPS=$(echo "$OUT" | sed -n 's/.* \([0-9.]*\) MB\/s.*/\1/p')
  for bs in 1m 4m; do
    python3 -c "print('  entry size $2: ratio to fio bs=$bs: %.2f' % ($MBPS / ${FIO[$bs]% *}))"
  done
  rm -rf "$WORK/a-$2"
done

# ~1 GiB: 16384 x 64 KiB, then abort; recovery scans everything after the
# last checkpoint (none here: the default interval is 30 s).
MAGNETAR_APPEND_ABORT=1 "$EX/append" 16384 65536 64 "$WORK/r" 2>/dev/null || true
sync
"$EX/recover" "$WORK/r"
