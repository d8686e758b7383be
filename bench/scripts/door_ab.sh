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
REPORT="$(dirname "$0")/ab_report.py"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for shape in $SHAPES; do
  [ -f "bench/workloads/$shape.toml" ] || { echo "no bench/workloads/$shape.toml" >&2; exit 1; }
  # ab_report.py's layout: side A (native) and side B (pulsar) per shape.
  mkdir -p "$OUT/$shape"
  for r in $(seq 1 "$ROUNDS"); do
    for door in native pulsar; do
      side=A; [ $door = pulsar ] && side=B
      "$BENCH" --broker-bin "$M" --no-history -q --workload "bench/workloads/$shape.toml" \
        --protocol "$door" --json "$OUT/$shape/$side-$r.json" "$@" >/dev/null
      python3 "$REPORT" round "$OUT/$shape/$side-$r.json" "$shape $door" "$r"
    done
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
for shape in $SHAPES; do
  echo "== $shape (median of $ROUNDS)"
  python3 "$REPORT" median "$OUT/$shape" "$ROUNDS" native pulsar --goal 1.15
done
