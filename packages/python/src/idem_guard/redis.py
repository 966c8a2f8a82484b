"""Records in Redis (or Valkey), in the on-store layout of `wit/store-layout/`
(its README is the spec): guards in Rust (`idem serve`), Node.js and Python
pointed at the same server and prefix share their keys. Needs the `redis`
extra (`pip install 'idem-guard[redis]'`)::

    from idem_guard import Guard
    from idem_guard.redis import RedisStore

    with RedisStore("redis://127.0.0.1:6379/0", prefix="shop:") as store:
        guard = Guard(store=store)
        outcome = guard.run("order-1", "cents=1000", charge)

`RedisStore` (redis-py) is for `Guard`: the component's imports call it
inline. `AsyncRedisStore` (`redis.asyncio`) is for `AsyncGuard`, which
replays each call from a journal of the store's answers
(`idem_guard.journal`) so that the loop never waits on a socket. Both open
their connections with redis-py (address, TLS, AUTH, SELECT, protocol) and
then send the commands and parse the replies themselves (`_pack`, `_parse`):
`RedisStore` on the connection's socket, `AsyncRedisStore` as the protocol
of its transport (one pipelined connection per event loop).

Each primitive is one native command, or a script of the layout's
(`EVALSHA`, with `SCRIPT LOAD` on `NOSCRIPT`): a claim is
`SET {prefix}{key} value NX GET PX ttl`, one round trip; a completion is the
`replace` script — or, on a server with `SET … IFEQ` (Valkey 8.1+, asked
once, at the first completion of a record whose bytes the store knows), the
one command `SET key new IFEQ old PX ttl`, whenever the store holds the bytes
of the record at the expected version (those of every unfinished record it
last wrote or read, at most 65,536 keys: a completion after its own claim
always does). Other bytes mean another writer came between: refused, as the
script would. `cas="script"` always runs the script; `store.native_cas` says
which. Expiry is compared with the `now_ms` the guard passes, never a clock
a script reads; every write sets `PX` to the record's remaining life by the
guard's clock plus `grace_ms` (default 60 000), so Redis frees the space by
itself.

The guard's clock is the store's (`store.clock`, a `SyncedClock`: the time
authority of wit/clock.wit): the server's `TIME`, through the layout's
`time.lua` on the key `{prefix}\x01clock` (on a cluster, the node of that
slot), read when `RedisStore` opens (`AsyncRedisStore`: at its first guard
call, or `async with`) and every `clock_sync_ms` after (default 1 000), on a
daemon thread or a task of the event loop, and carried between readings by
the boot clock. So every host on the server judges leases by one clock,
whatever its own wall clock says. Until it has been read once, every guard
call fails closed naming why.

Failures: a refused connection, a timeout (`timeout_ms`, default 2000) or any
error reply is `StoreFault("unavailable")`, and the guard fails closed;
commands are not retried by the client (a write whose reply was lost may
have been applied: the guard's read-back sorts that out). A value that does
not decode, or a key holding another Redis type, is `StoreFault("corrupt")`
naming the key.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import os
import select
import struct
import threading
from collections import deque
from collections.abc import Callable, Generator
from typing import Any

try:
    import redis as _redis
    import redis.asyncio as _aredis
    from redis._parsers.base import BaseParser
    from redis.asyncio.retry import Retry as _AsyncRetry
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as _ConnectionError
    from redis.exceptions import InvalidResponse, NoScriptError, RedisError, ResponseError
    from redis.exceptions import TimeoutError as _TimeoutError
    from redis.retry import Retry
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("idem_guard.redis needs redis-py: pip install 'idem-guard[redis]'") from e

from . import layout
from .clock import CLOCK_SYNC_MS, SyncedClock
from .steps import AsyncSteps, Steps
from .types import Checkpoint, Entry, Record, Response, StoreFault

__all__ = ["AsyncRedisStore", "RedisStore", "decode", "encode"]

NAME = "redis"
U64_MAX = (1 << 64) - 1
# "{version} {expires_at_ms}\n" fits in this many bytes; the scripts read bytes 0..=41.
HEADER_MAX = 42
DEFAULT_GRACE_MS = 60_000
DEFAULT_TIMEOUT_MS = 2_000
# How many records' bytes a store keeps for `SET … IFEQ` before it forgets them all (as the Rust store).
SEEN_MAX = 65_536
_READ = 65_536  # bytes per recv: a record up to the guard's 1 MiB response limit takes a few
# What a reply may announce before it is read: a string up to Redis's 512 MiB, an array far past the
# store's replies (at most 2 elements). More is a stream out of step: failed at once, not buffered for.
_MAX_BULK = 512 * 1024 * 1024
_MAX_ARRAY = 1024

_U16, _U32, _U64 = struct.Struct(">H"), struct.Struct(">I"), struct.Struct(">Q")
_STATES = ("processing", "done")


# --- the value: a record as the string stored for it, and back -------------


def _put(out: bytearray, data: bytes) -> None:
    out += _U32.pack(len(data))
    out += data


def encode(version: int, record: Record) -> bytes:
    """The value stored for `record` at `version` (the layout's `value`)."""
    out = bytearray(b"%d %d\n" % (version, record.expires_at_ms))
    out += _U64.pack(record.lease_until_ms)
    out.append(_STATES.index(record.state))
    _put(out, record.fingerprint.encode())
    r = record.response
    if r is None:
        out.append(0)
    else:
        out.append(1)
        out += _U16.pack(r.status)
        out += _U32.pack(len(r.headers))
        for name, value in r.headers:
            _put(out, name.encode())
            _put(out, bytes(value))
        _put(out, bytes(r.body))
    out += _U64.pack(record.holder)
    c = record.checkpoint
    if c is None:
        out.append(0)
    else:
        out.append(1)
        _put(out, c.phase.encode())
        _put(out, bytes(c.data))
    return bytes(out)


def time_ms(seconds: int, microseconds: int) -> int:
    """A `TIME` reply (`[seconds, microseconds]`) in milliseconds since the Unix epoch, as the layout reads it."""
    return seconds * 1000 + microseconds // 1000


def header(value: bytes) -> tuple[int, int, int] | None:
    """The header's length with its newline, the version and the expiry; None if it does not decode."""
    end = value.find(b"\n", 0, HEADER_MAX)
    if end < 0:
        return None
    version, space, expires = value[:end].partition(b" ")
    if not space or not version.isdigit() or not expires.isdigit():  # ASCII digits only: bytes.isdigit
        return None
    version_n, expires_n = int(version), int(expires)
    if version_n > U64_MAX or expires_n > U64_MAX:
        return None
    return end + 1, version_n, expires_n


class _Corrupt(Exception):
    pass


class _Reader:
    def __init__(self, data: bytes, at: int):
        self.data, self.at = data, at

    def take(self, n: int, what: str) -> bytes:
        if self.at + n > len(self.data):
            raise _Corrupt(f"ends inside {what}")
        part = self.data[self.at : self.at + n]
        self.at += n
        return part

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u16(self, what: str) -> int:
        value: int = _U16.unpack(self.take(2, what))[0]
        return value

    def u64(self, what: str) -> int:
        value: int = _U64.unpack(self.take(8, what))[0]
        return value

    def blob(self, what: str) -> bytes:
        (n,) = _U32.unpack(self.take(4, f"the length of {what}"))
        return self.take(n, what)

    def text(self, what: str) -> str:
        try:
            return self.blob(what).decode("utf-8")
        except UnicodeDecodeError as e:
            raise _Corrupt(f"has {what} that is not UTF-8") from e

    def done(self) -> bool:
        return self.at == len(self.data)


def _corrupt(key: str, why: str) -> StoreFault:
    return StoreFault("corrupt", f"{NAME}: the record of key {key!r} {why}")


def decode(key: str, value: bytes) -> Entry:
    """The entry `value` holds; `StoreFault("corrupt")` naming `key` when it does not decode."""
    head = header(value)
    if head is None:
        raise _corrupt(key, 'has no "{version} {expires_at_ms}" header')
    start, version, expires_at_ms = head
    try:
        r = _Reader(value, start)
        lease_until_ms = r.u64("the lease")
        state = r.u8("the state")
        if state > 1:
            raise _Corrupt(f"has an unknown state {state}")
        fingerprint = r.text("the fingerprint")
        flag = r.u8("the response flag")
        response = None
        if flag == 1:
            status = r.u16("the status")
            (count,) = _U32.unpack(r.take(4, "the header count"))
            headers = [(r.text("a header name"), r.blob("a header value")) for _ in range(count)]
            response = Response(status, headers, r.blob("the body"))
        elif flag != 0:
            raise _Corrupt(f"has an unknown response flag {flag}")
        holder, checkpoint = 0, None  # a 0.1 host's value ends after the response
        if not r.done():
            holder = r.u64("the holder")
            flag = r.u8("the checkpoint flag")
            if flag == 1:
                checkpoint = Checkpoint(r.text("the checkpoint's phase"), r.blob("the checkpoint's data"))
            elif flag != 0:
                raise _Corrupt(f"has an unknown checkpoint flag {flag}")
            if not r.done():
                raise _Corrupt(f"has {len(value) - r.at} bytes after the checkpoint")
    except _Corrupt as e:
        raise _corrupt(key, str(e)) from None
    record = Record(fingerprint, _STATES[state], holder, lease_until_ms, expires_at_ms, response, checkpoint)
    return Entry(record, version)


# --- the primitives, once: each a generator of commands ----------------------
#
# A primitive yields the commands it sends (a tuple of arguments, or a
# `_Script`) and receives each reply; the sync and the async store only carry
# the commands out. So the layout's logic is written once for both.


class _Script:
    """`EVALSHA` of one of the layout's scripts on one key."""

    __slots__ = ("args", "key", "name")

    def __init__(self, name: str, key: str, *args: Any):
        self.name, self.key, self.args = name, key, args


class _Probe:
    """Whether the server has `SET … IFEQ` (Valkey 8.1 and later): `SET` of a
    probe key that holds no record (a control character no idem key has)
    `IFEQ` a value, which never creates a key, so the probe writes nothing.
    Answered True, or False on an error reply (Redis 7's syntax error)."""

    __slots__ = ("args",)

    def __init__(self, prefix: str):
        self.args = ("SET", prefix + "\x01ifeq-probe", "probe", "IFEQ", "probe")


class _Set:
    """`SET key value NX GET PX ttl`: the claim."""

    __slots__ = ("key", "ttl", "value")

    def __init__(self, key: str, value: bytes, ttl: int):
        self.key, self.value, self.ttl = key, value, ttl


_Steps = Generator[Any, Any, Any]
_Batches = Generator[tuple[tuple[Any, ...], ...], list[Any], Any]
_HEADLESS = 'has no "{version} {expires_at_ms}" header'


class _Layout:
    """What both stores share: options, scripts, and the primitives as command sequences."""

    # The client each store opens for itself from a URL: redis-py's sync or asyncio one.
    _client_class: Any
    _retry_class: Any

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379",
        *,
        prefix: str = "",
        grace_ms: int = DEFAULT_GRACE_MS,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        client: Any = None,
        max_connections: int | None = None,
        cas: str = "auto",
        clock_sync_ms: int = CLOCK_SYNC_MS,
    ):
        if grace_ms < 0 or timeout_ms < 1:
            raise ValueError("grace_ms must be at least 0 and timeout_ms at least 1")
        if cas not in ("auto", "script"):
            raise ValueError(f"cas {cas!r} is not one of 'auto', 'script'")
        # The store's time authority (wit/clock.wit): the server's TIME, read by the store itself.
        self.clock = SyncedClock("the Redis server's clock (TIME)", clock_sync_ms)
        # SET … IFEQ (Valkey 8.1+): whether the server has it (None: not asked yet, at the first
        # completion of a record whose bytes are known), and those bytes, `full key -> (version, value)`,
        # of every unfinished record the store last wrote or read.
        self._native: bool | None = None if cas == "auto" else False
        self._seen: dict[str, tuple[int, bytes]] = {}
        self._seen_lock = threading.Lock()
        self.prefix = prefix
        self.grace_ms = grace_ms
        self.timeout_ms = timeout_ms
        self._scripts = {name: layout.redis_script(name) for name in ("claim_expired", "replace", "delete_at", "purge", "time")}
        self._shas = {name: hashlib.sha1(text.encode()).hexdigest() for name, text in self._scripts.items()}
        # `client` as given (its owner closes it), else one of the store's own (it closes it).
        self._owned = client is None
        if client is None:
            # No retries inside the client: a retried write whose first reply was lost
            # would be applied twice; the guard fails closed and its read-back decides.
            client = self._client_class.from_url(
                url,
                max_connections=max_connections,
                retry=self._retry_class(NoBackoff(), 0),
                socket_timeout=timeout_ms / 1000,
                socket_connect_timeout=timeout_ms / 1000,
                retry_on_timeout=False,
            )
        if client.get_connection_kwargs().get("decode_responses"):
            raise ValueError("the redis client must not decode responses (decode_responses=False): values are bytes")
        self.client = client
        self._opened()

    def _opened(self) -> None:
        """What a store sets up once it has its client."""

    @property
    def native_cas(self) -> bool | None:
        """Whether completions use the server's `SET … IFEQ` rather than the script
        (None until the first completion of a record whose bytes the store knows asks the server)."""
        return self._native

    def _remember(self, full: str, version: int, state: str, value: bytes) -> None:
        """Notes the bytes of the record at `version` (an unfinished one: a done record is not written again)."""
        if self._native is False:
            return
        with self._seen_lock:
            if state == "done":
                self._seen.pop(full, None)
                return
            if len(self._seen) >= SEEN_MAX and full not in self._seen:
                self._seen.clear()
            self._seen[full] = (version, value)

    def _recall(self, full: str, version: int) -> bytes | None:
        """The bytes of the record at `version`, when known; taken out, so a concurrent replace of the key runs the script."""
        with self._seen_lock:
            known = self._seen.get(full)
            if known is None or known[0] != version:
                return None
            del self._seen[full]
            return known[1]

    def _ttl(self, record: Record, now_ms: int) -> int:
        """PX: the record's remaining life by the guard's clock, plus the grace (u64 arithmetic, as in Rust)."""
        return min(U64_MAX, max(1, max(0, record.expires_at_ms - now_ms) + self.grace_ms))

    def _get(self, key: str, now_ms: int) -> _Steps:
        full = self.prefix + key
        value = yield ("GET", full)
        if value is None:
            return None
        entry = decode(key, value)
        if now_ms >= entry.record.expires_at_ms:
            return None
        self._remember(full, entry.version, entry.record.state, value)
        return entry

    def _insert(self, key: str, record: Record, now_ms: int) -> _Steps:
        full = self.prefix + key
        ttl = self._ttl(record, now_ms)
        value = encode(1, record)
        held = yield _Set(full, value, ttl)
        if held is None:
            self._remember(full, 1, record.state, value)
            return 1
        entry = decode(key, held)
        if now_ms < entry.record.expires_at_ms:
            self._remember(full, entry.version, entry.record.state, held)
            return entry
        # Expired by the guard's clock, still held by Redis (the grace period).
        start = value.index(b"\n") + 1
        reply = yield _Script("claim_expired", full, now_ms, ttl, record.expires_at_ms, value[start:])
        if isinstance(reply, list) and reply and reply[0] == 0 and len(reply) == 2 and isinstance(reply[1], int):
            if self._native is not False:
                self._remember(full, reply[1], record.state, encode(reply[1], record))
            return reply[1]
        if isinstance(reply, list) and len(reply) == 2 and reply[0] == 1 and isinstance(reply[1], bytes):
            live = decode(key, reply[1])
            self._remember(full, live.version, live.record.state, reply[1])
            return live
        if reply == [2]:
            raise _corrupt(key, _HEADLESS)
        raise StoreFault("unavailable", f"{NAME}: unexpected reply to the claim_expired script: {reply!r}")

    def _replace(self, key: str, expected_version: int, record: Record, now_ms: int) -> _Steps:
        version = expected_version + 1
        if version > U64_MAX:
            return False  # a refused replace, not an error
        full, ttl, value = self.prefix + key, self._ttl(record, now_ms), encode(version, record)
        old = self._recall(full, expected_version)
        if old is not None and self._native is None:
            self._native = yield _Probe(self.prefix)
        if old is not None and self._native:
            # The exact bytes at that version: the server compares them whole, and the expiry is theirs.
            head = header(old)
            if head is None or head[2] <= now_ms:
                return False
            written = yield ("SET", full, value, "IFEQ", old, "PX", ttl)
            if not written:  # nil (redis-py's SET callback may make it False): another writer's bytes
                return False
            self._remember(full, version, record.state, value)
            return True
        reply = yield _Script("replace", full, expected_version, now_ms, ttl, value)
        if reply == 1:
            self._remember(full, version, record.state, value)
            return True
        if reply == 0:
            return False
        if reply == -1:
            raise _corrupt(key, _HEADLESS)
        raise StoreFault("unavailable", f"{NAME}: unexpected reply to the replace script: {reply!r}")

    def _delete(self, key: str, expected_version: int | None, now_ms: int) -> _Steps:
        with self._seen_lock:
            self._seen.pop(self.prefix + key, None)
        # Live at now_ms only (an expired record Redis still holds is left alone), at the version unless "".
        version = "" if expected_version is None else expected_version
        removed = yield _Script("delete_at", self.prefix + key, version, now_ms)
        return isinstance(removed, int) and removed > 0

    def _time(self) -> _Steps:
        """The server's TIME through the layout's `time.lua`, on the key `{prefix}\\x01clock` (on a
        cluster, every host asks the node of that slot), in milliseconds since the Unix epoch."""
        reply = yield _Script("time", self.prefix + "\x01clock")
        if isinstance(reply, list) and len(reply) == 2 and all(isinstance(p, bytes) and p.isdigit() for p in reply):
            return time_ms(int(reply[0]), int(reply[1]))
        raise StoreFault("unavailable", f"{NAME}: unexpected reply to the time script: {reply!r}")

    def _batches(self, command: Any) -> _Batches:
        """One command of a primitive as what goes over the wire: yields batches of
        commands (argument tuples, written at once and answered in order), is sent
        their replies (an error reply as redis-py's exception, not raised), and
        returns the reply the primitive gets. A script the server does not hold
        (`NOSCRIPT`) is loaded and run again in one batch. Written once for the sync
        and the async store, which only carry the batches out (`_pipeline`)."""
        if isinstance(command, _Probe):
            (probed,) = yield (command.args,)
            if isinstance(probed, ResponseError):
                return False
            return True
        if isinstance(command, _Set):
            args: tuple[Any, ...] = ("SET", command.key, command.value, "NX", "GET", "PX", command.ttl)
        elif isinstance(command, _Script):
            args = ("EVALSHA", self._shas[command.name], 1, command.key, *command.args)
        else:
            args = tuple(command)
        (reply,) = yield (args,)
        if isinstance(reply, NoScriptError):
            loaded, reply = yield (("SCRIPT", "LOAD", self._scripts[command.name]), args)
            if isinstance(loaded, ResponseError):
                raise loaded
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    def _fault(self, error: Exception, key: str) -> StoreFault:
        if isinstance(error, ResponseError) and "WRONGTYPE" in str(error):
            return _corrupt(key, "is a Redis value that is not a string: not an idem record")
        return StoreFault("unavailable", f"{NAME}: {type(error).__name__}: {error}")


