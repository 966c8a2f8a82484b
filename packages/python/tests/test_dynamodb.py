"""DynamoDbStore (idem_guard.dynamodb): its items against the layout's vectors
(wit/store-layout/vectors.json: each record's `dynamodb`, `corrupt_dynamodb`,
`time.dynamodb_date`, `time.dynamodb_readings`), and live on the server
IDEM_TEST_DYNAMODB_URL names (`dynamodb://HOST:PORT?table=…&region=…`; CI:
moto's, started by scripts/services.sh): the primitives one conditional
request each, the TTL attribute, undecodable items corrupt naming the key, the
clock from the Date header, and every conformance scenario through `Guard`
(both bindings) and through `AsyncGuard`'s journal replay, as
tests/test_netstores.py runs them on Redis and PostgreSQL.

Each test's tables are named `idempy_{pid}_…` and deleted afterwards."""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from idem_guard import Guard, Response
from idem_guard.clock import SyncedClock
from idem_guard.types import Entry, Record, StoreFault
from stores import AsyncFaulty, Faulty, server_url, unique
from test_conformance import FILES, load, run_scenario
from test_layout import VECTORS, record

pytest.importorskip("boto3")

from idem_guard.dynamodb import AsyncDynamoDbStore, DynamoDbStore, date_ms, decode_item, encode_item

BINDINGS = ["static", "dynamic"]
RECORDS = VECTORS["records"]
BASE = 1_792_382_400_000


def item(attributes: dict[str, Any]) -> dict[str, Any]:
    """An item of the vectors' DynamoDB JSON (`B` in hex) as boto3 gives it (`B` as bytes)."""

    def attribute(v: dict[str, Any]) -> dict[str, Any]:
        if "B" in v:
            return {"B": bytes.fromhex(v["B"])}
        if "L" in v:
            return {"L": [attribute(x) for x in v["L"]]}
        return v

    return {name: attribute(v) for name, v in attributes.items()}


# --- the vectors --------------------------------------------------------------


def test_the_vectors_cover_dynamodb() -> None:
    assert all("dynamodb" in v for v in RECORDS) and len(VECTORS["corrupt_dynamodb"]) >= 5
    assert len(VECTORS["time"]["dynamodb_date"]) >= 2 and len(VECTORS["time"]["dynamodb_readings"]) >= 2


@pytest.mark.parametrize("v", RECORDS, ids=[v["name"] for v in RECORDS])
def test_each_record_encodes_to_the_layouts_dynamodb_item_and_decodes_back(v: dict) -> None:
    version, expected = int(v["version"]), record(v["record"])
    assert encode_item("k", version, expected) == {"key": {"S": "k"}, **item(v["dynamodb"])}
    assert decode_item("k", item(v["dynamodb"])) == Entry(expected, version)


@pytest.mark.parametrize("v", VECTORS["corrupt_dynamodb"], ids=[v["name"] for v in VECTORS["corrupt_dynamodb"]])
def test_a_corrupt_dynamodb_item_is_refused_as_corrupt_naming_the_key(v: dict) -> None:
    with pytest.raises(StoreFault) as fault:
        decode_item("order-17", item(v["dynamodb"]))
    assert fault.value.kind == "corrupt" and "'order-17'" in str(fault.value), str(fault.value)


@pytest.mark.parametrize("vector", VECTORS["time"]["dynamodb_date"], ids=lambda v: v["date"])
def test_a_date_header_reads_as_the_start_of_its_second(vector: dict) -> None:
    assert date_ms(vector["date"]) == int(vector["ms"])


@pytest.mark.parametrize("vector", VECTORS["time"]["dynamodb_readings"], ids=lambda v: f"rtt {int(v['received']) - int(v['sent'])} at {v['at']}")
def test_a_date_reading_is_the_middle_of_its_second_with_half_a_second_more_error(vector: dict) -> None:
    n = {k: int(v) for k, v in vector.items()}
    clock = SyncedClock("vectors", resolution_ms=1_000)
    clock.adopt(n["server_ms"], n["sent"], n["received"])
    assert clock.at(n["at"]) == n["now_ms"]
    assert clock.error_at(n["at"]) == n["error_ms"]


def test_a_date_header_that_does_not_parse_is_refused() -> None:
    with pytest.raises(ValueError, match="does not parse"):
        date_ms("yesterday")


# --- live, on the server ------------------------------------------------------


class Server:
    """The server of IDEM_TEST_DYNAMODB_URL, and the tables this run made on it (deleted at the end)."""

    def __init__(self, url: str):
        parsed = urllib.parse.urlsplit(url)
        assert parsed.scheme == "dynamodb" and parsed.netloc, f"IDEM_TEST_DYNAMODB_URL={url}: expected dynamodb://HOST:PORT?region=…"
        query = dict(urllib.parse.parse_qsl(parsed.query))
        self.endpoint = f"http://{parsed.netloc}"
        self.region = query.get("region", "us-east-1")
        self.made: list[str] = []

    def open(self, table: str | None = None, **options: Any) -> DynamoDbStore:
        if table is None:
            table = unique("d")
            self.made.append(table)
        # The one-thread emulator queues requests: a generous timeout (as the Rust and JS tests).
        options.setdefault("timeout_ms", 10_000)
        return DynamoDbStore(endpoint=self.endpoint, region=self.region, table=table, **options)

    def drop(self) -> None:
        if not self.made:
            return
        with self.open(self.made[0]) as store:
            for table in self.made:
                store.client.delete_table(TableName=table)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    made = Server(server_url("IDEM_TEST_DYNAMODB_URL"))
    yield made
    made.drop()


def claim(lease: int, expires: int) -> Record:
    return Record("fp", "processing", 7, lease, expires, None)


