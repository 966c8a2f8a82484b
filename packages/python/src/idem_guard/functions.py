"""Idempotent functions: a decorator in the shape of AWS Lambda Powertools'
`@idempotent_function`, over a `Guard` (sync functions) or an `AsyncGuard`
(async ones)::

    from idem_guard import Guard, idempotent_function

    guard = Guard()

    @idempotent_function(guard=guard, data_keyword_argument="order", key=lambda order: order["id"])
    def charge(order: dict) -> dict:
        return {"charged": order["cents"], "receipt": payments.charge(order)}

    charge(order={"id": "o-1", "cents": 1000})   # runs, stores the result
    charge(order={"id": "o-1", "cents": 1000})   # replays it; charge does not run
    charge(order={"id": "o-1", "cents": 5})      # raises PayloadMismatch

What is stored. The function's return value, encoded by `encode` (default:
`json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))`
as UTF-8), as the response `200`, `content-type: application/json`, that
body. A replay returns `decode(body)` (default `json.loads`), so a tuple comes
back as a list and a dataclass as whatever `encode` made of it; the first call
returns the function's own value. A value `encode` refuses raises its
`TypeError`/`ValueError` after the function ran, and the key is released (a
retry runs the function again), as Powertools does.

The key: `key` names an argument whose value is the key, or is a callable
given the data argument (`data_keyword_argument`), or all the arguments when
there is none; without `key`, the key is the payload's hash (so any other
payload is simply another key). A key that is not a `str` is used as its
canonical JSON. The store key is `namespace#key`, namespace the function's
`module.qualname` unless given (at most 255 bytes in all: the guard's limit).

The fingerprint: the SHA-256 of the canonical JSON (keys sorted, no
whitespace, UTF-8, no NaN) of `{name: value}` for the `payload` arguments
(default: the data argument, else every argument but `self`/`cls`).
Dataclasses are encoded as dicts; anything else that `json` cannot encode
raises `TypeError` before anything is claimed.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
from typing import Any, Callable, Optional, Sequence, Union

from .aio import AsyncGuard
from .guard import Guard, Outcome
from .types import Response

__all__ = [
    "AlreadyInProgress",
    "IdempotencyError",
    "IdempotencyKeyMissing",
    "PayloadMismatch",
    "StoreUnavailable",
    "canonical_json",
    "idempotent",
    "idempotent_function",
]


class IdempotencyError(Exception):
    """The base of the decorator's refusals: the function did not run."""


class AlreadyInProgress(IdempotencyError):
    """Another call with this key is running (Powertools' `IdempotencyAlreadyInProgressError`).
    Retry after `retry_after` seconds (`retry_after_ms` exactly): the holder's lease then runs out."""

    def __init__(self, key: str, retry_after_ms: int):
        super().__init__(f"a call with key {key!r} is in progress; retry after {retry_after_ms} ms")
        self.key = key
        self.retry_after_ms = retry_after_ms

    @property
    def retry_after(self) -> float:
        return self.retry_after_ms / 1000


class PayloadMismatch(IdempotencyError):
    """The key was first used with another payload (Powertools' `IdempotencyValidationError`)."""

    def __init__(self, key: str):
        super().__init__(f"key {key!r} was first used with another payload; use a new key for a new call")
        self.key = key


class StoreUnavailable(IdempotencyError):
    """The store could not answer, so the function did not run (Powertools' `IdempotencyPersistenceLayerError`)."""

    def __init__(self, key: str, message: str):
        super().__init__(f"the idempotency store is unavailable, key {key!r} not run: {message}")
        self.key = key
        self.message = message


class IdempotencyKeyMissing(IdempotencyError):
    """The key came out as None and `raise_on_no_idempotency_key` is set (Powertools' `IdempotencyKeyError`)."""


