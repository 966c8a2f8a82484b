"""The guard component through wasmtime-py's dynamic component API
(`wasmtime.component`): the reference binding.

`idem_guard.abi` is the binding the guard uses; this one lifts and lowers through
wasmtime's own implementation of the component model, so the tests run the
conformance scenarios through both and catch a mistake in the hand-written
canonical ABI, and `bench.py` measures what the static binding saves. It is
slow (milliseconds per call): every value crosses ctypes through generic type
objects.

How wasmtime-py (50.0.1) represents component values, which this relies on:
a record is a `wasmtime.component.Record` whose attributes are the WIT field
names (kebab-case, so `getattr(r, "lease-until-ms")`); a variant whose cases'
payloads cannot be told apart by Python type is a `Variant(tag, payload)`,
otherwise it is "untagged" and the bare payload stands for the case (so
`result<claim, guard-error>` is either a Record or a `Variant`); an option is
`None` or its value; `list<u8>` is `bytes`; an enum is its case name.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, Callable, Sequence

import wasmtime
from wasmtime import component as wc
from wasmtime.component import Record as WitRecord
from wasmtime.component import Variant
from wasmtime.component._types import OptionType

from .abi import ENGINE
from .types import Checkpoint, Claim, Entry, Failure, Policy, Record, Response, StoreFault


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

GUARD_ERRORS = ("unavailable", "invalid-input", "stale-claim")
VERSION = "0.2.0"


def _wit(**fields: Any) -> WitRecord:
    r = WitRecord()
    for name, value in fields.items():
        setattr(r, name.replace("_", "-"), value)
    return r


def _get(r: WitRecord, name: str) -> Any:
    return getattr(r, name.replace("_", "-"))


def _response(r: WitRecord) -> Response:
    return Response(r.status, [(n, bytes(v)) for n, v in r.headers], bytes(r.body))


def _checkpoint(r: Any) -> Any:
    return None if r is None else Checkpoint(r.phase, bytes(r.data))


def _to_checkpoint(c: Any) -> Any:
    return None if c is None else _wit(phase=c.phase, data=bytes(c.data))


def _claim(r: WitRecord) -> Claim:
    return Claim(
        r.key, r.fingerprint, r.fence, r.holder, _get(r, "lease_until_ms"), _get(r, "expires_at_ms"), _checkpoint(r.checkpoint)
    )


def _to_response(r: Response) -> WitRecord:
    # wasmtime-py 50.0.1 lowers a u16 without a range check: status 65_736
    # would be stored as 200. Refuse it as the static binding (and jco) do.
    if not 0 <= r.status <= 0xFFFF:
        raise ValueError(f"status {r.status} is not a u16")
    return _wit(status=r.status, headers=[(n, bytes(v)) for n, v in r.headers], body=bytes(r.body))


def _to_claim(c: Claim) -> WitRecord:
    return _wit(
        key=c.key,
        fingerprint=c.fingerprint,
        fence=c.fence,
        holder=c.holder,
        lease_until_ms=c.lease_until_ms,
        expires_at_ms=c.expires_at_ms,
        checkpoint=_to_checkpoint(c.checkpoint),
    )


def _to_policy(p: Policy) -> WitRecord:
    return _wit(lease_ms=p.lease_ms, retention_ms=p.retention_ms, max_response_bytes=p.max_response_bytes)


def _record(r: WitRecord) -> Record:
    response = None if r.response is None else _response(r.response)
    return Record(
        r.fingerprint, r.state, r.holder, _get(r, "lease_until_ms"), _get(r, "expires_at_ms"), response, _checkpoint(r.checkpoint)
    )


def _to_entry(e: Entry) -> WitRecord:
    r = e.record
    response = None if r.response is None else _to_response(r.response)
    record = _wit(
        fingerprint=r.fingerprint,
        state=r.state,
        holder=r.holder,
        lease_until_ms=r.lease_until_ms,
        expires_at_ms=r.expires_at_ms,
        response=response,
        checkpoint=_to_checkpoint(r.checkpoint),
    )
    return _wit(record=record, version=e.version)


def _result(value: Any) -> Any:
    """`result<T, guard-error>`: tagged when T is itself a tagged variant (`begin`), untagged otherwise."""
    if isinstance(value, Variant):
        if value.tag == "ok":
            return value.payload
        if value.tag == "err":
            return Failure(value.payload.tag, value.payload.payload)
        if value.tag in GUARD_ERRORS:
            return Failure(value.tag, value.payload)
    return value


class Guest:
    """The component, compiled once per file."""

    @classmethod
    @cache  # compiled once per file, for the life of the process
    def load(cls, path: Path) -> "Guest":
        return cls(wc.Component.from_file(ENGINE, str(path)))

    def __init__(self, component: wc.Component):
        self.component = component

    def instantiate(self, store: Any, clock: Any, random: Any) -> "Instance":
        return Instance(self, store, clock, random)


class Instance:
    """One instance in a wasmtime Store of its own. After any exception it must be dropped."""

    def __init__(self, guest: Guest, store: Any, clock: Any, random: Any):
        self.store, self.clock, self.random = store, clock, random
        self._wasmtime = wasmtime.Store(ENGINE)
        instance = self._link().instantiate(self._wasmtime, guest.component)
        iface = instance.get_export_index(self._wasmtime, f"idem:guard/guard@{VERSION}")
        self._funcs = {}
        for name in ("begin", "complete", "release", "renew", "save-checkpoint", "fingerprint", "begin-request"):
            func = instance.get_func(self._wasmtime, instance.get_export_index(self._wasmtime, name, iface))
            assert func is not None, f"the component does not export guard.{name}"
            self._funcs[name] = func

    def _link(self) -> wc.Linker:
        linker = wc.Linker(ENGINE)
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

        def insert(key: str, record: WitRecord, now_ms: int) -> Any:
            outcome = store.insert(key, _record(record), now_ms)
            return _to_entry(outcome) if isinstance(outcome, Entry) else outcome

        def replace(key: str, expected_version: int, record: WitRecord, now_ms: int) -> Any:
            return store.replace(key, expected_version, _record(record), now_ms)

        def get(key: str, now_ms: int) -> Any:
            entry = store.get(key, now_ms)
            return None if entry is None else _to_entry(entry)

        with linker.root() as root:
            with root.add_instance(f"idem:guard/clock@{VERSION}") as clock:
                clock.add_func("now-ms", lambda _ctx: self.clock.now_ms())
            with root.add_instance(f"idem:guard/random@{VERSION}") as random:
                random.add_func("random-u64", lambda _ctx: self.random.random_u64())
            with root.add_instance(f"idem:guard/store@{VERSION}") as imports:
                imports.add_func("get", fallible(get))
                imports.add_func("insert", fallible(insert))
                imports.add_func("replace", fallible(replace))
                imports.add_func("delete", fallible(store.delete))
        return linker

    def _call(self, name: str, *args: Any) -> Any:
        return _result(self._funcs[name](self._wasmtime, *args))

    def begin(self, key: str, fingerprint: str, policy: Policy) -> Any:
        return self._decision(self._call("begin", key, fingerprint, _to_policy(policy)))

    def begin_request(
        self, key: str, method: str, path: str, headers: Sequence[tuple[str, bytes]], body: bytes, policy: Policy
    ) -> Any:
        parts = _wit(method=method, path=path, headers=[(n, bytes(v)) for n, v in headers], body=bytes(body))
        return self._decision(self._call("begin-request", key, parts, _to_policy(policy)))

    @staticmethod
    def _decision(decision: Any) -> Any:
        if isinstance(decision, Failure):
            return decision
        if decision.tag == "proceed":
            return "proceed", _claim(decision.payload)
        if decision.tag == "replay":
            return "replay", _response(decision.payload)
        return decision.tag, decision.payload

    def complete(self, claim: Claim, response: Response, policy: Policy) -> Any:
        return self._call("complete", _to_claim(claim), _to_response(response), _to_policy(policy))

    def release(self, claim: Claim) -> Any:
        return self._call("release", _to_claim(claim))

    def renew(self, claim: Claim, policy: Policy) -> Any:
        value = self._call("renew", _to_claim(claim), _to_policy(policy))
        return value if isinstance(value, Failure) else _claim(value)

    def save_checkpoint(self, claim: Claim, checkpoint: Checkpoint, policy: Policy) -> Any:
        value = self._call("save-checkpoint", _to_claim(claim), _to_checkpoint(checkpoint), _to_policy(policy))
        return value if isinstance(value, Failure) else _claim(value)

    def fingerprint(self, method: str, path: str, headers: Sequence[tuple[str, bytes]], body: bytes) -> str:
        parts = _wit(method=method, path=path, headers=[(n, bytes(v)) for n, v in headers], body=bytes(body))
        return self._funcs["fingerprint"](self._wasmtime, parts)
