"""The idem guard component hosted in Python with the `wasmtime` package.

The component (the very bytes `idem component --out FILE` writes) makes every
decision; this module gives it a clock, randomness and a store and wraps its
calls in `Guard.run`, which runs a handler at most once per key and replays
its response to every repeat::

    guard = Guard.load(store=MemoryStore())
    outcome = guard.run("order-1", "sku=A&qty=1", lambda fence: Response(200, [], b"paid"))

A handler of several steps takes the `Attempt` as a second argument, saves a
checkpoint after each step, and a retry that takes over after a crash is
handed the last one::

    def order(fence: int, attempt: Attempt) -> Response:
        if attempt.checkpoint is None:
            attempt.save_checkpoint("charged", charge())
        return ship(attempt.checkpoint.data)

Two bindings run the component: `idem_guard.abi` (the default, `binding="static"`)
runs its core module through wasmtime's core API with the canonical ABI of this
WIT written once in Python, tens of microseconds a call; `idem_guard.component`
(`binding="dynamic"`) goes through wasmtime-py's component API, milliseconds a
call, and serves as the reference the tests check the static one against.
Stores and callers see the same values either way (`idem_guard.types`).

Time is the store's: a guard judges leases and retention by `store.clock`,
the store's time authority (`idem_guard.clock`, wit/clock.wit), never by
this host's wall clock.
"""

from __future__ import annotations

import heapq
import inspect
import itertools
import logging
import os
import secrets
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .clock import LocalClock, clock_error
from .observe import DecisionHook, Observer, TracedStore
from .types import Checkpoint, Claim, Entry, Failure, Policy, Record, Response, StoreFault
from .workers import fork_generation, reset_after_fork, warn, warn_if_shared_memory

# The component's bytes ship inside the package (packages/python/build.sh writes them
# there from `idem component --out`); IDEM_COMPONENT or `component=` override them.
DEFAULT_COMPONENT = Path(__file__).resolve().parent / "idem-guard.wasm"
T = TypeVar("T")
U64_MAX = (1 << 64) - 1


@dataclass(frozen=True)
class Outcome:
    """What `Guard.run` did: `executed`, `replayed`, `in-flight`, `conflict` or `unavailable`."""

    kind: str
    response: Response | None = None
    retry_after_ms: int | None = None
    message: str | None = None
    #: The claim's fence when the handler ran (`executed`).
    fence: int | None = None
    #: Until when the key replays its stored response (`executed`, `replayed`): the
    #: `expires_at_ms` of its stored record, ms since the epoch on the store's clock.
    expires_at_ms: int | None = None


class Decided(tuple[str, Any]):
    """`begin`'s decision, `(kind, value)` as it always was — `("proceed", Claim)`,
    `("replay", Response)`, `("in-flight", ms)` or `("conflict", None)` — with
    `expires_at_ms`: on a replay, the `expires_at_ms` of the stored record whose
    response it hands back (ms since the epoch on the store's clock: repeats get
    this response until then); None for the other decisions."""

    expires_at_ms: int | None

    def __new__(cls, kind: str, value: Any, expires_at_ms: int | None = None) -> Decided:
        decided = super().__new__(cls, (kind, value))
        decided.expires_at_ms = expires_at_ms
        return decided