def _default(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable; pass encode= (or payload= to leave it out)")


def canonical_json(value: Any) -> bytes:
    """Keys sorted, no whitespace, UTF-8, no NaN or infinities; dataclasses as dicts."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_default
    ).encode()


def _encode(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_default).encode()


def _decode(body: bytes) -> Any:
    return json.loads(body)


def idempotent_function(
    *,
    guard: Union[Guard, AsyncGuard],
    data_keyword_argument: Optional[str] = None,
    key: Union[str, Callable[..., Any], None] = None,
    payload: Optional[Sequence[str]] = None,
    namespace: Optional[str] = None,
    raise_on_no_idempotency_key: bool = False,
    fence_keyword_argument: Optional[str] = None,
    encode: Callable[[Any], bytes] = _encode,
    decode: Callable[[bytes], Any] = _decode,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Makes a function run at most once per key while the guard retains the
    key (24 h by default); repeats get the stored return value.

    A sync function needs a `Guard`, an async one an `AsyncGuard`. Refusals
    raise: `AlreadyInProgress` (another call holds the key; `retry_after`),
    `PayloadMismatch` (the key was used with another payload), `StoreUnavailable`
    (the function did not run). An exception from the function releases the key
    and propagates, so a retry runs it again; `NotRecorded` means it ran but its
    result could not be stored. A key that comes out None runs the function
    unguarded, or raises `IdempotencyKeyMissing` with `raise_on_no_idempotency_key`.
    `fence_keyword_argument` names a parameter that receives the claim's fence.
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(fn)
        names = list(signature.parameters)
        for what, name in (("data_keyword_argument", data_keyword_argument), ("fence_keyword_argument", fence_keyword_argument)):
            if name is not None and name not in names:
                raise TypeError(f"{what}={name!r} is not a parameter of {fn.__qualname__}{signature}")
        if isinstance(key, str) and key not in names:
            raise TypeError(f"key={key!r} is not a parameter of {fn.__qualname__}{signature}")
        for name in payload or ():
            if name not in names:
                raise TypeError(f"payload names {name!r}, not a parameter of {fn.__qualname__}{signature}")
        is_async = inspect.iscoroutinefunction(fn)
        if is_async and not isinstance(guard, AsyncGuard):
            raise TypeError(f"{fn.__qualname__} is async: it needs an AsyncGuard")
        if not is_async and not isinstance(guard, Guard):
            raise TypeError(f"{fn.__qualname__} is not async: it needs a Guard (an AsyncGuard guards async functions)")
        prefix = namespace if namespace is not None else f"{fn.__module__}.{fn.__qualname__}"
        if payload is not None:
            hashed = list(payload)
        elif data_keyword_argument is not None:
            hashed = [data_keyword_argument]
        else:
            hashed = [n for n in names if n not in ("self", "cls") and n != fence_keyword_argument]

        def prepare(args: tuple, kwargs: dict) -> Optional[tuple[str, str]]:
            """The store key and fingerprint of a call, or None to run it unguarded."""
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            arguments = bound.arguments
            content = canonical_json({name: arguments[name] for name in hashed})
            fingerprint = "sha256:" + hashlib.sha256(content).hexdigest()
            if isinstance(key, str):
                value = arguments[key]
            elif callable(key):
                value = key(arguments[data_keyword_argument]) if data_keyword_argument else key(*args, **kwargs)
            else:
                value = fingerprint
            if value is None:
                if raise_on_no_idempotency_key:
                    raise IdempotencyKeyMissing(f"no idempotency key for this call of {fn.__qualname__}")
                return None
            text = value if isinstance(value, str) else canonical_json(value).decode()
            return f"{prefix}#{text}", fingerprint

        def fenced(kwargs: dict, fence: int) -> dict:
            return {**kwargs, fence_keyword_argument: fence} if fence_keyword_argument else kwargs

        def answer(store_key: str, outcome: Outcome, ran: list) -> Any:
            if outcome.kind == "executed":
                return ran[0]
            if outcome.kind == "replayed":
                return decode(outcome.response.body)
            if outcome.kind == "in-flight":
                raise AlreadyInProgress(store_key, outcome.retry_after_ms)
            if outcome.kind == "conflict":
                raise PayloadMismatch(store_key)
            raise StoreUnavailable(store_key, outcome.message or "")

        def stored(value: Any) -> Response:
            return Response(200, [("content-type", b"application/json")], encode(value))

        if is_async:

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                call = prepare(args, kwargs)
                if call is None:
                    return await fn(*args, **kwargs)
                ran: list = []

                async def handler(fence: int) -> Response:
                    ran.append(await fn(*args, **fenced(kwargs, fence)))
                    return stored(ran[0])

                return answer(call[0], await guard.run(call[0], call[1], handler), ran)

            return async_wrapper

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            call = prepare(args, kwargs)
            if call is None:
                return fn(*args, **kwargs)
            ran: list = []

            def handler(fence: int) -> Response:
                ran.append(fn(*args, **fenced(kwargs, fence)))
                return stored(ran[0])

            return answer(call[0], guard.run(call[0], call[1], handler), ran)

        return wrapper

    return decorate


def idempotent(
    *, guard: Union[Guard, AsyncGuard], key: Union[Callable[[Any], Any], None] = None, **options: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`idempotent_function` for a handler whose first parameter is the event
    (Powertools' `@idempotent` for `handler(event, context)`): the event is the
    payload, and `key=lambda event: event["order_id"]` picks the key from it
    (default: the event's hash)."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        params = list(inspect.signature(fn).parameters)
        if not params:
            raise TypeError(f"{fn.__qualname__} takes no event parameter")
        return idempotent_function(guard=guard, data_keyword_argument=params[0], key=key, **options)(fn)

    return decorate
