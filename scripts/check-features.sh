#!/usr/bin/env bash
# The library's cargo features (host/Cargo.toml): each store feature pulls
# its own driver and no other store's, and every feature set a library user
# may pick builds without a warning. Run by scripts/test-all.sh; its cargo
# checks share the workspace's target directory (CARGO_TARGET_DIR if set).
set -euo pipefail
cd "$(dirname "$0")/.."

# The crates that mark each store's driver in `cargo tree`.
declare -A driver=(
  [sqlite]="rusqlite libsqlite3-sys"
  [redis]="redis"
  [postgres]="deadpool-postgres tokio-postgres postgres-protocol"
  [dynamodb]="aws-sdk-dynamodb aws-config"
)

failed=0
fail() {
  echo "check-features: $*" >&2
  failed=1
}

# The engine alone, then with each store: its driver is in, the others' are out.
for store in "" sqlite redis postgres dynamodb; do
  features="engine${store:+,$store}"
  crates=$(cargo tree --locked -p idem --no-default-features --features "$features" -e normal \
    --prefix none | sed 's/ .*//' | sort -u)
  for other in "${!driver[@]}"; do
    for crate in ${driver[$other]}; do
      if [ "$other" = "$store" ]; then
        grep -qx "$crate" <<<"$crates" || fail "--features $features lacks its driver $crate"
      else
        grep -qx "$crate" <<<"$crates" && fail "--features $features pulls $crate, $other's driver"
      fi
    done
  done
done

# Each build a library user (or the gateway fuzz target, with no features)
# may ask for compiles warning-free. Cargo replays a cached crate's
# warnings, so a second run still shows them.
for features in "" engine engine,sqlite engine,redis engine,postgres engine,dynamodb; do
  out=$(cargo check --locked -p idem --lib --no-default-features --features "$features" \
    --message-format short 2>&1) || {
    echo "$out" >&2
    fail "cargo check --features '$features' fails"
    continue
  }
  if grep -q 'warning' <<<"$out"; then
    echo "$out" >&2
    fail "cargo check --features '$features' warns"
  fi
done

# A URL for a store left out names the feature to build with.
cargo test --locked -q -p idem --lib --no-default-features --features engine \
  store::open::tests || fail "a store left out is not refused by name"

exit "$failed"
