"""A store is a component: the guard composed with the reference store
component (examples/store-component, composed by scripts/compose-store.sh
with wac), hosted through wasmtime-py's component API (`wasmtime.component`)
as a third party would host it, without `idem_guard`. The host gives it only
`clock`, `random` and the `response` resource (world
idem:guard/idem-with-store); records and response bytes live in the
instance's memory, so each scenario gets an instance of its own.

Every conformance scenario runs on the tests' composition (which also exports
the store's `testing` hooks, for `fault` and `peek` steps); those without
faults, their peeks left out, on `wac plug`'s output itself; and breaking any
one expectation fails its scenario at that step. No import here returns
`result<option<T>, E>` (which wasmtime-py 51 cannot lower an error into,
idem_guard/component.py): the store's results are exports, lifted.

The compositions come from IDEM_STORE_COMPONENTS (the directory
scripts/compose-store.sh wrote; examples/run-polyglot-tests.sh sets it), or
else from running that script (which needs cargo).

How wasmtime-py (51) gives component values: a record is a
`wasmtime.component.Record` with kebab-case attributes; a variant whose cases
Python can tell apart by type is "untagged" (the bare payload stands for its
case: a `decision` is a Record, a ResourceAny, an int or None), otherwise a
`Variant(tag, payload)`; an option is None or its value; an enum is its
case's name; `list<u8>` is bytes.
"""

from __future__ import annotations

import itertools
import os
import random
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import wasmtime
from wasmtime import component as wc
from wasmtime.component import Record as WitRecord
from wasmtime.component import ResourceAny, ResourceHost, ResourceType, Variant

from scenario_runner import (
    FILES,
    Checkpoint,
    Claim,
    Failure,
    Mismatch,
    Record,
    Response,
    load,
    mutants,
    play,
)

ROOT = Path(__file__).resolve().parents[3]
VERSION = "0.3.0"
GUARD_ERRORS = ("unavailable", "invalid-input", "stale-claim")
# The id wasmtime tells this host's `response` resource type by (any u32 of ours).
RESPONSE = 1
ENGINE = wasmtime.Engine()


@cache
def components() -> Path:
    given = os.environ.get("IDEM_STORE_COMPONENTS")
    if given:
        return Path(given)
    out = subprocess.run(["bash", str(ROOT / "scripts/compose-store.sh")], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip())


@cache
def composition(name: str) -> wc.Component:
    return wc.Component.from_file(ENGINE, str(components() / name))


def _wit(**fields: Any) -> WitRecord:
    r = WitRecord()
    for name, value in fields.items():
        setattr(r, name.replace("_", "-"), value)
    return r


def _get(r: WitRecord, name: str) -> Any:
    return getattr(r, name.replace("_", "-"))


def _checkpoint(r: Any) -> Checkpoint | None:
    return None if r is None else Checkpoint(r.phase, bytes(r.data))


def _to_checkpoint(c: Checkpoint | None) -> WitRecord | None:
    return None if c is None else _wit(phase=c.phase, data=c.data)


def _claim(r: Any) -> Claim:
    return Claim(r.key, r.fingerprint, r.fence, r.holder, _get(r, "lease_until_ms"), _get(r, "expires_at_ms"), _checkpoint(r.checkpoint))


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


def _result(value: Any) -> Any:
    """`result<T, guard-error>` as wasmtime-py lifts it: T itself, or a guard
    error — a `Variant` whose tag is the error's (untagged), or `err` (tagged)."""
    if isinstance(value, Variant):
        if value.tag == "ok":
            return value.payload
        if value.tag == "err":
            error: Any = value.payload  # the guard-error variant
            raise Failure(error.tag, error.payload)
        if value.tag in GUARD_ERRORS:
            raise Failure(value.tag, str(value.payload))
    return value


class Clock:
    def __init__(self, ms: int):
        self.ms = ms

    def set(self, ms: int) -> None:
        self.ms = ms

    def advance(self, ms: int) -> None:
        self.ms += ms


