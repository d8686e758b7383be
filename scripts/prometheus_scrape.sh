#!/usr/bin/env bash
# Issue #21: a real Prometheus (Debian's `prometheus` package) scrapes a
# broker's /metrics every second, and a PromQL query over its HTTP API
# returns the produced topic's rate, with a plausible value.
#
#   scripts/prometheus_scrape.sh            # uses target/debug/magnetar
#   M=path/to/magnetar scripts/prometheus_scrape.sh
#
# Installs the package when `prometheus` is missing (apt-get update once,
# then apt-get install -y prometheus; needs root). When it cannot be
# installed, says why and exits 0 as "skipped". Everything lives in a
# temporary directory; the broker, the producer loop and Prometheus are
# killed on exit, whatever happens. Exit 1 on a failed check.
set -euo pipefail
cd "$(dirname "$0")/.."
M=${M:-$PWD/${CARGO_TARGET_DIR:-target}/debug/magnetar}
TOPIC=persistent://public/default/prometheus-scrape
# Messages produced each second by the loop below.
PER_SECOND=100

skip() { echo "SKIPPED: $*"; exit 0; }

if ! command -v prometheus >/dev/null; then
  if [ "$(id -u)" != 0 ]; then
    skip "prometheus is not installed and installing it needs root"
  fi
  echo "== installing Debian's prometheus package"
  if ! { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y prometheus >/dev/null; }; then
    skip "apt-get could not install prometheus"
  fi
  # The package starts a system service on some systems: this script runs
  # its own instance and does not need that one.
  if command -v systemctl >/dev/null; then systemctl stop prometheus >/dev/null 2>&1 || true; fi
fi
command -v prometheus >/dev/null || skip "no prometheus binary after installation"
[ -x "$M" ] || { echo "no magnetar binary at $M (cargo build -p magnetar, or set M)" >&2; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/magnetar-prometheus.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  stop_broker KILL
  rm -rf "$TMP"
}
trap cleanup EXIT
# shellcheck source=../bench/scripts/broker_lib.sh
source bench/scripts/broker_lib.sh
start_broker "$TMP/broker" --data-dir "$TMP/data" --shards 1 --no-pin
echo "== broker on $BROKER_ADDR, HTTP on $BROKER_HTTP"

# A steady workload: PER_SECOND messages every second until killed.
(
  while true; do
    "$M" produce "$TOPIC" --count "$PER_SECOND" --size 100 --url "$BROKER_ADDR" >/dev/null 2>&1 || true
    sleep 1
  done
) &
PIDS+=($!)

# A free port for Prometheus' own HTTP API.
PROM_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$TMP/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: magnetar
    metrics_path: /metrics
    static_configs:
      - targets: ["$BROKER_HTTP"]
EOF
prometheus --config.file="$TMP/prometheus.yml" --storage.tsdb.path="$TMP/tsdb" \
  --web.listen-address="127.0.0.1:$PROM_PORT" >"$TMP/prometheus.log" 2>&1 &
PIDS+=($!)
echo "== prometheus $(prometheus --version 2>&1 | head -1 | awk '{print $3}') on 127.0.0.1:$PROM_PORT"

QUERY="rate(pulsar_in_messages_total{topic=\"$TOPIC\"}[10s])"
# Up to 90 s for Prometheus to start, scrape and have two samples in range.
for _ in $(seq 90); do
  sleep 1
  ANSWER=$(curl -sf --max-time 5 "http://127.0.0.1:$PROM_PORT/api/v1/query" --data-urlencode "query=$QUERY" || true)
  [ -n "$ANSWER" ] || continue
  VALUE=$(echo "$ANSWER" | jq -r '.data.result[0].value[1] // empty')
  [ -n "$VALUE" ] || continue
  echo "== $QUERY = $VALUE"
  # Plausible: more than nothing, at most what the loop can send (each
  # second it sends PER_SECOND messages and then sleeps a second).
  if python3 -c "import sys; v=float('$VALUE'); sys.exit(0 if 0 < v <= $PER_SECOND else 1)"; then
    TARGET=$(curl -sf --max-time 5 "http://127.0.0.1:$PROM_PORT/api/v1/targets" | jq -r '.data.activeTargets[0].health')
    [ "$TARGET" = up ] || { echo "FAILED: the scrape target is $TARGET" >&2; exit 1; }
    echo "OK: Prometheus scraped the broker and the topic's rate is plausible"
    exit 0
  fi
  [ "$VALUE" = 0 ] && continue
  echo "FAILED: implausible rate $VALUE (expected 0 < rate <= $PER_SECOND)" >&2
  exit 1
done
echo "FAILED: no series for $QUERY within 90 s" >&2
tail -n 20 "$TMP/prometheus.log" >&2
exit 1
