"""The guard for `asyncio` code: `AsyncGuard.run` awaits an async handler (a
plain one works too) and renews its claim's lease from an asyncio task::

    guard = AsyncGuard(store=MemoryStore())

    async def charge(fence: int) -> Response:
        receipt = await payments.charge("order-1", 1000, fence)
        return Response(200, [], receipt)

    outcome = await guard.run("order-1", "cents=1000", charge)

It wraps a `Guard` (same options, same component, same decisions). The
component's calls are synchronous and run a store's primitives inline, so
where they run depends on the store:

- an asynchronous store (its primitives are coroutine functions:
  `idem_guard.redis.AsyncRedisStore`, `idem_guard.postgres.AsyncPostgresStore`,
  or your own): each call is replayed from a journal of the store's answers
  (`idem_guard.journal`, the "Replaying a call" of wit/guard.wit), awaiting
  one primitive between runs, all on the loop;
- a `MemoryStore` answers from a dict in microseconds: its calls run on the
  event loop;
- any other (synchronous) store may wait on a disk or a server: its calls go
  to a worker thread (`asyncio.to_thread`) and the loop keeps serving.
  `store_blocks=` says whether a synchronous store blocks, when the default
  guesses wrong.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .guard import (
    PURGES,
    ClaimView,
    Decided,
    Guard,
    GuardError,
    MemoryStore,
    NotRecorded,
    Outcome,
    PurgeStats,
    SystemRandom,
    _bytes,
    _normalized,
    _not_run,
    _refused,
    _takes_attempt,
    check_lease_for,
    store_clock,
)
from .journal import Replay
from .observe import AsyncTracedStore, Observer
from .types import Checkpoint, Claim, Response

# How long the purge thread waits for one batch on the loop.
PURGE_WAIT_S = 10.0

__all__ = ["AsyncAttempt", "AsyncGuard"]


class AsyncGuard:
    """An idempotency guard for asyncio: `await guard.run(key, fingerprint, handler)`.

    Takes `Guard`'s options, plus `store_blocks`: whether a synchronous
    store's calls can block (default: every store but `MemoryStore`). Its
    clock is the store's (`store.clock`) unless `clock=` is given; a store
    with `async open_clock()` (`AsyncRedisStore`, `AsyncPostgresStore`) has
    it awaited before each call, which reads the server's clock the first
    time and keeps it synced from a task of the running loop. An
    asynchronous store (`AsyncRedisStore`, `AsyncPostgresStore`: primitives
    that are coroutine functions) is awaited between the replays of each
    call (`idem_guard.journal`) and never blocks the loop. Lease renewal, on by
    default (`renew_lease=False`), runs as one asyncio task per running handler,
    so it needs the loop to be free: a handler that blocks the loop for longer
    than the lease loses its key as if it had crashed.
    """

    @classmethod
    def load(cls, **options: Any) -> AsyncGuard:
        return cls(**options)

    def __init__(self, *, store_blocks: bool | None = None, renew_lease: bool = True, **options: Any):
        store = options.get("store")
        self._replay: Replay | None = None
        given = options.get("clock")
        # An asynchronous store's clock is read (the first time) and kept synced on the loop of
        # the calls: `open_clock`, awaited before each call while the guard runs on the store's clock.
        self._open_clock: Callable[[], Awaitable[None]] | None = None
        if store is not None:
            check_lease_for(store, options.get("lease_ms", 30_000), renew_lease, given is not None)
            if given is None:
                opener = getattr(store, "open_clock", None)
                self._open_clock = opener if inspect.iscoroutinefunction(opener) else None
        clock: Any = given
        if store is not None and is_async_store(store):
            clock = given if given is not None else store_clock(store)
            # The component is given the journal's store, clock and random; the real ones answer between runs.
            random = options.get("random") or SystemRandom()
            observed = options.get("tracing") is not False and Observer(tracing=options.get("tracing")).tracing
            self._replay = Replay(AsyncTracedStore(store) if observed else store, clock, random)
            options.update(store=self._replay.store, clock=self._replay.clock, random=self._replay.random)
        # The wrapped guard's own renewal thread stays off: the tasks below renew.
        self.guard = Guard(renew_lease=False, **options)
        # The real clock (the wrapped guard may be given a journal's): the store's time authority, or the one given.
        self.clock: Any = clock if self._replay is not None else self.guard.clock
        self.renew_lease = renew_lease
        if self._replay is not None:
            self.store_blocks = False
        else:
            self.store_blocks = not isinstance(self.guard.store, MemoryStore) if store_blocks is None else store_blocks
        self._every_s = max(1, self.guard.policy.lease_ms // 3) / 1000
        # A synchronous store is purged by the wrapped guard. An asynchronous
        # one by the same purge thread (`PURGES`), each batch run on the loop
        # of this guard's calls: added at the first call, when a loop runs.
        self._purge_stats: PurgeStats | None = None
        self._on_loop: _OnLoop | None = None
        self._purge: int | None = None
        every_ms = options.get("purge_every_ms", 60_000)
        if self._replay is not None and every_ms > 0 and callable(getattr(store, "purge_expired", None)):
            self._purge_stats = PurgeStats()
            self._on_loop = _OnLoop(store.purge_expired)  # type: ignore[union-attr]  # checked just above
            self._purge = PURGES.add(self, every_ms, self._on_loop, self.clock, self._purge_stats)

    @property
    def purge_stats(self) -> PurgeStats:
        """What the purge of expired records has done (`Guard.purge_stats`)."""
        return self._purge_stats if self._purge_stats is not None else self.guard.purge_stats

    def close(self) -> None:
        """Stops the guard's background work (the purge); calls still work."""
        if self._purge is not None:
            PURGES.remove(self._purge)
            self._purge = None
        self.guard.close()


    @property
    def store(self) -> Any:
        if self._replay is None:
            return self.guard.store
        target = self._replay.target
        return target.inner if isinstance(target, AsyncTracedStore) else target

    @property
    def replays(self) -> bool:
        """Whether calls are replayed from a journal (the store is asynchronous)."""
        return self._replay is not None

    async def _call(self, method: Callable[..., Any], *args: Any) -> Any:
        if self._open_clock is not None:
            await self._open_clock()  # read once (a failure leaves it unknown: the call fails closed), synced after
        if self._replay is not None:
            if self._on_loop is not None and (self._on_loop.loop is None or self._on_loop.loop.is_closed()):
                self._on_loop.loop = asyncio.get_running_loop()  # the first call, or the first on a new loop
            return await self._replay.call(method, *args)
        if self.store_blocks:
            return await asyncio.to_thread(method, *args)
        return method(*args)

    async def begin(self, key: str, fingerprint: str) -> Decided:
        """`("proceed", Claim)`, `("replay", Response)`, `("in-flight", ms)` or `("conflict", None)`,
        as a `Decided` (`Guard.begin`): a replay's `expires_at_ms` is its stored record's expiry."""
        decision: Decided = await self._call(self.guard.begin, key, fingerprint)
        return decision

    async def complete(self, claim: Claim, response: Response) -> int | None:
        """Stores `response` for the claim; returns until when repeats replay it (`Guard.complete`)."""
        expires_at_ms: int | None = await self._call(self.guard.complete, claim, response)
        return expires_at_ms

    async def release(self, claim: Claim) -> None:
        await self._call(self.guard.release, claim)

    async def renew(self, claim: Claim) -> Claim:
        renewed: Claim = await self._call(self.guard.renew, claim)
        return renewed

    async def save_checkpoint(self, claim: Claim, checkpoint: Checkpoint) -> Claim:
        saved: Claim = await self._call(self.guard.save_checkpoint, claim, checkpoint)
        return saved

    async def begin_request(
        self, key: str, method: str, path: str, headers: Sequence[tuple[str, bytes]] = (), body: bytes = b""
    ) -> Decided:
        decision: Decided = await self._call(self.guard.begin_request, key, method, path, headers, body)
        return decision

    async def fingerprint(self, method: str, path: str, headers: Sequence[tuple[str, bytes]] = (), body: bytes = b"") -> str:
        printed: str = await self._call(self.guard.fingerprint, method, path, headers, body)
        return printed

    async def run(self, key: str, fingerprint: str, handler: Callable[..., Awaitable[Response] | Response]) -> Outcome:
        """`Guard.run` for asyncio: runs `handler(fence)` (or `handler(fence,
        attempt)`, with an `AsyncAttempt`) at most once per key and fingerprint,
        awaiting it if it returns an awaitable, and replays its response to
        every repeat. Outcomes and exceptions are `Guard.run`'s; a cancelled
        handler releases its claim like a failed one. Each call ends in one
        decision, logged, passed to `on_decision` and put on a span
        (`idem_guard.observe`)."""
        return await self.guard.observer.run_async(key, lambda: self._run(key, fingerprint, handler))

    async def _run(self, key: str, fingerprint: str, handler: Callable[..., Awaitable[Response] | Response]) -> Outcome:
        try:
            decision = await self.begin(key, fingerprint)
        except GuardError as e:
            return _refused(e)
        if (outcome := _not_run(decision)) is not None:
            return outcome
        value = decision[1]
        held = _AsyncHeld(self, value)
        try:
            if _takes_attempt(handler):
                result = handler(value.fence, AsyncAttempt(held))
            else:
                result = handler(value.fence)
            if inspect.isawaitable(result):
                result = await result
            response = _normalized(result)
        except BaseException:
            claim = await held.stop()
            try:
                await self.release(claim)
            except GuardError:
                pass  # the lease runs out as after a crash
            raise
        claim = await held.stop()
        try:
            expires_at_ms = await self.complete(claim, response)
        except GuardError as e:
            raise NotRecorded(response, e) from e
        return Outcome("executed", response=response, fence=value.fence, expires_at_ms=expires_at_ms)


