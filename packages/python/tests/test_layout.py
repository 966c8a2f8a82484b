"""The on-store layout (wit/store-layout/): the Redis value and the PostgreSQL
columns the Python stores write and read, byte for byte and column for
column against vectors.json (made by an independent encoder, vectors.py),
and the shared scripts and statements as the stores load them. No server
needed; tests/test_netstores.py runs the stores themselves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from idem_guard import layout
from idem_guard.clock import SyncedClock
from idem_guard.postgres import SCHEMA_VERSION, STATEMENTS, decode_row, record_params
from idem_guard.redis import decode, encode, time_ms
from idem_guard.types import Checkpoint, Entry, Record, Response, StoreFault

VECTORS = json.loads((Path(__file__).resolve().parents[3] / "wit" / "store-layout" / "vectors.json").read_text("utf-8"))


def record(v: dict) -> Record:
    r = v["response"]
    response = None
    if r is not None:
        response = Response(r["status"], [(n, bytes.fromhex(h)) for n, h in r["headers"]], bytes.fromhex(r["body"]))
    c = v["checkpoint"]
    checkpoint = None if c is None else Checkpoint(c["phase"], bytes.fromhex(c["data"]))
    return Record(
        v["fingerprint"], v["state"], int(v["holder"]), int(v["lease_until_ms"]), int(v["expires_at_ms"]), response, checkpoint
    )


def columns(row: dict) -> list[Any]:
    """A vector's `postgres` columns after `version`, as psycopg passes and returns them."""

    def num(s: str | None) -> int | None:
        return None if s is None else int(s)

    def blob(h: str | None) -> bytes | None:
        return None if h is None else bytes.fromhex(h)

    return [
        row["fingerprint"],
        row["state"],
        num(row["lease_until_ms"]),
        num(row["expires_at_ms"]),
        row["status"],
        row["header_names"],
        None if row["header_values"] is None else [bytes.fromhex(h) for h in row["header_values"]],
        blob(row["body"]),
        num(row["holder"]),
        row["phase"],
        blob(row["checkpoint"]),
    ]


RECORDS = VECTORS["records"]
NAMES = [v["name"] for v in RECORDS]


def test_the_vectors_cover_the_layout() -> None:
    assert len(RECORDS) >= 5 and VECTORS["legacy_redis"] and VECTORS["corrupt_redis"]


@pytest.mark.parametrize("v", RECORDS, ids=NAMES)
def test_redis_values_encode_and_decode_as_the_layout_says(v: dict) -> None:
    version, expected = int(v["version"]), record(v["record"])
    assert encode(version, expected).hex() == v["redis"]
    assert decode("k", bytes.fromhex(v["redis"])) == Entry(expected, version)


@pytest.mark.parametrize("v", VECTORS["legacy_redis"], ids=[v["name"] for v in VECTORS["legacy_redis"]])
def test_redis_values_of_0_1_hosts_read_as_holder_0_without_a_checkpoint(v: dict) -> None:
    assert decode("k", bytes.fromhex(v["redis"])) == Entry(record(v["record"]), int(v["version"]))


@pytest.mark.parametrize("v", VECTORS["corrupt_redis"], ids=[v["name"] for v in VECTORS["corrupt_redis"]])
def test_corrupt_redis_values_are_refused_naming_the_key(v: dict) -> None:
    with pytest.raises(StoreFault) as fault:
        decode("order-17", bytes.fromhex(v["redis"]))
    assert fault.value.kind == "corrupt" and "'order-17'" in str(fault.value)


@pytest.mark.parametrize("v", RECORDS, ids=NAMES)
def test_postgres_rows_are_the_layouts_columns(v: dict) -> None:
    expected = record(v["record"])
    row = columns(v["postgres"])
    assert record_params(expected) == row
    # Read back: times saturated at 2^63 - 1 stay there (the vector of times at the top of u64).
    version = int(v["postgres"]["version"])
    entry = decode_row("k", [version, *row])
    saturated = expected._replace(
        lease_until_ms=min(expected.lease_until_ms, (1 << 63) - 1), expires_at_ms=min(expected.expires_at_ms, (1 << 63) - 1)
    )
    assert entry == Entry(saturated, version)


@pytest.mark.parametrize(
    "change, why",
    [
        ({0: -1}, "version"),
        ({3: -5}, "lease_until_ms"),
        ({2: "finished"}, "unknown state"),
        ({5: 200}, "response columns"),
        ({5: 70_000, 6: [], 7: [], 8: b""}, "status 70000"),
        ({5: 200, 6: ["a"], 7: [], 8: b""}, "response columns"),
        ({10: "charged"}, "partly present"),
    ],
)
def test_postgres_rows_that_do_not_decode_are_corrupt_naming_the_key(change: dict, why: str) -> None:
    row: list[Any] = [1, *record_params(Record("fp", "processing", 7, 10, 20, None, None))]
    for at, value in change.items():
        row[at] = value
    with pytest.raises(StoreFault) as fault:
        decode_row("order-17", row)
    assert fault.value.kind == "corrupt" and "'order-17'" in str(fault.value) and why in str(fault.value)


def test_every_statement_is_one_statement_with_the_table_filled_in() -> None:
    for name in STATEMENTS:
        text = layout.postgres_statement(name, "idem_t")
        assert "{t}" not in text and "-- name:" not in text and not text.endswith(";"), name
        assert "idem_t" in text or name == "now", name  # `now` reads the server's clock, no table
    schema = layout.postgres_schema("idem_t")
    assert f"INSERT INTO idem_schema VALUES ('idem_t', {SCHEMA_VERSION}) " in schema
    assert "{t}" not in schema


@pytest.mark.parametrize("table", ["", "1abc", "Idem", "idem-records", "a" * 49, "t; DROP TABLE x"])
def test_a_table_name_outside_the_layout_is_refused(table: str) -> None:
    with pytest.raises(ValueError, match="1 to 48 characters"):
        layout.postgres_schema(table)


def test_the_scripts_are_the_layouts_files() -> None:
    for name in ("claim_expired", "replace", "delete_at", "purge"):
        assert layout.redis_script(name) == (layout.root() / "redis" / f"{name}.lua").read_text("utf-8")
    assert (layout.root() / "redis" / "replace.lua").read_bytes() == (
        Path(__file__).resolve().parents[3] / "wit" / "store-layout" / "redis" / "replace.lua"
    ).read_bytes(), "the package's copy is the repository's file"


# --- the time authority (README.md, "Time"; vectors.json `time`) -----------------------------


@pytest.mark.parametrize("vector", VECTORS["time"]["redis_time"], ids=lambda v: " ".join(v["reply"]))
def test_a_redis_time_reply_reads_as_the_layouts_milliseconds(vector: dict) -> None:
    seconds, micros = (int(part) for part in vector["reply"])
    assert time_ms(seconds, micros) == int(vector["ms"])


@pytest.mark.parametrize("vector", VECTORS["time"]["readings"], ids=lambda v: f"rtt {int(v['received']) - int(v['sent'])} at {v['at']}")
def test_a_reading_gives_the_layouts_time_and_error_bound(vector: dict) -> None:
    n = {k: int(v) for k, v in vector.items()}
    clock = SyncedClock("vectors")
    clock.adopt(n["server_ms"], n["sent"], n["received"])
    assert clock.at(n["at"]) == n["now_ms"]
    assert clock.error_at(n["at"]) == n["error_ms"]


def test_the_layout_has_time_vectors() -> None:
    assert len(VECTORS["time"]["redis_time"]) >= 4 and len(VECTORS["time"]["readings"]) >= 2
