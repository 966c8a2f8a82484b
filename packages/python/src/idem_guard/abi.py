"""The guard component run through wasmtime's core API, with the canonical ABI
of `idem:guard@0.3.0` written once, here, for this WIT.

Why: wasmtime-py's dynamic component API lifts and lowers every value
through generic type objects, with a ctypes call or more per value: about
3.7 ms per guarded call on 50.0.1 when the response was a record, still 10 to
20 times this binding's cost on 51.0.0 with the response a resource
(examples/python/bench.py). Its core `Func.__call__` is no way out either: it
rebuilds the function's type and converts every parameter through `Val` on
each call (about 95 µs a call on this machine). This module runs the
component's own core module (the guest wit-bindgen compiled, taken out of the
very component bytes `idem component --out` writes; nothing is rebuilt) and
calls it through the unchecked entry points of wasmtime's C API
(`wasmtime_func_call_unchecked`, `wasmtime_func_new_unchecked`), reached
through the ctypes prototypes wasmtime-py ships with its library. Values are
moved with precompiled `struct` formats straight in linear memory, as the
canonical ABI says (https://github.com/WebAssembly/component-model, design/mvp/
CanonicalABI.md: `flatten_functype`, `store`, `load`, `lift_flat`).

What the component model would also check and this binding checks too: every
pointer and length the guest hands back is bounds-checked (and lists'
alignment), strings must be UTF-8, discriminants in range, and every
`response` handle must be in the instance's handle table. A violation raises
`AbiViolation`, which the guard treats as a trap (the instance is dropped).

The `response` resource (wit/types.wit) is the host's: the guest sees a
handle, an i32 index into the instance's `Handles` table of host `Response`s,
and calls the resource's methods and drop as imports. Lowering an own handle
(an entry's response from `get` or `insert`, `complete`'s argument) inserts
the response into the table; lifting one (a `replay`, a drop) removes it;
lifting a borrow (a method's `self`, `same-as`'s argument, `replace`'s
response) looks it up. So a response's bytes never enter linear memory, and a
replay hands back the very object the store read. The guest keeps no state
between calls: after each export call the table is empty, and it is emptied
anyway (after a trap, say) so nothing outlives the call.

The layouts live in one place, the WIT mirror below (`# wit/...` comments say
where each type comes from). Sizes, alignments, offsets and the flattened core
signatures are computed from it with the canonical ABI's rules, and
`Guest.load` compares every computed signature with the core module's: a
component whose types moved (a field added to `record`, a new export) is
refused at load, not mis-read at run time. Moving to the next contract: edit
the mirror, `VERSION` and the few hand-written lift/lower functions that
name fields.

What it takes from wasmtime-py beyond its public API, exercised by every
test: the library handle and C types of `wasmtime._bindings`, `Func._from_raw`, `Func._func`,
`Memory._memory`, `Store._context()`, `FuncType.ptr()`, `Trap._from_ptr`,
`WasmtimeError._from_ptr` and `Trap._consume`. Why not the public API: a call
into the guest through `wasmtime.Func.__call__` costs about 80 times this
binding's unchecked call (1.8 against 145–163 µs, side by side:
`examples/python/bench_crossing.py`), and a begin+complete makes twelve crossings. These internals held from wasmtime-py
40 to 51 (tested), so the dependency is a range (`wasmtime>=40,<52`), its
floor checked in CI; a release past it is refused until tested.
"""

from __future__ import annotations

import ctypes
import itertools
import struct
import weakref
from collections.abc import Callable, Sequence
from ctypes import POINTER
from functools import cache, wraps
from pathlib import Path
from typing import Any

import wasmtime
from wasmtime import _bindings as capi  # wasmtime-py's ctypes prototypes of wasmtime's C API

from .types import (
    Checkpoint,
    Claim,
    Entry,
    Failure,
    Policy,
    Record,
    Response,
    StoreFault,
    response_size,
    same_response,
    status_u16,
)

VERSION = "0.3.0"


def contract(interface: str) -> str:
    """The name an interface of the contract has in the component: `idem:guard/store@0.3.0`."""
    return f"idem:guard/{interface}@{VERSION}"


def _written(answer: Any) -> bool:
    """A store's `replace` answer, `bool` by the contract (wit/store.wit: the new version is
    `expected + 1`). Anything else (a 0.2 store's new version or None) is a host bug, raised:
    the instance traps and the call fails closed, naming what the store returned."""
    if type(answer) is not bool:
        raise TypeError(f"store.replace returned {answer!r}; a 0.3 store returns True (written) or False")
    return answer


class AbiViolation(Exception):
    """The guest broke the canonical ABI (bad pointer, length, UTF-8 or
    discriminant), or the component is not the shape this binding reads."""


# --- the canonical ABI's layout rules --------------------------------------


def _align_to(n: int, align: int) -> int:
    return (n + align - 1) // align * align


class Type:
    size: int
    align: int
    flat: tuple[str, ...]


class Scalar(Type):
    def __init__(self, size: int, flat: str, code: str):
        self.size = self.align = size
        self.flat = (flat,)
        self.code = code  # its `struct` format character


class Str(Type):
    """`string` or `list<T>`: a (pointer, length) pair."""

    size, align, flat = 8, 4, ("i32", "i32")

    def __init__(self, element: Type | None = None):
        self.element = element


class Rec(Type):
    """A record (or tuple): fields in order, each at its own alignment."""

    def __init__(self, *fields: tuple[str, Type]):
        self.fields = dict(fields)
        self.offset: dict[str, int] = {}
        end = 0
        for name, ty in fields:
            end = _align_to(end, ty.align)
            self.offset[name] = end
            end += ty.size
        self.align = max(ty.align for _, ty in fields)
        self.size = _align_to(end, self.align)
        self.flat = tuple(f for _, ty in fields for f in ty.flat)


