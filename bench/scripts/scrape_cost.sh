#!/usr/bin/env bash
# Scrape cost (issue #21): how long GET /metrics takes with TOPICS topics
# loaded, and the canonical workload's publish latency with and without a
# scrape every second meanwhile, side by side on one broker.
#
# usage: bench/scripts/scrape_cost.sh [TOPICS] [ROUNDS] [BROKER...]
# (defaults 10000 topics, 3 rounds, target/release/magnetar). With several
# broker binaries (e.g. an older build first), each gets the same run in
# turn, so that their figures come from the same minutes of a shared
# machine. Each round runs the bench once without scraping and once with a
# scrape every second (alternating which goes first); the medians and their
# ratio are printed. BENCH (default target/release/magnetar-bench), RATE
# (messages/s, default 50000: a fixed rate, so that p99 is the broker's and
# not the producer's window), DURATION_S (default 10) and DATA_DIR
# (default ./target) may be set.
set -euo pipefail
cd "$(dirname "$0")/../.."
TOPICS=${1:-10000}
ROUNDS=${2:-3}
shift $(( $# < 2 ? $# : 2 ))
BROKERS=("$@")
[ ${#BROKERS[@]} -gt 0 ] || BROKERS=(target/release/magnetar)
BENCH=${BENCH:-target/release/magnetar-bench}
RATE=${RATE:-50000}
DURATION_S=${DURATION_S:-10}
. bench/scripts/broker_lib.sh
dir=$(mktemp -d "${DATA_DIR:-target}/scrape-cost.XXXXXX")
scraper=
trap '[ -n "$scraper" ] && kill "$scraper" 2>/dev/null; stop_broker; rm -rf "$dir"' EXIT
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"

bench_round() { # NAME: one bench run against the broker; prints its JSON path
  local json="$dir/$1.json"
  "$BENCH" --url "$BROKER_ADDR" --no-history -q --json "$json" --rate "$RATE" \
    --duration-s "$DURATION_S" --warmup-s 2 --topic-prefix "scrape-bench-$1" >/dev/null
  echo "$json"
}

for b in "${!BROKERS[@]}"; do
  M=${BROKERS[$b]}
  out="$dir/b$b"
  mkdir -p "$out"
  start_broker "$out/broker" --data-dir "$out/data" --shards 2
  echo "== broker $b: $M ($BROKER_ADDR, http $BROKER_HTTP); creating $TOPICS topics"
  seq 0 $((TOPICS - 1)) | xargs -P 8 -I{} curl -sf -o /dev/null -X PUT \
    "http://$BROKER_HTTP/admin/v2/persistent/public/default/scrape-{}"
  for i in 1 2 3 4 5; do
    curl -s -o "$out/metrics.txt" -w "idle scrape ${i}: %{time_total} s, %{size_download} bytes\n" \
      "http://$BROKER_HTTP/metrics"
  done
  echo "series: $(grep -vc '^#' "$out/metrics.txt"), topics: $(grep -c '^pulsar_rate_in{' "$out/metrics.txt")"
  for r in $(seq 1 "$ROUNDS"); do
    order="without with"
    [ $((r % 2)) -eq 0 ] && order="with without"
    for mode in $order; do
      if [ "$mode" = with ]; then
        ( while true; do
            curl -s -o /dev/null -w "%{time_total}\n" "http://$BROKER_HTTP/metrics" >>"$out/scrapes.txt"
            sleep 1
          done ) &
        scraper=$!
      fi
      json=$(bench_round "b$b-$mode-$r")
      if [ "$mode" = with ]; then kill "$scraper"; wait "$scraper" 2>/dev/null || true; scraper=; fi
      python3 -c "import json,sys; j=json.load(open(sys.argv[1])); l=j['publish_latency_ms']; print(sys.argv[2], 'round', sys.argv[3], '%.0f msg/s' % j['produce']['msgs_per_s'], 'publish p50 %.3f p99 %.3f p99.9 %.3f ms' % (l['p50'], l['p99'], l['p999']))" \
        "$json" "$mode" "$r"
    done
  done
  python3 - "$dir" "$b" "$ROUNDS" "$out/scrapes.txt" <<'PY'
import json, statistics, sys
d, b, rounds, scrapes = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
def med(mode, *k):
    vals = []
    for r in range(1, rounds + 1):
        v = json.load(open(f"{d}/b{b}-{mode}-{r}.json"))
        for p in k:
            v = v[p]
        vals.append(v)
    return statistics.median(vals)
for k in [("produce", "msgs_per_s"), ("publish_latency_ms", "p50"), ("publish_latency_ms", "p99"), ("publish_latency_ms", "p999")]:
    a, w = med("without", *k), med("with", *k)
    print(f"median {'.'.join(k):<22}: without {a:10.3f}  with scraping {w:10.3f}  with/without {w / a:.3f}")
t = sorted(float(x) for x in open(scrapes))
print(f"scrapes under load: {len(t)}, median {statistics.median(t) * 1000:.0f} ms, max {t[-1] * 1000:.0f} ms")
PY
  stop_broker
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