def test_a_claim_a_refusal_a_completion_a_takeover_and_a_release_each_one_request(server: Server) -> None:
    with server.open() as store:
        sent: list[str] = []
        store.client.meta.events.register("before-call.dynamodb.*", lambda model, **_: sent.append(model.name))
        assert store.insert("k", claim(BASE + 1_000, BASE + 10_000), BASE) == 1
        assert store.insert("k", claim(BASE + 2_000, BASE + 20_000), BASE) == Entry(claim(BASE + 1_000, BASE + 10_000), 1)
        done = Record("fp", "done", 7, BASE, BASE + 10_000, Response(201, [("x", b"\xff")], b"\x01\x02"))
        assert store.replace("k", 2, done, BASE) is False, "a stale version"
        assert store.replace("k", 1, done, BASE) is True
        assert store.get("k", BASE) == Entry(done, 2)
        assert store.get("k", BASE + 10_000) is None, "expired"
        # Over the expired record: its version + 1, its response gone.
        assert store.insert("k", claim(BASE + 11_000, BASE + 20_000), BASE + 10_000) == 3
        assert store.get("k", BASE + 10_000) == Entry(claim(BASE + 11_000, BASE + 20_000), 3)
        assert store.delete("k", 2, BASE + 10_000) is False, "another version"
        assert store.delete("k", 3, BASE + 10_000) is True
        assert store.get("k", BASE + 10_000) is None
        assert store.replace("k", (1 << 64) - 1, done, BASE) is False, "no successor version: refused, nothing sent"
        # One request per primitive (the clock's thread sends GetItems of its own, so those are not counted).
        assert (sent.count("UpdateItem"), sent.count("PutItem"), sent.count("DeleteItem")) == (3, 2, 2), sent
        # The TTL attribute: the expiry in seconds, rounded up, plus a minute.
        store.insert("t", claim(BASE + 1, BASE + 10_001), BASE)
        raw = store.client.get_item(TableName=store.table, Key={"key": {"S": "t"}}, ConsistentRead=True)["Item"]
        assert raw["ttl"] == {"N": str(-(-(BASE + 10_001) // 1000) + 60)}
        # An expired item is left to the purge (and DynamoDB's TTL).
        assert store.delete("t", None, BASE + 10_001) is False
        assert store.purge_expired(BASE + 10_001, 10) == 1
        assert store.client.get_item(TableName=store.table, Key={"key": {"S": "t"}}, ConsistentRead=True).get("Item") is None


def test_an_undecodable_item_is_corrupt_naming_the_key_and_the_guard_runs_nothing(server: Server) -> None:
    with server.open() as store:
        live = str(1 << 62)  # live by the guard's clock too (the store's: now)
        store.client.put_item(
            TableName=store.table,
            Item={
                "key": {"S": "bad"},
                "version": {"N": "1"},
                "fingerprint": {"S": "fp"},
                "state": {"S": "paused"},
                "lease_until_ms": {"N": live},
                "expires_at_ms": {"N": live},
                "holder": {"N": "1"},
            },
        )
        for call in (lambda: store.get("bad", BASE), lambda: store.insert("bad", claim(BASE + 1, BASE + 10), BASE)):
            with pytest.raises(StoreFault) as fault:
                call()
            assert fault.value.kind == "corrupt" and "'bad'" in str(fault.value) and "paused" in str(fault.value), str(fault.value)
        ran: list[int] = []
        outcome = Guard(store=store).run("bad", "fp", lambda fence: ran.append(fence) or Response(200))
        assert outcome.kind == "unavailable" and "bad" in outcome.message and ran == []


def test_the_clock_is_read_from_the_date_header_known_to_within_half_a_second_and_the_round_trip(server: Server) -> None:
    with server.open() as store:
        error = store.clock.known()
        assert 501 <= error < 2_000, error
        assert "Date header" in store.clock.authority
        assert store.server_time() % 1000 == 0, "whole seconds"


def test_a_table_keyed_otherwise_is_refused_naming_it(server: Server) -> None:
    table = unique("d")
    server.made.append(table)
    with server.open() as store:
        store.client.create_table(
            TableName=table,
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            BillingMode="PAY_PER_REQUEST",
        )
    with pytest.raises(StoreFault) as fault:
        server.open(table)
    assert fault.value.kind == "unavailable" and repr(table) in str(fault.value) and "another key" in str(fault.value)


def test_an_endpoint_that_cannot_be_reached_fails_opening_as_unavailable() -> None:
    with pytest.raises(StoreFault) as fault:
        DynamoDbStore(endpoint="http://127.0.0.1:9", table="idem", timeout_ms=500)
    assert fault.value.kind == "unavailable" and "127.0.0.1:9" in str(fault.value), str(fault.value)


def test_a_bad_table_name_is_refused_naming_the_limit() -> None:
    with pytest.raises(ValueError, match="3 to 255"):
        DynamoDbStore(endpoint="http://127.0.0.1:9", table="a b")


# --- every conformance scenario -----------------------------------------------


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("name", FILES)
def test_conformance_on_dynamodb(server: Server, name: str, binding: str) -> None:
    with server.open() as store:
        assert run_scenario(load(name), binding, store=Faulty(store)) > 0


@pytest.mark.parametrize("name", FILES)
def test_conformance_on_async_dynamodb_by_journal_replay(server: Server, name: str) -> None:
    loop = asyncio.new_event_loop()
    store = AsyncDynamoDbStore(server.open())
    try:
        assert run_scenario(load(name), store=AsyncFaulty(store), loop=loop) > 0
    finally:
        loop.run_until_complete(store.close())
        loop.close()
