"""The guard component through wasmtime-py's dynamic component API
(`wasmtime.component`): the reference binding.

`idem_guard.abi` is the binding the guard uses; this one lifts and lowers through
wasmtime's own implementation of the component model, so the tests run the
conformance scenarios through both and catch a mistake in the hand-written
canonical ABI, and `bench.py` measures what the static binding saves. It is
slow (milliseconds per call): every value crosses ctypes through generic type
objects.

How wasmtime-py (51.0.0) represents component values, which this relies on:
a record is a `wasmtime.component.Record` whose attributes are the WIT field
names (kebab-case, so `getattr(r, "lease-until-ms")`); a variant whose cases'
payloads cannot be told apart by Python type is a `Variant(tag, payload)`,
otherwise it is "untagged" and the bare payload stands for the case (so
`result<claim, guard-error>` is either a Record or a `Variant`); an option is
`None` or its value; `list<u8>` is `bytes`; an enum is its case name.

The `response` resource (wit/types.wit) is host-defined, as wasmtime-py 51
supports it (`wasmtime/component/_linker.py`: `LinkerInstance.add_resource`
with a `ResourceType.host(id)` and a destructor; `_resources.py`:
`ResourceHost.own(rep, id)` to hand one to the guest, `ResourceAny.to_host`
and `.rep` to read one it passes back): wasmtime keeps the guest's handles,
each standing for a `rep`, and the `rep` is a handle of the same `Handles`
table the static binding uses (`idem_guard.abi`), holding the `Response`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import wasmtime
from wasmtime import component as wc
from wasmtime.component import Record as WitRecord
from wasmtime.component import ResourceAny, ResourceHost, ResourceType, Variant
from wasmtime.component._types import OptionType

from .abi import ENGINE, Handles, _written, clears_handles
from .types import (
    Checkpoint,
    Claim,
    Entry,
    Failure,
    Policy,
    Record,
    Response,
    StoreFault,
    response_size,
    same_response,
    status_u16,
)


def _untagged_option_classes(self: OptionType, s: set[Any]) -> None:
    # wasmtime-py (50.0.1, and still 51.0.0) says an untagged option's `none`
    # case may be any `object`. Inside an untagged `result<option<T>, E>` (the store's
    # `get`; 0.2's `replace` too) that makes the `ok` case claim every value, so a host
    # function could never return `err`: lowering `Variant("unavailable", ..)`
    # fails with "value not valid for this variant" and traps the instance.
    # `none` is Python's `None`, so its class is `NoneType`; with that the
    # error lowers as `err`, as the WIT says.
    if self._tagged():
        s.add(Variant)
    else:
        s.add(type(None))
        self.payload.add_classes(s)


OptionType.add_classes = _untagged_option_classes  # type: ignore[method-assign,assignment]

GUARD_ERRORS = ("unavailable", "invalid-input", "stale-claim")
VERSION = "0.3.0"
# The id wasmtime tells this host's `response` resource type by (any u32 of ours).
RESPONSE_TYPE = 1


def _wit(**fields: Any) -> WitRecord:
    r = WitRecord()
    for name, value in fields.items():
        setattr(r, name.replace("_", "-"), value)
    return r


def _get(r: WitRecord, name: str) -> Any:
    return getattr(r, name.replace("_", "-"))


def _checkpoint(r: Any) -> Any:
    return None if r is None else Checkpoint(r.phase, bytes(r.data))


def _to_checkpoint(c: Any) -> Any:
    return None if c is None else _wit(phase=c.phase, data=bytes(c.data))


def _claim(r: Any) -> Claim:  # a wasmtime.component.Record: its fields are attributes set at run time
    return Claim(
        r.key, r.fingerprint, r.fence, r.holder, _get(r, "lease_until_ms"), _get(r, "expires_at_ms"), _checkpoint(r.checkpoint)
    )


def _held(x: Claim | Record) -> dict[str, Any]:
    """The fields a claim and a record share: whose the key is, until when, and how far it got."""
    return {
        "fingerprint": x.fingerprint,
        "holder": x.holder,
        "lease_until_ms": x.lease_until_ms,
        "expires_at_ms": x.expires_at_ms,
        "checkpoint": _to_checkpoint(x.checkpoint),
    }


def _to_claim(c: Claim) -> WitRecord:
    return _wit(key=c.key, fence=c.fence, **_held(c))


def _to_policy(p: Policy) -> WitRecord:
    return _wit(lease_ms=p.lease_ms, retention_ms=p.retention_ms, max_response_bytes=p.max_response_bytes)


def _record(r: Any, response: Any) -> Record:
    """A WIT record and the response that goes with it, as the store keeps them."""
    return Record(
        r.fingerprint, r.state, r.holder, _get(r, "lease_until_ms"), _get(r, "expires_at_ms"), response, _checkpoint(r.checkpoint)
    )


def _result(value: Any) -> Any:
    """`result<T, guard-error>`: tagged when T is itself a tagged variant (`begin`), untagged otherwise."""
    if isinstance(value, Variant):
        if value.tag == "ok":
            return value.payload
        error: Any = value.payload  # an err's payload is the guard-error variant; a guard-error's, its detail
        if value.tag == "err":
            return Failure(error.tag, error.payload)
        if value.tag in GUARD_ERRORS:
            return Failure(value.tag, str(error))
    return value


class Guest:
    """The component, compiled once per file."""

    @classmethod
    @cache  # compiled once per file, for the life of the process
    def load(cls, path: Path) -> Guest:
        return cls(wc.Component.from_file(ENGINE, str(path)))

    def __init__(self, component: wc.Component):
        self.component = component

    def instantiate(self, store: Any, clock: Any, random: Any) -> Instance:
        return Instance(self, store, clock, random)


class Instance:
    """One instance in a wasmtime Store of its own. After any exception it must be dropped."""

    def __init__(self, guest: Guest, store: Any, clock: Any, random: Any):
        self.store, self.clock, self.random = store, clock, random
        self.handles = Handles()
        self._wasmtime = wasmtime.Store(ENGINE)
        instance = self._link().instantiate(self._wasmtime, guest.component)
        iface = instance.get_export_index(self._wasmtime, f"idem:guard/guard@{VERSION}")
        self._funcs = {}
        for name in ("begin", "complete", "release", "renew", "save-checkpoint", "fingerprint", "begin-request"):
            index = instance.get_export_index(self._wasmtime, name, iface)
            assert index is not None, f"the component does not export guard.{name}"
            func = instance.get_func(self._wasmtime, index)
            assert func is not None, f"the component does not export guard.{name}"
            self._funcs[name] = func

    # The response resource: a wasmtime handle stands for a `rep`, a handle of `self.handles`.

    def _own(self, response: Response) -> ResourceHost:
        """An own handle to `response`, for the guest."""
        return ResourceHost.own(self.handles.own(response), RESPONSE_TYPE)

    def _rep(self, ctx: Any, resource: ResourceAny) -> int:
        host = resource.to_host(ctx)
        if host.type != RESPONSE_TYPE:  # wasmtime type-checks handles: never expected
            raise TypeError(f"a resource of type {host.type}, not a response")
        return host.rep

    def _borrow(self, ctx: Any, resource: ResourceAny) -> Response:
        return self.handles.borrow(self._rep(ctx, resource))

    def _link(self) -> wc.Linker:
        linker = wc.Linker(ENGINE)
        store = self.store

        def fallible(primitive: Callable[..., Any]) -> Callable[..., Any]:
            # A store failure goes back to the guest as `err(store-error)`;
            # any other exception is a host bug and traps the instance.
            def call(ctx: Any, *args: Any) -> Any:
                try:
                    return primitive(ctx, *args)
                except StoreFault as fault:
                    return Variant(fault.kind, str(fault))

            return call

        def entry(e: Entry) -> WitRecord:
            r = e.record
            record = _wit(state=r.state, **_held(r))
            response = None if r.response is None else self._own(r.response)
            return _wit(record=record, response=response, version=e.version)

        def insert(_ctx: Any, key: str, record: WitRecord, now_ms: int) -> Any:
            # The guard inserts only `processing` records: no response goes with them.
            outcome = store.insert(key, _record(record, None), now_ms)
            return entry(outcome) if isinstance(outcome, Entry) else outcome

        def get(_ctx: Any, key: str, now_ms: int) -> Any:
            found = store.get(key, now_ms)
            return None if found is None else entry(found)

        def replace(ctx: Any, key: str, expected_version: int, record: WitRecord, response: Any, now_ms: int) -> Any:
            lent = None if response is None else self._borrow(ctx, response)
            return _written(store.replace(key, expected_version, _record(record, lent), now_ms))

        with linker.root() as root:
            with root.add_instance(f"idem:guard/types@{VERSION}") as types:
                # Called when the guest drops an own handle; one it hands back in `replay` is taken in `_decision`.
                types.add_resource("response", ResourceType.host(RESPONSE_TYPE), lambda _ctx, rep: self.handles.take(rep))
                types.add_func("[method]response.status", lambda ctx, this: status_u16(self._borrow(ctx, this)))
                types.add_func("[method]response.size", lambda ctx, this: response_size(self._borrow(ctx, this)))
                types.add_func(
                    "[method]response.same-as",
                    lambda ctx, this, other: same_response(self._borrow(ctx, this), self._borrow(ctx, other)),
                )
            with root.add_instance(f"idem:guard/clock@{VERSION}") as clock:
                clock.add_func("now-ms", lambda _ctx: self.clock.now_ms())
            with root.add_instance(f"idem:guard/random@{VERSION}") as random:
                random.add_func("random-u64", lambda _ctx: self.random.random_u64())
            with root.add_instance(f"idem:guard/store@{VERSION}") as imports:
                imports.add_func("get", fallible(get))
                imports.add_func("insert", fallible(insert))
                imports.add_func("replace", fallible(replace))
                # Not imported by the 0.3.0 guard (hosts call it for operators), defined all the same.
                imports.add_func("delete", fallible(lambda _ctx, key, expected, now_ms: store.delete(key, expected, now_ms)))
        return linker

    def _call(self, name: str, *args: Any) -> Any:
        return _result(self._funcs[name](self._wasmtime, *args))

    @clears_handles
    def begin(self, key: str, fingerprint: str, policy: Policy) -> Any:
        return self._decision(self._call("begin", key, fingerprint, _to_policy(policy)))

    @clears_handles
    def begin_request(
        self, key: str, method: str, path: str, headers: Sequence[tuple[str, bytes]], body: bytes, policy: Policy
    ) -> Any:
        parts = _wit(method=method, path=path, headers=[(n, bytes(v)) for n, v in headers], body=bytes(body))
        return self._decision(self._call("begin-request", key, parts, _to_policy(policy)))

    def _decision(self, decision: Any) -> Any:
        # No two of `decision`'s cases have payloads of one Python class, so
        # wasmtime-py lifts it untagged: the bare payload stands for its case.
        if isinstance(decision, Failure):
            return decision
        if isinstance(decision, WitRecord):
            return "proceed", _claim(decision)
        if isinstance(decision, ResourceAny):
            # The own handle comes back to the host: out of wasmtime's table, then out of ours.
            return "replay", self.handles.take(self._rep(self._wasmtime, decision))
        if decision is None:
            return "conflict", None
        return "in-flight", decision

    @clears_handles
    def complete(self, claim: Claim, response: Response, policy: Policy) -> Any:
        return self._call("complete", _to_claim(claim), self._own(response), _to_policy(policy))

    @clears_handles
    def release(self, claim: Claim) -> Any:
        return self._call("release", _to_claim(claim))

    @clears_handles
    def renew(self, claim: Claim, policy: Policy) -> Any:
        value = self._call("renew", _to_claim(claim), _to_policy(policy))
        return value if isinstance(value, Failure) else _claim(value)

    @clears_handles
    def save_checkpoint(self, claim: Claim, checkpoint: Checkpoint, policy: Policy) -> Any:
        value = self._call("save-checkpoint", _to_claim(claim), _to_checkpoint(checkpoint), _to_policy(policy))
        return value if isinstance(value, Failure) else _claim(value)

    @clears_handles
    def fingerprint(self, method: str, path: str, headers: Sequence[tuple[str, bytes]], body: bytes) -> str:
        parts = _wit(method=method, path=path, headers=[(n, bytes(v)) for n, v in headers], body=bytes(body))
        printed: str = self._funcs["fingerprint"](self._wasmtime, parts)
        return printed
