"""The Redis and PostgreSQL stores on real servers (`IDEM_TEST_REDIS_URL`,
`IDEM_TEST_POSTGRES_URL`; see tests/stores.py for when they are missing):
every conformance scenario through `Guard` (both bindings) and through
`AsyncGuard`'s journal replay, faults injected beside the store; corrupt
values named by key; a store that cannot be reached fails closed; the
handler runs once under concurrent callers of one key; what one store
writes, the other reads; and the HTTP scenarios (conformance/http) through
the ASGI middleware over the asynchronous stores.

Each test's keys are under a prefix, and its tables named, `idempy_{pid}_…`;
the module removes them afterwards (it never flushes Redis or drops a table
it did not make)."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from idem_guard import AsyncGuard, Guard, GuardError, ManualClock, Response
from idem_guard.types import Record, StoreFault
from stores import RUN, AsyncFaulty, Faulty, server_url, unique
from test_conformance import FILES, load, run_scenario

redis = pytest.importorskip("redis")
psycopg = pytest.importorskip("psycopg")

import redis.asyncio as aredis  # noqa: E402

from idem_guard.postgres import AsyncPostgresStore, PostgresStore  # noqa: E402
from idem_guard.redis import AsyncRedisStore, RedisStore, encode  # noqa: E402

BINDINGS = ["static", "dynamic"]


# --- servers, and what the tests leave on them ------------------------------


def served(var: str) -> Iterator[str]:
    """The server of env var `var`; this run's keys are deleted from it afterwards."""
    url = server_url(var)
    yield url
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{RUN}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    yield from served("IDEM_TEST_REDIS_URL")


@pytest.fixture(scope="module")
def valkey_url() -> Iterator[str]:
    """Valkey 8.1 or later: completions are `SET … IFEQ`, not the script."""
    yield from served("IDEM_TEST_VALKEY_URL")


@pytest.fixture(params=["redis", "valkey"])
def any_redis_url(request: Any) -> str:
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture
def raw_redis(redis_url: str) -> Iterator[Any]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


class Tables:
    """Tables a test opens stores on; dropped (with what the schema made beside them) at the end."""

    def __init__(self, url: str):
        self.url = url
        self.made: list[str] = []

    def new(self) -> str:
        table = unique("t")
        self.made.append(table)
        return table

    def sql(self, text: str, params: Any = None) -> list:
        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(text, params)
            return cur.fetchall() if cur.description is not None else []

    def drop(self) -> None:
        for t in self.made:
            assert t.startswith(RUN)
            self.sql(
                f"DROP TABLE IF EXISTS {t}; DROP FUNCTION IF EXISTS {t}_claim; DROP FUNCTION IF EXISTS {t}_try_claim; "
                f"DELETE FROM idem_schema WHERE table_name = '{t}'"
            )


@pytest.fixture(scope="module")
def postgres_url() -> str:
    return server_url("IDEM_TEST_POSTGRES_URL")


@pytest.fixture(scope="module")
def tables(postgres_url: str) -> Iterator[Tables]:
    made = Tables(postgres_url)
    yield made
    made.drop()


@pytest.fixture(scope="module")
def scenario_table(tables: Tables) -> str:
    """One table for the scenarios, made at once; each empties it first (as the Rust run does)."""
    table = tables.new()
    PostgresStore(tables.url, table=table).close()
    return table


# --- every conformance scenario ---------------------------------------------


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("name", FILES)
def test_conformance_on_redis(any_redis_url: str, name: str, binding: str) -> None:
    with RedisStore(any_redis_url, prefix=unique("scenario") + ":") as store:
        assert run_scenario(load(name), binding, store=Faulty(store)) > 0


@pytest.mark.parametrize("name", FILES)
def test_conformance_on_async_redis_by_journal_replay(any_redis_url: str, name: str) -> None:
    loop = asyncio.new_event_loop()  # the client's connections belong to one loop: the scenario's
    store = AsyncRedisStore(any_redis_url, prefix=unique("scenario") + ":")
    try:
        assert run_scenario(load(name), store=AsyncFaulty(store), loop=loop) > 0
    finally:
        loop.run_until_complete(store.close())
        loop.close()


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("name", FILES)
def test_conformance_on_postgres(tables: Tables, scenario_table: str, name: str, binding: str) -> None:
    with PostgresStore(tables.url, table=scenario_table, pool=2) as store:
        tables.sql(f"DELETE FROM {scenario_table}")
        assert run_scenario(load(name), binding, store=Faulty(store)) > 0


@pytest.mark.parametrize("name", FILES)
def test_conformance_on_async_postgres_by_journal_replay(tables: Tables, scenario_table: str, name: str) -> None:
    tables.sql(f"DELETE FROM {scenario_table}")
    loop = asyncio.new_event_loop()  # the pool's tasks live on the loop that opens it: the scenario runs there too
    try:
        store = loop.run_until_complete(AsyncPostgresStore.open(tables.url, table=scenario_table, pool=2))
        try:
            assert run_scenario(load(name), store=AsyncFaulty(store), loop=loop) > 0
        finally:
            loop.run_until_complete(store.close())
    finally:
        loop.close()


# --- Redis ------------------------------------------------------------------

NOW = 1_700_000_000_000


def record(expires_at_ms: int = NOW + 10_000, holder: int = 7, state: str = "processing") -> Record:
    response = Response(200, [("etag", b"\x00\xff")], b"paid") if state == "done" else None
    return Record("sha256:fp", state, holder, NOW + 1_000, expires_at_ms, response)


def test_redis_stores_the_layouts_value_with_px_from_the_guards_clock(redis_url: str, raw_redis: Any) -> None:
    prefix = unique("px") + ":"
    with RedisStore(redis_url, prefix=prefix, grace_ms=5_000) as store:
        assert store.insert("k", record(), NOW) == 1
        assert raw_redis.get(prefix + "k") == encode(1, record())
        assert 15_000 - 2_000 < raw_redis.pttl(prefix + "k") <= 15_000, "PX = expires - now + grace"
        # Expired by the guard's clock but still held by Redis: claimed again at version + 1 (the script).
        assert store.insert("k", record(NOW + 20_000), NOW + 10_000) == 2
        assert raw_redis.get(prefix + "k") == encode(2, record(NOW + 20_000))
        assert store.replace("k", 2, record(NOW + 30_000, state="done"), NOW + 10_001) is True
        assert raw_redis.get(prefix + "k") == encode(3, record(NOW + 30_000, state="done")), "written at expected + 1"
        assert store.replace("k", 2, record(NOW + 30_000), NOW + 10_001) is False, "a stale version is refused"
        assert store.get("k", NOW + 30_000) is None, "not live at its expiry"
        assert store.delete("k", 3, NOW + 30_000) is False, "an expired record is left alone (Redis drops it)"
        assert raw_redis.exists(prefix + "k") == 1
        assert store.delete("k", 2, NOW) is False and store.delete("k", 3, NOW) is True
        assert raw_redis.exists(prefix + "k") == 0


