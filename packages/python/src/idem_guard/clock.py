"""The time the guard judges leases and retention by: one *time authority*
per store (`wit/clock.wit`), never this host's wall clock.

- `SyncedClock`: a store server's clock (Redis `TIME` through the layout's
  `time.lua`, PostgreSQL's `clock_timestamp()` through its `now`
  statement), read when the store opens and every `clock_sync_ms` after
  (default 1 000), carried between reads by the machine's boot clock. Every
  host sharing the server agrees with it to within half a round trip.
  `RedisStore`, `AsyncRedisStore`, `PostgresStore` and `AsyncPostgresStore`
  each keep one (`store.clock`); `DynamoDbStore` too, from the `Date` header
  of DynamoDB's responses (whole seconds: `resolution_ms=1000`).
- `LocalClock`: this process's boot clock, anchored once to the wall clock;
  the authority of a store that lives and dies with the process
  (`MemoryStore`).
- `ManualClock`: one a test moves.

A step of the wall clock moves none of them: `time.time()` is read once, to
anchor `LocalClock`, and never for a decision. The boot clock is Linux's
`CLOCK_BOOTTIME` (monotonic, counting time suspended, shared by every
process of the machine); elsewhere `time.monotonic()`.

A clock answers `now_ms()`, and `known()`: the bound on its error in
milliseconds, or `ClockUnknown` saying why it does not know the time yet (a
server clock never read). The guard fails closed (`unavailable`) while it is
unknown::

    from idem_guard.clock import ManualClock, SyncedClock

    clock = SyncedClock("a test server's clock")
    clock.adopt(server_ms=1_765_000_000_000, sent_ms=1_000, received_ms=1_004)
    assert clock.at(1_004) == 1_765_000_000_002 and clock.error_at(1_004) == 3
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from .workers import reset_after_fork

__all__ = [
    "CLOCK_SYNC_MS",
    "ClockUnknown",
    "LocalClock",
    "ManualClock",
    "SyncedClock",
    "boot_ms",
    "check_clock_sync_ms",
    "clock_error",
    "wall_offset_ms",
]

# How often a store's synced clock reads its server's clock again (the stores' `clock_sync_ms`).
CLOCK_SYNC_MS = 1_000
# `clock_sync_ms`'s range, as the Rust host's: 100 ms to an hour.
CLOCK_SYNC_MIN_MS, CLOCK_SYNC_MAX_MS = 100, 3_600_000
# How fast a boot clock may drift from the server's, at most: a millisecond every this many
# (100 ppm, which quartz oscillators stay well inside). A reading's error bound grows by this as it ages.
DRIFT_EVERY_MS = 10_000
# Past this a disagreement between two readings is a step of the server's clock, and is counted.
STEP_MS = 1_000

if hasattr(time, "CLOCK_BOOTTIME"):

    def boot_ms() -> int:
        """The machine's boot clock in milliseconds: monotonic, counting time suspended,
        never stepped (`CLOCK_BOOTTIME`, one clock for every process of the machine)."""
        return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1_000_000

else:  # pragma: no cover - not Linux

    def boot_ms() -> int:
        """This process's monotonic clock in milliseconds (no `CLOCK_BOOTTIME` here)."""
        return time.monotonic_ns() // 1_000_000


def wall_ms() -> int:
    """This host's wall clock, in milliseconds since the Unix epoch: only for anchoring
    `LocalClock` once and for telling operators how far off it is; never for a decision."""
    return time.time_ns() // 1_000_000


class ClockUnknown(Exception):
    """A clock that does not know its authority's time yet: the message says why."""


def clock_error(clock: Any) -> str | None:
    """Why `clock` does not know its authority's time, or None when it does (or
    cannot tell: a clock without `known()` is taken as known)."""
    known = getattr(clock, "known", None)
    if known is None:
        return None
    try:
        known()
    except ClockUnknown as e:
        return str(e)
    return None


def wall_offset_ms(clock: Any) -> int:
    """How far this host's wall clock is ahead of `clock` (negative: behind), in
    milliseconds: a wall-clock step, or a mis-set host, shows here."""
    offset: int = wall_ms() - clock.now_ms()
    return offset


