"""What the Python host does beyond the shared scenarios: store errors reach
the guest as `err` (not a trap) and a trapped instance is replaced, with
either binding; `run` renews a slow handler's lease, a retry resumes a crashed
handler from its checkpoint, and a lost renewal reply does not make the
handler run twice; expired records are purged in the background (and the
purge stops with `close()` or with the guard)."""

from __future__ import annotations

import gc
import importlib.util
import random
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from idem_guard import Attempt, Checkpoint, Guard, GuardError, ManualClock, MemoryStore, NotRecorded, Response


def guard_over(store: MemoryStore, binding: str = "static") -> Guard:
    return Guard.load(store=store, clock=ManualClock(1_000), lease_ms=100, retention_ms=10_000, binding=binding)


BINDINGS = ["static", "dynamic"]


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_store_error_from_replace_reaches_the_guest_as_err_not_a_trap(binding: str) -> None:
    # `replace` returns `result<option<u64>, store-error>`, the shape wasmtime-py
    # 51.0.0 (as 50.0.1) cannot lower an `err` for without idem_guard.component's OptionType fix
    # (the dynamic binding); the static one writes the `err` case itself.
    store = MemoryStore()
    guard = guard_over(store, binding)
    _, claim = guard.begin("k", "fp")
    store.fault("replace", "error", "store timeout", count=1)
    with pytest.raises(GuardError) as err:
        guard.complete(claim, Response(200, [], b"x"))
    assert err.value.kind == "unavailable"
    assert "store replace of key \"k\" failed: store timeout" in err.value.detail
    assert guard.replaced == 0, "the guest saw the error; the instance did not trap"
    guard.complete(claim, Response(200, [], b"x"))
    assert guard.begin("k", "fp") == ("replay", Response(200, [], b"x"))


@pytest.mark.parametrize("binding", BINDINGS)
def test_a_host_bug_traps_the_instance_which_is_replaced(binding: str) -> None:
    store = MemoryStore()
    guard = guard_over(store, binding)
    _, claim = guard.begin("k", "fp")
    store.fault("replace", "trap", count=1)
    with pytest.raises(GuardError) as err:
        guard.complete(claim, Response(200, [], b"x"))
    assert err.value.kind == "unavailable" and "instance replaced" in err.value.detail
    assert guard.replaced == 1
    # The fresh instance works, and the trapped call stored nothing: the claim still holds.
    assert guard.begin("k", "fp") == ("in-flight", 100)
    guard.complete(claim, Response(200, [], b"x"))
    assert guard.begin("k", "fp")[0] == "replay"


def native_fingerprint():
    """`conformance/fingerprint.py`: the fingerprint written from the WIT doc alone."""
    spec = importlib.util.spec_from_file_location(
        "fingerprint", Path(__file__).resolve().parents[3] / "conformance" / "fingerprint.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fingerprint_vectors_are_reproduced_natively() -> None:
    # Independently of the component: the vectors follow from the WIT's text.
    native = native_fingerprint()
    conformance = Path(__file__).resolve().parents[3] / "conformance"
    assert native.check(conformance / "fingerprint-vectors.json") >= 20
    assert native.check(conformance / "fingerprint-canonical.json") == 4


def test_the_component_and_the_native_fingerprint_agree_on_random_requests() -> None:
    native = native_fingerprint()
    guard = guard_over(MemoryStore())
    rng = random.Random(16)
    alphabet = "aAzZ-_/?=&é ÖöΣσ\u00e9x0\x7f"
    for _ in range(300):
        def word(n):
            return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, n)))
        headers = [(word(6), rng.randbytes(rng.randint(0, 4))) for _ in range(rng.randint(0, 4))]
        if headers and rng.random() < 0.3:
            headers.append((headers[0][0].swapcase(), headers[0][1]))
        method, path, body = word(5), word(12), rng.randbytes(rng.randint(0, 40))
        assert guard.fingerprint(method, path, headers, body) == native.fingerprint(method, path, headers, body), (
            method,
            path,
            headers,
            body,
        )


