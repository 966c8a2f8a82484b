"""The HTTP conformance scenarios (conformance/http/*.json, format in
conformance/README.md) against `idem_guard.asgi.IdempotencyMiddleware` in a
Starlette app, and against FastAPI guarded per route (`idem_guard.fastapi`'s
route class) and app-wide (`Idempotency.install`), driven in process through ASGI. The JavaScript package plays
the same files against its Express middleware and the `idem serve` gateway
(packages/js/test/http-conformance.test.js)."""

from __future__ import annotations

import asyncio
import copy
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response as HttpResponse
from starlette.routing import Route

from idem_guard import AsyncGuard, MemoryStore
from idem_guard.asgi import IdempotencyMiddleware

SCENARIOS = Path(__file__).resolve().parents[3] / "conformance" / "http"
FILES = sorted(p.name for p in SCENARIOS.glob("*.json"))


def load(name: str) -> dict:
    return {"file": name, **json.loads((SCENARIOS / name).read_text(encoding="utf-8"))}


class Handler:
    """The scenario handler (conformance/README.md, "The handler") and its run count."""

    def __init__(self) -> None:
        self.runs = 0
        self._holds: dict[str, asyncio.Event] = {}

    def hold(self, name: str) -> asyncio.Event:
        return self._holds.setdefault(name, asyncio.Event())

    async def __call__(self, request: Request) -> HttpResponse:
        self.runs += 1
        run = self.runs
        body = await request.body()
        if hold := request.headers.get("x-handler-hold"):
            await self.hold(hold).wait()
        if request.headers.get("x-handler-fail"):
            raise RuntimeError(f"scenario handler failed on run {run}")
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        content = json.dumps({"run": run, "method": request.method, "path": target, "body": body.decode("latin-1")})
        return HttpResponse(
            content,
            status_code=int(request.headers.get("x-handler-status", "201")),
            headers={"content-type": "application/json", "x-handler-run": str(run)},
        )


METHODS = ["GET", "POST", "PATCH", "PUT", "DELETE"]
# How the app is guarded: the ASGI middleware in Starlette, a FastAPI route class, the middleware in FastAPI.
KINDS = ("starlette", "fastapi-route", "fastapi-app")


class Target:
    """An app guarded by an AsyncGuard on `store` (`kind`, one of KINDS): a
    MemoryStore by default, or any store with its `fault` and `clear_faults`
    (tests/stores.py's `AsyncFaulty` around a network store)."""

    def __init__(self, config: dict, store: Any = None, kind: str = "starlette") -> None:
        self.store = store if store is not None else MemoryStore()
        self.handler = Handler()
        guard = AsyncGuard(store=self.store)
        require_key = config.get("require_key", False)
        if kind == "starlette":
            route = Route("/{path:path}", self.handler.__call__, methods=METHODS)
            options = {"guard": guard, "require_key": require_key}
            self.app: Any = Starlette(routes=[route], middleware=[Middleware(IdempotencyMiddleware, **options)])
            return
        from fastapi import FastAPI

        from idem_guard.fastapi import Idempotency

        idem = Idempotency(guard, require_key=require_key)
        self.app = FastAPI()
        if kind == "fastapi-route":
            router = idem.router()
            router.add_api_route("/{path:path}", self.handler.__call__, methods=METHODS)
            self.app.include_router(router)
        else:
            self.app.router.add_api_route("/{path:path}", self.handler.__call__, methods=METHODS)
            idem.install(self.app)

    def store_down(self) -> None:
        self.store.fault("get", kind="error", message="store down")
        self.store.fault("insert", kind="error", message="store down")

    def store_up(self) -> None:
        self.store.clear_faults()


class Got:
    def __init__(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes):
        self.status = status
        self.headers = headers
        self.body = body

    def header(self, name: str) -> str | None:
        """All values of `name`, joined with ", " as fetch does; None if absent."""
        values = [v.decode("latin-1") for n, v in self.headers if n.decode("latin-1").lower() == name]
        return ", ".join(values) if values else None


def key_value(key: Any) -> str | None:
    if key is None or isinstance(key, str):
        return key
    return key["repeat"] * key["times"]


async def exchange(app: Any, spec: dict, handler: dict | None) -> Got:
    """One request through the app, as an ASGI server would make it."""
    headers = [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in (spec.get("headers") or {}).items()]
    if (key := key_value(spec.get("key"))) is not None:
        headers.append((b"idempotency-key", key.encode("latin-1")))
    for field, header in (("status", b"x-handler-status"), ("hold", b"x-handler-hold"), ("fail", b"x-handler-fail")):
        if handler and handler.get(field):
            headers.append((header, str(handler[field]).encode()))
    method = spec.get("method", "POST")
    body = b"" if method in ("GET", "HEAD") else (spec.get("body") or "").encode()
    headers.append((b"content-length", str(len(body)).encode()))
    path, _, query = spec["path"].partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": unquote(path),
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }
    delivered = False
    gone = asyncio.Event()

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    messages: list[dict] = []

    async def send(message: dict) -> None:
        messages.append(message)

    try:
        await app(scope, receive, send)
    except Exception:
        # Starlette's ServerErrorMiddleware answers 500, then re-raises for the server to log.
        if not messages:
            raise
    finally:
        gone.set()
    start = next(m for m in messages if m["type"] == "http.response.start")
    content = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return Got(start["status"], list(start.get("headers", [])), content)


