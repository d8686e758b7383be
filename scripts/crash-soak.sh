#!/usr/bin/env bash
# Crash soak, run on purpose (CI runs the 20-cycle default of the same test):
# kill -9 the broker at random moments (while producing, a random moment
# into a graceful shutdown, and while it recovers), restart, and check that
# every acknowledged message is present, in order, byte for byte, once; over
# four shapes (plain; batched and compressed; 4 partitions with key routing;
# two producers). See tests/tests/crash_soak.rs.
#
#   scripts/crash-soak.sh [CYCLES] [SEED]     # default 200 cycles, fresh seed
#
# The seed is printed at the start (and in the summary line at the end);
# pass it back to replay the same shapes, sizes and kill delays. A failing
# run keeps its data directory with MAGNETAR_TEST_KEEP=1.
set -euo pipefail
cd "$(dirname "$0")/.."
cycles=${1:-200}
if [[ $# -ge 2 ]]; then
    export MAGNETAR_TEST_SEED=$2
fi
export MAGNETAR_SOAK_CYCLES=$cycles
exec cargo test -p magnetar-tests --test crash_soak -- --nocapture
