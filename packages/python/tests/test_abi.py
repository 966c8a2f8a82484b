"""The static binding (`idem_guard.abi`) against the reference (`idem_guard.component`,
wasmtime's own canonical ABI): the same random calls, stores and faults give the
same answers and the same stored records. And what it refuses: a component whose
core signatures are not the WIT mirror's. And the `response` handles, in both
bindings: complete stores the very response, a replay hands back the stored
one, and no handle outlives a call, whether it returned, failed or trapped."""

from __future__ import annotations

import gc
import os
import random
from pathlib import Path
from typing import Any

import pytest

from idem_guard import DEFAULT_COMPONENT, Checkpoint, Guard, GuardError, ManualClock, MemoryStore, Response, StoreFault
from idem_guard import abi as idem_abi

COMPONENT = Path(os.environ.get("IDEM_COMPONENT") or DEFAULT_COMPONENT)


class Corrupting(MemoryStore):
    """A MemoryStore whose next `get`, `insert` or `replace` may answer `corrupt`."""

    corrupt_next = False

    def _apply(self, primitive: str, operation: Any) -> Any:
        if self.corrupt_next and primitive in ("get", "insert", "replace"):
            self.corrupt_next = False
            raise StoreFault("corrupt", f"bytes for {primitive} do not decode (injected)")
        return super()._apply(primitive, operation)


class SeededRandom:
    """Holder ids from a seeded generator: both bindings draw the same ones."""

    def __init__(self, seed: int):
        self._rng = random.Random(seed)

    def random_u64(self) -> int:
        return self._rng.getrandbits(64)


def outcome(call: Any) -> Any:
    try:
        return ("ok", call())
    except GuardError as e:
        return ("error", e.kind, e.detail)


def test_random_calls_answer_and_store_the_same_through_both_bindings() -> None:
    rng = random.Random(17)
    sides = []
    for binding in ("static", "dynamic"):
        store, clock = Corrupting(), ManualClock(1_000)
        guard = Guard.load(
            store=store, clock=clock, random=SeededRandom(17), lease_ms=50, retention_ms=400, max_response_bytes=64, binding=binding
        )
        sides.append((guard, store, clock))
    keys = ["a", "b", "ключ", "k\u200b", "x" * 255]
    text = "aZ-/é Σ日\u00e9"
    claims = []
    checkpointed = stored_checkpoints = 0
    for step in range(400):
        op = rng.choice(["begin", "begin", "request", "complete", "complete", "release", "renew", "checkpoint", "clock", "fault", "corrupt"])
        if op == "clock":
            ms = rng.choice([1, 10, 49, 50, 51, 400])
            for _, _, clock in sides:
                clock.advance(ms)
            continue
        if op == "fault":
            primitive, kind = rng.choice(["get", "insert", "replace"]), rng.choice(["error", "lost"])
            for _, store, _ in sides:
                store.fault(primitive, kind, "down", count=1)
            continue
        if op == "corrupt":
            for _, store, _ in sides:
                store.corrupt_next = True
            continue
        if op == "begin":
            key, fp = rng.choice(keys), rng.choice(["fp-1", "fp-2"])
            answers = [outcome(lambda g=g: g.begin(key, fp)) for g, _, _ in sides]
            if answers[0][0] == "ok" and answers[0][1][0] == "proceed":
                claims.append(answers[0][1][1])
        elif op == "request":
            key = rng.choice(keys)
            request = (rng.choice(["POST", "get"]), rng.choice(["/a", "/ü"]), [(rng.choice(["x", "Y"]), rng.randbytes(3))], rng.randbytes(20))
            answers = [outcome(lambda g=g: g.begin_request(key, *request)) for g, _, _ in sides]
            if answers[0][0] == "ok" and answers[0][1][0] == "proceed":
                claims.append(answers[0][1][1])
        elif not claims:
            continue
        elif op == "complete":
            claim = rng.choice(claims)
            headers = [("".join(rng.choice(text) for _ in range(rng.randint(1, 6))), rng.randbytes(rng.randint(0, 5))) for _ in range(rng.randint(0, 3))]
            response = Response(rng.choice([200, 201, 404, 99, 1000]), headers, rng.randbytes(rng.randint(0, 40)))
            answers = [outcome(lambda g=g: g.complete(claim, response)) for g, _, _ in sides]
        elif op == "release":
            claim = rng.choice(claims)
            answers = [outcome(lambda g=g: g.release(claim)) for g, _, _ in sides]
        elif op == "checkpoint":
            claim = claims[-1] if rng.random() < 0.5 else rng.choice(claims)  # the latest is the likeliest current one
            checkpoint = Checkpoint(rng.choice(["charged", "é", "", "x" * 65]), rng.randbytes(rng.randint(0, 70)))
            answers = [outcome(lambda g=g: g.save_checkpoint(claim, checkpoint)) for g, _, _ in sides]
            if answers[0][0] == "ok":
                claims.append(answers[0][1])
                checkpointed += 1
        else:
            claim = rng.choice(claims)
            answers = [outcome(lambda g=g: g.renew(claim)) for g, _, _ in sides]
            if answers[0][0] == "ok":
                claims.append(answers[0][1])
        assert answers[0] == answers[1], (step, op, answers)
        now = sides[0][2].now_ms()
        stored = [sides[0][1].peek(k, now) for k in keys]
        assert stored == [sides[1][1].peek(k, now) for k in keys], (step, op)
        stored_checkpoints += sum(e is not None and e.record.checkpoint is not None for e in stored)
    assert sides[0][0].replaced == 0, "no call of the static binding trapped"
    assert sides[1][0].replaced == 0, "nor of the dynamic one"
    assert checkpointed >= 5 and stored_checkpoints > 0, (checkpointed, stored_checkpoints)