class _OnLoop:
    """An asynchronous store's `purge_expired` as the purge thread calls it: run
    on the loop the guard's calls last ran on, waited for at most
    `PURGE_WAIT_S` (a stalled loop must not hold the thread up)."""

    def __init__(self, purge: Callable[[int, int], Awaitable[int]]):
        self.purge = purge
        self.loop: asyncio.AbstractEventLoop | None = None

    def __call__(self, now_ms: int, limit: int) -> int:
        if self.loop is None:
            return 0  # no call yet: nothing has been written
        # The store's coroutine is made on the loop, so a loop that closed meanwhile leaves none unawaited.
        batch = _coroutine(self.purge, now_ms, limit)
        try:
            done: concurrent.futures.Future[int] = asyncio.run_coroutine_threadsafe(batch, self.loop)
        except RuntimeError:  # the loop is closed: the batch never starts
            batch.close()
            raise
        try:
            return done.result(PURGE_WAIT_S)
        except concurrent.futures.TimeoutError:
            done.cancel()
            raise


async def _coroutine(purge: Callable[[int, int], Awaitable[int]], now_ms: int, limit: int) -> int:
    return await purge(now_ms, limit)


def is_async_store(store: Any) -> bool:
    """Whether `store`'s primitives are coroutine functions (awaited, and replayed from a journal)."""
    return inspect.iscoroutinefunction(getattr(store, "insert", None))


