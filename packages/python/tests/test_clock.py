"""The time authority (`idem_guard.clock`, wit/clock.wit): a store server's
clock read and carried by the boot clock with the layout's reading rule, the
process's monotonic clock for a memory store, a guard that fails closed
until its store's clock is known, the lease a store's timeout allows, and —
in child processes under libfaketime — that a step of this host's wall
clock, or a host whose wall clock is an hour off, changes no decision. The
layout's vectors (`time`) are checked in tests/test_layout.py; the Redis and
PostgreSQL stores' readings of their servers in tests/test_netstores.py."""

from __future__ import annotations

import asyncio
import gc
import glob
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from idem_guard import (
    AsyncGuard,
    ClockUnknown,
    Guard,
    GuardError,
    LocalClock,
    ManualClock,
    MemoryStore,
    Record,
    Response,
    SyncedClock,
)
from idem_guard.clock import boot_ms, wall_offset_ms
from idem_guard.guard import check_lease_renewable
from stores import AsyncMemory, Recording

DEADLINE_S = 30.0  # how long a poll waits for a state, on a loaded machine


def poll(condition: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S} s: {what}")
        time.sleep(0.01)


# --- a server's clock ---------------------------------------------------------


def test_a_synced_clock_is_unknown_until_read_then_carried_by_the_boot_clock() -> None:
    clock = SyncedClock("a test server's clock")
    with pytest.raises(ClockUnknown, match=r"^a test server's clock has not been read yet$"):
        clock.known()
    with pytest.raises(ClockUnknown):
        clock.now_ms()  # never a guess
    assert not clock.read(lambda: (_ for _ in ()).throw(ConnectionRefusedError("refused")))
    with pytest.raises(ClockUnknown, match=r"has not been read yet \(reading it failed: ConnectionRefusedError: refused\)"):
        clock.known()
    # The server said 5_000_000 halfway through a 4 ms round trip that ended now.
    received = boot_ms()
    clock.adopt(5_000_000, received - 4, received)
    before = boot_ms()
    now, error = clock.now_ms(), clock.known()
    after = boot_ms()
    assert error >= 3, "half the round trip and a millisecond"
    assert 5_000_000 + before - (received - 2) <= now <= 5_000_000 + after - (received - 2)


def test_jitter_keeps_the_time_and_a_step_of_the_servers_clock_moves_it() -> None:
    t = 10_000_000
    clock = SyncedClock("s")
    clock.adopt(t, 0, 10)  # offset t - 5, error 6
    clock.adopt(t + 103, 100, 120)  # offset t - 7, error 11: slower, within both bounds
    assert clock.at(0) == t - 5, "a less precise reading inside the bounds changes nothing"
    clock.adopt(t + 201, 200, 202)  # offset t, error 2
    assert clock.at(0) == t and clock.error_at(202) == 2, "a more precise one is taken"
    assert clock.steps == 0
    clock.adopt(t + 301 - 3_600_000, 300, 302)  # the server's clock was set back an hour
    assert clock.at(0) == t - 3_600_000, "followed: it is the authority"
    assert (clock.steps, clock.last_step_ms) == (1, -3_600_000)
    # A reading that disagrees by more than both bounds, though less precise, is followed too.
    clock.adopt(t + 1_000 - 3_600_000 + 50, 1_000, 1_040)
    assert clock.at(0) == t - 3_600_000 + 30


def test_the_error_bound_grows_a_millisecond_per_ten_seconds_since_the_reading() -> None:
    clock = SyncedClock("s")
    clock.adopt(1_000_000, 0, 4)
    assert [clock.error_at(4 + age) for age in (0, 1, 10_000, 10_001, 60_000)] == [3, 4, 4, 5, 9]


def test_a_sync_period_outside_100_ms_to_an_hour_is_refused() -> None:
    for bad in (99, 3_600_001, 0, 1.5, True):
        with pytest.raises(ValueError, match=r"clock_sync_ms .* from 100 to 3600000"):
            SyncedClock("s", bad)  # type: ignore[arg-type]
    assert SyncedClock("s", 100).sync_every_ms == 100


def test_keep_synced_reads_every_period_on_a_thread_until_stopped_or_its_store_is_gone() -> None:
    class Server:
        def __init__(self) -> None:
            self.asked = 0

        def time(self) -> int:
            self.asked += 1
            return 1_765_000_000_000 + boot_ms()

    server = Server()
    clock = SyncedClock("a test server's clock", 100)
    clock.read(server.time)
    clock.keep_synced(server.time)
    poll(lambda: server.asked >= 4, "three readings after the first")
    assert abs(clock.now_ms() - (1_765_000_000_000 + boot_ms())) <= clock.known()
    clock.stop()
    assert clock._thread is not None
    clock._thread.join(DEADLINE_S)
    assert not clock._thread.is_alive(), "stopped"
    # Held weakly: a store (the owner of the bound method) that is gone ends the thread.
    other = SyncedClock("another", 100)
    gone = Server()
    other.keep_synced(gone.time)
    thread = other._thread
    assert thread is not None
    del gone
    gc.collect()
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), "the store was collected: nothing to read"