def check_clock_sync_ms(clock_sync_ms: int) -> int:
    """`clock_sync_ms` if it is a whole number of milliseconds from 100 to 3 600 000; else ValueError."""
    if (
        not isinstance(clock_sync_ms, int)
        or isinstance(clock_sync_ms, bool)
        or not CLOCK_SYNC_MIN_MS <= clock_sync_ms <= CLOCK_SYNC_MAX_MS
    ):
        raise ValueError(
            f"clock_sync_ms {clock_sync_ms!r} must be a whole number of milliseconds "
            f"from {CLOCK_SYNC_MIN_MS} to {CLOCK_SYNC_MAX_MS}: how often the store reads its server's clock"
        )
    return clock_sync_ms


class LocalClock:
    """This process's boot clock, anchored to the wall clock the first time any
    `LocalClock` is read: the time authority of a store that lives and dies with
    the process (`MemoryStore`). Every `LocalClock` of the process answers the
    same time, and a forked child goes on from its parent's anchor."""

    authority = "this process's monotonic clock, anchored to its wall clock once"
    _anchor: tuple[int, int] | None = None
    _anchor_lock = threading.Lock()

    @classmethod
    def anchor(cls) -> tuple[int, int]:
        """The wall-clock instant and the boot clock at the anchor."""
        anchor = LocalClock._anchor
        if anchor is None:
            with LocalClock._anchor_lock:
                if LocalClock._anchor is None:
                    LocalClock._anchor = (wall_ms(), boot_ms())
                anchor = LocalClock._anchor
        return anchor

    def now_ms(self) -> int:
        wall, boot = self.anchor()
        return wall + max(0, boot_ms() - boot)

    def known(self) -> int:
        """The error bound in milliseconds: 0, this process is its own authority."""
        return 0

    def __repr__(self) -> str:
        return "LocalClock()"


class ManualClock:
    """A clock that moves only when told to: tests expire leases without sleeping."""

    authority = "a manual clock"

    def __init__(self, now_ms: int):
        self.ms = now_ms

    def now_ms(self) -> int:
        return self.ms

    def known(self) -> int:
        return 0

    def set(self, ms: int) -> None:
        self.ms = ms

    def advance(self, ms: int) -> None:
        self.ms += ms


