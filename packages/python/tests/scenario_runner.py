"""The conformance scenarios (conformance/*.json, format in conformance/README.md)
as a runner over any guard host: `play(scenario, host)` performs each step
through `host` and checks its result. It needs nothing of `idem_guard`, so it
runs hosts written from the WIT alone (tests/test_store_component.py).

A host has the guard's calls, its clock, and its store's faults and records:

    clock.set(ms), clock.advance(ms)
    begin(key, fingerprint)        -> ("proceed", Claim) | ("replay", Response)
                                      | ("in-flight", ms) | ("conflict", None)
    complete(claim, response), release(claim)
    renew(claim), save_checkpoint(claim, Checkpoint)  -> Claim
    fingerprint(method, path, headers, body)          -> "sha256:…"
    set_fault(primitive, kind, message, count), clear_faults()
    peek(key)                      -> None | (Record, version)

A guard error is raised as a `Failure`. A host with a `run(step, effects)` of
its own (a guard's `run`, tests/test_conformance.py) answers `run` steps
itself; for one without, a `run` step is the lifecycle over those calls (`run`
below, as the Rust runner's default `GuardHost::run`).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

CONFORMANCE = Path(__file__).resolve().parents[3] / "conformance"
FILES = sorted(p.name for p in CONFORMANCE.glob("*.json"))


def load(name: str) -> dict[str, Any]:
    scenario: dict[str, Any] = json.loads((CONFORMANCE / name).read_text(encoding="utf-8"))
    return scenario


class Failure(Exception):
    """A guard error: `kind` is `unavailable`, `invalid-input` or `stale-claim`."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


class Mismatch(AssertionError):
    """A step whose result is not what the scenario expects: `step N (op): ...`."""


@dataclass(frozen=True)
class Response:
    status: int
    headers: list[tuple[str, bytes]]
    body: bytes


@dataclass(frozen=True)
class Checkpoint:
    phase: str
    data: bytes


@dataclass(frozen=True)
class Claim:
    key: str
    fingerprint: str
    fence: int
    holder: int
    lease_until_ms: int
    expires_at_ms: int
    checkpoint: Checkpoint | None


@dataclass(frozen=True)
class Record:
    fingerprint: str
    state: str
    holder: int
    lease_until_ms: int
    expires_at_ms: int
    checkpoint: Checkpoint | None
    response: Response | None


class Clock(Protocol):
    def set(self, ms: int) -> None: ...
    def advance(self, ms: int) -> None: ...


class Host(Protocol):
    @property
    def clock(self) -> Clock: ...

    def begin(self, key: str, fingerprint: str) -> tuple[str, Any]: ...
    def complete(self, claim: Claim, response: Response) -> None: ...
    def release(self, claim: Claim) -> None: ...
    def renew(self, claim: Claim) -> Claim: ...
    def save_checkpoint(self, claim: Claim, checkpoint: Checkpoint) -> Claim: ...
    def fingerprint(self, method: str, path: str, headers: list[tuple[str, bytes]], body: bytes) -> str: ...
    def set_fault(self, primitive: str, kind: str, message: str, count: int | None) -> None: ...
    def clear_faults(self) -> None: ...
    def peek(self, key: str) -> tuple[Record, int] | None: ...


def text(v: Any) -> str:
    """A string field: a string, or `{"repeat": S, "times": N}`."""
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and "repeat" in v:
        return str(v["repeat"] * v["times"])
    raise ValueError(f"expected a string, got {v!r}")


def data(v: Any) -> bytes:
    """A bytes field: a UTF-8 string, `{"hex": H}` or `{"repeat": S, "times": N}`."""
    if v is None:
        return b""
    if isinstance(v, dict) and "hex" in v:
        return bytes.fromhex(v["hex"])
    return text(v).encode()


def response(v: dict[str, Any]) -> Response:
    return Response(v["status"], [(text(n), data(val)) for n, val in v.get("headers", [])], data(v.get("body")))


def response_json(r: Response) -> dict[str, Any]:
    return {"status": r.status, "headers": [[n, v.decode("utf-8", "replace")] for n, v in r.headers], "body_hex": r.body.hex()}


def checkpoint_json(c: Checkpoint | None) -> dict[str, Any] | None:
    return None if c is None else {"phase": c.phase, "data_hex": c.data.hex()}


def claim_json(c: Claim) -> dict[str, Any]:
    return {
        "fence": c.fence,
        "holder": c.holder,
        "lease_until_ms": c.lease_until_ms,
        "expires_at_ms": c.expires_at_ms,
        "checkpoint": checkpoint_json(c.checkpoint),
    }