def test_keep_synced_async_reads_every_period_in_a_task_until_stopped() -> None:
    asked: list[int] = []

    class Server:
        async def time(self) -> int:
            asked.append(1)
            return 1_765_000_000_000 + boot_ms()

    async def main() -> None:
        server = Server()
        clock = SyncedClock("a test server's clock", 100)
        assert await clock.aread(server.time)
        clock.keep_synced_async(server.time)
        clock.keep_synced_async(server.time)  # one task per clock
        assert [t.get_name() for t in asyncio.all_tasks()].count("idem-clock") == 1
        deadline = time.monotonic() + DEADLINE_S
        while len(asked) < 4:
            assert time.monotonic() < deadline, "three readings after the first"
            await asyncio.sleep(0.01)
        await clock.astop()
        assert [t for t in asyncio.all_tasks() if t.get_name() == "idem-clock"] == []

    asyncio.run(main())


# --- this process's clock -----------------------------------------------------


def test_local_clocks_agree_and_are_anchored_to_the_wall_clock_once() -> None:
    a, b = LocalClock().now_ms(), LocalClock().now_ms()
    assert b >= a and LocalClock().known() == 0
    assert abs(wall_offset_ms(LocalClock())) < 1_000, "anchored to the wall clock, which this test does not step"
    assert isinstance(MemoryStore().clock, LocalClock)


# --- the guard on its store's clock ---------------------------------------------


class ServerStore(MemoryStore):
    """A MemoryStore whose time authority is a server clock, not read yet (as a network store's
    before its server first answered), and whose operations may take `timeout_ms`."""

    timeout_ms = 2_000

    def __init__(self) -> None:
        super().__init__()
        self.clock = SyncedClock("a test server's clock")  # type: ignore[assignment]


def test_a_guard_fails_closed_until_its_stores_clock_is_read_and_never_asks_the_store() -> None:
    store = ServerStore()
    seen = Recording(store)
    guard = Guard(store=seen, renew_lease=False)
    assert guard.clock is store.clock, "the store's time authority, by default"
    ran: list[int] = []
    outcome = guard.run("k", "fp", lambda fence: ran.append(fence) or Response(200))
    assert outcome.kind == "unavailable" and ran == [] and seen.calls == []
    assert outcome.message == "the store's clock is not known: a test server's clock has not been read yet"
    with pytest.raises(GuardError) as refused:
        guard.begin("k", "fp")
    assert refused.value.kind == "unavailable"
    assert guard.fingerprint("POST", "/", [], b"").startswith("sha256:"), "fingerprint reads no clock"
    store.clock.adopt(1_765_000_000_000, boot_ms(), boot_ms())
    kind, claim = guard.begin("k", "fp")
    assert kind == "proceed" and abs(claim.lease_until_ms - 30_000 - 1_765_000_000_000) < 60_000, "judged by the server's time"


def test_an_async_guard_fails_closed_until_its_stores_clock_is_read() -> None:
    store = ServerStore()

    async def main() -> tuple[str, str]:
        guard = AsyncGuard(store=AsyncMemory(store), renew_lease=False)
        assert guard.clock is store.clock
        refused = await guard.run("k", "fp", lambda fence: Response(200))
        store.clock.adopt(1_765_000_000_000, boot_ms(), boot_ms())
        ran = await guard.run("k", "fp", lambda fence: Response(200))
        return refused.message or "", ran.kind

    message, kind = asyncio.run(main())
    assert message == "the store's clock is not known: a test server's clock has not been read yet" and kind == "executed"
    assert store.peek("k", store.clock.now_ms()) is not None


def test_a_guard_does_not_purge_while_its_stores_clock_is_unknown() -> None:
    store = ServerStore()
    store.insert("old", Record("fp", "processing", 1, 5, 10, None), 0)
    guard = Guard(store=store, renew_lease=False, purge_every_ms=10)
    try:
        poll(lambda: guard.purge_stats.errors >= 1, "a purge run that could not tell the time")
        assert guard.purge_stats.purged == 0 and len(store) == 1
        assert guard.purge_stats.last_error == "the store's clock is not known: a test server's clock has not been read yet"
        store.clock.adopt(1_765_000_000_000, boot_ms(), boot_ms())
        poll(lambda: len(store) == 0, "the expired record purged once the clock is known")
    finally:
        guard.close()


