#!/usr/bin/env bash
# Regenerate pulsar-wire/src/generated/pulsar.proto.rs from
# pulsar-wire/proto/PulsarApi.proto.
#
# The generator (pulsar-wire/codegen, outside the workspace) parses the schema
# with protox and emits Rust with prost-build, both pure Rust: no protoc is
# needed, here or anywhere else. Only this script needs the generator's crates;
# `cargo build` and CI use the committed output. Keep prost-build's minor
# version (codegen/Cargo.toml) equal to the runtime `prost` of
# pulsar-wire/Cargo.toml.
#
# The schema is Apache Pulsar's own file, copied unchanged (license header
# included). To update it, copy the new upstream file over proto/PulsarApi.proto
# and run this script; note the source commit in pulsar-wire/README.md.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cargo run --quiet --manifest-path "$here/codegen/Cargo.toml"
