"""`idempotent_function` and `idempotent`: the function runs once per key,
repeats get the stored return value, and the refusals raise typed errors."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import decimal
import enum
import json
import uuid
from typing import Any

import pytest

from idem_guard import (
    AlreadyInProgress,
    AsyncGuard,
    Guard,
    IdempotencyKeyMissing,
    MemoryStore,
    NotRecorded,
    PayloadMismatch,
    ResultNotStored,
    StoreUnavailable,
    idempotent,
    idempotent_function,
)
from idem_guard.functions import canonical_json


def test_runs_once_per_key_and_replays_the_stored_value() -> None:
    guard = Guard()
    calls = []

    @idempotent_function(guard=guard, data_keyword_argument="order", key=lambda order: order["id"])
    def charge(order: dict) -> dict:
        calls.append(order)
        return {"charged": order["cents"], "items": ("a", "b")}

    first = charge(order={"id": "o-1", "cents": 1000})
    again = charge({"cents": 1000, "id": "o-1"})  # positional, keys in another order: the same payload
    assert calls == [{"id": "o-1", "cents": 1000}]
    assert first == {"charged": 1000, "items": ("a", "b")}  # the function's own value
    assert again == {"charged": 1000, "items": ["a", "b"]}  # decoded from the stored JSON
    with pytest.raises(PayloadMismatch) as refused:
        charge(order={"id": "o-1", "cents": 5})
    assert "o-1" in refused.value.key and len(calls) == 1

    # The store key is namespace#key; what is stored: 200, application/json, the compact JSON of the value.
    assert refused.value.key == f"{charge.__module__}.{charge.__qualname__}#o-1"
    entry = guard.store.peek(refused.value.key, guard.clock.now_ms())
    response = entry.record.response
    assert (response.status, response.headers) == (200, [("content-type", b"application/json")])
    assert json.loads(response.body) == {"charged": 1000, "items": ["a", "b"]}


def test_key_from_a_named_argument_and_payload_from_selected_arguments() -> None:
    guard = Guard()
    runs = []

    @idempotent_function(guard=guard, key="request_id", payload=["cents"], namespace="pay")
    def pay(request_id: str, cents: int, note: str = "") -> int:
        runs.append(note)
        return len(runs)

    assert pay("r-1", 100, note="first") == 1
    assert pay("r-1", 100, note="ignored: not in the payload") == 1
    with pytest.raises(PayloadMismatch):
        pay("r-1", 200)
    assert pay("r-2", 200) == 2
    assert guard.store.peek("pay#r-1", guard.clock.now_ms()) is not None


def test_without_a_key_the_payload_hash_is_the_key() -> None:
    runs = []

    @idempotent_function(guard=Guard(), data_keyword_argument="event")
    def handle(event: dict) -> str:
        runs.append(event)
        return "ok"

    assert [handle({"a": 1}), handle({"a": 1}), handle({"a": 2})] == ["ok", "ok", "ok"]
    assert len(runs) == 2


def test_a_none_key_runs_unguarded_or_raises() -> None:
    runs = []

    @idempotent_function(guard=Guard(), data_keyword_argument="e", key=lambda e: e.get("id"))
    def lenient(e: dict) -> int:
        runs.append(e)
        return len(runs)

    assert [lenient({}), lenient({})] == [1, 2]

    @idempotent_function(guard=Guard(), data_keyword_argument="e", key=lambda e: e.get("id"), raise_on_no_idempotency_key=True)
    def strict(e: dict) -> int:
        return 0

    with pytest.raises(IdempotencyKeyMissing):
        strict({})


def test_an_exception_releases_the_key_and_a_retry_runs() -> None:
    attempts = []

    @idempotent_function(guard=Guard(), key="k")
    def flaky(k: str) -> str:
        attempts.append(k)
        if len(attempts) == 1:
            raise ConnectionError("downstream failed")
        return "done"

    with pytest.raises(ConnectionError):
        flaky("k-1")
    assert flaky("k-1") == "done"
    assert flaky("k-1") == "done"
    assert len(attempts) == 2


def test_a_value_json_cannot_encode_is_stored_as_a_failure_and_never_runs_again() -> None:
    guard = Guard()
    attempts = []

    @idempotent_function(guard=guard, key="k")
    def makes(k: str) -> object:
        attempts.append(k)
        return object() if len(attempts) == 1 else "fine"

    with pytest.raises(ResultNotStored, match="not JSON-serialisable") as first:
        makes("k")
    assert first.value.value is not None  # the call that ran gets the value it made
    with pytest.raises(ResultNotStored, match="earlier call") as again:
        makes("k")
    assert again.value.value is None
    assert attempts == ["k"]  # never run a second time because of what it returned
    stored = guard.store.peek(first.value.key, guard.clock.now_ms()).record.response
    assert (stored.status, stored.headers) == (500, [("content-type", b"application/json"), ("idem-result", b"unstorable")])
    assert json.loads(stored.body)["error"].startswith("Unstorable: object is not JSON-serialisable")


def test_the_datetime_case_runs_once_and_replays_a_datetime() -> None:
    """Issue #46: `{"at": datetime.now()}` ran, failed to encode, released its key, and ran again."""
    effects = []

    @idempotent_function(guard=Guard(), key="k")
    def charge(k: str) -> dict:
        effects.append(k)
        return {"at": datetime.datetime(2026, 12, 7, 2, 30, tzinfo=datetime.UTC), "cents": decimal.Decimal("10.05")}

    first, again = charge("o-1"), charge("o-1")
    assert effects == ["o-1"]
    assert first["at"] == datetime.datetime(2026, 12, 7, 2, 30, tzinfo=datetime.UTC)
    assert again == {"at": "2026-12-07T02:30:00+00:00", "cents": "10.05"}  # -> dict: the JSON as it is

    @idempotent_function(guard=Guard(), key="k")
    def stamp(k: str) -> datetime.datetime:
        effects.append(k)
        return datetime.datetime(2026, 12, 7, 2, 30, 1, 500, tzinfo=datetime.UTC)

    assert stamp("s") == stamp("s") == datetime.datetime(2026, 12, 7, 2, 30, 1, 500, tzinfo=datetime.UTC)
    assert isinstance(stamp("s"), datetime.datetime) and effects == ["o-1", "s"]