def test_what_the_sync_redis_store_writes_the_async_one_reads(redis_url: str) -> None:
    prefix = unique("shared") + ":"
    holder = (1 << 64) - 2
    with RedisStore(redis_url, prefix=prefix) as store:
        assert store.insert("k", record(holder=holder, state="done"), NOW) == 1

    async def read() -> Any:
        async with AsyncRedisStore(redis_url, prefix=prefix) as store:
            return await store.get("k", NOW)

    entry = asyncio.run(read())
    assert entry is not None and entry.version == 1 and entry.record == record(holder=holder, state="done")


def test_a_redis_value_that_does_not_decode_is_corrupt_naming_the_key_and_the_guard_fails_closed(
    redis_url: str, raw_redis: Any
) -> None:
    prefix = unique("corrupt") + ":"
    raw_redis.set(prefix + "garbage", b"\x00\x01 not a record")
    raw_redis.hset(prefix + "hash", "field", "value")
    ran: list[int] = []
    with RedisStore(redis_url, prefix=prefix) as store:
        for key in ("garbage", "hash"):
            for call in (lambda k=key: store.get(k, NOW), lambda k=key: store.insert(k, record(), NOW)):
                with pytest.raises(StoreFault) as fault:
                    call()
                assert fault.value.kind == "corrupt" and repr(key) in str(fault.value), str(fault.value)
        with pytest.raises(StoreFault) as fault:
            store.replace("hash", 1, record(), NOW)  # inside the script
        assert fault.value.kind == "corrupt", str(fault.value)
        # An error reply (READONLY after a failover alike) drops the connection: the next command connects afresh.
        assert all(conn._sock is None for conn in store._idle), "a connection that got an error reply was kept"
        outcome = Guard(store=store).run("garbage", "fp", lambda fence: ran.append(fence) or Response(200))
    assert outcome.kind == "unavailable" and "garbage" in outcome.message and ran == []


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_store_error_from_redis_replace_reaches_the_guest_as_err_not_a_trap(
    redis_url: str, raw_redis: Any, binding: str
) -> None:
    # `replace` is `result<option<u64>, store-error>`, the shape wasmtime-py 51.0.0
    # (as 50.0.1) cannot lower an `err` for without idem_guard.component's fix (the dynamic
    # binding): here the error is the store's own (a key that turned into a hash).
    prefix = unique("replace-err") + ":"
    with RedisStore(redis_url, prefix=prefix) as store:
        guard = Guard(store=store, binding=binding, renew_lease=False)
        _, claim = guard.begin("k", "fp")
        raw_redis.delete(prefix + "k")
        raw_redis.hset(prefix + "k", "field", "value")
        with pytest.raises(GuardError) as err:
            guard.complete(claim, Response(200, [], b"x"))
        assert err.value.kind == "unavailable" and guard.replaced == 0, (err.value, guard.replaced)
        assert "replace" in err.value.detail and "corrupt" in err.value.detail and "not a string" in err.value.detail


class Spied(RedisStore):
    """A RedisStore that notes the name and options of every command it sends, but the
    readings of the server's clock (time.lua), which its thread takes whenever it likes."""

    def _opened(self) -> None:
        self.sent: list[str] = []
        super()._opened()

    def _pipeline(self, batch: tuple[tuple[Any, ...], ...]) -> list[Any]:
        if not any(args[:2] == ("EVALSHA", self._shas["time"]) for args in batch):
            self.sent.extend(" ".join(str(a) for a in args if not isinstance(a, bytes)) for args in batch)
        return super()._pipeline(batch)


def checkpointed(fence: int, attempt: Any) -> Response:
    attempt.save_checkpoint("charged", b"ch-1")
    return Response(201, [], b"paid")


def test_on_valkey_a_guarded_call_completes_with_set_ifeq_and_no_script_and_other_bytes_are_refused(valkey_url: str) -> None:
    prefix = unique("ifeq") + ":"
    with Spied(valkey_url, prefix=prefix) as store:
        assert store.native_cas is None, "asked at the first completion"
        guard = Guard(store=store)
        first, again = guard.run("order", "fp", checkpointed), guard.run("order", "fp", checkpointed)
        assert (first.kind, again.kind, again.response.body) == ("executed", "replayed", b"paid")
        assert store.native_cas is True
        assert sum("IFEQ" in c for c in store.sent) == 3, "the probe, the checkpoint and the completion"
        assert not any(c.startswith("EVALSHA") for c in store.sent)
        # Another writer's bytes at the same version (a claim after the key was dropped): refused, left as they are.
        theirs = encode(1, record(holder=99))
        assert store.insert("k", record(), NOW) == 1
        raw = redis.Redis.from_url(valkey_url)
        raw.set(prefix + "k", theirs, px=60_000)
        assert store.replace("k", 1, record(state="done"), NOW) is False
        assert raw.get(prefix + "k") == theirs
        raw.close()

    async def main() -> tuple[str, Any]:
        store = AsyncRedisStore(valkey_url, prefix=prefix)
        try:
            async def handler(fence: int, attempt: Any) -> Response:
                await attempt.save_checkpoint("charged", b"ch-1")
                return Response(201, [], b"async")

            outcome = await AsyncGuard(store=store).run("async-order", "fp", handler)
            return outcome.kind, store.native_cas
        finally:
            await store.close()

    assert asyncio.run(main()) == ("executed", True)


