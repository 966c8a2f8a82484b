#!/usr/bin/env bash
# Instructions the gateway executes per request, counted by callgrind, so
# that two builds can be compared on a loaded machine (callgrind counts
# instructions, not seconds). BENCHMARKS.md, "Instructions per gateway
# request"; the method: benchmarks/log.md, "Issue 16: the gateway before and
# after its fix".
#
#   scripts/gateway-instructions.sh [IDEM_BINARY]   # default: target/release/idem
#
# IDEM_STORE picks the gateway's store (default `memory:`; e.g.
# `redis://127.0.0.1:6379?prefix=cg:`); CALLGRIND_KEEP=DIR keeps the two
# profiles there (new.cg, replay.cg) for `callgrind_annotate --inclusive=yes`.
#
# Runs `idem ledger` natively and `idem serve --store $IDEM_STORE` under
# valgrind; after 100 warm-up requests and 50 placed keys, counts 1,000
# sequential keep-alive POSTs with fresh keys, then 1,000 replays of the 50.
# The keys' length moves the count (the body is hashed in 64-byte blocks),
# so compare builds only with this script's keys.
set -euo pipefail
bin="$(realpath "${1:-target/release/idem}")"
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
cd "$work"
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
ledger=$(free_port); gateway=$(free_port); admin=$(free_port)
"$bin" ledger --listen "127.0.0.1:$ledger" >/dev/null 2>&1 &
valgrind --tool=callgrind --callgrind-out-file="$work/cg.%p" "$bin" serve --store "${IDEM_STORE:-memory:}" \
  --listen "127.0.0.1:$gateway" --admin-listen "127.0.0.1:$admin" \
  --upstream "http://127.0.0.1:$ledger" >/dev/null 2>"$work/valgrind.log" &
served=$!
for _ in $(seq 1 600); do (echo >"/dev/tcp/127.0.0.1/$gateway") 2>/dev/null && break; sleep 0.5; done

send() { # KIND N RUN: POSTs, fresh keys ("new") or the 50 placed ("replay")
  python3 - "$gateway" "$@" <<'PY'
import http.client, json, sys
port, kind, n, run = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
c = http.client.HTTPConnection("127.0.0.1", port)
ok = 0
for i in range(n):
    key = f"new-{run}-{i % 50}" if kind == "replay" else f"{kind}-{run}-{i}"
    c.request("POST", "/orders", body=json.dumps({"order": key, "sku": "A", "qty": 1, "cents": 100}),
              headers={"idempotency-key": key, "content-type": "application/json"})
    r = c.getresponse(); r.read(); ok += 200 <= r.status < 300
assert ok == n, f"{ok} of {n} answered 2xx"
PY
}
send warm 100 w
send new 50 r
for kind in new replay; do
  callgrind_control -z "$served" >/dev/null 2>&1
  if [ "$kind" = new ]; then send new 1000 x; else send replay 1000 r; fi
  callgrind_control -d "$kind" "$served" >/dev/null 2>&1
  file=$(grep -l "Trigger: dump $kind" "$work"/cg.* | head -1)
  total=$(grep -m1 '^summary:' "$file" | cut -d' ' -f2)
  echo "$kind: $((total / 1000)) instructions per request ($total for 1000)"
  if [ -n "${CALLGRIND_KEEP:-}" ]; then cp "$file" "$CALLGRIND_KEEP/$kind.cg"; fi
done