def _pack(args: tuple[Any, ...]) -> bytes:
    """A command as RESP, an array of bulk strings: what redis-py's packer
    writes for these arguments (str as UTF-8, the layout's encoding of keys;
    int in decimal; bytes as they are), in one join."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, str):
            arg = arg.encode()
        elif isinstance(arg, int):
            arg = b"%d" % arg
        parts.append(b"$%d\r\n%b\r\n" % (len(arg), arg))
    return b"".join(parts)


if hasattr(select, "poll"):

    def _readable(sock: Any) -> bool:
        """Whether a socket has something to read (or was closed by its peer), without waiting."""
        poll = select.poll()  # not select(): it refuses descriptors past FD_SETSIZE
        poll.register(sock, select.POLLIN)
        return bool(poll.poll(0))

else:  # pragma: no cover - Windows, where select() takes any socket

    def _readable(sock: Any) -> bool:
        """Whether a socket has something to read (or was closed by its peer), without waiting."""
        return bool(select.select((sock,), (), (), 0)[0])


class _Incomplete(Exception):
    """The reply does not end in the bytes read so far."""


def _exchange(sock: Any, command: bytes, count: int = 1) -> Any:
    """Sends packed commands and reads their `count` replies (one reply, or a
    list of `count`; an error reply comes back as redis-py's exception for it,
    not raised). Socket failures are redis-py's `TimeoutError` and `ConnectionError`."""
    try:
        sock.sendall(command)
        data = b""
        while True:
            more = sock.recv(_READ)
            if not more:
                raise _ConnectionError("Connection closed by server.")
            data += more
            replies = _replies(data, count)
            if replies is not _INCOMPLETE:
                return replies
    except TimeoutError as e:
        raise _TimeoutError("Timeout talking to the server") from e
    except OSError as e:
        raise _ConnectionError(f"Error talking to the server: {e}") from e