class GuardError(Exception):
    """An error the guard returned: `unavailable`, `invalid-input` or `stale-claim`."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


class NotRecorded(Exception):
    """The handler ran but its response was not stored; the key stays claimed until its lease runs out."""

    def __init__(self, response: Response, error: GuardError):
        super().__init__(f"the handler ran but its response was not recorded: {error}")
        self.response = response
        self.error = error


class SystemRandom:
    """The claims' holder ids: 64 bits from the operating system's CSPRNG (`secrets`)."""

    def random_u64(self) -> int:
        return secrets.randbits(64)


class Faults:
    """Scripted store faults, one rule per primitive, for tests and drills.

    `fault("replace", kind="error", message="timeout", count=1)`: `error`
    fails before applying, `lost` applies then fails (a lost reply), `trap`
    raises a plain exception (a host bug: the instance traps); `count` calls
    (every call when None). A store applies a rule with `take`, `before` and
    `lost` around its own operation."""

    def __init__(self) -> None:
        self._faults: dict[str, dict[str, Any]] = {}

    def fault(self, primitive: str, kind: str, message: str = "injected fault", count: int | None = None) -> None:
        if primitive not in ("get", "insert", "replace", "delete"):
            raise ValueError(f"unknown store primitive {primitive!r}; expected get, insert, replace or delete")
        if kind not in ("error", "lost", "trap"):
            raise ValueError(f"unknown fault kind {kind!r}; expected error, lost or trap")
        self._faults[primitive] = {"kind": kind, "message": message, "count": count}

    def clear_faults(self) -> None:
        self._faults.clear()

    def take(self, primitive: str) -> dict[str, Any] | None:
        """The rule for this call of `primitive`, or None; counted down."""
        rule = self._faults.get(primitive)
        if rule is not None and rule["count"] is not None:
            rule["count"] -= 1
            if rule["count"] <= 0:
                del self._faults[primitive]
        return rule

    @staticmethod
    def before(primitive: str, rule: dict[str, Any]) -> None:
        """Raises what `rule` injects before the operation (`error`, `trap`); returns for `lost`."""
        if rule["kind"] == "error":
            raise StoreFault("unavailable", f"{rule['message']} (injected on {primitive})")
        if rule["kind"] == "trap":
            raise RuntimeError(f"host bug injected on {primitive}")

    @staticmethod
    def lost(primitive: str) -> StoreFault:
        """What a `lost` rule raises after the operation was applied."""
        return StoreFault("unavailable", f"reply to {primitive} lost (injected; the operation was applied)")


class MemoryStore(Faults):
    """The store primitives of wit/store.wit over a dict, with fault injection
    (`Faults`: `store.fault("replace", kind="error", message="timeout", count=1)`).
    Each primitive is atomic, so guards on several threads can share one store.

    Its time authority (`clock`, wit/clock.wit) is the process's: a
    `LocalClock`, the boot clock anchored once to the wall clock, so a step
    of the wall clock moves no lease.
    """

    def __init__(self) -> None:
        super().__init__()
        self.clock = LocalClock()
        self._records: dict[str, Entry] = {}
        self._lock = threading.Lock()
        self._generation = fork_generation()  # a fork after this makes a copy per process: warned at first use
        reset_after_fork(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    def _apply(self, primitive: str, operation: Callable[[], T]) -> T:
        if self._generation != fork_generation():
            self._generation = fork_generation()
            warn(self, "this MemoryStore was made before an os.fork() and is used in the child")
        with self._lock:
            rule = self.take(primitive)
            if rule is None:
                return operation()
            self.before(primitive, rule)
            operation()
            raise self.lost(primitive)

    def _live(self, key: str, now_ms: int) -> Entry | None:
        entry = self._records.get(key)
        if entry is not None and now_ms < entry.record.expires_at_ms:
            return entry
        return None

    def get(self, key: str, now_ms: int) -> Entry | None:
        return self._apply("get", lambda: self._live(key, now_ms))

    def insert(self, key: str, record: Record, now_ms: int) -> int | Entry:
        """`inserted(version)` is an `int`, `existing(entry)` the live `Entry`."""

        def op() -> int | Entry:
            live = self._live(key, now_ms)
            if live is not None:
                return live
            # An expired record's version carries on, so an old fence never matches again.
            old = self._records.get(key)
            version = (old.version if old else 0) + 1
            self._records[key] = Entry(record, version)
            return version

        return self._apply("insert", op)

    def replace(self, key: str, expected_version: int, record: Record, now_ms: int) -> bool:
        """Writes `record` at `expected_version + 1` when the live record is at
        `expected_version`; whether it wrote (an absent, expired or moved record: no)."""

        def op() -> bool:
            live = self._live(key, now_ms)
            if live is None or live.version != expected_version or expected_version + 1 > U64_MAX:
                return False
            self._records[key] = Entry(record, expected_version + 1)
            return True

        return self._apply("replace", op)

    def delete(self, key: str, expected_version: int | None, now_ms: int) -> bool:
        """Removes the record live at `now_ms` (at `expected_version` only, unless None);
        whether it did. An expired record is left alone (the purge frees it)."""

        def op() -> bool:
            live = self._live(key, now_ms)
            if live is None or (expected_version is not None and live.version != expected_version):
                return False
            del self._records[key]
            return True

        return self._apply("delete", op)

    def peek(self, key: str, now_ms: int) -> Entry | None:
        """The live record and its version, bypassing faults: for tests and operators."""
        return self._live(key, now_ms)

    def __len__(self) -> int:
        """How many records the store holds, expired ones not yet purged included."""
        return len(self._records)

    def purge_expired(self, now_ms: int, limit: int) -> int:
        """Frees at most `limit` records expired at `now_ms`; returns how many.
        Reads never depend on it (an expired record is absent either way); a
        key claimed again after its record was purged starts at version 1."""
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"limit {limit!r} must be a positive whole number")
        with self._lock:
            expired = [k for k, e in self._records.items() if e.record.expires_at_ms <= now_ms][:limit]
            for key in expired:
                del self._records[key]
        return len(expired)


class _Witness:
    """The store as the component sees it, noting the last `done` record that passed
    through it in one guard call: read (`get`, or `insert` finding it) or written (a
    `replace` that answered True). Its `expires_at_ms` is until when the key's response
    is replayed, which the guest does not return: a `replay` hands back the response of
    the done record just read, and a `complete` succeeds right after writing its done
    record, or after reading it back. So the guard learns the expiry from the records
    it passes, with no store call of its own. The guard's lock makes one call at a time
    (a journaled call's runs included), so one witness, reset per call, serves them all.
    Any other attribute is the store's."""

    def __init__(self, store: Any):
        self.inner = store
        self.response: Response | None = None
        self.expires_at_ms: int | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def take(self) -> tuple[Response | None, int | None]:
        """The last done record's response and expiry seen since the last `take`, forgotten."""
        seen = self.response, self.expires_at_ms
        self.response = self.expires_at_ms = None
        return seen

    def _saw(self, record: Record | None) -> None:
        if record is not None and record.state == "done":
            self.response, self.expires_at_ms = record.response, record.expires_at_ms

    def get(self, key: str, now_ms: int) -> Any:
        entry = self.inner.get(key, now_ms)
        if isinstance(entry, Entry):
            self._saw(entry.record)
        return entry

    def insert(self, key: str, record: Record, now_ms: int) -> Any:
        outcome = self.inner.insert(key, record, now_ms)
        if isinstance(outcome, Entry):
            self._saw(outcome.record)
        return outcome

    def replace(self, key: str, expected_version: int, record: Record, now_ms: int) -> Any:
        written = self.inner.replace(key, expected_version, record, now_ms)
        if written is True:
            self._saw(record)
        return written

    def delete(self, key: str, expected_version: int | None, now_ms: int) -> Any:
        return self.inner.delete(key, expected_version, now_ms)


def _bytes(value: Any) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


def _normalized(r: Response) -> Response:
    """A handler's response with `str` bodies and header values as UTF-8 bytes
    (the response itself when it already is: a frozen dataclass is slow to build)."""
    if (
        type(r) is Response
        and type(r.body) is bytes
        and type(r.headers) is list
        and all(type(h) is tuple and len(h) == 2 and type(h[1]) is bytes for h in r.headers)
    ):
        return r
    return Response(r.status, [(n, _bytes(v)) for n, v in r.headers], _bytes(r.body))


def _binding(name: str) -> Any:
    if name == "static":
        from . import abi

        return abi.Guest
    if name == "dynamic":
        from . import component

        return component.Guest
    raise ValueError(f"unknown binding {name!r}; expected static or dynamic")


def store_clock(store: Any) -> Any:
    """The time authority of `store` (`store.clock`, wit/clock.wit): what a guard
    judges leases and retention by unless it is given a clock. A store without
    one is refused: a guard never falls back to this host's wall clock, which
    other hosts sharing the store do not share."""
    clock = getattr(store, "clock", None)
    if clock is None or not callable(getattr(clock, "now_ms", None)):
        raise TypeError(
            f"the store {type(store).__name__} has no `clock`, its time authority (wit/clock.wit): "
            "give the store a `clock` attribute with `now_ms()` (a server's clock for a store that several "
            "processes share, idem_guard.clock.LocalClock() for one private to this process), "
            "or pass clock= to the guard"
        )
    return clock


def check_lease_renewable(lease_ms: int, store_timeout_ms: int) -> None:
    """Whether renewals can keep a lease of `lease_ms` alive on a store that may take
    `store_timeout_ms` to answer (the Rust host's `check_lease_renewable`): the guard
    renews a third of the way into the lease, and a renewal must land before the lease
    ends even when it takes the whole store timeout. So the lease must be at least twice
    the store timeout; a shorter one could lapse while its holder is alive and renewing,
    and a repeat would run the key a second time. ValueError when it is not."""
    if lease_ms < 2 * store_timeout_ms:
        raise ValueError(
            f"lease ({lease_ms} ms) must be at least twice store-timeout ({store_timeout_ms} ms), "
            f"i.e. at least {2 * store_timeout_ms} ms: a renewal starts a third into the lease and may take "
            "the whole store timeout, so a shorter lease could lapse while its holder is alive; lengthen the "
            "lease or shorten the store timeout"
        )


def check_lease_for(store: Any, lease_ms: int, renew_lease: bool, clock_given: bool) -> None:
    """`check_lease_renewable` where it applies, as in the Rust host: a guard that renews
    leases, over a store with a timeout (`timeout_ms`: the Redis and PostgreSQL stores; a
    memory store never waits), on the store's own clock (a clock the caller gives, a test's
    manual one, is not real time)."""
    timeout_ms = getattr(store, "timeout_ms", None)
    if renew_lease and not clock_given and isinstance(timeout_ms, int) and not isinstance(timeout_ms, bool):
        check_lease_renewable(lease_ms, timeout_ms)


class Guard:
    """An idempotency guard: the component, one instance, over one store and clock.

    Its calls take turns on one lock, so it may be shared between threads.

    The clock is the store's time authority (`store.clock`, wit/clock.wit)
    unless `clock=` gives one (a test's `ManualClock`). Until that clock knows
    its authority's time (a server's clock not read yet) every call but
    `fingerprint` fails closed: `GuardError("unavailable")` naming why. A
    guard that renews leases over a store with a timeout (`timeout_ms`) is
    refused (ValueError) when the lease is shorter than twice that timeout.
    """

    @classmethod
    def load(cls, **options: Any) -> Guard:
        return cls(**options)

    def __init__(
        self,
        store: Any = None,
        clock: Any = None,
        lease_ms: int = 30_000,
        retention_ms: int = 24 * 60 * 60 * 1000,
        max_response_bytes: int = 1 << 20,
        renew_lease: bool = True,
        component: os.PathLike[str] | str | None = None,
        binding: str = "static",
        random: Any = None,
        purge_every_ms: int = 60_000,
        logger: logging.Logger | None = None,
        on_decision: DecisionHook | Iterable[DecisionHook] | None = None,
        tracing: Any = None,
    ):
        if not isinstance(purge_every_ms, int) or isinstance(purge_every_ms, bool) or purge_every_ms < 0:
            raise ValueError(f"purge_every_ms {purge_every_ms!r} must be a whole number of milliseconds, 0 for never")
        self.store = store if store is not None else MemoryStore()
        self.clock = clock if clock is not None else store_clock(self.store)
        check_lease_for(self.store, lease_ms, renew_lease, clock is not None)
        self.random = random if random is not None else SystemRandom()
        self.policy = Policy(lease_ms, retention_ms, max_response_bytes)
        self.renew_lease = renew_lease
        self.replaced = 0
        # Logging, metrics callbacks and spans on each decision (idem_guard.observe).
        self.observer = Observer(logger, on_decision, tracing)
        warn_if_shared_memory(self.store)
        # What the component calls: the store, with a span per primitive when calls may be traced
        # (a journal's store is not: AsyncGuard traces the real store behind it).
        traced = self.observer.tracing and not getattr(self.store, "journaled", False)
        self._store_seen = TracedStore(self.store) if traced else self.store
        # The store the component is given: it notes the done records of each call.
        self._witness = _Witness(self._store_seen)
        self._lock = threading.Lock()
        reset_after_fork(self)
        path = Path(component or os.environ.get("IDEM_COMPONENT") or DEFAULT_COMPONENT)
        if not path.is_file():
            raise FileNotFoundError(
                f"no guard component at {path}: build it with `scripts/build-component.sh {path}` "
                f"(or `idem component --out {path}`; "
                f"packages/python/build.sh puts it in the package), or set IDEM_COMPONENT to the file"
            )
        self._guest = _binding(binding).load(path)
        self._instance: Any = None
        self._renewer = _Renewer(self)
        self._instantiate()  # fail at load, not at the first request
        # What the purge has done; `every_ms` 0 when this guard does not purge.
        self.purge_stats = PurgeStats()
        self._purge: int | None = None
        if purge_every_ms > 0 and callable(getattr(self.store, "purge_expired", None)):
            self._purge = PURGES.add(self, purge_every_ms, self.store.purge_expired, self.clock, self.purge_stats)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        renewer = getattr(self, "_renewer", None)
        if renewer is not None:
            renewer._after_fork()

    def close(self) -> None:
        """Stops the guard's background work (the purge); calls still work, and `run` still renews leases."""
        if self._purge is not None:
            PURGES.remove(self._purge)
            self._purge = None

    def _instantiate(self) -> Any:
        if self._instance is None:
            # Each instance has a wasmtime Store of its own; a trapped one is dropped whole.
            self._instance = self._guest.instantiate(self._witness, self.clock, self.random)
        return self._instance

    def _call(self, name: str, *args: Any) -> Any:
        return self._call_seen(name, *args)[0]

    def _call_seen(self, name: str, *args: Any) -> tuple[Any, tuple[Response | None, int | None]]:
        """The export's value, and the response and expiry of the last done record its store calls passed (`_Witness`)."""
        # The guard judges time by the store's authority: until it is known no call may guess it.
        if name != "fingerprint" and (why := clock_error(self.clock)) is not None:
            raise GuardError("unavailable", f"the store's clock is not known: {why}")
        with self._lock:
            instance = self._instantiate()
            self._witness.take()
            try:
                value = getattr(instance, name)(*args)
            except Exception as trap:  # a trap, or an exception a host function raised
                self._witness.take()
                self._instance = None
                self.replaced += 1
                raise GuardError("unavailable", f"guard component failed, instance replaced: {trap}") from trap
            seen = self._witness.take()
        if isinstance(value, Failure):
            raise GuardError(value.kind, value.detail)
        return value, seen

    @staticmethod
    def _decided(value: Any, seen: tuple[Response | None, int | None]) -> Decided:
        kind, val = value
        response, expires_at_ms = seen
        if kind == "replay" and val is response:
            return Decided(kind, val, expires_at_ms)
        return Decided(kind, val)

    def begin(self, key: str, fingerprint: str) -> Decided:
        """`("proceed", Claim)`, `("replay", Response)`, `("in-flight", ms)` or `("conflict", None)`,
        as a `Decided`: a replay's `expires_at_ms` is its stored record's expiry."""
        return self._decided(*self._call_seen("begin", key, fingerprint, self.policy))

    def complete(self, claim: Claim, response: Response) -> int | None:
        """Stores `response` for the claim: every repeat replays it. Returns until when: the
        `expires_at_ms` of the record it stored (or, on a retry that finds it stored, read back),
        ms since the epoch on the store's clock; None only over a store that showed it no such record."""
        _, (_, expires_at_ms) = self._call_seen("complete", claim, _normalized(response), self.policy)
        return expires_at_ms

    def release(self, claim: Claim) -> None:
        self._call("release", claim)

    def renew(self, claim: Claim) -> Claim:
        """Extends the claim's lease; returns it with its new fence."""
        renewed: Claim = self._call("renew", claim, self.policy)
        return renewed

    def save_checkpoint(self, claim: Claim, checkpoint: Checkpoint) -> Claim:
        """Records a recovery point for the claim and extends its lease; returns
        the claim with its new fence and this checkpoint. A later takeover's
        claim carries it."""
        saved: Claim = self._call("save_checkpoint", claim, Checkpoint(checkpoint.phase, _bytes(checkpoint.data)), self.policy)
        return saved

    def begin_request(
        self, key: str, method: str, path: str, headers: Sequence[tuple[str, bytes]] = (), body: bytes = b""
    ) -> Decided:
        """`begin` with the canonical fingerprint of the request, in one call."""
        return self._decided(
            *self._call_seen("begin_request", key, method, path, [(n, _bytes(v)) for n, v in headers], _bytes(body), self.policy)
        )

    def fingerprint(self, method: str, path: str, headers: Sequence[tuple[str, bytes]] = (), body: bytes = b"") -> str:
        printed: str = self._call("fingerprint", method, path, [(n, bytes(v)) for n, v in headers], bytes(body))
        return printed

    def run(self, key: str, fingerprint: str, handler: Callable[..., Response]) -> Outcome:
        """Runs `handler(fence)` at most once per key and fingerprint within the
        retention window and replays its response to every repeat.

        A handler that takes a second positional parameter (without a default)
        is called as `handler(fence, attempt)`: `attempt.checkpoint` is the recovery point to
        continue from (None on a fresh claim; the last one saved when this run
        took over from an attempt that crashed or failed), and
        `attempt.save_checkpoint(phase, data)` records the next.

        While the handler runs, the guard's renewal thread renews its claim's
        lease every third of the lease, so a handler slower than the lease is
        not taken over and run a second time (`renew_lease=False` turns this
        off). A renewal the store cannot answer is tried again at the next
        tick; one refused as stale (the claim was taken over) stops the
        renewing, and the completion is then refused the same way. Renewals,
        checkpoints and the completion all use the latest claim (each write
        moves the fence).

        Raises `GuardError("invalid-input")` for a bad key or fingerprint,
        `NotRecorded` if the response could not be stored, or the handler's own
        exception (after releasing the claim).

        Each call ends in one decision, logged, passed to `on_decision` and
        put on a span as `idem_guard.observe` describes.
        """
        return self.observer.run(key, lambda: self._run(key, fingerprint, handler))

    def _run(self, key: str, fingerprint: str, handler: Callable[..., Response]) -> Outcome:
        try:
            decision = self.begin(key, fingerprint)
        except GuardError as e:
            return _refused(e)
        if (outcome := _not_run(decision)) is not None:
            return outcome
        value = decision[1]
        held = self._renewer.hold(value) if self.renew_lease else _Held(value)
        try:
            if _takes_attempt(handler):
                response = _normalized(handler(value.fence, Attempt(self, held)))
            else:
                response = _normalized(handler(value.fence))
        except BaseException:
            claim = held.stop()
            try:
                self.release(claim)
            except GuardError:
                pass  # the lease runs out as after a crash
            raise
        claim = held.stop()
        try:
            expires_at_ms = self.complete(claim, response)
        except GuardError as e:
            raise NotRecorded(response, e) from e
        return Outcome("executed", response=response, fence=value.fence, expires_at_ms=expires_at_ms)


def _takes_attempt(handler: Callable[..., Any]) -> bool:
    """Whether `handler` takes the `Attempt`: a second positional parameter
    without a default (or `*args`). A handler written for one argument, the
    fence, keeps working, and so does one whose second parameter is a default
    capturing a value (`lambda fence, ledger=ledger: ...`)."""
    code = getattr(handler, "__code__", None)
    if code is not None and not isinstance(handler, types.MethodType):  # a plain function or lambda: cheap
        required = code.co_argcount - len(getattr(handler, "__defaults__", None) or ())
        return required >= 2 or bool(code.co_flags & inspect.CO_VARARGS)
    try:
        params = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):
        return False
    required = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    return len(required) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


