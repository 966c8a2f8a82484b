"""What a guard tells about its decisions: a log line, a callback, a span.

Every `Guard.run` / `AsyncGuard.run` ends in one `Decision` — `executed`,
`replayed`, `in-flight`, `conflict`, `unavailable` (the store could not
answer: nothing ran), `not-recorded` (the handler ran, its response could not
be stored) or `failed` (the handler raised; its key was released) — and the
guard reports it three ways, each optional:

- **logging**: to the `logger=` given (default `logging.getLogger("idem_guard")`):
  `unavailable` at WARNING and `not-recorded` at ERROR, with the store's own
  reason (which the HTTP adapters never put in a response body); the others at
  DEBUG. Each record carries `idem_key`, `idem_decision`, `idem_fence` and
  `idem_duration_ms` as attributes, for a structured formatter.
- **metrics**: `on_decision=` a callable (or a list of them) given each
  `Decision`; count, time or export it as you like. A callback that raises is
  logged at ERROR and never changes the call's outcome.
- **tracing**: with the `otel` extra (`opentelemetry-api`) and a tracer
  provider configured (the SDK's, or any), one span per guarded call, named
  `idem.run`, current while the handler runs (so its own spans nest under it),
  with `idem.key`, `idem.decision`, `idem.fence`, `idem.replayed` and, for a
  409, `idem.retry_after_ms`; its status is ERROR for `unavailable`,
  `not-recorded` and `failed` (the handler's exception recorded). Each store
  primitive the call made is a child span, `idem.store.get`, `.insert`,
  `.replace` or `.delete`, with `idem.key`, its latency, and ERROR with the
  exception when the store failed (over an asynchronous store, each primitive
  once, though the journal runs each export twice). Without the package,
  nothing is wrapped or checked. With it but no provider configured (the API's
  default proxy, or a no-op provider), no span is started: a call costs one
  `isinstance` check, and each store primitive a context-variable read (the
  store the component sees is wrapped in `TracedStore`). `tracing=False` turns
  it all off whatever is installed; `tracing=` a tracer provider uses that one
  instead of the global one.

    import logging
    from idem_guard import Guard

    seen = []
    guard = Guard(on_decision=seen.append, logger=logging.getLogger("payments.idem"))
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .guard import Outcome

try:  # the `otel` extra: the API only; an SDK (or any provider) configures where spans go
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - depends on the environment
    _trace = None  # type: ignore[assignment]

__all__ = ["AsyncTracedStore", "Decision", "DecisionHook", "Observer", "TracedStore"]

LOGGER = logging.getLogger("idem_guard")
T = TypeVar("T")

# The tracer of the guarded call under way in this context, while its span is current: a
# traced store makes a child span per primitive it answers (`TracedStore`).
_TRACER: ContextVar[Any] = ContextVar("idem_guard_tracer", default=None)


@dataclass(frozen=True)
class Decision:
    """One guarded call's end: what the guard decided for `key`, in `duration_ms`
    (the whole call, the handler included). `fence` is the claim's fence when
    the handler ran; `reason` the store's or the handler's error for
    `unavailable`, `not-recorded` and `failed`; `retry_after_ms` for `in-flight`."""

    key: str
    decision: str
    duration_ms: float
    fence: int | None = None
    reason: str | None = None
    retry_after_ms: int | None = None


DecisionHook = Callable[[Decision], Any]

_LEVELS = {"unavailable": logging.WARNING, "not-recorded": logging.ERROR}


class Observer:
    """A guard's logger, decision callbacks and tracer, applied around each `run`."""

    def __init__(
        self,
        logger: logging.Logger | None = None,
        on_decision: DecisionHook | Iterable[DecisionHook] | None = None,
        tracing: Any = None,
    ):
        self.logger = logger if logger is not None else LOGGER
        if on_decision is None:
            self.hooks: tuple[DecisionHook, ...] = ()
        elif callable(on_decision):
            self.hooks = (on_decision,)
        else:
            self.hooks = tuple(on_decision)
            for hook in self.hooks:
                if not callable(hook):
                    raise TypeError(f"on_decision takes callables; {hook!r} is not one")
        self.tracing = tracing is not False and _trace is not None
        # `tracing=` a tracer provider: that one, instead of the global one.
        self._given = None if tracing is None or isinstance(tracing, bool) else tracing
        self._provider: Any = None
        self._tracer: Any = None

    def tracer(self) -> Any:
        """The tracer of the configured provider, or None when no provider is configured."""
        if not self.tracing:
            return None
        provider = self._given if self._given is not None else _trace.get_tracer_provider()
        if provider is not self._provider:
            self._provider = provider
            if isinstance(provider, (_trace.ProxyTracerProvider, _trace.NoOpTracerProvider)):
                self._tracer = None
            else:
                from . import __version__

                self._tracer = provider.get_tracer("idem_guard", __version__)
        return self._tracer

    def run(self, key: str, call: Callable[[], Outcome]) -> Outcome:
        tracer = self.tracer()
        if tracer is None:
            return self._timed(key, call, None)
        with tracer.start_as_current_span("idem.run", record_exception=False, set_status_on_exception=False) as span:
            token = _TRACER.set(tracer)
            try:
                return self._timed(key, call, span)
            finally:
                _TRACER.reset(token)

    async def run_async(self, key: str, call: Callable[[], Awaitable[Outcome]]) -> Outcome:
        tracer = self.tracer()
        if tracer is None:
            return await self._timed_async(key, call, None)
        with tracer.start_as_current_span("idem.run", record_exception=False, set_status_on_exception=False) as span:
            token = _TRACER.set(tracer)
            try:
                return await self._timed_async(key, call, span)
            finally:
                _TRACER.reset(token)

    def _timed(self, key: str, call: Callable[[], Outcome], span: Any) -> Outcome:
        start = time.perf_counter_ns()
        try:
            outcome = call()
        except BaseException as e:
            self._failed(key, start, e, span)
            raise
        self._report(key, start, outcome, span)
        return outcome

    async def _timed_async(self, key: str, call: Callable[[], Awaitable[Outcome]], span: Any) -> Outcome:
        start = time.perf_counter_ns()
        try:
            outcome = await call()
        except BaseException as e:
            self._failed(key, start, e, span)
            raise
        self._report(key, start, outcome, span)
        return outcome

    def _report(self, key: str, start: int, outcome: Outcome, span: Any) -> None:
        if span is None and not self.hooks and not self.logger.isEnabledFor(_LEVELS.get(outcome.kind, logging.DEBUG)):
            return  # nobody listens: no Decision built (the usual case, on the hot path)
        self._emit(
            Decision(
                key,
                outcome.kind,
                (time.perf_counter_ns() - start) / 1e6,
                outcome.fence,
                outcome.message if outcome.kind == "unavailable" else None,
                outcome.retry_after_ms,
            ),
            span,
            None,
        )

    def _failed(self, key: str, start: int, error: BaseException, span: Any) -> None:
        from .guard import GuardError, NotRecorded

        if isinstance(error, GuardError) and error.kind == "invalid-input":
            if span is not None:
                span.set_attribute("idem.decision", "invalid-input")
            return  # the caller's mistake, raised to it: not a decision
        kind = "not-recorded" if isinstance(error, NotRecorded) else "failed"
        reason = str(error.error.detail) if isinstance(error, NotRecorded) else f"{type(error).__name__}: {error}"
        self._emit(Decision(key, kind, (time.perf_counter_ns() - start) / 1e6, None, reason), span, error)

    def _emit(self, decision: Decision, span: Any, error: BaseException | None) -> None:
        level = _LEVELS.get(decision.decision, logging.DEBUG)
        if self.logger.isEnabledFor(level):
            extra = {
                "idem_key": decision.key,
                "idem_decision": decision.decision,
                "idem_fence": decision.fence,
                "idem_duration_ms": decision.duration_ms,
            }
            tail = f": {decision.reason}" if decision.reason else ""
            self.logger.log(
                level, "idem %s key=%r in %.2f ms%s", decision.decision, decision.key, decision.duration_ms, tail, extra=extra
            )
        for hook in self.hooks:
            try:
                hook(decision)
            except Exception:
                self.logger.exception("idem on_decision hook %r raised on %s", hook, decision)
        if span is not None:
            span.set_attribute("idem.key", decision.key)
            span.set_attribute("idem.decision", decision.decision)
            span.set_attribute("idem.replayed", decision.decision == "replayed")
            if decision.fence is not None:
                span.set_attribute("idem.fence", decision.fence)
            if decision.retry_after_ms is not None:
                span.set_attribute("idem.retry_after_ms", decision.retry_after_ms)
            if decision.decision in ("unavailable", "not-recorded", "failed"):
                if error is not None:
                    span.record_exception(error)
                span.set_status(_trace.Status(_trace.StatusCode.ERROR, decision.reason or decision.decision))


