#!/usr/bin/env bash
# Starts a loopback Redis Cluster: one redis-server in cluster mode per PORT
# on 127.0.0.1 (cluster bus on PORT+10000), data and logs under DIR/PORT, then
# joins them with one replica per primary (6 ports: 3 primaries + 3 replicas)
# and waits until every node says the cluster is ok. Any node of an earlier
# cluster in DIR is stopped and its state wiped first.
#
#   scripts/redis-cluster.sh DIR PORT...
#
# REDIS_SERVER (default redis-server) names the binary; NODE_TIMEOUT_MS
# (default 5000) the cluster's node timeout; REDIS_ARGS adds arguments to
# every node (the failover test: `--cluster-replica-validity-factor 0`).
set -euo pipefail
dir=$1
shift
ports=("$@")
server=${REDIS_SERVER:-redis-server}
command -v "$server" >/dev/null || { echo "redis-cluster.sh: $server is not installed" >&2; exit 1; }

for port in "${ports[@]}"; do
  if [ -f "$dir/$port/pid" ]; then
    kill "$(cat "$dir/$port/pid")" 2>/dev/null || true
  fi
done
for port in "${ports[@]}"; do
  for _ in $(seq 1 50); do
    redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1 || break
    sleep 0.1
  done
  rm -rf "${dir:?}/$port"
  mkdir -p "$dir/$port"
  # shellcheck disable=SC2086 # REDIS_ARGS is a list of arguments
  "$server" --daemonize yes --bind 127.0.0.1 --port "$port" --dir "$dir/$port" \
    --pidfile "$dir/$port/pid" --logfile "$dir/$port/log" --save "" --appendonly no \
    --cluster-enabled yes --cluster-config-file "$dir/$port/nodes.conf" \
    --cluster-node-timeout "${NODE_TIMEOUT_MS:-5000}" ${REDIS_ARGS:-}
done
for port in "${ports[@]}"; do
  for _ in $(seq 1 100); do
    redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG && break
    sleep 0.1
  done
done
nodes=()
for port in "${ports[@]}"; do nodes+=("127.0.0.1:$port"); done
redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log" 2>&1 \
  || { cat "$dir/create.log" >&2; exit 1; }
# Ready when every node sees the cluster ok and every replica in place, and
# every replica has finished its first sync.
ready() {
  local port=$1
  redis-cli -h 127.0.0.1 -p "$port" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || return 1
  [ "$(redis-cli -h 127.0.0.1 -p "$port" cluster nodes | awk '$3 ~ /slave/' | wc -l)" -eq $((${#ports[@]} / 2)) ] || return 1
  ! redis-cli -h 127.0.0.1 -p "$port" info replication | grep -q 'master_link_status:down'
}
for port in "${ports[@]}"; do
  for _ in $(seq 1 300); do
    ready "$port" && break
    sleep 0.1
  done
  ready "$port" || { echo "redis-cluster.sh: the node on port $port never saw the cluster ready" >&2; exit 1; }
done
