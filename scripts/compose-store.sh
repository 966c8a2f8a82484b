#!/usr/bin/env bash
# Builds the reference store component (examples/store-component) and the
# guard component, and composes them with wac, the Bytecode Alliance's
# composition tool (the crate wac-cli, version pinned below), into OUT_DIR
# (default: target/store-component):
#
#   idem-guard.wasm               the guard (scripts/build-component.sh)
#   memory-store.wasm             the store (world idem:store-example/memory-store)
#   idem-with-memory-store.wasm   `wac plug`: the guard with the store in its
#                                 `store` import; world idem:guard/idem-with-store,
#                                 checked with `wac targets`
#   guard-with-memory-store.wasm  `wac compose` of guard-with-memory-store.wac:
#                                 the same, also exporting the store's `testing`
#                                 hooks (faults, peek) for the conformance tests
#
# Prints OUT_DIR. Needs the pinned Rust toolchain with the wasm32-wasip2
# target; installs wac with `cargo install` when the pinned version is not
# in $CARGO_HOME/bin (once per machine: about 5 minutes of CPU, 113 crates,
# without the crate's default `registry` feature, which only fetches
# packages from a registry, so no network client is built).
#
#   scripts/compose-store.sh [OUT_DIR]
set -euo pipefail

WAC_VERSION=0.12.0

root="$(cd "$(dirname "$0")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
out="${1:-$target/store-component}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

wac="${CARGO_HOME:-$HOME/.cargo}/bin/wac"
if [[ "$("$wac" --version 2>/dev/null)" != "wac-cli $WAC_VERSION" ]]; then
  echo "installing wac-cli $WAC_VERSION (cargo install, once per machine)" >&2
  cargo install --quiet --locked wac-cli --version "$WAC_VERSION" --no-default-features >&2
fi

bash "$root/scripts/build-component.sh" "$out/idem-guard.wasm" >/dev/null

# The store with the guard's profile and target, in the guard's target
# directory (build-component.sh's), whose wit-bindgen and dlmalloc it reuses.
guest_target="$target/guest-target/guard"
(cd "$root/examples/store-component" && env -u RUSTFLAGS -u CARGO_ENCODED_RUSTFLAGS -u CARGO_BUILD_TARGET -u CARGO_TARGET_DIR \
  cargo build --quiet --locked --lib --target wasm32-wasip2 --profile guest --target-dir "$guest_target")
cp "$guest_target/wasm32-wasip2/guest/idem_store_component.wasm" "$out/memory-store.wasm"

# What a host loads: the store plugged into the guard's `store` import.
# `wac targets` fails if it imports anything idem-with-store does not name
# (clock, random, types) or does not export the guard.
"$wac" plug --plug "$out/memory-store.wasm" "$out/idem-guard.wasm" -o "$out/idem-with-memory-store.wasm"
"$wac" targets --wit "$root/wit" --world idem-with-store "$out/idem-with-memory-store.wasm"

# What the conformance tests load: the same composition, plus `testing`.
"$wac" compose "$root/examples/store-component/guard-with-memory-store.wac" \
  --dep "idem:memory-store=$out/memory-store.wasm" --dep "idem:guard=$out/idem-guard.wasm" \
  -o "$out/guard-with-memory-store.wasm"
"$wac" targets --wit "$root/wit" --world idem-with-store "$out/guard-with-memory-store.wasm"

echo "$out"
