"""The on-store layout's shared files: the Redis scripts and the PostgreSQL
schema and statements of `wit/store-layout/` (its README is the spec), loaded
as they are, so that every host runs the same text.

Where they are read from: `idem_guard/store_layout/` inside an installed
package (packages/python/build.sh copies `wit/store-layout/` there when it
builds the wheel; the copy is never committed), else the repository's own
`wit/store-layout/` when the package runs from a source checkout
(`PYTHONPATH=packages/python/src`, or an editable install)::

    from idem_guard import layout
    script = layout.redis_script("replace")        # replace.lua's text
    sql = layout.postgres_statement("get", "idem_records")
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# The wheel's copy first; then the checkout: packages/python/src/idem_guard -> the repository root.
CANDIDATES = (_HERE / "store_layout", _HERE.parents[3] / "wit" / "store-layout")

# A PostgreSQL table name the layout allows: it is spliced into SQL text, so nothing else passes.
TABLE_NAME = re.compile(r"[a-z_][a-z0-9_]{0,47}")


@cache
def root() -> Path:
    """The folder holding `redis/` and `postgres/`."""
    for candidate in CANDIDATES:
        if (candidate / "redis" / "replace.lua").is_file():
            return candidate
    raise FileNotFoundError(
        "the on-store layout's scripts and SQL are not found at "
        + " or ".join(str(c) for c in CANDIDATES)
        + ": build the wheel with packages/python/build.sh, which copies wit/store-layout/ into it"
    )


@cache
def _text(*parts: str) -> str:
    return root().joinpath(*parts).read_text(encoding="utf-8")


def redis_script(name: str) -> str:
    """The Lua script `redis/{name}.lua` (claim_expired, replace, delete_at, purge)."""
    return _text("redis", f"{name}.lua")


def check_table(table: str) -> str:
    """`table` if the layout allows it (1 to 48 of a-z, 0-9 and _, not starting with a digit); else ValueError."""
    if not TABLE_NAME.fullmatch(table):
        raise ValueError(f"table {table!r} must be 1 to 48 characters of a-z, 0-9 and _, not starting with a digit")
    return table


def postgres_schema(table: str) -> str:
    """`postgres/schema.sql` for `table`: one multi-statement script, run once before the first statement."""
    return _text("postgres", "schema.sql").replace("{t}", check_table(table))


def postgres_statement(name: str, table: str) -> str:
    """The statement after `-- name: {name}` in `postgres/statements.sql`, up to the
    next name, without its final `;`, for `table`."""
    text = _text("postgres", "statements.sql")
    marker = f"-- name: {name}\n"
    start = text.find(marker)
    if start < 0:
        raise KeyError(f"statements.sql has no statement named {name!r}")
    body = text[start + len(marker) :]
    end = body.find("-- name: ")
    body = body if end < 0 else body[:end]
    return body.rstrip().rstrip(";").replace("{t}", check_table(table))