def _refused(e: GuardError) -> Outcome:
    """`run`'s outcome when `begin` failed: an invalid key or fingerprint is
    raised; anything else is `unavailable` (nothing ran)."""
    if e.kind == "invalid-input":
        raise e
    return Outcome("unavailable", message=e.detail)


def _not_run(decision: Decided) -> Outcome | None:
    """`run`'s outcome for a decision that runs nothing; None for `proceed`."""
    kind, value = decision
    if kind == "replay":
        return Outcome("replayed", response=value, expires_at_ms=decision.expires_at_ms)
    if kind == "in-flight":
        return Outcome("in-flight", retry_after_ms=value)
    if kind == "conflict":
        return Outcome("conflict")
    return None


class ClaimView:
    """The claim a running handler holds, as it stands: `Attempt` and
    `AsyncAttempt` share it. `held` is anything with a `claim` attribute that
    renewals and checkpoints keep current."""

    def __init__(self, held: Any):
        self._held = held

    @property
    def claim(self) -> Claim:
        """The claim as it stands: renewals and checkpoints move its fence."""
        claim: Claim = self._held.claim
        return claim

    @property
    def fence(self) -> int:
        return self.claim.fence

    @property
    def checkpoint(self) -> Checkpoint | None:
        """The key's last recovery point, or None: on entry, how far an earlier
        attempt whose lease ran out (or that failed and released) got — None on
        a fresh claim; after `save_checkpoint`, the one just saved."""
        return self.claim.checkpoint


