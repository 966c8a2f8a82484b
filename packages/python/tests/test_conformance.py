"""Every conformance scenario (conformance/*.json, format in conformance/README.md)
against the component hosted in Python, with the Python MemoryStore and a
ManualClock; also over an asynchronous MemoryStore through `AsyncGuard`'s
journal replay. The Rust and JavaScript hosts run the same files;
tests/test_netstores.py runs them on Redis and PostgreSQL with `Host` below."""

from __future__ import annotations

import asyncio
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
from scenario_runner import FILES, Failure, Mismatch, checkpoint_json, data, error_json, load, mutants, play, response_json, text
from stores import AsyncFaulty, AsyncMemory


class Host:
    """A `Guard` over `store` (a `MemoryStore` by default; any store with
    MemoryStore's `fault`, `clear_faults` and `peek`, such as tests/stores.py's
    `Faulty`), or, with `asynchronous`, an `AsyncGuard` over an asynchronous
    store (`AsyncFaulty`), each call run to its end on a loop of its own (or on
    `loop`, where the store was opened): a host as tests/scenario_runner.py
    drives one, its `GuardError`s raised as the runner's `Failure`s, and its
    `run` steps `guard.run` itself."""

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

    def close(self) -> None:
        if self._own_loop:
            self.loop.close()

    def _call(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self.guard, name)(*args)
        except GuardError as e:
            raise Failure(e.kind, e.detail) from e

    def begin(self, key: str, fingerprint: str) -> tuple[str, Any]:
        return self._call("begin", key, fingerprint)

    def complete(self, claim: Claim, response: Any) -> None:
        self._call("complete", claim, Response(response.status, response.headers, response.body))

    def release(self, claim: Claim) -> None:
        self._call("release", claim)

    def renew(self, claim: Claim) -> Claim:
        return self._call("renew", claim)

    def save_checkpoint(self, claim: Claim, checkpoint: Any) -> Claim:
        return self._call("save_checkpoint", claim, Checkpoint(checkpoint.phase, checkpoint.data))

    def fingerprint(self, method: str, path: str, headers: list[tuple[str, bytes]], body: bytes) -> str:
        return self._call("fingerprint", method, path, headers, body)

    def set_fault(self, primitive: str, kind: str, message: str, count: int | None) -> None:
        self.store.fault(primitive, kind, message, count)

    def clear_faults(self) -> None:
        self.store.clear_faults()

    def peek(self, key: str) -> Any:
        entry = self.store.peek(key, self.clock.now_ms())
        return self.loop.run_until_complete(entry) if self.loop is not None else entry

    def run(self, step: dict, effects: dict[str, int]) -> dict:
        """`guard.run` with a handler that counts its side effect and saves the step's checkpoints."""
        name = step.get("effect", "effect")
        resumed = []

        def handler(_fence: int, attempt: Attempt) -> Response:
            resumed.append(checkpoint_json(attempt.checkpoint))
            effects[name] = effects.get(name, 0) + 1
            for c in step.get("checkpoints", []):
                attempt.save_checkpoint(text(c["phase"]), data(c.get("data")))
            if step.get("fails"):
                raise RuntimeError("handler failed")
            return response(step["response"])

        async def async_handler(_fence: int, attempt: AsyncAttempt) -> Response:
            resumed.append(checkpoint_json(attempt.checkpoint))
            effects[name] = effects.get(name, 0) + 1
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


def response(v: dict) -> Response:
    return Response(v["status"], [(text(n), data(val)) for n, val in v.get("headers", [])], data(v.get("body")))


class _Awaited:
    """An `AsyncGuard` with `Guard`'s synchronous methods: each call runs on `loop` to its end."""

    def __init__(self, guard: AsyncGuard, loop: asyncio.AbstractEventLoop):
        self.guard, self.loop = guard, loop

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.guard, name)
        return lambda *args: self.loop.run_until_complete(method(*args))


def run_scenario(scenario: dict, binding: str = "static", **host: Any) -> int:
    """Plays a scenario (tests/scenario_runner.py's `play`); returns the number of checked steps, or raises
    `Mismatch("step N (op): ...")`. `host` goes to `Host` (`store=`, `asynchronous=`, `loop=`)."""
    host = Host(scenario, binding, **host)
    try:
        return play(scenario, host)
    finally:
        host.close()


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
    broken = mutants(load(name))
    for i, mutant in broken:
        with pytest.raises(Mismatch, match=rf"^step {i} "):
            run_scenario(mutant)
    assert len(broken) > 0


# AsyncGuard over an asynchronous store: every call replayed from a journal of
# the store's answers (idem_guard.journal), faults injected beside the store.
@pytest.mark.parametrize("name", FILES)
def test_conformance_over_an_asynchronous_store_by_journal_replay(name: str) -> None:
    assert run_scenario(load(name), store=AsyncFaulty(AsyncMemory()), asynchronous=True) > 0