def test_a_store_without_a_clock_is_refused_naming_the_fix() -> None:
    class Bare:
        def get(self, *args: Any) -> None: ...

    for make in (lambda: Guard(store=Bare()), lambda: AsyncGuard(store=Bare())):
        with pytest.raises(TypeError, match=r"the store Bare has no `clock`, its time authority \(wit/clock.wit\)"):
            make()
    assert Guard(store=Bare(), clock=ManualClock(1)).clock.now_ms() == 1, "a clock given is used"


def test_a_lease_shorter_than_twice_the_store_timeout_is_refused_when_the_guard_renews() -> None:
    expected = (
        "lease (3999 ms) must be at least twice store-timeout (2000 ms), i.e. at least 4000 ms: a renewal starts a "
        "third into the lease and may take the whole store timeout, so a shorter lease could lapse while its holder "
        "is alive; lengthen the lease or shorten the store timeout"
    )
    for make in (Guard, AsyncGuard):
        with pytest.raises(ValueError) as refused:
            make(store=ServerStore(), lease_ms=3_999)
        assert str(refused.value) == expected
        make(store=ServerStore(), lease_ms=4_000)
        make(store=ServerStore(), lease_ms=3_999, renew_lease=False)  # nothing renews it
        make(store=ServerStore(), lease_ms=10, clock=ManualClock(0))  # a test's clock is not real time
    Guard(store=MemoryStore(), lease_ms=10)  # a memory store never waits out a timeout
    check_lease_renewable(10_000, 5_000)
    with pytest.raises(ValueError, match="at least 10000 ms"):
        check_lease_renewable(9_999, 5_000)


# --- a wall clock that steps, or is an hour off ------------------------------------

LIBFAKETIME = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1") + glob.glob("/usr/lib/faketime/libfaketime.so.1"))


def faked(env: dict[str, str]) -> dict[str, str]:
    """The environment of a child under libfaketime, the wall clock faked, the monotonic and
    boot clocks not (FAKETIME_DONT_FAKE_MONOTONIC=1: what a host whose wall clock steps sees)."""
    if not LIBFAKETIME or shutil.which("faketime") is None:
        pytest.fail("these tests need libfaketime: apt-get install faketime", pytrace=False)
    return {**os.environ, "FAKETIME_DONT_FAKE_MONOTONIC": "1", **env}


