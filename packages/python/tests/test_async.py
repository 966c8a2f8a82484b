"""`AsyncGuard`: an async handler runs once per key and its bytes are replayed;
a repeat while it runs is told it is in flight; its lease is renewed by an
asyncio task (and not without one); a failed or cancelled handler releases
with its checkpoint kept; the component's calls stay on the loop over a
`MemoryStore` and go to a worker thread over a store that may block; expired
records are purged (on the guard's loop, for an asynchronous store)."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import warnings
import weakref
from typing import Any

import pytest

from idem_guard import AsyncAttempt, AsyncGuard, Checkpoint, ManualClock, MemoryStore, NotRecorded, Response
from stores import AsyncMemory


def guards(n: int, store: Any, clock: Any = None, lease_ms: int = 1_000, **options: Any) -> list[AsyncGuard]:
    clock = clock or ManualClock(1_000_000)
    return [AsyncGuard(store=store, clock=clock, lease_ms=lease_ms, retention_ms=60_000, **options) for _ in range(n)]


class ThreadsSeen(MemoryStore):
    """A MemoryStore that notes the thread of each primitive call."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[int] = set()

    def _apply(self, primitive: str, operation: Any) -> Any:
        self.threads.add(threading.get_ident())
        return super()._apply(primitive, operation)


def test_an_async_handler_runs_once_and_its_bytes_are_replayed_on_the_loop_thread() -> None:
    store = ThreadsSeen()
    (guard,) = guards(1, store)
    assert guard.store_blocks is False, "a MemoryStore answers from memory: no thread hop"
    effects: list[int] = []

    async def charge(fence: int) -> Response:
        await asyncio.sleep(0)
        effects.append(fence)
        return Response(200, [("content-type", "application/json")], b'{"charged":1}')

    async def main() -> tuple[Any, Any, Any]:
        first = await guard.run("pay:o-1", "cents=1000", charge)
        again = await guard.run("pay:o-1", "cents=1000", charge)
        sync = await guard.run("pay:o-2", "cents=1000", lambda fence: Response(201, [], b"sync handler"))
        return first, again, sync

    first, again, sync = asyncio.run(main())
    assert (first.kind, again.kind) == ("executed", "replayed")
    assert again.response == first.response == Response(200, [("content-type", b"application/json")], b'{"charged":1}')
    assert effects == [1], "the side effect ran once"
    assert sync.kind == "executed" and sync.response.body == b"sync handler"
    assert store.threads == {threading.get_ident()}, "every store call ran on the loop's thread"


def test_over_a_store_that_may_block_the_calls_run_off_the_loop() -> None:
    class Delegating:  # not a MemoryStore: its calls may wait on a server
        def __init__(self, inner: MemoryStore) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    assert guards(1, Delegating(MemoryStore()))[0].store_blocks is True
    store = ThreadsSeen()
    (guard,) = guards(1, store, store_blocks=True)

    async def main() -> Any:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        outcome = await guard.run("k", "fp", lambda fence: Response(200, [], b"ok"))
        task.cancel()
        return outcome, ticks

    outcome, ticks = asyncio.run(main())
    assert outcome.kind == "executed"
    assert threading.get_ident() not in store.threads, "the store was called from worker threads"
    assert ticks > 0, "the loop ran other tasks meanwhile"


def test_a_repeat_while_the_handler_runs_is_in_flight_and_then_replayed() -> None:
    first, second = guards(2, MemoryStore())

    async def main() -> list[Any]:
        started, finish = asyncio.Event(), asyncio.Event()

        async def slow(_fence: int) -> Response:
            started.set()
            await finish.wait()
            return Response(200, [], b"first")

        running = asyncio.create_task(first.run("k", "fp", slow))
        await started.wait()
        during = await second.run("k", "fp", lambda _: Response(500, [], b"repeat"))
        finish.set()
        return [during, await running, await second.run("k", "fp", lambda _: Response(500))]

    during, done, later = asyncio.run(main())
    assert during.kind == "in-flight" and during.retry_after_ms == 1_000
    assert done.kind == "executed"
    assert later.kind == "replayed" and later.response.body == b"first"


# The lease runs on a ManualClock; renewals run on the loop's own time, every
# third of the lease (100 ms). The handler moves the clock past its first lease.
def slow_handler_and_repeat(renew_lease: bool, store_blocks: bool = False) -> tuple[Any, Any, list[str]]:
    store, clock = MemoryStore(), ManualClock(1_000_000)
    first, second = guards(2, store, clock, lease_ms=300, renew_lease=renew_lease, store_blocks=store_blocks)
    executions: list[str] = []

    async def main() -> tuple[Any, Any]:
        repeat = []

        async def slow(_fence: int, attempt: AsyncAttempt) -> Response:
            executions.append("first")
            clock.advance(200)
            if renew_lease:
                deadline = time.monotonic() + 5
                while attempt.fence == 1:  # the renewal task's turn
                    assert time.monotonic() < deadline, "no renewal within 5 s"
                    await asyncio.sleep(0.01)
            clock.advance(200)  # past the first lease
            repeat.append(await second.run("k", "fp", lambda _: (executions.append("repeat"), Response(200, [], b"repeat"))[1]))
            return Response(200, [], b"first")

        try:
            outcome: Any = await first.run("k", "fp", slow)
        except NotRecorded as e:
            outcome = e
        assert asyncio.all_tasks() == {asyncio.current_task()}, "the renewal task ended with the run"
        return outcome, repeat[0]

    outcome, repeat = asyncio.run(main())
    return outcome, repeat, executions