class SyncedClock:
    """A store server's clock, kept on this host: `now_ms()` is the server's time
    at the reading held plus the boot clock's time since, so a wall-clock step of
    this host changes nothing, and hosts reading the same server agree to within
    the sum of their readings' error bounds.

    The reading rule (`wit/store-layout/README.md`, "Time"): the server said
    `S` between boot-clock instants `sent` and `received` (`rtt = received -
    sent`); the time at boot instant `m` is `S + (m - (sent + rtt // 2))`, with
    an error bound of `ceil(rtt / 2) + 1` ms plus 0.1 ms per second since the
    reading, rounded up. A server that answers in whole steps of
    `resolution_ms` (DynamoDB's `Date` header: 1 000) is read as the middle of
    its step, `S + resolution_ms // 2`, with that half step more error. A new reading is adopted only when it is more precise
    (a smaller bound) than the one held, or disagrees with it by more than both
    bounds (the server's clock was set: the host follows its authority). So
    round-trip jitter never moves the time, and a step of the server's clock is
    followed at the next reading.

    `read(ask)` (or `await aread(ask)`) takes one reading, `ask()` returning
    the server's time in milliseconds; a failure leaves the time as it was
    and, before the first reading, says why in `known()`. `keep_synced(ask)`
    reads every `sync_every_ms` on a daemon thread (`idem-clock`) while the
    clock and its store live; `keep_synced_async(ask)`, as an asyncio task
    of the running loop. Thread-safe."""

    def __init__(self, authority: str, sync_every_ms: int = CLOCK_SYNC_MS, *, resolution_ms: int = 1):
        self.authority = authority
        self.sync_every_ms = check_clock_sync_ms(sync_every_ms)
        if not isinstance(resolution_ms, int) or isinstance(resolution_ms, bool) or resolution_ms < 1:
            raise ValueError(f"resolution_ms {resolution_ms!r} must be a whole number of milliseconds, at least 1")
        # How fine the server's answers are, floored: 1 ms, or 1 000 for an HTTP `Date` header
        # (DynamoDB's). A reading is taken as the middle of its step, with half a step more error.
        self.resolution_ms = resolution_ms
        self._lock = threading.Lock()
        self._offset_ms = 0  # server time minus boot clock
        self._error_ms = 0  # half the round trip of the reading held, plus a millisecond of rounding
        self._read_at_ms = 0  # the boot clock at the reading held
        self._anchored = False
        self._failure: str | None = None  # why the last reading failed, while never anchored
        self.readings = 0  # readings taken (adopted or not)
        self.failures = 0  # readings that failed
        self.steps = 0  # steps of the server's clock seen (a second or more)
        self.last_step_ms = 0  # the last one's size (negative: back)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ask: Callable[[], Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._pending: asyncio.Task[bool] | None = None  # a first reading under way (`first_reading`)
        reset_after_fork(self)  # a forked child starts its syncing thread again

    # --- readings ------------------------------------------------------------

    def adopt(self, server_ms: int, sent_ms: int, received_ms: int) -> None:
        """A reading: the server said `server_ms` between the boot clock's `sent_ms` and `received_ms`."""
        round_trip = max(0, received_ms - sent_ms)
        half_step = self.resolution_ms // 2
        offset = server_ms + half_step - (sent_ms + round_trip // 2)
        error = -(-round_trip // 2) + half_step + 1
        with self._lock:
            self.readings += 1
            if self._anchored:
                held = self._offset_ms
                held_error = self._error_now(received_ms)
                apart = abs(offset - held)
                disagrees = apart > held_error + error
                if not disagrees and error >= held_error:
                    return  # no better, and consistent with what is held
                if disagrees and apart >= STEP_MS:
                    self.steps += 1
                    self.last_step_ms = offset - held
            self._offset_ms = offset
            self._error_ms = error
            self._read_at_ms = received_ms
            self._anchored = True
            self._failure = None

    def failed(self, why: str) -> None:
        """A reading that failed: the time stays as it was; before the first reading, `known()` says why."""
        with self._lock:
            self.failures += 1
            if not self._anchored:
                self._failure = why

    def read(self, ask: Callable[[], int]) -> bool:
        """Takes one reading with `ask()` (the server's time in ms); whether it answered."""
        sent = boot_ms()
        try:
            server_ms = ask()
        except Exception as e:  # noqa: BLE001 - any failure of the reading leaves the time as it was
            self.failed(f"{type(e).__name__}: {e}")
            return False
        self.adopt(server_ms, sent, boot_ms())
        return True

    async def aread(self, ask: Callable[[], Awaitable[int]]) -> bool:
        """`read` for an asynchronous store: `await ask()`."""
        sent = boot_ms()
        try:
            server_ms = await ask()
        except Exception as e:  # noqa: BLE001 - as `read`
            self.failed(f"{type(e).__name__}: {e}")
            return False
        self.adopt(server_ms, sent, boot_ms())
        return True

    async def first_reading(self, ask: Callable[[], Awaitable[int]]) -> None:
        """Reads with `await ask()` unless the clock has been read: concurrent callers on
        one loop share the reading under way (one round trip for a burst of first calls)."""
        if self._anchored:
            return
        loop = asyncio.get_running_loop()
        pending = self._pending
        if pending is None or pending.done() or pending.get_loop() is not loop:
            pending = self._pending = loop.create_task(self.aread(ask), name="idem-clock-read")
        await asyncio.shield(pending)

    # --- the time ------------------------------------------------------------

    def _error_now(self, at_ms: int) -> int:
        age_ms = max(0, at_ms - self._read_at_ms)
        return self._error_ms + -(-age_ms // DRIFT_EVERY_MS)

    def at(self, at_ms: int) -> int:
        """The time at boot-clock instant `at_ms`."""
        return max(0, at_ms + self._offset_ms)

    def error_at(self, at_ms: int) -> int:
        """The held reading's error bound at boot-clock instant `at_ms`: its round trip's, grown by the drift since."""
        with self._lock:
            return self._error_now(at_ms)

    def now_ms(self) -> int:
        """The server's time now; `ClockUnknown` before the first reading (never a guess)."""
        if not self._anchored:
            raise self._unknown()
        return self.at(boot_ms())

    @property
    def anchored(self) -> bool:
        """Whether the server's clock has been read once."""
        return self._anchored

    def known(self) -> int:
        """The error bound now, in milliseconds; `ClockUnknown` saying why before the first reading."""
        if self._anchored:
            return self.error_at(boot_ms())
        raise self._unknown()

    def _unknown(self) -> ClockUnknown:
        with self._lock:
            why = self._failure
        return ClockUnknown(f"{self.authority} has not been read yet" + (f" (reading it failed: {why})" if why else ""))

    # --- keeping it synced ---------------------------------------------------

    def keep_synced(self, ask: Callable[[], int]) -> None:
        """Reads with `ask` every `sync_every_ms` on a daemon thread, until `stop()` or
        until `ask`'s object (a bound method of the store: held weakly) is gone. A forked
        child starts its own thread."""
        self._ask = weakref.WeakMethod(ask) if hasattr(ask, "__self__") else (lambda: ask)
        self._start_thread()

    def _start_thread(self) -> None:
        if self._ask is None or self._stop.is_set():
            return
        self._thread = threading.Thread(target=_sync_thread, args=(weakref.ref(self),), name="idem-clock", daemon=True)
        self._thread.start()

    def _after_fork(self) -> None:
        """In a forked child: new locks, and the syncing thread (if any) started again."""
        self._lock = threading.Lock()
        stopped, self._stop = self._stop.is_set(), threading.Event()
        if stopped:
            self._stop.set()
        self._thread = None
        self._task = self._pending = None
        self._start_thread()

    def keep_synced_async(self, ask: Callable[[], Awaitable[int]]) -> None:
        """Reads with `await ask()` every `sync_every_ms` in a task of the running loop
        (one per clock: a task whose loop ended is replaced on the next loop), until `stop()`."""
        if self._stop.is_set():
            return
        task = self._task
        loop = asyncio.get_running_loop()
        if task is not None and not task.done() and task.get_loop() is loop:
            return
        self._task = loop.create_task(_sync_task(weakref.ref(self), weakref.WeakMethod(ask)), name="idem-clock")

    def stop(self) -> None:
        """Stops the syncing (thread or task); the time goes on from the last reading."""
        self._stop.set()
        task, self._task = self._task, None
        if task is not None and not task.done() and not task.get_loop().is_closed():
            task.get_loop().call_soon_threadsafe(task.cancel)

    async def astop(self) -> None:
        """`stop`, from a coroutine: a syncing task of the running loop is cancelled and
        waited for, so none is left pending when the loop closes."""
        self._stop.set()
        task, self._task = self._task, None
        if task is None or task.done():
            return
        if task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            await asyncio.wait([task])
        elif not task.get_loop().is_closed():
            task.get_loop().call_soon_threadsafe(task.cancel)

    def __repr__(self) -> str:
        return f"SyncedClock({self.authority!r}, anchored={self._anchored})"


def _sync_thread(ref: weakref.ref[SyncedClock]) -> None:
    """A synced clock's thread: reads every period while the clock, its store and its syncing live."""
    clock = ref()
    if clock is None:
        return
    stop, every = clock._stop, clock.sync_every_ms / 1000
    del clock
    while not stop.wait(every):
        clock = ref()
        ask = clock._ask() if clock is not None and clock._ask is not None else None
        if clock is None or ask is None:
            return
        clock.read(ask)
        del clock, ask


async def _sync_task(ref: weakref.ref[SyncedClock], method: weakref.WeakMethod[Any]) -> None:
    """A synced clock's task: as `_sync_thread`, on an event loop."""
    clock = ref()
    if clock is None:
        return
    stop, every = clock._stop, clock.sync_every_ms / 1000
    del clock
    while not stop.is_set():
        await asyncio.sleep(every)
        clock, ask = ref(), method()
        if clock is None or ask is None or stop.is_set():
            return
        await clock.aread(ask)
        del clock, ask