def test_on_redis_7_or_with_cas_script_a_completion_runs_the_script(redis_url: str, valkey_url: str) -> None:
    with Spied(redis_url, prefix=unique("ifeq") + ":") as store:
        assert Guard(store=store).run("order", "fp", checkpointed).kind == "executed"
        assert store.native_cas is False, "Redis 7 answered the probe with a syntax error"
        assert sum(c.startswith("EVALSHA") for c in store.sent) == 2
    with Spied(valkey_url, prefix=unique("ifeq") + ":", cas="script") as store:
        assert store.native_cas is False
        assert Guard(store=store).run("order", "fp", checkpointed).kind == "executed"
        assert not any("IFEQ" in c for c in store.sent), "no probe, no IFEQ"
    with pytest.raises(ValueError, match="cas 'ifeq' is not one of 'auto', 'script'"):
        RedisStore(redis_url, cas="ifeq")


def test_a_script_the_server_has_not_seen_is_loaded_on_noscript(redis_url: str, raw_redis: Any) -> None:
    with RedisStore(redis_url, prefix=unique("noscript") + ":") as store:
        # The same script with a comment no server has seen: EVALSHA answers NOSCRIPT first.
        text = store._scripts["replace"] + f"\n-- {store.prefix}\n"
        store._scripts["replace"] = text
        store._shas["replace"] = hashlib.sha1(text.encode()).hexdigest()
        assert raw_redis.script_exists(store._shas["replace"]) == [False]
        assert store.insert("k", record(), NOW) == 1
        assert store.replace("k", 1, record(), NOW) is True
        assert raw_redis.script_exists(store._shas["replace"]) == [True]


def test_a_redis_server_that_cannot_be_reached_fails_closed_sync_and_async() -> None:
    ran: list[int] = []
    handler = lambda fence: ran.append(fence) or Response(200)  # noqa: E731
    with RedisStore("redis://127.0.0.1:1", timeout_ms=500) as store:
        with pytest.raises(StoreFault) as fault:
            store.get("k", NOW)
        assert fault.value.kind == "unavailable" and "redis" in str(fault.value)
        outcome = Guard(store=store).run("k", "fp", handler)
        assert outcome.kind == "unavailable"
        # Its clock was never read: the guard fails closed before it asks the store, saying why.
        assert "the store's clock is not known: the Redis server's clock (TIME) has not been read yet" in outcome.message
        assert "reading it failed: StoreFault: redis: ConnectionError" in outcome.message, outcome.message

    async def main() -> Any:
        async with AsyncRedisStore("redis://127.0.0.1:1", timeout_ms=500) as store:
            return await AsyncGuard(store=store).run("k", "fp", handler)

    outcome = asyncio.run(main())
    assert outcome.kind == "unavailable" and "the Redis server's clock (TIME) has not been read yet" in outcome.message
    assert ran == []


def run_in_threads(guards: list[Guard], key: str) -> tuple[list[int], list[str]]:
    """Each guard runs `key` on a thread of its own, all released at once; the handler takes 50 ms."""
    ran: list[int] = []
    kinds: list[str] = []
    start = threading.Barrier(len(guards))

    def handler(fence: int) -> Response:
        ran.append(fence)
        time.sleep(0.05)
        return Response(200, [], b"once")

    def worker(guard: Guard) -> None:
        start.wait()
        kinds.append(guard.run(key, "fp", handler).kind)

    threads = [threading.Thread(target=worker, args=(g,)) for g in guards]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ran, kinds


async def run_concurrently(guard: AsyncGuard, key: str, n: int) -> tuple[list[int], list[str]]:
    ran: list[int] = []

    async def handler(fence: int) -> Response:
        ran.append(fence)
        await asyncio.sleep(0.05)
        return Response(200, [], b"once")

    outcomes = await asyncio.gather(*(guard.run(key, "fp", handler) for _ in range(n)))
    return ran, [o.kind for o in outcomes]


def test_eight_threads_of_guard_run_on_one_redis_key_run_the_handler_once(redis_url: str) -> None:
    with RedisStore(redis_url, prefix=unique("threads") + ":") as store:
        ran, kinds = run_in_threads([Guard(store=store) for _ in range(8)], "k")
    assert ran == [1] and kinds.count("executed") == 1 and set(kinds) <= {"executed", "in-flight", "replayed"}, kinds


def test_twenty_concurrent_async_runs_on_one_redis_key_run_the_handler_once(redis_url: str) -> None:
    async def main() -> tuple[list[int], list[str], int]:
        # No periodic reading during the test (an hour): only the first ones are counted.
        store = AsyncRedisStore(redis_url, prefix=unique("tasks") + ":", clock_sync_ms=3_600_000)
        try:
            # The first calls, all at once: they share one reading of the server's clock.
            ran, kinds = await run_concurrently(AsyncGuard(store=store), "k", 20)
            return ran, kinds, store.clock.readings
        finally:
            await store.close()

    ran, kinds, readings = asyncio.run(main())
    assert ran == [1] and sorted(kinds) == ["executed"] + ["in-flight"] * 19, kinds
    assert readings == 1, "one reading for the burst of first calls"


def test_a_guarded_call_through_a_redis_cluster_client_runs_once_and_replays_sync_and_async() -> None:
    """`client=` a redis-py cluster client: the stores send each command through it (routed by
    key), and a repeat replays the stored response (`SET … NX GET` answers the record it found,
    not redis-py's bool)."""
    url = server_url("IDEM_TEST_REDIS_CLUSTER_URL")
    host, _, port = urllib.parse.urlsplit(url).netloc.split(",")[0].rpartition(":")
    prefix = unique("cluster") + ":"
    client = redis.RedisCluster(host=host, port=int(port))
    try:
        with RedisStore(client=client, prefix=prefix) as store:
            guard = Guard(store=store)
            first = guard.run("k", "fp", lambda fence: Response(201, [], b"once"))
            again = guard.run("k", "fp", lambda fence: Response(500))
        assert (first.kind, again.kind, again.response.body) == ("executed", "replayed", b"once"), (first, again)
    finally:
        client.delete(prefix + "k")
        client.close()

    async def main() -> tuple[list[int], list[str], Any]:
        aclient = aredis.RedisCluster(host=host, port=int(port))
        try:
            async with AsyncRedisStore(client=aclient, prefix=prefix) as store:
                guard = AsyncGuard(store=store)
                ran, kinds = await run_concurrently(guard, "a", 8)
                return ran, kinds, await guard.run("a", "fp", lambda fence: Response(500))
        finally:
            await aclient.delete(prefix + "a")
            await aclient.aclose()

    ran, kinds, again = asyncio.run(main())
    assert ran == [1] and sorted(kinds) == ["executed"] + ["in-flight"] * 7, kinds
    assert (again.kind, again.response.body) == ("replayed", b"once"), again