def test_fingerprints_agree_through_both_bindings() -> None:
    rng = random.Random(18)
    static, dynamic = (Guard.load(binding=b, renew_lease=False) for b in ("static", "dynamic"))
    for _ in range(50):
        headers = [(rng.choice(["a", "B", "ü", ""]), rng.randbytes(rng.randint(0, 4))) for _ in range(rng.randint(0, 4))]
        args = (rng.choice(["get", "POST", "ß"]), "/p?" + rng.choice(["", "q=1", "日"]), headers, rng.randbytes(rng.randint(0, 30)))
        assert static.fingerprint(*args) == dynamic.fingerprint(*args)


def test_a_component_whose_core_signatures_moved_is_refused_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    # As if `get` had gained a parameter: the WIT mirror's no longer matches the guest's.
    params, results = idem_abi.IMPORTS[("store", "get")]
    monkeypatch.setitem(idem_abi.IMPORTS, ("store", "get"), ([*params[:-1], "i32", "i32"], results))
    with pytest.raises(idem_abi.AbiViolation, match="get: core signature"):
        idem_abi.Guest(COMPONENT.read_bytes())
    with pytest.raises(idem_abi.AbiViolation, match="not a component"):
        idem_abi.Guest(b"\0asm\x01\x00\x00\x00")


def test_the_layouts_are_the_canonical_abis() -> None:
    # Offsets by the canonical ABI's rules (design/mvp/CanonicalABI.md) for wit/:
    # a claim in begin's result at +16..+88; complete's parameters in 104 bytes,
    # the claim at 0, the response's handle (an i32) at 72, the policy at 80.
    assert idem_abi.BEGIN_RESULT.payload + idem_abi.DECISION.payload == 16
    assert idem_abi.CLAIM.offset == {
        "key": 0,
        "fingerprint": 8,
        "fence": 16,
        "holder": 24,
        "lease_until_ms": 32,
        "expires_at_ms": 40,
        "checkpoint": 48,
    }
    sizes = (idem_abi.RECORD.size, idem_abi.ENTRY.size, idem_abi.INSERT_RESULT.size, idem_abi.GET_RESULT.size)
    assert sizes == (64, 80, 96, 96)
    assert idem_abi.ENTRY.offset == {"record": 0, "response": 64, "version": 72}
    assert (idem_abi.PARAMS["complete"].size, idem_abi.PARAMS["complete"].offset) == (104, {"0": 0, "1": 72, "2": 80})
    assert len(idem_abi.RECORD.flat) == 11, "the response is no longer in the record"
    insert = ["i32"] * 5 + ["i64"] * 3 + ["i32"] * 5 + ["i64", "i32"]
    assert idem_abi.IMPORTS[("store", "insert")] == (insert, []), "14 flat values: passed flat, the result by pointer"
    assert idem_abi.IMPORTS[("store", "replace")] == (["i32", "i32"], []), "17 flat values: passed by pointer"
    assert idem_abi.IMPORTS[("types", "[method]response.same-as")] == (["i32", "i32"], ["i32"])
    assert idem_abi.IMPORTS[("types", "[resource-drop]response")] == (["i32"], [])
    assert idem_abi.EXPORTS["complete"][0] == ["i32"] and len(idem_abi.EXPORTS["renew"][0]) == 16
    # 0.3: replace answers `result<bool, store-error>`: the bool at 4 (the error's alignment), 16 bytes.
    assert (idem_abi.REPLACE_RESULT.size, idem_abi.REPLACE_RESULT.payload) == (16, 4)