def _join(a: str, b: str) -> str:
    return a if a == b else "i64"  # only i32 and i64 occur in this WIT


class Variant(Type):
    """A variant, enum, option or result: a discriminant, then the payload at the largest case alignment."""

    def __init__(self, *cases: tuple[str, Type | None]):
        self.cases = tuple(name for name, _ in cases)
        self.payloads = tuple(ty for _, ty in cases)
        self.disc = 1 if len(cases) <= 256 else 2 if len(cases) <= 65536 else 4
        payload_align = max([ty.align for ty in self.payloads if ty] or [1])
        payload_size = max([ty.size for ty in self.payloads if ty] or [0])
        self.align = max(self.disc, payload_align)
        self.payload = _align_to(self.disc, payload_align)
        self.size = _align_to(self.payload + payload_size, self.align)
        flat: list[str] = []
        for ty in self.payloads:
            for i, f in enumerate(ty.flat if ty else ()):
                flat[i : i + 1] = [_join(flat[i], f) if i < len(flat) else f]
        self.flat = ("i32", *flat)

    def case(self, index: int) -> str:
        if index >= len(self.cases):
            raise AbiViolation(f"discriminant {index} out of range for {self.cases}")
        return self.cases[index]


def Enum(*names: str) -> Variant:
    return Variant(*((n, None) for n in names))


def Option(ty: Type) -> Variant:
    return Variant(("none", None), ("some", ty))


def Result(ok: Type | None, err: Type | None) -> Variant:
    return Variant(("ok", ok), ("err", err))


def Tuple(*types: Type) -> Rec:
    return Rec(*((str(i), ty) for i, ty in enumerate(types)))


U8, U16, U32, U64 = Scalar(1, "i32", "B"), Scalar(2, "i32", "H"), Scalar(4, "i32", "I"), Scalar(8, "i64", "Q")
STRING = Str()

MAX_FLAT_PARAMS, MAX_FLAT_RESULTS = 16, 1


def _flat_params(params: Sequence[Type]) -> list[str]:
    """The core parameters: the flat values, or, past 16 of them, one pointer
    to the parameters stored as a tuple (`PARAMS` below)."""
    flat = [f for ty in params for f in ty.flat]
    return ["i32"] if len(flat) > MAX_FLAT_PARAMS else flat


def export_signature(params: Sequence[Type], result: Type | None) -> tuple[list[str], list[str]]:
    """`flatten_functype` for a lifted export: results over one core value come back through a pointer."""
    flat = _flat_params(params)
    results = list(result.flat) if result else []
    return flat, (["i32"] if len(results) > MAX_FLAT_RESULTS else results)


def import_signature(params: Sequence[Type], result: Type | None) -> tuple[list[str], list[str]]:
    """`flatten_functype` for a lowered import: results over one core value go to a pointer the guest passes last."""
    flat = _flat_params(params)
    results = list(result.flat) if result else []
    if len(results) > MAX_FLAT_RESULTS:
        return [*flat, "i32"], []
    return flat, results


# --- the WIT, mirrored: the one place the layouts come from ----------------

# wit/types.wit
HEADER = Tuple(STRING, Str(U8))  # an element of `request-parts.headers`
# `response` is a resource: own and borrow handles alike are one i32, an index
# into the instance's handle table (`Handles`).
RESPONSE = Scalar(4, "i32", "I")
BOOL = Scalar(1, "i32", "B")
STATE = Enum("processing", "done")
CHECKPOINT = Rec(("phase", STRING), ("data", Str(U8)))
OPTION_CHECKPOINT = Option(CHECKPOINT)
OPTION_RESPONSE = Option(RESPONSE)
RECORD = Rec(
    ("fingerprint", STRING),
    ("state", STATE),
    ("holder", U64),
    ("lease_until_ms", U64),
    ("expires_at_ms", U64),
    ("checkpoint", OPTION_CHECKPOINT),
)
ENTRY = Rec(("record", RECORD), ("response", OPTION_RESPONSE), ("version", U64))

# wit/guard.wit
POLICY = Rec(("lease_ms", U64), ("retention_ms", U64), ("max_response_bytes", U32))
CLAIM = Rec(
    ("key", STRING),
    ("fingerprint", STRING),
    ("fence", U64),
    ("holder", U64),
    ("lease_until_ms", U64),
    ("expires_at_ms", U64),
    ("checkpoint", OPTION_CHECKPOINT),
)
DECISION = Variant(("proceed", CLAIM), ("replay", RESPONSE), ("in-flight", U64), ("conflict", None))
GUARD_ERROR = Variant(("unavailable", STRING), ("invalid-input", STRING), ("stale-claim", STRING))
REQUEST_PARTS = Rec(("method", STRING), ("path", STRING), ("headers", Str(HEADER)), ("body", Str(U8)))
BEGIN_RESULT = Result(DECISION, GUARD_ERROR)
UNIT_RESULT = Result(None, GUARD_ERROR)
CLAIM_RESULT = Result(CLAIM, GUARD_ERROR)  # renew, save-checkpoint

# wit/store.wit (the 0.3.0 guest imports `get`, `insert` and `replace`, not `delete`; of
# wit/types.wit's response, `status`, `size`, `same-as` and the drop, not the constructor,
# `headers` or `body`, which are for a store written as a component. `Guest.load` refuses a
# component that imports anything this binding does not lower, naming it.)
STORE_ERROR = Variant(("unavailable", STRING), ("corrupt", STRING))
OPTION_ENTRY = Option(ENTRY)
GET_RESULT = Result(OPTION_ENTRY, STORE_ERROR)
INSERT_OUTCOME = Variant(("inserted", U64), ("existing", ENTRY))
INSERT_RESULT = Result(INSERT_OUTCOME, STORE_ERROR)
REPLACE_RESULT = Result(BOOL, STORE_ERROR)

