"""The expiry told to clients (issue #45): until when a key's stored response is
replayed is the `expires_at_ms` of its stored record, and the guard learns it
from the records its store calls pass — on `run`'s outcomes, `begin`'s replay
decision and `complete`'s result — and the ASGI middleware and the FastAPI
route class send it on every stored response as `Idempotency-Expires`, an
HTTP-date rounded down to the second. Each expectation is read from the store
itself, not from the clock."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from idem_guard import AsyncGuard, Decided, Guard, ManualClock, MemoryStore, Response
from idem_guard.asgi import IdempotencyMiddleware
from idem_guard.fastapi import Idempotency
from idem_guard.http import http_date, scoped_key
from idem_guard.redis import AsyncRedisStore
from stores import AsyncMemory, server_url, unique
from test_http_conformance import Got, exchange


async def stored_expiry(store: Any, key: str, now_ms: int) -> int:
    """The `expires_at_ms` of `key`'s stored (done) record, read from the store at `now_ms`."""
    entry = store.get(key, now_ms)
    if inspect.isawaitable(entry):
        entry = await entry
    assert entry is not None and entry.record.state == "done", f"{key} is stored"
    expires_at_ms: int = entry.record.expires_at_ms
    return expires_at_ms


def respond(body: bytes) -> Any:
    return lambda fence: Response(201, [("content-type", b"text/plain")], body)


@pytest.mark.parametrize("binding", ["static", "dynamic"])
def test_run_outcomes_carry_the_stored_records_expiry(binding: str) -> None:
    clock = ManualClock(1_000_000)
    store = MemoryStore()
    guard = Guard(store=store, clock=clock, lease_ms=1_000, retention_ms=60_000, binding=binding)
    first = guard.run("k", "fp", respond(b"paid"))
    stored = asyncio.run(stored_expiry(store, "k", clock.now_ms()))
    assert (first.kind, first.expires_at_ms, stored) == ("executed", stored, 1_060_000)

    clock.advance(5_000)  # the replay's expiry is the record's, not now + retention
    again = guard.run("k", "fp", respond(b"other"))
    assert (again.kind, again.expires_at_ms) == ("replayed", stored)
    assert guard.run("k", "another", respond(b"x")).expires_at_ms is None  # a conflict stores nothing


@pytest.mark.parametrize("binding", ["static", "dynamic"])
def test_begin_and_complete_tell_the_expiry_also_when_complete_reads_it_back(binding: str) -> None:
    clock = ManualClock(2_000_000)
    store = MemoryStore()
    guard = Guard(store=store, clock=clock, lease_ms=1_000, retention_ms=30_000, renew_lease=False, binding=binding)
    kind, claim = guard.begin("k", "fp")
    assert kind == "proceed"
    clock.advance(700)
    until = guard.complete(claim, Response(200, [], b"ok"))
    assert until == 2_030_700 == asyncio.run(stored_expiry(store, "k", clock.now_ms()))
    clock.advance(100)
    replay = guard.begin("k", "fp")
    assert isinstance(replay, Decided) and (replay[0], replay.expires_at_ms) == ("replay", until)
    kind, response = replay  # still a (kind, value) pair
    assert (kind, response.body) == ("replay", b"ok")

    # The reply to the completing write is lost: the guest reads the record back, sees
    # its own response stored, and succeeds without writing; the expiry is the one read.
    _, claim = guard.begin("lost", "fp")
    store.fault("replace", kind="lost", count=1)
    clock.advance(1_000)
    read_back = guard.complete(claim, Response(200, [], b"ok"))
    assert read_back == 2_031_800 == asyncio.run(stored_expiry(store, "lost", clock.now_ms()))
    clock.advance(1_000)
    assert guard.complete(claim, Response(200, [], b"ok")) == read_back  # retried again: the same record


def test_over_an_asynchronous_store_overlapping_calls_each_get_their_records_expiry() -> None:
    clock = ManualClock(3_000_000)
    inner = MemoryStore()
    guard = AsyncGuard(store=AsyncMemory(inner), clock=clock, lease_ms=1_000, retention_ms=10_000)
    assert guard.replays

    async def main() -> list[int | None]:
        a = await guard.run("a", "fp", respond(b"a"))
        clock.advance(2_000)
        b = await guard.run("b", "fp", respond(b"b"))
        ra, rb = await asyncio.gather(guard.run("a", "fp", respond(b"x")), guard.run("b", "fp", respond(b"x")))
        assert (ra.kind, rb.kind) == ("replayed", "replayed")
        return [a.expires_at_ms, b.expires_at_ms, ra.expires_at_ms, rb.expires_at_ms, await stored_expiry(inner, "a", clock.now_ms())]

    assert asyncio.run(main()) == [3_010_000, 3_012_000, 3_010_000, 3_012_000, 3_010_000]


def test_http_date_is_imf_fixdate_rounded_down_to_the_second() -> None:
    assert http_date(784_111_777_000) == "Sun, 06 Nov 1994 08:49:37 GMT"
    assert http_date(784_111_777_999) == "Sun, 06 Nov 1994 08:49:37 GMT"
    assert http_date(784_111_778_000) == "Sun, 06 Nov 1994 08:49:38 GMT"


