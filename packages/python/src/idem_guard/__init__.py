"""idem-guard: an idempotency guard for Python, the `idem:guard@0.3.0`
WebAssembly component hosted with wasmtime. The component's bytes ship in the
package, so a guard needs no file of its own::

    from idem_guard import Guard, Response

    guard = Guard()  # a MemoryStore; pass store=, lease_ms=, ... (clock=: a test's)
    outcome = guard.run("order-1", "cents=1000", lambda fence: Response(200, [], b"paid"))
    assert guard.run("order-1", "cents=1000", lambda fence: Response(500)).response.body == b"paid"

`Guard` is the synchronous API (its renewals run on a thread), `AsyncGuard`
the asyncio one (`await guard.run(...)`, renewals as asyncio tasks).
`idempotent_function` (and `idempotent`) decorate a function, Powertools-style;
`idem_guard.asgi.IdempotencyMiddleware` gives an ASGI app (Starlette, FastAPI)
the `idem serve` gateway's HTTP semantics. The
component is read from the `component=` argument, else the file named by
`$IDEM_COMPONENT`, else the one in the package.

Stores: `MemoryStore` here; Redis in `idem_guard.redis` (`RedisStore`,
`AsyncRedisStore`: the `redis` extra) and PostgreSQL in `idem_guard.postgres`
(`PostgresStore`, `AsyncPostgresStore`: the `postgres` extra), in the
on-store layout every idem host shares (wit/store-layout/). `AsyncGuard`
over an asynchronous store replays each call from a journal of the store's
answers (`idem_guard.journal`).

Time: a guard judges leases and retention by its store's time authority
(`store.clock`, `idem_guard.clock`), never this host's wall clock: the
Redis or PostgreSQL server's clock, read every second, or this process's
monotonic clock for a `MemoryStore`.
"""

from .aio import AsyncAttempt, AsyncGuard
from .clock import ClockUnknown, LocalClock, ManualClock, SyncedClock
from .functions import (
    AlreadyInProgress,
    IdempotencyError,
    IdempotencyKeyMissing,
    PayloadMismatch,
    ResultNotStored,
    StoreUnavailable,
    idempotent,
    idempotent_function,
)
from .guard import (
    DEFAULT_COMPONENT,
    Attempt,
    Decided,
    Guard,
    GuardError,
    MemoryStore,
    NotRecorded,
    Outcome,
    PurgeStats,
    SystemRandom,
)
from .observe import Decision
from .types import Checkpoint, Claim, Entry, Record, Response, StoreFault

__version__ = "0.3.0"

__all__ = [
    "DEFAULT_COMPONENT",
    "AlreadyInProgress",
    "AsyncAttempt",
    "AsyncGuard",
    "Attempt",
    "Checkpoint",
    "Claim",
    "ClockUnknown",
    "Decided",
    "Decision",
    "Entry",
    "Guard",
    "GuardError",
    "IdempotencyError",
    "IdempotencyKeyMissing",
    "LocalClock",
    "ManualClock",
    "MemoryStore",
    "NotRecorded",
    "Outcome",
    "PayloadMismatch",
    "PurgeStats",
    "Record",
    "Response",
    "ResultNotStored",
    "StoreFault",
    "StoreUnavailable",
    "SyncedClock",
    "SystemRandom",
    "idempotent",
    "idempotent_function",
]
