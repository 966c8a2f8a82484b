"""Every conformance scenario (conformance/*.json, format in conformance/README.md)
against the component hosted in Python, with the Python MemoryStore and a
ManualClock; also over an asynchronous MemoryStore through `AsyncGuard`'s
journal replay. The Rust and JavaScript hosts run the same files;
tests/test_netstores.py runs them on Redis and PostgreSQL with `Host` below."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
from typing import Any

import pytest

from idem_guard import (
    AsyncAttempt,
    AsyncGuard,
    Attempt,
    Checkpoint,
    Claim,
    Guard,
    GuardError,
    ManualClock,
    MemoryStore,
    NotRecorded,
    Response,
)
from scenario_runner import FILES, check, checkpoint_json, claim_json, data, load, mutate, response_json, text
from stores import AsyncFaulty, AsyncMemory


def response(v: dict) -> Response:
    return Response(v["status"], [(text(n), data(val)) for n, val in v.get("headers", [])], data(v.get("body")))


def error_json(e: GuardError) -> dict:
    return {"error": e.kind, "message": e.detail}


class Host:
    """Runs a scenario's steps on a `Guard` over `store` (a `MemoryStore` by
    default; any store with MemoryStore's `fault`, `clear_faults` and `peek`,
    such as tests/stores.py's `Faulty`), or, with `asynchronous`, on an
    `AsyncGuard` over an asynchronous store (`AsyncFaulty`), each step run to
    its end on a loop of its own (or on `loop`, where the store was opened)."""

    def __init__(
        self,
        scenario: dict,
        binding: str = "static",
        store: Any = None,
        asynchronous: bool = False,
        loop: asyncio.AbstractEventLoop | None = None,
    ):
        self.clock = ManualClock(scenario["clock_ms"])
        self.store = store if store is not None else MemoryStore()
        p = scenario["policy"]
        options = dict(
            store=self.store,
            clock=self.clock,
            lease_ms=p["lease_ms"],
            retention_ms=p["retention_ms"],
            max_response_bytes=p["max_response_bytes"],
            binding=binding,
        )
        self.loop: asyncio.AbstractEventLoop | None = loop
        self._own_loop = loop is None and asynchronous
        if self._own_loop:
            self.loop = asyncio.new_event_loop()
        if self.loop is not None:
            self.guard: Any = _Awaited(AsyncGuard(**options), self.loop)
        else:
            self.guard = Guard.load(**options)
        self.claims: dict[str, Claim] = {}
        self.effects: dict[str, int] = {}

    def close(self) -> None:
        if self._own_loop:
            self.loop.close()

    def peek(self, key: str) -> Any:
        entry = self.store.peek(key, self.clock.now_ms())
        return self.loop.run_until_complete(entry) if self.loop is not None else entry

    def claim(self, step: dict) -> Claim:
        """The step's named claim, with the fields its `with` replaces (`holder`, `fence`: each a
        u64 as a decimal string), as a careless or hostile caller passes it back."""
        claim = self.claims[step["claim"]]
        fields = {}
        for name, value in step.get("with", {}).items():
            if name not in ("holder", "fence"):
                raise ValueError(f"with.{name}: not a field a step replaces")
            if not (isinstance(value, str) and value.isdigit() and int(value) < 1 << 64):
                raise ValueError(f"with.{name}: {value!r} is not a u64 as a decimal string")
            fields[name] = int(value)
        return dataclasses.replace(claim, **fields)

    def step(self, step: dict) -> dict | None:
        g, op = self.guard, step["op"]
        try:
            if op == "clock":
                if "set_ms" in step:
                    self.clock.set(step["set_ms"])
                else:
                    self.clock.advance(step["advance_ms"])
                return None
            if op == "fault":
                assert step["kind"] in ("error", "lost"), step["kind"]
                self.store.fault(step["primitive"], step["kind"], step.get("message", "injected fault"), step.get("count"))
                return None
            if op == "clear_faults":
                self.store.clear_faults()
                return None
            if op == "begin":
                kind, value = g.begin(text(step["key"]), text(step["fingerprint"]))
                if kind == "proceed":
                    if "as" in step:
                        self.claims[step["as"]] = value
                    return {"decision": "proceed", **claim_json(value)}
                if kind == "replay":
                    return {"decision": "replay", **response_json(value)}
                if kind == "in-flight":
                    return {"decision": "in-flight", "retry_after_ms": value}
                return {"decision": kind}
            if op == "complete":
                g.complete(self.claim(step), response(step["response"]))
                return {"ok": True}
            if op == "release":
                g.release(self.claim(step))
                return {"ok": True}
            if op == "renew":
                renewed = g.renew(self.claim(step))
                if "as" in step:
                    self.claims[step["as"]] = renewed
                return {"ok": True, **claim_json(renewed)}
            if op == "checkpoint":
                checkpoint = Checkpoint(text(step["phase"]), data(step.get("data")))
                saved = g.save_checkpoint(self.claim(step), checkpoint)
                if "as" in step:
                    self.claims[step["as"]] = saved
                return {"ok": True, **claim_json(saved)}
            if op == "run":
                return self.run(step)
            if op == "effects":
                return {name: self.effects.get(name, 0) for name in step["expect"]}
            if op == "peek":
                entry = self.peek(text(step["key"]))
                if entry is None:
                    return {"absent": True}
                r, version = entry
                out = {
                    "absent": False,
                    "state": r.state,
                    "version": version,
                    "fingerprint": r.fingerprint,
                    "holder": r.holder,
                    "lease_until_ms": r.lease_until_ms,
                    "expires_at_ms": r.expires_at_ms,
                    "checkpoint": checkpoint_json(r.checkpoint),
                }
                if r.response is not None:
                    out.update(response_json(r.response))
                return out
            if op == "fingerprint":
                q = step["request"]
                headers = [(text(n), data(v)) for n, v in q.get("headers", [])]
                return {"fingerprint": g.fingerprint(text(q["method"]), text(q["path"]), headers, data(q.get("body")))}
        except GuardError as e:
            return error_json(e)
        raise ValueError(f"unknown op {op!r}")

    def run(self, step: dict) -> dict:
        """`guard.run` with a handler that counts its side effect and saves the step's checkpoints."""
        name = step.get("effect", "effect")
        resumed = []

        def handler(_fence: int, attempt: Attempt) -> Response:
            resumed.append(checkpoint_json(attempt.checkpoint))
            self.effects[name] = self.effects.get(name, 0) + 1
            for c in step.get("checkpoints", []):
                attempt.save_checkpoint(text(c["phase"]), data(c.get("data")))
            if step.get("fails"):
                raise RuntimeError("handler failed")
            return response(step["response"])

        async def async_handler(_fence: int, attempt: AsyncAttempt) -> Response:
            resumed.append(checkpoint_json(attempt.checkpoint))
            self.effects[name] = self.effects.get(name, 0) + 1
            for c in step.get("checkpoints", []):
                await attempt.save_checkpoint(text(c["phase"]), data(c.get("data")))
            if step.get("fails"):
                raise RuntimeError("handler failed")
            return response(step["response"])

        if self.loop is not None:
            handler = async_handler  # type: ignore[assignment]

        try:
            out = self.guard.run(text(step["key"]), text(step["fingerprint"]), handler)
        except NotRecorded as e:
            return {"outcome": "not-recorded", **error_json(e.error)}
        except GuardError as e:
            return error_json(e)
        except RuntimeError as e:
            if str(e) != "handler failed":
                raise
            return {"outcome": "handler-failed"}
        if out.kind == "executed":
            return {"outcome": out.kind, **response_json(out.response), "resumed": resumed[0]}
        if out.kind == "replayed":
            return {"outcome": out.kind, **response_json(out.response)}
        if out.kind == "in-flight":
            return {"outcome": "in-flight", "retry_after_ms": out.retry_after_ms}
        if out.kind == "unavailable":
            return {"outcome": "unavailable", "message": out.message}
        return {"outcome": out.kind}


