"""How `idempotent_function` stores a return value and gives it back on a replay.

A value is stored as compact JSON (UTF-8, no NaN or infinities). Besides what
`json` encodes itself, these are encoded, and decoded back to their type when
the function's return annotation names it:

| type | stored as | a replay returns (annotated) |
|---|---|---|
| `datetime`, `date`, `time` | ISO 8601 text (`isoformat()`) | `fromisoformat(text)` |
| `Decimal` | its text (`str(d)`: no precision lost) | `Decimal(text)` |
| `UUID` | its text | `UUID(text)` |
| `Enum` members | their value | `EnumClass(value)` |
| dataclass instances | a dict of their fields | the dataclass, fields decoded by their types |
| Pydantic models (`model_dump`) | `model_dump(mode="json")` | `Model.model_validate(value)` |
| `tuple`, `set`, `frozenset` | a list | the annotated container |

Without an annotation (or with `Any`, `object`, a bare `dict`/`list`) a replay
returns what `json.loads` gives: text for a datetime, a list for a tuple.

`check_storable(annotation)` refuses, when the function is decorated, a return
annotation none of these can store (a class `json` does not know, a
generator, a callable), naming the type and the way out (`encode=`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import types
import typing
import uuid
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Union

__all__ = ["Unstorable", "check_storable", "decode_as", "default", "dumps"]


class Unstorable(TypeError):
    """A return type (or a value) the decorator cannot store as JSON."""


def _is_model(value: Any) -> bool:
    return callable(getattr(value, "model_dump", None)) and not isinstance(value, type)


def _is_model_class(tp: Any) -> bool:
    return isinstance(tp, type) and callable(getattr(tp, "model_validate", None)) and hasattr(tp, "model_fields")


def default(value: Any) -> Any:
    """`json.dumps`' `default=`: the JSON form of the types in the module's table."""
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise Unstorable(f"Decimal {value} is not finite: JSON has no NaN or infinity")
        return str(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if _is_model(value):
        return value.model_dump(mode="json")
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    raise Unstorable(
        f"{type(value).__name__} is not JSON-serialisable (the decorator stores datetime, date, time, Decimal, "
        "UUID, Enum, dataclasses, Pydantic models and what json encodes); pass encode= and decode= for it"
    )


# Made once: json.dumps with options builds an encoder per call.
_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=default)
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=default)


def dumps(value: Any, *, sort_keys: bool = False) -> bytes:
    """Compact JSON of `value` as UTF-8, the module's types included; `Unstorable` when it cannot be."""
    try:
        text = (_CANONICAL if sort_keys else _COMPACT).encode(value)
    except Unstorable:
        raise
    except (TypeError, ValueError) as e:  # NaN, a circular reference, a key json refuses
        raise Unstorable(str(e)) from e
    return text.encode()


_SCALARS: tuple[type, ...] = (str, int, float, bool, type(None), dt.datetime, dt.date, dt.time, Decimal, uuid.UUID)
_UNCHECKED = (Any, object)


def _origin(tp: Any) -> Any:
    return typing.get_origin(tp)


def check_storable(tp: Any, where: str) -> None:
    """Raises `Unstorable` naming `where` when a value of type `tp` cannot be stored."""
    problem = _unstorable(tp, set())
    if problem is not None:
        raise Unstorable(
            f"{where} returns {_name(tp)}, which the decorator cannot store: {problem}. It stores what json "
            "encodes and datetime, date, time, Decimal, UUID, Enum, dataclasses and Pydantic models; "
            "pass encode= and decode= for anything else"
        )


def _name(tp: Any) -> str:
    return tp.__qualname__ if isinstance(tp, type) else repr(tp)