# --- PostgreSQL ---------------------------------------------------------------


def test_postgres_rows_hold_the_layouts_columns(tables: Tables) -> None:
    table = tables.new()
    holder = (1 << 64) - 2
    with PostgresStore(tables.url, table=table) as store:
        assert store.insert("k", record(holder=holder), NOW) == 1
        assert store.insert("k", record(), NOW) == store.get("k", NOW)
        assert store.replace("k", 1, record(U64_TOP, holder=holder, state="done"), NOW) is True
        (row,) = tables.sql(f"SELECT version, holder, expires_at_ms, status, header_names, header_values, body FROM {table}")
        assert row == (2, -2, (1 << 63) - 1, 200, ["etag"], [b"\x00\xff"], b"paid"), "holder as i64, time saturated"
        entry = store.get("k", NOW)
        assert entry.record.holder == holder and entry.record.expires_at_ms == (1 << 63) - 1
        assert store.delete("k", 1, NOW) is False and store.delete("k", None, NOW) is True
        # An expired row is left alone by delete (the purge frees it).
        assert store.insert("old", record(NOW + 10), NOW) == 1
        assert store.delete("old", None, NOW + 10) is False and store.delete("old", 1, NOW + 10) is False
        assert tables.sql(f"SELECT count(*) FROM {table} WHERE key = 'old'") == [(1,)]


U64_TOP = (1 << 64) - 1


def test_a_postgres_row_that_does_not_decode_is_corrupt_naming_the_key(tables: Tables) -> None:
    table = tables.new()
    with PostgresStore(tables.url, table=table) as store:
        store.insert("order-17", record(), NOW)
        tables.sql(f"UPDATE {table} SET lease_until_ms = -1")
        with pytest.raises(StoreFault) as fault:
            store.get("order-17", NOW)
        assert fault.value.kind == "corrupt" and "'order-17'" in str(fault.value) and "lease_until_ms" in str(fault.value)


def test_postgres_purge_deletes_at_most_limit_rows_expired_at_now_oldest_first_sync_and_async(tables: Tables) -> None:
    table = tables.new()
    keys = [("a", NOW + 100), ("b", NOW + 200), ("c", NOW + 300), ("live", NOW + 10_000)]

    def left() -> str:
        return ",".join(k for (k,) in tables.sql(f"SELECT key FROM {table} ORDER BY key"))

    with PostgresStore(tables.url, table=table) as store:
        for key, expires in keys:
            store.insert(key, record(expires), NOW)
        assert store.purge_expired(NOW + 99, 10) == 0
        assert store.purge_expired(NOW + 300, 2) == 2 and left() == "c,live", "the oldest expiry first"
        with pytest.raises(ValueError, match="limit 0 must be a positive whole number"):
            store.purge_expired(NOW + 300, 0)

    async def main() -> int:
        store = await AsyncPostgresStore.open(tables.url, table=table)
        try:
            return await store.purge_expired(NOW + 300, 10)
        finally:
            await store.close()

    assert asyncio.run(main()) == 1 and left() == "live"


def test_guards_over_postgres_purge_its_expired_rows_sync_and_async(tables: Tables) -> None:
    table = tables.new()

    def count() -> int:
        return tables.sql(f"SELECT count(*) FROM {table}")[0][0]

    def eventually(done: Any, what: str) -> None:
        deadline = time.monotonic() + 10  # a loaded machine runs the purge late
        while not done():
            assert time.monotonic() < deadline, f"not within 10 s: {what}"
            time.sleep(0.01)

    clock = ManualClock(NOW)
    with PostgresStore(tables.url, table=table) as store:
        guard = Guard(store=store, clock=clock, lease_ms=10, retention_ms=100, purge_every_ms=20)
        for key in ("x", "y"):
            _kind, claim = guard.begin(key, "fp")
            guard.complete(claim, Response(201, [], key.encode()))
        clock.advance(200)
        # Waited for by its count: rows are gone a moment before the run that deleted them is counted.
        eventually(lambda: guard.purge_stats.purged >= 2, "the sync guard's purge")
        guard.close()
        assert guard.purge_stats.purged == 2 and guard.purge_stats.errors == 0 and count() == 0

    async def main() -> int:
        store = await AsyncPostgresStore.open(tables.url, table=table)
        guard = AsyncGuard(store=store, clock=clock, lease_ms=10, retention_ms=100, purge_every_ms=20)
        try:
            _kind, claim = await guard.begin("z", "fp")
            await guard.complete(claim, Response(201, [], b"z"))
            clock.advance(200)
            deadline = time.monotonic() + 10
            while guard.purge_stats.purged < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            return guard.purge_stats.purged
        finally:
            guard.close()
            await store.close()

    assert asyncio.run(main()) == 1 and count() == 0


def test_a_table_of_another_schema_version_is_refused(tables: Tables) -> None:
    table = tables.new()
    PostgresStore(tables.url, table=table).close()
    tables.sql("UPDATE idem_schema SET version = 3 WHERE table_name = %s", [table])
    with pytest.raises(StoreFault, match="schema version 3; this build reads version 2"):
        PostgresStore(tables.url, table=table)


def test_a_postgres_server_that_cannot_be_reached_fails_closed(tables: Tables) -> None:
    with pytest.raises(StoreFault) as fault:
        PostgresStore("postgres://postgres@127.0.0.1:1/test", timeout_ms=500)
    assert fault.value.kind == "unavailable"
    # A store whose pool is gone answers unavailable, and the guard runs nothing.
    store = PostgresStore(tables.url, table=tables.new())
    store.close()
    ran: list[int] = []
    outcome = Guard(store=store).run("k", "fp", lambda fence: ran.append(fence) or Response(200))
    assert outcome.kind == "unavailable" and ran == []


class SilentProxy:
    """A TCP proxy to `port` on 127.0.0.1 that, once `silence()` is called,
    keeps every connection open and forwards nothing more: a server that
    went silent (a partition, a frozen process)."""

    def __init__(self, port: int):
        self.silent = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.target = port
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if not self.silent.is_set():
                    dst.sendall(data)
        except OSError:
            pass

    def silence(self) -> None:
        self.silent.set()

    def close(self) -> None:
        self.listener.close()


