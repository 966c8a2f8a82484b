"""FastAPI: guard chosen routes (a route class), or the whole app (the ASGI
middleware), with the `idem serve` gateway's HTTP semantics
(`idem_guard.asgi`). Needs FastAPI; it is not a dependency of the package::

    from fastapi import FastAPI
    from idem_guard import AsyncGuard
    from idem_guard.fastapi import Idempotency

    idem = Idempotency(AsyncGuard(store=...), require_key=True)
    app = FastAPI()
    orders = idem.router()            # an APIRouter whose POST/PATCH routes are guarded

    @orders.post("/orders", status_code=201)
    async def create(order: Order) -> Receipt: ...

    app.include_router(orders)

Per route. `idem.route_class` is an `APIRoute` subclass: every route made
with it whose methods include a guarded one (POST and PATCH by default) is
guarded; `idem.router(**kwargs)` is `APIRouter(route_class=idem.route_class,
**kwargs)`, and `app.router.add_api_route(..., route_class_override=
idem.route_class)` guards one route of any router. Each guarded route
declares the `Idempotency-Key` header parameter, so it is in the OpenAPI
schema (required with `require_key=True`; its description says what a
repeat gets). The key is checked before FastAPI reads anything: a missing
(with `require_key`), malformed or repeated header is the gateway's 400
problem, not a validation error. Then the key is claimed and the route runs
— FastAPI's validation, dependencies, the endpoint, the response model — and
its response (status, headers, body, as FastAPI rendered it) is stored;
repeats get it byte for byte with `Idempotent-Replayed: true`. The first
response, once stored, and every replay carry `Idempotency-Expires`: until
when the key replays it (`idem_guard.asgi`).

What is not stored: a `RequestValidationError` (FastAPI's 422 for a request
that failed validation before the endpoint ran) releases the key and goes on
to the app's exception handler, so a corrected retry under the same key
runs; `store_validation_errors=True` stores it instead, rendered by the
app's handler for it. Any other exception the app has a handler for
(`HTTPException`, your own) is the route's answer: rendered by that handler
and stored like any response (a 5xx released unless `store_server_errors`).
An exception with no handler releases the key and propagates (a 500).

App-wide. `idem.install(app)` adds `IdempotencyMiddleware` with the same
options, and (unless `store_validation_errors=True`) a
`RequestValidationError` handler that marks the 422 as not to be stored
(`scope["extensions"]["idempotency"]["store"] = False`) and then answers as
FastAPI's own (or the handler registered before `install`). A handler you
register after `install` replaces it: call `idem_guard.fastapi.unstored(request)`
in it to keep validation errors unstored.

Options are `IdempotencyMiddleware`'s (`require_key`, `methods`, `key_header`,
`replay_header`, `expiry_header`, `fingerprint_headers`, `client_header`, `max_request_bytes`,
`store_server_errors`, `timeout_s`) and `store_validation_errors`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Annotated, Any, Unpack

try:
    from fastapi import APIRouter, Depends, FastAPI, Header, Request
    from fastapi.exception_handlers import request_validation_exception_handler
    from fastapi.exceptions import RequestValidationError
    from fastapi.routing import APIRoute
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import Response as HttpResponse
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("idem_guard.fastapi needs FastAPI: pip install fastapi") from e

from .aio import AsyncGuard
from .asgi import HOP_BY_HOP, HttpGuard, HttpOptions, IdempotencyMiddleware, _target
from .types import Response

__all__ = ["Idempotency", "unstored"]


def unstored(request: Request) -> None:
    """Marks the response to this request as not to be stored: the key is released.
    For an exception handler or endpoint of an app guarded by the middleware."""
    extension = (request.scope.get("extensions") or {}).get("idempotency")
    if isinstance(extension, dict):
        extension["store"] = False


ExceptionHandler = Callable[[Request, Exception], Awaitable[HttpResponse]]


class Idempotency:
    """The options of a guard for FastAPI routes or apps; see the module's doc."""

    def __init__(self, guard: AsyncGuard, *, store_validation_errors: bool = False, **options: Unpack[HttpOptions]) -> None:
        self.http = HttpGuard(guard, **options)
        self.guard = guard
        self.options = options
        self.store_validation_errors = store_validation_errors
        self.route_class: type[APIRoute] = _route_class(self)

    def router(self, **kwargs: Any) -> APIRouter:
        """An `APIRouter` whose routes with a guarded method are guarded."""
        return APIRouter(route_class=self.route_class, **kwargs)

    def install(self, app: FastAPI) -> None:
        """Guards the whole app with `IdempotencyMiddleware`; validation errors unstored unless
        `store_validation_errors`."""
        app.add_middleware(IdempotencyMiddleware, guard=self.guard, **self.options)
        if not self.store_validation_errors:
            previous = app.exception_handlers.get(RequestValidationError, request_validation_exception_handler)

            async def validation_error(request: Request, exc: Exception) -> HttpResponse:
                unstored(request)
                answer = previous(request, exc)
                response: HttpResponse = await answer if inspect.isawaitable(answer) else answer
                return response

            app.add_exception_handler(RequestValidationError, validation_error)

    def header_dependency(self, required: bool | None = None) -> Callable[..., Any]:
        """The `Idempotency-Key` header as a dependency, so the OpenAPI schema shows it:
        required when `required` (default: `require_key`). Its value is not used: the
        key is read before FastAPI runs, and a missing one answered 400 there."""
        http = self.http
        required = http.require_key if required is None else required
        name = http.key_header.decode("latin-1")
        alias = "-".join(part.capitalize() for part in name.split("-"))
        description = (
            f"Makes the request idempotent: the first request with a key runs, and a repeat with the same key "
            f"and request gets the stored response byte for byte (with `{http.replay_header}: true`). The same key "
            "with another request is 422, a repeat while the first runs 409 with Retry-After. 1 to 200 printable "
            "ASCII characters." + (" Required." if required else " Optional: without it the request is not guarded.")
        )
        annotation: Any = str if required else str | None

        async def idempotency_key(**values: Any) -> Any:
            return next(iter(values.values()), None)

        parameter = inspect.Parameter(
            "idempotency_key",
            inspect.Parameter.KEYWORD_ONLY,
            annotation=Annotated[annotation, Header(alias=alias, description=description)],
            default=inspect.Parameter.empty if required else None,
        )
        idempotency_key.__signature__ = inspect.Signature([parameter])  # type: ignore[attr-defined]
        return idempotency_key

    async def _guarded(self, handler: Callable[[Request], Awaitable[HttpResponse]], request: Request) -> HttpResponse:
        """The route's handler, guarded: the key is read and the body buffered here, the claim made
        by the endpoint's wrapper (`_endpoint`) once FastAPI has validated the request, and the
        response FastAPI rendered completes it here."""
        http = self.http
        scope = request.scope
        headers = [(bytes(n).lower(), bytes(v)) for n, v in scope["headers"]]
        key = http.key_of(headers)
        if key is None:
            return await handler(request)
        if isinstance(key, Response):
            return _http(key)
        body = bytearray()
        async for chunk in request.stream():  # buffered: FastAPI reads it again from the request
            body += chunk
            if len(body) > http.max_request_bytes:
                return _http(http.too_large())
        request._body = bytes(body)  # what Request.body() caches: FastAPI's handler reads it from there
        pending = _Pending(self, request, key, headers)
        token = _PENDING.set(pending)
        try:
            response = await handler(request)
        except Exception as error:
            if pending.task is None:
                # Nothing claimed: FastAPI refused the request before the endpoint ran (a
                # validation error), or a dependency raised. Stored only when asked.
                if not (self.store_validation_errors and isinstance(error, RequestValidationError)):
                    raise
                rendered = await self._rendered(request, error)
                if rendered is None:
                    raise
                return await pending.store_now(rendered)
            if pending.value.done() and not pending.final.done():
                pending.final.set_exception(error)  # rendering the endpoint's value failed: released
            await asyncio.gather(pending.task, return_exceptions=True)
            raise
        finally:
            _PENDING.reset(token)
        if pending.task is None or pending.answered:
            return response  # not guarded after all, or the guard's own answer (a replay, a problem)
        sendable, captured = await _captured(response)
        pending.final.set_result(captured)
        return _sent(sendable, captured, *await pending.task)

    async def _rendered(self, request: Request, error: Exception) -> HttpResponse | None:
        """The app's answer to an exception the endpoint (or FastAPI) raised, rendered by its
        handler; None to let it propagate (releasing the key)."""
        if isinstance(error, RequestValidationError) and not self.store_validation_errors:
            return None
        app = request.scope.get("app")
        handlers = getattr(app, "exception_handlers", None) or {}
        for cls in type(error).__mro__:
            if cls in handlers and isinstance(cls, type) and issubclass(cls, Exception):
                result = handlers[cls](request, error)
                return await result if inspect.isawaitable(result) else result  # type: ignore[no-any-return]
        return None


