"""`idem_guard.asgi.IdempotencyMiddleware` beyond the shared HTTP scenarios
(test_http_conformance.py): what the app sees, what is stored of a response,
the limits, a completion the store refuses, an app that never answers."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from idem_guard import AsyncGuard, Guard, MemoryStore
from idem_guard.asgi import IdempotencyMiddleware
from idem_guard.http import MalformedKey, idempotency_key, scoped_key
from test_http_conformance import exchange


def app_with(endpoint, guard: AsyncGuard, **options) -> Starlette:
    route = Route("/orders", endpoint, methods=["POST"])
    return Starlette(routes=[route], middleware=[Middleware(IdempotencyMiddleware, guard=guard, **options)])


def post(app, key: str, body: str = "x", headers: dict | None = None):
    return exchange(app, {"method": "POST", "path": "/orders", "key": key, "body": body, "headers": headers or {}}, None)


def test_the_app_reads_the_body_and_sees_the_key_and_fence() -> None:
    seen = []

    async def endpoint(request: Request) -> Response:
        seen.append((await request.json(), request.scope["extensions"]["idempotency"]))
        return JSONResponse({"ok": True}, status_code=201)

    guard = AsyncGuard()
    app = app_with(endpoint, guard)

    async def main() -> None:
        json_type = {"content-type": "application/json"}
        assert (await post(app, "k", '{"a": 1}', json_type)).status == 201
        again = await post(app, "k", '{"a": 1}', json_type)
        assert (again.status, again.header("idempotent-replayed")) == (201, "true")
        # The same JSON value in other bytes is another request.
        assert (await post(app, "k", '{"a":1}', json_type)).status == 422

    asyncio.run(main())
    assert len(seen) == 1
    body, info = seen[0]
    assert body == {"a": 1} and info["key"] == "k" and info["store_key"] == "anon/k" and info["fence"] > 0


def test_streamed_bodies_and_repeated_headers_are_stored_and_replayed_without_hop_by_hop_headers() -> None:
    runs = []

    async def endpoint(request: Request) -> Response:
        runs.append(1)

        async def chunks():
            yield b"chunk 1, "
            yield b"end"

        response = StreamingResponse(chunks(), status_code=202, media_type="text/plain")
        response.headers.append("set-cookie", "a=1")
        response.headers.append("set-cookie", "b=2")
        response.headers["keep-alive"] = "timeout=5"
        return response

    guard = AsyncGuard()
    app = app_with(endpoint, guard)

    async def main() -> None:
        for got in [await post(app, "k"), await post(app, "k")]:
            assert (got.status, got.body) == (202, b"chunk 1, end")
            assert got.header("set-cookie") == "a=1, b=2"
        assert got.header("idempotent-replayed") == "true"

    asyncio.run(main())
    assert len(runs) == 1
    stored = guard.store.peek("anon/k", guard.guard.clock.now_ms()).record.response
    names = [n for n, _ in stored.headers]
    assert "keep-alive" not in names and names.count("set-cookie") == 2


def test_a_response_over_the_limit_is_a_stored_502_and_never_runs_again() -> None:
    runs = []

    async def endpoint(request: Request) -> Response:
        runs.append(1)
        return Response(b"x" * 2000)

    app = app_with(endpoint, AsyncGuard(max_response_bytes=1024))

    async def main() -> None:
        first, again = await post(app, "big"), await post(app, "big")
        assert first.status == 502
        assert json.loads(first.body)["type"] == "https://idem.dev/problems/response-too-large"
        assert (again.status, again.header("idempotent-replayed")) == (502, "true")

    asyncio.run(main())
    assert len(runs) == 1


def test_a_completion_the_store_refuses_is_503_and_the_response_is_not_given_out() -> None:
    store = MemoryStore()

    async def endpoint(request: Request) -> Response:
        store.fault("replace", kind="error", message="disk full", count=1)
        return Response(b"secret", status_code=201)

    app = app_with(endpoint, AsyncGuard(store=store, lease_ms=2000))
    got = asyncio.run(post(app, "k"))
    assert (got.status, got.header("retry-after")) == (503, "2")
    assert json.loads(got.body)["type"] == "https://idem.dev/problems/response-not-recorded"
    assert b"secret" not in got.body


def test_an_app_that_never_answers_gets_504_and_its_key_is_released() -> None:
    runs = []

    async def endpoint(request: Request) -> Response:
        runs.append(1)
        if len(runs) == 1:
            await asyncio.sleep(3600)
        return Response(b"second", status_code=201)

    app = app_with(endpoint, AsyncGuard(), timeout_s=0.05)

    async def main() -> None:
        first = await post(app, "k")
        assert first.status == 504
        assert json.loads(first.body)["type"] == "https://idem.dev/problems/upstream-timeout"
        retry = await post(app, "k")
        assert (retry.status, retry.body) == (201, b"second")

    asyncio.run(main())


def test_a_body_over_the_limit_is_413_and_nothing_is_claimed() -> None:
    guard = AsyncGuard()

    async def endpoint(request: Request) -> Response:
        raise AssertionError("never runs")

    got = asyncio.run(post(app_with(endpoint, guard, max_request_bytes=10), "k", "x" * 11))
    assert got.status == 413
    assert guard.store.peek("anon/k", guard.guard.clock.now_ms()) is None


def test_the_middleware_needs_an_async_guard() -> None:
    with pytest.raises(TypeError, match="AsyncGuard"):
        IdempotencyMiddleware(lambda s, r, se: None, guard=Guard())


def test_keys_parse_as_the_gateway_parses_them_and_scopes_hash_the_client() -> None:
    assert idempotency_key(b'"8e03978e-40d5"') == "8e03978e-40d5"
    assert idempotency_key(b'"a \\"b\\\\"') == 'a "b\\'
    assert idempotency_key(b"order-1") == "order-1"
    for raw, why in [
        (b'"open', "closing"),
        (b"has space", "0x20"),
        (b'""', "empty"),
        (b"k" * 201, "limit is 200"),
        (b'"a\\nb"', "escape"),
        ("café".encode(), "0xc3"),
    ]:
        with pytest.raises(MalformedKey, match=why):
            idempotency_key(raw)
    assert scoped_key(None, "k") == "anon/k"
    alice, bob = scoped_key(b"Bearer alice", "k"), scoped_key(b"Bearer bob", "k")
    assert alice != bob and len(alice) == 18 and "alice" not in alice
    assert alice == "9d7cce461e4b2f09/k"  # the gateway's (packages/js/test/http-conformance.test.js asks it)


def test_one_starlette_route_is_guarded_by_wrapping_its_endpoint() -> None:
    """Per route in Starlette: the middleware wraps one route's ASGI app; the others are untouched."""
    from starlette.routing import request_response

    runs: list[str] = []

    async def create(request: Request) -> Response:
        runs.append("create")
        return JSONResponse({"n": len(runs)}, status_code=201)

    async def other(request: Request) -> Response:
        runs.append("other")
        return JSONResponse({"n": len(runs)}, status_code=201)

    guard = AsyncGuard()
    app = Starlette(
        routes=[
            Route("/orders", IdempotencyMiddleware(request_response(create), guard=guard), methods=["POST"]),
            Route("/other", other, methods=["POST"]),
        ]
    )

    async def main() -> None:
        first, again = await post(app, "k"), await post(app, "k")
        assert (first.status, again.status, again.header("idempotent-replayed")) == (201, 201, "true")
        assert again.body == first.body
        spec = {"method": "POST", "path": "/other", "key": "k", "body": "x"}
        assert (await exchange(app, spec, None)).header("idempotent-replayed") is None
        assert (await exchange(app, spec, None)).header("idempotent-replayed") is None

    asyncio.run(main())
    assert runs == ["create", "other", "other"]
