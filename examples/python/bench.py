"""The cost of one guarded call in Python — begin then complete on a new key,
through the component, over the dict store — as ns/op, for
examples/bench-hosts.sh. `python bench.py [OPS]`"""

import sys
import time
from importlib.metadata import version

from idem_guard import Guard, MemoryStore, Response

ops = int(sys.argv[1]) if len(sys.argv) > 1 else 5_000
guard = Guard.load(store=MemoryStore())
response = Response(200, [("content-type", b"text/plain")], b"paid")


def call(key: str) -> None:
    kind, claim = guard.begin(key, "sku=A&qty=1")
    if kind != "proceed":
        raise AssertionError(f"a new key must proceed, got {kind}")
    guard.complete(claim, response)


for i in range(ops // 10):
    call(f"warm-{i}")
start = time.perf_counter_ns()
for i in range(ops):
    call(f"order-{i}")
ns = (time.perf_counter_ns() - start) // ops
print(f"python  wasmtime-py {version('wasmtime'):<7} begin+complete  {ops} ops  {ns} ns/op")