def _replies(data: bytes, count: int) -> Any:
    """The `count` replies in `data` (one reply when `count` is 1), or `_INCOMPLETE` while one is."""
    try:
        replies, at = _parse_many(data, 0, count)
    except _Incomplete:
        return _INCOMPLETE
    if at != len(data):  # so many commands, so many replies: anything more is out of step
        raise InvalidResponse(f"{len(data) - at} bytes after the reply")
    return replies


_INCOMPLETE = object()


def _parse_many(data: bytes, at: int, count: int) -> tuple[Any, int]:
    """`count` replies from `data[at:]` (the reply itself when `count` is 1, else a list) and where
    they end; `_Incomplete` while one is, `InvalidResponse` for bytes that are not RESP."""
    try:
        if count == 1:
            return _parse(data, at)
        replies = []
        for _ in range(count):
            value, at = _parse(data, at)
            replies.append(value)
        return replies, at
    except ValueError as e:  # a length or an integer that is not one
        raise InvalidResponse(f"a reply that is not RESP: {e}") from e


def _parse(data: bytes, at: int) -> tuple[Any, int]:
    """The RESP2 or RESP3 reply at `data[at:]` and where it ends: the types
    the layout's commands and scripts answer with (bulk and simple strings as
    bytes, integers, arrays, nulls, errors)."""
    end = data.find(b"\r\n", at)
    if end < 0:
        raise _Incomplete
    kind, line, at = data[at], data[at + 1 : end], end + 2
    if kind == 0x24 or kind == 0x21:  # `$` bulk string, `!` bulk error
        n = int(line)
        if n > _MAX_BULK:
            raise InvalidResponse(f"a string of {n} bytes, over Redis's 512 MiB")
        if n < 0:
            return None, at
        if at + n + 2 > len(data):
            raise _Incomplete
        value = data[at : at + n]
        return (value if kind == 0x24 else _error(value)), at + n + 2
    if kind == 0x3A:  # `:` integer
        return int(line), at
    if kind == 0x2A:  # `*` array
        count = int(line)
        if count > _MAX_ARRAY:
            raise InvalidResponse(f"an array of {count} elements, over the {_MAX_ARRAY} a store's reply may have")
        items = []
        for _ in range(count):
            item, at = _parse(data, at)
            items.append(item)
        return items, at
    if kind == 0x2B:  # `+` simple string
        return line, at
    if kind == 0x2D:  # `-` error
        return _error(line), at
    if kind == 0x5F:  # `_` RESP3 null
        return None, at
    raise InvalidResponse(f"unexpected reply type {chr(kind)!r}")