def child(args: list[str], env: dict[str, str], script: str, *argv: str) -> dict[str, Any]:
    done = subprocess.run([*args, sys.executable, "-c", script, *argv], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


# In the child: a guard on the store's clock, and the 0.2 host's clock (the wall clock) as the control.
WALL_CLOCK = """
import json, sys, time
from idem_guard import Guard, MemoryStore, Response
class Wall:
    def now_ms(self):
        return time.time_ns() // 1_000_000
"""

STEP = WALL_CLOCK + """
step_file = sys.argv[1]
def step(offset):
    with open(step_file, "w") as f:
        f.write(offset + "\\n")
store = MemoryStore()
guard = Guard(store=store, lease_ms=600_000, renew_lease=False)
wall = Guard(store=MemoryStore(), clock=Wall(), lease_ms=600_000, renew_lease=False)
out = {"first": guard.begin("k", "fp")[0], "wall_first": wall.begin("k", "fp")[0]}
claimed_at = store.clock.now_ms()
before = time.time()
step("+1h")
out["stepped_s"] = time.time() - before
kind, value = guard.begin("k", "fp")
out["after_step"], out["retry_after_ms"] = kind, value
out["wall_after_step"] = wall.begin("k", "fp")[0]
# A completion's retention is judged by the same clock: the record expires a day after the claim.
kind, claim = guard.begin("d", "fp")
guard.complete(claim, Response(201, [], b"paid"))
out["expires_in_ms"] = store.peek("d", store.clock.now_ms()).record.expires_at_ms - claimed_at
step("-1h")
out["stepped_back_s"] = time.time() - before
kind, value = guard.begin("k", "fp")
out["after_step_back"], out["retry_after_ms_back"] = kind, value
out["replayed"] = guard.begin("d", "fp")[0]
print(json.dumps(out))
"""


def test_a_wall_clock_step_of_the_process_changes_no_decision_of_a_memory_store(tmp_path: Path) -> None:
    step_file = tmp_path / "faketime"
    step_file.write_text("+0\n")
    env = faked({"LD_PRELOAD": LIBFAKETIME[0], "FAKETIME_TIMESTAMP_FILE": str(step_file), "FAKETIME_NO_CACHE": "1"})
    out = child([], env, STEP, str(step_file))
    assert out["first"] == out["wall_first"] == "proceed"
    assert 3_590 < out["stepped_s"] < 3_610, f"the child's wall clock stepped an hour forward: {out}"
    # The lease of 10 min was taken a moment ago (less than 2 min, on a loaded machine): still in
    # flight, its retry-after the rest of the lease.
    assert out["after_step"] == "in-flight" and 480_000 < out["retry_after_ms"] <= 600_000, out
    assert out["wall_after_step"] == "proceed", f"the control: a guard on the wall clock took the key over: {out}"
    assert 86_400_000 <= out["expires_in_ms"] < 86_400_000 + 20_000, out
    assert -3_610 < out["stepped_back_s"] < -3_590, out
    assert out["after_step_back"] == "in-flight" and 480_000 < out["retry_after_ms_back"] <= 600_000, out
    assert out["replayed"] == "replay", out


AHEAD = WALL_CLOCK + """
kind, url, name = sys.argv[1:4]
if kind == "redis":
    from idem_guard.redis import RedisStore
    store = RedisStore(url, prefix=name)
else:
    from idem_guard.postgres import PostgresStore
    store = PostgresStore(url, table=name)
guard = Guard(store=store, lease_ms=600_000, renew_lease=False)
wall = Guard(store=store, clock=Wall(), lease_ms=600_000, renew_lease=False)
out = {"ahead_ms": time.time_ns() // 1_000_000 - store.clock.now_ms()}
out["store_clock"], out["retry_after_ms"] = guard.begin("k1", "fp")
out["wall_clock"] = wall.begin("k2", "fp")[0]
kind, replayed = guard.begin("done", "fp")
out["replayed"] = [kind, replayed.body.decode() if kind == "replay" else None]
store.close()
print(json.dumps(out))
"""


@pytest.mark.parametrize("kind", ["redis", "postgres"])
def test_a_host_whose_wall_clock_is_an_hour_ahead_agrees_with_this_one_on_a_shared_store(kind: str) -> None:
    from stores import server_url, unique

    url = server_url("IDEM_TEST_REDIS_URL" if kind == "redis" else "IDEM_TEST_POSTGRES_URL")
    if kind == "redis":
        from idem_guard.redis import RedisStore

        name = unique("ahead") + ":"
        store: Any = RedisStore(url, prefix=name)
    else:
        from idem_guard.postgres import PostgresStore

        name = unique("ahead")
        store = PostgresStore(url, table=name)
    try:
        guard = Guard(store=store, lease_ms=600_000, renew_lease=False)
        assert guard.begin("k1", "fp")[0] == guard.begin("k2", "fp")[0] == "proceed"
        _, claim = guard.begin("done", "fp")
        guard.complete(claim, Response(201, [], b"paid"))
        out = child(["faketime", "-f", "+1h"], faked({}), AHEAD, kind, url, name)
        assert 3_540_000 < out["ahead_ms"] < 3_660_000, f"the child's wall clock is an hour ahead of the server's: {out}"
        # Claimed for 10 min less than 2 min ago (the child's start, on a loaded machine).
        assert out["store_clock"] == "in-flight" and 480_000 < out["retry_after_ms"] <= 600_000, out
        assert out["wall_clock"] == "proceed", f"the control: on its wall clock the child took k2 over: {out}"
        assert out["replayed"] == ["replay", "paid"], out
        assert guard.begin("k1", "fp")[0] == "in-flight", "k1 is still this host's"
    finally:
        store.close()
        if kind == "redis":
            import redis

            with redis.Redis.from_url(url) as raw:
                keys = list(raw.scan_iter(match=f"{name}*"))
                if keys:
                    raw.delete(*keys)
        else:
            import psycopg

            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"DROP TABLE IF EXISTS {name}; DROP FUNCTION IF EXISTS {name}_claim; "
                             f"DROP FUNCTION IF EXISTS {name}_try_claim; DELETE FROM idem_schema WHERE table_name = '{name}'")


def test_the_process_clock_is_shared_by_threads() -> None:
    seen: list[int] = []
    threads = [threading.Thread(target=lambda: seen.append(LocalClock.anchor()[0])) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(seen)) == 1, "one anchor for the process"


FORKED = r"""
import os, time
from idem_guard import SyncedClock
from idem_guard.clock import boot_ms

class Server:
    def time(self):
        return 1_765_000_000_000 + boot_ms()

server = Server()
clock = SyncedClock("a test server's clock", 100)
clock.keep_synced(server.time)
pid = os.fork()
if pid == 0:
    # The parent's syncing thread did not come along: the child's own takes readings.
    start, deadline = clock.readings, time.monotonic() + 30
    while clock.readings < start + 3:
        if time.monotonic() > deadline:
            os._exit(3)
        time.sleep(0.01)
    os._exit(0 if abs(clock.now_ms() - server.time()) <= clock.known() else 4)
_, status = os.waitpid(pid, 0)
raise SystemExit(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")
def test_a_forked_child_keeps_its_synced_clock_synced() -> None:
    done = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
