#!/usr/bin/env bash
# Issue #18 part 3: the broker against the machine's own ceiling for durable
# messages, the durable pipe (../shared/limits/durable-pipe: TCP in, O_DIRECT
# group commit with fdatasync, ack out; no checksum, no index), both in the
# same window, round after round, on the same disk. Run on purpose on a
# quiet machine, not in CI. Per round:
#   pipe    1 KiB, 4,000 in flight                    (throughput ceiling)
#   broker  canonical, produce only (--consumers 0)   ratio to the pipe, target >= 0.8
#   broker  canonical, one consumer reading all       ratio to the pipe, target >= 0.7
#   pipe    1 KiB, one at a time                      (latency floor)
#   broker  one at a time, shard 0 and shard 1        p50 ratio, target <= 1.15
#   broker  canonical at LOAD_PCT (default 60) % of its one-consumer rate in
#           this round, one consumer: publish p99.9   target < 5 ms, beside
#           the pipe's one-at-a-time ack p99.9 (the disk's own tail)
# At the end, the median of each ratio over the rounds. Per-run JSON is kept
# in OUT (default target/vs-pipe/results-<time>).
#
#   cargo build --release -p magnetar -p magnetar-bench
#   bench/scripts/vs_pipe.sh [ROUNDS] [SECONDS] [DIR_ON_DISK]
#
# PIPE_DIR (default ../shared/limits/durable-pipe beside the project) holds
# the pipe's source; it is built into PIPE_TARGET_DIR
# (/tmp/durable-pipe-target). BENCH names magnetar-bench
# (target/release/magnetar-bench).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:-3} S=${2:-10} BASE=${3:-$PWD/target/vs-pipe}
LOAD_PCT=${LOAD_PCT:-60}
PIPE_DIR=${PIPE_DIR:-$PWD/../shared/limits/durable-pipe}
TD=${PIPE_TARGET_DIR:-/tmp/durable-pipe-target}
BENCH=${BENCH:-${CARGO_TARGET_DIR:-$PWD/target}/release/magnetar-bench}
[ -f "$PIPE_DIR/Cargo.toml" ] || { echo "no durable pipe at $PIPE_DIR (set PIPE_DIR)" >&2; exit 2; }
[ -x "$BENCH" ] || { echo "no $BENCH: cargo build --release -p magnetar -p magnetar-bench" >&2; exit 2; }
cargo build --release -q --manifest-path "$PIPE_DIR/Cargo.toml" --target-dir "$TD"
PIPE=$TD/release/durable-pipe
OUT=$BASE/results-$(date +%Y%m%d-%H%M%S)
W=$BASE/work
mkdir -p "$OUT"; rm -rf "$W"; mkdir -p "$W"
trap 'rm -rf "$W"' EXIT

pipe() { # name window
  local port=$((20000 + RANDOM % 20000)) sp
  rm -f "$W/pipe.out"
  "$PIPE" serve "$W" $port >"$W/pipe.out" & sp=$!
  until grep -q ready "$W/pipe.out" 2>/dev/null; do sleep 0.2; done; sleep 0.3
  "$PIPE" produce 127.0.0.1:$port 1024 "$S" "$2" >"$OUT/$1.txt"
  wait $sp; rm -f "$W"/*.dat
  echo "$(date +%T) $1: $(cat "$OUT/$1.txt")"
}
bench() { # name flags...
  local name=$1; shift
  rm -rf "$W/broker"; mkdir -p "$W/broker"
  "$BENCH" --duration-s "$S" --warmup-s 2 --size 1024 -q --no-history --json "$OUT/$name.json" \
    --data-dir "$W/broker" "$@" >"$OUT/$name.out" 2>&1 || { echo "$name failed:"; tail -5 "$OUT/$name.out"; return 1; }
  python3 - "$OUT/$name.json" "$name" <<'PY'
import json, sys, time
b = json.load(open(sys.argv[1])); p = b["produce"]; l = b["publish_latency_ms"]; c = b["consume"]
print("%s %s: produce %.0f msg/s, consume %.0f msg/s, publish p50 %.0f us p99 %.0f us p99.9 %.0f us"
      % (time.strftime("%H:%M:%S"), sys.argv[2], p["msgs_per_s"], c["msgs_per_s"], l["p50"] * 1e3, l["p99"] * 1e3, l["p999"] * 1e3))
PY
}
rate_of() { python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["produce"]["msgs_per_s"] * int(sys.argv[2]) / 100))' "$1" "$2"; }

for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r, $(uptime | sed 's/.*load/load/')"
  pipe "r$r-pipe-4000" 4000
  bench "r$r-produce-only" --consumers 0
  bench "r$r-one-consumer"
  pipe "r$r-pipe-1" 1
  for sh in 0 1; do
    bench "r$r-one-at-a-time-shard$sh" --consumers 0 --partitions 1 --batch-max-messages 0 --max-pending 1 --topic-shard $sh
  done
  # (Of the one-consumer rate: a share of the produce-only rate can be
  # more than the broker sustains with a consumer, and then the figure is
  # a queue's growth, not a tail.)
  bench "r$r-tail" --rate "$(rate_of "$OUT/r$r-one-consumer.json" "$LOAD_PCT")"
done

python3 - "$OUT" "$ROUNDS" "$LOAD_PCT" <<'PY'
import json, re, statistics, sys
out, rounds, pct = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def pipe(name):
    t = open(f"{out}/{name}.txt").read()
    return float(re.search(r"msg/s (\S+)", t).group(1)), float(re.search(r"p50 (\d+)", t).group(1))
def b(name): return json.load(open(f"{out}/{name}.json"))
rows = {"produce only / pipe msg/s (>= 0.8)": [], "one consumer / pipe msg/s (>= 0.7)": [],
        "one at a time p50, shard 0 / pipe (<= 1.15)": [], "one at a time p50, shard 1 / pipe (<= 1.15)": [],
        f"publish p99.9 ms at {pct} % with one consumer (< 5)": [],
        "pipe one at a time, ack p99.9 ms (the disk's own tail)": []}
k = list(rows)
for r in range(1, rounds + 1):
    pm, _ = pipe(f"r{r}-pipe-4000"); _, p50 = pipe(f"r{r}-pipe-1")
    rows[k[0]].append(b(f"r{r}-produce-only")["produce"]["msgs_per_s"] / pm)
    one = b(f"r{r}-one-consumer")
    rows[k[1]].append(min(one["produce"]["msgs_per_s"], one["consume"]["msgs_per_s"]) / pm)
    for i, sh in enumerate((0, 1)):
        rows[k[2 + i]].append(b(f"r{r}-one-at-a-time-shard{sh}")["publish_latency_ms"]["p50"] * 1e3 / p50)
    rows[k[4]].append(b(f"r{r}-tail")["publish_latency_ms"]["p999"])
    rows[k[5]].append(float(re.search(r"p999 (\d+)", open(f"{out}/r{r}-pipe-1.txt").read()).group(1)) / 1e3)
print(f"\n{'figure':<58} {'median':>8}   rounds")
for name, v in rows.items():
    print(f"{name:<58} {statistics.median(v):8.2f}   " + " ".join(f"{x:.2f}" for x in v))
print(f"\nper-run JSON and pipe output: {out}")
PY
