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
compact JSON as UTF-8, with datetime, date, time, Decimal, UUID, Enum,
dataclasses and Pydantic models encoded as `idem_guard.codec` says), as the
response `200`, `content-type: application/json`, that body. A replay returns
`decode(body)`: by default the JSON decoded back to the function's return
annotation where it names those types (a `-> datetime` function replays a
`datetime`, a `-> Order` dataclass or model an `Order`), else what
`json.loads` gives (a tuple comes back as a list). The first call returns the
function's own value.

A function never runs twice because of what it returned. With the default
encoder, a return annotation it cannot store is refused when the function is
decorated (`TypeError`, naming the type; an annotation that cannot be resolved
then is checked at the first call, before anything runs). A value that still
cannot be encoded at run time (under `-> Any`, or a NaN) is stored as a
failure: the function ran, so its key is done, and this call and every repeat
within the retention raise `ResultNotStored` (the first one carries the value
in `.value`); the function is not run again for that key. A failed encoding is
stored as status 500, `content-type: application/json`,
`idem-result: unstorable`, body `{"error": "..."}`.

The key: `key` names an argument whose value is the key, or is a callable
given the data argument (`data_keyword_argument`), or all the arguments when
there is none; without `key`, the key is the payload's hash (so any other
payload is simply another key). A key that is not a `str` is used as its
canonical JSON. The store key is `namespace#key`, namespace the function's
`module.qualname` unless given (at most 255 bytes in all: the guard's limit).

The fingerprint: the SHA-256 of the canonical JSON (keys sorted, no
whitespace, UTF-8, no NaN) of `{name: value}` for the `payload` arguments
(default: the data argument, else every argument but `self`/`cls`), the
types above encoded as they are stored; anything else raises `TypeError`
before anything is claimed.

Types: the decorated function keeps its signature (`ParamSpec`): a checker
sees `charge(order: dict) -> dict`, and an async function stays awaitable.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import typing
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ParamSpec, TypeVar, cast

from . import codec
from .aio import AsyncGuard
from .guard import Guard, Outcome
from .types import Response

__all__ = [
    "AlreadyInProgress",
    "IdempotencyError",
    "IdempotencyKeyMissing",
    "PayloadMismatch",
    "ResultNotStored",
    "StoreUnavailable",
    "canonical_json",
    "idempotent",
    "idempotent_function",
]

P = ParamSpec("P")
R = TypeVar("R")

#: The header that marks a stored failure to encode the function's result.
UNSTORABLE = ("idem-result", b"unstorable")


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


class ResultNotStored(Exception):
    """The function ran for this key, but its result could not be encoded, so a
    failure was stored in its place: this call and every repeat within the
    retention raise this, and the function does not run again for the key.
    `value` is the function's result on the call that ran it (None on a repeat);
    `reason` says why it could not be encoded."""

    def __init__(self, key: str, reason: str, value: Any = None, ran_here: bool = False):
        when = "" if ran_here else " on an earlier call"
        super().__init__(
            f"the function ran for key {key!r}{when}, but its result could not be stored ({reason}); "
            "it is not run again for this key: fix the return type (or pass encode=), then use a new key"
        )
        self.key = key
        self.reason = reason
        self.value = value


def canonical_json(value: Any) -> bytes:
    """Keys sorted, no whitespace, UTF-8, no NaN or infinities; the types of `idem_guard.codec` encoded as it says."""
    try:
        return codec.dumps(value, sort_keys=True)
    except codec.Unstorable as e:
        raise TypeError(f"{e} (or payload= to leave the argument out of the fingerprint)") from e


def _encode(value: Any) -> bytes:
    return codec.dumps(value)


def _decode(body: bytes) -> Any:
    return json.loads(body)


def _return_type(fn: Callable[..., Any]) -> tuple[bool, Any]:
    """(resolved, the return annotation): not resolved while a forward reference names nothing yet.
    Names are looked up in the function's module and in the variables its body closes over (a class
    defined in an enclosing function and used in the body resolves)."""
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None) or ()
    local: dict[str, Any] = {}
    for name, cell in zip(code.co_freevars if code is not None else (), cells, strict=False):
        try:
            local[name] = cell.cell_contents
        except ValueError:  # a cell not filled yet
            pass
    try:
        hints = typing.get_type_hints(fn, localns=local, include_extras=True)
    except (NameError, AttributeError, TypeError):
        return False, Any
    tp = hints.get("return", Any)
    return True, tp


def _unstorable_response(error: Exception) -> Response:
    body = json.dumps({"error": f"{type(error).__name__}: {error}"}, separators=(",", ":"), ensure_ascii=False)
    return Response(500, [("content-type", b"application/json"), UNSTORABLE], body.encode())


def _unstorable_reason(response: Response) -> str | None:
    if response.status != 500 or UNSTORABLE not in response.headers:
        return None
    try:
        return str(json.loads(response.body)["error"])
    except (ValueError, KeyError, TypeError):
        return "unknown"


