#!/usr/bin/env bash
# CPU time (user + system, the kernel's side of its system calls included)
# that `idem serve` spends per request, for two configurations side by side
# in alternating rounds: callgrind (scripts/gateway-instructions.sh) counts
# user-space instructions only, and a log line's write(2) is kernel time.
# BENCHMARKS.md, "Instructions per gateway request".
#
#   scripts/gateway-cpu.sh ROUNDS 'A: ENV… BINARY' 'B: ENV… BINARY'
#   e.g. scripts/gateway-cpu.sh 3 'RUST_LOG=warn target/release/idem' 'RUST_LOG=info target/release/idem'
#
# Each configuration is words `NAME=VALUE` for the gateway's environment,
# then the binary. Per round and configuration: a fresh `idem serve
# --store memory:` in front of `idem ledger`, its stderr (the log) to a file,
# 500 warm-up requests, then N=20000 POSTs with fresh keys and N replays of
# 256 keys, sent over 16 keep-alive connections by a Python client on the
# other core; the gateway's CPU from /proc/PID/stat before and after each.
# Prints µs of CPU per request per round, and each round's B ÷ A.
set -euo pipefail
rounds="$1"; shift
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
ledger=$(free_port)
first_bin=""
for config in "$@"; do first_bin="${config##* }"; break; done
"$first_bin" ledger --listen "127.0.0.1:$ledger" >/dev/null 2>&1 &
N="${N:-20000}"

cat >"$work/drive.py" <<'PY'
import asyncio, json, sys
port, kind, n, run = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
CONNS = 16

def request(key):
    body = json.dumps({"order": key, "sku": "A", "qty": 1, "cents": 100}).encode()
    return (f"POST /orders HTTP/1.1\r\nhost: x\r\nidempotency-key: {key}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body

async def conn(c, out):
    r, w = await asyncio.open_connection("127.0.0.1", port)
    for i in range(c, n, CONNS):
        key = f"placed-{run}-{i % 256}" if kind == "replay" else f"{kind}-{run}-{i}"
        w.write(request(key))
        head = await r.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await r.readexactly(length)
        out[0] += head.startswith(b"HTTP/1.1 2")
    w.close()

async def main():
    out = [0]
    await asyncio.gather(*(conn(c, out) for c in range(CONNS)))
    assert out[0] == n, f"{out[0]} of {n} answered 2xx"

asyncio.run(main())
PY

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
tick=$(getconf CLK_TCK)
declare -A total
for round in $(seq 1 "$rounds"); do
  line="round $round:"
  index=0
  for config in "$@"; do
    index=$((index + 1))
    read -r -a words <<<"$config"
    bin="${words[-1]}"
    unset 'words[-1]'
    gateway=$(free_port)
    env "${words[@]}" "$bin" serve --store memory: --listen "127.0.0.1:$gateway" \
      --upstream "http://127.0.0.1:$ledger" 2>"$work/log.$index" >/dev/null &
    served=$!
    for _ in $(seq 1 200); do (echo >"/dev/tcp/127.0.0.1/$gateway") 2>/dev/null && break; sleep 0.1; done
    python3 "$work/drive.py" "$gateway" warm 500 "w$round"
    python3 "$work/drive.py" "$gateway" placed 256 "p$round"
    for kind in new replay; do
      before=$(cpu_ticks "$served")
      if [ "$kind" = new ]; then python3 "$work/drive.py" "$gateway" new "$N" "n$round"
      else python3 "$work/drive.py" "$gateway" replay "$N" "p$round"; fi
      after=$(cpu_ticks "$served")
      us=$(python3 -c "print(round(($after - $before) / $tick * 1e6 / $N, 2))")
      total[$index.$kind]="$us"
      line="$line $index/$kind ${us}µs"
    done
    kill "$served"; wait "$served" 2>/dev/null || true
    lines=$(wc -l <"$work/log.$index")
    line="$line ($lines log lines)"
  done
  ratios=$(python3 -c "print('B÷A new %.3f replay %.3f' % (${total[2.new]}/${total[1.new]}, ${total[2.replay]}/${total[1.replay]}))")
  echo "$line · $ratios"
done
