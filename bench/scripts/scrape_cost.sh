#!/usr/bin/env bash
# Scrape cost (issue #21): how long GET /metrics takes with TOPICS topics
# loaded, and a one-at-a-time producer's publish latency with and without
# a scrape every second meanwhile.
#
# usage: M=target/release/magnetar bench/scripts/scrape_cost.sh [TOPICS] [MESSAGES]
# (defaults 10000 topics, 5000 messages; DATA_DIR defaults to a temporary
# directory under ./target).
set -euo pipefail
cd "$(dirname "$0")/../.."
M=${M:-target/release/magnetar}
TOPICS=${1:-10000}
MESSAGES=${2:-5000}
. bench/scripts/broker_lib.sh
dir=$(mktemp -d "${DATA_DIR:-target}/scrape-cost.XXXXXX")
trap 'stop_broker; rm -rf "$dir"' EXIT
start_broker "$dir/broker" --data-dir "$dir/data" --shards 2
echo "broker $BROKER_ADDR http $BROKER_HTTP; creating $TOPICS topics"
seq 0 $((TOPICS - 1)) | xargs -P 8 -I{} curl -sf -o /dev/null -X PUT "http://$BROKER_HTTP/admin/v2/persistent/public/default/scrape-{}"
for i in 1 2 3 4 5; do
  curl -s -o "$dir/metrics.txt" -w "scrape ${i}: %{time_total} s, %{size_download} bytes\n" "http://$BROKER_HTTP/metrics"
done
echo "series: $(grep -vc '^#' "$dir/metrics.txt")"
produce() {
  "$M" produce persistent://public/default/scrape-latency --count "$MESSAGES" --size 100 \
    --max-pending 1 --url "$BROKER_ADDR" 2>&1 | grep -o 'publish latency.*' || true
}
echo "without scraping: $(produce)"
( while true; do curl -s -o /dev/null "http://$BROKER_HTTP/metrics"; sleep 1; done ) &
scraper=$!
echo "scraping every 1 s: $(produce)"
kill "$scraper"