def fails_closed_once_silent(store: Any, proxy: SilentProxy) -> None:
    """A guard over `store` runs a handler, then, once `proxy` goes silent,
    answers unavailable well within 10 s and runs nothing."""
    guard = Guard(store=store)
    assert guard.run("before", "fp", lambda fence: Response(200)).kind == "executed"
    proxy.silence()
    ran: list[int] = []
    started = time.monotonic()
    outcome = guard.run("after", "fp", lambda fence: ran.append(fence) or Response(200))
    took = time.monotonic() - started
    assert outcome.kind == "unavailable" and ran == [], outcome
    assert took < 10, f"the store answered after {took:.1f} s"


def test_a_postgres_server_that_goes_silent_fails_the_sync_store_closed_within_its_deadline(tables: Tables) -> None:
    # The server's statement_timeout cannot help here: nothing reaches it, and nothing comes back.
    url = urllib.parse.urlsplit(tables.url)
    proxy = SilentProxy(url.port or 5432)
    proxied = url._replace(netloc=f"{url.username}@127.0.0.1:{proxy.port}").geturl()
    table = tables.new()
    try:
        with PostgresStore(proxied, table=table, timeout_ms=300) as store:
            # The deadline is twice timeout_ms (0.6 s); a hung call would wait for TCP, minutes.
            fails_closed_once_silent(store, proxy)
    finally:
        proxy.close()


def test_eight_threads_of_guard_run_on_one_postgres_key_run_the_handler_once(tables: Tables) -> None:
    with PostgresStore(tables.url, table=tables.new(), pool=8) as store:
        ran, kinds = run_in_threads([Guard(store=store) for _ in range(8)], "k")
    assert ran == [1] and kinds.count("executed") == 1 and set(kinds) <= {"executed", "in-flight", "replayed"}, kinds


def test_twenty_concurrent_async_runs_on_one_postgres_key_run_the_handler_once(tables: Tables) -> None:
    table = tables.new()

    async def main() -> tuple[list[int], list[str]]:
        async with await AsyncPostgresStore.open(tables.url, table=table, pool=8) as store:
            return await run_concurrently(AsyncGuard(store=store), "k", 20)

    ran, kinds = asyncio.run(main())
    assert ran == [1] and sorted(kinds) == ["executed"] + ["in-flight"] * 19, kinds


# --- the HTTP scenarios through the ASGI middleware, on the servers -----------


def http_scenarios() -> list[str]:
    pytest.importorskip("starlette")
    from test_http_conformance import FILES as HTTP_FILES

    return HTTP_FILES


@pytest.mark.parametrize("name", http_scenarios())
def test_the_asgi_middleware_plays_the_http_scenario_on_async_redis(redis_url: str, name: str) -> None:
    from test_http_conformance import Target, play
    from test_http_conformance import load as load_http

    scenario = load_http(name)

    async def main() -> int:
        async with AsyncRedisStore(redis_url, prefix=unique("http") + ":") as store:
            return await play(scenario, Target(scenario.get("config") or {}, AsyncFaulty(store)))

    assert asyncio.run(main()) > 0


@pytest.mark.parametrize("name", http_scenarios())
def test_the_asgi_middleware_plays_the_http_scenario_on_async_postgres(tables: Tables, scenario_table: str, name: str) -> None:
    from test_http_conformance import Target, play
    from test_http_conformance import load as load_http

    scenario = load_http(name)
    tables.sql(f"DELETE FROM {scenario_table}")

    async def main() -> int:
        async with await AsyncPostgresStore.open(tables.url, table=scenario_table, pool=4) as store:
            return await play(scenario, Target(scenario.get("config") or {}, AsyncFaulty(store)))

    assert asyncio.run(main()) > 0


def test_a_redis_client_given_to_the_store_must_return_bytes(redis_url: str) -> None:
    import redis

    with pytest.raises(ValueError, match="must not decode responses"):
        RedisStore(client=redis.Redis.from_url(redis_url, decode_responses=True))


def test_a_redis_server_that_goes_silent_fails_the_sync_store_closed_within_its_timeout(redis_url: str) -> None:
    url = urllib.parse.urlsplit(redis_url)
    proxy = SilentProxy(url.port or 6379)
    try:
        with RedisStore(f"redis://127.0.0.1:{proxy.port}", prefix=unique("silent") + ":", timeout_ms=300) as store:
            fails_closed_once_silent(store, proxy)
    finally:
        proxy.close()


def test_a_redis_connection_the_server_closed_while_idle_is_opened_again_before_the_next_command(
    redis_url: str, raw_redis: Any
) -> None:
    # The store keeps the connections it used; one the server dropped in the
    # meantime (an idle timeout, a restart) must not fail the next call.
    with RedisStore(redis_url, prefix=unique("killed") + ":") as store:
        assert store.insert("k", record(), NOW) == 1
        (conn,) = store._idle
        killed = store._command(("CLIENT", "ID"))
        assert raw_redis.client_kill_filter(_id=killed) == 1
        assert store.get("k", NOW) == (record(), 1)
        assert store._idle == [conn] and store._command(("CLIENT", "ID")) != killed


@pytest.mark.parametrize("protocol", [2, 3])
def test_the_redis_store_reads_every_reply_it_gets_in_resp2_and_resp3_and_in_pieces(redis_url: str, protocol: int) -> None:
    # The store reads replies off the socket itself: a 1 MiB body arrives in many
    # reads, and a client given with protocol=3 answers nulls and errors in RESP3.
    body = bytes(range(256)) * 4096
    big = Record("fp", "done", 7, NOW + 1_000, NOW + 10_000, Response(200, [("etag", b"\x00")], body))
    client = redis.Redis.from_url(redis_url, protocol=protocol)
    try:
        with RedisStore(client=client, prefix=unique(f"resp{protocol}") + ":") as store:
            assert store.get("k", NOW) is None
            assert store.insert("k", record(), NOW) == 1
            assert store.insert("k", record(), NOW) == (record(), 1)
            assert store.replace("k", 1, big, NOW) is True and store.get("k", NOW) == (big, 2)
            assert store.insert("k", record(NOW + 20_000), NOW + 10_000) == 3, "claim_expired's array reply"
            assert store.replace("k", 1, record(), NOW + 10_000) is False
            client.hset(store.prefix + "h", "field", "value")
            with pytest.raises(StoreFault, match="not a string"):
                store.get("h", NOW)
            assert store.delete("k", 3, NOW) is True and store.delete("k", None, NOW) is False
    finally:
        client.close()


