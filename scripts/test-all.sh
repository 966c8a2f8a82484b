#!/usr/bin/env bash
# Runs every test: the Rust workspace (guard, host, all five stores, gateway,
# console) and the JavaScript and Python hosts against the same component.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/services.sh
# libfaketime's `faketime` wrapper makes a named semaphore and shared memory
# per process id and refuses to start if one is already there: a wrapper
# killed with SIGKILL leaves its pair behind, and a later process given the
# same id fails with "sem_open: File exists". Remove those of dead processes.
for left in /dev/shm/sem.faketime_sem_* /dev/shm/faketime_shm_*; do
  [ -e "$left" ] || continue
  kill -0 "${left##*_}" 2>/dev/null || rm -f "$left"
done
export IDEM_TEST_REDIS_URL="${IDEM_TEST_REDIS_URL:-redis://127.0.0.1:6379}"
export IDEM_TEST_POSTGRES_URL="${IDEM_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}"
export IDEM_TEST_REDIS_CLUSTER_URL="${IDEM_TEST_REDIS_CLUSTER_URL:-redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002}"
export IDEM_TEST_VALKEY_URL="${IDEM_TEST_VALKEY_URL:-redis://127.0.0.1:6391}"
export IDEM_TEST_DYNAMODB_URL="${IDEM_TEST_DYNAMODB_URL:-dynamodb://127.0.0.1:8000?table=idem&region=us-east-1}"
# The failover test starts (and kills) a cluster of its own with this binary.
export IDEM_TEST_REDIS_SERVER="${IDEM_TEST_REDIS_SERVER:-$(command -v redis-server)}"

# The guard composed with the reference store component (examples/store-component),
# which host/tests/it/composed.rs and the JavaScript and Python hosts' store-component
# tests load; installs the pinned wac-cli first on a machine without it (about 5 minutes
# of CPU, once per machine).
bash scripts/compose-store.sh >/dev/null
cargo test --workspace --locked
# The library's features: each store's driver only with its feature, and
# every feature set a library user may pick builds warning-free.
bash scripts/check-features.sh
if [ -f examples/run-polyglot-tests.sh ]; then
  bash examples/run-polyglot-tests.sh
fi
