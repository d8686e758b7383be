#!/usr/bin/env bash
# The unbatched shapes (one message at a time; 16 producers, one in flight
# each) against a one-partition topic placed on each broker shard in turn
# (`--topic-shard`), repeated: on a VM whose disk interrupt goes to one CPU
# the shard pinned there does better (bench/RESULTS.md, "Which shard owns
# the topic decides the unbatched targets"). Rounds alternate the shards, so a
# noisy minute hits both.
#
# Usage: bench/scripts/by_shard.sh [RUNS_PER_SHARD] [extra magnetar-bench flags...]
# Prints one line per run, then the median per (shape, shard).
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${1:-5}; shift || true
cargo build --release -p magnetar -p magnetar-bench >&2
B=$PWD/target/release/magnetar-bench
SHARDS=$(nproc)
OUT=$(mktemp -d "${TMPDIR:-/tmp}/by_shard.XXXXXX")
for i in $(seq 1 "$RUNS"); do
  for s in $(seq 0 $((SHARDS - 1))); do
    for p in 1 16; do
      "$B" --no-history -q --duration-s 4 --warmup-s 1 --producers "$p" --partitions 1 --topic-shard "$s" \
        --batch-max-messages 0 --max-pending 1 --json "$OUT/p$p-s$s-$i.json" "$@" >/dev/null
    done
  done
done
python3 - "$OUT" <<'PY'
import collections, glob, json, os, statistics, sys
out = sys.argv[1]
by = collections.defaultdict(list)
for f in sorted(glob.glob(os.path.join(out, "*.json"))):
    j = json.load(open(f))
    shard = (j.get("topic_shards") or ["?"])[0]
    shape = "one at a time" if os.path.basename(f).startswith("p1-") else "16 producers"
    row = (j["publish_latency_ms"]["p50"], j["produce"]["msgs_per_s"], j["cpu"]["broker_us_per_msg"])
    by[(shape, str(shard))].append(row)
    print(f"{shape:14s} shard {shard}: publish p50 {row[0]:.3f} ms, {row[1]:,.0f} msg/s, broker {row[2]:.1f} us/msg")
for (shape, shard), rows in sorted(by.items()):
    med = [statistics.median(r[k] for r in rows) for k in range(3)]
    print(f"median {shape:14s} shard {shard} ({len(rows)} runs): publish p50 {med[0]:.3f} ms, "
          f"{med[1]:,.0f} msg/s, broker {med[2]:.1f} us/msg")
print(f"results: {out}")
PY