def _error(message: bytes) -> ResponseError:
    """The exception redis-py raises for this error reply (`NoScriptError` for `NOSCRIPT`, ...)."""
    error: ResponseError = BaseParser.parse_error(message.decode("utf-8", "replace"))  # type: ignore[no-untyped-call]
    return error


def _pool_args(pool: Any) -> tuple[str, ...]:
    """`get_connection`'s arguments: none since redis-py 5.3, a command name before."""
    if pool is None:
        return ()
    name = inspect.signature(pool.get_connection).parameters.get("command_name")
    return ("SET",) if name is not None and name.default is inspect.Parameter.empty else ()


class RedisStore(_Layout, Steps):
    """The store primitives of `wit/store.wit` on a Redis server, for `Guard`.

    `url`: `redis://[:PASSWORD@]HOST[:PORT][/DB]` (redis-py's `from_url`),
    or `client=` an existing `redis.Redis` (it must not decode responses).
    `prefix` goes before every key (stores sharing keys must use the same).
    Safe to share between threads: it takes a connection of the client's
    pool for each thread that calls it at once, and keeps it for the next
    command.
    """

    _client_class, _retry_class = _redis.Redis, Retry

    def _opened(self) -> None:
        self._pool = getattr(self.client, "connection_pool", None)
        self._pool_args = _pool_args(self._pool)
        self._idle: list[Any] = []  # connections taken from the pool, kept for the next command
        self._pid = os.getpid()
        # The time authority: read now (a server that cannot answer leaves it unknown, and every
        # guard call fails closed naming why) and every clock_sync_ms after, on the clock's thread.
        self.clock.read(self.server_time)
        self.clock.keep_synced(self.server_time)

    def _send(self, command: Any, key: str) -> Any:
        batches = self._batches(command)
        try:
            batch = next(batches)
            while True:
                batch = batches.send(self._pipeline(batch))
        except StopIteration as done:
            return done.value
        except RedisError as e:
            raise self._fault(e, key) from e

    def _command(self, args: tuple[Any, ...]) -> Any:
        """One command, its reply (an error reply raised): for tests and operators."""
        (reply,) = self._pipeline((args,))
        if isinstance(reply, ResponseError):
            raise reply
        return reply

    def _pipeline(self, batch: tuple[tuple[Any, ...], ...]) -> list[Any]:
        """A batch of commands on a connection of the store's own, their replies
        as the server sent them. redis-py's connection opens the socket (address,
        TLS, AUTH, SELECT, protocol); the commands and replies go over that
        socket directly (`_pack`, `_exchange`): no pool checkout, lock,
        observability hooks, retry or response callbacks per command, which
        cost more client-side time than the round trip itself
        (`examples/python/bench_stores.py`). A connection that failed, timed
        out or was interrupted mid-reply is dropped, so no later command
        reads its stale reply."""
        if self._pool is None:  # a client without one pool (a cluster client): its own path
            return [_executed(self.client.execute_command, args) for args in batch]
        conn = self._checkout()
        try:
            if conn._sock is None:
                conn.connect()
            replies = _exchange(conn._sock, b"".join(_pack(args) for args in batch), len(batch))
            replies = replies if len(batch) > 1 else [replies]
            if any(isinstance(r, ResponseError) and not isinstance(r, NoScriptError) for r in replies):
                # In step, but the server may be one to leave (READONLY after a
                # failover, LOADING): the next command connects afresh, as
                # redis-py's own connections do for the errors they act on.
                conn.disconnect()
        except BaseException:
            conn.disconnect()  # a timeout, a Ctrl-C, a broken reply: one may be left unread
            raise
        finally:
            self._idle.append(conn)
        return replies

    def _checkout(self) -> Any:
        """An idle connection of the store's, or a new one from the client's pool.

        The store keeps the connections it took (a list: `pop` and `append`
        are atomic, so threads never share one). One the server closed while
        it sat idle is reconnected before the command, as the pool would:
        nothing can be waiting to be read on a connection in step."""
        if self._pid != os.getpid():  # a forked child: the parent's sockets are not its own
            self._idle, self._pid = [], os.getpid()
        try:
            conn = self._idle.pop()
        except IndexError:
            return self._pool.get_connection(*self._pool_args)  # type: ignore[union-attr]  # None takes another path
        sock = conn._sock
        if sock is not None and _readable(sock):
            conn.disconnect()  # connected again before the command
        return conn

    def close(self) -> None:
        """Stops reading the server's clock, gives its connections back to the
        client's pool, and closes them (only those of a client the store opened itself)."""
        self.clock.stop()
        idle, self._idle = self._idle, []
        if self._pid == os.getpid():
            for conn in idle:
                self._pool.release(conn)  # type: ignore[union-attr]  # idle only with a pool
        if self._owned:
            self.client.close()