class ComposedHost:
    """One instance of a composition, as tests/scenario_runner.py drives a host."""

    def __init__(self, scenario: dict[str, Any], component: wc.Component):
        self.clock = Clock(scenario["clock_ms"])
        p = scenario["policy"]
        self.policy = _wit(lease_ms=p["lease_ms"], retention_ms=p["retention_ms"], max_response_bytes=p["max_response_bytes"])
        # The host's responses, by the `rep` wasmtime knows a handle by.
        self.responses: dict[int, Response] = {}
        self._reps = itertools.count(1)
        self.store = wasmtime.Store(ENGINE)
        instance = self._link().instantiate(self.store, component)
        self.guard = self._funcs(instance, "idem:guard/guard", "begin", "complete", "release", "renew", "save-checkpoint", "fingerprint")
        self.testing = self._funcs(instance, "idem:store-example/testing", "set-fault", "clear-faults", "peek", version="0.1.0")

    def _funcs(self, instance: wc.Instance, interface: str, *names: str, version: str = VERSION) -> dict[str, Any] | None:
        iface = instance.get_export_index(self.store, f"{interface}@{version}")
        if iface is None:
            return None
        funcs = {}
        for name in names:
            index = instance.get_export_index(self.store, name, iface)
            assert index is not None, f"{interface} exports no {name}"
            funcs[name] = instance.get_func(self.store, index)
        return funcs

    # The response resource: a wasmtime handle stands for a `rep`, a key of `self.responses`.

    def _own(self, response: Response) -> ResourceHost:
        rep = next(self._reps)
        self.responses[rep] = response
        return ResourceHost.own(rep, RESPONSE)

    def _rep(self, ctx: Any, resource: ResourceAny) -> int:
        host = resource.to_host(ctx)
        assert host.type == RESPONSE, f"a resource of type {host.type}"
        return host.rep

    def _borrow(self, ctx: Any, resource: ResourceAny) -> Response:
        return self.responses[self._rep(ctx, resource)]

    def _take(self, resource: ResourceAny) -> Response:
        """A response handed back (own): out of wasmtime's table, then out of ours."""
        return self.responses.pop(self._rep(self.store, resource))

    def _link(self) -> wc.Linker:
        linker = wc.Linker(ENGINE)

        def size(r: Response) -> int:
            return len(r.body) + sum(len(n.encode()) + len(v) for n, v in r.headers)

        def make(_ctx: Any, status: int, headers: list[tuple[str, bytes]], body: bytes) -> ResourceHost:
            return self._own(Response(status, [(n, bytes(v)) for n, v in headers], bytes(body)))

        with linker.root() as root:
            with root.add_instance(f"idem:guard/types@{VERSION}") as types:
                types.add_resource("response", ResourceType.host(RESPONSE), lambda _ctx, rep: self.responses.pop(rep))
                types.add_func("[constructor]response", make)
                types.add_func("[method]response.status", lambda ctx, this: self._borrow(ctx, this).status)
                types.add_func("[method]response.size", lambda ctx, this: size(self._borrow(ctx, this)))
                types.add_func("[method]response.same-as", lambda ctx, this, other: self._borrow(ctx, this) == self._borrow(ctx, other))
                types.add_func("[method]response.headers", lambda ctx, this: self._borrow(ctx, this).headers)
                types.add_func("[method]response.body", lambda ctx, this: self._borrow(ctx, this).body)
            with root.add_instance(f"idem:guard/clock@{VERSION}") as clock:
                clock.add_func("now-ms", lambda _ctx: self.clock.ms)
            with root.add_instance(f"idem:guard/random@{VERSION}") as rng:
                rng.add_func("random-u64", lambda _ctx: random.getrandbits(64))
        return linker

    def _call(self, name: str, *args: Any) -> Any:
        assert self.guard is not None
        return _result(self.guard[name](self.store, *args))

    def begin(self, key: str, fingerprint: str) -> tuple[str, Any]:
        decision = self._call("begin", key, fingerprint, self.policy)
        if isinstance(decision, WitRecord):
            return "proceed", _claim(decision)
        if isinstance(decision, ResourceAny):
            return "replay", self._take(decision)
        if decision is None:
            return "conflict", None
        return "in-flight", decision

    def complete(self, claim: Claim, response: Response) -> None:
        self._call("complete", _to_claim(claim), self._own(response), self.policy)

    def release(self, claim: Claim) -> None:
        self._call("release", _to_claim(claim))

    def renew(self, claim: Claim) -> Claim:
        return _claim(self._call("renew", _to_claim(claim), self.policy))

    def save_checkpoint(self, claim: Claim, checkpoint: Checkpoint) -> Claim:
        return _claim(self._call("save-checkpoint", _to_claim(claim), _to_checkpoint(checkpoint), self.policy))

    def fingerprint(self, method: str, path: str, headers: list[tuple[str, bytes]], body: bytes) -> str:
        assert self.guard is not None
        printed: str = self.guard["fingerprint"](self.store, _wit(method=method, path=path, headers=headers, body=body))
        return printed

    def hooks(self) -> dict[str, Any]:
        if self.testing is None:
            raise AssertionError("this composition does not export the store")
        return self.testing

    def set_fault(self, primitive: str, kind: str, message: str, count: int | None) -> None:
        self.hooks()["set-fault"](self.store, primitive, kind, message, count)

    def clear_faults(self) -> None:
        self.hooks()["clear-faults"](self.store)

    def peek(self, key: str) -> tuple[Record, int] | None:
        entry = self.hooks()["peek"](self.store, key, self.clock.ms)
        if entry is None:
            return None
        r = entry.record
        response = None if entry.response is None else self._take(entry.response)
        record = Record(
            r.fingerprint, r.state, r.holder, _get(r, "lease_until_ms"), _get(r, "expires_at_ms"), _checkpoint(r.checkpoint), response
        )
        return record, entry.version