def test_the_redis_store_parses_the_resp_types_its_commands_answer_with() -> None:
    from redis.exceptions import InvalidResponse, NoScriptError, ResponseError

    from idem_guard.redis import _Incomplete, _parse

    assert _parse(b"$3\r\nabc\r\n", 0) == (b"abc", 9)
    assert _parse(b"$0\r\n\r\n", 0) == (b"", 6)
    assert _parse(b"$-1\r\n", 0) == (None, 5) and _parse(b"_\r\n", 0) == (None, 3)
    assert _parse(b":-12\r\n", 0) == (-12, 6) and _parse(b"+OK\r\n", 0) == (b"OK", 5)
    assert _parse(b"*2\r\n:1\r\n$2\r\nab\r\n", 0) == ([1, b"ab"], 16)
    error, _ = _parse(b"-NOSCRIPT No matching script.\r\n", 0)
    assert isinstance(error, NoScriptError)
    error, _ = _parse(b"!9\r\nERR wrong\r\n", 0)
    assert type(error) is ResponseError and str(error) == "wrong"
    for cut in (b"", b"$3\r\nab", b"$3\r\nabc\r", b"*2\r\n:1\r\n", b":1"):
        with pytest.raises(_Incomplete):
            _parse(cut, 0)
    with pytest.raises(InvalidResponse):
        _parse(b"%1\r\n", 0)
    # Announced, not yet sent: refused before any of it is waited for.
    with pytest.raises(InvalidResponse, match="over Redis's 512 MiB"):
        _parse(b"$536870913\r\n", 0)
    with pytest.raises(InvalidResponse, match="an array of 1025 elements"):
        _parse(b"*1025\r\n", 0)


def test_a_redis_reply_that_is_not_resp_fails_the_command_and_drops_the_connection(redis_url: str) -> None:
    with RedisStore(redis_url, prefix=unique("garbled") + ":") as store:
        assert store.get("k", NOW) is None
        (conn,) = store._idle

        class Garbled:  # a server (or a middlebox) answering something that is not RESP
            def __init__(self, sock: socket.socket):
                self.sock = sock

            def recv(self, size: int) -> bytes:
                self.sock.recv(size)
                return b"$x\r\n"

            def __getattr__(self, name: str) -> Any:
                return getattr(self.sock, name)

        conn._sock = Garbled(conn._sock)
        with pytest.raises(StoreFault) as fault:
            store.get("k", NOW)
        assert fault.value.kind == "unavailable" and "not RESP" in str(fault.value), str(fault.value)
        assert conn._sock is None and store.get("k", NOW) is None, "dropped, then connected afresh"


class InterruptedOnce:
    """A socket whose next `recv` is interrupted, as by a Ctrl-C after the command went out."""

    def __init__(self, sock: socket.socket):
        self.sock, self.interrupted = sock, False

    def recv(self, size: int) -> bytes:
        if not self.interrupted:
            self.interrupted = True
            raise KeyboardInterrupt
        return self.sock.recv(size)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


def test_a_redis_reply_interrupted_mid_read_is_never_read_as_the_next_commands(redis_url: str, raw_redis: Any) -> None:
    prefix = unique("interrupted") + ":"
    raw_redis.set(prefix + "a", encode(1, record(state="done")))
    with RedisStore(redis_url, prefix=prefix) as store:
        assert store.get("a", NOW) is not None
        (conn,) = store._idle
        conn._sock = InterruptedOnce(conn._sock)
        with pytest.raises(KeyboardInterrupt):
            store.get("a", NOW)
        assert conn._sock is None, "dropped at once, not only when the next command finds a reply waiting"
        assert store.get("b", NOW) is None, "the reply to GET a was left unread and taken for GET b's"


def test_a_redis_store_gives_the_connections_it_used_back_to_a_client_it_was_given(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, max_connections=1)
    try:
        with RedisStore(client=client, prefix=unique("given") + ":") as store:
            assert store.insert("k", record(), NOW) == 1
        assert client.ping() is True, "the store kept the client's one connection"
    finally:
        client.close()


# --- AsyncRedisStore's own socket path: the same hostile servers as RedisStore's ---


def test_a_redis_server_that_goes_silent_fails_the_async_store_closed_within_its_timeout(redis_url: str) -> None:
    url = urllib.parse.urlsplit(redis_url)
    proxy = SilentProxy(url.port or 6379)

    async def main() -> None:
        async with AsyncRedisStore(f"redis://127.0.0.1:{proxy.port}", prefix=unique("asilent") + ":", timeout_ms=300) as store:
            guard = AsyncGuard(store=store)
            assert (await guard.run("before", "fp", lambda fence: Response(200))).kind == "executed"
            proxy.silence()
            ran: list[int] = []
            started = time.monotonic()
            outcome = await guard.run("after", "fp", lambda fence: ran.append(fence) or Response(200))
            took = time.monotonic() - started
            assert outcome.kind == "unavailable" and ran == [], outcome
            assert "Timeout" in (outcome.message or ""), outcome
            assert took < 10, f"the store answered after {took:.1f} s"

    try:
        asyncio.run(main())
    finally:
        proxy.close()


def test_an_async_redis_store_that_cannot_connect_again_gives_its_connection_back_each_time(redis_url: str) -> None:
    url = urllib.parse.urlsplit(redis_url)
    proxy = SilentProxy(url.port or 6379)

    async def main() -> list[str]:
        # One connection in the pool: one kept by a failed reconnection would refuse the next.
        client = aredis.Redis(host="127.0.0.1", port=proxy.port, max_connections=1, socket_timeout=0.3, socket_connect_timeout=0.3)
        try:
            async with AsyncRedisStore(client=client, prefix=unique("areopen") + ":", timeout_ms=300) as store:
                assert await store.get("k", NOW) is None
                proxy.silence()  # the command times out, and so does every handshake after it
                faults = []
                for _ in range(3):
                    with pytest.raises(StoreFault) as fault:
                        await store.get("k", NOW)
                    faults.append(str(fault.value))
                return faults
        finally:
            await client.aclose()

    try:
        faults = asyncio.run(main())
    finally:
        proxy.close()
    assert all("Timeout" in f for f in faults), faults


