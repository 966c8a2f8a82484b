#!/usr/bin/env bash
# Runs the conformance scenarios in the JavaScript and Python hosts against the
# exact component bytes the Rust host embeds, builds the npm package
# @idem/guard with those bytes (packages/js/build.sh, tarball in the target
# directory) and tests it installed, then runs examples/interop (idem serve, a
# Node.js service and a Python worker sharing one Redis and one PostgreSQL).
# Exits non-zero on any failure.
#
#   examples/run-polyglot-tests.sh [REPO_ROOT]
#
# Needs: cargo, Node.js >= 20.14 (--test-force-exit) with npm, Python 3.11 (with libfaketime, the
# Debian package faketime, for the Python package's clock tests), and for the packages'
# store tests and the interop test Redis and PostgreSQL: it runs
# scripts/services.sh, which starts the local ones (and Valkey, for the
# stores' SET … IFEQ), and names them in IDEM_TEST_REDIS_URL,
# IDEM_TEST_VALKEY_URL and IDEM_TEST_POSTGRES_URL unless those are set
# (IDEM_TEST_SKIP_NETSTORES=1 skips those tests instead). Installs from lock files
# only (npm ci, with express, ioredis and pg for the package's tests; pip install -r
# packages/python/requirements-dev.txt, with starlette, redis and psycopg, into
# a venv under target/), and builds the idem-guard wheel (packages/python/build.sh)
# with the same component, which the Python tests use installed.
# Set IDEM_BIN to use an already built idem binary instead of `cargo run`, or
# IDEM_COMPONENT to test a component file as it is (e.g. one built from guest/
# with `cargo build --lib --target wasm32-wasip2 --profile guest`).
set -euo pipefail

root="$(cd "${1:-$(dirname "$0")/..}" && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"
component="${IDEM_COMPONENT:-$target/idem-guard.wasm}"

if [[ -n "${IDEM_COMPONENT:-}" ]]; then
  component_as_is=1
  echo "== component: $component (IDEM_COMPONENT, as it is)"
  [[ -f "$component" ]] || { echo "no component at $component" >&2; exit 1; }
elif [[ -n "${IDEM_BIN:-}" ]]; then
  echo "== component: idem component --out $component"
  mkdir -p "$(dirname "$component")" # a fresh clone has no target/ yet
  "$IDEM_BIN" component --out "$component"
else
  echo "== component: idem component --out $component"
  (cd "$root" && cargo run --quiet -p idem -- component --out "$component")
fi
export IDEM_COMPONENT="$component"

# The guard composed with the reference store component (scripts/compose-store.sh,
# wac): the packages' store-component tests host it through jco and wasmtime-py.
IDEM_STORE_COMPONENTS="$(bash "$root/scripts/compose-store.sh")"
export IDEM_STORE_COMPONENTS

# The packages' store tests and the interop test need Redis and PostgreSQL:
# started if they are installed and stopped (scripts/services.sh), and named
# to every step below (values already set, as by scripts/test-all.sh, win).
# Without a server the tests that need it fail; IDEM_TEST_SKIP_NETSTORES=1
# skips them on purpose.
if [[ "${IDEM_TEST_SKIP_NETSTORES:-}" != 1 ]]; then
  bash "$root/scripts/services.sh"
  export IDEM_TEST_REDIS_URL="${IDEM_TEST_REDIS_URL:-redis://127.0.0.1:6379}"
  export IDEM_TEST_VALKEY_URL="${IDEM_TEST_VALKEY_URL:-redis://127.0.0.1:6391}"
  export IDEM_TEST_REDIS_CLUSTER_URL="${IDEM_TEST_REDIS_CLUSTER_URL:-redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002}"
  export IDEM_TEST_POSTGRES_URL="${IDEM_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
  export IDEM_TEST_DYNAMODB_URL="${IDEM_TEST_DYNAMODB_URL:-dynamodb://127.0.0.1:8000?table=idem&region=us-east-1}"
fi
# The HTTP scenarios (conformance/http) also run against `idem serve`: the
# JavaScript test starts the idem binary that wrote the component (IDEM_BIN,
# or the one `cargo run` built) and fails without it. A component taken as it
# is comes with no binary: those scenarios then run if target/ has one.
if [[ -n "${IDEM_BIN:-}" ]]; then
  export IDEM_GATEWAY_REQUIRED=1
elif [[ -z "${component_as_is:-}" ]]; then
  export IDEM_BIN="$target/debug/idem" IDEM_GATEWAY_REQUIRED=1
fi

# A test that hangs fails after 5 minutes, and a test file whose tests are
# done exits even if something it started is still open (a server, a child
# process), so a broken test is reported instead of stalling the run.
node_test_flags="--test-timeout=300000 --test-force-exit"