class Attempt(ClaimView):
    """What `Guard.run` hands a handler that takes it: the claim as it stands,
    the recovery point to continue from, and the call that records the next."""

    def __init__(self, guard: Guard, held: _Held):
        super().__init__(held)
        self._guard = guard

    def save_checkpoint(self, phase: str, data: bytes | str = b"") -> Claim:
        """Records that the operation got as far as `phase` (1 to 64 bytes), with
        `data` to continue from. Call it after a step's effect is durable and
        before the next step starts, so a retry repeats at most the step that was
        running. It also extends the lease; renewals and the completion go on
        from the claim it returns. Raises `GuardError` (`stale-claim`: taken
        over; `invalid-input`; `unavailable`)."""
        saved: Claim = self._held.save_checkpoint(self._guard, Checkpoint(phase, _bytes(data)))
        return saved


class _Held:
    """A claim whose lease may be renewed meanwhile; `stop()` returns the latest claim."""

    def __init__(self, claim: Claim, renewer: _Renewer | None = None, due: float = 0.0):
        self.claim = claim
        self.due = due  # time.monotonic() of the next renewal
        self.stopped = False
        self.lock = threading.Lock()  # held across a renewal, so `stop` waits for one under way
        self._renewer = renewer

    def stop(self) -> Claim:
        if self._renewer is not None:
            self._renewer.drop(self)
        with self.lock:
            self.stopped = True
            return self.claim

    def save_checkpoint(self, guard: Guard, checkpoint: Checkpoint) -> Claim:
        # Under the lock a renewal holds too: the two never write from the same
        # claim at once, and the renewal after this one goes from the new claim.
        with self.lock:
            self.claim = guard.save_checkpoint(self.claim, checkpoint)
            if self._renewer is not None:
                self.due = time.monotonic() + self._renewer.every  # the checkpoint extended the lease
            return self.claim


