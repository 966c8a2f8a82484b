"""Three hosts, one store: `idem serve` (Rust), a Node.js service
(`@idem/guard`, driven through peer.mjs) and a Python worker (`idem-guard`,
in this process) share one Redis, one PostgreSQL and one DynamoDB table, and agree on every key:

- a key one of them claimed is in flight for the other two;
- a response one of them stored is replayed byte for byte by the others;
- a claim whose lease ran out is taken over across languages at a higher
  fence, and the stale holder's completion is refused;
- the gateway and the Python package's ASGI middleware (Starlette, driven in
  process) replay each other's responses without running their handlers;
- with the gateway's wall clock a minute ahead and the Node.js service's a
  minute behind (libfaketime), and the gateway's stepped an hour mid-request,
  every host still sees the others' claims in flight and each key runs once:
  they all judge time by the store's clock (contract 0.3).

Needs IDEM_BIN (an `idem` binary), IDEM_TEST_REDIS_URL, IDEM_TEST_POSTGRES_URL and
IDEM_TEST_DYNAMODB_URL (`dynamodb://HOST:PORT?region=…`, a DynamoDB-compatible server); fails, naming what is missing, without them
(IDEM_TEST_SKIP_NETSTORES=1 skips it for want of a server URL).
Run by examples/run-polyglot-tests.sh in the polyglot venv.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import io
import json
import os
import queue
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from idem_guard import Guard, GuardError, Response

HERE = Path(__file__).resolve().parent
LEASE_MS = 30_000
# A DynamoDB request's timeout in every host (see started_hosts).
DYNAMODB_TIMEOUT_MS = 10_000


def need(var: str) -> str:
    value = os.environ.get(var)
    if not value and var != "IDEM_BIN" and os.environ.get("IDEM_TEST_SKIP_NETSTORES") == "1":
        pytest.skip(f"{var} is not set and IDEM_TEST_SKIP_NETSTORES=1")
    if not value:
        pytest.fail(f"{var} is not set: the interop test needs it (see examples/interop/test_interop.py)")
    return value


class Upstream:
    """The service behind the gateway: counts calls per idempotency key and
    answers after `delay` seconds with a body naming the key and the count."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.delay = 0.0
        upstream = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                self.rfile.read(length)
                key = self.headers.get("idempotency-key", "")
                upstream.calls[key] = upstream.calls.get(key, 0) + 1
                time.sleep(upstream.delay)
                body = json.dumps({"key": key, "run": upstream.calls[key], "by": "gateway"}).encode()
                self.send_response(201)
                self.send_header("content-type", "application/json")
                self.send_header("x-served-by", "upstream")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


