#!/usr/bin/env bash
# Builds the npm package @idem/guard: puts the guard component into the
# package (idem-guard.wasm, next to index.js, where `Guard.load()` looks by
# default), copies the on-store layout (wit/store-layout/: the Redis scripts
# and PostgreSQL SQL that RedisStore and PostgresStore load) into
# store-layout/, and packs it into OUT_DIR (default: the repository's
# target/). Prints the tarball's path. Both copies are gitignored: the files
# live once, in wit/.
#
#   packages/js/build.sh [OUT_DIR]
#
# The component: with IDEM_COMPONENT set, that file as it is; else
# scripts/build-component.sh builds it from guest/ alone (the guest crate for
# wasm32-wasip2, no host, no wasmtime: seconds once its dependencies are
# built), byte for byte the component `idem component --out` writes. Needs
# npm and, without IDEM_COMPONENT, the pinned Rust toolchain with the
# wasm32-wasip2 target; installs nothing: the package has no dependencies
# (express, pg and @opentelemetry/api are optional peers).
set -euo pipefail

pkg="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$pkg/../.." && pwd)"
out="$(mkdir -p "${1:-${CARGO_TARGET_DIR:-$root/target}}" && cd "${1:-${CARGO_TARGET_DIR:-$root/target}}" && pwd)"
wasm="$pkg/idem-guard.wasm"

if [[ -n "${IDEM_COMPONENT:-}" ]]; then
  [[ -f "$IDEM_COMPONENT" ]] || { echo "no component at $IDEM_COMPONENT" >&2; exit 1; }
  cp "$IDEM_COMPONENT" "$wasm"
else
  bash "$root/scripts/build-component.sh" "$wasm" >&2
fi

# The layout as it is in wit/ (a stale copy would pack old scripts).
rm -rf "$pkg/store-layout"
mkdir -p "$pkg/store-layout"
cp -R "$root/wit/store-layout/README.md" "$root/wit/store-layout/redis" "$root/wit/store-layout/postgres" "$pkg/store-layout/"

tarball="$(cd "$pkg" && npm pack --silent --pack-destination "$out")"
echo "$out/$tarball"
