"""What a guard tells about its decisions (idem_guard.observe): a log record
and an `on_decision` callback per call, and OpenTelemetry spans received over
OTLP/HTTP by a receiver the test starts (the SDK's OTLP/HTTP exporter, as an
application would configure it). Also the warning for a MemoryStore under
several worker processes (idem_guard.workers)."""

from __future__ import annotations

import asyncio
import http.server
import logging
import os
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from idem_guard import AsyncGuard, Guard, MemoryStore, Response
from idem_guard.observe import Decision

otlp = pytest.importorskip("opentelemetry.exporter.otlp.proto.http.trace_exporter")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402


def test_each_call_is_one_decision_to_the_callbacks_and_the_log(caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    seen: list[Decision] = []
    guard = Guard(store=store, on_decision=[seen.append, lambda d: 1 / 0])  # a broken hook changes nothing
    caplog.set_level(logging.DEBUG, logger="idem_guard")
    ok = Response(201, [], b"paid")
    assert guard.run("k", "f", lambda fence: ok).kind == "executed"
    assert guard.run("k", "f", lambda fence: ok).kind == "replayed"
    assert guard.run("k", "g", lambda fence: ok).kind == "conflict"
    with pytest.raises(ValueError):
        guard.run("bad", "f", lambda fence: (_ for _ in ()).throw(ValueError("card declined")))
    store.fault("get", kind="error", message="connection refused")
    store.fault("insert", kind="error", message="connection refused")
    assert guard.run("down", "f", lambda fence: ok).kind == "unavailable"
    assert [d.decision for d in seen] == ["executed", "replayed", "conflict", "failed", "unavailable"]
    assert seen[0].fence is not None and seen[0].fence > 0 and seen[0].duration_ms >= 0
    assert seen[3].reason == "ValueError: card declined"
    assert "connection refused" in (seen[4].reason or "")
    records = [r for r in caplog.records if r.name == "idem_guard" and hasattr(r, "idem_decision")]
    assert [(r.levelname, r.idem_decision) for r in records] == [  # type: ignore[attr-defined]
        ("DEBUG", "executed"), ("DEBUG", "replayed"), ("DEBUG", "conflict"), ("DEBUG", "failed"), ("WARNING", "unavailable"),
    ]
    assert any("on_decision hook" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)


class Receiver:
    """An OTLP/HTTP receiver on port 0: every POST to /v1/traces decoded into its spans."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        received = self.spans

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        received.extend((scope.scope.name, span) for span in scope.spans)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def attributes(span: Any) -> dict[str, Any]:
    out = {}
    for kv in span.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


def test_spans_per_guarded_call_reach_an_otlp_receiver(receiver: Receiver) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(otlp.OTLPSpanExporter(endpoint=receiver.url)))
    tracer = provider.get_tracer("the-app")
    store = MemoryStore()
    guard = Guard(store=store, tracing=provider)
    aguard = AsyncGuard(store=store, tracing=provider)

    def charge(fence: int) -> Response:
        with tracer.start_as_current_span("charge card"):  # the handler's own span nests under idem.run
            return Response(201, [], b"paid")

    guard.run("order-1", "f", charge)
    guard.run("order-1", "f", charge)

    async def main() -> None:
        await aguard.run("order-2", "f", lambda fence: Response(201, [], b"async"))
        with pytest.raises(RuntimeError):
            await aguard.run("order-3", "f", lambda fence: (_ for _ in ()).throw(RuntimeError("gateway down")))

    asyncio.run(main())
    store.fault("get", kind="error", message="store down")
    store.fault("insert", kind="error", message="store down")
    guard.run("order-4", "f", charge)
    provider.shutdown()

    spans = receiver.spans
    runs = [span for scope, span in spans if span.name == "idem.run"]
    assert all(scope == "idem_guard" for scope, span in spans if span.name == "idem.run")
    assert [attributes(s)["idem.decision"] for s in runs] == ["executed", "replayed", "executed", "failed", "unavailable"]
    assert [attributes(s)["idem.key"] for s in runs] == ["order-1", "order-1", "order-2", "order-3", "order-4"]
    assert attributes(runs[0])["idem.fence"] > 0 and attributes(runs[1])["idem.replayed"] is True
    assert [s.status.code for s in runs] == [0, 0, 0, 2, 2]  # UNSET, ..., ERROR for the failed and the unavailable
    assert "store down" in runs[4].status.message
    assert [e.name for e in runs[3].events] == ["exception"]
    (child,) = [span for _, span in spans if span.name == "charge card"]
    assert child.parent_span_id == runs[0].span_id and child.trace_id == runs[0].trace_id
    # Each store primitive the guard called is a child span of its run, with its latency.
    store_spans = [span for _, span in spans if span.name.startswith("idem.store.")]
    under = {run.span_id: [s.name for s in store_spans if s.parent_span_id == run.span_id] for run in runs}
    assert under[runs[0].span_id] == ["idem.store.insert", "idem.store.replace"], under
    assert under[runs[1].span_id] == ["idem.store.insert"], under  # the replay: the claim finds the record
    assert all(s.end_time_unix_nano >= s.start_time_unix_nano for s in store_spans)
    failed = [s for s in store_spans if s.parent_span_id == runs[4].span_id]
    assert failed and failed[0].status.code == 2, failed  # the store's own failure: ERROR


def test_an_async_store_behind_the_journal_is_traced_once_per_primitive(receiver: Receiver) -> None:
    from stores import AsyncMemory

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(otlp.OTLPSpanExporter(endpoint=receiver.url)))
    guard = AsyncGuard(store=AsyncMemory(), tracing=provider)
    assert guard.replays

    async def main() -> None:
        await guard.run("a-1", "f", lambda fence: Response(201, [], b"ok"))

    asyncio.run(main())
    provider.shutdown()
    (run,) = [span for _, span in receiver.spans if span.name == "idem.run"]
    children = [span.name for _, span in receiver.spans if span.parent_span_id == run.span_id]
    # Each primitive once, though the journal runs each export twice.
    assert children == ["idem.store.insert", "idem.store.replace"], children


GLOBAL = r"""
import sys
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from idem_guard import Guard, Response

guard = Guard()
assert guard.observer.tracer() is None, "no provider configured: no tracer, no span"
guard.run("before", "f", lambda fence: Response(200))
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sys.argv[1])))
trace.set_tracer_provider(provider)
guard.run("after", "f", lambda fence: Response(200))
Guard(tracing=False).run("off", "f", lambda fence: Response(200))
provider.shutdown()
"""


def test_the_global_provider_is_used_once_configured_and_nothing_before(receiver: Receiver) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", GLOBAL, receiver.url], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [attributes(s)["idem.key"] for _, s in receiver.spans if s.name == "idem.run"] == ["after"]


def test_a_memory_store_under_several_workers_warns_loudly(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("WEB_CONCURRENCY", "4")
    with pytest.warns(RuntimeWarning, match=r"MemoryStore .* several worker processes \(WEB_CONCURRENCY=4\)"):
        Guard(store=MemoryStore())
    assert any("RedisStore" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    monkeypatch.delenv("WEB_CONCURRENCY")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Guard(store=MemoryStore())  # one process: silent


FORKED = r"""
import os, threading, warnings
from idem_guard import Guard, Response
guard = Guard()
guard.run("k", "f", lambda fence: Response(200))
# Another thread keeps using the guard while this one forks, as a server's threads do: a lock
# it holds at the fork must not stay held in the child.
busy = threading.Event()
def load():
    n = 0
    while not busy.is_set():
        n += 1
        guard.run(f"bg{n}", "f", lambda fence: Response(200))
threading.Thread(target=load, daemon=True).start()
for i in range(10):
    pid = os.fork()
    if pid == 0:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outcome = guard.run(f"child{i}", "f", lambda fence: Response(200))
        os._exit(0 if outcome.kind == "executed" and any("os.fork()" in str(w.message) for w in caught) else 3)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"child {i} exited {os.waitstatus_to_exitcode(status)}")
busy.set()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")
def test_a_guard_made_before_a_fork_works_in_the_child_and_its_memory_store_warns() -> None:
    """Ten forks while another thread runs the guard: every child's call completes (the guard's
    and its renewer's locks are new in the child) and warns that its MemoryStore is a copy."""
    done = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