@pytest.mark.parametrize("store_blocks", [False, True], ids=["on-the-loop", "on-threads"])
def test_run_renews_the_lease_from_an_asyncio_task_so_a_slow_handler_runs_once(store_blocks: bool) -> None:
    outcome, repeat, executions = slow_handler_and_repeat(renew_lease=True, store_blocks=store_blocks)
    assert executions == ["first"]
    assert repeat.kind == "in-flight"
    assert outcome.kind == "executed"


def test_without_renewal_the_slow_async_handler_is_taken_over_and_runs_twice() -> None:
    outcome, repeat, executions = slow_handler_and_repeat(renew_lease=False)
    assert executions == ["first", "repeat"]
    assert repeat.kind == "executed"
    assert isinstance(outcome, NotRecorded) and outcome.error.kind == "stale-claim"


def test_a_failed_or_cancelled_handler_releases_and_the_retry_resumes_from_its_checkpoint() -> None:
    (guard,) = guards(1, MemoryStore())
    resumed: list[Any] = []

    async def main() -> None:
        async def fails(_fence: int, attempt: AsyncAttempt) -> Response:
            assert attempt.checkpoint is None
            await attempt.save_checkpoint("charged", "receipt-7")
            raise RuntimeError("ship failed")

        with pytest.raises(RuntimeError, match="ship failed"):
            await guard.run("order-1", "fp", fails)

        started = asyncio.Event()

        async def hangs(_fence: int, attempt: AsyncAttempt) -> Response:
            resumed.append(attempt.checkpoint)
            started.set()
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

        task = asyncio.create_task(guard.run("order-1", "fp", hangs))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

        async def ships(_fence: int, attempt: AsyncAttempt) -> Response:
            resumed.append(attempt.checkpoint)
            return Response(201, [], b"shipped " + attempt.checkpoint.data)

        outcome = await guard.run("order-1", "fp", ships)
        assert outcome.kind == "executed" and outcome.response.body == b"shipped receipt-7"
        assert (await guard.run("order-1", "fp", ships)).kind == "replayed"

    asyncio.run(main())
    assert resumed == [Checkpoint("charged", b"receipt-7")] * 2, "each retry took over at once, from the checkpoint"


def test_an_async_guard_over_an_asynchronous_store_purges_it_on_its_loop_until_closed() -> None:
    store, clock = AsyncMemory(), ManualClock(1_000)

    async def main() -> tuple[int, int, int]:
        guard = AsyncGuard(store=store, clock=clock, lease_ms=10, retention_ms=100, purge_every_ms=20)
        assert guard.purge_stats.every_ms == 20
        for i in range(3):
            kind, claim = await guard.begin(f"k{i}", "fp")
            await guard.complete(claim, Response(200, [], b"x"))
        clock.advance(200)
        deadline = time.monotonic() + 10  # a loaded machine runs the task late
        while guard.purge_stats.purged < 3 and time.monotonic() < deadline:  # counted after the rows are gone
            await asyncio.sleep(0.005)
        left, purged = len(store.inner), guard.purge_stats.purged
        guard.close()
        runs = guard.purge_stats.runs
        _kind, claim = await guard.begin("after", "fp")
        await guard.complete(claim, Response(200, [], b"x"))
        clock.advance(1_000)
        await asyncio.sleep(0.1)
        return left, purged, guard.purge_stats.runs - runs

    left, purged, runs_after_close = asyncio.run(main())
    assert (left, purged, runs_after_close) == (0, 3, 0)
    assert len(store.inner) == 1


def test_a_purge_due_after_its_loop_closed_fails_that_run_and_leaves_no_coroutine_unawaited() -> None:
    store = AsyncMemory()

    async def main() -> AsyncGuard:
        guard = AsyncGuard(store=store, clock=ManualClock(1_000), purge_every_ms=60_000)
        _kind, claim = await guard.begin("k", "fp")
        await guard.complete(claim, Response(200, [], b"x"))
        return guard

    guard = asyncio.run(main())  # the loop of its calls is closed now
    assert guard._on_loop is not None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # a coroutine made and never awaited warns when collected
        with pytest.raises(RuntimeError, match="closed"):
            guard._on_loop(10_000, 10)
        gc.collect()
    guard.close()
    assert [str(w.message) for w in caught] == []


def test_an_async_guard_over_a_memory_store_purges_from_the_wrapped_guards_thread() -> None:
    store, clock = MemoryStore(), ManualClock(1_000)

    async def main() -> AsyncGuard:
        guard = AsyncGuard(store=store, clock=clock, lease_ms=10, retention_ms=100, purge_every_ms=20)
        _kind, claim = await guard.begin("k", "fp")
        await guard.complete(claim, Response(200, [], b"x"))
        return guard

    guard = asyncio.run(main())
    clock.advance(200)
    deadline = time.monotonic() + 10
    while guard.purge_stats.purged < 1 and time.monotonic() < deadline:  # counted after the records are gone
        time.sleep(0.005)
    assert len(store) == 0 and guard.purge_stats.purged == 1
    guard.close()


def test_an_async_guard_dropped_without_close_is_not_kept_alive_by_its_purge() -> None:
    async def main() -> bool:
        guard = AsyncGuard(store=AsyncMemory(), purge_every_ms=10)
        await guard.begin("k", "fp")  # starts the purge task
        gone = weakref.ref(guard)
        del guard
        gc.collect()
        return gone() is None

    assert asyncio.run(main())
