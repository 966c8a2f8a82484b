"""Why idem_guard.abi calls the guest through wasmtime's C API rather than
wasmtime-py's public API: the cost of one call into the guest (the
component's `cabi_realloc(0, 0, 1, 0)`, which allocates nothing) through the binding's
unchecked path and through `wasmtime.Func.__call__`, side by side in one
process, the median of 7 repeats. A begin+complete makes twelve such
crossings (four exports and their post-returns, the store's imports).
`python bench_crossing.py [CALLS]`, with IDEM_COMPONENT or the installed package's component.
"""

from __future__ import annotations

import statistics
import sys
import timeit
from importlib.metadata import version

from idem_guard import Guard, MemoryStore

calls = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
instance = Guard(store=MemoryStore())._instantiate()
realloc = instance._realloc
store = instance._wasmtime


def unchecked() -> None:
    realloc.params.pack_into(realloc.view, 0, 0, 0, 1, 0)
    instance._invoke(realloc)


def public() -> None:
    realloc.func(store, 0, 0, 1, 0)


results = {}
for _ in range(2):  # the rows alternate, so a change in the machine's load falls on both
    for name, call in (("unchecked (idem_guard.abi)", unchecked), ("wasmtime.Func.__call__", public)):
        results.setdefault(name, []).extend(timeit.repeat(call, number=calls, repeat=4))
median = {name: statistics.median(times) / calls * 1e6 for name, times in results.items()}
for name, us in median.items():
    ratio = us / median["unchecked (idem_guard.abi)"]
    print(f"python  wasmtime-py {version('wasmtime'):<8} {name:<28} {us:8.2f} µs per call  {ratio:6.1f}x")
