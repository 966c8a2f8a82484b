"""`AsyncGuard` over an asynchronous store, by journal replay (idem_guard.journal,
"Replaying a call" in wit/guard.wit): the store sees each primitive exactly
once, in the order the synchronous host calls it, and the clock and the
random source are read as often as there; a store failure, a store bug and a
replay that diverges from its journal all fail closed."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import pytest

from idem_guard import AsyncGuard, Checkpoint, Guard, GuardError, ManualClock, MemoryStore, Response
from idem_guard.journal import Diverged, Journal
from idem_guard.types import Record, StoreFault
from stores import AsyncFaulty, AsyncMemory, Faulty, Recording


class Counted:
    """A ManualClock and a seeded random source that count their reads."""

    def __init__(self) -> None:
        self.clock = ManualClock(1_000_000)
        self.reads = {"now-ms": 0, "random-u64": 0}
        self._ids = itertools.count(0x1D0000)

    def now_ms(self) -> int:
        self.reads["now-ms"] += 1
        return self.clock.now_ms()

    def random_u64(self) -> int:
        self.reads["random-u64"] += 1
        return next(self._ids)


def story(call: Callable[..., Any], faults: Any, time: ManualClock) -> list:
    """The same guard calls, in order, whichever host makes them: claims, a
    replay, a conflict, in-flight, a takeover with a checkpoint, renew,
    release, and lost replies read back. Returns what each call answered."""
    answers: list = []

    def note(method: str, *args: Any) -> Any:
        try:
            value = call(method, *args)
        except GuardError as e:
            value = ("error", e.kind)
        answers.append((method, value))
        return value

    _, a = note("begin", "a", "fp")
    note("complete", a, Response(201, [("etag", b"1")], b"paid"))
    note("begin", "a", "fp")  # replay
    note("begin", "a", "other")  # conflict
    _, _b = note("begin", "b", "fp")
    note("begin", "b", "fp")  # in flight
    time.advance(1_000)  # b's lease runs out
    _, b2 = note("begin", "b", "fp")  # takeover
    b3 = note("save_checkpoint", b2, Checkpoint("charged", b"receipt-7"))
    b4 = note("renew", b3)
    note("release", b4)
    _, b5 = note("begin", "b", "fp")  # resumes from the checkpoint
    faults.fault("replace", "lost", count=1)
    note("complete", b5, Response(200, [], b"done"))  # applied, reply lost: read back
    faults.fault("insert", "error", "store timeout", count=1)
    note("begin", "c", "fp")  # unavailable
    _, c = note("begin", "c", "fp")
    faults.fault("replace", "error", "store timeout", count=1)
    note("complete", c, Response(200))  # unavailable, read back shows it not applied
    note("complete", c, Response(200))
    return answers


def sync_host() -> tuple[list, list, dict]:
    counted = Counted()
    recording = Recording(MemoryStore())
    faulty = Faulty(recording)
    guard = Guard(store=faulty, clock=counted, random=counted, lease_ms=1_000, retention_ms=60_000, renew_lease=False)
    answers = story(lambda m, *a: getattr(guard, m)(*a), faulty, counted.clock)
    return answers, recording.calls, counted.reads


def async_host() -> tuple[list, list, dict]:
    counted = Counted()
    recording = Recording(AsyncMemory(), asynchronous=True)
    faulty = AsyncFaulty(recording)
    guard = AsyncGuard(store=faulty, clock=counted, random=counted, lease_ms=1_000, retention_ms=60_000, renew_lease=False)
    assert guard.replays and guard.store is faulty
    loop = asyncio.new_event_loop()
    try:
        answers = story(lambda m, *a: loop.run_until_complete(getattr(guard, m)(*a)), faulty, counted.clock)
    finally:
        loop.close()
    return answers, recording.calls, counted.reads


def test_the_store_sees_each_primitive_once_in_the_order_the_sync_host_calls_it() -> None:
    sync_answers, sync_calls, sync_reads = sync_host()
    async_answers, async_calls, async_reads = async_host()
    assert async_answers == sync_answers
    assert [c[:2] for c in async_calls] == [c[:2] for c in sync_calls], "the same primitives with the same arguments, in order"
    assert async_calls == sync_calls, "and the same answers"
    assert async_reads == sync_reads, "the clock and the random source are read once per guest read, not once per replay"
    assert sync_reads["random-u64"] == 9, "one holder id per begin"
    kinds = [c[0] for c in sync_calls]
    # 9 begins; the one whose insert failed (injected before the store) never reached it.
    assert kinds.count("insert") == 8 and "replace" in kinds and "get" in kinds, kinds


def _async_guard(store: Any) -> AsyncGuard:
    return AsyncGuard(store=store, clock=ManualClock(1_000_000), lease_ms=1_000, retention_ms=60_000)


def test_a_store_that_fails_fails_closed_and_the_handler_does_not_run() -> None:
    store = AsyncFaulty(AsyncMemory())
    guard = _async_guard(store)
    ran: list[int] = []

    async def main() -> None:
        store.fault("insert", "error", "connection refused")
        outcome = await guard.run("k", "fp", lambda fence: ran.append(fence) or Response(200))
        assert outcome.kind == "unavailable" and "connection refused" in outcome.message
        with pytest.raises(GuardError) as err:
            await guard.begin("k", "fp")
        assert err.value.kind == "unavailable" and "connection refused" in err.value.detail
        store.clear_faults()
        assert (await guard.run("k", "fp", lambda fence: ran.append(fence) or Response(200))).kind == "executed"

    asyncio.run(main())
    assert ran == [1]


def test_a_store_that_raises_something_else_fails_closed_too() -> None:
    class Broken(AsyncMemory):
        async def insert(self, *args: Any) -> Any:
            raise KeyError("a bug in the store")

    guard = _async_guard(Broken())
    ran: list[int] = []
    outcome = asyncio.run(guard.run("k", "fp", lambda fence: ran.append(fence) or Response(200)))
    assert outcome.kind == "unavailable" and "KeyError" in outcome.message and ran == []


def test_a_replay_that_diverges_from_its_journal_fails_closed() -> None:
    store = Recording(AsyncMemory(), asynchronous=True)
    guard = _async_guard(store)
    keys = iter(["first", "second", "third"])

    # Not a deterministic call: each run asks for another key, so the second
    # run's insert is not the one the journal recorded.
    async def main() -> None:
        with pytest.raises(GuardError) as err:
            await guard._replay.call(lambda: guard.guard.begin(next(keys), "fp"))
        assert err.value.kind == "unavailable" and "diverged" in err.value.detail, err.value.detail

    asyncio.run(main())
    assert [c[:2] for c in store.calls] == [("insert", ("first", store.calls[0][1][1], 1_000_000))]


def test_a_replay_that_stops_short_of_its_journal_fails_closed() -> None:
    guard = _async_guard(AsyncMemory())
    calls = iter(["begin", "fingerprint"])

    # The second run makes no import at all: the journal's answers go unused.
    def flaky() -> Any:
        if next(calls) == "begin":
            return guard.guard.begin("k", "fp")
        return guard.guard.fingerprint("GET", "/")

    async def main() -> None:
        with pytest.raises(GuardError, match="ended after 0 of the 3 imports recorded"):
            await guard._replay.call(flaky)

    asyncio.run(main())


def test_the_journal_answers_what_it_recorded_and_refuses_anything_else() -> None:
    record = Record("fp", "processing", 1, 2, 3, None)
    journal = Journal()
    journal.start()
    assert journal.fresh("now-ms", lambda: 5) == 5
    with pytest.raises(StoreFault):
        journal.store("insert", ("k", record, 5))
    assert journal.pending == ("insert", ("k", record, 5))
    with pytest.raises(StoreFault, match="waits for insert"):
        journal.store("get", ("k", 5))  # later imports of the run: unavailable, not recorded
    journal.answer("insert", ("k", record, 5), None, 1)
    journal.start()
    assert journal.fresh("now-ms", lambda: 99) == 5, "the first run's time"
    assert journal.store("insert", ("k", record, 5)) == 1
    journal.start()
    with pytest.raises(Diverged):
        journal.fresh("random-u64", lambda: 7)


def test_concurrent_calls_interleave_between_replays_and_the_handler_runs_once() -> None:
    class Slow(AsyncMemory):
        async def insert(self, *args: Any) -> Any:
            await asyncio.sleep(0.001)
            return await super().insert(*args)

        async def replace(self, *args: Any) -> Any:
            await asyncio.sleep(0.001)
            return await super().replace(*args)

    guard = _async_guard(Slow())
    ran: list[int] = []

    async def handler(fence: int) -> Response:
        ran.append(fence)
        await asyncio.sleep(0.01)
        return Response(200, [], b"once")

    async def main() -> list:
        return await asyncio.gather(*(guard.run("k", "fp", handler) for _ in range(20)))

    outcomes = asyncio.run(main())
    assert ran == [1]
    assert sorted(o.kind for o in outcomes) == ["executed"] + ["in-flight"] * 19


def test_each_run_hands_the_guest_new_handles_to_the_same_responses() -> None:
    # "Replaying a call": a journaled answer that carries a response gives each
    # run a new handle to the same host response, and complete's response is
    # handed in anew on every run.
    inner = MemoryStore()
    store = AsyncFaulty(AsyncMemory(inner))
    guard = _async_guard(store)
    handles = guard.guard._instantiate().handles
    owned: list[tuple[int, Response]] = []
    own = handles.own

    def noting(response: Response) -> int:
        handle = own(response)
        owned.append((handle, response))
        return handle

    handles.own = noting  # type: ignore[method-assign]
    response = Response(201, [("x-é", b"\x00")], bytes(range(256)))

    async def main() -> None:
        _, claim = await guard.begin("k", "fp")
        store.fault("replace", "lost", count=1)
        owned.clear()
        await guard.complete(claim, response)  # applied, its reply lost: read back, same-as
        # Run 1: replace is not journaled yet. Run 2: its answer is the (lost-reply) error, get is
        # not journaled yet. Run 3: get's answer carries the stored response: a second handle.
        assert [h for h, _ in owned] == [1, 1, 1, 2]
        assert all(r is response for _, r in owned), "every handle stands for the response complete was given"
        assert inner.peek("k", 1_000_000).record.response is response
        owned.clear()
        kind, replayed = await guard.begin("k", "fp")  # run 1: insert not journaled; run 2: existing
        assert kind == "replay" and replayed is response and [h for h, _ in owned] == [1]

    asyncio.run(main())
    assert len(handles) == 0 and handles.stray == 0