# A handler slower than its lease, on the system clock: halfway through, a
# repeat of the same request arrives at a second guard over the same store.
LEASE_MS = 400


def slow_handler_and_repeat(renew_lease: bool, before_handler: Callable[[MemoryStore], None] = lambda _: None):
    store = MemoryStore()
    first, second = (Guard.load(store=store, lease_ms=LEASE_MS, retention_ms=60_000, renew_lease=renew_lease) for _ in range(2))
    executions: list[str] = []
    repeat = []

    def slow(_fence: int) -> Response:
        executions.append("first")
        before_handler(store)
        time.sleep(LEASE_MS * 2.5 / 1000)
        repeat.append(second.run("slow", "fp", lambda _: (executions.append("repeat"), Response(200, [], b"repeat"))[1]))
        return Response(200, [], b"first")

    try:
        outcome: Any = first.run("slow", "fp", slow)
    except NotRecorded as e:
        outcome = e
    later = second.run("slow", "fp", lambda _: Response(500, [], b"later"))
    return outcome, repeat[0], executions, later


def test_run_renews_the_lease_while_a_slow_handler_runs_so_it_runs_once() -> None:
    outcome, repeat, executions, later = slow_handler_and_repeat(renew_lease=True)
    assert executions == ["first"]
    assert repeat.kind == "in-flight"
    assert outcome.kind == "executed"
    assert later.kind == "replayed" and later.response.body == b"first"


def test_without_renewal_the_slow_handler_is_taken_over_and_runs_twice() -> None:
    outcome, repeat, executions, _ = slow_handler_and_repeat(renew_lease=False)
    assert executions == ["first", "repeat"]
    assert repeat.kind == "executed"
    assert isinstance(outcome, NotRecorded)
    assert outcome.error.kind == "stale-claim"


def test_a_renewal_the_store_fails_is_tried_again_before_the_lease_runs_out() -> None:
    outcome, repeat, executions, _ = slow_handler_and_repeat(
        renew_lease=True, before_handler=lambda store: store.fault("replace", "error", "store down", count=1)
    )
    assert executions == ["first"]
    assert repeat.kind == "in-flight"
    assert outcome.kind == "executed"


def test_run_arms_one_renewal_thread_per_guard_not_one_per_call() -> None:
    guard = Guard.load(store=MemoryStore(), lease_ms=30_000, retention_ms=60_000)
    guard.run("first", "fp", lambda _: Response(200, [], b"ok"))
    thread = guard._renewer._thread
    assert thread is not None and thread.name == "idem-renew"
    for i in range(50):
        assert guard.run(f"k{i}", "fp", lambda _: Response(200, [], b"ok")).kind == "executed"
    assert guard._renewer._thread is thread, "fast handlers share the guard's one renewal thread"
    assert not guard._renewer._held, "every claim was let go"


def test_a_missing_component_file_is_named_with_the_command_that_writes_it(tmp_path: Path) -> None:
    missing = tmp_path / "idem-guard.wasm"
    with pytest.raises(FileNotFoundError, match="idem component --out") as err:
        Guard.load(store=MemoryStore(), component=missing)
    assert str(missing) in str(err.value)