def _unstorable(tp: Any, seen: set[int]) -> str | None:
    """Why `tp` cannot be stored, or None when it can (or cannot be told before a value exists)."""
    if tp in _UNCHECKED or isinstance(tp, (typing.TypeVar, str, typing.ForwardRef)):
        return None
    if id(tp) in seen:
        return None  # a recursive type: checked once
    seen = seen | {id(tp)}
    origin = _origin(tp)
    if origin is typing.Annotated:
        return _unstorable(typing.get_args(tp)[0], seen)
    if origin is typing.Literal:
        return None
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(tp):
            if (why := _unstorable(arg, seen)) is not None:
                return why
        return None
    if origin is not None:
        if origin in (list, tuple, set, frozenset, dict) or (
            isinstance(origin, type) and issubclass(origin, (typing.Sequence, typing.Mapping, typing.AbstractSet))
            and not issubclass(origin, (bytes, bytearray))
        ):
            for arg in typing.get_args(tp):
                if arg is not Ellipsis and (why := _unstorable(arg, seen)) is not None:
                    return why
            if origin is dict or (isinstance(origin, type) and issubclass(origin, typing.Mapping)):
                args = typing.get_args(tp)
                if args and args[0] not in (str, Any) and not (isinstance(args[0], type) and issubclass(args[0], (str, int, float, bool))):
                    return f"a mapping's keys must be text (or numbers): {_name(args[0])}"
            return None
        if origin in (Callable, typing.Callable) or origin is type:
            return f"{_name(origin)} is not data"
        return f"{_name(origin)} is not data the decorator knows"
    if not isinstance(tp, type):
        return None  # something typing-specific it cannot judge (NewType, a TypedDict-like alias): checked when stored
    if tp in (list, tuple, set, frozenset, dict) or issubclass(tp, _SCALARS):
        return None
    if issubclass(tp, enum.Enum):
        return None
    if issubclass(tp, (bytes, bytearray, memoryview)):
        return "bytes are not JSON (encode them as text, e.g. base64, or pass encode=)"
    if dataclasses.is_dataclass(tp):
        try:
            hints = typing.get_type_hints(tp)
        except Exception:  # noqa: BLE001 - an unresolvable forward reference: checked when stored
            return None
        for f in dataclasses.fields(tp):
            if (why := _unstorable(hints.get(f.name, Any), seen)) is not None:
                return f"field {f.name!r} of {tp.__qualname__}: {why}"
        return None
    if _is_model_class(tp):
        return None
    if typing.is_typeddict(tp):
        return None
    return f"{tp.__qualname__} is neither JSON nor one of the types it knows"


def decode_as(value: Any, tp: Any) -> Any:
    """`value` (from `json.loads`) as type `tp`, for the types of the module's table;
    anything else (and any value that does not fit) is returned as it is."""
    if tp in _UNCHECKED or value is None:
        return value
    origin = _origin(tp)
    if origin is typing.Annotated:
        return decode_as(value, typing.get_args(tp)[0])
    if origin in (Union, types.UnionType):
        options = [a for a in typing.get_args(tp) if a is not type(None)]
        return decode_as(value, options[0]) if len(options) == 1 else value
    if origin is not None:
        args = typing.get_args(tp)
        if isinstance(value, list) and origin in (list, tuple, set, frozenset):
            if origin is tuple and args and (len(args) != 2 or args[1] is not Ellipsis):
                return tuple(decode_as(v, a) for v, a in zip(value, args, strict=False))
            item = args[0] if args else Any
            return origin(decode_as(v, item) for v in value)
        if isinstance(value, dict) and origin is dict and len(args) == 2:
            return {k: decode_as(v, args[1]) for k, v in value.items()}
        return value
    if not isinstance(tp, type):
        return value
    try:
        if tp is dt.datetime and isinstance(value, str):
            return dt.datetime.fromisoformat(value)
        if tp is dt.date and isinstance(value, str):
            return dt.date.fromisoformat(value)
        if tp is dt.time and isinstance(value, str):
            return dt.time.fromisoformat(value)
        if tp is Decimal and isinstance(value, (str, int, float)):
            return Decimal(str(value))
        if tp is uuid.UUID and isinstance(value, str):
            return uuid.UUID(value)
        if issubclass(tp, enum.Enum):
            return tp(value)
        if tp in (tuple, set, frozenset) and isinstance(value, list):
            return tp(value)
        if dataclasses.is_dataclass(tp) and isinstance(value, dict):
            hints = typing.get_type_hints(tp)
            fields = {f.name: decode_as(value[f.name], hints.get(f.name, Any)) for f in dataclasses.fields(tp) if f.name in value}
            return tp(**fields)
        if _is_model_class(tp):
            return tp.model_validate(value)  # type: ignore[attr-defined]
    except (ValueError, TypeError, KeyError, NameError):
        return value  # stored by another encoder, or a type that changed since: the JSON as it is
    return value