def test_an_async_redis_connection_the_server_closed_while_idle_is_opened_again(redis_url: str, raw_redis: Any) -> None:
    async def main() -> None:
        async with AsyncRedisStore(redis_url, prefix=unique("akilled") + ":") as store:
            assert await store.insert("k", record(), NOW) == 1
            wire = store._wire
            assert wire is not None
            (killed,) = await store._pipeline((("CLIENT", "ID"),))
            assert raw_redis.client_kill_filter(_id=killed) == 1
            for _ in range(200):  # the loop sees the server's close once it reads the socket
                if wire.closed:
                    break
                await asyncio.sleep(0.01)
            assert await store.get("k", NOW) == (record(), 1)
            assert store._wire is not wire and store._wire.conn is wire.conn, "the same redis-py connection, opened again"
            assert (await store._pipeline((("CLIENT", "ID"),)))[0] != killed

    asyncio.run(main())


def test_concurrent_async_redis_commands_share_one_connection_and_an_error_reply_leaves_it_once_answered(
    redis_url: str, raw_redis: Any
) -> None:
    prefix = unique("ashared") + ":"
    raw_redis.hset(prefix + "hash", "field", "value")

    async def main() -> None:
        async with AsyncRedisStore(redis_url, prefix=prefix) as store:
            assert await store.insert("k", record(), NOW) == 1
            wire = store._wire
            # Both written before either reply is read: the first is answered WRONGTYPE, the second its record.
            corrupt, entry = await asyncio.gather(store.get("hash", NOW), store.get("k", NOW), return_exceptions=True)
            assert isinstance(corrupt, StoreFault) and corrupt.kind == "corrupt", corrupt
            assert entry == (record(), 1), "the command behind the error reply got its own reply"
            for _ in range(200):
                if wire.closed:
                    break
                await asyncio.sleep(0.01)
            assert wire.closed and store._wire is not wire, "left after the error reply, once its commands were answered"
            assert await store.get("k", NOW) == (record(), 1) and store._wire is not None and store._wire is not wire

    asyncio.run(main())


@pytest.mark.parametrize("protocol", [2, 3])
def test_the_async_redis_store_reads_replies_in_resp2_and_resp3_and_in_pieces(redis_url: str, protocol: int) -> None:
    body = bytes(range(256)) * 4096
    big = Record("fp", "done", 7, NOW + 1_000, NOW + 10_000, Response(200, [("etag", b"\x00")], body))

    async def main() -> None:
        client = aredis.Redis.from_url(redis_url, protocol=protocol)
        async with AsyncRedisStore(client=client, prefix=unique(f"aresp{protocol}") + ":") as store:
            assert await store.get("k", NOW) is None
            assert await store.insert("k", record(), NOW) == 1
            assert await store.insert("k", record(), NOW) == (record(), 1)
            assert await store.replace("k", 1, big, NOW) is True and await store.get("k", NOW) == (big, 2)
            assert await store.insert("k", record(NOW + 20_000), NOW + 10_000) == 3, "claim_expired's array reply"
            await client.hset(store.prefix + "h", "field", "value")
            with pytest.raises(StoreFault, match="not a string"):
                await store.get("h", NOW)
            assert await store.delete("k", 3, NOW) is True and await store.delete("k", None, NOW) is False
        await client.aclose()

    asyncio.run(main())


def test_an_async_redis_command_cancelled_before_its_reply_leaves_the_reply_to_no_other_command(
    redis_url: str, raw_redis: Any
) -> None:
    prefix = unique("acancelled") + ":"
    raw_redis.set(prefix + "a", encode(1, record(state="done")))

    async def main() -> None:
        async with AsyncRedisStore(redis_url, prefix=prefix) as store:
            assert await store.get("a", NOW) is not None
            wire = store._wire
            task = asyncio.ensure_future(store.get("a", NOW))
            await asyncio.sleep(0)  # GET a is written; its reply is read at the loop's next poll
            assert wire is not None and len(wire._waiting) == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await store.get("b", NOW) is None, "the reply to GET a was taken for GET b's"
            assert await store.get("a", NOW) == (record(state="done"), 1)
            assert store._wire is wire, "in step: the connection is kept"

    asyncio.run(main())


def test_the_async_redis_store_loads_a_script_the_server_lost_in_the_same_round_trip(redis_url: str) -> None:
    from redis.exceptions import NoScriptError

    class Forgetful(AsyncRedisStore):
        """Answers the first EVALSHA NOSCRIPT itself (no SCRIPT FLUSH on a server other tests share)."""

        batches: ClassVar[list[list[str]]] = []

        async def _pipeline(self, batch: tuple[tuple[Any, ...], ...]) -> list[Any]:
            if batch[0][:2] == ("EVALSHA", self._shas["time"]):  # the clock's readings are not counted
                return await super()._pipeline(batch)
            self.batches.append([str(args[0]) for args in batch])
            if batch[0][0] == "EVALSHA" and len(self.batches) == 2:
                return [NoScriptError("No matching script. Please use EVAL.")]
            return await super()._pipeline(batch)

    async def main() -> None:
        async with Forgetful(redis_url, prefix=unique("anoscript") + ":", cas="script") as store:
            assert await store.insert("k", record(), NOW) == 1
            assert await store.replace("k", 1, record(state="done"), NOW) is True
            assert Forgetful.batches == [["SET"], ["EVALSHA"], ["SCRIPT", "EVALSHA"]], Forgetful.batches

    asyncio.run(main())


def test_async_redis_calls_start_inside_the_run_that_asks_for_them(redis_url: str) -> None:
    """AsyncRedisStore says `eager_start`: the journal starts a pending call the moment the
    guest asks for it, so its command is written before that run even ends (its round trip
    overlaps the rest of the run). A store without it is called after the run."""

    class Spied(AsyncRedisStore):
        sent: list[str]

        async def _pipeline(self, batch: tuple[tuple[Any, ...], ...]) -> list[Any]:
            if batch[0][:2] != ("EVALSHA", self._shas["time"]):  # the clock's readings are not counted
                self.sent.append(str(batch[0][0]))
            return await super()._pipeline(batch)

    class Lazy(Spied):
        eager_start = False

    async def sent_by_run_end(kind: type[Spied]) -> list[list[str]]:
        async with kind(redis_url, prefix=unique("eager") + ":") as store:
            store.sent = []
            guard = AsyncGuard(store=store)
            seen: list[list[str]] = []
            replay = guard._replay
            assert replay is not None
            run = replay._run

            def noted(*args: Any) -> Any:
                result = run(*args)
                seen.append(list(store.sent))
                return result

            replay._run = noted  # type: ignore[method-assign]
            outcome = await guard.run("k", "fp", lambda fence: Response(201, [], b"ok"))
            assert outcome.kind == "executed"
            return seen

    eager, lazy = asyncio.run(sent_by_run_end(Spied)), asyncio.run(sent_by_run_end(Lazy))
    assert eager[0] == ["SET"], eager  # begin's claim was on the wire when its first run ended
    assert lazy[0] == [], lazy
    assert eager[-1] == lazy[-1], (eager, lazy)  # the same commands either way (claim, IFEQ probe, completion)


