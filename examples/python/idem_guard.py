"""The idem guard component hosted in Python with the `wasmtime` package.

The component (the very bytes `idem component --out FILE` writes) makes every
decision; this module gives it a clock and a store and wraps its calls in
`Guard.run`, which runs a handler at most once per key and replays its
response to every repeat::

    guard = Guard.load(store=MemoryStore())
    outcome = guard.run("order-1", "sku=A&qty=1", lambda fence: Response(200, [], b"paid"))

How wasmtime-py (50.0.1) represents component values, which this relies on:
a record is a `wasmtime.component.Record` whose attributes are the WIT field
names (kebab-case, so `getattr(r, "lease-until-ms")`); a variant whose cases'
payloads cannot be told apart by Python type is a `Variant(tag, payload)`,
otherwise it is "untagged" and the bare payload stands for the case (so
`result<claim, guard-error>` is either a Record or a `Variant`); an option is
`None` or its value; `list<u8>` is `bytes`; an enum is its case name.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import wasmtime
from wasmtime import component as wc
from wasmtime.component import Record, Variant
from wasmtime.component._types import OptionType


def _untagged_option_classes(self: OptionType, s: set) -> None:
    # wasmtime-py 50.0.1 says an untagged option's `none` case may be any
    # `object`. Inside an untagged `result<option<T>, E>` (the store's
    # `replace`) that makes the `ok` case claim every value, so a host
    # function could never return `err`: lowering `Variant("unavailable", ..)`
    # fails with "value not valid for this variant" and traps the instance.
    # `none` is Python's `None`, so its class is `NoneType`; with that the
    # error lowers as `err`, as the WIT says.
    if self._tagged():
        s.add(Variant)
    else:
        s.add(type(None))
        self.payload.add_classes(s)


OptionType.add_classes = _untagged_option_classes  # type: ignore[method-assign]

DEFAULT_COMPONENT = Path(__file__).resolve().parents[2] / "target" / "idem-guard.wasm"
GUARD_ERRORS = ("unavailable", "invalid-input", "stale-claim")


@dataclass(frozen=True)
class Response:
    """A response, stored and replayed byte for byte: status, headers in order, body."""

    status: int
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    body: bytes = b""


@dataclass(frozen=True)
class Claim:
    """The right to run the operation for a key, proven by its fence."""

    key: str
    fingerprint: str
    fence: int
    lease_until_ms: int
    expires_at_ms: int


@dataclass(frozen=True)
class Outcome:
    """What `Guard.run` did: `executed`, `replayed`, `in-flight`, `conflict` or `unavailable`."""

    kind: str
    response: Optional[Response] = None
    retry_after_ms: Optional[int] = None
    message: Optional[str] = None


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


class StoreFault(Exception):
    """A store failure the guard should see (`unavailable` or `corrupt`): it fails closed."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class SystemClock:
    def now_ms(self) -> int:
        import time

        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to: tests expire leases without sleeping."""

    def __init__(self, now_ms: int):
        self.ms = now_ms

    def now_ms(self) -> int:
        return self.ms

    def set(self, ms: int) -> None:
        self.ms = ms

    def advance(self, ms: int) -> None:
        self.ms += ms


def _record(**fields: Any) -> Record:
    r = Record()
    for name, value in fields.items():
        setattr(r, name.replace("_", "-"), value)
    return r


def _field(r: Record, name: str) -> Any:
    return getattr(r, name.replace("_", "-"))


class MemoryStore:
    """The store primitives of wit/store.wit over a dict, with fault injection.

    `store.fault("replace", kind="error", message="timeout", count=1)`: `error`
    fails before applying, `lost` applies then fails (a lost reply), `trap`
    raises a plain exception (a host bug: the instance traps). Each primitive
    is atomic, so guards on several threads can share one store.
    """

    def __init__(self) -> None:
        self._records: dict[str, tuple[Record, int]] = {}
        self._faults: dict[str, dict] = {}
        self._lock = threading.Lock()

    def fault(self, primitive: str, kind: str, message: str = "injected fault", count: Optional[int] = None) -> None:
        if primitive not in ("get", "insert", "replace", "delete"):
            raise ValueError(f"unknown store primitive {primitive!r}; expected get, insert, replace or delete")
        if kind not in ("error", "lost", "trap"):
            raise ValueError(f"unknown fault kind {kind!r}; expected error, lost or trap")
        self._faults[primitive] = {"kind": kind, "message": message, "count": count}

    def clear_faults(self) -> None:
        self._faults.clear()

    def _apply(self, primitive: str, operation: Callable[[], Any]) -> Any:
        with self._lock:
            return self._apply_locked(primitive, operation)

    def _apply_locked(self, primitive: str, operation: Callable[[], Any]) -> Any:
        rule = self._faults.get(primitive)
        if rule is None:
            return operation()
        if rule["count"] is not None:
            rule["count"] -= 1
            if rule["count"] <= 0:
                del self._faults[primitive]
        if rule["kind"] == "error":
            raise StoreFault("unavailable", f"{rule['message']} (injected on {primitive})")
        if rule["kind"] == "lost":
            operation()
            raise StoreFault("unavailable", f"reply to {primitive} lost (injected; the operation was applied)")
        raise RuntimeError(f"host bug injected on {primitive}")

    def _live(self, key: str, now_ms: int) -> Optional[tuple[Record, int]]:
        entry = self._records.get(key)
        if entry is not None and now_ms < _field(entry[0], "expires_at_ms"):
            return entry
        return None

    def get(self, key: str, now_ms: int) -> Optional[Record]:
        def op() -> Optional[Record]:
            live = self._live(key, now_ms)
            return None if live is None else _record(record=live[0], version=live[1])

        return self._apply("get", op)

    def insert(self, key: str, record: Record, now_ms: int) -> Any:
        """`inserted(version)` is a bare int, `existing(entry)` a bare Record: the variant is untagged."""

        def op() -> Any:
            live = self._live(key, now_ms)
            if live is not None:
                return _record(record=live[0], version=live[1])
            # An expired record's version carries on, so an old fence never matches again.
            old = self._records.get(key)
            version = (old[1] if old else 0) + 1
            self._records[key] = (record, version)
            return version

        return self._apply("insert", op)

    def replace(self, key: str, expected_version: int, record: Record, now_ms: int) -> Optional[int]:
        def op() -> Optional[int]:
            live = self._live(key, now_ms)
            if live is None or live[1] != expected_version:
                return None
            self._records[key] = (record, expected_version + 1)
            return expected_version + 1

        return self._apply("replace", op)

    def delete(self, key: str, expected_version: Optional[int]) -> bool:
        def op() -> bool:
            entry = self._records.get(key)
            if entry is None or (expected_version is not None and entry[1] != expected_version):
                return False
            del self._records[key]
            return True

        return self._apply("delete", op)

    def peek(self, key: str, now_ms: int) -> Optional[tuple[Record, int]]:
        """The live record and its version, bypassing faults: for tests and operators."""
        return self._live(key, now_ms)


_ENGINE = wasmtime.Engine()
_COMPONENTS: dict[str, wc.Component] = {}


def _component(path: Path) -> wc.Component:
    """Compiles each component file once per process."""
    key = str(path)
    if key not in _COMPONENTS:
        _COMPONENTS[key] = wc.Component.from_file(_ENGINE, key)
    return _COMPONENTS[key]


def response_from(r: Record) -> Response:
    return Response(r.status, [(n, bytes(v)) for n, v in r.headers], bytes(r.body))


def claim_from(r: Record) -> Claim:
    return Claim(r.key, r.fingerprint, r.fence, _field(r, "lease_until_ms"), _field(r, "expires_at_ms"))


def _to_response(r: Response) -> Record:
    headers = [(n, v.encode() if isinstance(v, str) else bytes(v)) for n, v in r.headers]
    body = r.body.encode() if isinstance(r.body, str) else bytes(r.body)
    return _record(status=r.status, headers=headers, body=body)


def _to_claim(c: Claim) -> Record:
    return _record(
        key=c.key, fingerprint=c.fingerprint, fence=c.fence, lease_until_ms=c.lease_until_ms, expires_at_ms=c.expires_at_ms
    )


class Guard:
    """An idempotency guard: the component, one instance, over one store and clock.

    Its calls take turns on one lock, so it may be shared between threads.
    """

    @classmethod
    def load(cls, **options: Any) -> "Guard":
        return cls(**options)

    def __init__(
        self,
        store: Any = None,
        clock: Any = None,
        lease_ms: int = 30_000,
        retention_ms: int = 24 * 60 * 60 * 1000,
        max_response_bytes: int = 1 << 20,
        renew_lease: bool = True,
        component: Optional[os.PathLike | str] = None,
    ):
        self.store = store if store is not None else MemoryStore()
        self.clock = clock if clock is not None else SystemClock()
        self.policy = _record(lease_ms=lease_ms, retention_ms=retention_ms, max_response_bytes=max_response_bytes)
        self.renew_lease = renew_lease
        self.replaced = 0
        self._lock = threading.Lock()
        path = Path(component or os.environ.get("IDEM_COMPONENT") or DEFAULT_COMPONENT)
        self._component = _component(path)
        self._linker = self._link()
        self._instance: Optional[tuple[wasmtime.Store, dict[str, wc.Func]]] = None
        self._instantiate()  # fail at load, not at the first request

    def _link(self) -> wc.Linker:
        linker = wc.Linker(_ENGINE)
        store = self.store

        def fallible(primitive: Callable[..., Any]) -> Callable[..., Any]:
            # A store failure goes back to the guest as `err(store-error)`;
            # any other exception is a host bug and traps the instance.
            def call(_ctx: Any, *args: Any) -> Any:
                try:
                    return primitive(*args)
                except StoreFault as fault:
                    return Variant(fault.kind, str(fault))

            return call

        with linker.root() as root:
            with root.add_instance("idem:guard/clock@0.1.0") as clock:
                clock.add_func("now-ms", lambda _ctx: self.clock.now_ms())
            with root.add_instance("idem:guard/store@0.1.0") as imports:
                imports.add_func("get", fallible(store.get))
                imports.add_func("insert", fallible(store.insert))
                imports.add_func("replace", fallible(store.replace))
                imports.add_func("delete", fallible(store.delete))
        return linker

    def _instantiate(self) -> tuple[wasmtime.Store, dict[str, wc.Func]]:
        if self._instance is None:
            # Each instance has a Store of its own; a trapped one is dropped whole.
            wstore = wasmtime.Store(_ENGINE)
            instance = self._linker.instantiate(wstore, self._component)
            iface = instance.get_export_index(wstore, "idem:guard/guard@0.1.0")
            funcs = {}
            for name in ("begin", "complete", "release", "renew", "fingerprint"):
                func = instance.get_func(wstore, instance.get_export_index(wstore, name, iface))
                assert func is not None, f"the component does not export guard.{name}"
                funcs[name] = func
            self._instance = (wstore, funcs)
        return self._instance

    def _call(self, name: str, *args: Any) -> Any:
        with self._lock:
            wstore, funcs = self._instantiate()
            try:
                value = funcs[name](wstore, *args)
            except Exception as trap:  # a trap, or an exception a host function raised
                self._instance = None
                self.replaced += 1
                raise GuardError("unavailable", f"guard component failed, instance replaced: {trap}") from trap
        # `result<T, guard-error>`: tagged when T is itself a tagged variant (`begin`), untagged otherwise.
        if isinstance(value, Variant):
            if value.tag == "ok":
                return value.payload
            if value.tag == "err":
                raise GuardError(value.payload.tag, value.payload.payload)
            if value.tag in GUARD_ERRORS:
                raise GuardError(value.tag, value.payload)
        return value

    def begin(self, key: str, fingerprint: str) -> tuple[str, Any]:
        """`("proceed", Claim)`, `("replay", Response)`, `("in-flight", ms)` or `("conflict", None)`."""
        decision = self._call("begin", key, fingerprint, self.policy)
        if decision.tag == "proceed":
            return "proceed", claim_from(decision.payload)
        if decision.tag == "replay":
            return "replay", response_from(decision.payload)
        return decision.tag, decision.payload

    def complete(self, claim: Claim, response: Response) -> None:
        self._call("complete", _to_claim(claim), _to_response(response), self.policy)

    def release(self, claim: Claim) -> None:
        self._call("release", _to_claim(claim))

    def renew(self, claim: Claim) -> Claim:
        """Extends the claim's lease; returns it with its new fence."""
        return claim_from(self._call("renew", _to_claim(claim), self.policy))

    def fingerprint(self, method: str, path: str, headers: list[tuple[str, bytes]] = (), body: bytes = b"") -> str:
        parts = _record(method=method, path=path, headers=[(n, bytes(v)) for n, v in headers], body=bytes(body))
        return self._call("fingerprint", parts)

    def run(self, key: str, fingerprint: str, handler: Callable[[int], Response]) -> Outcome:
        """Runs `handler(fence)` at most once per key and fingerprint within the
        retention window and replays its response to every repeat.

        While the handler runs, a thread renews its claim's lease every third
        of the lease, so a handler slower than the lease is not taken over and
        run a second time (`renew_lease=False` turns this off). A renewal the
        store cannot answer is tried again at the next tick; one refused as
        stale (the claim was taken over) stops the renewing, and the
        completion is then refused the same way.

        Raises `GuardError("invalid-input")` for a bad key or fingerprint,
        `NotRecorded` if the response could not be stored, or the handler's own
        exception (after releasing the claim).
        """
        try:
            kind, value = self.begin(key, fingerprint)
        except GuardError as e:
            if e.kind == "invalid-input":
                raise
            return Outcome("unavailable", message=e.detail)
        if kind == "replay":
            return Outcome("replayed", response=value)
        if kind == "in-flight":
            return Outcome("in-flight", retry_after_ms=value)
        if kind == "conflict":
            return Outcome("conflict")
        held = _Held(self, value)
        try:
            response = response_from(_to_response(handler(value.fence)))
        except BaseException:
            claim = held.stop()
            try:
                self.release(claim)
            except GuardError:
                pass  # the lease runs out as after a crash
            raise
        claim = held.stop()
        try:
            self.complete(claim, response)
        except GuardError as e:
            raise NotRecorded(response, e) from e
        return Outcome("executed", response=response)


class _Held:
    """A claim whose lease a thread renews until `stop()`, which returns the latest claim."""

    def __init__(self, guard: Guard, claim: Claim):
        self.claim = claim
        self._guard = guard
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if guard.renew_lease:
            self._thread = threading.Thread(target=self._renew, name="idem-renew", daemon=True)
            self._thread.start()

    def _renew(self) -> None:
        every = max(1, _field(self._guard.policy, "lease_ms") // 3) / 1000
        while not self._stop.wait(every):
            try:
                self.claim = self._guard.renew(self.claim)
            except GuardError as e:
                if e.kind != "unavailable":
                    return  # taken over: the completion will be refused too
                # the lease may still hold: try at the next tick

    def stop(self) -> Claim:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.claim
