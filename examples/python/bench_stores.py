"""The cost of one guarded call on Redis (and PostgreSQL, when its URL is set)
from Python, next to the raw commands of the same claim and completion in
the same run. Within each round the rows take turns every twentieth of the
keys (the order reversed every other round), so a busy machine slows them
alike; the median round is printed, wall-clock and this process's CPU time per
call (on a shared machine the two part when the process waits for a core),
and each row's wall-clock and CPU time over its raw row's.
`python bench_stores.py [OPS] [ROUNDS] [--before SRC]`, with IDEM_TEST_REDIS_URL
(default redis://127.0.0.1:6379) and, optionally, IDEM_TEST_POSTGRES_URL; keys
go under `idembench_{pid}_`, removed afterwards. `--before SRC` adds the
`Guard`, `AsyncGuard` and decorator rows of another copy of the package (SRC:
the directory holding its `idem_guard`, e.g. a checkout of the previous commit's
`packages/python/src`), marked "(before)", taking turns with this one's.

- guard: `Guard.begin` + `Guard.complete` on a new key over `RedisStore` (the
  component's imports call it inline: one `SET NX GET`, one `EVALSHA replace`).
- async guard: the same through `AsyncGuard` over `AsyncRedisStore` (each call
  replayed from a journal: two runs of the export per call, the store awaited
  in between).
- raw: redis-py's `SET key v NX PX` then `SET key v PX` (sync and asyncio): the
  two round trips any claim-then-complete needs, with nothing decided.
- raw asyncio streams: the same two commands written on an `asyncio` stream
  and read back with no client at all: the floor under any asyncio client.
- AsyncRedisStore's connection: the same two commands through the store's
  own `_pipeline` (its transport protocol), no guard.
- decorator: idem_guard's `@idempotent_function` on a new payload over
  `RedisStore` (the key is the payload's hash, as Powertools' is by default).
- powertools: AWS Lambda Powertools' `@idempotent_function` over its
  `RedisCachePersistenceLayer` on the same Redis (local cache off), when
  `aws-lambda-powertools` (and `boto3`, which it imports) is installed:
  `pip install -r requirements-bench.txt` (pinned).
- PostgreSQL: `Guard` over `PostgresStore` next to a raw prepared
  `INSERT … ON CONFLICT DO NOTHING` then `UPDATE` on a table of its own.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
import statistics
import sys
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
import redis.asyncio as aredis

import idem_guard
from idem_guard import AsyncGuard, Guard, Response

argv = sys.argv[1:]
before_src: str | None = None
if "--before" in argv:
    at = argv.index("--before")
    before_src = argv[at + 1]
    del argv[at : at + 2]
ops = int(argv[0]) if len(argv) > 0 else 2_000
rounds = int(argv[1]) if len(argv) > 1 else 5
redis_url = os.environ.get("IDEM_TEST_REDIS_URL") or "redis://127.0.0.1:6379"
postgres_url = os.environ.get("IDEM_TEST_POSTGRES_URL")
prefix = f"idembench_{os.getpid()}_"
response = Response(200, [("content-type", b"text/plain")], b"paid")
value = b"x" * 120  # about a record's size
# The package's tests (packages/python/tests): the memory floor's store is theirs (stores.py).
TESTS = Path(__file__).resolve().parents[2] / "packages" / "python" / "tests"


def timed(keys: range, call: Callable[[int], Any]) -> tuple[int, int]:
    """Wall-clock and CPU nanoseconds `call` took over `keys`."""
    cpu, start = time.process_time_ns(), time.perf_counter_ns()
    for i in keys:
        call(i)
    return time.perf_counter_ns() - start, time.process_time_ns() - cpu


def timed_async(loop: asyncio.AbstractEventLoop, keys: range, call: Callable[[int], Any]) -> tuple[int, int]:
    async def body() -> tuple[int, int]:
        cpu, start = time.process_time_ns(), time.perf_counter_ns()
        for i in keys:
            await call(i)
        return time.perf_counter_ns() - start, time.process_time_ns() - cpu

    return loop.run_until_complete(body())


def guarded(guard: Any) -> Callable[[str], Callable[[int], None]]:
    """The row of `guard.begin` + `guard.complete` on new keys."""

    def row(tag: str) -> Callable[[int], None]:
        def call(i: int) -> None:
            kind, claim = guard.begin(f"{tag}{i}", "sku=A&qty=1")
            assert kind == "proceed", kind
            guard.complete(claim, response)

        return call

    return row


def aguarded(guard: Any) -> Callable[[str], Callable[[int], Any]]:
    """The row of `await guard.begin` + `await guard.complete` on new keys (an `AsyncGuard`)."""

    def row(tag: str) -> Callable[[int], Any]:
        async def call(i: int) -> None:
            kind, claim = await guard.begin(f"{tag}{i}", "sku=A&qty=1")
            assert kind == "proceed", kind
            await guard.complete(claim, response)

        return call

    return row


def package_rows(pkg: Any, tag: str, closers: list[Callable[[], Any]], loop: asyncio.AbstractEventLoop) -> dict[str, Callable[[str], Callable[[int], Any]]]:
    """The rows of one copy of the package (`idem_guard`, or the `--before` one): `Guard`,
    `AsyncGuard` and the decorator on Redis; `tag` goes after each row's name."""
    stores = importlib.import_module(pkg.__name__ + ".redis")
    store = stores.RedisStore(redis_url, prefix=f"{prefix}g{tag}:")
    astore = stores.AsyncRedisStore(redis_url, prefix=f"{prefix}a{tag}:")
    guard = pkg.Guard(store=store)
    aguard = pkg.AsyncGuard(store=astore)
    decorated_guard = pkg.Guard(store=stores.RedisStore(redis_url, prefix=f"{prefix}d{tag}:"))
    closers += [store.close, lambda: loop.run_until_complete(astore.close()), decorated_guard.store.close]

    @pkg.idempotent_function(guard=decorated_guard, data_keyword_argument="order")
    def pay_idem(order: dict[str, Any]) -> dict[str, Any]:
        return {"status": 200, "body": "paid"}

    def decorated(tag: str) -> Callable[[int], None]:
        def call(i: int) -> None:
            pay_idem(order={"id": f"{prefix}{tag}{i}", "sku": "A", "qty": 1})

        return call

    def wire_pair(tag: str) -> Callable[[int], Any]:
        async def call(i: int) -> None:
            key = f"{astore.prefix}w:{tag}{i}"
            assert await astore._pipeline((("SET", key, value, "NX", "PX", 86_400_000),)) == [b"OK"]
            await astore._pipeline((("SET", key, value, "PX", 86_400_000),))

        return call

    return {
        f"redis raw SET NX + SET (AsyncRedisStore's connection){tag}": wire_pair,
        f"redis Guard begin+complete{tag}": guarded(guard),
        f"redis AsyncGuard begin+complete{tag}": aguarded(aguard),
        f"redis idem_guard @idempotent_function{tag}": decorated,
    }


