"""A typed FastAPI consumer of idem_guard, checked with `mypy --strict` in CI
(pyproject.toml's [tool.mypy] `files`; examples/run-polyglot-tests.sh). It
is never run: it holds what a typed application writes, and each
`# type: ignore[...]` marks a call that must stay an error — mypy's
`warn_unused_ignores` (part of --strict) fails the check if the package's
types ever let it through (an erased signature, an unchecked option)."""

from __future__ import annotations

import datetime
import logging
import uuid
from decimal import Decimal

from fastapi import FastAPI
from pydantic import BaseModel

from idem_guard import AsyncGuard, Decided, Decision, Guard, Outcome, Response, idempotent_function
from idem_guard.asgi import IdempotencyMiddleware
from idem_guard.fastapi import Idempotency
from idem_guard.redis import AsyncRedisStore, RedisStore


class Order(BaseModel):
    id: uuid.UUID
    cents: int


class Receipt(BaseModel):
    order: Order
    total: Decimal
    at: datetime.datetime


decisions: list[Decision] = []
guard = Guard(store=RedisStore("redis://127.0.0.1:6379/0", prefix="typed:"), on_decision=decisions.append)
aguard = AsyncGuard(store=AsyncRedisStore("redis://127.0.0.1:6379/0", prefix="typed:"), logger=logging.getLogger("typed"))


@idempotent_function(guard=guard, data_keyword_argument="order")
def charge(order: Order) -> Receipt:
    return Receipt(order=order, total=Decimal(order.cents) / 100, at=datetime.datetime.now(datetime.UTC))


@idempotent_function(guard=aguard, key="order_id")
async def refund(order_id: str, cents: int) -> dict[str, int]:
    return {"refunded": cents}


def use_the_decorated_functions() -> None:
    receipt: Receipt = charge(Order(id=uuid.uuid4(), cents=100))  # the signature survives the decorator
    assert receipt.total >= 0
    charge("not an order")  # type: ignore[arg-type]
    charge(Order(id=uuid.uuid4(), cents=1), extra=True)  # type: ignore[call-arg]


async def use_the_async_one() -> int:
    refunded = await refund("o-1", 250)
    await refund("o-1")  # type: ignore[call-arg]
    return refunded["refunded"]


def use_the_guard() -> bytes | None:
    outcome: Outcome = guard.run("k", "fp", lambda fence: Response(200, [], b"ok"))
    until: int | None = outcome.expires_at_ms  # until when the key replays it
    decision: Decided = guard.begin("k", "fp")
    kind, value = decision  # still the (kind, value) pair
    if kind == "proceed":
        until = guard.complete(value, Response(200, [], b"ok"))
    elif kind == "replay":
        until = decision.expires_at_ms
    assert until is None or until > 0
    outcome.expires_at_ms.bit_length()  # type: ignore[union-attr]
    return outcome.response.body if outcome.response is not None else None


idem = Idempotency(aguard, require_key=True, timeout_s=5.0, expiry_header="idempotency-expires")
Idempotency(aguard, require_kye=True)  # type: ignore[call-arg]
app = FastAPI()
orders = idem.router(prefix="/v1")


@orders.post("/orders", status_code=201)
async def create(order: Order) -> Receipt:
    return Receipt(order=order, total=Decimal(order.cents) / 100, at=datetime.datetime.now(datetime.UTC))


app.include_router(orders)

whole = FastAPI()
whole.add_middleware(IdempotencyMiddleware, guard=aguard, require_key=True, methods=("POST",))
whole.add_middleware(IdempotencyMiddleware, guard=aguard, requires_key=True)  # type: ignore[call-arg]
idem.install(whole)