SAME_HEADER = re.compile(r"^(content-type|x-handler-.*)$")


def check(expect: dict, got: Got, responses: dict[str, Got], runs: int, where: str) -> None:
    what = f"{where} (got {got.status} {got.body[:300]!r})"
    if "status" in expect:
        if expect["status"] == "5xx":
            assert 500 <= got.status <= 599, f"{what}: expected a 5xx"
        else:
            assert got.status == expect["status"], f"{what}: status"
    for name, want in (expect.get("headers") or {}).items():
        have = got.header(name)
        if want is True:
            assert have is not None, f"{what}: header {name} present"
        elif want is False:
            assert have is None, f"{what}: header {name} absent"
        else:
            assert have == want, f"{what}: header {name}"
    if slug := expect.get("problem"):
        assert (got.header("content-type") or "").startswith("application/problem+json"), f"{what}: problem content type"
        problem = json.loads(got.body)
        assert problem["type"] == f"https://idem.dev/problems/{slug}", f"{what}: problem type"
        assert problem["status"] == got.status, f"{what}: problem status"
        assert isinstance(problem["title"], str) and isinstance(problem["detail"], str), f"{what}: problem title, detail"
    if expect.get("retry_after"):
        assert re.fullmatch(r"[1-9][0-9]*", got.header("retry-after") or ""), f"{what}: Retry-After in whole seconds, at least 1"
    if name := expect.get("same_as"):
        first = responses[name]
        assert got.status == first.status, f"{what}: status of {name}"
        assert got.body == first.body, f"{what}: body bytes of {name}"
        for n, _ in first.headers:
            header = n.decode("latin-1").lower()
            if SAME_HEADER.match(header):
                assert got.header(header) == first.header(header), f"{what}: header {header} of {name}"
    if "runs" in expect:
        assert runs == expect["runs"], f"{what}: handler runs"


async def play(scenario: dict, target: Target) -> int:
    """Plays one scenario; returns how many answers it checked."""
    named: dict[str, dict] = {}
    responses: dict[str, Got] = {}
    pending: dict[str, asyncio.Task] = {}
    checks = 0
    try:
        for i, step in enumerate(scenario["steps"]):
            where = f"{scenario['file']} step {i}"
            if "send" in step:
                send = dict(step["send"])
                spec = {**named[send.pop("like")], **send} if "like" in send else send
                if "as" in step:
                    named[step["as"]] = spec
                exchanging = exchange(target.app, spec, step.get("handler"))
                if step.get("background"):
                    pending[step["as"]] = asyncio.ensure_future(exchanging)
                    await asyncio.sleep(0)  # let it start
                    continue
                got = await exchanging
                if "as" in step:
                    responses[step["as"]] = got
                if "expect" in step:
                    check(step["expect"], got, responses, target.handler.runs, where)
                    checks += 1
            elif "await" in step:
                got = await pending.pop(step["await"])
                responses[step["await"]] = got
                check(step.get("expect") or {}, got, responses, target.handler.runs, where)
                checks += 1
            elif "wait_runs" in step:
                for _ in range(1000):
                    if target.handler.runs >= step["wait_runs"]:
                        break
                    await asyncio.sleep(0.005)
                assert target.handler.runs >= step["wait_runs"], f"{where}: the handler did not reach {step['wait_runs']} runs"
            elif "unhold" in step:
                target.handler.hold(step["unhold"]).set()
            elif step.get("store") == "down":
                target.store_down()
            elif step.get("store") == "up":
                target.store_up()
            else:
                raise AssertionError(f"{where}: unknown step {step}")
        assert not pending, f"{scenario['file']}: background requests never awaited: {list(pending)}"
    finally:
        for task in pending.values():
            for event in target.handler._holds.values():
                event.set()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return checks


def test_there_are_http_scenarios() -> None:
    assert len(FILES) >= 8, FILES


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", FILES)
def test_the_app_plays_the_scenario(name: str, kind: str) -> None:
    scenario = load(name)
    assert asyncio.run(play(scenario, Target(scenario.get("config") or {}, kind=kind))) > 0


def test_the_runner_fails_a_scenario_whose_expectation_is_changed() -> None:
    """A runner that skipped a check would pass anything: each expected status
    and run count, changed, must fail its scenario at that step."""
    broken = 0
    for name in FILES:
        scenario = load(name)
        for i, step in enumerate(scenario["steps"]):
            for field in ("status", "runs"):
                if not isinstance((step.get("expect") or {}).get(field), int):
                    continue
                mutated = copy.deepcopy(scenario)
                mutated["steps"][i]["expect"][field] += 1
                with pytest.raises(AssertionError, match=rf"step {i}\b"):
                    asyncio.run(play(mutated, Target(scenario.get("config") or {})))
                broken += 1
    assert broken > 20, broken