def error_json(e: Failure) -> dict[str, Any]:
    return {"error": e.kind, "message": e.detail}


def check(expect: dict[str, Any], actual: dict[str, Any], claims: dict[str, Claim]) -> str | None:
    """Why `actual` does not match `expect` (conformance/README.md, "Matching"), or None."""
    for name, want in expect.items():
        if name in ("holder_of", "holder_not_of"):
            claim = claims.get(want)
            if claim is None:
                return f"{name} names no kept claim {want!r}"
            if not isinstance(actual.get("holder"), int):
                return "the result has no holder"
            if (actual["holder"] == claim.holder) != (name == "holder_of"):
                return f"holder {actual['holder']} is {'not ' if name == 'holder_of' else ''}the holder of {want} ({claim.holder})"
        elif name in ("checkpoint", "resumed"):
            if name not in actual:
                return f"the result has no {name}"
            expected = None if want is None else {"phase": text(want["phase"]), "data_hex": data(want.get("data")).hex()}
            if actual[name] != expected:
                return f"{name} is {json.dumps(actual[name])}, expected {json.dumps(expected)}"
        elif name == "contains":
            for w in want if isinstance(want, list) else [want]:
                if not isinstance(actual.get("message"), str) or w not in actual["message"]:
                    return f"message does not contain {w!r}"
        elif name == "fence_above":
            if not (isinstance(actual.get("fence"), int) and actual["fence"] > want):
                return f"fence {actual.get('fence')} is not above {want}"
        elif name == "body":
            if actual.get("body_hex") != data(want).hex():
                return f"body is {actual.get('body_hex')}, expected {data(want).hex()}"
        elif name not in actual or actual[name] != want or type(actual[name]) is not type(want):
            return f"{name} is {json.dumps(actual.get(name))}, expected {json.dumps(want)}"
    return None


def claim_of(step: dict[str, Any], claims: dict[str, Claim]) -> Claim:
    """The step's named claim, with the fields its `with` replaces (u64s as decimal strings)."""
    claim = claims[step["claim"]]
    for field, value in step.get("with", {}).items():
        if field not in ("holder", "fence"):
            raise ValueError(f"with.{field}: not a field a step replaces")
        if not (isinstance(value, str) and value.isdigit() and int(value) < 1 << 64):
            raise ValueError(f"with.{field}: {value!r} is not a u64 as a decimal string")
        claim = dataclasses.replace(claim, holder=int(value)) if field == "holder" else dataclasses.replace(claim, fence=int(value))
    return claim


def run(host: Host, step: dict[str, Any], effects: dict[str, int]) -> dict[str, Any]:
    """A `run` step over the host's calls: begin; on a claim the handler counts its
    side effect, saves the step's checkpoints (a failure fails the handler), then
    fails (`fails`) or answers; then `complete`, or `release` if it failed."""
    try:
        kind, value = host.begin(text(step["key"]), text(step["fingerprint"]))
    except Failure as e:
        return error_json(e) if e.kind == "invalid-input" else {"outcome": "unavailable", "message": e.detail}
    if kind == "replay":
        return {"outcome": "replayed", **response_json(value)}
    if kind == "in-flight":
        return {"outcome": "in-flight", "retry_after_ms": value}
    if kind == "conflict":
        return {"outcome": "conflict"}
    claim: Claim = value
    resumed = checkpoint_json(claim.checkpoint)
    name = step.get("effect", "effect")
    effects[name] = effects.get(name, 0) + 1
    failed = False
    try:
        for c in step.get("checkpoints", []):
            claim = host.save_checkpoint(claim, Checkpoint(text(c["phase"]), data(c.get("data"))))
    except Failure:
        failed = True
    if failed or step.get("fails"):
        try:
            host.release(claim)
        except Failure:
            pass  # the lease runs out as usual
        return {"outcome": "handler-failed"}
    answer = response(step["response"])
    try:
        host.complete(claim, answer)
    except Failure as e:
        return {"outcome": "not-recorded", **error_json(e)}
    return {"outcome": "executed", **response_json(answer), "resumed": resumed}


