#!/usr/bin/env bash
# Runs every test: the Rust workspace (guard, host, all four stores, gateway,
# console) and the JavaScript and Python hosts against the same component.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/services.sh
export IDEM_TEST_REDIS_URL="${IDEM_TEST_REDIS_URL:-redis://127.0.0.1:6379}"
export IDEM_TEST_POSTGRES_URL="${IDEM_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"

cargo test --workspace --locked
if [ -f examples/run-polyglot-tests.sh ]; then
  bash examples/run-polyglot-tests.sh
fi
