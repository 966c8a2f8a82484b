#!/usr/bin/env bash
# Prints the cost of one guarded call (begin + complete on a new key, memory
# store, through the component) in the Rust, Node.js and Python hosts, side
# by side, in one run on one machine.
#
#   examples/bench-hosts.sh [REPO_ROOT] [OPS]
#
# Run it on a quiet machine: the three hosts run one after the other.
set -euo pipefail

root="$(cd "${1:-$(dirname "$0")/..}" && pwd)"
ops="${2:-20000}"
target="${CARGO_TARGET_DIR:-$root/target}"
component="$target/idem-guard.wasm"
export IDEM_COMPONENT="$component"

(cd "$root" && cargo build --quiet --release -p idem --bin idem --example host_bench)
"$target/release/idem" component --out "$component" 2>/dev/null
(
  cd "$root/examples/js"
  [[ -d node_modules ]] || npm ci --no-audit --no-fund --loglevel=error
  rm -rf gen
  npx --no-install jco transpile "$component" -o gen --name idem --instantiation sync --no-wasi-shim -q
)
venv="$target/polyglot-venv"
[[ -x "$venv/bin/python" ]] || python3.11 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check -r "$root/examples/python/requirements.txt"

echo "host    runtime           call            ops        cost"
"$target/release/examples/host_bench" "$ops"
(cd "$root/examples/js" && node bench.js "$ops")
# The Python host is two orders of magnitude slower; a quarter of the ops is plenty.
(cd "$root/examples/python" && "$venv/bin/python" bench.py "$(( ops / 4 ))")
