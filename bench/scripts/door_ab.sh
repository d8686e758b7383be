#!/usr/bin/env bash
# The native door versus the Pulsar door, side by side (issue #19): the same
# magnetar-bench workloads, the canonical one (bench/workloads/canonical.toml)
# and one message at a time (bench/workloads/one-at-a-time.toml), against a
# fresh self-started broker each run, through the native client (A) and
# through Apache Pulsar's Rust client, the `pulsar` crate (B,
# `--protocol pulsar`), alternately (A B A B ...) so that a noisy machine hurts
# both alike. Per door: msg/s, broker CPU per message (the bench reads the
# broker's /proc/PID/stat utime+stime over the run) and the client's own CPU
# per message (reported, not judged: it is the client library's cost); then
# the medians and the pulsar/native ratio of broker CPU per message (issue
# #19's goal: at most 1.15).
#
# Usage: bench/scripts/door_ab.sh ROUNDS [magnetar-bench flags...]
# e.g.   bench/scripts/door_ab.sh 3 --duration-s 10
# The flags go to every run (after the workload file). Binaries: MAGNETAR
# (default target/release/magnetar) and MAGNETAR_BENCH (default
# target/release/magnetar-bench): `cargo build --release -p magnetar -p
# magnetar-bench`. SHAPES="canonical one-at-a-time" (the default) picks the
# workloads. Report the figures in bench/RESULTS.md (they are not a gate).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:?usage: bench/scripts/door_ab.sh ROUNDS [magnetar-bench flags...]}
shift
M=${MAGNETAR:-$PWD/target/release/magnetar}
BENCH=${MAGNETAR_BENCH:-$PWD/target/release/magnetar-bench}
SHAPES=${SHAPES:-canonical one-at-a-time}
for b in "$M" "$BENCH"; do
  [ -x "$b" ] || { echo "no $b: cargo build --release -p magnetar -p magnetar-bench" >&2; exit 1; }
done
OUT=$(mktemp -d "${TMPDIR:-/tmp}/door_ab.XXXXXX")
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for shape in $SHAPES; do
  [ -f "bench/workloads/$shape.toml" ] || { echo "no bench/workloads/$shape.toml" >&2; exit 1; }
  for r in $(seq 1 "$ROUNDS"); do
    for door in native pulsar; do
      "$BENCH" --broker-bin "$M" --no-history -q --workload "bench/workloads/$shape.toml" \
        --protocol "$door" --json "$OUT/$shape-$door-$r.json" "$@" >/dev/null
      python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print('%-14s %-6s round %s' % (sys.argv[2], sys.argv[3], sys.argv[4]), '%9.0f msg/s consumed %9.0f' % (j['produce']['msgs_per_s'], j['consume']['msgs_per_s']), 'publish p50 %.3f p99 %.3f ms' % (j['publish_latency_ms']['p50'], j['publish_latency_ms']['p99']), 'broker %.2f client %.2f us/msg' % (j['cpu']['broker_us_per_msg'], j['cpu']['client_us_per_msg']))" \
        "$OUT/$shape-$door-$r.json" "$shape" "$door" "$r"
    done
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$OUT" "$ROUNDS" $SHAPES <<'PY'
import json, sys, statistics
out, rounds, shapes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
keys = [("produce", "msgs_per_s"), ("consume", "msgs_per_s"), ("cpu", "broker_us_per_msg"),
        ("cpu", "client_us_per_msg"), ("publish_latency_ms", "p50"), ("publish_latency_ms", "p99"),
        ("e2e_latency_ms", "p50"), ("e2e_latency_ms", "p99")]
def get(shape, door, r, k):
    v = json.load(open(f"{out}/{shape}-{door}-{r}.json"))
    for p in k:
        v = v.get(p) if isinstance(v, dict) else None
    return v
for shape in shapes:
    print(f"== {shape} (median of {rounds})")
    for k in keys:
        nv = [get(shape, "native", r, k) for r in range(1, rounds + 1)]
        pv = [get(shape, "pulsar", r, k) for r in range(1, rounds + 1)]
        if None in nv or None in pv:
            continue
        n, p = statistics.median(nv), statistics.median(pv)
        name = ".".join(k)
        print(f"{name:<24}: native {n:12.3f}  pulsar {p:12.3f}  pulsar/native {p / n if n else float('nan'):.3f}")
    n = statistics.median([get(shape, "native", r, ("cpu", "broker_us_per_msg")) for r in range(1, rounds + 1)])
    p = statistics.median([get(shape, "pulsar", r, ("cpu", "broker_us_per_msg")) for r in range(1, rounds + 1)])
    verdict = "within" if n and p / n <= 1.15 else "above"
    print(f"broker CPU per message pulsar/native: {p / n if n else float('nan'):.3f} ({verdict} the 1.15 goal)")
print(f"runs: {out}")
PY
