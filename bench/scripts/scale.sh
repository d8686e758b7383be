#!/usr/bin/env bash
# Memory against data on one node (issue #18, part 1), run on purpose (not CI).
#
# Entries mode (default): one broker with one shard, unbounded retention, one
# topic; ENTRIES unbatched messages of SIZE bytes (each one entry of the
# shard's log) produced in two halves by PRODUCERS parallel producers,
# noting the time between the halves (T_mid). Then, at once, one consumer
# catches up from the earliest position and another seeks by publish time
# to T_mid and reads the second half. Then a clean restart. The broker's
# RSS (VmRSS of /proc/PID/status) is sampled every second into rss.csv
# (t_s,rss_kib,phase) and drawn into rss.svg by bench/scripts/plot_rss.py
# (python3, standard library only).
#
# Topics mode (--topics N): one broker (SHARDS shards, default 2), N topics
# each with MESSAGES messages and one durable subscription (the
# `scale-topics` bench binary), producers and consumers closed afterwards.
# Reports RSS growth per topic, then the start time (the broker's
# "broker ready start_ms") and RSS after a clean restart and after a kill -9
# restart, and the time to list the namespace's topics.
#
#   cargo build --release -p magnetar -p magnetar-bench
#   [MAGNETAR_BIN=… SCALE_TOPICS_BIN=…] bench/scripts/scale.sh [--entries N] [--size B] [--producers P] [--dir DIR] [--keep]
#   bench/scripts/scale.sh --topics N [--messages K] [--concurrency C] [--dir DIR] [--unload-wait S] [--retention-wait S]
#
# With --unload-wait S (topics mode), after the idle-topics sample the script
# waits S seconds more (give it the broker's --topic-idle-unload-s plus one
# sweep, a quarter of that) and reports RSS and magnetar_topics_loaded again:
# the memory idle topics keep once unloaded. BROKER_ARGS (environment) adds
# flags to every broker start, e.g. BROKER_ARGS="--topic-idle-unload-s 5".
# With --retention-wait S (topics mode), after the clean restart the script
# waits S seconds (give it the broker's --retention-check-interval-s and the
# time of one pass) and reports RSS and magnetar_topics_loaded: what a
# retention pass leaves in memory.
#
# Defaults: --entries 200000000 (the issue's figure: needs ~45 GB of disk at
# 100 B, and hours here), --size 100, --producers 4, --messages 3,
# --concurrency 64, --dir target/scale-bench (on the real disk, not tmpfs;
# removed at the end unless --keep). Output (CSV, SVG, broker logs) in
# DIR/out, kept.
set -euo pipefail
cd "$(dirname "$0")/../.."
ENTRIES=200000000 SIZE=100 PRODUCERS=4 TOPICS=0 MESSAGES=3 CONCURRENCY=64 BASE=$PWD/target/scale-bench KEEP=0 UNLOAD_WAIT=0 RETENTION_WAIT=0
while [ $# -gt 0 ]; do
  case $1 in
    --entries) ENTRIES=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --producers) PRODUCERS=$2; shift 2 ;;
    --topics) TOPICS=$2; shift 2 ;;
    --messages) MESSAGES=$2; shift 2 ;;
    --concurrency) CONCURRENCY=$2; shift 2 ;;
    --dir) BASE=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --unload-wait) UNLOAD_WAIT=$2; shift 2 ;;
    --retention-wait) RETENTION_WAIT=$2; shift 2 ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
SHARDS=${SHARDS:-2}
T=${CARGO_TARGET_DIR:-$PWD/target}
M=${MAGNETAR_BIN:-$T/release/magnetar}
ST=${SCALE_TOPICS_BIN:-$T/release/scale-topics}
D=$BASE/data OUT=$BASE/out
rm -rf "$D"; mkdir -p "$D" "$OUT"
source bench/scripts/broker_lib.sh
SAMPLER=
cleanup() {
  [ -n "$SAMPLER" ] && kill "$SAMPLER" 2>/dev/null
  stop_broker KILL
  [ "$KEEP" = 1 ] || rm -rf "$D"
}
trap cleanup EXIT