def _store_span(tracer: Any, name: str, key: Any) -> Any:
    return tracer.start_as_current_span(
        f"idem.store.{name}", attributes={"idem.key": str(key)}, record_exception=True, set_status_on_exception=True
    )


class TracedStore:
    """A synchronous store whose primitives, called within a traced guard call, each make a
    child span `idem.store.{get,insert,replace,delete}` (its latency, `idem.key`, ERROR with
    the exception when the store fails); outside one they are the store's own calls. Any
    other attribute is the store's."""

    def __init__(self, store: Any):
        self.inner = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _traced(self, name: str, args: tuple[Any, ...]) -> Any:
        tracer = _TRACER.get()
        if tracer is None:
            return getattr(self.inner, name)(*args)
        with _store_span(tracer, name, args[0]):
            return getattr(self.inner, name)(*args)

    def get(self, *args: Any) -> Any:
        return self._traced("get", args)

    def insert(self, *args: Any) -> Any:
        return self._traced("insert", args)

    def replace(self, *args: Any) -> Any:
        return self._traced("replace", args)

    def delete(self, *args: Any) -> Any:
        return self._traced("delete", args)


class AsyncTracedStore(TracedStore):
    """`TracedStore` for an asynchronous store: each primitive awaited within its span."""

    async def _atraced(self, name: str, args: tuple[Any, ...]) -> Any:
        tracer = _TRACER.get()
        if tracer is None:
            return await getattr(self.inner, name)(*args)
        with _store_span(tracer, name, args[0]):
            return await getattr(self.inner, name)(*args)

    async def get(self, *args: Any) -> Any:
        return await self._atraced("get", args)

    async def insert(self, *args: Any) -> Any:
        return await self._atraced("insert", args)

    async def replace(self, *args: Any) -> Any:
        return await self._atraced("replace", args)

    async def delete(self, *args: Any) -> Any:
        return await self._atraced("delete", args)
