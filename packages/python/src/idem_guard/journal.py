"""Running a guard call over an asynchronous store: the replay of
"Replaying a call" in `wit/guard.wit`.

The component's imports are synchronous: a host function must answer before
the guest goes on, and an `asyncio` store answers only after an `await`. The
guard keeps no state between calls, and what an export does depends only on
its arguments and on what its imports answered, so the host runs the export
with every import answered from a `Journal`:

- an import the journal holds (the same primitive, with the same
  arguments, at the same position) gets the answer recorded there — a value,
  or the store's error;
- the first store call it does not hold is answered `unavailable` without
  touching the store, and noted as the journal's `pending` call; every later
  import of that run likewise (the run's result is thrown away);
- after the export returns, the host awaits the pending call on the real
  store, appends its answer (a value or a `StoreFault`) and runs the export
  again from the start, until a run leaves nothing pending; that run's
  result is the call's.

`clock.now-ms` and `random.random-u64` are journaled too, so every run sees
the first run's time and holder id. So the store sees each primitive
exactly once, in the order a synchronous host would have called it.

Responses cross as handles (wit/types.wit's `response` resource), and a
handle lives within one run: the journal holds what the store answered (an
`Entry` whose record carries the store's `Response`), and each run's binding
gives the guest a new handle to that same object; `complete`'s response is
the call's argument, handed in anew on every run. The `replace` a run asks
for carries the `Response` behind the handle the guest lent (the same object
on every run), so it compares equal to the journaled one. A run
that asks for something else at a position the journal holds (another
primitive, or other arguments) means the guest is not the deterministic
function the contract says: the call fails closed (`GuardError
("unavailable")`).

`AsyncGuard` uses this whenever its store's primitives are coroutine
functions (`AsyncRedisStore`, `AsyncPostgresStore`, or a store of your own)::

    replay = Replay(async_store, async_store.clock, SystemRandom())
    guard = Guard(store=replay.store, clock=replay.clock, random=replay.random)
    kind, value = await replay.call(guard.begin, "order-1", "cents=1000")
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable, Coroutine, Generator
from typing import Any

from .guard import GuardError
from .types import StoreFault

__all__ = ["Diverged", "Journal", "Replay"]

STORE_PRIMITIVES = ("get", "insert", "replace", "delete")


class Diverged(Exception):
    """A replay asked for another import than the journal recorded at that position."""


class Journal:
    """The imports of one guard call, in the order the guest made them:
    `(name, args, fault, value)`, where `fault` is the `StoreFault` the store
    answered (then `value` is None). With `start`, the pending call is started
    on the store the moment the guest asks for it (`started`), so its round trip
    overlaps the rest of the run, as a synchronous host's would."""

    def __init__(self, start: Callable[[str, tuple[Any, ...]], _Started] | None = None) -> None:
        self.entries: list[tuple[str, tuple[Any, ...], StoreFault | None, Any]] = []
        self.runs = 0
        self._start = start
        self.started: _Started | None = None
        # Per run:
        self.position = 0
        self.pending: tuple[str, tuple[Any, ...]] | None = None
        self.diverged: str | None = None

    def start(self) -> None:
        self.runs += 1
        self.position = 0
        self.pending = None

    def _next(self, name: str, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The recorded entry at this position (checked against `name` and `args`), or None past the end."""
        if self.position >= len(self.entries):
            return None
        entry = self.entries[self.position]
        if entry[0] != name or entry[1] != args:
            self.diverged = (
                f"run {self.runs} called {name}{_shown(args)} where run 1 called {entry[0]}{_shown(entry[1])} "
                f"(import {self.position + 1})"
            )
            raise Diverged(self.diverged)
        self.position += 1
        return entry

    def fresh(self, name: str, produce: Callable[[], Any]) -> Any:
        """`clock.now-ms` or `random.random-u64`: the recorded value, else a new one, recorded."""
        if self.pending is not None:
            return produce()  # this run's result is thrown away; nothing is recorded after the gap
        entry = self._next(name, ())
        if entry is not None:
            return entry[3]
        value = produce()
        self.entries.append((name, (), None, value))
        self.position += 1
        return value

    def store(self, name: str, args: tuple[Any, ...]) -> Any:
        """A store primitive: the recorded answer, else `unavailable` (the first unknown one becomes `pending`)."""
        if self.pending is not None:
            raise StoreFault("unavailable", f"not asked yet: waits for {self.pending[0]} (journal replay)")
        entry = self._next(name, args)
        if entry is None:
            self.pending = (name, args)
            if self._start is not None:
                self.started = self._start(name, args)
            raise StoreFault("unavailable", f"{name} is asked of the store before the call is run again (journal replay)")
        if entry[2] is not None:
            raise entry[2]
        return entry[3]

    def answer(self, name: str, args: tuple[Any, ...], fault: StoreFault | None, value: Any) -> None:
        """Appends the store's answer to the pending call."""
        self.entries.append((name, args, fault, value))


def _shown(args: tuple[Any, ...]) -> str:
    text = repr(args)
    return text if len(text) <= 120 else text[:117] + "...)"


class _Current(threading.local):
    journal: Journal | None = None


class _Store:
    """The store the component sees: answers from the current journal."""

    journaled = True  # the guard traces the real store behind it, not these answers

    def __init__(self, current: _Current):
        self._current = current

    def _journal(self) -> Journal:
        journal = self._current.journal
        if journal is None:
            raise RuntimeError("a guard over an asynchronous store was called outside Replay.call")
        return journal

    def get(self, *args: Any) -> Any:
        return self._journal().store("get", args)

    def insert(self, *args: Any) -> Any:
        return self._journal().store("insert", args)

    def replace(self, *args: Any) -> Any:
        return self._journal().store("replace", args)

    def delete(self, *args: Any) -> Any:
        return self._journal().store("delete", args)


class _Inputs:
    """The clock and the randomness the component is given (`clock.now-ms`,
    `random.random-u64`): the real ones, journaled during a replay."""

    def __init__(self, current: _Current, clock: Any, random: Any):
        self._current, self._clock, self._random = current, clock, random

    def _fresh(self, name: str, produce: Callable[[], int]) -> int:
        journal = self._current.journal
        return produce() if journal is None else journal.fresh(name, produce)

    def now_ms(self) -> int:
        return self._fresh("now-ms", self._clock.now_ms)

    def known(self) -> int:
        """Whether the real clock knows its authority's time (`idem_guard.clock`): not journaled,
        the guard asks it before each run."""
        known = getattr(self._clock, "known", None)
        bound: int = known() if known is not None else 0
        return bound

    def random_u64(self) -> int:
        return self._fresh("random-u64", self._random.random_u64)


class _Started:
    """A store call run up to its first suspension inside a guard's run (`_eager`): its
    answer if it already has one, else the coroutine and what it waits on, driven on by
    whoever awaits `answer()` — in the guard call's own task, so no task is made for it."""

    __slots__ = ("coro", "error", "value", "yielded")

    def __init__(self, coro: Coroutine[Any, Any, Any] | None, yielded: Any = None, value: Any = None, error: Exception | None = None):
        self.coro, self.yielded, self.value, self.error = coro, yielded, value, error

    async def answer(self) -> Any:
        coro, self.coro = self.coro, None
        if coro is None:
            if self.error is not None:
                raise self.error
            return self.value
        yielded = self.yielded
        while True:
            try:
                await _Resumed(yielded)
            except asyncio.CancelledError as cancelled:  # the guard call was cancelled: so is the store call
                try:
                    yielded = coro.throw(cancelled)
                except StopIteration as done:
                    return done.value
                continue
            try:
                yielded = coro.send(None)
            except StopIteration as done:
                return done.value

    def forget(self) -> None:
        """Ends a store call nobody will await: the coroutine is closed (its `finally`s run)."""
        coro, self.coro = self.coro, None
        if coro is not None:
            coro.close()


class _Resumed:
    """Awaits what a coroutine stepped by hand suspended on, as its task would: a
    future (marked blocking again, as `Future.__await__` does) or a bare yield."""

    __slots__ = ("yielded",)

    def __init__(self, yielded: Any):
        self.yielded = yielded

    def __await__(self) -> Generator[Any, None, None]:
        if self.yielded is None:
            yield None
        elif not self.yielded.done():
            self.yielded._asyncio_future_blocking = True
            yield self.yielded


def _eager(awaitable: Awaitable[Any]) -> _Started:
    """Runs a store call now, up to its first suspension (a command written, its reply
    awaited); the rest runs when the guard call awaits it (Python 3.12's eager tasks,
    for 3.11, without a task)."""
    if not inspect.iscoroutine(awaitable):
        return _Started(_awaited(awaitable))
    try:
        yielded = awaitable.send(None)
    except StopIteration as done:
        return _Started(None, value=done.value)
    except Exception as error:  # noqa: BLE001 - the store's answer (a StoreFault) or its bug, given to the await
        return _Started(None, error=error)
    return _Started(awaitable, yielded)


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


class Replay:
    """Runs guard calls over an asynchronous store by journal replay.

    `store`, `clock` and `random` are what the component is given (pass them
    to the `Guard`); `call(method, *args)` runs one of that guard's methods
    to its end, awaiting the real store between runs. The journal is per
    call and per thread, so calls of several tasks may interleave between runs.
    """

    def __init__(self, store: Any, clock: Any, random: Any):
        self.target = store
        # A store whose primitives do nothing bound to the current task before their first
        # suspension (`AsyncRedisStore`) says so with `eager_start = True`: its calls are then
        # started inside the run that asks for them (`_eager`).
        self._start = self._eager_start if getattr(store, "eager_start", False) is True else None
        self._current = _Current()
        self.store = _Store(self._current)
        self.clock = self.random = _Inputs(self._current, clock, random)

    def _eager_start(self, name: str, args: tuple[Any, ...]) -> _Started:
        return _eager(getattr(self.target, name)(*args))

    def _run(self, journal: Journal, method: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, GuardError | None]:
        journal.start()
        self._current.journal = journal
        try:
            return method(*args), None
        except GuardError as e:
            return None, e
        finally:
            self._current.journal = None

    async def call(self, method: Callable[..., Any], *args: Any) -> Any:
        """`method(*args)` (a `Guard` method: it returns or raises `GuardError`), replayed until the
        journal answers every import it makes."""
        journal = Journal(self._start)
        try:
            return await self._replayed(journal, method, args)
        finally:
            if journal.started is not None:  # left behind by a call that ended another way
                journal.started.forget()

    async def _replayed(self, journal: Journal, method: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        while True:
            value, error = self._run(journal, method, args)
            if journal.diverged is not None:
                if journal.started is not None:
                    abandoned, journal.started = journal.started, None
                    abandoned.forget()
                raise GuardError("unavailable", f"the guard's replay diverged from its journal: {journal.diverged}")
            if journal.pending is None:
                if journal.position != len(journal.entries):
                    raise GuardError(
                        "unavailable",
                        f"the guard's replay diverged from its journal: run {journal.runs} ended after "
                        f"{journal.position} of the {len(journal.entries)} imports recorded",
                    )
                if error is not None:
                    raise error
                return value
            name, pending_args = journal.pending
            pending_call, journal.started = journal.started, None
            try:
                answer = await (pending_call.answer() if pending_call is not None else getattr(self.target, name)(*pending_args))
            except StoreFault as fault:
                journal.answer(name, pending_args, fault, None)
            except Exception as bug:  # not a store error: a bug, which a sync host would trap on
                raise GuardError("unavailable", f"the store's {name} raised {type(bug).__name__}: {bug}") from bug
            else:
                journal.answer(name, pending_args, None, answer)
