#!/usr/bin/env bash
# TLS on versus TLS off, side by side (issue #20): the same magnetar-bench
# workload (the canonical one unless flags say otherwise) against a fresh
# self-started broker without TLS (A) and with TLS on the broker port (B),
# alternately (A B A B ...) so that a noisy machine hurts both alike; then
# the median of each figure and the B/A ratio, as bench/scripts/ab.sh
# prints them.
#
# The certificates (a CA and a server certificate for 127.0.0.1, EC P-256)
# are made with openssl in a temporary directory; the B side passes
# --tls-cert/--tls-key to the broker and --tls-ca to the bench. Both sides
# use the same broker and bench binaries.
#
# Usage: bench/scripts/tls_ab.sh ROUNDS [magnetar-bench flags...]
# e.g.   bench/scripts/tls_ab.sh 3 --duration-s 10
# Binaries: MAGNETAR (default target/release/magnetar) and MAGNETAR_BENCH
# (default target/release/magnetar-bench): build them with
# `cargo build --release -p magnetar -p magnetar-bench`.
# Report the figures in bench/RESULTS.md (they are not a gate).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${1:?usage: bench/scripts/tls_ab.sh ROUNDS [magnetar-bench flags...]}
shift
M=${MAGNETAR:-$PWD/target/release/magnetar}
BENCH=${MAGNETAR_BENCH:-$PWD/target/release/magnetar-bench}
for b in "$M" "$BENCH"; do
  [ -x "$b" ] || { echo "no $b: cargo build --release -p magnetar -p magnetar-bench" >&2; exit 1; }
done
command -v openssl >/dev/null || { echo "openssl is needed to make the test certificates" >&2; exit 1; }
OUT=$(mktemp -d "${TMPDIR:-/tmp}/tls_ab.XXXXXX")
PKI=$OUT/pki
mkdir -p "$PKI"
# A CA, and a server certificate for 127.0.0.1 signed by it.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj "/CN=tls_ab CA" -keyout "$PKI/ca.key" -out "$PKI/ca.pem" 2>/dev/null
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -subj "/CN=127.0.0.1" -keyout "$PKI/server.key" -out "$PKI/server.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$PKI/ext.cnf"
openssl x509 -req -in "$PKI/server.csr" -CA "$PKI/ca.pem" -CAkey "$PKI/ca.key" -CAcreateserial \
  -days 2 -extfile "$PKI/ext.cnf" -out "$PKI/server.pem" 2>/dev/null
TLS_FLAGS=(--tls-ca "$PKI/ca.pem" --broker-arg "--tls-cert=$PKI/server.pem" --broker-arg "--tls-key=$PKI/server.key")

for r in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    extra=()
    [ $side = B ] && extra=("${TLS_FLAGS[@]}")
    "$BENCH" --broker-bin "$M" --no-history -q --json "$OUT/$side-$r.json" "${extra[@]}" "$@" >/dev/null
    python3 "$(dirname "$0")/ab_report.py" round "$OUT/$side-$r.json" "$([ $side = A ] && echo plain || echo tls)" "$r"
  done
done
python3 "$(dirname "$0")/ab_report.py" median "$OUT" "$ROUNDS" plain tls
