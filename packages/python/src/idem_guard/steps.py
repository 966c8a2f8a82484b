"""Store primitives written once, as generators of the commands they send.

A primitive (`_get`, `_insert`, `_replace`, `_delete` of `idem_guard.redis`
and `idem_guard.postgres`, and `_time`, the reading of the server's clock)
yields a command, is sent its reply, and returns the primitive's value; the
layout's logic is written once for a synchronous and an asynchronous store.
A store carries the commands out with its own `_send(command, key)`, which
raises `StoreFault` when the server fails, and gets the four primitives of
`wit/store.wit` and `server_time()` from `Steps` (or `AsyncSteps`, awaiting
each command)::

    class MyStore(_Layout, Steps):
        def _send(self, command, key):
            return server.execute(command)
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from .types import Entry, Record

Commands = Generator[Any, Any, Any]


class _Primitives:
    """The primitives a layout writes once, as generators of commands (`idem_guard.redis._Layout`,
    `idem_guard.postgres._Layout`)."""

    def _get(self, key: str, now_ms: int) -> Commands:
        raise NotImplementedError

    def _insert(self, key: str, record: Record, now_ms: int) -> Commands:
        raise NotImplementedError

    def _replace(self, key: str, expected_version: int, record: Record, now_ms: int) -> Commands:
        raise NotImplementedError

    def _delete(self, key: str, expected_version: int | None, now_ms: int) -> Commands:
        raise NotImplementedError

    def _time(self) -> Commands:
        """The server's clock, in milliseconds since the Unix epoch (the store's time authority)."""
        raise NotImplementedError


class Steps(_Primitives):
    """`get`, `insert`, `replace` and `delete`, each the primitive's commands sent one by one."""

    def _send(self, command: Any, key: str) -> Any:
        raise NotImplementedError

    def _run(self, key: str, steps: Commands) -> Any:
        try:
            command = next(steps)
            while True:
                command = steps.send(self._send(command, key))
        except StopIteration as done:
            return done.value

    def get(self, key: str, now_ms: int) -> Entry | None:
        value: Entry | None = self._run(key, self._get(key, now_ms))
        return value

    def insert(self, key: str, record: Record, now_ms: int) -> int | Entry:
        value: int | Entry = self._run(key, self._insert(key, record, now_ms))
        return value

    def replace(self, key: str, expected_version: int, record: Record, now_ms: int) -> bool:
        value: bool = self._run(key, self._replace(key, expected_version, record, now_ms))
        return value

    def delete(self, key: str, expected_version: int | None, now_ms: int) -> bool:
        value: bool = self._run(key, self._delete(key, expected_version, now_ms))
        return value

    def server_time(self) -> int:
        """The server's clock now, in ms since the Unix epoch; `StoreFault` when it cannot answer."""
        value: int = self._run("", self._time())
        return value

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.close()


class AsyncSteps(_Primitives):
    """`Steps` for asyncio: `await store.get(...)` and so on, each command awaited (`async def _send`)."""

    async def _send(self, command: Any, key: str) -> Any:
        raise NotImplementedError

    async def _run(self, key: str, steps: Commands) -> Any:
        try:
            command = next(steps)
            while True:
                command = steps.send(await self._send(command, key))
        except StopIteration as done:
            return done.value

    async def get(self, key: str, now_ms: int) -> Entry | None:
        value: Entry | None = await self._run(key, self._get(key, now_ms))
        return value

    async def insert(self, key: str, record: Record, now_ms: int) -> int | Entry:
        value: int | Entry = await self._run(key, self._insert(key, record, now_ms))
        return value

    async def replace(self, key: str, expected_version: int, record: Record, now_ms: int) -> bool:
        value: bool = await self._run(key, self._replace(key, expected_version, record, now_ms))
        return value

    async def delete(self, key: str, expected_version: int | None, now_ms: int) -> bool:
        value: bool = await self._run(key, self._delete(key, expected_version, now_ms))
        return value

    async def server_time(self) -> int:
        """`Steps.server_time`, awaited."""
        value: int = await self._run("", self._time())
        return value