def orders_app(guard: AsyncGuard, started: asyncio.Event, go: asyncio.Event, **options: Any) -> Starlette:
    """POST /orders answers 201 (or `x-status`); with `x-hold`, it sets `started` and waits for `go`."""
    runs = 0

    async def endpoint(request: Request) -> PlainTextResponse:
        nonlocal runs
        runs += 1
        if request.headers.get("x-hold"):
            started.set()
            await go.wait()
        return PlainTextResponse(f"run {runs}", status_code=int(request.headers.get("x-status", "201")))

    route = Route("/orders", endpoint, methods=["POST"])
    return Starlette(routes=[route], middleware=[Middleware(IdempotencyMiddleware, guard=guard, **options)])


def post(app: Any, key: str, body: str = "order", headers: dict[str, str] | None = None) -> Any:
    return exchange(app, {"method": "POST", "path": "/orders", "key": key, "body": body, "headers": headers or {}}, None)


async def expiry_over_http(guard: AsyncGuard, store: Any) -> None:
    """What every store shows through the middleware: the first response and the
    replay carry the same Idempotency-Expires, the stored record's expiry rounded
    down to the second; a 409, a 422 and a response not stored carry none."""
    started, go = asyncio.Event(), asyncio.Event()
    app = orders_app(guard, started, go)
    first = await post(app, "k")
    replay = await post(app, "k")
    expires = http_date(await stored_expiry(store, scoped_key(None, "k"), guard.clock.now_ms()))
    assert (first.status, first.header("idempotency-expires")) == (201, expires), "the first response, once stored"
    assert (replay.status, replay.header("idempotent-replayed"), replay.body) == (201, "true", b"run 1")
    assert replay.header("idempotency-expires") == expires, "the replay: the same instant"

    mismatch = await post(app, "k", "another order")
    assert (mismatch.status, mismatch.header("idempotency-expires")) == (422, None)

    held = asyncio.ensure_future(post(app, "slow", "o", {"x-hold": "1"}))
    await started.wait()  # its app runs under the claim: a repeat is 409
    in_flight = await post(app, "slow", "o")
    assert (in_flight.status, in_flight.header("idempotency-expires")) == (409, None), "no expiry on a 409"
    go.set()
    slow = await held
    assert slow.header("idempotency-expires") == http_date(await stored_expiry(store, scoped_key(None, "slow"), guard.clock.now_ms()))

    failed = await post(app, "e", "o", {"x-status": "500"})
    assert (failed.status, failed.header("idempotency-expires")) == (500, None), "a 5xx released, not stored"


def test_asgi_over_memory_store_sends_the_stored_expiry_on_the_first_response_and_the_replay() -> None:
    store = MemoryStore()
    asyncio.run(expiry_over_http(AsyncGuard(store=store), store))


def test_asgi_over_async_redis_sends_the_expiry_read_back_from_redis() -> None:
    url = server_url("IDEM_TEST_REDIS_URL")

    async def main() -> None:
        async with AsyncRedisStore(url, prefix=unique("expiry") + ":") as store:
            await expiry_over_http(AsyncGuard(store=store), store)

    asyncio.run(main())


def test_asgi_rounds_down_to_the_second_under_the_configured_name_and_not_on_a_response_not_recorded() -> None:
    # Stored at 08:48:37.999 with a minute's retention: expires at 08:49:37.999, told as 08:49:37.
    clock = ManualClock(784_111_717_999)
    store = MemoryStore()
    guard = AsyncGuard(store=store, clock=clock, retention_ms=60_000, lease_ms=2_000)
    app = orders_app(guard, asyncio.Event(), asyncio.Event(), expiry_header="X-Key-Expires")

    async def main() -> list[Got]:
        return [await post(app, "k"), await post(app, "k")]

    for got in asyncio.run(main()):
        assert got.header("x-key-expires") == "Sun, 06 Nov 1994 08:49:37 GMT"
        assert got.header("idempotency-expires") is None
    assert asyncio.run(stored_expiry(store, scoped_key(None, "k"), clock.now_ms())) == 784_111_777_999
    store.fault("replace", kind="error", count=1)
    not_recorded = asyncio.run(post(app, "k2"))
    assert (not_recorded.status, not_recorded.header("x-key-expires")) == (503, None)


@pytest.mark.parametrize("kind", ["route", "app"])
def test_fastapi_sends_the_stored_expiry_on_the_first_response_and_the_replay_not_on_a_422(kind: str) -> None:
    store = MemoryStore()
    guard = AsyncGuard(store=store)
    idem = Idempotency(guard)
    app = FastAPI()
    orders = idem.router() if kind == "route" else app.router
    runs: list[int] = []

    @orders.post("/orders", status_code=201)
    async def create(order: dict[str, int]) -> dict[str, int]:
        runs.append(1)
        return {**order, "run": len(runs)}

    if kind == "route":
        app.include_router(orders)
    else:
        idem.install(app)
    json_type = {"content-type": "application/json"}

    async def main() -> None:
        first = await post(app, "k", '{"cents": 10}', json_type)
        replay = await post(app, "k", '{"cents": 10}', json_type)
        expires = http_date(await stored_expiry(store, scoped_key(None, "k"), guard.clock.now_ms()))
        assert (first.status, first.header("idempotency-expires")) == (201, expires)
        assert (replay.status, replay.header("idempotent-replayed"), replay.header("idempotency-expires")) == (201, "true", expires)
        assert replay.body == first.body
        mismatch = await post(app, "k", '{"cents": 11}', json_type)
        assert (mismatch.status, mismatch.header("idempotency-expires")) == (422, None)
        invalid = await post(app, "v", '{"cents": "ten"}', json_type)  # FastAPI's validation error: not stored
        assert (invalid.status, invalid.header("idempotency-expires")) == (422, None)

    asyncio.run(main())
    assert runs == [1]

