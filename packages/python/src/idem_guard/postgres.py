"""Records in PostgreSQL, in the on-store layout of `wit/store-layout/` (its
README is the spec): guards in Rust (`idem serve`), Node.js and Python
pointed at the same database and table share their keys. Needs the
`postgres` extra (`pip install 'idem-guard[postgres]'`: psycopg 3 with its
bundled libpq, and psycopg_pool)::

    from idem_guard import Guard
    from idem_guard.postgres import PostgresStore

    with PostgresStore("postgres://postgres@127.0.0.1:5432/test") as store:
        guard = Guard(store=store)
        outcome = guard.run("order-1", "cents=1000", charge)

`PostgresStore` (a `psycopg_pool.ConnectionPool`) is for `Guard`: the
component's imports call it inline. `AsyncPostgresStore` (an
`AsyncConnectionPool`, opened with `await AsyncPostgresStore.open(url)`) is
for `AsyncGuard`, which replays each call from a journal of the store's
answers (`idem_guard.journal`).

Opening runs the layout's `schema.sql` for the table (default
`idem_records`) as one multi-statement simple query — it creates the table,
its index and claim functions, or brings a version 1 table up to date — and
refuses a table whose `idem_schema` version is not 2. Each primitive is then
one of the layout's named statements (`statements.sql`), prepared on each
connection at its first use: one round trip (a claim that lost a race to a
concurrent claimer takes a second, `settle`).

The guard's clock is the store's (`store.clock`, a `SyncedClock`: the time
authority of wit/clock.wit): the server's `clock_timestamp()` (the layout's
`now` statement), read when the store opens and every `clock_sync_ms` after
(default 1 000), on a daemon thread (`AsyncPostgresStore`: a task of the
loop that opened it), carried between readings by the boot clock.

Failures: a refused connection, a timeout (`timeout_ms`, default 2000: the
pool's wait, the connect, and the server's `statement_timeout`; and twice
`timeout_ms` as the client's own deadline on every answer, for a server that
went silent — sync and async stores alike) or any error
from the server is `StoreFault("unavailable")`, and the guard fails closed. A
row that does not decode (a negative time, a state other than `processing`
or `done`, response or checkpoint columns only partly set) is
`StoreFault("corrupt")` naming the key. A connection that broke while idle in
the pool fails the operation that drew it, once; the pool replaces it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Generator, Sequence
from typing import Any

try:
    import psycopg
    import psycopg_pool
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("idem_guard.postgres needs psycopg 3 and psycopg_pool: pip install 'idem-guard[postgres]'") from e

try:  # the interval at which psycopg's waits wake to see a Ctrl-C
    from psycopg.connection import _WAIT_INTERVAL
except ImportError:  # pragma: no cover - another psycopg's layout
    _WAIT_INTERVAL = 0.1

from . import layout
from .clock import CLOCK_SYNC_MS, SyncedClock
from .steps import AsyncSteps, Steps
from .types import Checkpoint, Entry, Record, Response, StoreFault

__all__ = ["SCHEMA_VERSION", "AsyncPostgresStore", "PostgresStore", "decode_row", "record_params"]

NAME = "postgres"
SCHEMA_VERSION = 2
DEFAULT_TABLE = "idem_records"
DEFAULT_TIMEOUT_MS = 2_000
I64_MAX = (1 << 63) - 1
U64_MAX = (1 << 64) - 1
STATEMENTS = ("claim", "settle", "get", "replace", "delete", "now", "list", "purge")


def sql_int(v: int) -> int:
    """A u64 time or version as a BIGINT: past 2^63 - 1 (the year 292 million) it saturates."""
    return min(v, I64_MAX)


def sql_holder(holder: int) -> int:
    """A holder id as a BIGINT: the u64's 64 bits as a two's-complement i64."""
    return holder - (1 << 64) if holder > I64_MAX else holder


def record_params(record: Record) -> list[Any]:
    """The record as the statements' parameters, in the layout's column order after the version:
    fingerprint, state, lease_until_ms, expires_at_ms, status, header_names, header_values, body,
    holder, phase, checkpoint."""
    r, c = record.response, record.checkpoint
    return [
        record.fingerprint,
        record.state,
        sql_int(record.lease_until_ms),
        sql_int(record.expires_at_ms),
        None if r is None else r.status,
        None if r is None else [n for n, _ in r.headers],
        None if r is None else [bytes(v) for _, v in r.headers],
        None if r is None else bytes(r.body),
        sql_holder(record.holder),
        None if c is None else c.phase,
        None if c is None else bytes(c.data),
    ]


def _corrupt(key: str, why: str) -> StoreFault:
    return StoreFault("corrupt", f"{NAME}: the row of key {key!r} {why}")


def decode_row(key: str, row: Sequence[Any], at: int = 0) -> Entry:
    """The entry in the layout's columns from `row[at]` (version, fingerprint, …, checkpoint);
    `StoreFault("corrupt")` naming `key` when they do not decode."""
    version, fingerprint, state, lease, expires, status, names, values, body, holder, phase, data = row[at : at + 12]
    for column, n in (("version", version), ("lease_until_ms", lease), ("expires_at_ms", expires)):
        if not isinstance(n, int) or n < 0:
            raise _corrupt(key, f"has {column} {n!r}: not a non-negative integer")
    if state not in ("processing", "done"):
        raise _corrupt(key, f"has an unknown state {state!r}")
    if not isinstance(fingerprint, str) or not isinstance(holder, int):
        raise _corrupt(key, "has a NULL fingerprint or holder")
    if status is None and names is None and values is None and body is None:
        response = None
    elif None not in (status, names, values, body) and len(names) == len(values) and None not in names and None not in values:
        if not 0 <= status <= 0xFFFF:
            raise _corrupt(key, f"has status {status}: out of range")
        response = Response(status, [(n, bytes(v)) for n, v in zip(names, values, strict=False)], bytes(body))
    else:
        raise _corrupt(key, "has response columns that are inconsistent (status, header names/values, body)")
    if phase is None and data is None:
        checkpoint = None
    elif phase is not None and data is not None:
        checkpoint = Checkpoint(phase, bytes(data))
    else:
        raise _corrupt(key, "has the checkpoint's phase and data only partly present")
    record = Record(fingerprint, state, holder & U64_MAX, lease, expires, response, checkpoint)
    return Entry(record, version)


# --- the primitives, once: each a generator of statements --------------------
#
# A primitive yields `(statement name, parameters)` and receives `(rows,
# rowcount)`; the sync and the async store only run the statements.

_Steps = Generator[tuple[str, list[Any]], tuple[list[Any], int], Any]


class _Layout:
    """What both stores share: options, statements, and the primitives as statement sequences."""

    def __init__(
        self,
        url: str,
        *,
        table: str = DEFAULT_TABLE,
        pool: int = 4,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        clock_sync_ms: int = CLOCK_SYNC_MS,
    ):
        if timeout_ms < 1:
            raise ValueError("timeout_ms must be at least 1")
        self.url = url
        self.table = layout.check_table(table)
        self.timeout_ms = timeout_ms
        self._max_size = max(1, pool)
        # The store's time authority (wit/clock.wit): the server's clock_timestamp(), read by the store itself.
        self.clock = SyncedClock("the PostgreSQL server's clock (clock_timestamp())", clock_sync_ms)
        self._sql = {name: layout.postgres_statement(name, table) for name in STATEMENTS}
        self._schema = layout.postgres_schema(table)
        self._opened()

    def _opened(self) -> None:
        """What a store sets up once its options are checked."""

    def _connect_options(self) -> dict[str, Any]:
        # libpq's connect_timeout is in whole seconds, at least 2.
        return {"connect_timeout": max(2, math.ceil(self.timeout_ms / 1000))}

    def _pool_options(self) -> dict[str, Any]:
        # Autocommit: each statement is its own transaction, as the layout
        # assumes. prepare_threshold=0: every statement is prepared on a
        # connection at its first use. RawCursor: the layout's `$1` placeholders.
        return {
            "autocommit": True,
            "prepare_threshold": 0,
            "cursor_factory": psycopg.RawCursor,
        }

    def _checked_version(self, found: tuple[Any, ...] | None) -> None:
        if found is None or found[0] != SCHEMA_VERSION:
            version = None if found is None else found[0]
            raise StoreFault(
                "unavailable",
                f"{NAME}: the table {self.table!r} has schema version {version}; this build reads version {SCHEMA_VERSION}",
            )

    @staticmethod
    def _get(key: str, now_ms: int) -> _Steps:
        rows, _ = yield "get", [key, sql_int(now_ms)]
        return decode_row(key, rows[0]) if rows else None

    @staticmethod
    def _insert(key: str, record: Record, now_ms: int) -> _Steps:
        now = sql_int(now_ms)
        params = [key, now, *record_params(record)]
        rows, _ = yield "claim", params
        if not rows:
            raise StoreFault("unavailable", f"{NAME}: the claim returned no row")
        row = rows[0]
        # The layout's columns (expires_at_ms is the fifth), then the version the claim wrote.
        if row[12] is not None:
            return row[12]
        if row[4] is not None and row[4] > now:
            return decode_row(key, row)
        # A concurrent claimer committed the key after this claim read it: settle.
        rows, _ = yield "settle", params
        if not rows:
            raise StoreFault("unavailable", f"{NAME}: the claim returned no row")
        row = rows[0]
        if row[0]:
            return row[1]
        return decode_row(key, row, 1)

    @staticmethod
    def _replace(key: str, expected_version: int, record: Record, now_ms: int) -> _Steps:
        if expected_version >= I64_MAX:
            return False  # expected + 1 does not fit the version column: a refused replace, not an error
        _, count = yield "replace", [key, sql_int(expected_version), sql_int(now_ms), *record_params(record)]
        return count > 0

    @staticmethod
    def _delete(key: str, expected_version: int | None, now_ms: int) -> _Steps:
        version = None if expected_version is None else sql_int(expected_version)
        _, count = yield "delete", [key, version, sql_int(now_ms)]
        return count > 0

    @staticmethod
    def _time() -> _Steps:
        """The layout's `now`: the server's clock_timestamp() in milliseconds since the Unix epoch."""
        rows, _ = yield "now", []
        if not rows or not isinstance(rows[0][0], int) or rows[0][0] < 0:
            raise StoreFault("unavailable", f"{NAME}: the now statement answered {rows!r}")
        now: int = rows[0][0]
        return now

    @staticmethod
    def _purge(now_ms: int, limit: int) -> _Steps:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"limit {limit!r} must be a positive whole number")
        _, count = yield "purge", [sql_int(now_ms), limit]
        return count

    @staticmethod
    def _fault(error: Exception) -> StoreFault:
        return StoreFault("unavailable", f"{NAME}: {type(error).__name__}: {error}".strip())


class _DeadlineConnection(psycopg.Connection):
    """A connection whose every wait for the server ends after `deadline_s`:
    the server's `statement_timeout` does not cover a server that went
    silent (a partition, a frozen process), and a sync call must not hang
    until TCP gives up. Past it the call raises (an `OperationalError`),
    the store answers unavailable, and the pool drops the connection, whose
    state is unknown. Each store makes a subclass with its own deadline."""

    deadline_s = 4.0

    def wait(self, gen: Any, interval: float = _WAIT_INTERVAL, timeout: float | None = None) -> Any:
        return super().wait(gen, interval, self.deadline_s if timeout is None else timeout)


class PostgresStore(_Layout, Steps):
    """The store primitives of `wit/store.wit` on a PostgreSQL table, for `Guard`.

    `url`: a libpq connection string or URI (`postgres://USER@HOST:PORT/DB`).
    `table`: 1 to 48 of a-z, 0-9 and _, not starting with a digit. `pool`:
    the most connections (a `Guard` uses one at a time; guards sharing the
    store, more). Opening connects, runs the schema and opens the pool, so a
    server that cannot be reached fails here (`StoreFault("unavailable")`).
    """

    def _opened(self) -> None:
        timeout_s = self.timeout_ms / 1000
        try:
            with psycopg.connect(self.url, autocommit=True, **self._connect_options()) as conn:
                conn.execute(self._schema)  # no parameters: one simple query, one implicit transaction
                found = conn.execute("SELECT version FROM idem_schema WHERE table_name = %s", [self.table]).fetchone()
        except psycopg.Error as e:
            raise self._fault(e) from e
        self._checked_version(found)
        self.pool = psycopg_pool.ConnectionPool(
            self.url,
            min_size=1,
            max_size=self._max_size,
            kwargs={**self._pool_options(), **self._connect_options()},
            # The client's own deadline, as the async store's: twice the server's statement_timeout.
            connection_class=type("_Deadline", (_DeadlineConnection,), {"deadline_s": timeout_s * 2}),
            configure=self._configure,
            timeout=timeout_s,
            open=False,
            name=f"idem-{self.table}",
        )
        try:
            self.pool.open(wait=True, timeout=max(timeout_s, 2.0))
        except psycopg_pool.PoolTimeout as e:
            self.pool.close()
            raise self._fault(e) from e
        # The time authority: read now (a failure leaves it unknown, and every guard call fails
        # closed naming why) and every clock_sync_ms after, on the clock's thread.
        self.clock.read(self.server_time)
        self.clock.keep_synced(self.server_time)

    def _configure(self, conn: psycopg.Connection) -> None:
        conn.execute(f"SET statement_timeout = {self.timeout_ms}")

    def purge_expired(self, now_ms: int, limit: int) -> int:
        """Deletes at most `limit` rows expired at `now_ms` (the layout's
        `purge`: the oldest expiry first, rows another session holds skipped)
        and returns how many. A `Guard` over this store calls it every
        `purge_every_ms`."""
        purged: int = self._run("", self._purge(now_ms, limit))
        return purged

    def _send(self, command: tuple[str, list[Any]], _key: str) -> tuple[list[Any], int]:
        name, params = command
        try:
            with self.pool.connection() as conn:
                cur = conn.execute(self._sql[name], params, prepare=True)
                rows = cur.fetchall() if cur.description is not None else []
                return rows, cur.rowcount
        except (psycopg.Error, psycopg_pool.PoolTimeout) as e:
            raise self._fault(e) from e

    def close(self) -> None:
        self.clock.stop()
        self.pool.close()


class AsyncPostgresStore(_Layout, AsyncSteps):
    """The store primitives on a PostgreSQL table through psycopg's asyncio API,
    for `AsyncGuard`. Open it with `await AsyncPostgresStore.open(url, ...)`
    (options as `PostgresStore`'s) or `async with`; close with `await store.close()`."""

    def _opened(self) -> None:
        self.pool: psycopg_pool.AsyncConnectionPool | None = None  # opened by `open` (or `async with`)

    @classmethod
    async def open(cls, url: str, **options: Any) -> AsyncPostgresStore:
        store = cls(url, **options)
        await store._open()
        return store

    async def _open(self) -> None:
        timeout_s = self.timeout_ms / 1000
        try:
            async with await psycopg.AsyncConnection.connect(self.url, autocommit=True, **self._connect_options()) as conn:
                await conn.execute(self._schema)
                cur = await conn.execute("SELECT version FROM idem_schema WHERE table_name = %s", [self.table])
                found = await cur.fetchone()
        except psycopg.Error as e:
            raise self._fault(e) from e
        self._checked_version(found)
        options = self._pool_options()
        options["cursor_factory"] = psycopg.AsyncRawCursor
        self.pool = psycopg_pool.AsyncConnectionPool(
            self.url,
            min_size=1,
            max_size=self._max_size,
            kwargs={**options, **self._connect_options()},
            configure=self._configure,
            timeout=timeout_s,
            open=False,
            name=f"idem-{self.table}",
        )
        try:
            await self.pool.open(wait=True, timeout=max(timeout_s, 2.0))
        except psycopg_pool.PoolTimeout as e:
            await self.pool.close()
            raise self._fault(e) from e
        await self.open_clock()

    async def open_clock(self) -> None:
        """Reads the server's clock unless it has been read (a failure leaves it unknown: every
        guard call fails closed naming why, and the next call tries again), and keeps it synced
        every `clock_sync_ms` from a task of the running loop. Opening the store awaits it;
        `AsyncGuard` awaits it before each call."""
        if self.pool is None:
            return  # not open: the calls fail as unavailable anyway
        await self.clock.first_reading(self.server_time)
        self.clock.keep_synced_async(self.server_time)

    async def _configure(self, conn: psycopg.AsyncConnection) -> None:
        await conn.execute(f"SET statement_timeout = {self.timeout_ms}")

    async def purge_expired(self, now_ms: int, limit: int) -> int:
        """`PostgresStore.purge_expired`, awaited; an `AsyncGuard` over this store calls it every `purge_every_ms`."""
        purged: int = await self._run("", self._purge(now_ms, limit))
        return purged

    async def _send(self, command: tuple[str, list[Any]], _key: str) -> tuple[list[Any], int]:
        if self.pool is None:
            raise StoreFault("unavailable", f"{NAME}: the store is not open (await AsyncPostgresStore.open(url))")
        name, params = command
        try:
            # The client's own deadline too: statement_timeout does not cover a server that went silent.
            async with asyncio.timeout(self.timeout_ms / 1000 * 2):
                async with self.pool.connection() as conn:
                    cur = await conn.execute(self._sql[name], params, prepare=True)
                    rows = await cur.fetchall() if cur.description is not None else []
                    return rows, cur.rowcount
        except (psycopg.Error, psycopg_pool.PoolTimeout) as e:
            raise self._fault(e) from e
        except TimeoutError as e:
            raise StoreFault("unavailable", f"{NAME}: no answer within {self.timeout_ms * 2} ms") from e

    async def close(self) -> None:
        await self.clock.astop()
        if self.pool is not None:
            await self.pool.close()

    aclose = close

    async def __aenter__(self) -> AsyncPostgresStore:
        if self.pool is None:
            await self._open()
        return self

    async def __aexit__(self, *_exc: Any) -> None:
        await self.close()
