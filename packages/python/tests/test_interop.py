"""The on-store layout shared across languages, live: `idem serve` (the Rust
gateway) and the Python package's ASGI middleware pointed at the same Redis
prefix, or the same PostgreSQL table, share their keys. A response the
gateway stored is replayed by the middleware without running its handler,
and one the middleware stored is replayed by the gateway without calling its
upstream; the Python store reads the gateway's record.

Needs the servers (tests/stores.py) and an idem binary: $IDEM_BIN, else
target/release/idem or target/debug/idem (under $CARGO_TARGET_DIR). Without
one the test is skipped, unless IDEM_GATEWAY_REQUIRED=1 (run-polyglot-tests.sh
sets it when it has the binary that wrote the component)."""

from __future__ import annotations

import asyncio
import http.server
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
from stores import server_url, unique

from idem_guard import AsyncGuard

starlette = pytest.importorskip("starlette")
pytest.importorskip("redis")
pytest.importorskip("psycopg")

from starlette.applications import Starlette  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import Response as HttpResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402
from test_http_conformance import exchange  # noqa: E402

from idem_guard.asgi import IdempotencyMiddleware  # noqa: E402
from idem_guard.postgres import AsyncPostgresStore, PostgresStore  # noqa: E402
from idem_guard.redis import AsyncRedisStore, RedisStore  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
BODY = b'{"order":"o-1","cents":1000}'


def idem_bin() -> str:
    target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    for candidate in (os.environ.get("IDEM_BIN"), target / "release" / "idem", target / "debug" / "idem"):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    message = f"no idem binary at $IDEM_BIN ({os.environ.get('IDEM_BIN')}) or in {target}"
    if os.environ.get("IDEM_GATEWAY_REQUIRED") == "1":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Upstream:
    """The service behind the gateway: counts its calls, answers 201 with its own body."""

    def __init__(self) -> None:
        self.calls = 0
        upstream = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("content-length") or 0))
                upstream.calls += 1
                body = b'{"by":"upstream","call":%d}' % upstream.calls
                self.send_response(201)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Gateway:
    """`idem serve` on `store` in front of an Upstream."""

    def __init__(self, binary: str, store: str):
        self.upstream = Upstream()
        port, admin = free_port(), free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [binary, "serve", "--listen", f"127.0.0.1:{port}", "--upstream", self.upstream.url, "--store", store,
             "--admin-listen", f"127.0.0.1:{admin}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 15
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{admin}/v1/stats", timeout=1) as r:
                    if r.status == 200:
                        break
            except (OSError, urllib.error.URLError):
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"idem serve did not start: {self.process.stderr.read().decode(errors='replace')}")
            time.sleep(0.05)

    def post(self, key: str) -> tuple[int, dict, bytes]:
        request = urllib.request.Request(
            f"{self.url}/orders", data=BODY, method="POST",
            headers={"content-type": "application/json", "idempotency-key": key},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
        except urllib.error.HTTPError as e:
            return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.upstream.stop()


def python_app(store: Any) -> tuple[Any, list[int]]:
    """A Starlette app behind the middleware over `store`; its handler's calls counted."""
    calls: list[int] = []

    async def orders(request: Request) -> HttpResponse:
        await request.body()
        calls.append(1)
        return HttpResponse(b'{"by":"python"}', status_code=201, media_type="application/json")

    app = Starlette(
        routes=[Route("/orders", orders, methods=["POST"])],
        middleware=[Middleware(IdempotencyMiddleware, guard=AsyncGuard(store=store))],
    )
    return app, calls


def through_python(app: Any, key: str) -> Any:
    spec = {"method": "POST", "path": "/orders", "key": key, "headers": {"content-type": "application/json"}, "body": BODY.decode()}
    return exchange(app, spec, None)


def with_param(url: str, param: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{param}"


def shares_keys(gateway_store: str, sync_store: Any, open_async: Any) -> None:
    gateway = Gateway(idem_bin(), gateway_store)
    try:
        # The gateway first: its record, read by the Python store and replayed by the middleware.
        status, _, body = gateway.post("g-1")
        assert (status, body, gateway.upstream.calls) == (201, b'{"by":"upstream","call":1}', 1)
        entry = sync_store.get("anon/g-1", time.time_ns() // 1_000_000)
        assert entry is not None and entry.record.state == "done" and entry.record.response.body == body, entry

        async def python_side() -> tuple[Any, Any, list[int]]:
            async with await open_async() as store:
                app, calls = python_app(store)
                replayed = await through_python(app, "g-1")
                first = await through_python(app, "p-1")
                return replayed, first, calls

        replayed, first, calls = asyncio.run(python_side())
        assert replayed.status == 201 and replayed.body == body and replayed.header("idempotent-replayed") == "true"
        assert first.status == 201 and first.body == b'{"by":"python"}'
        assert calls == [1], "the middleware ran its handler for p-1 only"

        # The middleware first: the gateway replays its response and never calls the upstream.
        status, headers, body = gateway.post("p-1")
        assert (status, body) == (201, b'{"by":"python"}') and headers.get("idempotent-replayed") == "true", headers
        assert gateway.upstream.calls == 1
    finally:
        gateway.stop()


@pytest.fixture
def redis_url() -> Iterator[str]:
    import redis

    url = server_url("IDEM_TEST_REDIS_URL")
    yield url
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match="idempy_*interop*"))
    if keys:
        client.delete(*keys)
    client.close()


def test_idem_serve_and_the_python_package_share_keys_on_redis(redis_url: str) -> None:
    prefix = unique("interop") + ":"
    with RedisStore(redis_url, prefix=prefix) as store:

        async def open_async() -> AsyncRedisStore:
            return AsyncRedisStore(redis_url, prefix=prefix)

        shares_keys(with_param(redis_url, f"prefix={prefix}"), store, open_async)


def test_idem_serve_and_the_python_package_share_keys_on_postgres() -> None:
    import psycopg

    url = server_url("IDEM_TEST_POSTGRES_URL")
    table = unique("interop")
    try:
        with PostgresStore(url, table=table) as store:
            shares_keys(with_param(url, f"table={table}"), store, lambda: AsyncPostgresStore.open(url, table=table))
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                f"DROP TABLE IF EXISTS {table}; DROP FUNCTION IF EXISTS {table}_claim; "
                f"DROP FUNCTION IF EXISTS {table}_try_claim; DELETE FROM idem_schema WHERE table_name = '{table}'"
            )