@dataclasses.dataclass(frozen=True)
class Receipt:
    id: uuid.UUID
    cents: decimal.Decimal
    at: datetime.date
    tags: tuple[str, ...]
    kind: Kind


class Kind(enum.Enum):
    CARD = "card"
    BANK = "bank"


def test_the_common_types_replay_as_the_annotated_type() -> None:
    runs = []

    @idempotent_function(guard=Guard(), key="k")
    def pay(k: str) -> Receipt:
        runs.append(k)
        return Receipt(uuid.UUID(int=7), decimal.Decimal("0.10"), datetime.date(2026, 1, 2), ("a", "b"), Kind.BANK)

    @idempotent_function(guard=Guard(), key="k")
    def ids(k: str) -> list[uuid.UUID]:
        runs.append(k)
        return [uuid.UUID(int=1), uuid.UUID(int=2)]

    first = pay("p")
    assert pay("p") == first and isinstance(pay("p").cents, decimal.Decimal)
    assert ids("i") == ids("i") == [uuid.UUID(int=1), uuid.UUID(int=2)]
    assert runs == ["p", "i"]


def test_pydantic_models_are_stored_and_replayed_as_models() -> None:
    pydantic = pytest.importorskip("pydantic")

    class Order(pydantic.BaseModel):
        id: uuid.UUID
        at: datetime.datetime
        total: decimal.Decimal

    runs = []
    guard = AsyncGuard()

    @idempotent_function(guard=guard, key="k")
    async def place(k: str) -> Order:
        runs.append(k)
        return Order(id=uuid.UUID(int=3), at=datetime.datetime(2026, 5, 1, 12), total=decimal.Decimal("9.99"))

    async def main() -> None:
        first, again = await place("o"), await place("o")
        assert again == first and isinstance(again, Order)

    asyncio.run(main())
    assert runs == ["o"]


class Opaque:
    pass


def test_a_return_type_that_cannot_be_stored_is_refused_when_decorated() -> None:
    with pytest.raises(TypeError, match=r"returns Opaque, which the decorator cannot store.*encode="):

        @idempotent_function(guard=Guard(), key="k")
        def f(k: str) -> Opaque:
            return Opaque()

    with pytest.raises(TypeError, match="bytes are not JSON"):

        @idempotent_function(guard=Guard(), key="k")
        def g(k: str) -> dict[str, bytes]:
            return {}

    @dataclasses.dataclass
    class Holder:
        thing: Opaque

    with pytest.raises(TypeError, match=r"field 'thing' of .*Holder"):
        idempotent_function(guard=Guard(), key="k")(_returns(Holder))

    # A custom encoder takes the responsibility: no check.
    idempotent_function(guard=Guard(), key="k", encode=lambda v: b"x", decode=lambda b: None)(_returns(Opaque))


