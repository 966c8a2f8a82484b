#!/usr/bin/env bash
# Makes sure the servers the tests need are up: Redis on 127.0.0.1:6379 and
# PostgreSQL on 127.0.0.1:5432 (database `test`). Starts them if they are
# installed but stopped; fails, naming the server, if one cannot be reached.
set -euo pipefail

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
echo "services: Redis and PostgreSQL are up"
