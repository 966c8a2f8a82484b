"""The HTTP semantics of the `idem serve` gateway, for the framework adapters
(`idem_guard.asgi`): the key as the gateway reads it, the client scope, the
problem responses. Pure functions over bytes, no framework::

    >>> idempotency_key(b'"order-1"')
    'order-1'
    >>> scoped_key(None, "order-1")
    'anon/order-1'
    >>> http_date(784_111_777_999)
    'Sun, 06 Nov 1994 08:49:37 GMT'
"""

from __future__ import annotations

import hashlib
import json
from email.utils import formatdate

from .types import Response

__all__ = ["HOP_BY_HOP", "MAX_KEY_BYTES", "MalformedKey", "http_date", "idempotency_key", "problem", "response_size", "scoped_key"]

#: The longest key a client may send: the store key adds a 16-character
#: client scope and a `/`, and the guard's limit is 255 bytes.
MAX_KEY_BYTES = 200

#: Headers that belong to one connection: never stored or replayed.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "te", "trailer", "transfer-encoding", "upgrade"}
)

_PROBLEMS = {
    "idempotency-key-missing": (400, "Idempotency-Key is missing"),
    "idempotency-key-malformed": (400, "Idempotency-Key is malformed"),
    "bad-request": (400, "Bad request"),
    "idempotency-key-mismatch": (422, "Idempotency-Key is already used for another request"),
    "idempotency-key-in-flight": (409, "A request with this Idempotency-Key is being processed"),
    "store-unavailable": (503, "The idempotency store is unavailable"),
    "response-not-recorded": (503, "The request ran but its response could not be recorded"),
    "body-too-large": (413, "Request body too large"),
    "response-too-large": (502, "The request ran; its response was too large to keep"),
    "upstream-timeout": (504, "The upstream timed out"),
}


class MalformedKey(ValueError):
    """An `Idempotency-Key` value that is not a key; the message says why (for a 400)."""


def idempotency_key(raw: bytes) -> str:
    """The key in one `Idempotency-Key` value: a structured-field string
    (`"…"`, escaping only `"` and `\\`) or a bare token of visible ASCII, 1 to
    200 bytes once unquoted. Raises `MalformedKey` saying what is wrong."""
    if raw.startswith(b'"'):
        if len(raw) < 2 or not raw.endswith(b'"'):
            raise MalformedKey("the quoted key has no closing '\"'")
        key = bytearray()
        inner = iter(raw[1:-1])
        for b in inner:
            if b == 0x5C:
                e = next(inner, None)
                if e not in (0x22, 0x5C):
                    raise MalformedKey("a quoted key may only escape '\"' and '\\'")
                key.append(e)
            elif b == 0x22:
                raise MalformedKey("a quoted key contains an unescaped '\"'")
            elif 0x20 <= b <= 0x7E:
                key.append(b)
            else:
                raise MalformedKey(f"the key contains byte 0x{b:02x}; keys are printable ASCII")
        text = bytes(key)
    else:
        for b in raw:
            if not 0x21 <= b <= 0x7E:
                raise MalformedKey(
                    f"the key contains byte 0x{b:02x}; an unquoted key is visible ASCII without spaces "
                    "(quote it as a structured-field string otherwise)"
                )
        text = raw
    if not text:
        raise MalformedKey(f"the key is empty; keys are 1 to {MAX_KEY_BYTES} bytes")
    if len(text) > MAX_KEY_BYTES:
        raise MalformedKey(f"the key is {len(text)} bytes; the limit is {MAX_KEY_BYTES}")
    return text.decode("ascii")


def scoped_key(client: bytes | None, key: str) -> str:
    """The store key, as the gateway builds it: the first 16 hex digits of the
    SHA-256 of the client header's value (`anon` without one), `/`, the key.
    One client never sees another's response, and no secret is stored."""
    scope = "anon" if client is None else hashlib.sha256(client).hexdigest()[:16]
    return f"{scope}/{key}"


def http_date(ms: int) -> str:
    """An instant (ms since the epoch) as an HTTP-date, RFC 9110's IMF-fixdate
    (`Sun, 06 Nov 1994 08:49:37 GMT`), rounded down to the second: a client told
    when a key expires never thinks a retry safe after it is gone."""
    return formatdate(ms // 1000, usegmt=True)


def problem(slug: str, detail: str, retry_after_s: int | None = None) -> Response:
    """A problem (RFC 9457) as the gateway renders it: `application/problem+json`
    with `type`, `title`, `status` and `detail`, and `retry-after` in whole
    seconds where a retry may work."""
    status, title = _PROBLEMS[slug]
    body = json.dumps(
        {"type": f"https://idem.dev/problems/{slug}", "title": title, "status": status, "detail": detail},
        separators=(",", ":"),
    ).encode()
    headers = [("content-type", b"application/problem+json")]
    if retry_after_s is not None:
        headers.append(("retry-after", str(retry_after_s).encode()))
    return Response(status, headers, body)


def response_size(response: Response) -> int:
    """The bytes counted against the guard's `max_response_bytes`: the body and each header's name and value."""
    return len(response.body) + sum(len(n) + len(v) for n, v in response.headers)
