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
    python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(sys.argv[2], 'round', sys.argv[3], '%.0f msg/s' % j['produce']['msgs_per_s'], 'publish p50 %.3f p99 %.3f ms' % (j['publish_latency_ms']['p50'], j['publish_latency_ms']['p99']), 'broker %.2f client %.2f us/msg' % (j['cpu']['broker_us_per_msg'], j['cpu']['client_us_per_msg']))" "$OUT/$side-$r.json" $side $r
  done
done
python3 - "$OUT" "$ROUNDS" <<'PY'
import json, sys, statistics
out, rounds = sys.argv[1], int(sys.argv[2])
keys = [("cpu", "broker_us_per_msg"), ("cpu", "client_us_per_msg"), ("produce", "msgs_per_s"), ("publish_latency_ms", "p50"), ("publish_latency_ms", "p99"), ("e2e_latency_ms", "p50"), ("e2e_latency_ms", "p99")]
for k in keys:
    a = statistics.median(json.load(open(f"{out}/A-{r}.json"))[k[0]][k[1]] for r in range(1, rounds + 1))
    b = statistics.median(json.load(open(f"{out}/B-{r}.json"))[k[0]][k[1]] for r in range(1, rounds + 1))
    print(f"median {k[0]}.{k[1]:<5}: A {a:12.3f}  B {b:12.3f}  B/A {b / a if a else float('nan'):.3f}")
print(f"runs: {out}")
PY