# The functions whose flat parameters are over 16, as the tuples they are passed as.
PARAMS = {
    "complete": Tuple(CLAIM, RESPONSE, POLICY),
    "save-checkpoint": Tuple(CLAIM, CHECKPOINT, POLICY),
    ("store", "replace"): Tuple(STRING, U64, RECORD, OPTION_RESPONSE, U64),
}

# Where each parameter sits in those tuples.
_PARAMS_AT = {name: tuple(ty.offset[str(i)] for i in range(len(ty.fields))) for name, ty in PARAMS.items()}

# wit/guard.wit's exports and the imports of wit/types.wit (the response's
# methods and drop), wit/clock.wit, wit/random.wit and wit/store.wit: core signatures.
EXPORTS = {
    "begin": export_signature([STRING, STRING, POLICY], BEGIN_RESULT),
    "complete": export_signature([CLAIM, RESPONSE, POLICY], UNIT_RESULT),
    "release": export_signature([CLAIM], UNIT_RESULT),
    "renew": export_signature([CLAIM, POLICY], CLAIM_RESULT),
    "save-checkpoint": export_signature([CLAIM, CHECKPOINT, POLICY], CLAIM_RESULT),
    "fingerprint": export_signature([REQUEST_PARTS], STRING),
    "begin-request": export_signature([STRING, REQUEST_PARTS, POLICY], BEGIN_RESULT),
}
IMPORTS = {
    ("types", "[resource-drop]response"): import_signature([RESPONSE], None),
    ("types", "[method]response.status"): import_signature([RESPONSE], U16),
    ("types", "[method]response.size"): import_signature([RESPONSE], U64),
    ("types", "[method]response.same-as"): import_signature([RESPONSE, RESPONSE], BOOL),
    ("clock", "now-ms"): import_signature([], U64),
    ("random", "random-u64"): import_signature([], U64),
    ("store", "get"): import_signature([STRING, U64], GET_RESULT),
    ("store", "insert"): import_signature([STRING, RECORD, U64], INSERT_RESULT),
    ("store", "replace"): import_signature([STRING, U64, RECORD, OPTION_RESPONSE, U64], REPLACE_RESULT),
}


