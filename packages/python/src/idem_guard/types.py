"""The values of `idem:guard@0.3.0` as Python sees them, one class per WIT type.

Field names are the WIT's, snake_case. Both bindings (`idem_guard.abi`, the static
canonical ABI over the core module, and `idem_guard.component`, wasmtime-py's dynamic
component API) produce and take exactly these, so a store or a test never sees
which one runs.

One difference from the WIT: `types.response` is a resource, so the WIT
carries a stored response beside its record, as a handle (`entry.response`,
`store.replace`'s `response`). A store here keeps it in the record
(`Record.response`), by value, as it always did: the bindings give the guest a
handle to that `Response` when they hand it an entry, and put the `Response`
behind the handle the guest lends to `replace` into the record they hand the
store. The response methods the guest calls (`status`, `size`, `same-as`) are
`status_u16`, `response_size` and `same_response` below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass(frozen=True)
class Response:
    """`types.response`: stored and replayed byte for byte: status, headers in order, body.

    In the WIT a resource the host holds: the guest gets handles to these
    objects, never their bytes, and a replay hands back the one the store read."""

    status: int
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    body: bytes = b""


def status_u16(r: Response) -> int:
    """`response.status`: the status, which must fit the WIT's u16 (the guard
    then refuses one outside 100 to 999). One that does not is a host error,
    raised (the instance traps, and nothing is stored), never cut to 16 bits:
    65,736 would read as 200."""
    if not 0 <= r.status <= 0xFFFF:
        raise ValueError(f"status {r.status} is not a u16")
    return r.status


def response_size(r: Response) -> int:
    """`response.size`: what `max-response-bytes` counts, the body's bytes plus
    every header name's (UTF-8) and value's bytes."""
    return len(r.body) + sum(len(name.encode()) + len(value) for name, value in r.headers)


def same_response(a: Response, b: Response) -> bool:
    """`response.same-as`: the same status, the same headers (names and values
    byte for byte, in order) and the same body."""
    return (
        a.status == b.status
        and a.body == b.body
        and len(a.headers) == len(b.headers)
        and all(na == nb and va == vb for (na, va), (nb, vb) in zip(a.headers, b.headers, strict=False))
    )


class Checkpoint(NamedTuple):
    """`types.checkpoint`: how far a multi-step operation got (`phase`, 1 to 64
    bytes of UTF-8) and what it needs to continue from there (`data`)."""

    phase: str
    data: bytes = b""


@dataclass(frozen=True)
class Claim:
    """`guard.claim`: the right to run the operation for a key, proven by its fence.

    `holder` is the claim's random holder id, kept across renewals and
    checkpoints; `checkpoint` the key's last recovery point (None on a fresh
    claim). Pass a claim back as received: `renew` and `release` keep its
    checkpoint in the record."""

    key: str
    fingerprint: str
    fence: int
    holder: int
    lease_until_ms: int
    expires_at_ms: int
    checkpoint: Checkpoint | None = None


class Policy(NamedTuple):
    """`guard.policy`: durations for one call."""

    lease_ms: int
    retention_ms: int
    max_response_bytes: int


class Record(NamedTuple):
    """`types.record`, with the response the WIT carries beside it: what the
    store keeps for one key. `state` is `"processing"` or `"done"`; `response`
    is present exactly when `done`; `holder` is 0 in records a 0.1 host wrote."""

    fingerprint: str
    state: str
    holder: int
    lease_until_ms: int
    expires_at_ms: int
    response: Response | None
    checkpoint: Checkpoint | None = None


class Entry(NamedTuple):
    """`types.entry`: a record (and its response) as read from the store, with
    the version the store gave it.

    A store's `insert` returns an `int` (`inserted(version)`) or an `Entry`
    (`existing(entry)`)."""

    record: Record
    version: int


class Failure(NamedTuple):
    """`guard.guard-error` as the guard returned it (not raised: the binding stays neutral)."""

    kind: str
    detail: str


class StoreFault(Exception):
    """A store failure the guard should see (`unavailable` or `corrupt`): it fails closed."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind
