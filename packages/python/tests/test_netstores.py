"""The Redis and PostgreSQL stores on real servers (`IDEM_TEST_REDIS_URL`,
`IDEM_TEST_POSTGRES_URL`; see tests/stores.py for when they are missing):
every conformance scenario through `Guard` (both bindings) and through
`AsyncGuard`'s journal replay, faults injected beside the store; corrupt
values named by key; a store that cannot be reached fails closed; the
handler runs once under concurrent callers of one key; what one store
writes, the other reads.

Each test's keys are under a prefix, and its tables named, `idempy_{pid}_…`;
the module removes them afterwards (it never flushes Redis or drops a table
it did not make)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Iterator

import pytest
from stores import RUN, AsyncFaulty, Faulty, server_url, unique
from test_conformance import FILES, load, run_scenario

from idem_guard import AsyncGuard, Guard, GuardError, ManualClock, Response
from idem_guard.types import Record, StoreFault

redis = pytest.importorskip("redis")
psycopg = pytest.importorskip("psycopg")

from idem_guard.postgres import AsyncPostgresStore, PostgresStore  # noqa: E402
from idem_guard.redis import AsyncRedisStore, RedisStore, encode  # noqa: E402

BINDINGS = ["static", "dynamic"]


# --- servers, and what the tests leave on them ------------------------------


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    url = server_url("IDEM_TEST_REDIS_URL")
    yield url
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{RUN}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


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
    """One table for the scenarios; each empties it first (as the Rust run does)."""
    return tables.new()


# --- every conformance scenario ---------------------------------------------


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("name", FILES)
def test_conformance_on_redis(redis_url: str, name: str, binding: str) -> None:
    with RedisStore(redis_url, prefix=unique("scenario") + ":") as store:
        assert run_scenario(load(name), binding, store=Faulty(store)) > 0


@pytest.mark.parametrize("name", FILES)
def test_conformance_on_async_redis_by_journal_replay(redis_url: str, name: str) -> None:
    loop = asyncio.new_event_loop()  # the client's connections belong to one loop: the scenario's
    store = AsyncRedisStore(redis_url, prefix=unique("scenario") + ":")
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
