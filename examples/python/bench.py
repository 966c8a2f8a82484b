"""The cost of one guarded call in Python, through the component, over the dict
store, with each binding: `dynamic` (wasmtime-py's component API, the binding
before issue 17) and `static` (idem_guard.abi, the guard's). Rounds alternate the
bindings so a busy machine slows both alike; the median round is printed
(wall-clock and this process's CPU time per call: on a shared machine the two
part when the process waits for a core), then the ratio. For
examples/bench-hosts.sh. `python bench.py [OPS] [ROUNDS]`

- begin+complete: a new key, as examples/bench-hosts.sh compares across hosts.
- run: `Guard.run` on a new key with lease renewal armed (the default).
- replay: `begin` on a completed key.
"""

import statistics
import sys
import time
from importlib.metadata import version

from idem_guard import Guard, MemoryStore, Response

ops = int(sys.argv[1]) if len(sys.argv) > 1 else 5_000
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
response = Response(200, [("content-type", b"text/plain")], b"paid")
BINDINGS = {"dynamic": "component API", "static": "canonical ABI"}
CALLS = ("begin+complete", "run", "replay")


def begin_complete(guard: Guard, key: str) -> None:
    kind, claim = guard.begin(key, "sku=A&qty=1")
    if kind != "proceed":
        raise AssertionError(f"a new key must proceed, got {kind}")
    guard.complete(claim, response)


def run(guard: Guard, key: str) -> None:
    if guard.run(key, "sku=A&qty=1", lambda _fence: response).kind != "executed":
        raise AssertionError("a new key must execute")


def replay(guard: Guard, _key: str) -> None:
    if guard.begin("done", "sku=A&qty=1")[0] != "replay":
        raise AssertionError("a completed key must replay")


def measure(binding: str, call: str, n: int, round_: int) -> tuple[float, float]:
    guard = Guard.load(store=MemoryStore(), binding=binding)
    begin_complete(guard, "done")
    fn = {"begin+complete": begin_complete, "run": run, "replay": replay}[call]
    for i in range(max(1, n // 10)):
        fn(guard, f"warm-{round_}-{i}")
    cpu, start = time.process_time_ns(), time.perf_counter_ns()
    for i in range(n):
        fn(guard, f"order-{round_}-{i}")
    return (time.perf_counter_ns() - start) / n, (time.process_time_ns() - cpu) / n


# The dynamic binding is two orders of magnitude slower: a 25th of the ops is plenty.
counts = {"dynamic": max(200, ops // 25), "static": ops}
results: dict[tuple[str, str], list[tuple[float, float]]] = {(b, c): [] for b in BINDINGS for c in CALLS}
for r in range(rounds):
    for call in CALLS:
        for binding in BINDINGS if r % 2 == 0 else reversed(BINDINGS):
            results[(binding, call)].append(measure(binding, call, counts[binding], r))

def wall(binding: str, call: str) -> float:
    return statistics.median(w for w, _ in results[(binding, call)])


def cpu(binding: str, call: str) -> float:
    return statistics.median(c for _, c in results[(binding, call)])


runtime = f"wasmtime-py {version('wasmtime')}"
for binding, what in BINDINGS.items():
    for call in CALLS:
        print(
            f"python  {runtime:<17} {call:<15} {counts[binding]:>6} ops  {wall(binding, call):>9.0f} ns/op  "
            f"{cpu(binding, call):>9.0f} cpu-ns/op  ({binding}: {what}, median of {rounds})"
        )
for call in CALLS:
    ratio = wall("dynamic", call) / wall("static", call)
    cpu_ratio = cpu("dynamic", call) / cpu("static", call)
    print(f"python  dynamic/static    {call:<15} {ratio:>6.1f}x wall  {cpu_ratio:>6.1f}x cpu")