def test_an_async_guard_call_cancelled_while_its_started_store_call_waits_leaves_nothing_behind(
    redis_url: str,
) -> None:
    url = urllib.parse.urlsplit(redis_url)
    proxy = SilentProxy(url.port or 6379)

    async def main() -> None:
        async with AsyncRedisStore(f"redis://127.0.0.1:{proxy.port}", prefix=unique("acancel") + ":", timeout_ms=60_000) as store:
            guard = AsyncGuard(store=store, renew_lease=False)  # a 60 s store timeout would need a 120 s lease
            assert (await guard.run("warm", "fp", lambda fence: Response(200))).kind == "executed"
            wire = store._wire
            assert wire is not None
            proxy.silence()
            ran: list[int] = []
            task = asyncio.ensure_future(guard.run("k", "fp", lambda fence: ran.append(fence) or Response(200)))
            for _ in range(500):  # until the claim's SET is on the wire and waits for a reply that never comes
                if wire._waiting:
                    break
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert ran == [], ran
            assert [reply.cancelled() for reply, _, _ in wire._waiting] == [True], "the store call was cancelled with its guard call"
            # The store's clock keeps its own task (named idem-clock), until the store closes.
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and t.get_name() != "idem-clock"]
            assert others == [], others

    try:
        asyncio.run(main())
    finally:
        proxy.close()


# --- the time authority: each server's clock ---------------------------------------


def redis_time_ms(url: str) -> int:
    with redis.Redis.from_url(url) as raw:
        seconds, micros = raw.time()
    return int(seconds) * 1000 + int(micros) // 1000


def postgres_time_ms(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        (now,) = conn.execute("SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::BIGINT").fetchone()
    return int(now)


def agrees(clock: Any, server_now: Any) -> None:
    """`clock` tells the server's time within its error bound (plus the round trip of this check)."""
    before = clock.now_ms()
    server = server_now()
    after = clock.now_ms()
    bound = clock.known()
    assert before - bound - 5 <= server <= after + bound + 5, (before, server, after, bound)


def test_the_redis_stores_read_the_servers_clock_through_time_lua_and_keep_it_synced(redis_url: str) -> None:
    prefix = unique("clock") + ":"
    with Spied(redis_url, prefix=prefix, clock_sync_ms=100) as store:
        assert store.clock.anchored and store.clock.readings >= 1, "read when the store opened"
        assert store.clock.authority == "the Redis server's clock (TIME)"
        agrees(store.clock, lambda: redis_time_ms(redis_url))
        assert store.sent == [], "the readings are the time script on {prefix}\\x01clock, not counted"
        start = time.monotonic()
        while store.clock.readings < 4:
            assert time.monotonic() - start < 30, "read again every clock_sync_ms"
            time.sleep(0.01)
    readings = store.clock.readings
    store.clock._thread.join(30)
    assert not store.clock._thread.is_alive() and store.clock.readings == readings, "close() stops the readings"
    with pytest.raises(ValueError, match="clock_sync_ms 99"):
        RedisStore(redis_url, clock_sync_ms=99)

    async def main() -> None:
        store = AsyncRedisStore(redis_url, prefix=prefix, clock_sync_ms=100)
        assert not store.clock.anchored, "no loop yet: read at the first call (or async with)"
        guard = AsyncGuard(store=store)
        assert (await guard.run("k", "fp", lambda fence: Response(200))).kind == "executed"
        assert store.clock.anchored
        agrees(store.clock, lambda: redis_time_ms(redis_url))
        start = time.monotonic()
        while store.clock.readings < 4:
            assert time.monotonic() - start < 30, "read again every clock_sync_ms, from a task of the loop"
            await asyncio.sleep(0.01)
        await store.close()
        assert [t for t in asyncio.all_tasks() if t.get_name() == "idem-clock"] == [], "close() ends its task"

    asyncio.run(main())


def test_the_postgres_stores_read_the_servers_clock_through_the_now_statement(tables: Tables) -> None:
    table = tables.new()
    with PostgresStore(tables.url, table=table, clock_sync_ms=100) as store:
        assert store.clock.anchored and store.clock.authority == "the PostgreSQL server's clock (clock_timestamp())"
        agrees(store.clock, lambda: postgres_time_ms(tables.url))
        start = time.monotonic()
        while store.clock.readings < 4:
            assert time.monotonic() - start < 30, "read again every clock_sync_ms"
            time.sleep(0.01)

    async def main() -> None:
        async with await AsyncPostgresStore.open(tables.url, table=table, clock_sync_ms=100) as store:
            assert store.clock.anchored, "read when the store opened"
            agrees(store.clock, lambda: postgres_time_ms(tables.url))
            start = time.monotonic()
            while store.clock.readings < 4:
                assert time.monotonic() - start < 30, "read again every clock_sync_ms, from a task of the loop"
                await asyncio.sleep(0.01)
        assert [t for t in asyncio.all_tasks() if t.get_name() == "idem-clock"] == [], "close() ends its task"

    asyncio.run(main())


def test_a_guard_over_a_network_store_judges_time_by_the_servers_clock(redis_url: str, tables: Tables) -> None:
    """The lease and expiry a claim carries are the server's time plus the policy's, whatever this host's wall clock says."""
    with RedisStore(redis_url, prefix=unique("servertime") + ":") as redis_store, PostgresStore(tables.url, table=tables.new()) as pg:
        for store, server_now in ((redis_store, lambda: redis_time_ms(redis_url)), (pg, lambda: postgres_time_ms(tables.url))):
            guard = Guard(store=store, lease_ms=30_000)
            assert guard.clock is store.clock
            before = server_now()
            kind, claim = guard.begin("k", "fp")
            after = server_now()
            bound = store.clock.known() + 5
            assert kind == "proceed" and before - bound <= claim.lease_until_ms - 30_000 <= after + bound