class AsyncRedisStore(_Layout, AsyncSteps):
    """The store primitives on a Redis server for `AsyncGuard`: `await
    store.get(...)` and so on. Options as `RedisStore`'s (`client=` an existing
    `redis.asyncio.Redis`). Like `RedisStore`, it sends its commands itself:
    redis-py's asyncio connection opens the connection (address, TLS, AUTH,
    SELECT, protocol), then the store takes its transport over (`_Wire`, an
    `asyncio.Protocol`): each batch of commands is one write, and the replies
    are parsed in place as they arrive and handed, in order, to the commands
    that wait for them — no stream reader, pool checkout, lock, hooks or
    response callbacks per command. Concurrent calls share the store's one
    connection on each event loop (pipelined: each writes when it is ready).
    Each command is bounded by `timeout_ms`: past it the connection is closed
    and every command on it fails. A connection that failed, timed out or
    answered out of step is dropped and the next command connects again;
    one that answered an error reply (READONLY after a failover, LOADING) is
    left once its commands are answered. A command cancelled mid-reply
    leaves its reply to be read and thrown away, so no later command takes
    it for its own. Connections belong to the event loop that opened them: on
    another loop the store opens a new one."""

    _client_class, _retry_class = _aredis.Redis, _AsyncRetry
    # Its primitives bind nothing to the current task before their first suspension, so
    # AsyncGuard starts each one inside the run that asks for it (idem_guard.journal).
    eager_start = True

    def _opened(self) -> None:
        self._pool = getattr(self.client, "connection_pool", None)
        self._wire: _Wire | None = None  # the connection commands go on, on the loop of `_wire.loop`
        self._opening: asyncio.Task[_Wire] | None = None  # a connection being opened, for every caller at once
        self._spent: list[_Wire] = []  # wires left after an error reply: their connections go back to the pool
        self._timeout_s = self.timeout_ms / 1000

    async def open_clock(self) -> None:
        """Reads the server's clock unless it has been read (a failure leaves it unknown: every
        guard call fails closed naming why, and the next call tries again), and keeps it synced
        every `clock_sync_ms` from a task of the running loop. `AsyncGuard` awaits it before
        each call; `async with` the store awaits it too."""
        await self.clock.first_reading(self.server_time)
        self.clock.keep_synced_async(self.server_time)

    async def _send(self, command: Any, key: str) -> Any:
        batches = self._batches(command)
        try:
            batch = next(batches)
            while True:
                batch = batches.send(await self._pipeline(batch))
        except StopIteration as done:
            return done.value
        except RedisError as e:
            raise self._fault(e, key) from e

    async def _pipeline(self, batch: tuple[tuple[Any, ...], ...]) -> list[Any]:
        """`RedisStore._pipeline` on the store's `_Wire`: the batch in one write, its replies as the server sent them."""
        if self._pool is None:  # a client without one pool (a cluster client): its own path
            return [await _aexecuted(self.client.execute_command, args) for args in batch]
        wire = self._wire
        if wire is None or wire.ended or wire.loop is not asyncio.get_running_loop():
            wire = await self._connected()
        count = len(batch)
        reply = wire.send(_pack(batch[0]) if count == 1 else b"".join(_pack(args) for args in batch), count)
        try:
            answered = await reply
        except BaseException:
            reply.cancel()  # abandoned (cancelled, or its coroutine closed): its reply is read and thrown away
            raise
        replies: list[Any] = [answered] if count == 1 else answered
        for r in replies:
            if isinstance(r, ResponseError) and not isinstance(r, NoScriptError):
                # In step, but the server may be one to leave (READONLY after a failover,
                # LOADING): the next command goes on a new connection, as redis-py's own
                # connections reconnect after the errors they act on.
                self._retire(wire)
                break
        return replies

    def _retire(self, wire: _Wire) -> None:
        if self._wire is wire:
            self._wire = None
            self._spent.append(wire)
        wire.retire()

    async def _connected(self) -> _Wire:
        """The store's connection on the running loop, opened once for every caller that needs it now."""
        loop = asyncio.get_running_loop()
        opening = self._opening
        if opening is None or opening.done() or opening.get_loop() is not loop:
            # A task of its own: a caller cancelled meanwhile does not cancel the others' opening.
            opening = self._opening = loop.create_task(self._open(loop), name="idem-redis-connect")
            opening.add_done_callback(_retrieved)  # its callers may all be cancelled: a failure is theirs, not a log line
        return await asyncio.shield(opening)

    async def _open(self, loop: asyncio.AbstractEventLoop) -> _Wire:
        wire = self._wire
        if wire is not None and not wire.ended and wire.loop is loop:
            return wire
        assert self._pool is not None
        await self._give_back(loop)
        if wire is not None:  # lost, timed out, or of another loop: its connection is opened again
            self._wire = None
            conn = wire.detach()
        else:
            conn = await self._pool.get_connection()
        if conn._writer is None:
            try:
                await conn.connect()
            except Exception:
                await self._pool.release(conn)  # not kept while the server cannot be reached: the next call takes it again
                raise
        self._wire = _Wire(conn, loop, self._timeout_s)
        return self._wire

    async def _give_back(self, loop: asyncio.AbstractEventLoop, everything: bool = False) -> None:
        """Gives the connections of the wires left after an error reply, once they are closed
        (`everything`: now), back to the client's pool."""
        spent, self._spent = self._spent, []
        for wire in spent:
            if wire.loop is loop and not wire.closed and not everything:
                self._spent.append(wire)  # still answering the commands it was sent
                continue
            conn = wire.detach()
            if wire.loop is loop:
                await self._pool.release(conn)  # type: ignore[union-attr]  # wires only with a pool

    async def close(self) -> None:
        """Stops reading the server's clock, closes its connection and gives it back to the
        client's pool, and closes the client (only a client the store opened itself)."""
        await self.clock.astop()
        wire, self._wire = self._wire, None
        if wire is not None:
            self._spent.append(wire)
            wire.retire()
        try:
            await self._give_back(asyncio.get_running_loop(), everything=True)
        finally:
            self._spent = []
        if self._owned:
            await self.client.aclose()

    aclose = close

    async def __aenter__(self) -> AsyncRedisStore:
        await self.open_clock()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()


