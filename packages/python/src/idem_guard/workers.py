"""A `MemoryStore` is one process's dict: under several worker processes
(uvicorn or gunicorn `--workers N`, a forked pool) each worker has its own, so
two workers given one key both run it. The package cannot see every server's
workers, so it looks for the signs it can and warns loudly — a
`RuntimeWarning` and a WARNING on the `idem_guard` logger — naming the sign:

- `WEB_CONCURRENCY` above 1 (the worker count uvicorn and gunicorn read);
- `SERVER_SOFTWARE` naming gunicorn (its workers are forked processes);
- this process was started by `multiprocessing` (uvicorn `--workers`, and
  also its `--reload` child: a false alarm there, since one process serves);
- a `MemoryStore` created before an `os.fork()` and used after it, in the child.

The first three are checked when a guard is made over a `MemoryStore`, the
last at the store's first call in the child; each store warns at most once
per process. Use `RedisStore` or `PostgresStore` (or their async twins) under
several workers.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import warnings
import weakref
from typing import Any

__all__ = ["fork_generation", "reset_after_fork", "warn_if_shared_memory", "worker_sign"]

LOGGER = logging.getLogger("idem_guard")

_generation = 0

# Objects whose locks and threads a forked child must not inherit: a lock another thread held
# at the fork stays held for ever in the child (a guard made before gunicorn's fork, say).
# Each gets new ones in the child (`_after_fork`).
_FORK_RESETS: weakref.WeakSet[Any] = weakref.WeakSet()


def reset_after_fork(resettable: Any) -> None:
    """Has `resettable._after_fork()` called in every forked child while it lives (held weakly)."""
    _FORK_RESETS.add(resettable)


def _forked() -> None:
    global _generation
    _generation += 1
    for resettable in list(_FORK_RESETS):
        resettable._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def fork_generation() -> int:
    """How many forks lie between the first process and this one (0 in the first)."""
    return _generation


def worker_sign() -> str | None:
    """Why this process looks like one of several workers, or None."""
    concurrency = os.environ.get("WEB_CONCURRENCY", "")
    if concurrency.isdigit() and int(concurrency) > 1:
        return f"WEB_CONCURRENCY={concurrency}"
    if "gunicorn" in os.environ.get("SERVER_SOFTWARE", "").lower():
        return f"SERVER_SOFTWARE={os.environ['SERVER_SOFTWARE']!r} (gunicorn forks its workers)"
    parent = multiprocessing.parent_process()
    if parent is not None:
        return f"this process was started by multiprocessing from process {parent.pid} (uvicorn --workers does so)"
    return None


def warn(store: Any, sign: str) -> None:
    if getattr(store, "_warned_pid", None) == os.getpid():
        return
    store._warned_pid = os.getpid()
    message = (
        f"idem_guard: a MemoryStore is one process's memory, and this looks like one of several worker "
        f"processes ({sign}): each worker has its own store, so the same key can run once per worker. "
        "Use idem_guard.redis.RedisStore or idem_guard.postgres.PostgresStore (or their async twins) "
        "to share keys between processes."
    )
    LOGGER.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=4)


def warn_if_shared_memory(store: Any) -> None:
    """Warns when `store` is a `MemoryStore` and this process looks like one of several workers."""
    from .guard import MemoryStore

    if isinstance(store, MemoryStore) and (sign := worker_sign()) is not None:
        warn(store, sign)