async def _captured(response: HttpResponse) -> tuple[HttpResponse, Response]:
    """The route's response as it is sent and as the guard stores it: status, headers
    (hop-by-hop dropped), the whole body (a streamed one read through first)."""
    body = getattr(response, "body", None)
    if body is None:  # a StreamingResponse: read it through, and send what was read
        chunks = []
        async for chunk in response.body_iterator:  # type: ignore[attr-defined]
            chunks.append(chunk if isinstance(chunk, bytes) else str(chunk).encode(response.charset))
        body = b"".join(chunks)
        whole = HttpResponse(body, response.status_code, background=response.background)
        headers = [(n, v) for n, v in response.raw_headers if n.lower() != b"content-length"]
        whole.raw_headers = [*headers, (b"content-length", str(len(body)).encode())]
        response = whole
    captured = Response(
        response.status_code,
        [
            (name, bytes(value))
            for name, value in ((bytes(n).decode("latin-1").lower(), v) for n, v in response.raw_headers)
            if name not in HOP_BY_HOP
        ],
        bytes(body),
    )
    return response, captured


def _sent(sendable: HttpResponse, captured: Response, answer: Response, added: list[tuple[str, bytes]]) -> HttpResponse:
    """What goes to the client for the route's response (`sendable` as FastAPI rendered it,
    `captured` as the guard was given it): that response when the guard's `answer` is it,
    else the answer; either with the headers the guard adds (replay, expiry)."""
    if answer is not captured:
        return _http(answer, added)
    if added:
        sendable.raw_headers = [*sendable.raw_headers, *((n.encode("latin-1"), v) for n, v in added)]
    return sendable