def _returns(tp: type) -> Any:
    def f(k: str) -> Any:
        return tp()

    f.__annotations__["return"] = tp
    return f


def test_a_forward_reference_is_checked_at_the_first_call_before_anything_runs() -> None:
    runs = []

    @idempotent_function(guard=Guard(), key="k")
    def later(k: str) -> NotYetDefined:
        runs.append(k)
        return NotYetDefined()

    class NotYetDefined:
        pass

    globals()["NotYetDefined"] = NotYetDefined
    try:
        with pytest.raises(TypeError, match=r"returns .*NotYetDefined"):
            later("k")
        assert runs == []
    finally:
        del globals()["NotYetDefined"]


def test_a_nan_under_a_float_annotation_is_stored_as_a_failure() -> None:
    runs = []

    @idempotent_function(guard=Guard(), key="k")
    def ratio(k: str) -> float:
        runs.append(k)
        return float("nan")

    for _ in range(3):
        with pytest.raises(ResultNotStored, match="Out of range float values"):
            ratio("r")
    assert runs == ["r"]


def test_store_down_raises_unavailable_and_nothing_runs() -> None:
    store = MemoryStore()
    runs = []

    @idempotent_function(guard=Guard(store=store), key="k")
    def f(k: str) -> int:
        runs.append(k)
        return 1

    store.fault("insert", kind="error", message="connection refused")
    store.fault("get", kind="error", message="connection refused")
    with pytest.raises(StoreUnavailable, match="connection refused"):
        f("k")
    assert runs == []
    store.clear_faults()
    assert f("k") == 1


def test_a_result_the_store_cannot_record_is_not_recorded() -> None:
    store = MemoryStore()

    @idempotent_function(guard=Guard(store=store), key="k")
    def f(k: str) -> int:
        store.fault("replace", kind="error", count=1)
        return 1

    with pytest.raises(NotRecorded):
        f("k")


def test_the_fence_is_handed_to_the_named_parameter() -> None:
    @idempotent_function(guard=Guard(), key="k", fence_keyword_argument="fence")
    def f(k: str, fence: int = 0) -> int:
        return fence

    fence = f("k")
    assert fence > 0 and f("k") == fence


def test_dataclasses_are_encoded_as_dicts_and_custom_codecs_apply() -> None:
    @dataclasses.dataclass
    class Order:
        id: str
        cents: int

    @idempotent_function(
        guard=Guard(),
        data_keyword_argument="order",
        key=lambda order: order.id,
        encode=lambda v: repr(v).encode(),
        decode=lambda b: ("decoded", b.decode()),
    )
    def place(order: Order) -> list:
        return [order.cents]

    assert place(Order("o", 5)) == [5]
    assert place(Order("o", 5)) == ("decoded", "[5]")
    assert canonical_json(Order("o", 5)) == b'{"cents":5,"id":"o"}'


def test_async_functions_need_an_async_guard_and_raise_in_progress_with_retry_after() -> None:
    guard = AsyncGuard(lease_ms=10_000)
    started = asyncio.Event()
    finish = asyncio.Event()

    @idempotent_function(guard=guard, key="k")
    async def slow(k: str) -> str:
        started.set()
        await finish.wait()
        return "slow done"

    async def main() -> None:
        first = asyncio.ensure_future(slow("k"))
        await started.wait()
        with pytest.raises(AlreadyInProgress) as busy:
            await slow("k")
        assert 0 < busy.value.retry_after <= 10 and busy.value.retry_after_ms <= 10_000
        finish.set()
        assert await first == "slow done"
        assert await slow("k") == "slow done"

    asyncio.run(main())

    with pytest.raises(TypeError, match="AsyncGuard"):
        idempotent_function(guard=Guard(), key="k")(slow.__wrapped__)
    with pytest.raises(TypeError, match="needs a Guard"):
        idempotent_function(guard=guard, key="k")(lambda k: k)
    with pytest.raises(TypeError, match="not a parameter"):
        idempotent_function(guard=Guard(), key="nope")(lambda k: k)


def test_idempotent_takes_the_event_as_the_payload() -> None:
    runs = []

    @idempotent(guard=Guard(), key=lambda event: event["order_id"])
    def handler(event: dict, context: object = None) -> dict:
        runs.append(event)
        return {"statusCode": 200}

    assert handler({"order_id": "1", "x": 1}, object()) == {"statusCode": 200}
    assert handler({"order_id": "1", "x": 1}, object()) == {"statusCode": 200}
    with pytest.raises(PayloadMismatch):
        handler({"order_id": "1", "x": 2}, None)
    assert len(runs) == 1