def perform(host: Host, step: dict[str, Any], claims: dict[str, Claim], effects: dict[str, int]) -> dict[str, Any] | None:
    """Performs one step; returns the result to check, or None for a step without one."""
    op = step["op"]
    if op == "clock":
        if "set_ms" in step:
            host.clock.set(step["set_ms"])
        else:
            host.clock.advance(step["advance_ms"])
        return None
    if op == "fault":
        if step["kind"] not in ("error", "lost"):
            raise ValueError(f"unknown fault kind {step['kind']!r}")
        host.set_fault(step["primitive"], step["kind"], step.get("message", "injected fault"), step.get("count"))
        return None
    if op == "clear_faults":
        host.clear_faults()
        return None
    if op == "run":
        own = getattr(host, "run", None)
        return own(step, effects) if own is not None else run(host, step, effects)
    if op == "effects":
        return {name: effects.get(name, 0) for name in step["expect"]}
    try:
        if op == "begin":
            kind, value = host.begin(text(step["key"]), text(step["fingerprint"]))
            if kind == "proceed":
                if "as" in step:
                    claims[step["as"]] = value
                return {"decision": "proceed", **claim_json(value)}
            if kind == "replay":
                return {"decision": "replay", **response_json(value)}
            if kind == "in-flight":
                return {"decision": "in-flight", "retry_after_ms": value}
            return {"decision": kind}
        if op == "complete":
            host.complete(claim_of(step, claims), response(step["response"]))
            return {"ok": True}
        if op == "release":
            host.release(claim_of(step, claims))
            return {"ok": True}
        if op in ("renew", "checkpoint"):
            claim = claim_of(step, claims)
            if op == "renew":
                next_claim = host.renew(claim)
            else:
                next_claim = host.save_checkpoint(claim, Checkpoint(text(step["phase"]), data(step.get("data"))))
            if "as" in step:
                claims[step["as"]] = next_claim
            return {"ok": True, **claim_json(next_claim)}
        if op == "fingerprint":
            q = step["request"]
            headers = [(text(n), data(v)) for n, v in q.get("headers", [])]
            return {"fingerprint": host.fingerprint(text(q["method"]), text(q["path"]), headers, data(q.get("body")))}
    except Failure as e:
        return error_json(e)
    if op == "peek":
        found = host.peek(text(step["key"]))
        if found is None:
            return {"absent": True}
        r, version = found
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
    raise ValueError(f"unknown op {op!r}")


def play(scenario: dict[str, Any], host: Host) -> int:
    """Runs `scenario` on `host` (fresh: an empty store, its clock at `clock_ms`);
    returns the number of checked steps, or raises `Mismatch("step N (op): ...")`."""
    claims: dict[str, Claim] = {}
    effects: dict[str, int] = {}
    checked = 0
    for i, step in enumerate(scenario["steps"]):
        for _ in range(step.get("times", 1)):
            actual = perform(host, step, claims, effects)
            if actual is None:
                continue
            if "expect" not in step:
                raise Mismatch(f"step {i} ({step['op']}): no expect")
            why = check(step["expect"], actual, claims)
            if why:
                raise Mismatch(f"step {i} ({step['op']}): {why}; got {json.dumps(actual)}")
            checked += 1
    return checked


def mutants(scenario: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """The scenario with one expectation made wrong (`mutate`), for each step that has one
    to break: (the step's index, the mutant). Playing a mutant must fail at that step."""
    out = []
    for i, step in enumerate(scenario["steps"]):
        wrong = mutate(step.get("expect"))
        if wrong is not None:
            mutant = copy.deepcopy(scenario)
            mutant["steps"][i]["expect"] = wrong
            out.append((i, mutant))
    return out


def mutate(expect: dict[str, Any] | None) -> dict[str, Any] | None:
    """A plausible wrong answer for an expectation (as the Rust runner's `mutate`), or None."""
    if not expect:
        return None
    wrong = dict(expect)
    if isinstance(wrong.get("decision"), str):
        wrong["decision"] = "in-flight" if wrong["decision"] == "proceed" else "proceed"
    elif isinstance(wrong.get("outcome"), str):
        wrong["outcome"] = "replayed" if wrong["outcome"] == "executed" else "executed"
    elif isinstance(wrong.get("error"), str):
        wrong["error"] = "unavailable" if wrong["error"] == "stale-claim" else "stale-claim"
    elif "ok" in wrong:
        del wrong["ok"]
        wrong["error"] = "unavailable"
    elif isinstance(wrong.get("absent"), bool):
        wrong["absent"] = not wrong["absent"]
    else:
        n = next((k for k, v in wrong.items() if isinstance(v, int) and not isinstance(v, bool)), None)
        s = next((k for k, v in wrong.items() if isinstance(v, str)), None)
        if n is not None:
            wrong[n] += 1
        elif s is not None:
            wrong[s] += "!"
        else:
            return None
    return wrong