now_ms() { date +%s%3N; }
rss_kib() { sed -n 's/^VmRSS:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$1/status" 2>/dev/null || echo 0; }
phase() { echo "$1" > "$OUT/phase"; echo "$(date +%T) phase $1 (rss $(rss_kib "$BROKER_PID") KiB)"; }
T0=$(now_ms)
# Samples whichever broker $OUT/pid names, every second.
sampler() {
  echo "t_s,rss_kib,phase" > "$OUT/rss.csv"
  while :; do
    local pid; pid=$(cat "$OUT/pid" 2>/dev/null || true)
    local r=0; [ -n "$pid" ] && r=$(rss_kib "$pid")
    echo "$(( ($(now_ms) - T0) / 1000 )),${r:-0},$(cat "$OUT/phase" 2>/dev/null)" >> "$OUT/rss.csv"
    sleep 1
  done
}
start() { # label flags...
  local label=$1; shift
  # shellcheck disable=SC2086 # BROKER_ARGS is a list of flags
  BROKER_WAIT_S=900 start_broker "$OUT/$label" --data-dir "$D" --no-pin --disk-refuse-pct 100 "$@" ${BROKER_ARGS:-} || exit 1
  echo "$BROKER_PID" > "$OUT/pid"
}
ready_ms() { sed 's/\x1b\[[0-9;]*m//g' "$OUT/$1.err" | sed -n 's/.*broker ready.*start_ms=\([0-9]*\).*/\1/p' | tail -1; }
echo "machine: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(free -g | awk '/Mem/{print $2}') GiB RAM (shared: figures are indicative)"

if [ "$TOPICS" = 0 ]; then
  start broker --shards 1
  sampler & SAMPLER=$!
  "$M" admin --url "$BROKER_ADDR" namespaces set-retention public/default --minutes -1 --size-mb -1
  sleep 2; phase idle; sleep 3
  BASE_RSS=$(rss_kib "$BROKER_PID")
  produce_half() { # count
    local per=$(( $1 / PRODUCERS )) i pids=()
    for i in $(seq "$PRODUCERS"); do
      "$M" produce scale --count "$per" --size "$SIZE" --max-pending 5000 --url "$BROKER_ADDR" >/dev/null 2>"$OUT/produce-$i.err" &
      pids+=($!)
    done
    wait "${pids[@]}"
  }
  phase produce
  t=$(now_ms); produce_half $(( ENTRIES / 2 ))
  sleep 1.1; T_MID=$(now_ms); sleep 1.1
  produce_half $(( ENTRIES / 2 )); produce_s=$(( ($(now_ms) - t) / 1000 ))
  PRODUCED=$(( ENTRIES / 2 / PRODUCERS * PRODUCERS * 2 ))
  sleep 2; AFTER_PRODUCE=$(rss_kib "$BROKER_PID")
  echo "produced $PRODUCED entries of $SIZE B in $produce_s s; data $(du -sm "$D" | cut -f1) MiB"
  phase read
  t=$(now_ms)
  "$M" consume scale -s catchup --initial-position earliest --count "$PRODUCED" --timeout-s 120 --url "$BROKER_ADDR" --output jsonl \
    --receiver-queue-size 5000 2>"$OUT/catchup.err" | awk 'END { print NR }' > "$OUT/catchup.count" &
  C1=$!
  "$M" consume scale -s seek --initial-position earliest --seek-time-ms "$T_MID" --count $(( PRODUCED / 2 )) --url "$BROKER_ADDR" \
    --timeout-s 120 --output jsonl --receiver-queue-size 5000 2>"$OUT/seek.err" \
    | awk 'NR == 1 { print > "'"$OUT/seek.first"'" } END { print NR > "'"$OUT/seek.count"'" }' &
  C2=$!
  wait $C1 $C2 || true
  read_s=$(( ($(now_ms) - t) / 1000 ))
  echo "catch-up consumer read $(cat "$OUT/catchup.count") messages; seek consumer $(cat "$OUT/seek.count") in $read_s s"
  echo "seek to $T_MID: first message $(cut -c1-160 "$OUT/seek.first")"
  phase restart
  stop_broker TERM
  start restarted --shards 1
  sleep 3; phase after-restart; sleep 5
  AFTER_RESTART=$(rss_kib "$BROKER_PID")
  PEAK=$(awk -F, 'NR > 1 && $2 > m { m = $2 } END { print m }' "$OUT/rss.csv")
  echo "RSS KiB: idle $BASE_RSS, after produce $AFTER_PRODUCE, peak $PEAK, after restart $AFTER_RESTART"
  echo "RSS growth per entry after produce: $(echo "($AFTER_PRODUCE - $BASE_RSS) * 1024 / $PRODUCED" | bc -l | cut -c1-6) B;" \
    "after restart: $(echo "($AFTER_RESTART - $BASE_RSS) * 1024 / $PRODUCED" | bc -l | cut -c1-6) B"
  echo "restart start_ms $(ready_ms restarted)"
else
  start broker --shards "$SHARDS"
  sampler & SAMPLER=$!
  sleep 2; phase idle; sleep 3
  BASE_RSS=$(rss_kib "$BROKER_PID")
  phase topics
  "$ST" --url "$BROKER_ADDR" --topics "$TOPICS" --messages "$MESSAGES" --concurrency "$CONCURRENCY" 2>"$OUT/topics.err" \
    | tee "$OUT/topics.out"
  sleep 5; phase idle-topics; sleep 5
  AFTER=$(rss_kib "$BROKER_PID")
  echo "RSS KiB: before $BASE_RSS, with $TOPICS topics $AFTER: $(( (AFTER - BASE_RSS) * 1024 / TOPICS )) B per topic"
  topics_loaded() { curl -s "http://$BROKER_HTTP/metrics" | sed -n 's/^magnetar_topics_loaded{shard="total"} \([0-9]*\).*/\1/p'; }
  if [ "$UNLOAD_WAIT" != 0 ]; then
    echo "loaded topics: $(topics_loaded)"
    phase unload-wait; sleep "$UNLOAD_WAIT"
    UNLOADED=$(rss_kib "$BROKER_PID")
    echo "after $UNLOAD_WAIT s more: loaded topics $(topics_loaded), RSS $UNLOADED KiB:" \
      "$(( (UNLOADED - BASE_RSS) * 1024 / TOPICS )) B per topic"
  fi
  t=$(now_ms); n=$("$M" admin --url "$BROKER_ADDR" topics list public/default | wc -l)
  echo "topics list public/default: $n lines in $(( $(now_ms) - t )) ms"
  phase clean-restart
  stop_broker TERM
  start clean-restart --shards "$SHARDS"
  sleep 5; R1=$(rss_kib "$BROKER_PID")
  echo "clean restart: start_ms $(ready_ms clean-restart), RSS $R1 KiB"
  if [ "$RETENTION_WAIT" != 0 ]; then
    phase retention-wait; sleep "$RETENTION_WAIT"
    R3=$(rss_kib "$BROKER_PID")
    echo "after $RETENTION_WAIT s (retention passes): loaded topics $(topics_loaded), RSS $R3 KiB:" \
      "$(( (R3 - R1) * 1024 / TOPICS )) B per topic over the restarted broker"
  fi
  # Touch every topic again (a consumer reconnecting to each subscription)
  # to see what loaded topics cost after a restart.
  phase reload
  t=$(now_ms)
  "$ST" --url "$BROKER_ADDR" --topics "$TOPICS" --messages 0 --concurrency "$CONCURRENCY" 2>>"$OUT/topics.err" >/dev/null
  sleep 5; R2=$(rss_kib "$BROKER_PID")
  echo "every topic loaded again in $(( $(now_ms) - t )) ms: RSS $R2 KiB ($(( (R2 - BASE_RSS) * 1024 / TOPICS )) B per topic over the first idle broker)"
  phase kill9-restart
  stop_broker KILL
  start kill9-restart --shards "$SHARDS"
  sleep 5
  echo "kill -9 restart: start_ms $(ready_ms kill9-restart), RSS $(rss_kib "$BROKER_PID") KiB"
fi
phase done
sleep 1
kill "$SAMPLER" 2>/dev/null; SAMPLER=
stop_broker TERM
python3 bench/scripts/plot_rss.py "$OUT/rss.csv" "$OUT/rss.svg" && echo "RSS samples: $OUT/rss.csv, plot: $OUT/rss.svg"
