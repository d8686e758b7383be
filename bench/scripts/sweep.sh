#!/usr/bin/env bash
# The issue #6 table: how throughput and latency change with partitions,
# producers (one unbatched message in flight each), message size and 10,000
# topics, plus a backlog catch-up. Each point is one magnetar-bench run
# against a fresh self-started broker; prints a markdown table (JSON kept in
# the out dir).
#
# The partition, size and backlog points use the canonical workload's
# producer batching (Pulsar's client defaults: 1,000 messages, 128 KiB,
# 1 ms); the producer points are unbatched (`--batch-max-messages 0
# --max-pending 1`), one message in flight per producer; the 10,000-topic
# point is unbatched at a fixed 10,000 msg/s over 16 + 16 shared client
# connections (a connection takes at most 1,024 producers and 1,024
# consumers; 10,000 producers, 10,000 subscriptions). Setting up 10,000
# topics takes minutes. Extra flags go to every point.
#
# Usage: bench/scripts/sweep.sh [DURATION_S] [extra magnetar-bench flags...]
# POINTS="partitions producers sizes topics backlog" selects groups.
set -euo pipefail
cd "$(dirname "$0")/../.."
D=${1:-10}; shift || true
cargo build --release -p magnetar -p magnetar-bench >&2
B=$PWD/target/release/magnetar-bench
OUT=$(mktemp -d "$PWD/target/sweep.XXXXXX")
POINTS=${POINTS:-partitions producers sizes topics backlog}
point() { # name, flags...
  local name=$1; shift
  echo "point $name: $*" >&2
  "$B" --no-history -q --duration-s "$D" --warmup-s 1 --json "$OUT/$name.json" "$@" "${EXTRA[@]}" >/dev/null
}
EXTRA=("$@")
want() { [[ " $POINTS " == *" $1 "* ]]; }
if want partitions; then for p in 1 4 16 64; do point "partitions-$p" --partitions "$p"; done; fi
if want producers; then
  for n in 1 4 16; do point "producers-$n-one-in-flight" --partitions 1 --producers "$n" --max-pending 1 --batch-max-messages 0; done
fi
if want sizes; then for s in 100 1024 16384; do point "size-$s" --size "$s"; done; fi
if want topics; then
  point "topics-10000" --topics 10000 --partitions 1 --batch-max-messages 0 --rate 10000 --connections 16 --max-pending 10
fi
if want backlog; then point "backlog-200k" --backlog-messages 200000; fi
python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
print("| point | batching | produce msg/s | MB/s | consume msg/s | publish p50 / p99 / p99.9 ms | e2e p99 ms | broker CPU us/msg | client CPU us/msg |")
print("|---|---|---|---|---|---|---|---|---|")
for name in sorted(os.listdir(out), key=lambda n: os.path.getmtime(os.path.join(out, n))):
    j = json.load(open(os.path.join(out, name)))
    p, e, c = j["publish_latency_ms"], j["e2e_latency_ms"], j["cpu"]
    batching = "off" if j["batching"].startswith("off") else "on"
    print(f"| {name[:-5]} | {batching} | {j['produce']['msgs_per_s']:,.0f} | {j['produce']['mb_per_s']:.1f} | {j['consume']['msgs_per_s']:,.0f} | "
          f"{p['p50']:.2f} / {p['p99']:.2f} / {p['p999']:.2f} | {e['p99']:.2f} | {c['broker_us_per_msg'] or 0:.2f} | {c['client_us_per_msg']:.2f} |")
print(f"\nJSON: {out}")
PY