# Records one purge asks of a store at most; a period asks again until a batch comes back short.
PURGE_BATCH = 1_000
# What the purge thread holds for one guard: its store's purge, its clock, its stats.
_PurgeJob = tuple[Callable[[int, int], int], Any, "PurgeStats"]


@dataclass
class PurgeStats:
    """What a guard's purge has done: `every_ms` is 0 when it does not purge
    (its store keeps no expired records, or `purge_every_ms=0`)."""

    every_ms: int = 0
    runs: int = 0
    purged: int = 0
    errors: int = 0
    last_purged: int = 0
    last_error: str | None = None

    def count(self, purged: int, error: Exception | None) -> None:
        """Counts one run: `purged` records freed before it ended, and why it failed, if it did."""
        self.runs += 1
        self.purged += purged
        self.last_purged = purged
        if error is not None:
            self.errors += 1
            self.last_error = str(error)



class _Purges:
    """Every guard's purge of expired records, on one daemon thread for the
    process (`idem-purge`): each guard that purges is due every
    `purge_every_ms`, for a store that keeps expired records (`purge_expired`:
    `MemoryStore`, `PostgresStore`, `AsyncPostgresStore`; Redis drops its keys
    itself). Reads never depend on it; without it a memory store or a
    PostgreSQL table grows with every key ever used. A run asks for batches of
    `PURGE_BATCH` records expired at its start until one comes back short; a
    failed batch ends it, and the next period tries again. Guards are held
    weakly: one dropped without `close()` is forgotten at its next due time.
    After `close()` a run under way is not counted and none follows. The
    thread starts with the first guard and ends when none is left; runs of
    different guards take turns."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        reset_after_fork(self)
        # (due, token, guard, period, (purge, clock, stats)): the earliest due first.
        self._heap: list[tuple[float, int, weakref.ref[Any], float, _PurgeJob]] = []
        self._closed: set[int] = set()
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, guard: Any, every_ms: int, purge: Callable[[int, int], int], clock: Any, stats: PurgeStats) -> int:
        """Purges every `every_ms` while `guard` lives, with `purge(now_ms, limit)` at `clock`'s time,
        counted in `stats`; none of the three may hold `guard`. Returns the token `remove` takes."""
        every = every_ms / 1000
        stats.every_ms = every_ms
        with self._cond:
            token = next(self._tokens)
            heapq.heappush(self._heap, (time.monotonic() + every, token, weakref.ref(guard), every, (purge, clock, stats)))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="idem-purge", daemon=True)
                self._thread.start()
            self._cond.notify()
        return token

    def _after_fork(self) -> None:
        """In a forked child: the thread did not come along; one starts again for the guards it had."""
        self._cond = threading.Condition()
        self._thread = None
        if self._heap:
            self._thread = threading.Thread(target=self._run, name="idem-purge", daemon=True)
            self._thread.start()

    def remove(self, token: int) -> None:
        with self._cond:
            self._closed.add(token)
            self._cond.notify()

    def _next(self) -> tuple[int, _PurgeJob] | None:
        """The next guard's token and `(purge, clock, stats)`, rescheduled, once it is due; None when no guard is left."""
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] in self._closed:
                    self._closed.discard(heapq.heappop(self._heap)[1])
                if not self._heap:
                    self._thread = None
                    return None
                due, token, ref, every, job = self._heap[0]
                wait = due - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                if ref() is not None:  # a dropped guard is not rescheduled
                    heapq.heappush(self._heap, (time.monotonic() + every, token, ref, every, job))
                    return token, job

    def _run(self) -> None:
        while (due := self._next()) is not None:
            token, (purge, clock, stats) = due
            purged, error = 0, None
            if (why := clock_error(clock)) is not None:  # no time to judge expiry by: the next period tries again
                with self._cond:
                    if token not in self._closed:
                        stats.count(0, RuntimeError(f"the store's clock is not known: {why}"))
                continue
            now = clock.now_ms()
            try:
                while True:  # batches expired at the run's start, until one comes back short
                    n = purge(now, PURGE_BATCH)
                    purged += n
                    if n < PURGE_BATCH:
                        break
            except Exception as e:  # noqa: BLE001 - counted, not raised: the next period tries again
                error = e
            with self._cond:
                if token not in self._closed:  # `close()` freezes the stats, even mid-run
                    stats.count(purged, error)


