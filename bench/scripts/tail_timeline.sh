#!/usr/bin/env bash
# The publish tail against what the shards were doing, second by second
# (issue #18 part 3), run on purpose on a quiet machine, not in CI: the
# canonical workload with one consumer at RATE msg/s for SECONDS against a
# broker started here (2 shards); per second the bench's publish p50/p99
# (its JSON timeline) beside the broker's fdatasyncs, their mean latency
# and group commits (from /metrics) and its CPU (% of one core); then the
# storage events of the run (checkpoints, segments created or recycled,
# slow lone batches: the broker runs with RUST_LOG=info,magnetar_storage=debug)
# at their second of the timeline.
#
#   cargo build --release -p magnetar -p magnetar-bench
#   bench/scripts/tail_timeline.sh RATE [SECONDS] [DIR_ON_DISK]
#
# BIN (default target/release) holds magnetar and magnetar-bench.
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=$1; S=${2:-30}; BASE=${3:-${CARGO_TARGET_DIR:-$PWD/target}}
BIN=${BIN:-${CARGO_TARGET_DIR:-$PWD/target}/release}
M=$BIN/magnetar
mkdir -p "$BASE"
W=$(mktemp -d "$BASE/tail-timeline.XXXX"); trap 'stop_broker KILL; rm -rf "$W"' EXIT
source bench/scripts/broker_lib.sh
RUST_LOG=${RUST_LOG:-info,magnetar_storage=debug} start_broker "$W/b" --data-dir "$W/data" --no-pin
PID=$BROKER_PID
( while kill -0 $PID 2>/dev/null; do
    t=$(date +%s.%N)
    m=$(curl -s "http://$BROKER_HTTP/metrics")
    fs=$(echo "$m" | awk '/^magnetar_fdatasync_latency_seconds_sum\{shard="total"/{s+=$2} END{print s+0}')
    fc=$(echo "$m" | awk '/^magnetar_fdatasync_latency_seconds_count\{shard="total"/{s+=$2} END{print s+0}')
    gc=$(echo "$m" | awk '/^magnetar_group_commits_total\{shard="total"/{s+=$2} END{print s+0}')
    cpu=$(awk '{print $14+$15}' /proc/$PID/stat)
    echo "$t $fs $fc $gc $cpu"
    sleep 1
  done ) > "$W/metrics.txt" 2>/dev/null &
$BIN/magnetar-bench --url "$BROKER_ADDR" --duration-s "$S" --warmup-s 2 --size 1024 -q --no-history --json "$W/b.json" --rate "$RATE" >/dev/null 2>&1
python3 - "$W/b.json" "$W/metrics.txt" "$W/b.err" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))
l = b["publish_latency_ms"]
print("rate %.0f: publish p50 %.1f p99 %.1f p99.9 %.1f max %.1f ms" % (b["produce"]["msgs_per_s"], l["p50"], l["p99"], l["p999"], l["max"]))
rows = [list(map(float, x.split())) for x in open(sys.argv[2]) if x.strip()]
end = b["finished_at"]; tl = b["timeline"]; t0 = end - tl[-1]["t_s"] - 1
print(" t_s  phase    prod/s   p50ms  p99ms | fsyncs/s fsync_ms_avg commits/s broker_cpu%")
for k in tl:
    at = t0 + k["t_s"]
    prev = [r for r in rows if r[0] <= at - 1]; cur = [r for r in rows if r[0] <= at]
    if prev and cur:
        a, c = prev[-1], cur[-1]
        dn = c[2] - a[2]; avg = (c[1] - a[1]) / dn * 1e3 if dn else 0
        extra = "%7.0f %9.2f %9.0f %7.0f" % (dn, avg, c[3] - a[3], (c[4] - a[4]))
    else:
        extra = ""
    print("%4d %-8s %7.0f %7.1f %6.1f | %s" % (k["t_s"], k.get("phase", ""), k.get("produce_msgs_per_s", 0), k.get("publish_p50_ms", 0), k.get("publish_p99_ms", 0), extra))
import datetime, re
print("storage events (t_s on the timeline above):")
for line in open(sys.argv[3], errors="replace"):
    line = re.sub(r"\x1b\[[0-9;]*m", "", line)
    if "magnetar_storage" not in line:
        continue
    m = re.match(r"(\S+Z)\s+\w+\s+(.*)", line)
    if not m:
        continue
    at = datetime.datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
    print("%6.1f  %s" % (at - t0, m.group(2)[:160]))
PY