def test_the_03_guard_imports_neither_delete_nor_the_responses_constructor_or_bytes() -> None:
    # What the component's core module imports, checked at load against the WIT mirror: the
    # constructor, `headers` and `body` of wit/types.wit are for a store written as a component,
    # and `delete` is the operators' (a host store never needs the first three from the guard).
    assert sorted(idem_abi.Guest(COMPONENT.read_bytes()).imports) == [
        ("clock", "now-ms"),
        ("random", "random-u64"),
        ("store", "get"),
        ("store", "insert"),
        ("store", "replace"),
        ("types", "[method]response.same-as"),
        ("types", "[method]response.size"),
        ("types", "[method]response.status"),
        ("types", "[resource-drop]response"),
    ]


class OldReplace(MemoryStore):
    """A store written for 0.2: `replace` answers the new version or None."""

    def replace(self, key: str, expected_version: int, record: Any, now_ms: int) -> Any:
        return expected_version + 1 if super().replace(key, expected_version, record, now_ms) else None


@pytest.mark.parametrize("binding", ["static", "dynamic"])
def test_a_replace_that_answers_anything_but_a_bool_fails_closed(binding: str) -> None:
    guard = Guard.load(store=OldReplace(), clock=ManualClock(1_000), renew_lease=False, binding=binding)
    _, claim = guard.begin("k", "fp")
    with pytest.raises(GuardError) as err:
        guard.complete(claim, Response(200))
    assert err.value.kind == "unavailable" and "store.replace returned 2; a 0.3 store returns True" in err.value.detail


def test_dropped_instances_free_their_host_functions() -> None:
    Guard.load(renew_lease=False)
    gc.collect()
    before = len(idem_abi._HOST_FUNCS)
    for _ in range(20):
        guard = Guard.load(renew_lease=False)
        guard.begin("k", "fp")
    del guard
    gc.collect()
    assert len(idem_abi._HOST_FUNCS) <= before


@pytest.mark.parametrize("binding", ["static", "dynamic"])
def test_a_response_larger_than_the_guests_memory_replays_byte_for_byte(binding: str) -> None:
    # The response is a host resource: its bytes never cross into the guest, so
    # neither binding copies them (the dynamic one refused a copy past about
    # 2 MB when the response was a record).
    guard = Guard.load(
        store=MemoryStore(), clock=ManualClock(1_000), max_response_bytes=8 << 20, renew_lease=False, binding=binding
    )
    body = bytes((i * 7) & 0xFF for i in range(3 << 20))  # past the 1.1 MB the guest starts with
    headers = [("x-big", body[:70_000])]
    _, claim = guard.begin("big", "fp")
    guard.complete(claim, Response(200, headers, body))
    assert guard.begin("big", "fp") == ("replay", Response(200, headers, body))
    assert guard.replaced == 0


@pytest.mark.parametrize("binding", ["static", "dynamic"])
def test_a_status_over_u16_fails_closed_instead_of_wrapping_to_200(binding: str) -> None:
    store = MemoryStore()
    guard = Guard.load(store=store, clock=ManualClock(1_000), renew_lease=False, binding=binding)
    _, claim = guard.begin("k", "fp")
    with pytest.raises(GuardError) as err:
        guard.complete(claim, Response(65_536 + 200, [], b"x"))  # 200 if an i32 were cut to a u16
    assert err.value.kind == "unavailable"
    assert store.peek("k", 1_000).record.state == "processing", "nothing was stored"


# --- the response handle table ----------------------------------------------

# Header names beyond ASCII, an empty value, a repeated name, a body of every byte.
ODD = Response(299, [("x-é", b"\x00\xff"), ("x-empty", b""), ("x-é", b"again")], bytes(range(256)) * 3)


def instance(guard: Guard) -> Any:
    """The guard's current instance (a trap replaces it)."""
    return guard._instantiate()


@pytest.mark.parametrize("binding", ["static", "dynamic"])
def test_complete_stores_the_response_and_a_replay_hands_back_that_very_response(binding: str) -> None:
    store = MemoryStore()
    guard = Guard.load(store=store, clock=ManualClock(1_000), renew_lease=False, binding=binding)
    _, claim = guard.begin("k", "fp")
    guard.complete(claim, ODD)
    stored = store.peek("k", 1_000).record.response
    assert stored == ODD, "stored byte for byte"
    kind, replayed = guard.begin("k", "fp")
    # The guest never saw the bytes: the handle a store read gave it comes
    # back, and lifting it takes the store's own Response out of the table.
    assert kind == "replay" and replayed is stored
    assert (replayed.status, replayed.headers, replayed.body) == (ODD.status, ODD.headers, ODD.body)
    handles = instance(guard).handles
    assert len(handles) == 0 and handles.stray == 0