class _Wire(asyncio.Protocol):
    """One connection of `AsyncRedisStore`'s, taken over from the redis-py connection
    that opened it: the transport's protocol from then on. Commands are written as they
    come (pipelined); `data_received` parses the replies in place (`_parse`, as the sync
    store) and hands each, in order, to the future of the command that waits for it.

    One timer per connection, not per command, bounds the commands: armed when a command
    is written with none armed, it fails everything on the connection once the oldest
    command waited `timeout_ms`, else is armed again for the oldest's deadline. The end of
    the connection is passed on to redis-py's stream protocol, so its reader sees the end
    and its writer's `wait_closed` returns."""

    def __init__(self, conn: Any, loop: asyncio.AbstractEventLoop, timeout_s: float):
        self.conn = conn
        self.loop = loop
        self.transport: asyncio.Transport = conn._writer.transport
        self._stream: asyncio.BaseProtocol | None = self.transport.get_protocol()
        self._timeout_s = timeout_s
        self._waiting: deque[tuple[asyncio.Future[Any], int, float]] = deque()
        self._buffer = b""
        self._timer: asyncio.TimerHandle | None = None
        self._timed_out = False
        # No new command once lost, timed out, out of step or retired; closed once the transport is.
        self.ended = False
        self.closed = False
        self._retired = False
        self.transport.set_protocol(self)

    def send(self, payload: bytes, count: int) -> asyncio.Future[Any]:
        """Writes the commands; the future is given their `count` replies (one, or a list)."""
        reply = self.loop.create_future()
        deadline = self.loop.time() + self._timeout_s
        self._waiting.append((reply, count, deadline))
        self.transport.write(payload)
        if self._timer is None:
            self._timer = self.loop.call_at(deadline, self._check)
        return reply

    def data_received(self, data: bytes) -> None:
        if self._buffer:
            data = self._buffer + data
        at, waiting = 0, self._waiting
        try:
            while waiting:
                reply, count, _ = waiting[0]
                try:
                    value, at = _parse_many(data, at, count)
                except _Incomplete:
                    break
                waiting.popleft()
                if not reply.done():  # else abandoned: its reply is thrown away
                    reply.set_result(value)
        except InvalidResponse as e:
            self._end(e)
            return
        if at < len(data) and not waiting:  # so many commands, so many replies: anything more is out of step
            self._end(InvalidResponse(f"{len(data) - at} bytes after the reply"))
            return
        self._buffer = data[at:] if at else data
        if self._retired and not waiting:
            self.transport.close()

    def eof_received(self) -> bool:
        return False  # the server closed its side: so does the store (connection_lost follows)

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._timed_out:
            self._fail(lambda: _TimeoutError("Timeout talking to the server"))
        elif exc is not None:
            self._fail(lambda: _ConnectionError(f"Error talking to the server: {exc}"))
        else:
            self._fail(lambda: _ConnectionError("Connection closed by server."))
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.connection_lost(exc)

    def _check(self) -> None:
        self._timer = None
        if not self._waiting:
            return
        deadline = self._waiting[0][2]
        if self.loop.time() >= deadline:
            self._timed_out = True
            self.ended = True
            self.transport.abort()  # connection_lost fails every command on it
        else:
            self._timer = self.loop.call_at(deadline, self._check)

    def _end(self, error: Exception) -> None:
        """Out of step: every command waiting fails with `error`, and the connection is dropped."""
        self.ended = True
        self._fail(lambda: error)
        self.transport.abort()

    def _fail(self, error: Callable[[], Exception]) -> None:
        waiting, self._waiting = self._waiting, deque()
        self._buffer = b""
        for reply, _, _ in waiting:
            if not reply.done():
                reply.set_exception(error())

    def retire(self) -> None:
        """No new command; closed once the commands written are answered."""
        self.ended = self._retired = True
        if not self._waiting and not self.closed:
            self.transport.close()

    def abort(self) -> None:
        """Closed now, whatever waits (the store closes)."""
        self.ended = True
        if not self.closed:
            try:
                self.transport.abort()
            except RuntimeError:  # its loop is closed: the socket went with it
                self.closed = True

    def detach(self) -> Any:
        """The redis-py connection, its transport closed and forgotten, to connect again or give back."""
        self.abort()
        conn = self.conn
        conn._reader = conn._writer = None
        return conn


def _retrieved(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _options(args: tuple[Any, ...]) -> dict[str, Any]:
    """What redis-py's response callback must be told of a command run through the client: a
    `SET … GET` answers the value it found (its `SET` callback would make it a bool)."""
    return {"get": True} if args[0] == "SET" and "GET" in args else {}


def _executed(execute: Any, args: tuple[Any, ...]) -> Any:
    try:
        return execute(*args, **_options(args))
    except ResponseError as e:
        return e


async def _aexecuted(execute: Any, args: tuple[Any, ...]) -> Any:
    try:
        return await execute(*args, **_options(args))
    except ResponseError as e:
        return e