def _fields(ty: Rec, *names: str) -> struct.Struct:
    """A `struct` format reading the named fields of a record in memory, padding
    included (a string or list is its pointer and length; a variant, its discriminant)."""
    fmt, at = "<", ty.offset[names[0]]
    for name in names:
        field = ty.fields[name]
        fmt += "x" * (ty.offset[name] - at)
        if isinstance(field, Scalar):
            fmt += field.code
        elif isinstance(field, Str):
            fmt += "II"
        elif isinstance(field, Variant):
            fmt += "BHI"[field.disc // 2]
        else:
            raise TypeError(f"{name}: read nested records field by field")
        at = ty.offset[name] + (field.disc if isinstance(field, Variant) else field.size)
    return struct.Struct(fmt)


def _flat(signature: list[str]) -> struct.Struct:
    """Core values as wasmtime's C API lays them out: one 16-byte `wasmtime_val_raw_t` each."""
    return struct.Struct("<" + "".join("I12x" if t == "i32" else "Q8x" for t in signature))


_CLAIM = _fields(CLAIM, "key", "fingerprint", "fence", "holder", "lease_until_ms", "expires_at_ms", "checkpoint")
_HEADER = _fields(HEADER, "0", "1")
_CHECKPOINT = _fields(CHECKPOINT, "phase", "data")
_POLICY = _fields(POLICY, "lease_ms", "retention_ms", "max_response_bytes")
_RECORD_HEAD = _fields(RECORD, "fingerprint", "state", "holder", "lease_until_ms", "expires_at_ms")
# `option<response>`: the discriminant, then the handle.
_OPTION_HANDLE = struct.Struct(f"<B{OPTION_RESPONSE.payload - 1}xI")
_VERSION = struct.Struct("<Q")
_U32 = struct.Struct("<I")  # an i32 result in a `wasmtime_val_raw_t`, as unsigned
_DISC = struct.Struct("<B")
_PTR_LEN = struct.Struct("<II")

# Where the payloads sit, from the layouts above.
_BEGIN_OK = BEGIN_RESULT.payload  # the decision
_BEGIN_CASE = _BEGIN_OK + DECISION.payload  # the decision's payload
_UNIT_ERR = UNIT_RESULT.payload
_CLAIM_OK = CLAIM_RESULT.payload
_ENTRY_AT = INSERT_RESULT.payload + INSERT_OUTCOME.payload
_GET_ENTRY_AT = GET_RESULT.payload + OPTION_ENTRY.payload
_CHECKPOINT_IN_OPTION = OPTION_CHECKPOINT.payload
_CHECKPOINT_IN_RECORD = RECORD.offset["checkpoint"]
_REPLACE_PARAMS = PARAMS[("store", "replace")]
_REPLACE_KEY, _REPLACE_EXPECTED, _REPLACE_RECORD, _REPLACE_RESPONSE, _REPLACE_NOW = (
    _REPLACE_PARAMS.offset[f] for f in ("0", "1", "2", "3", "4")
)
# `ok(inserted(v))`, the answer of an insert that took: two discriminants, then the u64.
_OK_U64 = struct.Struct(f"<B{INSERT_RESULT.payload - 1}xB{INSERT_OUTCOME.payload - 1}xQ")
# `ok(written)`, replace's answer: the discriminant, then the bool.
_OK_BOOL = struct.Struct(f"<B{REPLACE_RESULT.payload - 1}xB")


# --- the component file ----------------------------------------------------


def _leb128(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def core_modules(component: bytes) -> list[bytes]:
    """The core modules a component embeds at its top level (section id 1), in order."""
    if component[:8] != b"\0asm\x0d\x00\x01\x00":
        raise AbiViolation("not a component (expected the component-model binary, version 0xd, layer 1)")
    modules, at = [], 8
    while at < len(component):
        section = component[at]
        size, at = _leb128(component, at + 1)
        if section == 1:
            modules.append(component[at : at + size])
        at += size
    return modules


ENGINE = wasmtime.Engine()


class Guest:
    """The guard's core module, compiled once, checked against the WIT mirror."""

    @classmethod
    @cache  # compiled once per file, for the life of the process
    def load(cls, path: Path) -> Guest:
        return cls(Path(path).read_bytes())

    def __init__(self, component: bytes):
        # wit-component wraps the guest with a shim and a fixup module for the
        # imports' indirect calls; the guest is the one that exports memory.
        for wasm in core_modules(component):
            module = wasmtime.Module(ENGINE, wasm)
            if any(e.name == "memory" for e in module.exports):
                break
        else:
            raise AbiViolation("the component has no core module exporting its memory")
        self.module = module
        exports = {e.name: e.type for e in module.exports}
        for name, (params, results) in EXPORTS.items():
            self._check(exports, contract("guard") + "#" + name, params, results)
            self._check(exports, "cabi_post_" + contract("guard") + "#" + name, ["i32"], [])
        self._check(exports, "cabi_realloc", ["i32"] * 4, ["i32"])
        self.imports = []
        for imp in module.imports:
            iface = imp.module.split("/")[-1].removesuffix(f"@{VERSION}")
            if imp.module != contract(iface) or (iface, imp.name or "") not in IMPORTS:
                raise AbiViolation(f"the component imports {imp.module} {imp.name}, which this binding does not provide")
            name = imp.name or ""
            self._check({name: imp.type}, name, *IMPORTS[(iface, name)])
            self.imports.append((iface, name))

    @staticmethod
    def _check(types: dict[str, Any], name: str, params: list[str], results: list[str]) -> None:
        ty = types.get(name)
        if not isinstance(ty, wasmtime.FuncType):
            raise AbiViolation(f"the component's core module has no function {name}")
        actual = ([str(t) for t in ty.params], [str(t) for t in ty.results])
        if actual != (params, results):
            raise AbiViolation(f"{name}: core signature {actual}, the WIT mirror says {(params, results)}")

    def instantiate(self, store: Any, clock: Any, random: Any) -> Instance:
        return Instance(self, store, clock, random)


# --- host functions through wasmtime's unchecked C API ---------------------

# env -> (the instance, weakly: the dict must not keep it alive, its handler, the handler's flat parameters)
_HOST_FUNCS: dict[int, tuple[weakref.ref[Any], Callable[..., None], struct.Struct]] = {}
_next_env = itertools.count(1)


# `wasmtime_func_unchecked_callback_t`, with its pointers as plain ints.
@ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)  # type: ignore[untyped-decorator]
def _trampoline(env: int, caller: int, values: int, count: int) -> int:
    try:
        instance, handler, params = _HOST_FUNCS[env]
    except KeyError:  # never expected; an exception escaping a ctypes callback would read as success
        return _trap(f"no host function {env}")
    return Instance._host_call(instance(), caller, values, handler, params)


@ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # type: ignore[untyped-decorator]
def _finalize(env: int) -> None:
    _HOST_FUNCS.pop(env, None)  # the wasmtime Store holding the function was dropped


def _trap(message: str) -> int:
    return ctypes.cast(wasmtime.Trap(message)._consume(), ctypes.c_void_p).value or 0


def _c(name: str, restype: Any, *argtypes: Any) -> Any:
    """A C API function of the library wasmtime-py loaded, taking addresses as plain ints.

    `PYFUNCTYPE` keeps the GIL across the call: the calls are microseconds
    long, and this halves ctypes' cost against wasmtime-py's own prototypes."""
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, capi.dll))  # type: ignore[attr-defined]


_P = ctypes.c_void_p


def _address(pointer: Any) -> int:
    return ctypes.cast(pointer, _P).value or 0

_call_unchecked = _c("wasmtime_func_call_unchecked", _P, _P, _P, _P, ctypes.c_size_t, _P)
_memory_size = _c("wasmtime_memory_data_size", ctypes.c_size_t, _P, _P)
_memory_data = _c("wasmtime_memory_data", _P, _P, _P)
_caller_context = _c("wasmtime_caller_context", _P, _P)
_func_new_unchecked = _c("wasmtime_func_new_unchecked", None, _P, _P, _P, _P, _P, _P)
_Values = capi.wasmtime_val_raw_t


class _Export:
    """A core export and a buffer of raw values for its parameters and results."""

    def __init__(self, func: wasmtime.Func, params: list[str], results: list[str]):
        self.func = func  # keeps the `wasmtime_func_t` at `self.ref` alive
        self.ref = ctypes.addressof(func._func)
        self.count = max(len(params), len(results))
        self.values = (_Values * self.count)()
        self.address = ctypes.addressof(self.values)
        self.view = memoryview(self.values).cast("B")
        self.params = _flat(params)


