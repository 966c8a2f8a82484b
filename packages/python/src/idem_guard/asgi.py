"""ASGI middleware with the HTTP semantics of the `idem serve` gateway
(draft-ietf-httpapi-idempotency-key-header), for Starlette, FastAPI or any
ASGI app, over an `AsyncGuard`. Pure ASGI: it imports no framework::

    from starlette.applications import Starlette
    from idem_guard import AsyncGuard
    from idem_guard.asgi import IdempotencyMiddleware

    app = Starlette(routes=[...])
    app.add_middleware(IdempotencyMiddleware, guard=AsyncGuard(), require_key=True)

A guarded request (POST and PATCH by default) with an `Idempotency-Key`
runs the app once; its status, headers and body are stored and every repeat
gets them back byte for byte with `Idempotent-Replayed: true`; the first
response, once stored, and every replay say until when the key replays it
with `Idempotency-Expires` (an HTTP-date, rounded down to the second). A repeat
while the first runs is 409 with `Retry-After`; the key with another
request (method, path with query, body, fingerprinted headers) is 422; a
malformed key, or a missing one with `require_key=True`, is 400; a store
that is down is 503 with `Retry-After: 1` and the app never runs (the body
says to retry and when, never what the store said: that goes to the guard's
log, `idem_guard.observe`); a 5xx
from the app, or an exception, releases the key for a retry. Errors are
`application/problem+json` with the gateway's types and titles
(`idem_guard.http.problem`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any, TypedDict, Unpack
from urllib.parse import quote

from .aio import AsyncAttempt, AsyncGuard
from .guard import GuardError, NotRecorded
from .http import HOP_BY_HOP, MalformedKey, http_date, idempotency_key, problem, response_size, scoped_key
from .types import Response

__all__ = ["HOP_BY_HOP", "HttpGuard", "HttpOptions", "IdempotencyMiddleware"]

LOGGER = logging.getLogger("idem_guard")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class _Unstored(Exception):
    """Raised in the guarded run to release the key with this response (a 5xx not stored);
    with `forget` (the claim's holder), the released record is deleted too."""

    def __init__(self, response: Response, forget: int | None = None):
        super().__init__(f"the app answered {response.status}; not stored")
        self.response = response
        self.forget = forget


async def _awaited(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


class _TimedOut(Exception):
    pass


class _TooLarge(Exception):
    pass


class _Disconnected(Exception):
    pass


class HttpOptions(TypedDict, total=False):
    """`HttpGuard`'s (and so `IdempotencyMiddleware`'s) options, for checkers: a misspelt one is an error."""

    require_key: bool
    methods: Iterable[str]
    key_header: str
    replay_header: str
    expiry_header: str
    fingerprint_headers: Iterable[str]
    client_header: str | None
    max_request_bytes: int
    store_server_errors: bool
    timeout_s: float


class HttpGuard:
    """The HTTP semantics of a guarded request, apart from how the request
    arrives and the app runs: the ASGI middleware below and the FastAPI route
    class (`idem_guard.fastapi`) share it. Options are `IdempotencyMiddleware`'s."""

    def __init__(
        self,
        guard: AsyncGuard,
        *,
        require_key: bool = False,
        methods: Iterable[str] = ("POST", "PATCH"),
        key_header: str = "idempotency-key",
        replay_header: str = "idempotent-replayed",
        expiry_header: str = "idempotency-expires",
        fingerprint_headers: Iterable[str] = ("content-type",),
        client_header: str | None = "authorization",
        max_request_bytes: int = 1 << 20,
        store_server_errors: bool = False,
        timeout_s: float = 20.0,
    ):
        if not isinstance(guard, AsyncGuard):
            raise TypeError("the idempotency middleware needs an AsyncGuard (idem_guard.AsyncGuard)")
        if max_request_bytes < 0 or timeout_s <= 0:
            raise ValueError("max_request_bytes must be at least 0 and timeout_s above 0")
        self.guard = guard
        self.require_key = require_key
        self.methods = frozenset(m.upper() for m in methods)
        self.key_header = key_header.lower().encode("latin-1")
        self.replay_header = replay_header.lower()
        self.expiry_header = expiry_header.lower()
        self.fingerprint_headers = [h.lower() for h in fingerprint_headers]
        self.client_header = client_header.lower().encode("latin-1") if client_header else None
        self.max_request_bytes = max_request_bytes
        self.store_server_errors = store_server_errors
        self.timeout_s = timeout_s

    def key_of(self, headers: list[tuple[bytes, bytes]]) -> str | Response | None:
        """The request's key; None without one (guarded only with `require_key`, answered 400);
        a problem `Response` for a malformed or repeated header."""
        sent = [v for n, v in headers if n == self.key_header]
        header = self.key_header.decode("latin-1")
        if not sent:
            if not self.require_key:
                return None
            return problem("idempotency-key-missing", f"this endpoint requires an {header} header")
        if len(sent) > 1:
            return problem("idempotency-key-malformed", f"more than one {header} header; send exactly one")
        try:
            return idempotency_key(sent[0])
        except MalformedKey as e:
            return problem("idempotency-key-malformed", str(e))

    def too_large(self) -> Response:
        limit = self.max_request_bytes
        return problem("body-too-large", f"the request body is over the limit of {limit} bytes")

    async def answer(
        self,
        key: str,
        method: str,
        target: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        run: Callable[[dict[str, Any]], Awaitable[Response]],
    ) -> tuple[Response, list[tuple[str, bytes]]]:
        """Runs `run(idempotency)` at most once for the key (and the request's
        fingerprint) and answers what a client gets, apart from the headers the
        guard adds to a stored response: the app's response (the very one `run`
        returned when it ran and was stored), a replay of it, or a problem; and
        those headers — on a replay the replay header, and on every stored
        response the expiry header, until when the key replays it (its stored
        record's `expires_at_ms` as an HTTP-date, rounded down to the second);
        none on a problem or a response not stored. `idempotency` is the dict
        the app sees as `scope["extensions"]["idempotency"]`: `key`,
        `store_key`, `fence`, and `store` — set it to False and the app's
        answer is sent but not stored (the key is released)."""
        client = next((v for n, v in headers if n == self.client_header), None) if self.client_header else None
        scoped = scoped_key(client, key)
        printed = [(name, v) for name in self.fingerprint_headers for n, v in headers if n == name.encode("latin-1")]
        fingerprint = await self.guard.fingerprint(method, target, printed, body)

        async def run_app(fence: int, attempt: AsyncAttempt) -> Response:
            extension: dict[str, Any] = {"key": key, "store_key": scoped, "fence": fence, "store": True}
            try:
                response = await asyncio.wait_for(run(extension), self.timeout_s)
            except TimeoutError as e:
                raise _TimedOut() from e
            if extension.get("store") is False:
                raise _Unstored(response, forget=attempt.claim.holder)
            if response.status >= 500 and not self.store_server_errors:
                raise _Unstored(response)
            limit = self.guard.guard.policy.max_response_bytes
            if response_size(response) > limit:
                # The app ran; its answer is too large to keep, so this problem is
                # stored in its place and every repeat gets it: it never runs again.
                return problem(
                    "response-too-large",
                    f"the handler ran the request, but its response was over the limit of {limit} bytes "
                    "(body plus headers) and was not kept; the key is done and this answer is what every "
                    "repeat gets, so the request is never run again",
                )
            return response

        try:
            outcome = await self.guard.run(scoped, fingerprint, run_app)
        except _Unstored as e:
            if e.forget is not None:
                await self._forget(scoped, e.forget)
            return e.response, []
        except _TimedOut:
            return problem("upstream-timeout", f"the handler did not answer within {int(self.timeout_s * 1000)} ms"), []
        except NotRecorded:
            # The store's reason is on the guard's log (idem_guard.observe), never in the body.
            lease_s = max(1, -(-self.guard.guard.policy.lease_ms // 1000))
            detail = (
                "the handler ran the request, but its response could not be recorded, so it is not "
                f"given out: a replay could contradict it. Retry after {lease_s * 1000} ms: the retry gets the recorded "
                "outcome, or, once the key's lease has run out, runs the request again"
            )
            return problem("response-not-recorded", detail, lease_s), []
        except GuardError as e:
            if e.kind != "invalid-input":
                raise
            return problem("idempotency-key-malformed", e.detail), []
        if outcome.kind in ("executed", "replayed"):
            assert outcome.response is not None
            added = [(self.replay_header, b"true")] if outcome.kind == "replayed" else []
            if outcome.expires_at_ms is not None:
                added.append((self.expiry_header, http_date(outcome.expires_at_ms).encode("latin-1")))
            return outcome.response, added
        if outcome.kind == "in-flight":
            ms = outcome.retry_after_ms or 0
            detail = f"retry after {ms} ms, when the first request has finished or its lease has run out"
            return problem("idempotency-key-in-flight", detail, max(1, -(-ms // 1000))), []
        if outcome.kind == "conflict":
            detail = (
                "the key was first used with another method, path, body or fingerprinted header; "
                "use a new key for a new request"
            )
            return problem("idempotency-key-mismatch", detail), []
        # The store's reason is on the guard's log (idem_guard.observe), never in the body.
        return problem(
            "store-unavailable",
            "the request was not run: the idempotency store could not answer. Retry after 1 second",
            1,
        ), []


    async def _forget(self, scoped: str, holder: int) -> None:
        """Deletes the released record of a request whose answer the app said not to store, so
        that the key is as if never used: a corrected retry under it runs (a released record
        keeps its fingerprint, and another request under the key would be a mismatch). Only the
        record this request's claim left (its holder, unfinished, at the version read) goes; a
        store failure here leaves it released."""
        store = self.guard.store
        try:
            now_ms = self.guard.clock.now_ms()  # the store's time authority
            entry = await _awaited(store.get(scoped, now_ms))
            if entry is not None and entry.record.holder == holder and entry.record.state == "processing":
                await _awaited(store.delete(scoped, entry.version, now_ms))
        except Exception as e:  # noqa: BLE001 - the key stays released; logged for the operator
            LOGGER.warning("idem could not forget the unstored answer of key %r: %s", scoped, e)


class IdempotencyMiddleware:
    """Wraps an ASGI app. Options (defaults are the gateway's):

    - `guard`: an `AsyncGuard` (its store, lease, retention, `max_response_bytes`).
    - `require_key` (False): answer 400 to a guarded request without a key;
      otherwise it passes through unguarded.
    - `methods` (POST, PATCH): the guarded methods; others pass through.
    - `key_header`, `replay_header`: `idempotency-key`, `idempotent-replayed`.
    - `expiry_header` (`idempotency-expires`): on every stored response (the first,
      once stored, and each replay), until when the key replays it: an HTTP-date, the
      stored record's `expires_at_ms` rounded down to the second.
    - `fingerprint_headers` (`content-type`): headers in the fingerprint besides
      method, path with query, and body.
    - `client_header` (`authorization`; None: one scope): keys are scoped by
      a hash of its value, so one client never gets another's response.
    - `max_request_bytes` (1 MiB): a larger body is 413, nothing claimed.
    - `store_server_errors` (False): store the app's 5xx too, instead of releasing the key.
    - `timeout_s` (20): an app that has not answered by then gets a 504 and
      the key is released (the app's task is cancelled).

    The app sees `scope["extensions"]["idempotency"]`: `key`, `store_key`,
    `fence`, and `store`, which it may set to False to have its answer sent
    but not stored (the key is released; `idem_guard.fastapi` does so for
    FastAPI's validation errors).
    """

    def __init__(self, app: ASGIApp, guard: AsyncGuard, **options: Unpack[HttpOptions]) -> None:
        self.app = app
        self.http = HttpGuard(guard, **options)
        self.guard = guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        http = self.http
        if scope["type"] != "http" or scope["method"].upper() not in http.methods:
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = [(bytes(n).lower(), bytes(v)) for n, v in scope["headers"]]
        key = http.key_of(headers)
        if key is None:
            await self.app(scope, receive, send)
            return
        if isinstance(key, Response):
            await _send(send, key)
            return
        try:
            body = await _read_body(receive, http.max_request_bytes)
        except _TooLarge:
            await _send(send, http.too_large())
            return
        except _Disconnected:
            return  # the client left before its request arrived: nothing was claimed

        async def run(extension: dict[str, Any]) -> Response:
            inner = {**scope, "extensions": {**(scope.get("extensions") or {}), "idempotency": extension}}
            return await self._captured(inner, body, receive)

        response, added = await http.answer(key, scope["method"].upper(), _target(scope), headers, body, run)
        await _send(send, _with_headers(response, added))

    async def _captured(self, scope: Scope, body: bytes, receive: Receive) -> Response:
        """Runs the app on the buffered body and captures its response: nothing
        reaches the client until the claim is settled."""
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # the client's disconnect, when it comes

        start: Message | None = None
        chunks: list[bytes] = []

        async def capture(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
            elif message["type"] == "http.response.body":
                chunks.append(bytes(message.get("body", b"")))

        await self.app(scope, replay, capture)
        if start is None:
            raise RuntimeError("the ASGI app returned without sending a response")
        headers = [
            (name, bytes(value))
            for name, value in ((bytes(n).decode("latin-1").lower(), v) for n, v in start.get("headers", []))
            if name not in HOP_BY_HOP
        ]
        return Response(start["status"], headers, b"".join(chunks))


def _with_headers(response: Response, added: list[tuple[str, bytes]]) -> Response:
    """`response` with `added` after its own headers (the response itself when there are none)."""
    return Response(response.status, [*response.headers, *added], response.body) if added else response


def _target(scope: Scope) -> str:
    """The request target as the gateway fingerprints it: the path as sent, and `?query` if any."""
    raw = scope.get("raw_path")
    path = bytes(raw).decode("latin-1") if raw else quote(scope.get("root_path", "") + scope["path"])
    query = bytes(scope.get("query_string", b"")).decode("latin-1")
    return f"{path}?{query}" if query else path


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected()
        chunk = bytes(message.get("body", b""))
        size += len(chunk)
        if size > limit:
            raise _TooLarge()
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _send(send: Send, response: Response) -> None:
    headers = [(n.encode("latin-1"), bytes(v)) for n, v in response.headers]
    if not any(n == b"content-length" for n, _ in headers):
        headers.append((b"content-length", str(len(response.body)).encode()))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})