@pytest.mark.parametrize("binding", ["static", "dynamic"])
def test_the_guest_drops_or_hands_back_every_handle_it_is_given(binding: str) -> None:
    store = MemoryStore()
    clock = ManualClock(1_000)
    guard = Guard.load(store=store, clock=clock, lease_ms=100, renew_lease=False, binding=binding)
    handles = instance(guard).handles
    given: list[int] = []
    own = handles.own
    handles.own = lambda response: given.append(1) or own(response)  # type: ignore[method-assign]

    _, claim = guard.begin("k", "fp")
    guard.complete(claim, ODD)  # complete's handle: read, lent to replace, dropped
    assert guard.begin("k", "fp")[0] == "replay"  # insert's entry: handed back
    assert guard.begin("k", "other")[0] == "conflict"  # insert's entry: dropped
    with pytest.raises(GuardError, match="stale-claim"):
        guard.renew(claim)  # replace refused; the read-back's entry: dropped
    store.fault("replace", "error", count=1)
    _, second = guard.begin("k2", "fp")
    with pytest.raises(GuardError, match="unavailable"):
        guard.complete(second, ODD)  # a store error; the read-back's record is processing: no handle
    assert given == [1] * 5
    assert instance(guard) is not None and guard.replaced == 0
    assert len(handles) == 0 and handles.stray == 0, "no handle was left for the host to clear"


@pytest.mark.parametrize("binding", ["static", "dynamic"])
def test_a_lost_reply_to_complete_is_recognised_with_same_as(binding: str) -> None:
    # The read-back finds the record this complete meant: same-as the response being stored.
    store = MemoryStore()
    guard = Guard.load(store=store, clock=ManualClock(1_000), renew_lease=False, binding=binding)
    _, claim = guard.begin("k", "fp")
    store.fault("replace", "lost", count=1)
    guard.complete(claim, ODD)
    assert store.peek("k", 1_000).record.response == ODD
    handles = instance(guard).handles
    assert len(handles) == 0 and handles.stray == 0
    # The same claim completing again with another response: done by this holder, not the record meant.
    with pytest.raises(GuardError, match="stale-claim"):
        guard.complete(claim, Response(200, ODD.headers, ODD.body + b"!"))
    assert len(handles) == 0 and handles.stray == 0


@pytest.mark.parametrize("binding", ["static", "dynamic"])
def test_handles_are_cleared_after_a_trap(binding: str) -> None:
    store = MemoryStore()
    guard = Guard.load(store=store, clock=ManualClock(1_000), renew_lease=False, binding=binding)
    _, claim = guard.begin("k", "fp")
    # A host bug in replace, while the guest lends it complete's handle: the instance traps.
    trapped = instance(guard)
    store.fault("replace", "trap", count=1)
    with pytest.raises(GuardError, match="unavailable"):
        guard.complete(claim, ODD)
    assert guard.replaced == 1 and len(trapped.handles) == 0 and trapped.handles.stray == 1
    # A status that is no u16 is refused by `response.status` (a trap, never cut to 16 bits).
    trapped = instance(guard)
    with pytest.raises(GuardError, match="unavailable"):
        guard.complete(claim, Response(65_536 + 200))
    assert guard.replaced == 2 and len(trapped.handles) == 0 and trapped.handles.stray == 1
    guard.complete(claim, ODD)  # the claim is still current: nothing was stored
    assert guard.begin("k", "fp") == ("replay", ODD)


def test_a_handle_the_table_does_not_hold_is_an_abi_violation() -> None:
    handles = idem_abi.Handles()
    first, second = handles.own(ODD), handles.own(ODD)
    assert (first, second) == (1, 2), "0 is never a handle"
    assert handles.borrow(first) is ODD and len(handles) == 2
    assert handles.take(first) is ODD
    for use in (handles.borrow, handles.take):
        with pytest.raises(idem_abi.AbiViolation, match="handle 1 is not in the handle table"):
            use(first)
    handles.clear()
    assert len(handles) == 0 and handles.stray == 1 and handles.own(ODD) == 1


def test_the_response_methods_count_and_compare_bytes() -> None:
    from idem_guard.types import response_size, same_response, status_u16

    assert response_size(Response(200, [("é", b"ab"), ("x", b"")], b"xyz")) == 2 + 2 + 1 + 3, "names in UTF-8 bytes"
    assert same_response(ODD, Response(ODD.status, list(ODD.headers), bytes(ODD.body)))
    assert not same_response(ODD, Response(ODD.status, ODD.headers[::-1], ODD.body)), "header order counts"
    assert not same_response(ODD, Response(ODD.status, ODD.headers[:2], ODD.body))
    assert not same_response(ODD, Response(298, ODD.headers, ODD.body))
    assert status_u16(Response(999)) == 999
    with pytest.raises(ValueError, match="not a u16"):
        status_u16(Response(1 << 16))
