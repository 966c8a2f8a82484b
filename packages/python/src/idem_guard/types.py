"""The values of `idem:guard@0.2.0` as Python sees them, one class per WIT type.

Field names are the WIT's, snake_case. Both bindings (`idem_guard.abi`, the static
canonical ABI over the core module, and `idem_guard.component`, wasmtime-py's dynamic
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
    checkpoint: Optional[Checkpoint] = None


class Policy(NamedTuple):
    """`guard.policy`: durations for one call."""

    lease_ms: int
    retention_ms: int
    max_response_bytes: int


class Record(NamedTuple):
    """`types.record`: what the store keeps for one key. `state` is `"processing"` or `"done"`;
    `holder` is 0 in records a 0.1 host wrote."""

    fingerprint: str
    state: str
    holder: int
    lease_until_ms: int
    expires_at_ms: int
    response: Optional[Response]
    checkpoint: Optional[Checkpoint] = None


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
