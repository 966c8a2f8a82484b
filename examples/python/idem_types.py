"""The values of `idem:guard@0.1.0` as Python sees them, one class per WIT type.

Field names are the WIT's, snake_case. Both bindings (`idem_abi`, the static
canonical ABI over the core module, and `idem_component`, wasmtime-py's dynamic
component API) produce and take exactly these, so a store or a test never sees
which one runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional


@dataclass(frozen=True)
class Response:
    """`types.response`: stored and replayed byte for byte: status, headers in order, body."""

    status: int
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    body: bytes = b""


@dataclass(frozen=True)
class Claim:
    """`guard.claim`: the right to run the operation for a key, proven by its fence."""

    key: str
    fingerprint: str
    fence: int
    lease_until_ms: int
    expires_at_ms: int


class Policy(NamedTuple):
    """`guard.policy`: durations for one call."""

    lease_ms: int
    retention_ms: int
    max_response_bytes: int


class Record(NamedTuple):
    """`types.record`: what the store keeps for one key. `state` is `"processing"` or `"done"`."""

    fingerprint: str
    state: str
    lease_until_ms: int
    expires_at_ms: int
    response: Optional[Response]


class Entry(NamedTuple):
    """`types.entry`: a record as read from the store, with the version the store gave it.

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