def without_hooks(scenario: dict[str, Any]) -> dict[str, Any] | None:
    """The scenario as `wac plug`'s composition can take it (no faults; its peeks, which only read, left out), or None."""
    if any(s["op"] in ("fault", "clear_faults") for s in scenario["steps"]):
        return None
    return {**scenario, "steps": [s for s in scenario["steps"] if s["op"] != "peek"]}


TESTING = "guard-with-memory-store.wasm"
PLUGGED = "idem-with-memory-store.wasm"


def test_the_conformance_suite_is_all_there() -> None:
    assert len(FILES) >= 20, FILES


@pytest.mark.parametrize("name", FILES)
def test_conformance_on_the_composed_store_component(name: str) -> None:
    scenario = load(name)
    assert play(scenario, ComposedHost(scenario, composition(TESTING))) > 0


def test_wac_plugs_composition_imports_clock_random_and_types_alone_and_exports_the_guard_alone() -> None:
    host = ComposedHost(load(FILES[0]), composition(PLUGGED))
    assert host.guard is not None
    assert host.testing is None


PLUGGED_FILES = [name for name in FILES if without_hooks(load(name)) is not None]


def test_most_scenarios_run_on_the_plugged_composition() -> None:
    assert len(PLUGGED_FILES) >= 15, PLUGGED_FILES


@pytest.mark.parametrize("name", PLUGGED_FILES)
def test_conformance_on_wac_plugs_composition(name: str) -> None:
    scenario = without_hooks(load(name))
    assert scenario is not None
    assert play(scenario, ComposedHost(scenario, composition(PLUGGED))) > 0


@pytest.mark.parametrize("name", FILES)
def test_a_wrong_expectation_fails_the_scenario_at_that_step(name: str) -> None:
    broken = mutants(load(name))
    for i, mutant in broken:
        with pytest.raises(Mismatch, match=rf"^step {i} "):
            play(mutant, ComposedHost(mutant, composition(TESTING)))
    assert len(broken) > 0
