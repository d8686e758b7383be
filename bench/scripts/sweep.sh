#!/usr/bin/env bash
# The issue #6 table: how throughput and latency change with partitions,
# producers (one message in flight each) and message size, plus a backlog
# catch-up. Each point is one magnetar-bench run against a fresh
# self-started broker; prints a markdown table (JSON kept in the out dir).
#
# Usage: bench/scripts/sweep.sh [DURATION_S] [extra magnetar-bench flags...]
set -euo pipefail
cd "$(dirname "$0")/../.."
D=${1:-10}; shift || true
cargo build --release -p magnetar -p magnetar-bench >&2
B=$PWD/target/release/magnetar-bench
OUT=$(mktemp -d "$PWD/target/sweep.XXXXXX")
point() { # name, flags...
  local name=$1; shift
  "$B" --no-history -q --duration-s "$D" --warmup-s 1 --json "$OUT/$name.json" "$@" "${EXTRA[@]}" >/dev/null
}
EXTRA=("$@")
for p in 1 4 16 64; do point "partitions-$p" --partitions "$p"; done
for n in 1 4 16; do point "producers-$n-one-in-flight" --partitions 1 --producers "$n" --max-pending 1; done
for s in 100 1024 16384; do point "size-$s" --size "$s"; done
point "backlog-200k" --backlog-messages 200000
python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
print("| point | produce msg/s | MB/s | consume msg/s | publish p50 / p99 / p99.9 ms | e2e p99 ms | broker CPU us/msg | client CPU us/msg |")
print("|---|---|---|---|---|---|---|---|")
for name in sorted(os.listdir(out), key=lambda n: os.path.getmtime(os.path.join(out, n))):
    j = json.load(open(os.path.join(out, name)))
    p, e, c = j["publish_latency_ms"], j["e2e_latency_ms"], j["cpu"]
    print(f"| {name[:-5]} | {j['produce']['msgs_per_s']:,.0f} | {j['produce']['mb_per_s']:.1f} | {j['consume']['msgs_per_s']:,.0f} | "
          f"{p['p50']:.2f} / {p['p99']:.2f} / {p['p999']:.2f} | {e['p99']:.2f} | {c['broker_us_per_msg'] or 0:.2f} | {c['client_us_per_msg']:.2f} |")
print(f"\nJSON: {out}")
PY