echo "== JavaScript package @idem/guard (Node.js $(node --version))"
if [[ -z "${component_as_is:-}" ]]; then
  # The package builds without the Rust host: build.sh with no IDEM_COMPONENT
  # takes the component from scripts/build-component.sh (guest/ alone), which
  # must be byte for byte the one the idem binary wrote above.
  IDEM_COMPONENT= bash "$root/packages/js/build.sh" "$target/js-from-guest" >/dev/null
  cmp "$root/packages/js/idem-guard.wasm" "$component" \
    || { echo "the component built from guest/ alone differs from idem component --out" >&2; exit 1; }
  echo "guest-only build: the same $(wc -c <"$component") bytes as idem component --out"
fi
tarball="$(IDEM_COMPONENT="$component" bash "$root/packages/js/build.sh" "$target")"
echo "packed $tarball"
(
  # Its tests: the conformance scenarios through the lean binding and jco's
  # glue (the devDependency) and on RedisStore and PostgresStore, the guard's
  # own, the HTTP scenarios against the Express middleware (express is a
  # devDependency) and `idem serve`, spans received over OTLP, every README
  # block, and an install of the tarball into an empty project, as a user
  # does. The Redis and PostgreSQL tests fail without their servers' URLs
  # (IDEM_TEST_SKIP_NETSTORES=1 skips them). Before them, the package's
  # habits: Biome (formatting and lint, warnings fail) and tsc over its
  # declaration files and a typed Express consumer (test/types/), both pinned
  # in its devDependencies.
  cd "$root/packages/js"
  npm ci --no-audit --no-fund --loglevel=error
  npx --no-install biome ci --error-on-warnings --colors=off .
  npx --no-install tsc -p .
  echo "biome and tsc: clean"
  rm -rf gen
  npx --no-install jco transpile "$component" -o gen --name idem --instantiation sync --no-wasi-shim -q
  node --test $node_test_flags test/
)

echo "== JavaScript examples (@idem/guard linked from packages/js)"
(
  cd "$root/examples/js"
  npm ci --no-audit --no-fund --loglevel=error
  node --test $node_test_flags test/
)

echo "== Python package and host ($(python3.11 --version))"
(
  venv="$target/polyglot-venv"
  wheels="$target/wheels"
  [[ -x "$venv/bin/python" ]] || python3.11 -m venv "$venv"
  # The test dependencies go through a wheelhouse, from which the wheel test
  # installs wasmtime into its fresh venv offline.
  dev="$root/packages/python/requirements-dev.txt"
  "$venv/bin/pip" download --quiet --disable-pip-version-check --no-deps --dest "$wheels" -r "$dev"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-index --find-links "$wheels" -r "$dev"
  # The linters, pinned in requirements-dev.txt and configured in pyproject.toml:
  # Ruff on the package, its tests and the Python examples; mypy --strict on the
  # package and a typed FastAPI consumer (tests/typed_fastapi_app.py).
  (cd "$root/packages/python" && "$venv/bin/ruff" check . ../../examples/python ../../examples/interop \
    && "$venv/bin/mypy")
  # The idem-guard wheel, with $component inside; the tests import it installed.
  "$root/packages/python/build.sh" "" "$wheels"
  "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --force-reinstall \
    "$wheels/idem_guard-0.3.0-py3-none-any.whl"
  (cd "$root/packages/python" && IDEM_WHEELHOUSE="$wheels" \
    "$venv/bin/python" -m pytest -q -p no:cacheprovider tests)
  # The oldest wasmtime-py the package accepts (pyproject.toml: wasmtime>=40,<52),
  # under the static binding's tests, in a venv of its own. (The dynamic binding,
  # wasmtime-py's component API, is the tests' reference and needs 51.)
  floor="$target/polyglot-venv-wasmtime-floor"
  floor_reqs="$root/packages/python/requirements-wasmtime-floor.txt"
  [[ -x "$floor/bin/python" ]] || python3.11 -m venv "$floor"
  "$floor/bin/pip" download --quiet --disable-pip-version-check --no-deps --dest "$wheels" -r "$floor_reqs"
  "$floor/bin/pip" install --quiet --disable-pip-version-check --no-index --find-links "$wheels" -r "$floor_reqs"
  "$floor/bin/pip" install --quiet --disable-pip-version-check --no-deps --force-reinstall \
    "$wheels/idem_guard-0.3.0-py3-none-any.whl"
  (cd "$root/packages/python" && "$floor/bin/python" -m pytest -q -p no:cacheprovider \
    tests/test_abi.py tests/test_conformance.py tests/test_host.py -k "not dynamic and not both_bindings")
  (cd "$root/examples/python" && "$venv/bin/python" -m pytest -q -p no:cacheprovider)
)

echo "== interop: idem serve, a Node.js service and a Python worker on one Redis, one PostgreSQL and one DynamoDB table"
(
  # The gateway is the idem binary the component came from (IDEM_BIN, above).
  cd "$root/examples/interop" && "$target/polyglot-venv/bin/python" -m pytest -q -p no:cacheprovider
)

echo "== every host agrees with every scenario"