class AsyncAttempt(ClaimView):
    """`Attempt` for async handlers: the same properties; `save_checkpoint` is awaited."""

    async def save_checkpoint(self, phase: str, data: bytes | str = b"") -> Claim:
        """Records that the operation got as far as `phase`, with `data` to
        continue from, and extends the lease (see `Attempt.save_checkpoint`).
        Raises `GuardError` (`stale-claim`: taken over; `invalid-input`; `unavailable`)."""
        saved: Claim = await self._held.save_checkpoint(Checkpoint(phase, _bytes(data)))
        return saved


class _AsyncHeld:
    """A claim and the task renewing it each third of the lease; `stop()` ends
    the task and returns the latest claim.

    Renewals, checkpoints and `stop` take turns on one `asyncio.Lock`: a
    renewal under way (perhaps on a worker thread) finishes before `stop`
    reads the claim, and the next renewal goes on from a checkpoint's claim.
    """

    def __init__(self, guard: AsyncGuard, claim: Claim):
        self.claim = claim
        self._guard = guard
        self._lock = asyncio.Lock()
        self._stopped = False
        loop = asyncio.get_running_loop()
        self._due = loop.time() + guard._every_s
        self._task = loop.create_task(self._renew(), name="idem-renew") if guard.renew_lease else None

    async def _renew(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(0.0, self._due - loop.time()))
            async with self._lock:
                if self._stopped:
                    return
                if loop.time() < self._due:
                    continue  # a checkpoint extended the lease meanwhile
                self._due = loop.time() + self._guard._every_s
                try:
                    self.claim = await self._guard.renew(self.claim)
                except GuardError as e:
                    if e.kind != "unavailable":
                        self._stopped = True  # taken over: the completion will be refused too
                        return
                    # unavailable: the lease may still hold, try at the next tick

    async def save_checkpoint(self, checkpoint: Checkpoint) -> Claim:
        async with self._lock:
            self.claim = await self._guard.save_checkpoint(self.claim, checkpoint)
            self._due = asyncio.get_running_loop().time() + self._guard._every_s  # it extended the lease
            return self.claim

    async def stop(self) -> Claim:
        async with self._lock:
            self._stopped = True
            claim = self.claim
        if self._task is not None:
            self._task.cancel()  # it is asleep: the lock is free, so no renewal is under way
            await asyncio.wait([self._task])  # tracked to its end; a cancellation of ours still propagates
        return claim