# Checkpoints: two processes over one store and clock; the first dies in the
# middle of its handler (its thread is frozen, and a dead process renews nothing).
def test_a_handler_that_checkpoints_and_crashes_is_resumed_from_the_checkpoint_by_the_retry() -> None:
    store, clock = MemoryStore(), ManualClock(1_000_000)
    crashing, retrying = (
        Guard.load(store=store, clock=clock, lease_ms=1_000, retention_ms=60_000, renew_lease=False) for _ in range(2)
    )
    effects: list[str] = []
    checkpointed, unfreeze = threading.Event(), threading.Event()
    zombie: list[Any] = []

    def crashes(_fence: int, attempt: Attempt) -> Response:
        assert attempt.checkpoint is None, "a fresh claim has no checkpoint"
        effects.append("charge")
        attempt.save_checkpoint("charged", "receipt-7")
        checkpointed.set()
        unfreeze.wait(10)  # the process dies here
        return Response(200, [], b"zombie")

    def first() -> None:
        try:
            zombie.append(crashing.run("order-1", "fp", crashes))
        except NotRecorded as e:
            zombie.append(e)

    thread = threading.Thread(target=first)
    thread.start()
    assert checkpointed.wait(10)

    def order(_fence: int, attempt: Attempt) -> Response:
        if attempt.checkpoint is None or attempt.checkpoint.phase != "charged":
            effects.append("charge")
        effects.append(f"ship {attempt.checkpoint.data.decode() if attempt.checkpoint else ''}")
        return Response(201, [], b"shipped")

    assert retrying.run("order-1", "fp", order).kind == "in-flight", "within the lease"
    clock.advance(1_000)
    assert retrying.run("order-1", "fp", order).kind == "executed"
    assert effects == ["charge", "ship receipt-7"], "charged once, shipped from the checkpoint"
    assert store.peek("order-1", clock.now_ms()).record.checkpoint is None, "complete drops the checkpoint"

    unfreeze.set()  # the zombie wakes: its claim was taken over
    thread.join(10)
    assert isinstance(zombie[0], NotRecorded) and zombie[0].error.kind == "stale-claim", zombie
    again = retrying.run("order-1", "fp", order)
    assert again.kind == "replayed" and again.response.body == b"shipped"


def test_a_one_argument_handler_still_runs_and_a_failed_one_releases_with_its_checkpoint_kept() -> None:
    guard = Guard.load(store=MemoryStore(), clock=ManualClock(1_000_000), lease_ms=1_000, retention_ms=60_000, renew_lease=False)

    def fails(_fence: int, attempt: Attempt) -> Response:
        attempt.save_checkpoint("step-1", b"\x00\xff")
        raise RuntimeError("step 2 failed")

    with pytest.raises(RuntimeError, match="step 2 failed"):
        guard.run("k", "fp", fails)
    resumed = []

    class Handler:
        def order(self, _fence: int, attempt: Attempt) -> Response:  # a bound method: its self is not the fence
            resumed.append(attempt.checkpoint)
            return Response(200)

    assert guard.run("k", "fp", Handler().order).kind == "executed", "the release let the retry proceed at once"
    assert resumed == [Checkpoint("step-1", b"\x00\xff")]
    assert guard.run("k2", "fp", lambda fence: Response(200, [], str(fence).encode())).kind == "executed"
    status = 202
    outcome = guard.run("k3", "fp", lambda _fence, status=status: Response(status))  # a default captures, not the Attempt
    assert outcome.kind == "executed" and outcome.response.status == 202


def test_a_lost_renewal_reply_does_not_make_the_handler_run_twice() -> None:
    store, clock = MemoryStore(), ManualClock(1_000_000)
    first, second = (Guard.load(store=store, clock=clock, lease_ms=300, retention_ms=60_000) for _ in range(2))  # renewed every 100 ms
    executions: list[str] = []
    repeat = []

    def handler(_fence: int, attempt: Attempt) -> Response:
        executions.append("first")
        store.fault("replace", "lost", count=1)  # the next renewal is applied, its reply lost
        clock.advance(200)
        deadline = time.monotonic() + 5
        while attempt.fence == 1:
            assert time.monotonic() < deadline, "no renewal within 5 s"
            time.sleep(0.01)
        # Read back and found applied: fence 2. (Taken as failed, the next tick would have written fence 3.)
        assert attempt.fence == 2
        clock.advance(200)  # past the first lease; within the renewed one
        repeat.append(second.run("k", "fp", lambda _: (executions.append("repeat"), Response(200, [], b"repeat"))[1]))
        return Response(200, [], b"first")

    outcome = first.run("k", "fp", handler)
    assert repeat[0].kind == "in-flight", "the renewal was read back as applied"
    assert outcome.kind == "executed", "and the completion went on from the renewed claim"
    assert executions == ["first"]
    assert second.run("k", "fp", lambda _: Response(500)).kind == "replayed"


# --- the purge of expired records ---------------------------------------------