class Handles:
    """The response handle table of one instance: handle -> the host's `Response`.

    Own handles are lowered by inserting (`own`: an `entry`'s response,
    `complete`'s argument) and lifted by removing (`take`: the guest's
    `[resource-drop]`, `replay`); borrow handles are lifted by lookup
    (`borrow`: the methods' `self` and `same-as`'s argument, `replace`'s
    response). A handle lives within one export call: `clears_handles`
    empties the table after each. 0 is never a handle. Both bindings use it
    (`idem_guard.component` with wasmtime's own table in front of it: its
    handles are this table's `rep`s)."""

    def __init__(self) -> None:
        self._table: dict[int, Response] = {}
        self._next = 1
        # Handles left in the table when a call ended (the call trapped, or the
        # guest did not drop one): 0 for a guest that keeps the contract.
        self.stray = 0

    def __len__(self) -> int:
        return len(self._table)

    def own(self, response: Response) -> int:
        """A new handle to `response`, owned by the guest."""
        handle = self._next
        self._next += 1
        self._table[handle] = response
        return handle

    def borrow(self, handle: int) -> Response:
        """The response behind a handle the guest lends (it stays in the table)."""
        try:
            return self._table[handle]
        except KeyError:
            raise AbiViolation(f"response handle {handle} is not in the handle table") from None

    def take(self, handle: int) -> Response:
        """The response behind a handle the guest gives up (dropped, or handed back)."""
        try:
            return self._table.pop(handle)
        except KeyError:
            raise AbiViolation(f"response handle {handle} is not in the handle table") from None

    def clear(self) -> None:
        if self._table:
            self.stray += len(self._table)
            self._table.clear()
        self._next = 1


def clears_handles(method: Callable[..., Any]) -> Callable[..., Any]:
    """An export call of an instance (with `handles`): the handle table is
    emptied after it, however it ended. The guest keeps no state between
    calls, so a handle still there is dead: one the guest held when it trapped
    (or when a host function raised), or one it failed to drop."""

    @wraps(method)
    def call(self: Any, *args: Any) -> Any:
        try:
            return method(self, *args)
        finally:
            self.handles.clear()

    return call


