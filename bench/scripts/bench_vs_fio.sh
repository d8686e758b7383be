#!/usr/bin/env bash
# Issue #6's measurement, side by side on one disk and in one run:
#  1. fio O_DIRECT sequential write with an fdatasync after every write
#     (bs 4k, 64k, 1m): the disk's own limit for durable appends;
#  2. magnetar-bench's canonical workload (1 topic x 4 partitions, 1 producer,
#     1 consumer, 1 KiB, durable receipts) against a broker it starts with its
#     data directory on that disk;
#  3. one message at a time (1 partition, --max-pending 1): publish p50
#     against fio's 4 KiB write+fdatasync p50 (target: + 100 us);
# and prints the broker's MB/s as a ratio of fio's (target: >= 0.9 of 1m).
#
# Usage: bench/scripts/bench_vs_fio.sh [DIR_ON_DISK] [DURATION_S] [-- extra magnetar-bench flags]
# Needs fio and python3. Results (JSON, SVG) go to DIR_ON_DISK/results-<time>/.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-$PWD/target/bench-disk}
DURATION=${2:-30}
shift $(( $# < 2 ? $# : 2 )) || true
[ "${1:-}" = "--" ] && shift
EXTRA=("$@")
command -v fio >/dev/null || { echo "fio is not installed: apt-get install fio" >&2; exit 2; }
cargo build --release -p magnetar -p magnetar-bench >&2
B=$PWD/target/release/magnetar-bench
mkdir -p "$DIR"
OUT="$DIR/results-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$OUT"
WORK=$(mktemp -d "$DIR/fio.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

source bench/scripts/fio_lib.sh
declare -A FIO
fio_write_limits "$WORK" 256m 4k 64k 1m

"$B" --data-dir "$DIR" --duration-s "$DURATION" --json "$OUT/canonical.json" --plot "$OUT/canonical.svg" -q "${EXTRA[@]}"
"$B" --data-dir "$DIR" --duration-s 10 --partitions 1 --max-pending 1 --json "$OUT/one-at-a-time.json" -q "${EXTRA[@]}"

python3 - "$OUT" "${FIO[4k]}" "${FIO[64k]}" "${FIO[1m]}" <<'PY'
import json, sys
out = sys.argv[1]
fio = {bs: tuple(map(float, v.split())) for bs, v in zip(["4k", "64k", "1m"], sys.argv[2:5])}
c = json.load(open(f"{out}/canonical.json"))
o = json.load(open(f"{out}/one-at-a-time.json"))
mb = c["produce"]["mb_per_s"]
print(f"\ncanonical: {c['produce']['msgs_per_s']:.0f} msg/s, {mb:.1f} MB/s; publish p99 {c['publish_latency_ms']['p99']:.2f} ms, "
      f"p99.9 {c['publish_latency_ms']['p999']:.2f} ms; e2e p99 {c['e2e_latency_ms']['p99']:.2f} ms")
for bs in ["4k", "64k", "1m"]:
    print(f"  ratio to fio bs={bs}: {mb / fio[bs][0]:.3f}")
p50_us = o["publish_latency_ms"]["p50"] * 1000
print(f"one at a time: publish p50 {p50_us:.0f} us, p99 {o['publish_latency_ms']['p99']*1000:.0f} us "
      f"vs fio 4k write+fdatasync p50 {fio['4k'][1]:.0f} us (target <= {fio['4k'][1] + 100:.0f} us)")
print(f"results: {out}")
PY
