#!/usr/bin/env bash
# Prints the cost of one guarded call (begin + complete on a new key, memory
# store, through the component) in the Rust, Node.js and Python hosts, side
# by side, in one run on one machine. Node.js and Python each print their
# binding before issue 17 (jco's glue; wasmtime-py's component API) and the
# one they use now (idem-abi.js; idem_abi.py), rounds interleaved, with the
# ratio; also `run` with lease renewal armed and a replay.
#
#   examples/bench-hosts.sh [REPO_ROOT] [OPS] [ROUNDS]
#   HOSTS="js python" examples/bench-hosts.sh   # without the Rust host and its release build
#
# Run it on a quiet machine: the hosts run one after the other. Set IDEM_BIN
# to write the component with an already built idem binary.
set -euo pipefail

root="$(cd "${1:-$(dirname "$0")/..}" && pwd)"
ops="${2:-20000}"
rounds="${3:-5}"
hosts="${HOSTS:-rust js python}"
target="${CARGO_TARGET_DIR:-$root/target}"
component="$target/idem-guard.wasm"
export IDEM_COMPONENT="$component"

if [[ " $hosts " == *" rust "* ]]; then
  (cd "$root" && cargo build --quiet --release -p idem --bin idem --example host_bench)
  "$target/release/idem" component --out "$component" 2>/dev/null
elif [[ -n "${IDEM_BIN:-}" ]]; then
  "$IDEM_BIN" component --out "$component" 2>/dev/null
else
  # The guest is built with its own profile: a debug `idem` writes the same component bytes.
  (cd "$root" && cargo run --quiet -p idem -- component --out "$component" 2>/dev/null)
fi
if [[ " $hosts " == *" js "* ]]; then
  (
    # bench.js uses the package (linked) and jco's glue, transpiled in the package.
    cd "$root/packages/js"
    [[ -d node_modules ]] || npm ci --no-audit --no-fund --loglevel=error
    rm -rf gen
    npx --no-install jco transpile "$component" -o gen --name idem --instantiation sync --no-wasi-shim -q
    cd "$root/examples/js"
    [[ -d node_modules ]] || npm ci --no-audit --no-fund --loglevel=error
  )
fi
venv="$target/polyglot-venv"
if [[ " $hosts " == *" python "* ]]; then
  [[ -x "$venv/bin/python" ]] || python3.11 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$root/packages/python/requirements-dev.txt"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --force-reinstall \
    "$("$root/packages/python/build.sh" "" "$target/wheels")"  # the idem-guard wheel, with $component
fi

echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "host    runtime           call            ops        cost"
if [[ " $hosts " == *" rust "* ]]; then "$target/release/examples/host_bench" "$ops"; fi
if [[ " $hosts " == *" js "* ]]; then (cd "$root/examples/js" && node bench.js "$ops" "$rounds"); fi
# The Python host is an order of magnitude slower than Node.js: a quarter of the ops is plenty.
if [[ " $hosts " == *" python "* ]]; then (cd "$root/examples/python" && "$venv/bin/python" bench.py "$(( ops / 4 ))" "$rounds"); fi
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