def before_package(src: str) -> Any:
    """The package under `src` imported as `idem_guard_before` (its imports within are relative)."""
    path = os.path.join(src, "idem_guard")
    spec = importlib.util.spec_from_file_location("idem_guard_before", os.path.join(path, "__init__.py"), submodule_search_locations=[path])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["idem_guard_before"] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    loop = asyncio.new_event_loop()
    raw = redis.Redis.from_url(redis_url)
    araw = aredis.Redis.from_url(redis_url)
    closers: list[Callable[[], Any]] = []
    ours = package_rows(idem_guard, "", closers, loop)
    before = package_rows(before_package(before_src), " (before)", closers, loop) if before_src else {}

    def raw_pair(tag: str) -> Callable[[int], None]:
        def call(i: int) -> None:
            key = f"{prefix}r:{tag}{i}"
            assert raw.set(key, value, nx=True, px=86_400_000)
            raw.set(key, value, px=86_400_000)

        return call

    def araw_pair(tag: str) -> Callable[[int], Any]:
        async def call(i: int) -> None:
            key = f"{prefix}ra:{tag}{i}"
            assert await araw.set(key, value, nx=True, px=86_400_000)
            await araw.set(key, value, px=86_400_000)

        return call

    url = urllib.parse.urlsplit(redis_url)
    streams = loop.run_until_complete(asyncio.open_connection(url.hostname or "127.0.0.1", url.port or 6379))

    def stream_pair(tag: str) -> Callable[[int], Any]:
        reader, writer = streams

        async def call(i: int) -> None:
            key = f"{prefix}rs:{tag}{i}".encode()
            writer.write(b"*6\r\n$3\r\nSET\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n$2\r\nNX\r\n$2\r\nPX\r\n$8\r\n86400000\r\n" % (len(key), key, len(value), value))
            assert await reader.readexactly(5) == b"+OK\r\n"
            writer.write(b"*5\r\n$3\r\nSET\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n$2\r\nPX\r\n$8\r\n86400000\r\n" % (len(key), key, len(value), value))
            assert await reader.readexactly(5) == b"+OK\r\n"

        return call

    # The floor under AsyncGuard's row: its component calls and journal replays over an
    # asynchronous store that answers from memory (no I/O, the package tests' `AsyncMemory`):
    # add the streams row for the round trips. No purge: it would run batches on the loop.
    sys.path.insert(0, str(TESTS))
    from stores import AsyncMemory

    amemory = aguarded(AsyncGuard(store=AsyncMemory(), purge_every_ms=0))

    rows: dict[str, Callable[[str], Callable[[int], Any]]] = {
        "redis raw SET NX + SET (redis-py)": raw_pair,
        "redis raw SET NX + SET (asyncio)": araw_pair,
        "redis raw SET NX + SET (asyncio streams)": stream_pair,
        "memory AsyncGuard begin+complete (async store, no I/O)": amemory,
        **ours,
        **before,
    }
    asynchronous = {name for name in rows if "asyncio" in name or "Async" in name}

    try:
        from aws_lambda_powertools.utilities import idempotency as powertools
        from aws_lambda_powertools.utilities.idempotency.persistence.redis import RedisCachePersistenceLayer
    except ImportError:
        print("(aws-lambda-powertools not installed: no Powertools row)")
    else:
        import warnings

        # Outside Lambda it warns on every call that it has no Lambda context.
        warnings.filterwarnings("ignore", message="Couldn't determine the remaining time")
        layer = RedisCachePersistenceLayer(client=redis.Redis.from_url(redis_url))
        # Its records expire on their own a minute after the run.
        config = powertools.IdempotencyConfig(use_local_cache=False, expires_after_seconds=60)

        @powertools.idempotent_function(data_keyword_argument="order", persistence_store=layer, config=config)
        def pay(order: dict) -> dict:
            return {"status": 200, "body": "paid"}

        def powertools(tag: str) -> Callable[[int], None]:
            def call(i: int) -> None:
                pay(order={"id": f"{prefix}{tag}{i}", "sku": "A", "qty": 1})

            return call

        rows["redis Powertools @idempotent_function"] = powertools

    pg: Any = None
    if postgres_url:
        import psycopg

        from idem_guard.postgres import PostgresStore

        table = f"idembench_{os.getpid()}"
        pg = PostgresStore(postgres_url, table=table, pool=1)
        conn = psycopg.connect(postgres_url, autocommit=True, prepare_threshold=0)
        conn.execute(f"CREATE TABLE {table}_raw (key TEXT PRIMARY KEY, v BYTEA, version BIGINT)")

        def pg_raw(tag: str) -> Callable[[int], None]:
            def call(i: int) -> None:
                key = f"{tag}{i}"
                conn.execute(f"INSERT INTO {table}_raw VALUES (%s, %s, 1) ON CONFLICT (key) DO NOTHING", (key, value))
                conn.execute(f"UPDATE {table}_raw SET v = %s, version = 2 WHERE key = %s AND version = 1", (value, key))

            return call

        rows["postgres raw INSERT + UPDATE"] = pg_raw
        rows["postgres Guard begin+complete"] = guarded(Guard(store=pg))

    # Within a round the rows take turns every `block` keys, so a change in the
    # machine's load (other processes on its cores) falls on all of them alike.
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
    block = max(1, ops // 20)
    try:
        for r in range(rounds):
            order = list(rows) if r % 2 == 0 else list(reversed(rows))
            calls = {name: rows[name](f"{r}-") for name in order}
            spent = {name: [0, 0] for name in order}
            for name in order:
                warm = rows[name](f"warm{r}-")
                if name in asynchronous:
                    timed_async(loop, range(max(1, ops // 10)), warm)
                else:
                    timed(range(max(1, ops // 10)), warm)
            for start in range(0, ops, block):
                keys = range(start, min(ops, start + block))
                for name in order:
                    if name in asynchronous:
                        wall, cpu = timed_async(loop, keys, calls[name])
                    else:
                        wall, cpu = timed(keys, calls[name])
                    spent[name][0] += wall
                    spent[name][1] += cpu
            for name in order:
                results[name].append((spent[name][0] / ops, spent[name][1] / ops))
    finally:
        keys = list(raw.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(keys), 1000):
            raw.delete(*keys[i : i + 1000])
        raw.close()
        for close in closers:
            close()
        loop.run_until_complete(araw.aclose())
        streams[1].close()
        loop.close()
        if pg is not None:
            pg.close()
            t = pg.table
            for statement in (
                f"DROP TABLE {t}_raw",
                f"DROP TABLE {t}",
                f"DROP FUNCTION {t}_claim",
                f"DROP FUNCTION {t}_try_claim",
                f"DELETE FROM idem_schema WHERE table_name = '{t}'",
            ):
                conn.execute(statement, prepare=False)
            conn.close()

    print(f"load average: {' '.join(open('/proc/loadavg').read().split()[:3])}")
    baseline = {False: "redis raw SET NX + SET (redis-py)", True: "redis raw SET NX + SET (asyncio)"}
    wall = {name: statistics.median(w for w, _ in times) / 1000 for name, times in results.items()}
    cpu = {name: statistics.median(c for _, c in times) / 1000 for name, times in results.items()}
    peer = "redis Powertools @idempotent_function"
    for name in results:
        raw_row = "postgres raw INSERT + UPDATE" if name.startswith("postgres") else baseline[name in asynchronous]
        ratio = f"{wall[name] / wall[raw_row]:.2f}x its raw row (cpu {cpu[name] / cpu[raw_row]:.2f}x)" if raw_row in wall else ""
        if name.startswith("redis idem_guard @idempotent_function") and peer in wall:
            ratio += f", {wall[name] / wall[peer]:.2f}x Powertools' (cpu {cpu[name] / cpu[peer]:.2f}x)"
        print(
            f"python  {name:<63} {ops:>6} ops  {wall[name]:>8.1f} µs/op  {cpu[name]:>7.1f} cpu-µs/op  "
            f"(median of {rounds})  {ratio}"
        )


if __name__ == "__main__":
    main()