# The process's one purge thread: `Guard` and `AsyncGuard` (idem_guard.aio) add to it.
PURGES = _Purges()


class _Renewer:
    """One thread per guard renews every held claim each third of the lease.

    A handler that returns before its first renewal (the usual case) costs a
    dict entry, not a thread: the thread starts at the first `hold` and exits
    after a third of a lease with nothing held. All claims of one guard share
    one interval, so a new claim is never due before the thread's next wake-up
    and `hold` need not wake it.
    """

    def __init__(self, guard: Guard):
        self._guard = guard
        self.every = max(1, guard.policy.lease_ms // 3) / 1000
        self._cond = threading.Condition()
        self._held: dict[int, _Held] = {}
        self._thread: threading.Thread | None = None

    def _after_fork(self) -> None:
        """In a forked child: no claim of the parent's is held here, and its thread did not come along."""
        self._cond = threading.Condition()
        self._held = {}
        self._thread = None

    def hold(self, claim: Claim) -> _Held:
        held = _Held(claim, self, time.monotonic() + self.every)
        with self._cond:
            self._held[id(held)] = held
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="idem-renew", daemon=True)
                self._thread.start()
        return held

    def drop(self, held: _Held) -> None:
        with self._cond:
            self._held.pop(id(held), None)

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                if not self._held:
                    self._cond.wait(self.every)
                    if not self._held:
                        self._thread = None
                        return
                    continue
                due = [h for h in self._held.values() if h.due <= now]
                if not due:
                    self._cond.wait(min(h.due for h in self._held.values()) - now)
                    continue
            for held in due:
                self._renew(held)

    def _renew(self, held: _Held) -> None:
        with held.lock:
            if held.stopped:
                return
            held.due = time.monotonic() + self.every
            try:
                held.claim = self._guard.renew(held.claim)
            except GuardError as e:
                if e.kind != "unavailable":
                    held.stopped = True  # taken over: the completion will be refused too
                    self.drop(held)
                # unavailable: the lease may still hold, try at the next tick