def eventually(done: Callable[[], bool], what: str) -> None:
    """Waits up to 10 s (a loaded machine's threads run late) until `done()`."""
    deadline = time.monotonic() + 10
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"not within 10 s: {what}")
        time.sleep(0.005)


def completed(guard: Guard, *keys: str) -> None:
    for key in keys:
        kind, claim = guard.begin(key, "fp")
        assert kind == "proceed"
        guard.complete(claim, Response(200, [], key.encode()))


def test_memory_store_purge_frees_at_most_limit_expired_records_and_keeps_live_ones() -> None:
    store = MemoryStore()
    completed(Guard(store=store, clock=ManualClock(1_000), lease_ms=10, retention_ms=100, purge_every_ms=0), "a", "b", "c")
    completed(Guard(store=store, clock=ManualClock(1_050), lease_ms=10, retention_ms=100, purge_every_ms=0), "live")
    assert store.purge_expired(1_099, 10) == 0
    assert store.purge_expired(1_100, 2) == 2
    assert store.purge_expired(1_100, 10) == 1
    assert len(store) == 1 and store.peek("live", 1_100).record.state == "done"
    with pytest.raises(ValueError, match="limit 0 must be a positive whole number"):
        store.purge_expired(1_100, 0)
    # A purged key is absent: another fingerprint is no conflict, it claims the key anew, at fence 1.
    kind, claim = Guard(store=store, clock=ManualClock(1_000), purge_every_ms=0).begin("a", "other")
    assert (kind, claim.fence) == ("proceed", 1)


def test_a_guard_purges_expired_records_every_period_in_batches_until_closed() -> None:
    store, clock = MemoryStore(), ManualClock(1_000)
    guard = Guard(store=store, clock=clock, lease_ms=10, retention_ms=100, purge_every_ms=20)
    assert guard.purge_stats.every_ms == 20
    completed(guard, *(f"k{i}" for i in range(2_500)))
    clock.advance(50)  # none expired yet: a run frees nothing
    eventually(lambda: guard.purge_stats.runs >= 1, "a first purge run")
    assert len(store) == 2_500
    clock.advance(100)
    # Waited for by its count: records are gone a moment before the run that freed them is counted.
    eventually(lambda: guard.purge_stats.purged >= 2_500, "the 2,500 expired records purged")
    assert len(store) == 0
    assert guard.purge_stats.purged == 2_500
    assert guard.purge_stats.last_purged == 2_500, "one run of three batches (1,000, 1,000, 500)"
    assert guard.purge_stats.errors == 0
    guard.close()
    runs = guard.purge_stats.runs
    completed(guard, "after")
    clock.advance(1_000)
    time.sleep(0.1)
    assert guard.purge_stats.runs == runs, "no run after close"
    assert len(store) == 1


def test_a_failing_purge_is_counted_and_retried_and_purge_every_ms_0_never_purges() -> None:
    class Failing(MemoryStore):
        fail = True

        def purge_expired(self, now_ms: int, limit: int) -> int:
            if self.fail:
                raise RuntimeError("disk on fire")
            return super().purge_expired(now_ms, limit)

    store, clock = Failing(), ManualClock(1_000)
    guard = Guard(store=store, clock=clock, lease_ms=10, retention_ms=100, purge_every_ms=10)
    completed(guard, "k")
    clock.advance(200)
    eventually(lambda: guard.purge_stats.errors >= 1, "a failed run")
    assert guard.purge_stats.last_error == "disk on fire" and len(store) == 1
    store.fail = False
    eventually(lambda: len(store) == 0, "the next period purging")
    guard.close()
    assert Guard(store=MemoryStore(), purge_every_ms=0).purge_stats.every_ms == 0
    with pytest.raises(ValueError, match="purge_every_ms -1 must be a whole number of milliseconds, 0 for never"):
        Guard(purge_every_ms=-1)


def test_the_purge_does_not_keep_a_guard_dropped_without_close_alive() -> None:
    guard = Guard(store=MemoryStore(), purge_every_ms=10)
    assert guard.purge_stats.every_ms == 10
    gone = weakref.ref(guard)
    del guard
    gc.collect()
    assert gone() is None
