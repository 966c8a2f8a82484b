#!/usr/bin/env bash
# Builds the npm package @idem/guard: writes the guard component into the
# package (idem-guard.wasm, next to index.js, where `Guard.load()` looks by
# default), copies the on-store layout (wit/store-layout/: the Redis scripts
# and PostgreSQL SQL that RedisStore and PostgresStore load) into
# store-layout/, and packs it into OUT_DIR (default: the repository's
# target/). Prints the tarball's path. Both copies are gitignored: the files
# live once, in wit/.
#
#   packages/js/build.sh [OUT_DIR]
#
# The component comes from `idem component --out`: with IDEM_COMPONENT set,
# that file as it is; else with IDEM_BIN set, that idem binary; else
# `cargo run -p idem` from the repository root (the component's bytes do not
# depend on the idem build's profile). Needs npm; installs nothing: the
# package has no dependencies (express and pg are optional peers).
set -euo pipefail

pkg="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$pkg/../.." && pwd)"
out="$(mkdir -p "${1:-${CARGO_TARGET_DIR:-$root/target}}" && cd "${1:-${CARGO_TARGET_DIR:-$root/target}}" && pwd)"
wasm="$pkg/idem-guard.wasm"

if [[ -n "${IDEM_COMPONENT:-}" ]]; then
  [[ -f "$IDEM_COMPONENT" ]] || { echo "no component at $IDEM_COMPONENT" >&2; exit 1; }
  cp "$IDEM_COMPONENT" "$wasm"
elif [[ -n "${IDEM_BIN:-}" ]]; then
  "$IDEM_BIN" component --out "$wasm" >&2
else
  # Exactly `cargo run -p idem -- …`: the README test's cargo stand-in knows this form.
  (cd "$root" && cargo run -p idem -- component --out "$wasm" >&2)
fi

# The layout as it is in wit/ (a stale copy would pack old scripts).
rm -rf "$pkg/store-layout"
mkdir -p "$pkg/store-layout"
cp -R "$root/wit/store-layout/README.md" "$root/wit/store-layout/redis" "$root/wit/store-layout/postgres" "$pkg/store-layout/"

tarball="$(cd "$pkg" && npm pack --silent --pack-destination "$out")"
echo "$out/$tarball"
