"""A PostgreSQL claim that loses the race to a concurrent claimer (`settle`).

The store's `claim` statement reads the key and, when it is absent or
expired, calls `{t}_try_claim`. If another claimer inserted the key and has
not committed yet, `try_claim` waits on the unique key; once the winner
commits it inserts nothing and returns NULL, and the store runs `settle`
(`wit/store-layout/postgres/statements.sql`), which returns the winner's
row. These tests hold the winner's transaction open on a connection of
their own until the store's claim is seen waiting on its lock, so the
second round trip is taken every time, not by chance.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from idem_guard.types import Entry, Record
from stores import server_url, unique

psycopg = pytest.importorskip("psycopg")

from idem_guard.postgres import AsyncPostgresStore, PostgresStore  # noqa: E402

NOW = 1_000_000
# The winner's holder and fingerprint: nothing the losing claim writes.
WINNER_HOLDER = 77
LOSER = Record(
    fingerprint="loser",
    state="processing",
    holder=5,
    lease_until_ms=NOW + 30_000,
    expires_at_ms=NOW + 3_600_000,
    response=None,
)


@pytest.fixture
def table() -> Iterator[tuple[str, str]]:
    url = server_url("IDEM_TEST_POSTGRES_URL")
    t = unique("race")
    yield url, t
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"DROP TABLE IF EXISTS {t}; DROP FUNCTION IF EXISTS {t}_claim; "
            f"DROP FUNCTION IF EXISTS {t}_try_claim; DELETE FROM idem_schema WHERE table_name = '{t}'"
        )


def race(url: str, t: str, key: str, claim: Callable[[], Any]) -> Any:
    """Runs `claim` (the store's insert of `key`) while another connection
    holds an uncommitted insert of the same key, commits that insert once the
    claim waits on it, and returns what the claim returned."""
    with psycopg.connect(url) as winner, psycopg.connect(url, autocommit=True) as watch:
        winner.execute(
            f"INSERT INTO {t} (key, version, fingerprint, state, lease_until_ms, expires_at_ms, holder) "
            "VALUES (%s, 1, 'winner', 'processing', %s, %s, %s)",
            (key, NOW + 30_000, NOW + 3_600_000, WINNER_HOLDER),
        )
        result: dict[str, Any] = {}

        def run() -> None:
            try:
                result["value"] = claim()
            except BaseException as e:
                result["error"] = e

        thread = threading.Thread(target=run)
        thread.start()
        # Wait (no fixed sleep: CI machines are loaded) until the claim
        # statement, on a backend other than the winner, waits for a lock.
        deadline = time.monotonic() + 30
        while True:
            (waiting,) = watch.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE NOT l.granted AND a.datname = current_database() AND a.pid <> %s "
                "AND a.query LIKE %s",
                (winner.info.backend_pid, f"%{t}_try_claim%"),
            ).fetchone()
            if waiting:
                break
            assert thread.is_alive(), f"the claim finished without waiting: {result}"
            assert time.monotonic() < deadline, "the claim never waited on the winner's insert"
            time.sleep(0.01)
        winner.commit()
        thread.join(30)
        assert not thread.is_alive()
    if "error" in result:
        raise result["error"]
    return result["value"]


def assert_winner_kept(url: str, t: str, key: str, outcome: Any) -> None:
    assert isinstance(outcome, Entry), outcome
    assert outcome.version == 1
    assert outcome.record.fingerprint == "winner"
    assert outcome.record.holder == WINNER_HOLDER
    with psycopg.connect(url) as conn:
        rows = conn.execute(f"SELECT version, fingerprint, holder FROM {t} WHERE key = %s", (key,)).fetchall()
    assert rows == [(1, "winner", WINNER_HOLDER)], "the losing claim wrote nothing"


def test_sync_store_loses_the_race_and_gets_the_winners_record(table: tuple[str, str]) -> None:
    url, t = table
    key = unique("k")
    # A timeout well above the wait: the claim must not give up while the winner holds the key.
    with PostgresStore(url, table=t, timeout_ms=20_000) as store:
        outcome = race(url, t, key, lambda: store.insert(key, LOSER, NOW))
    assert_winner_kept(url, t, key, outcome)


def test_async_store_loses_the_race_and_gets_the_winners_record(table: tuple[str, str]) -> None:
    url, t = table
    key = unique("k")
    # Opened before the race: opening runs the schema, which would wait on
    # the winner's transaction itself.
    loop = asyncio.new_event_loop()
    try:
        store = loop.run_until_complete(AsyncPostgresStore.open(url, table=t, timeout_ms=20_000))
        try:
            outcome = race(url, t, key, lambda: loop.run_until_complete(store.insert(key, LOSER, NOW)))
        finally:
            loop.run_until_complete(store.close())
    finally:
        loop.close()
    assert_winner_kept(url, t, key, outcome)
