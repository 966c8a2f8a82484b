"""`idem_guard.fastapi` beyond the shared HTTP scenarios (test_http_conformance.py
plays those against a FastAPI route and app too): validation errors are not
stored unless asked, the route's own answers to exceptions are, the header is
in the OpenAPI schema, and no 503 body names the store (its reason is logged)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import pytest
from fastapi import BackgroundTasks, FastAPI, HTTPException
from pydantic import BaseModel

from idem_guard import AsyncGuard, MemoryStore
from idem_guard.fastapi import Idempotency
from test_http_conformance import Got, exchange


class Order(BaseModel):
    sku: str
    qty: int


class Receipt(BaseModel):
    order: Order
    charge: int


def shop(kind: str, store: MemoryStore, **options: Any) -> tuple[FastAPI, list[Order]]:
    """An app whose POST /orders charges once per order; `kind` "route" guards that route, "app" the app."""
    charged: list[Order] = []
    idem = Idempotency(AsyncGuard(store=store), **options)
    app = FastAPI()
    orders = idem.router() if kind == "route" else app.router

    @orders.post("/orders", status_code=201)
    async def create(order: Order, tasks: BackgroundTasks) -> Receipt:
        if order.qty > 100:
            raise HTTPException(status_code=402, detail="over the credit limit")
        charged.append(order)
        tasks.add_task(lambda: None)
        return Receipt(order=order, charge=len(charged))

    @orders.get("/orders")
    async def listed() -> list[Order]:
        return charged

    if kind == "route":
        app.include_router(orders)
    else:
        idem.install(app)
    return app, charged


def post(app: FastAPI, key: str, body: str) -> Got:
    spec = {"method": "POST", "path": "/orders", "key": key, "body": body, "headers": {"content-type": "application/json"}}
    return asyncio.run(exchange(app, spec, None))


@pytest.mark.parametrize("kind", ["route", "app"])
def test_a_validation_error_is_not_stored_and_the_corrected_retry_runs(kind: str) -> None:
    store = MemoryStore()
    app, charged = shop(kind, store)
    bad = post(app, "k-1", '{"sku": "A"}')
    assert bad.status == 422 and json.loads(bad.body)["detail"][0]["loc"] == ["body", "qty"]
    assert bad.header("idempotent-replayed") is None
    kept = store.peek("anon/k-1", time.time_ns() // 1_000_000)
    assert kept is None or kept.record.response is None  # released: no answer kept for the key
    fixed = post(app, "k-1", '{"sku": "A", "qty": 2}')
    assert fixed.status == 201 and json.loads(fixed.body) == {"order": {"sku": "A", "qty": 2}, "charge": 1}
    again = post(app, "k-1", '{"sku": "A", "qty": 2}')
    assert (again.status, again.body, again.header("idempotent-replayed")) == (201, fixed.body, "true")
    assert len(charged) == 1


@pytest.mark.parametrize("kind", ["route", "app"])
def test_store_validation_errors_stores_them(kind: str) -> None:
    app, charged = shop(kind, MemoryStore(), store_validation_errors=True)
    bad = post(app, "k-2", '{"sku": "A"}')
    again = post(app, "k-2", '{"sku": "A"}')
    assert (bad.status, again.status, again.header("idempotent-replayed")) == (422, 422, "true")
    assert again.body == bad.body
    assert post(app, "k-2", '{"sku": "A", "qty": 1}').status == 422  # another request under the key: a mismatch
    assert charged == []


def test_the_routes_answer_to_an_http_exception_is_stored_and_the_endpoint_runs_once() -> None:
    store = MemoryStore()
    app, _ = shop("route", store)
    runs = []
    original = store.insert

    def counting(*args: Any) -> Any:
        runs.append(args[0])
        return original(*args)

    store.insert = counting  # type: ignore[method-assign]
    first = post(app, "k-3", '{"sku": "A", "qty": 500}')
    again = post(app, "k-3", '{"sku": "A", "qty": 500}')
    assert (first.status, json.loads(first.body)) == (402, {"detail": "over the credit limit"})
    assert (again.status, again.body, again.header("idempotent-replayed")) == (402, first.body, "true")
    assert len(runs) == 2 and len(store) == 1  # claimed once, answered from the store the second time


def test_the_guarded_route_declares_the_idempotency_key_header_in_openapi() -> None:
    idem = Idempotency(AsyncGuard(), require_key=True)
    app = FastAPI()
    router = idem.router()

    @router.post("/orders")
    async def create(order: Order) -> Order:
        return order

    @router.get("/orders")
    async def listed() -> list[Order]:
        return []

    app.include_router(router)
    paths = app.openapi()["paths"]["/orders"]
    headers = [p for p in paths["post"].get("parameters", []) if p["in"] == "header"]
    assert [(h["name"], h["required"]) for h in headers] == [("Idempotency-Key", True)]
    assert "byte for byte" in headers[0]["description"]
    assert not [p for p in paths["get"].get("parameters", []) if p["in"] == "header"]


SECRET = "redis://10.9.8.7:6379: Connection refused (ECONNREFUSED)"


@pytest.mark.parametrize("kind", ["route", "app"])
def test_no_503_body_names_the_store_and_the_log_has_the_reason(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    app, charged = shop(kind, store)
    caplog.set_level(logging.WARNING, logger="idem_guard")
    store.fault("get", kind="error", message=SECRET)
    store.fault("insert", kind="error", message=SECRET)
    down = post(app, "k-4", '{"sku": "A", "qty": 1}')
    store.clear_faults()
    store.fault("replace", kind="error", message=SECRET, count=1)
    lost = post(app, "k-5", '{"sku": "A", "qty": 1}')
    for got, slug in ((down, "store-unavailable"), (lost, "response-not-recorded")):
        assert got.status == 503 and got.header("retry-after") is not None
        problem = json.loads(got.body)
        assert problem["type"] == f"https://idem.dev/problems/{slug}"
        assert "retry after" in problem["detail"].lower()
        for leak in ("10.9.8.7", "6379", "redis", "refused", "injected"):
            assert leak not in got.body.decode().lower(), (slug, got.body)
    logged = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "idem_guard"]
    assert any(level == "WARNING" and "unavailable" in text and SECRET in text for level, text in logged), logged
    assert any(level == "ERROR" and "not-recorded" in text and SECRET in text for level, text in logged), logged
    assert len(charged) == 1  # the not-recorded one ran; the one with the store down did not
