#!/usr/bin/env bash
# Side-by-side comparison of two broker binaries on a noisy machine: runs
# the same magnetar-bench workload against A and B alternately (A B A B ...),
# each against a fresh self-started broker, then prints the median of each
# figure and the B/A ratio (`magnetar-bench --compare` of the median runs).
#
# The flags go to both sides; the bench's default workload is the canonical
# one (producer batching on), so pass --batch-max-messages 0 to compare
# unbatched per-message costs.
#
# Backlog runs (--backlog-messages) also get the catch-up figures
# (backlog.consume_*, backlog.catchup_cpu.*).
#
# Usage: bench/scripts/ab.sh BROKER_A BROKER_B ROUNDS [magnetar-bench flags...]
# e.g.   bench/scripts/ab.sh /tmp/magnetar-before target/release/magnetar 3 --duration-s 8
#
# To compare two clients (the bench links the client SDK), give each side
# its own bench binary: MAGNETAR_BENCH_A and MAGNETAR_BENCH_B (both default
# to MAGNETAR_BENCH, else target/release/magnetar-bench); BROKER_A and
# BROKER_B may then be the same broker binary.
set -euo pipefail
cd "$(dirname "$0")/../.."
A=$1; B=$2; ROUNDS=$3; shift 3
BENCH=${MAGNETAR_BENCH:-$PWD/target/release/magnetar-bench}
BENCH_A=${MAGNETAR_BENCH_A:-$BENCH}
BENCH_B=${MAGNETAR_BENCH_B:-$BENCH}
OUT=$(mktemp -d "${TMPDIR:-/tmp}/ab.XXXXXX")
for r in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    bin=$A; bench=$BENCH_A; [ $side = B ] && bin=$B && bench=$BENCH_B
    "$bench" --broker-bin "$bin" --no-history -q --json "$OUT/$side-$r.json" "$@" >/dev/null
    python3 -c "import json,sys; j=json.load(open(sys.argv[1])); b=j.get('backlog') or {}; c=b.get('catchup_cpu') or {}; print(sys.argv[2], 'round', sys.argv[3], '%.0f msg/s consumed %.0f' % (j['produce']['msgs_per_s'], j['consume']['msgs_per_s']), 'publish p50 %.3f p99 %.3f ms' % (j['publish_latency_ms']['p50'], j['publish_latency_ms']['p99']), 'broker %.2f client %.2f us/msg' % (j['cpu']['broker_us_per_msg'], j['cpu']['client_us_per_msg']), ('catch-up %.1f MB/s broker %.2f client %.2f us/msg' % (b['consume_mb_per_s'], c.get('broker_us_per_msg') or 0, c.get('client_us_per_msg') or 0)) if b else '')" "$OUT/$side-$r.json" $side $r
  done
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys, statistics
out, rounds = sys.argv[1], int(sys.argv[2])
keys = [("cpu", "broker_us_per_msg"), ("cpu", "client_us_per_msg"), ("produce", "msgs_per_s"), ("consume", "msgs_per_s"), ("publish_latency_ms", "p50"), ("publish_latency_ms", "p99"), ("publish_latency_ms", "p999"), ("e2e_latency_ms", "p50"), ("e2e_latency_ms", "p99")]
keys += [("sustainable", "rate")]
keys += [("backlog", "consume_msgs_per_s"), ("backlog", "consume_mb_per_s"), ("backlog", "catchup_cpu", "broker_us_per_msg"), ("backlog", "catchup_cpu", "client_us_per_msg")]
def get(side, r, k):
    v = json.load(open(f"{out}/{side}-{r}.json"))
    for p in k:
        v = v.get(p) if isinstance(v, dict) else None
    return v
for k in keys:
    av = [get("A", r, k) for r in range(1, rounds + 1)]
    bv = [get("B", r, k) for r in range(1, rounds + 1)]
    if None in av or None in bv:
        continue
    a, b = statistics.median(av), statistics.median(bv)
    name = ".".join(k)
    print(f"median {name:<5}: A {a:12.3f}  B {b:12.3f}  B/A {b / a if a else float('nan'):.3f}")
print(f"runs: {out}")
PY