class Gateway:
    def __init__(self, store_url: str, upstream: Upstream, env: dict[str, str] | None = None) -> None:
        # Port 0: the gateway takes a free port and names it on stderr
        # ("idem serve: http://ADDR -> ..."), so no other process can take it
        # between a probe and the bind.
        self.proc = subprocess.Popen(
            [
                need("IDEM_BIN"), "serve",
                "--listen", "127.0.0.1:0",
                "--upstream", f"http://127.0.0.1:{upstream.port}",
                "--store", store_url,
                "--admin-listen", "off",
                "--client-header", "",
                "--lease", f"{LEASE_MS}ms",
                "--upstream-timeout", "10s",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.stderr: list[str] = []
        bound: queue.Queue[str] = queue.Queue()

        def drain() -> None:  # read every line, so the gateway never blocks on a full pipe
            for line in io.TextIOWrapper(self.proc.stderr, errors="replace"):
                self.stderr.append(line)
                if line.startswith("idem serve: http://"):
                    bound.put(line.split()[2].removeprefix("http://"))
            bound.put("")

        threading.Thread(target=drain, daemon=True).start()
        try:
            addr = bound.get(timeout=60)
        except queue.Empty:
            addr = ""
        if not addr:
            why = "did not listen within 60 s" if self.proc.poll() is None else "exited before it listened"
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"idem serve {why}; its stderr: {''.join(self.stderr)!r}")
        self.port = int(addr.rsplit(":", 1)[1])

    def post(self, key: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/orders",
            data=body,
            method="POST",
            headers={"content-type": "application/json", "idempotency-key": key},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
        except urllib.error.HTTPError as e:
            return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


class Node:
    """The Node.js service: peer.mjs over a pipe."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            ["node", str(HERE / "peer.mjs")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def __call__(self, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("peer.mjs exited")
        answer = json.loads(line)
        if answer.get("error") == "exception":
            raise RuntimeError(answer["detail"])
        return answer

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self(op="close")
        finally:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wire(r: Response) -> dict:
    return {"status": r.status, "headers": [[n, bytes(v).hex()] for n, v in r.headers], "body": bytes(r.body).hex()}


LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


class Skew:
    """Wall clocks for the hosts started as processes, each an offset from the real one kept in a
    file that libfaketime reads on every clock call (only CLOCK_REALTIME moves; the monotonic and
    boot clocks stay real): a step reaches the running process at once."""

    def __init__(self, tmp: Path, offsets: dict[str, int]) -> None:
        if not Path(LIBFAKETIME).exists():
            pytest.fail(f"{LIBFAKETIME} is missing: apt-get install faketime (.ci/run installs it)")
        self.files = {host: tmp / f"faketime-{host}" for host in offsets}
        for host, seconds in offsets.items():
            self.set(host, seconds)

    def set(self, host: str, seconds: int) -> None:
        self.files[host].write_text(f"{seconds:+d}\n")

    def env(self, host: str) -> dict[str, str]:
        return {
            **os.environ,
            "LD_PRELOAD": LIBFAKETIME,
            "FAKETIME_TIMESTAMP_FILE": str(self.files[host]),
            "FAKETIME_NO_CACHE": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }


@pytest.fixture(params=["redis", "postgres", "dynamodb"])
def hosts(request):
    """The three hosts on one store, under a prefix or table of this run's own."""
    with started_hosts(request.param) as started:
        yield started


@contextlib.contextmanager
def started_hosts(kind: str, skew: Skew | None = None):
    """The gateway, the Node.js service and the Python worker on the store `kind`, the first two
    on `skew`'s wall clocks when given."""
    run = f"interop_{os.getpid()}_{int(time.time() * 1000) % 10**8}"
    if kind == "redis":
        url = need("IDEM_TEST_REDIS_URL")
        prefix = f"{run}:"
        from idem_guard.redis import AsyncRedisStore, RedisStore

        py_store = RedisStore(url, prefix=prefix)
        gateway_url = f"{url}{'&' if '?' in url else '?'}prefix={prefix}"
        node_open = {"store": "redis", "url": url, "prefix": prefix}

        async def open_async():
            return AsyncRedisStore(url, prefix=prefix)

    elif kind == "dynamodb":
        url = need("IDEM_TEST_DYNAMODB_URL")
        from idem_guard.dynamodb import AsyncDynamoDbStore, DynamoDbStore

        endpoint, region = _dynamodb_endpoint(url)
        # A table of the run's own. moto serves one request at a time (scripts/dynamodb-server.py),
        # so three hosts queue behind each other: a longer request timeout than the 2 s default.
        dynamo = {"endpoint": endpoint, "region": region, "table": run}
        py_store = DynamoDbStore(**dynamo, timeout_ms=DYNAMODB_TIMEOUT_MS)
        gateway_url = f"dynamodb://{endpoint.removeprefix('http://')}?table={run}&region={region}&timeout_ms={DYNAMODB_TIMEOUT_MS}"
        node_open = {"store": "dynamodb", **dynamo, "timeoutMs": DYNAMODB_TIMEOUT_MS}

        async def open_async():
            return await AsyncDynamoDbStore.open(**dynamo, timeout_ms=DYNAMODB_TIMEOUT_MS)

    else:
        url = need("IDEM_TEST_POSTGRES_URL")
        from idem_guard.postgres import AsyncPostgresStore, PostgresStore

        py_store = PostgresStore(url, table=run)
        gateway_url = f"{url}{'&' if '?' in url else '?'}table={run}"
        node_open = {"store": "postgres", "url": url, "table": run}

        async def open_async():
            return await AsyncPostgresStore.open(url, table=run)

    # Whatever was started is stopped, and the run's keys or table removed, even when a host
    # fails to start (no gateway or Node.js process is left behind).
    with contextlib.ExitStack() as started:
        started.callback(_forget, kind, url, run)
        started.callback(py_store.close)
        upstream = Upstream()
        started.callback(upstream.close)
        gateway = Gateway(gateway_url, upstream, skew.env("gateway") if skew else None)
        started.callback(gateway.close)
        node = Node(skew.env("node") if skew else None)
        started.callback(node.close)
        assert node(op="open", leaseMs=LEASE_MS, **node_open) == {"ok": True}
        python = Guard(store=py_store, lease_ms=LEASE_MS, renew_lease=False)
        yield kind, gateway, node, python, upstream, py_store, open_async


def _dynamodb_endpoint(url: str) -> tuple[str, str]:
    """`dynamodb://HOST:PORT?region=R…` as the packages take it: `http://HOST:PORT` and R."""
    rest = url.removeprefix("dynamodb://")
    host, _, query = rest.partition("?")
    params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
    return f"http://{host}", params.get("region", "us-east-1")


def _forget(kind: str, url: str, run: str) -> None:
    """Removes the run's table, or its keys."""
    if kind == "postgres":
        _drop(url, run)
        return
    if kind == "dynamodb":
        import boto3

        endpoint, region = _dynamodb_endpoint(url)
        client = boto3.client(
            "dynamodb", endpoint_url=endpoint, region_name=region, aws_access_key_id="interop", aws_secret_access_key="interop"
        )
        with contextlib.suppress(client.exceptions.ResourceNotFoundException):
            client.delete_table(TableName=run)
        return
    import redis

    with redis.Redis.from_url(url) as r:
        keys = list(r.scan_iter(match=f"{run}:*"))
        if keys:
            r.delete(*keys)


def _drop(url: str, table: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"DROP FUNCTION IF EXISTS {table}_try_claim")
        conn.execute(f"DROP FUNCTION IF EXISTS {table}_claim")
        conn.execute("DELETE FROM idem_schema WHERE table_name = %s", (table,))


def fingerprint_of(python: Guard, body: bytes) -> str:
    """The fingerprint the gateway computes for POST /orders with this body."""
    return python.fingerprint("POST", "/orders", [("content-type", b"application/json")], body)


def post_in_flight(gateway: Gateway, upstream: Upstream, key: str, body: bytes, delay_s: float) -> Callable[[], tuple[int, dict[str, str], bytes]]:
    """POSTs `body` under `key` through the gateway on a thread of its own, the upstream answering
    after `delay_s`, and returns once the upstream has the request (the key is in flight on the
    store); the function returned waits for the gateway's answer (status, headers, body)."""
    upstream.delay = delay_s
    first: dict[str, tuple[int, dict[str, str], bytes]] = {}
    t = threading.Thread(target=lambda: first.update(answer=gateway.post(key, body)))
    t.start()
    deadline = time.monotonic() + 10
    while upstream.calls.get(key) is None and time.monotonic() < deadline:
        time.sleep(0.01)

    def answer() -> tuple[int, dict[str, str], bytes]:
        t.join()
        return first["answer"]

    return answer


def test_a_node_claim_is_in_flight_everywhere_then_replayed_byte_for_byte(hosts):
    _kind, gateway, node, python, upstream, _, _ = hosts
    body = b'{"order":"n-1","cents":1000}'
    fp = fingerprint_of(python, body)

    claim = node(op="begin", key="anon/n-1", fingerprint=fp)
    assert claim["tag"] == "proceed"
    tag, _ = python.begin("anon/n-1", fp)
    assert tag == "in-flight"
    status, headers, _ = gateway.post("n-1", body)
    assert status == 409 and "retry-after" in headers
    assert upstream.calls.get("n-1") is None  # the gateway never forwarded it

    stored = Response(201, [("content-type", b"application/json"), ("x-served-by", b"node")], b'{"by":"node"}\x00\xff')
    assert node(op="complete", claim=claim["claim"], response=wire(stored)) == {"ok": True}

    tag, replayed = python.begin("anon/n-1", fp)
    assert tag == "replay" and wire(replayed) == wire(stored)
    status, headers, got = gateway.post("n-1", body)
    assert (status, got) == (201, stored.body)
    assert headers["x-served-by"] == "node" and headers["idempotent-replayed"] == "true"
    assert upstream.calls.get("n-1") is None


def test_a_gateway_response_is_replayed_by_node_and_python(hosts):
    _kind, gateway, node, python, upstream, _, _ = hosts
    body = b'{"order":"g-1","cents":500}'
    fp = fingerprint_of(python, body)
    answer = post_in_flight(gateway, upstream, "g-1", body, delay_s=1.0)
    assert node(op="begin", key="anon/g-1", fingerprint=fp)["tag"] == "in-flight"
    assert python.begin("anon/g-1", fp)[0] == "in-flight"
    status, _, sent = answer()
    assert status == 201

    by_node = node(op="begin", key="anon/g-1", fingerprint=fp)
    assert by_node["tag"] == "replay"
    assert bytes.fromhex(by_node["response"]["body"]) == sent and by_node["response"]["status"] == 201
    tag, by_python = python.begin("anon/g-1", fp)
    assert tag == "replay" and bytes(by_python.body) == sent
    assert wire(by_python) == by_node["response"]
    assert upstream.calls["g-1"] == 1


def test_a_takeover_across_languages_raises_the_fence_and_refuses_the_stale_holder(hosts):
    _kind, gateway, node, python, upstream, py_store, _ = hosts
    body = b'{"order":"t-1"}'
    fp = fingerprint_of(python, body)
    short = Guard(store=py_store, lease_ms=200, renew_lease=False)
    tag, stale = short.begin("anon/t-1", fp)
    assert tag == "proceed"
    # The Python worker "crashes": it never completes. After its lease, by the store's clock
    # (every host's time authority), with a margin for the two hosts' error bounds (milliseconds
    # on Redis and PostgreSQL; about a second on DynamoDB, whose clock is its Date header's):
    margin = py_store.clock.known() + int(node(op="clock")["errorMs"]) + 100
    deadline = time.monotonic() + 30
    while py_store.clock.now_ms() < stale.lease_until_ms + margin:
        assert time.monotonic() < deadline, "the store's clock did not pass the lease"
        time.sleep(0.01)
    taken = node(op="begin", key="anon/t-1", fingerprint=fp)
    assert taken["tag"] == "proceed"
    assert int(taken["fence"]) > stale.fence

    with pytest.raises(GuardError) as refused:
        short.complete(stale, Response(200, [], b"from the stale holder"))
    assert refused.value.kind == "stale-claim"

    done = Response(201, [("content-type", b"application/json")], b'{"by":"node, after the takeover"}')
    assert node(op="complete", claim=taken["claim"], response=wire(done)) == {"ok": True}
    status, _, got = gateway.post("t-1", body)
    assert (status, got) == (201, done.body)
    assert upstream.calls.get("t-1") is None


def python_app(store) -> tuple:
    """A Starlette app behind the ASGI middleware over `store`; its handler's runs counted."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import Response as HttpResponse
    from starlette.routing import Route

    from idem_guard import AsyncGuard
    from idem_guard.asgi import IdempotencyMiddleware

    runs: list[int] = []

    async def orders(request) -> HttpResponse:
        await request.body()
        runs.append(1)
        return HttpResponse(b'{"by":"python"}', status_code=201, media_type="application/json")

    app = Starlette(
        routes=[Route("/orders", orders, methods=["POST"])],
        middleware=[Middleware(IdempotencyMiddleware, guard=AsyncGuard(store=store))],
    )
    return app, runs


def through_python(app, key: str, body: bytes):
    """POST /orders through the ASGI app in process (the HTTP scenarios' `exchange`)."""
    from test_http_conformance import exchange

    spec = {"method": "POST", "path": "/orders", "key": key, "headers": {"content-type": "application/json"}, "body": body.decode()}
    return exchange(app, spec, None)


def test_the_gateway_and_the_asgi_middleware_replay_each_others_responses(hosts):
    _kind, gateway, _node, _python, upstream, py_store, open_async = hosts
    body = b'{"order":"m-1","cents":1000}'

    # The gateway first: its record, read by the Python store and replayed by the middleware.
    status, _, sent = gateway.post("g-m", body)
    assert status == 201 and upstream.calls["g-m"] == 1
    entry = py_store.get("anon/g-m", py_store.clock.now_ms())
    assert entry is not None and entry.record.state == "done" and entry.record.response.body == sent, entry

    async def python_side():
        store = await open_async()
        try:
            app, runs = python_app(store)
            replayed = await through_python(app, "g-m", body)
            first = await through_python(app, "p-m", body)
            return replayed, first, runs
        finally:
            await store.close()

    replayed, first, runs = asyncio.run(python_side())
    assert replayed.status == 201 and replayed.body == sent and replayed.header("idempotent-replayed") == "true"
    assert first.status == 201 and first.body == b'{"by":"python"}', first.body
    assert runs == [1], "the middleware ran its handler for p-m only"

    # The middleware first: the gateway replays its response and never calls the upstream.
    status, headers, got = gateway.post("p-m", body)
    assert (status, got) == (201, b'{"by":"python"}') and headers.get("idempotent-replayed") == "true", headers
    assert upstream.calls.get("p-m") is None


@pytest.fixture(params=["redis", "postgres", "dynamodb"])
def hosts_skewed(request, tmp_path):
    """The three hosts on one store, the gateway's wall clock a minute ahead of the real one and
    the Node.js service's a minute behind: two minutes, four leases, between them. Python's is
    the real one. Contract 0.3's time authority is the store's clock, so none of it matters."""
    skew = Skew(tmp_path, {"gateway": 60, "node": -60})
    with started_hosts(request.param, skew) as started:
        yield skew, started


def test_hosts_minutes_apart_agree_on_every_lease_and_run_each_key_once(hosts_skewed):
    skew, (_kind, gateway, node, python, upstream, py_store, _) = hosts_skewed
    # What each host says of its own clock: the store's, within milliseconds, whatever its wall
    # clock says (the gateway's is checked by the in-flight answers below).
    clock = node(op="clock")
    assert abs(clock["wallOffsetMs"] + 60_000) < 5_000, clock
    assert clock["errorMs"] is not None and clock["errorMs"] < 1_000, clock

    # A claim by each host is in flight for the two others, whichever is ahead.
    for first, key in (("python", "s-py"), ("node", "s-node")):
        body = f'{{"order":"{key}"}}'.encode()
        fp = fingerprint_of(python, body)
        if first == "python":
            tag, claim = python.begin(f"anon/{key}", fp)
            assert tag == "proceed"
            assert node(op="begin", key=f"anon/{key}", fingerprint=fp)["tag"] == "in-flight"
        else:
            claim = node(op="begin", key=f"anon/{key}", fingerprint=fp)
            assert claim["tag"] == "proceed"
            assert python.begin(f"anon/{key}", fp)[0] == "in-flight"
        status, headers, _ = gateway.post(key, body)
        assert status == 409, (key, status, headers)
        assert int(headers["retry-after"]) <= LEASE_MS // 1000, headers
        assert upstream.calls.get(key) is None, "the gateway a minute ahead took the key over"

    # The gateway runs an order; its wall clock steps an hour forward mid-request, then back
    # two: the other hosts see it in flight all along, then replay its one answer.
    body = b'{"order":"s-gw"}'
    fp = fingerprint_of(python, body)
    answer = post_in_flight(gateway, upstream, "s-gw", body, delay_s=2.0)
    skew.set("gateway", 3_600)
    assert node(op="begin", key="anon/s-gw", fingerprint=fp)["tag"] == "in-flight"
    assert python.begin("anon/s-gw", fp)[0] == "in-flight"
    skew.set("gateway", -3_600)
    status, _, sent = answer()
    assert status == 201
    assert node(op="begin", key="anon/s-gw", fingerprint=fp)["tag"] == "replay"
    tag, replayed = python.begin("anon/s-gw", fp)
    assert tag == "replay" and bytes(replayed.body) == sent
    status, headers, again = gateway.post("s-gw", body)
    assert (status, again) == (201, sent) and headers["idempotent-replayed"] == "true"
    assert upstream.calls["s-gw"] == 1
