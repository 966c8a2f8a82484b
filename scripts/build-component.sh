#!/usr/bin/env bash
# Builds the guard component from guest/ alone — no host, no wasmtime — and
# writes it to OUT (default: target/idem-guard.wasm). The bytes are those the
# host embeds and `idem component --out` writes: the same crate, target
# (wasm32-wasip2) and profile (`guest`, Cargo.toml) as host/build.rs uses.
# Needs only the pinned Rust toolchain with the wasm32-wasip2 target
# (rust-toolchain.toml lists both; rustup installs them on first use).
#
#   scripts/build-component.sh [OUT]
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
out="${1:-$target/idem-guard.wasm}"

rustup target list --installed 2>/dev/null | grep -q '^wasm32-wasip2$' \
  || rustup target add wasm32-wasip2 >&2
# The guest's own target directory, as host/build.rs keeps it, so the two
# builds share their work.
guest_target="$target/guest-target/guard"
(cd "$root/guest" && env -u RUSTFLAGS -u CARGO_ENCODED_RUSTFLAGS -u CARGO_BUILD_TARGET -u CARGO_TARGET_DIR \
  cargo build --quiet --locked --lib --target wasm32-wasip2 --profile guest --target-dir "$guest_target")
mkdir -p "$(dirname "$out")"
cp "$guest_target/wasm32-wasip2/guest/idem_guest.wasm" "$out"
echo "$out"
