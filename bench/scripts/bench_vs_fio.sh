#!/usr/bin/env bash
# Issue #6's four targets, each beside the disk's own limit measured by fio
# on the same disk in the same run:
#  1. fio O_DIRECT sequential write with an fdatasync after every write
#     (bs 4k, 64k, 1m): the disk's limit for durable appends;
#  2. magnetar-bench's canonical workload (1 topic x 4 partitions, 1 producer,
#     1 consumer, 1 KiB, durable receipts, the producer batching as Pulsar's
#     clients do by default) against a broker it starts with its data
#     directory on that disk: MB/s as a ratio of fio's (target >= 0.9 of 1m),
#     publish p99 / p99.9 (targets 5 / 10 ms);
#  2a. the same canonical workload at a fixed rate, LOAD_PCT percent (default
#     60) of what run 2 reached: at --rate 0 the publish latency is mostly
#     the producer's own window filling up (1,000 messages per partition in
#     flight: Little's law), so this is the broker's latency with headroom;
#  2b. the same canonical workload at its sustainable rate (`--sustainable`:
#     the highest rate its consumer keeps up with, found by a search first):
#     at --rate 0 the producer can outrun the consumer, and then the run's
#     end-to-end latency is the age of a growing backlog;
#  3. one producer, one unbatched message at a time (1 partition,
#     --max-pending 1 --batch-max-messages 0): publish p50 against fio's
#     4 KiB write+fdatasync p50 (target: + 100 us);
#  4. 16 producers, one unbatched message in flight each (target 30,000 msg/s),
#     twice: one connection per producer (the bench's default: 16 client
#     applications) and all 16 sharing one connection (pulsar-perf's default:
#     one client, connectionsPerBroker 1);
#     runs 3 and 4 are one-partition shapes, and their figures depend on
#     which broker shard owns the topic (bench/RESULTS.md, "Which shard owns
#     the topic ..."), so each runs once per shard (`--topic-shard`; shards 0
#     and 1, or PLACE_SHARDS="0 1 ...");
#  5. a 1 GiB backlog of unbatched 1 KiB messages (1,048,576 entries), written
#     with the broker's write cache at 64 MiB so the catch-up reads the disk,
#     then read by one consumer: MB/s as a ratio of fio's O_DIRECT 1 MiB
#     sequential read (target >= 0.75). Needs ~2.5 GiB free.
#
# Extra flags after `--` go to the canonical run ONLY: runs 3-5 define their
# own shape (unbatched, one in flight) and never inherit batching flags.
#
# Usage: bench/scripts/bench_vs_fio.sh [DIR_ON_DISK] [DURATION_S] [-- extra flags for the canonical run]
# SKIP_CATCHUP=1 skips run 5, SKIP_SUSTAINABLE=1 run 2b, LOAD_PCT=0 run 2a. Needs fio and python3. Results (JSON, SVG) go
# to DIR_ON_DISK/results-<time>/.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-$PWD/target/bench-disk}
DURATION=${2:-30}
shift $(( $# < 2 ? $# : 2 )) || true
[ "${1:-}" = "--" ] && shift
EXTRA=("$@")
command -v fio >/dev/null || { echo "fio is not installed: apt-get install fio" >&2; exit 2; }
cargo build --release -p magnetar -p magnetar-bench >&2
B=$PWD/target/release/magnetar-bench
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
OUT="$DIR/results-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$OUT"
# Each canonical run writes ~0.45 GB per second measured (plus warm-up and
# search); the broker refuses produce once the disk is 90 % full.
NEED_GB=$(( DURATION + 10 ))
HEADROOM_GB=$(df -P -BG "$DIR" | awk 'NR==2 {gsub("G",""); print int(($3 + $4) * 0.9 - $3)}')
if [ "$HEADROOM_GB" -lt "$NEED_GB" ]; then
  echo "warning: $HEADROOM_GB GB left on $DIR before the broker's 90 % watermark, about $NEED_GB GB needed: expect StorageFull errors" >&2
fi
WORK=$(mktemp -d "$DIR/fio.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

source bench/scripts/fio_lib.sh
declare -A FIO
fio_write_limits "$WORK" 256m 4k 64k 1m

UNBATCHED=(--batch-max-messages 0 --max-pending 1 --partitions 1)
"$B" --data-dir "$DIR" --duration-s "$DURATION" --json "$OUT/canonical.json" --plot "$OUT/canonical.svg" -q --no-history "${EXTRA[@]}"
LOAD_PCT=${LOAD_PCT:-60}
if [ "$LOAD_PCT" -gt 0 ]; then
  RATE=$(python3 -c 'import json,sys; print(int(json.load(open(sys.argv[1]))["produce"]["msgs_per_s"] * int(sys.argv[2]) / 100))' \
    "$OUT/canonical.json" "$LOAD_PCT")
  "$B" --data-dir "$DIR" --duration-s "$DURATION" --rate "$RATE" --json "$OUT/canonical-load.json" -q --no-history "${EXTRA[@]}"
fi
if [ -z "${SKIP_SUSTAINABLE:-}" ]; then
  "$B" --data-dir "$DIR" --duration-s "$DURATION" --sustainable --json "$OUT/canonical-sustainable.json" -q --no-history "${EXTRA[@]}"
fi
# The broker starts one shard per CPU it may use (a CPU quota can make that
# fewer than nproc says): a shard it does not have is reported and skipped.
PLACE_SHARDS=${PLACE_SHARDS:-$( [ "$(nproc)" -ge 2 ] && echo "0 1" || echo 0 )}
for S in $PLACE_SHARDS; do
  ON=(--topic-shard "$S")
  "$B" --data-dir "$DIR" --duration-s 10 "${UNBATCHED[@]}" "${ON[@]}" --json "$OUT/one-at-a-time-shard$S.json" -q --no-history \
    || { echo "no run on shard $S (see above): skipped" >&2; continue; }
  "$B" --data-dir "$DIR" --duration-s 10 "${UNBATCHED[@]}" "${ON[@]}" --producers 16 \
    --json "$OUT/sixteen-producers-shard$S.json" -q --no-history
  "$B" --data-dir "$DIR" --duration-s 10 "${UNBATCHED[@]}" "${ON[@]}" --producers 16 --connections 1 \
    --json "$OUT/sixteen-producers-shared-shard$S.json" -q --no-history
done
READ_1M=0
if [ -z "${SKIP_CATCHUP:-}" ]; then
  WRITE_1M=${FIO[1m]}
  fio_read_limits "$WORK" 1g 1m
  READ_1M=${FIO[1m]}
  FIO[1m]=$WRITE_1M
  "$B" --data-dir "$DIR" --backlog-messages 1048576 --batch-max-messages 0 --broker-arg=--write-cache-mib=64 \
    --json "$OUT/catchup-1g.json" -q --no-history
fi

python3 - "$OUT" "${FIO[4k]}" "${FIO[64k]}" "${FIO[1m]}" "$READ_1M" $PLACE_SHARDS <<'PY'
import json, os, sys
out = sys.argv[1]
place_shards = [sh for sh in sys.argv[6:] if os.path.exists(f"{out}/one-at-a-time-shard{sh}.json")]
fio = {bs: tuple(map(float, v.split())) for bs, v in zip(["4k", "64k", "1m"], sys.argv[2:5])}
read_1m = float(sys.argv[5])
c = json.load(open(f"{out}/canonical.json"))
mb = c["produce"]["mb_per_s"]
print(f"\ncanonical ({c['batching']}): {c['produce']['msgs_per_s']:.0f} msg/s, {mb:.1f} MB/s; "
      f"publish p50 {c['publish_latency_ms']['p50']:.2f} p99 {c['publish_latency_ms']['p99']:.2f} ms (target < 5), "
      f"p99.9 {c['publish_latency_ms']['p999']:.2f} ms (target < 10); e2e p99 {c['e2e_latency_ms']['p99']:.2f} ms; "
      f"broker CPU {c['cpu']['broker_us_per_msg'] or 0:.2f} us/msg (target < 4); consumed {c['consume']['msgs_per_s']:.0f} msg/s")
unbatched = [f"{shape}-shard{sh}" for sh in place_shards
             for shape in ["one-at-a-time", "sixteen-producers", "sixteen-producers-shared"]]
for name in ["canonical", "canonical-load", "canonical-sustainable", *unbatched, "catchup-1g"]:
    path = f"{out}/{name}.json"
    if os.path.exists(path) and json.load(open(path))["publish_errors"]:
        r = json.load(open(path))
        print(f"  WARNING: {name} had {r['publish_errors']} publish errors (last: {r['last_error']}): its figures are not valid")
for bs in ["4k", "64k", "1m"]:
    print(f"  ratio to fio write+fdatasync bs={bs}: {mb / fio[bs][0]:.3f}" + ("  (target >= 0.9)" if bs == "1m" else ""))
if os.path.exists(f"{out}/canonical-load.json"):
    u = json.load(open(f"{out}/canonical-load.json"))
    pl, el = u["publish_latency_ms"], u["e2e_latency_ms"]
    print(f"canonical at a fixed {u['workload']['rate']:.0f} msg/s ({u['workload']['rate'] / c['produce']['msgs_per_s']:.2f} x the run above): "
          f"produced {u['produce']['msgs_per_s']:.0f} msg/s; publish p50 {pl['p50']:.2f} p99 {pl['p99']:.2f} ms (target < 5) "
          f"p99.9 {pl['p999']:.2f} ms (target < 10); e2e p99 {el['p99']:.2f} ms; broker CPU {u['cpu']['broker_us_per_msg'] or 0:.2f} us/msg")
if os.path.exists(f"{out}/canonical-sustainable.json"):
    u = json.load(open(f"{out}/canonical-sustainable.json"))
    f = u["sustainable"]
    print(f"canonical at its sustainable rate {f['rate']:.0f} msg/s (search {f['search_s']:.0f} s, "
          f"{'settled' if f['converged'] else 'NOT settled'}, window {'held it' if f['held'] else 'did NOT hold it'}): "
          f"produced {u['produce']['msgs_per_s']:.0f} consumed {u['consume']['msgs_per_s']:.0f} msg/s, "
          f"{u['produce']['mb_per_s']:.1f} MB/s = {u['produce']['mb_per_s'] / fio['1m'][0]:.3f} x fio 1m; "
          f"publish p50 {u['publish_latency_ms']['p50']:.2f} p99 {u['publish_latency_ms']['p99']:.2f} "
          f"p99.9 {u['publish_latency_ms']['p999']:.2f} ms; e2e p99 {u['e2e_latency_ms']['p99']:.2f} ms")
def on_shard(r, asked):
    # The shard the producers' connections found (topic_shards), which
    # --topic-shard chose; say so if they ever disagree.
    shards = r.get("topic_shards") or []
    if not shards:
        return f" [topic placed on shard {asked}]"
    found = str(shards[0])
    return f" [topic on shard {found}]" + ("" if found == asked else f" (asked for shard {asked})")
for sh in place_shards:
    o = json.load(open(f"{out}/one-at-a-time-shard{sh}.json"))
    p50_us = o["publish_latency_ms"]["p50"] * 1000
    print(f"one at a time ({o['batching']}): publish p50 {p50_us:.0f} us, p99 {o['publish_latency_ms']['p99']*1000:.0f} us "
          f"vs fio 4k write+fdatasync p50 {fio['4k'][1]:.0f} us (target <= {fio['4k'][1] + 100:.0f} us); "
          f"broker CPU {o['cpu']['broker_us_per_msg'] or 0:.1f} us/msg{on_shard(o, sh)}")
for sh in place_shards:
    for shape, how in [("sixteen-producers", "a connection each"), ("sixteen-producers-shared", "one shared connection")]:
        s = json.load(open(f"{out}/{shape}-shard{sh}.json"))
        print(f"16 producers, one in flight each, {how}: {s['produce']['msgs_per_s']:.0f} msg/s (target >= 30,000); "
              f"publish p50 {s['publish_latency_ms']['p50']:.2f} ms; CPU per msg broker {s['cpu']['broker_us_per_msg'] or 0:.1f} "
              f"client {s['cpu']['client_us_per_msg'] or 0:.1f} us{on_shard(s, sh)}")
if os.path.exists(f"{out}/catchup-1g.json"):
    k = json.load(open(f"{out}/catchup-1g.json"))
    b = k["backlog"]
    print(f"catch-up of {b['messages']} x 1 KiB ({b['bytes']/2**30:.2f} GiB, write cache 64 MiB): {b['consume_msgs_per_s']:.0f} msg/s, "
          f"{b['consume_mb_per_s']:.1f} MB/s in {b['catchup_s']:.1f} s vs fio O_DIRECT read bs=1m {read_1m:.0f} MB/s: "
          f"ratio {b['consume_mb_per_s'] / read_1m:.3f} (target >= 0.75)")
print(f"results: {out}")
PY