class _Awaited:
    """An `AsyncGuard` with `Guard`'s synchronous methods: each call runs on `loop` to its end."""

    def __init__(self, guard: AsyncGuard, loop: asyncio.AbstractEventLoop):
        self.guard, self.loop = guard, loop

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.guard, name)
        return lambda *args: self.loop.run_until_complete(method(*args))


class Mismatch(AssertionError):
    pass


def run_scenario(scenario: dict, binding: str = "static", **host: Any) -> int:
    """Runs a scenario; returns the number of checked steps, or raises `Mismatch("step N (op): ...")`.
    `host` goes to `Host` (`store=`, `asynchronous=`, `loop=`)."""
    host = Host(scenario, binding, **host)
    checked = 0
    try:
        for i, step in enumerate(scenario["steps"]):
            for _ in range(step.get("times", 1)):
                actual = host.step(step)
                if actual is None:
                    continue
                if "expect" not in step:
                    raise Mismatch(f"step {i} ({step['op']}): no expect")
                why = check(step["expect"], actual, host.claims)
                if why:
                    raise Mismatch(f"step {i} ({step['op']}): {why}; got {json.dumps(actual)}")
                checked += 1
    finally:
        host.close()
    return checked


def test_the_conformance_suite_is_all_there() -> None:
    assert len(FILES) >= 15, FILES


# Both bindings: the static canonical ABI (the guard's) and wasmtime-py's
# component API (the reference it is checked against).
@pytest.mark.parametrize("binding", ["static", "dynamic"])
@pytest.mark.parametrize("name", FILES)
def test_conformance(name: str, binding: str) -> None:
    assert run_scenario(load(name), binding) > 0


@pytest.mark.parametrize("name", FILES)
def test_a_wrong_expectation_fails_the_scenario_at_that_step(name: str) -> None:
    scenario = load(name)
    broken = 0
    for i, step in enumerate(scenario["steps"]):
        wrong = mutate(step.get("expect"))
        if wrong is None:
            continue
        mutant = copy.deepcopy(scenario)
        mutant["steps"][i]["expect"] = wrong
        with pytest.raises(Mismatch, match=rf"^step {i} "):
            run_scenario(mutant)
        broken += 1
    assert broken > 0


# AsyncGuard over an asynchronous store: every call replayed from a journal of
# the store's answers (idem_guard.journal), faults injected beside the store.
@pytest.mark.parametrize("name", FILES)
def test_conformance_over_an_asynchronous_store_by_journal_replay(name: str) -> None:
    assert run_scenario(load(name), store=AsyncFaulty(AsyncMemory()), asynchronous=True) > 0
