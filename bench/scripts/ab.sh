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
    python3 "$(dirname "$0")/ab_report.py" round "$OUT/$side-$r.json" $side $r
  done
done
python3 "$(dirname "$0")/ab_report.py" median "$OUT" "$ROUNDS" A B
