#!/usr/bin/env bash
# Coverage-guided fuzzing on stable Rust: builds one target of fuzz/ with
# libFuzzer (libfuzzer-sys) and the SanitizerCoverage instrumentation that
# cargo-fuzz uses with `--sanitizer none` (stable codegen flags; no nightly),
# then runs it for MINUTES minutes on the committed seed corpus.
#
#   scripts/fuzz.sh TARGET MINUTES [extra libFuzzer args...]
#   scripts/fuzz.sh list
#   scripts/fuzz.sh TARGET replay FILE...    # rerun saved inputs (a crash)
#
# New interesting inputs go to fuzz/corpus/TARGET/ (ignored by git; the
# committed seeds are fuzz/seeds/TARGET/), crashes to fuzz/artifacts/TARGET/.
# Build output goes to $FUZZ_TARGET_DIR (default: $CARGO_TARGET_DIR/fuzz or
# target/fuzz), apart from the normal build, since every crate is
# instrumented. FUZZ_JOBS=N runs N libFuzzer workers (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."

targets=$(sed -n 's/^name = "\([a-z_]*\)"$/\1/p' fuzz/Cargo.toml | grep -v '^magnetar-fuzz$' || true)
if [[ ${1:-} == list ]]; then
    echo "$targets"
    exit 0
fi
if [[ $# -lt 2 ]]; then
    echo "usage: $0 TARGET MINUTES [libFuzzer args...] | $0 TARGET replay FILE... | $0 list" >&2
    echo "targets: $(echo $targets)" >&2
    exit 2
fi
target=$1
shift
if ! grep -qx "$target" <<<"$targets"; then
    echo "unknown target '$target'; targets: $(echo $targets)" >&2
    exit 2
fi

triple=$(rustc -vV | sed -n 's/^host: //p')
tdir=${FUZZ_TARGET_DIR:-${CARGO_TARGET_DIR:-$PWD/target}/fuzz}
# The flags of cargo-fuzz's `--sanitizer none` build: libFuzzer's 8-bit edge
# counters, PC table and comparison tracing, `cfg(fuzzing)`, and checks on.
# `--target` keeps them off build scripts and proc macros.
export RUSTFLAGS="-Cpasses=sancov-module \
 -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
 -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares \
 -Cllvm-args=-simplifycfg-branch-fold-threshold=0 \
 --cfg fuzzing -Cdebug-assertions -Coverflow-checks -Ccodegen-units=16"
cargo build --quiet --release --features libfuzzer -p magnetar-fuzz --bin "$target" \
    --target "$triple" --target-dir "$tdir"
bin=$tdir/$triple/release/$target

mkdir -p "fuzz/corpus/$target" "fuzz/artifacts/$target"
if [[ $1 == replay ]]; then
    shift
    exec "$bin" -rss_limit_mb=2048 "$@"
fi
minutes=$1
shift
seconds=$((minutes * 60))
jobs=${FUZZ_JOBS:-1}
echo "fuzzing $target for $minutes min with $jobs worker(s): $bin"
args=(-max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -max_len=65536
    -artifact_prefix="fuzz/artifacts/$target/" -print_final_stats=1)
if [[ $jobs -gt 1 ]]; then
    args+=(-fork="$jobs" -ignore_crashes=0)
fi
exec "$bin" "${args[@]}" "$@" "fuzz/corpus/$target" "fuzz/seeds/$target"