def idempotent_function(
    *,
    guard: Guard | AsyncGuard,
    data_keyword_argument: str | None = None,
    key: str | Callable[..., Any] | None = None,
    payload: Sequence[str] | None = None,
    namespace: str | None = None,
    raise_on_no_idempotency_key: bool = False,
    fence_keyword_argument: str | None = None,
    encode: Callable[[Any], bytes] | None = None,
    decode: Callable[[bytes], Any] | None = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Makes a function run at most once per key while the guard retains the
    key (24 h by default); repeats get the stored return value.

    A sync function needs a `Guard`, an async one an `AsyncGuard`. Refusals
    raise: `AlreadyInProgress` (another call holds the key; `retry_after`),
    `PayloadMismatch` (the key was used with another payload), `StoreUnavailable`
    (the function did not run). An exception from the function releases the key
    and propagates, so a retry runs it again; `NotRecorded` means it ran but the
    store could not record its result (the key stays claimed until its lease runs
    out); `ResultNotStored` that it ran but its result could not be encoded (a
    failure is stored: it never runs again for that key). A key that comes out
    None runs the function unguarded, or raises `IdempotencyKeyMissing` with
    `raise_on_no_idempotency_key`. `fence_keyword_argument` names a parameter
    that receives the claim's fence. `encode`/`decode` replace the JSON codec
    (and its check of the return annotation).
    """

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
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
        encoder = encode if encode is not None else _encode
        # The return type: checked now when it can be resolved, else at the first call.
        returns: list[Any] = []

        def return_type() -> Any:
            if not returns:
                resolved, tp = _return_type(fn)
                if encode is None:
                    codec.check_storable(tp, f"{fn.__module__}.{fn.__qualname__}")
                if not resolved:
                    return Any  # a forward reference not defined yet: tried again next call
                returns.append(tp)
            return returns[0]

        if _return_type(fn)[0]:
            return_type()

        def decoded(body: bytes) -> Any:
            if decode is not None:
                return decode(body)
            return codec.decode_as(json.loads(body), return_type())

        # Binding the call's arguments to names without inspect.Signature.bind (a tenth of the
        # decorator's cost) when the parameters are plain: positional-or-keyword, no *args or **kwargs.
        plain = all(p.kind is p.POSITIONAL_OR_KEYWORD for p in signature.parameters.values())
        defaults = {n: p.default for n, p in signature.parameters.items() if p.default is not p.empty}

        def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
            if plain and len(args) <= len(names):
                arguments = dict(zip(names, args, strict=False))
                if not arguments.keys() & kwargs.keys() and kwargs.keys() <= signature.parameters.keys():
                    arguments.update(kwargs)
                    if len(arguments) == len(names):
                        return arguments
                    if all(n in arguments or n in defaults for n in names):
                        return {n: arguments[n] if n in arguments else defaults[n] for n in names}
            bound = signature.bind(*args, **kwargs)  # raises the TypeError a bad call deserves
            bound.apply_defaults()
            return dict(bound.arguments)

        def prepare(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, str] | None:
            """The store key and fingerprint of a call, or None to run it unguarded."""
            if not returns:
                return_type()
            arguments = bind(args, kwargs)
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

        def fenced(kwargs: dict[str, Any], fence: int) -> dict[str, Any]:
            return {**kwargs, fence_keyword_argument: fence} if fence_keyword_argument else kwargs

        class Ran:
            """What the handler got: the function's value, and why it could not be encoded, if so."""

            value: Any = None
            unstorable: Exception | None = None

            def stored(self, value: Any) -> Response:
                self.value = value
                try:
                    body = encoder(value)
                except Exception as e:  # noqa: BLE001 - any encoder's failure is stored, never a release
                    self.unstorable = e
                    return _unstorable_response(e)
                return Response(200, [("content-type", b"application/json")], body)

        def answer(store_key: str, outcome: Outcome, ran: Ran) -> Any:
            if outcome.kind == "executed":
                if ran.unstorable is not None:
                    failure = f"{type(ran.unstorable).__name__}: {ran.unstorable}"
                    raise ResultNotStored(store_key, failure, ran.value, ran_here=True) from ran.unstorable
                return ran.value
            if outcome.kind == "replayed":
                assert outcome.response is not None
                reason = _unstorable_reason(outcome.response)
                if reason is not None:
                    raise ResultNotStored(store_key, reason)
                return decoded(outcome.response.body)
            if outcome.kind == "in-flight":
                raise AlreadyInProgress(store_key, outcome.retry_after_ms or 0)
            if outcome.kind == "conflict":
                raise PayloadMismatch(store_key)
            raise StoreUnavailable(store_key, outcome.message or "")

        if is_async:
            async_fn = cast(Callable[..., Awaitable[Any]], fn)
            async_guard = cast(AsyncGuard, guard)

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                call = prepare(args, kwargs)
                if call is None:
                    return await async_fn(*args, **kwargs)
                ran = Ran()

                async def handler(fence: int) -> Response:
                    return ran.stored(await async_fn(*args, **fenced(kwargs, fence)))

                return answer(call[0], await async_guard.run(call[0], call[1], handler), ran)

            return cast(Callable[P, R], async_wrapper)

        sync_guard = cast(Guard, guard)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            call = prepare(args, kwargs)
            if call is None:
                return fn(*args, **kwargs)
            ran = Ran()

            def handler(fence: int) -> Response:
                return ran.stored(fn(*args, **fenced(kwargs, fence)))

            return answer(call[0], sync_guard.run(call[0], call[1], handler), ran)

        return cast(Callable[P, R], wrapper)

    return decorate


def idempotent(
    *, guard: Guard | AsyncGuard, key: Callable[[Any], Any] | None = None, **options: Any
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """`idempotent_function` for a handler whose first parameter is the event
    (Powertools' `@idempotent` for `handler(event, context)`): the event is the
    payload, and `key=lambda event: event["order_id"]` picks the key from it
    (default: the event's hash)."""

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        params = list(inspect.signature(fn).parameters)
        if not params:
            raise TypeError(f"{fn.__qualname__} takes no event parameter")
        return idempotent_function(guard=guard, data_keyword_argument=params[0], key=key, **options)(fn)

    return decorate
