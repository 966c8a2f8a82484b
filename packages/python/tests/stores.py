"""What the tests put around stores: fault injection as a decorator beside
them (`Faulty`, `AsyncFaulty`, with MemoryStore's `fault` grammar), an
asynchronous MemoryStore, a recording one, and the servers the network-store
tests run on.

Servers: `IDEM_TEST_REDIS_URL` (e.g. redis://127.0.0.1:6379) and
`IDEM_TEST_POSTGRES_URL` (e.g. postgres://postgres@127.0.0.1:5432/test), as
scripts/test-all.sh sets them. A test that needs one fails when it is not set
— a run that silently tested nothing looks like a pass — unless
`IDEM_TEST_SKIP_NETSTORES=1` says to skip them on purpose.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import Any

import pytest

from idem_guard import MemoryStore
from idem_guard.guard import Faults
from idem_guard.types import StoreFault

PRIMITIVES = ("get", "insert", "replace", "delete")
# Every key prefix and table name a run makes starts so: unique to the run, removed after it.
RUN = f"idempy_{os.getpid()}_"
_names = itertools.count(1)


def unique(what: str) -> str:
    """A name no other test (or run) uses: `idempy_{pid}_{what}{n}`."""
    return f"{RUN}{what}{next(_names)}"


EXAMPLES = {
    "IDEM_TEST_REDIS_URL": "redis://127.0.0.1:6379",
    "IDEM_TEST_VALKEY_URL": "redis://127.0.0.1:6391",
    "IDEM_TEST_REDIS_CLUSTER_URL": "redis+cluster://127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002",
    "IDEM_TEST_POSTGRES_URL": "postgres://postgres@127.0.0.1:5432/test",
    "IDEM_TEST_DYNAMODB_URL": "dynamodb://127.0.0.1:8000?table=idem&region=us-east-1",
}


def server_url(var: str) -> str:
    url = os.environ.get(var, "")
    if url:
        return url
    if os.environ.get("IDEM_TEST_SKIP_NETSTORES") == "1":
        pytest.skip(f"{var} is not set and IDEM_TEST_SKIP_NETSTORES=1")
    pytest.fail(
        f"{var} is not set: these tests need the server (e.g. {var}={EXAMPLES.get(var, '...')}; "
        f"scripts/test-all.sh sets it). Set IDEM_TEST_SKIP_NETSTORES=1 to skip them on purpose.",
        pytrace=False,
    )


class _Around(Faults):
    """Faults injected around the primitives of the store `inner`, whose time authority (`clock`) it keeps."""

    def __init__(self, inner: Any):
        super().__init__()
        self.inner = inner
        self.clock = inner.clock


class Faulty(_Around):
    """A synchronous store with faults injected around its primitives; `peek` bypasses them.
    Its time authority is the store's (`clock`)."""

    def _apply(self, primitive: str, *args: Any) -> Any:
        rule = self.take(primitive)
        if rule is not None:
            self.before(primitive, rule)
        value = getattr(self.inner, primitive)(*args)
        if rule is not None:
            raise self.lost(primitive)
        return value

    def get(self, *args: Any) -> Any:
        return self._apply("get", *args)

    def insert(self, *args: Any) -> Any:
        return self._apply("insert", *args)

    def replace(self, *args: Any) -> Any:
        return self._apply("replace", *args)

    def delete(self, *args: Any) -> Any:
        return self._apply("delete", *args)

    def peek(self, key: str, now_ms: int) -> Any:
        return self.inner.get(key, now_ms)


class AsyncFaulty(_Around):
    """An asynchronous store with faults injected around its primitives; `await peek(...)` bypasses them.
    Its time authority is the store's (`clock`)."""

    async def _apply(self, primitive: str, *args: Any) -> Any:
        rule = self.take(primitive)
        if rule is not None:
            self.before(primitive, rule)
        value = await getattr(self.inner, primitive)(*args)
        if rule is not None:
            raise self.lost(primitive)
        return value

    async def get(self, *args: Any) -> Any:
        return await self._apply("get", *args)

    async def insert(self, *args: Any) -> Any:
        return await self._apply("insert", *args)

    async def replace(self, *args: Any) -> Any:
        return await self._apply("replace", *args)

    async def delete(self, *args: Any) -> Any:
        return await self._apply("delete", *args)

    async def peek(self, key: str, now_ms: int) -> Any:
        return await self.inner.get(key, now_ms)


class AsyncMemory:
    """A MemoryStore behind coroutine functions: an asynchronous store that answers at once."""

    def __init__(self, inner: MemoryStore | None = None):
        self.inner = inner if inner is not None else MemoryStore()
        self.clock = self.inner.clock

    async def get(self, *args: Any) -> Any:
        return self.inner.get(*args)

    async def insert(self, *args: Any) -> Any:
        return self.inner.insert(*args)

    async def replace(self, *args: Any) -> Any:
        return self.inner.replace(*args)

    async def delete(self, *args: Any) -> Any:
        return self.inner.delete(*args)

    async def purge_expired(self, now_ms: int, limit: int) -> int:
        return self.inner.purge_expired(now_ms, limit)


class Recording:
    """A store (sync, or async with `asynchronous=True`) that notes each primitive call and its answer."""

    def __init__(self, inner: Any, asynchronous: bool = False):
        self.inner = inner
        self.clock = inner.clock
        self.calls: list[tuple] = []
        for name in PRIMITIVES:
            setattr(self, name, self._async(name) if asynchronous else self._sync(name))

    def _note(self, name: str, args: tuple, call: Callable[[], Any]) -> Any:
        try:
            value = call()
        except StoreFault as fault:
            self.calls.append((name, args, "fault", str(fault)))
            raise
        self.calls.append((name, args, "ok", value))
        return value

    def _sync(self, name: str) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            return self._note(name, args, lambda: getattr(self.inner, name)(*args))

        return call

    def _async(self, name: str) -> Callable[..., Any]:
        async def call(*args: Any) -> Any:
            try:
                value = await getattr(self.inner, name)(*args)
            except StoreFault as fault:
                self.calls.append((name, args, "fault", str(fault)))
                raise
            self.calls.append((name, args, "ok", value))
            return value

        return call