class Instance:
    """One instance of the guest in a wasmtime Store of its own, over one store and clock.

    Not thread-safe (the guard calls it under its lock). After any exception
    other than a returned `Failure` the instance must be dropped: the guest
    may be half-way through a call."""

    def __init__(self, guest: Guest, store: Any, clock: Any, random: Any):
        self.store, self.clock, self.random = store, clock, random
        self._wasmtime = wasmtime.Store(ENGINE)
        self._ctx = self._store_ctx = _address(self._wasmtime._context())
        self._pending: BaseException | None = None
        self._trap = POINTER(capi.wasm_trap_t)()
        self._trap_ref = ctypes.addressof(self._trap)
        self.handles = Handles()
        handlers = {
            ("types", "[resource-drop]response"): Instance._response_drop,
            ("types", "[method]response.status"): Instance._response_status,
            ("types", "[method]response.size"): Instance._response_size,
            ("types", "[method]response.same-as"): Instance._response_same_as,
            ("clock", "now-ms"): Instance._now_ms,
            ("random", "random-u64"): Instance._random_u64,
            ("store", "get"): Instance._get,
            ("store", "insert"): Instance._insert,
            ("store", "replace"): Instance._replace,
        }
        funcs = []
        for imp, (iface, name) in zip(guest.module.imports, guest.imports, strict=False):
            env = next(_next_env)
            _HOST_FUNCS[env] = (weakref.ref(self), handlers[(iface, name)], _flat(IMPORTS[(iface, name)][0]))
            func = capi.wasmtime_func_t()
            _func_new_unchecked(
                self._ctx, _address(imp.type.ptr()), _address(_trampoline), env, _address(_finalize), ctypes.addressof(func)
            )
            funcs.append(wasmtime.Func._from_raw(func))
        exports: Any = wasmtime.Instance(self._wasmtime, guest.module, funcs).exports(self._wasmtime)
        self._memory_export = exports["memory"]
        self._memory = ctypes.addressof(self._memory_export._memory)
        self._size = -1
        self._mem = memoryview(b"")
        self._exports = {}
        for name, (params, results) in EXPORTS.items():
            self._exports[name] = _Export(exports[contract("guard") + "#" + name], params, results)
            self._exports["post-" + name] = _Export(exports["cabi_post_" + contract("guard") + "#" + name], ["i32"], [])
        self._realloc = _Export(exports["cabi_realloc"], ["i32"] * 4, ["i32"])

    # Calls into the guest.

    def _invoke(self, export: _Export) -> None:
        error = _call_unchecked(self._ctx, export.ref, export.address, export.count, self._trap_ref)
        if error or self._trap:
            pending, self._pending = self._pending, None
            if error:
                failure: Exception = wasmtime.WasmtimeError._from_ptr(ctypes.cast(error, POINTER(capi.wasmtime_error_t)))
            else:
                failure = wasmtime.Trap._from_ptr(self._trap)
            self._trap = POINTER(capi.wasm_trap_t)()
            self._trap_ref = ctypes.addressof(self._trap)
            if pending is not None:
                raise pending from failure
            raise failure

    def _call(self, name: str, *params: int) -> int:
        export = self._exports[name]
        export.params.pack_into(export.view, 0, *params)
        self._invoke(export)
        result: int = _U32.unpack_from(export.view)[0]
        return result

    def _post(self, name: str, ret: int) -> None:
        export = self._exports["post-" + name]
        export.values[0].i32 = ret
        self._invoke(export)

    def _view(self) -> memoryview:
        """Linear memory as it is now: call after the guest ran (it may have grown)."""
        size = _memory_size(self._ctx, self._memory)
        if size != self._size:
            base = _memory_data(self._ctx, self._memory)
            self._mem = memoryview((ctypes.c_ubyte * size).from_address(base)).cast("B")
            self._size = size
        return self._mem

    # Lowering: Python values into memory the guest owns. Allocations first, then one view, then the writes.

    def _put(self, writes: list[Any], data: bytes, align: int = 1) -> tuple[int, int]:
        """Allocates room for `data` (`cabi_realloc(0, 0, align, len)`: memory the
        guest then owns) and queues its write for `_flush`; the pointer and length."""
        n = len(data)
        r = self._realloc
        r.params.pack_into(r.view, 0, 0, 0, align, n)
        self._invoke(r)
        (ptr,) = _U32.unpack_from(r.view)
        if ptr % align:
            raise AbiViolation(f"cabi_realloc returned {ptr}, not aligned to {align}")
        writes.append((ptr, data))
        return ptr, n

    def _put_headers(self, writes: list[Any], headers: Sequence[tuple[str, bytes]]) -> tuple[int, int]:
        array = bytearray(HEADER.size * len(headers))
        for i, (name, value) in enumerate(headers):
            _HEADER.pack_into(array, i * HEADER.size, *self._put(writes, name.encode()), *self._put(writes, bytes(value)))
        ptr, _ = self._put(writes, bytes(array), HEADER.align)
        return ptr, len(headers)

    def _flush(self, writes: list[Any]) -> None:
        mem = self._view()
        for ptr, data in writes:
            if ptr + len(data) > self._size:
                raise AbiViolation(f"cabi_realloc returned {ptr}, beyond memory ({self._size} bytes)")
            mem[ptr : ptr + len(data)] = data

    def _checkpoint_params(self, writes: list[Any], c: Checkpoint | None) -> tuple[int, ...]:
        """`option<checkpoint>`'s five flat values."""
        if c is None:
            return (0, 0, 0, 0, 0)
        return (1, *self._put(writes, c.phase.encode()), *self._put(writes, bytes(c.data)))

    def _claim_params(self, writes: list[Any], c: Claim) -> tuple[int, ...]:
        """A claim's 13 flat values (CLAIM.flat)."""
        return (
            *self._put(writes, c.key.encode()),
            *self._put(writes, c.fingerprint.encode()),
            c.fence,
            c.holder,
            c.lease_until_ms,
            c.expires_at_ms,
            *self._checkpoint_params(writes, c.checkpoint),
        )

    def _put_checkpoint(self, writes: list[Any], out: bytearray, at: int, c: Checkpoint | None) -> None:
        """`option<checkpoint>` into `out` at `at`."""
        out[at] = c is not None
        if c is not None:
            _CHECKPOINT.pack_into(out, at + _CHECKPOINT_IN_OPTION, *self._checkpoint_params(writes, c)[1:])

    def _put_claim(self, writes: list[Any], out: bytearray, at: int, c: Claim) -> None:
        """A claim into `out` at `at` (CLAIM's layout)."""
        flat = self._claim_params(writes, c)
        _CLAIM.pack_into(out, at, *flat[:9])
        if c.checkpoint is not None:
            _CHECKPOINT.pack_into(out, at + CLAIM.offset["checkpoint"] + _CHECKPOINT_IN_OPTION, *flat[9:])

    def _put_params(self, writes: list[Any], name: str, fill: Callable[[bytearray, tuple[int, ...]], None]) -> int:
        """A function's parameters stored as their tuple (over 16 flat values): the pointer to pass."""
        ty = PARAMS[name]
        out = bytearray(ty.size)
        fill(out, _PARAMS_AT[name])
        return self._put(writes, bytes(out), ty.align)[0]

    # Lifting: the guest's memory into Python values (copied: the guest frees it in post-return).

    def _bytes(self, mem: memoryview, ptr: int, length: int) -> bytes:
        if ptr + length > self._size:
            raise AbiViolation(f"list at {ptr} of {length} bytes is beyond memory ({self._size} bytes)")
        return mem[ptr : ptr + length].tobytes()

    def _string(self, mem: memoryview, ptr: int, length: int) -> str:
        if ptr + length > self._size:
            raise AbiViolation(f"string at {ptr} of {length} bytes is beyond memory ({self._size} bytes)")
        try:
            return str(mem[ptr : ptr + length], "utf-8")
        except UnicodeDecodeError as e:
            raise AbiViolation(f"string at {ptr} is not UTF-8: {e}") from e

    def _checkpoint(self, mem: memoryview, at: int) -> Checkpoint | None:
        """`option<checkpoint>` at `at`."""
        if OPTION_CHECKPOINT.case(mem[at]) == "none":
            return None
        pp, pl, dp, dl = _CHECKPOINT.unpack_from(mem, at + _CHECKPOINT_IN_OPTION)
        return Checkpoint(self._string(mem, pp, pl), self._bytes(mem, dp, dl))

    def _claim(self, mem: memoryview, at: int) -> Claim:
        kp, kl, fp, fl, fence, holder, lease_until_ms, expires_at_ms, _ = _CLAIM.unpack_from(mem, at)
        checkpoint = self._checkpoint(mem, at + CLAIM.offset["checkpoint"])
        return Claim(self._string(mem, kp, kl), self._string(mem, fp, fl), fence, holder, lease_until_ms, expires_at_ms, checkpoint)

    def _failure(self, mem: memoryview, at: int) -> Failure:
        (case,) = _DISC.unpack_from(mem, at)
        return Failure(GUARD_ERROR.case(case), self._string(mem, *_PTR_LEN.unpack_from(mem, at + GUARD_ERROR.payload)))

    # The exports of wit/guard.wit.

    def _decision(self, name: str, params: tuple[int, ...]) -> tuple[str, Any] | Failure:
        """Calls `begin` or `begin-request`: `result<decision, guard-error>`."""
        ret = self._call(name, *params)
        mem = self._view()
        (ok,) = _DISC.unpack_from(mem, ret)
        if BEGIN_RESULT.case(ok) == "err":
            value: Any = self._failure(mem, ret + BEGIN_RESULT.payload)
        else:
            tag = DECISION.case(mem[ret + _BEGIN_OK])
            if tag == "proceed":
                value = (tag, self._claim(mem, ret + _BEGIN_CASE))
            elif tag == "replay":
                value = (tag, self.handles.take(_U32.unpack_from(mem, ret + _BEGIN_CASE)[0]))
            elif tag == "in-flight":
                value = (tag, _VERSION.unpack_from(mem, ret + _BEGIN_CASE)[0])
            else:
                value = (tag, None)
        self._post(name, ret)
        decision: tuple[str, Any] | Failure = value
        return decision

    @clears_handles
    def begin(self, key: str, fingerprint: str, policy: Policy) -> tuple[str, Any] | Failure:
        writes: list[Any] = []
        params = (*self._put(writes, key.encode()), *self._put(writes, fingerprint.encode()), *policy)
        self._flush(writes)
        return self._decision("begin", params)

    @clears_handles
    def begin_request(
        self, key: str, method: str, path: str, headers: Sequence[tuple[str, bytes]], body: bytes, policy: Policy
    ) -> tuple[str, Any] | Failure:
        writes: list[Any] = []
        params = (
            *self._put(writes, key.encode()),
            *self._put(writes, method.encode()),
            *self._put(writes, path.encode()),
            *self._put_headers(writes, headers),
            *self._put(writes, bytes(body)),
            *policy,
        )
        self._flush(writes)
        return self._decision("begin-request", params)

    def _unit(self, name: str, params: tuple[int, ...]) -> Failure | None:
        ret = self._call(name, *params)
        mem = self._view()
        failure = None if UNIT_RESULT.case(mem[ret]) == "ok" else self._failure(mem, ret + _UNIT_ERR)
        self._post(name, ret)
        return failure

    @clears_handles
    def complete(self, claim: Claim, response: Response, policy: Policy) -> Failure | None:
        writes: list[Any] = []

        def fill(out: bytearray, at: tuple[int, ...]) -> None:
            self._put_claim(writes, out, at[0], claim)
            _U32.pack_into(out, at[1], self.handles.own(response))
            _POLICY.pack_into(out, at[2], *policy)

        params = self._put_params(writes, "complete", fill)
        self._flush(writes)
        return self._unit("complete", (params,))

    @clears_handles
    def release(self, claim: Claim) -> Failure | None:
        writes: list[Any] = []
        params = self._claim_params(writes, claim)
        self._flush(writes)
        return self._unit("release", params)

    def _claim_result(self, name: str, params: tuple[int, ...]) -> Claim | Failure:
        """Calls `renew` or `save-checkpoint`: `result<claim, guard-error>`."""
        ret = self._call(name, *params)
        mem = self._view()
        ok = CLAIM_RESULT.case(mem[ret]) == "ok"
        value = self._claim(mem, ret + _CLAIM_OK) if ok else self._failure(mem, ret + CLAIM_RESULT.payload)
        self._post(name, ret)
        return value

    @clears_handles
    def renew(self, claim: Claim, policy: Policy) -> Claim | Failure:
        writes: list[Any] = []
        params = (*self._claim_params(writes, claim), *policy)
        self._flush(writes)
        return self._claim_result("renew", params)

    @clears_handles
    def save_checkpoint(self, claim: Claim, checkpoint: Checkpoint, policy: Policy) -> Claim | Failure:
        writes: list[Any] = []

        def fill(out: bytearray, at: tuple[int, ...]) -> None:
            self._put_claim(writes, out, at[0], claim)
            _CHECKPOINT.pack_into(out, at[1], *self._checkpoint_params(writes, checkpoint)[1:])
            _POLICY.pack_into(out, at[2], *policy)

        params = self._put_params(writes, "save-checkpoint", fill)
        self._flush(writes)
        return self._claim_result("save-checkpoint", (params,))

    @clears_handles
    def fingerprint(self, method: str, path: str, headers: Sequence[tuple[str, bytes]], body: bytes) -> str:
        writes: list[Any] = []
        params = (
            *self._put(writes, method.encode()),
            *self._put(writes, path.encode()),
            *self._put_headers(writes, headers),
            *self._put(writes, bytes(body)),
        )
        self._flush(writes)
        ret = self._call("fingerprint", *params)
        mem = self._view()
        value = self._string(mem, *_PTR_LEN.unpack_from(mem, ret))
        self._post("fingerprint", ret)
        return value

    # The imports of wit/clock.wit, wit/random.wit and wit/store.wit.

    def _host_call(self: Instance | None, caller: Any, values: Any, handler: Callable[..., None], params: struct.Struct) -> int:
        """Runs an import: its flat parameters unpacked; a host exception becomes a trap
        (raised again from the export call that was running)."""
        if self is None:
            return _trap("the instance was dropped")
        try:
            if params.size:  # the store's imports read memory and allocate: through the caller
                self._ctx = _caller_context(caller)
                handler(self, values, params.unpack(ctypes.string_at(values, params.size)))
            else:  # clock and random only write their result
                handler(self, values, ())
            return 0
        except BaseException as e:  # noqa: BLE001 - any exception of a host function becomes a trap, re-raised after the call
            self._pending = e
            return _trap(f"host function raised {type(e).__name__}: {e}")
        finally:
            self._ctx = self._store_ctx

    def _now_ms(self, values: int, _params: tuple[Any, ...]) -> None:
        ctypes.c_uint64.from_address(values).value = self.clock.now_ms()

    def _random_u64(self, values: int, _params: tuple[Any, ...]) -> None:
        ctypes.c_uint64.from_address(values).value = self.random.random_u64()

    # wit/types.wit's `response`: its methods take the handle as a borrow.

    def _response_drop(self, _values: int, params: tuple[Any, ...]) -> None:
        self.handles.take(params[0])

    def _response_status(self, values: int, params: tuple[Any, ...]) -> None:
        ctypes.c_uint32.from_address(values).value = status_u16(self.handles.borrow(params[0]))

    def _response_size(self, values: int, params: tuple[Any, ...]) -> None:
        ctypes.c_uint64.from_address(values).value = response_size(self.handles.borrow(params[0]))

    def _response_same_as(self, values: int, params: tuple[Any, ...]) -> None:
        this, other = params
        ctypes.c_uint32.from_address(values).value = same_response(self.handles.borrow(this), self.handles.borrow(other))

    def _at(self, ptr: int, ty: Type) -> int:
        """A struct the guest passed by pointer: aligned and within memory."""
        if ptr % ty.align or ptr + ty.size > self._size:
            raise AbiViolation(f"{ty.size} bytes at {ptr} are misaligned (to {ty.align}) or beyond memory ({self._size} bytes)")
        return ptr

    def _record(self, mem: memoryview, at: int, response: Response | None) -> Record:
        """`record` at `at` (RECORD's layout), with the response that goes with it."""
        fp, fl, state, holder, lease_until_ms, expires_at_ms = _RECORD_HEAD.unpack_from(mem, at)
        checkpoint = self._checkpoint(mem, at + _CHECKPOINT_IN_RECORD)
        return Record(self._string(mem, fp, fl), STATE.case(state), holder, lease_until_ms, expires_at_ms, response, checkpoint)

    def _store_error(self, writes: list[Any], ret: int, result: Variant, fault: StoreFault) -> None:
        case = STORE_ERROR.cases.index(fault.kind)
        message = self._put(writes, str(fault).encode())
        writes.append((ret, struct.pack("<B", result.cases.index("err"))))
        writes.append((ret + result.payload, struct.pack("<B", case)))
        writes.append((ret + result.payload + STORE_ERROR.payload, _PTR_LEN.pack(*message)))

    def _get(self, _values: Any, params: tuple[Any, ...]) -> None:
        kp, kl, now_ms, ret = params
        mem = self._view()
        self._at(ret, GET_RESULT)
        writes: list[Any] = []
        try:
            entry = self.store.get(self._string(mem, kp, kl), now_ms)
        except StoreFault as fault:
            self._store_error(writes, ret, GET_RESULT, fault)
        else:
            writes.append((ret, b"\0"))  # ok
            writes.append((ret + GET_RESULT.payload, struct.pack("<B", entry is not None)))
            if entry is not None:
                writes.append((ret + _GET_ENTRY_AT, self._lower_entry(writes, entry)))
        self._flush(writes)

    def _store_params(self, ptr: int, ret: int, params: Rec, result: Variant) -> memoryview:
        """Memory, for a store import that passed its parameters (`params`) and the
        place for its result (`result`) by pointer: both checked."""
        mem = self._view()
        self._at(ptr, params)
        self._at(ret, result)
        return mem

    def _insert(self, _values: Any, params: tuple[Any, ...]) -> None:
        kp, kl, fp, fl, state, holder, lease_until_ms, expires_at_ms, has_checkpoint, pp, pl, dp, dl, now_ms, ret = params
        mem = self._view()
        self._at(ret, INSERT_RESULT)
        checkpoint = None
        if OPTION_CHECKPOINT.case(has_checkpoint) == "some":
            checkpoint = Checkpoint(self._string(mem, pp, pl), self._bytes(mem, dp, dl))
        # The guard inserts only `processing` records: no response goes with them.
        record = Record(self._string(mem, fp, fl), STATE.case(state), holder, lease_until_ms, expires_at_ms, None, checkpoint)
        key = self._string(mem, kp, kl)
        writes: list[Any] = []
        try:
            outcome = self.store.insert(key, record, now_ms)
        except StoreFault as fault:
            self._store_error(writes, ret, INSERT_RESULT, fault)
        else:
            if isinstance(outcome, Entry):
                writes.append((ret, b"\0"))  # ok
                writes.append((ret + INSERT_RESULT.payload, struct.pack("<B", INSERT_OUTCOME.cases.index("existing"))))
                writes.append((ret + _ENTRY_AT, self._lower_entry(writes, outcome)))
            else:
                writes.append((ret, _OK_U64.pack(0, INSERT_OUTCOME.cases.index("inserted"), outcome)))
        self._flush(writes)

    def _lower_entry(self, writes: list[Any], entry: Entry) -> bytes:
        """`entry` as it sits in memory (ENTRY.size bytes); its strings and lists
        allocated, its response (the `Record`'s) given a handle."""
        r = entry.record
        out = bytearray(ENTRY.size)
        fingerprint = self._put(writes, r.fingerprint.encode())
        _RECORD_HEAD.pack_into(out, 0, *fingerprint, STATE.cases.index(r.state), r.holder, r.lease_until_ms, r.expires_at_ms)
        if r.response is not None:  # the stored response: a new handle the guest owns
            _OPTION_HANDLE.pack_into(out, ENTRY.offset["response"], 1, self.handles.own(r.response))
        self._put_checkpoint(writes, out, RECORD.offset["checkpoint"], r.checkpoint)
        _VERSION.pack_into(out, ENTRY.offset["version"], entry.version)
        return bytes(out)

    def _replace(self, _values: Any, params: tuple[Any, ...]) -> None:
        ptr, ret = params
        mem = self._store_params(ptr, ret, _REPLACE_PARAMS, REPLACE_RESULT)
        key = self._string(mem, *_PTR_LEN.unpack_from(mem, ptr + _REPLACE_KEY))
        (expected_version,) = _VERSION.unpack_from(mem, ptr + _REPLACE_EXPECTED)
        has_response, handle = _OPTION_HANDLE.unpack_from(mem, ptr + _REPLACE_RESPONSE)
        response = self.handles.borrow(handle) if OPTION_RESPONSE.case(has_response) == "some" else None
        record = self._record(mem, ptr + _REPLACE_RECORD, response)
        (now_ms,) = _VERSION.unpack_from(mem, ptr + _REPLACE_NOW)
        writes: list[Any] = []
        try:
            written = self.store.replace(key, expected_version, record, now_ms)
        except StoreFault as fault:
            self._store_error(writes, ret, REPLACE_RESULT, fault)
        else:
            writes.append((ret, _OK_BOOL.pack(0, _written(written))))
        self._flush(writes)
