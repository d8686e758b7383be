#!/usr/bin/env bash
# Producer throughput without batching, with batching, and with batching and
# each compression codec, against one fresh standalone broker on this disk.
# Generated 1 KiB payloads are "<name>:<seq>:" padded with 'x' (very
# compressible: codecs look better here than on real data). One producer,
# one topic, each run on its own topic.
#
# Usage: bench/scripts/produce_batching.sh [DIR_ON_DISK] [COUNT] [SIZE]
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:-$PWD/target/bench-disk}
COUNT=${2:-200000}
SIZE=${3:-1024}
cargo build --release --bin magnetar >&2
M=$PWD/target/release/magnetar
mkdir -p "$DIR"
WORK=$(mktemp -d "$DIR/run.XXXXXX")
source bench/scripts/broker_lib.sh
trap 'stop_broker KILL; rm -rf "$WORK"' EXIT

start_broker "$WORK/broker" --data-dir "$WORK/data"
ADDR=$BROKER_ADDR

run() { # label, extra args...
  local label=$1; shift
  local summary
  summary=$("$M" produce "persistent://public/default/bench-$label" --url "$ADDR" --count "$COUNT" \
    --size "$SIZE" --max-pending 1000 "$@" 2>&1 >/dev/null | tail -1)
  printf '%-22s %s\n' "$label" "$summary"
}
run no-batching
run batching --batch-max-messages 1000 --batch-max-delay-ms 5
for codec in lz4 zlib zstd snappy; do
  run "batching-$codec" --batch-max-messages 1000 --batch-max-delay-ms 5 --compression "$codec"
done
run key-based-4-keys --batching key-based --batch-max-delay-ms 5 --keys 4
du -sh "$WORK/data" | sed 's/^/data directory after all runs: /'