def _http(response: Response, added: list[tuple[str, bytes]] | None = None) -> HttpResponse:
    """A stored (or problem) response as Starlette sends it, headers byte for byte, then `added`."""
    out = HttpResponse(response.body, response.status)
    headers = [(n.encode("latin-1"), bytes(v)) for n, v in [*response.headers, *(added or ())]]
    if not any(n == b"content-length" for n, _ in headers):
        headers.append((b"content-length", str(len(response.body)).encode()))
    out.raw_headers = headers
    return out


class _Pending:
    """One guarded request between the route handler (which reads the key and renders the
    response) and the endpoint's wrapper (which claims once FastAPI has validated the request)."""

    def __init__(self, idem: Idempotency, request: Request, key: str, headers: list[tuple[bytes, bytes]]):
        self.idem, self.request, self.key, self.headers = idem, request, key, headers
        self.entered = False  # the endpoint's wrapper ran: the request passed validation
        self.answered = False  # the wrapper returned the guard's own answer (replay, 409, 422, 503)
        # HttpGuard.answer, run beside FastAPI's handler: the response, and the headers the guard adds.
        self.task: asyncio.Task[tuple[Response, list[tuple[str, bytes]]]] | None = None
        loop = asyncio.get_running_loop()
        self.value: asyncio.Future[tuple[str, Any]] = loop.create_future()  # the endpoint's value, or its rendered exception
        self.final: asyncio.Future[Response] = loop.create_future()  # the response FastAPI rendered from it

    def answer(self, run: Callable[[dict[str, Any]], Awaitable[Response]]) -> Awaitable[tuple[Response, list[tuple[str, bytes]]]]:
        scope = self.request.scope
        body = self.request._body
        return self.idem.http.answer(self.key, scope["method"].upper(), _target(scope), self.headers, body, run)

    async def store_now(self, rendered: HttpResponse) -> HttpResponse:
        """Claims and stores `rendered` as the key's answer (`store_validation_errors`)."""
        sendable, captured = await _captured(rendered)

        async def run(extension: dict[str, Any]) -> Response:
            return captured

        return _sent(sendable, captured, *await self.answer(run))

    async def claim(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """In the endpoint's wrapper: claims the key and runs `call` (the endpoint) under the
        claim; returns its value for FastAPI to render, or the guard's own answer."""
        request = self.request

        async def run(extension: dict[str, Any]) -> Response:
            request.scope.setdefault("extensions", {})["idempotency"] = extension
            try:
                value = await call()
            except Exception as error:
                rendered = await self.idem._rendered(request, error)
                if rendered is None:
                    raise
                self.value.set_result(("response", rendered))
            else:
                self.value.set_result(("value", value))
            return await self.final  # what FastAPI renders of it, handed over by the route handler

        self.task = asyncio.ensure_future(self.answer(run))
        waited: list[asyncio.Future[Any]] = [self.task, self.value]
        await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
        if self.value.done():
            return self.value.result()[1]
        answer, added = self.task.result()  # the endpoint's own exception, if it raised one (the key released)
        self.answered = True
        return _http(answer, added)


_PENDING: ContextVar[_Pending | None] = ContextVar("idem_guard_fastapi_pending", default=None)


def _endpoint(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """The endpoint as a guarded route calls it: claimed after validation (see `_Pending.claim`).
    FastAPI reads the parameters through `functools.wraps`, so the schema is the endpoint's."""
    if inspect.isgeneratorfunction(endpoint) or inspect.isasyncgenfunction(endpoint):
        raise TypeError(f"{endpoint.__qualname__} streams its response (a generator): it cannot be stored, so it cannot be guarded")
    is_async = inspect.iscoroutinefunction(endpoint) or inspect.iscoroutinefunction(type(endpoint).__call__)

    @functools.wraps(endpoint)
    async def guarded(*args: Any, **kwargs: Any) -> Any:
        async def call() -> Any:
            if is_async:
                return await endpoint(*args, **kwargs)
            return await run_in_threadpool(endpoint, *args, **kwargs)

        pending = _PENDING.get()
        if pending is None or pending.entered:
            return await call()  # not a guarded request (no key, an unguarded method)
        pending.entered = True
        return await pending.claim(call)

    return guarded


def _route_class(idem: Idempotency) -> type[APIRoute]:
    class IdempotentRoute(APIRoute):
        """An `APIRoute` guarded by an `Idempotency` when one of its methods is guarded."""

        def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
            methods = {m.upper() for m in kwargs.get("methods") or ("GET",)}
            self.idempotent = bool(methods & idem.http.methods)
            if self.idempotent:
                # Required in the schema only where every method of the route is guarded
                # (one route's methods share their parameters).
                required = idem.http.require_key and methods <= idem.http.methods
                kwargs["dependencies"] = [*(kwargs.get("dependencies") or ()), Depends(idem.header_dependency(required))]
                endpoint = _endpoint(endpoint)
            super().__init__(path, endpoint, **kwargs)

        def get_route_handler(self) -> Callable[[Request], Any]:
            handler = super().get_route_handler()
            if not getattr(self, "idempotent", False):
                return handler

            async def guarded(request: Request) -> HttpResponse:
                if request.method.upper() not in idem.http.methods:
                    return await handler(request)
                return await idem._guarded(handler, request)

            return guarded

    IdempotentRoute.__qualname__ = IdempotentRoute.__name__ = "IdempotentRoute"
    return IdempotentRoute
