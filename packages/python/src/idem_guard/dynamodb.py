"""Records in DynamoDB, in the on-store layout of `wit/store-layout/` (its
README is the spec, "DynamoDB"): one item per key in a table (default
`idem_records`) that `idem serve` and the Node.js package read and write
too. Needs the `dynamodb` extra (`pip install 'idem-guard[dynamodb]'`:
boto3, the AWS SDK)::

    from idem_guard import Guard
    from idem_guard.dynamodb import DynamoDbStore

    with DynamoDbStore(table="idem_records", region="eu-west-1") as store:
        guard = Guard(store=store)
        outcome = guard.run("order-1", "cents=1000", charge)

Opening creates the table if it is absent (on-demand capacity, partition key
`key`, TTL on `ttl`) and refuses one keyed otherwise or whose TTL is on
another attribute. Each primitive is then one conditional request, so one
round trip: a claim is an `UpdateItem` whose failed condition answers the
live item (`ReturnValuesOnConditionCheckFailure=ALL_OLD`). The client makes
one attempt per request: a write whose answer was lost may have been
applied, and the guard decides what follows.

The guard's clock is the store's (`store.clock`, a `SyncedClock`): AWS's
clock as the `Date` header of DynamoDB's responses states it, in whole
seconds, read when the store opens and every `clock_sync_ms` after (default
1 000) on a daemon thread. A reading is the middle of its second, so its
error bound is half a second plus half the round trip: leases must be far
longer than that (the default 30 s are).

boto3 is synchronous. `AsyncDynamoDbStore` is the same store for
`AsyncGuard`: each primitive runs the synchronous one in a thread
(`asyncio.to_thread`), so a call holds a thread of the loop's default
executor for its round trip.

Failures: a request that fails or takes longer than `timeout_ms` (default
2 000) is `StoreFault("unavailable")`, and the guard fails closed. An item
that does not decode (a number that is no u64, an attribute missing or of
another type, a response or checkpoint only partly present) is
`StoreFault("corrupt")` naming the key.
"""

from __future__ import annotations

import asyncio
import email.utils
import os
import re
import time
from typing import Any

try:
    import boto3
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError("idem_guard.dynamodb needs boto3: pip install 'idem-guard[dynamodb]'") from e

from .clock import CLOCK_SYNC_MS, SyncedClock, clock_error
from .steps import Commands, Steps
from .types import Checkpoint, Entry, Record, Response, StoreFault

__all__ = ["AsyncDynamoDbStore", "DynamoDbStore", "date_ms", "decode_item", "encode_item", "record_attributes", "ttl_seconds"]

NAME = "dynamodb"
DEFAULT_TABLE = "idem_records"
DEFAULT_TIMEOUT_MS = 2_000
TABLE_NAME = re.compile(r"[a-zA-Z0-9_.-]{3,255}")
U64_MAX = (1 << 64) - 1
# DynamoDB deletes an item by its TTL this long after the record expired (s), by its own clock.
TTL_GRACE_S = 60
# The key the clock reads: no idem key holds a control character.
CLOCK_KEY = "\x01clock"
# The attributes a record may lack (no response, no checkpoint), which a claim over an expired item removes.
OPTIONAL = ("status", "header_names", "header_values", "body", "phase", "checkpoint")
RESPONSE = ("status", "header_names", "header_values", "body")
# A claim's attributes, in the order its update expression sets them.
CLAIMED = ("fingerprint", "state", "lease_until_ms", "expires_at_ms", "ttl", "holder", *OPTIONAL)


def _n(v: int) -> dict[str, str]:
    return {"N": str(v)}


def ttl_seconds(expires_at_ms: int) -> int:
    """The TTL attribute for a record expiring at `expires_at_ms`: seconds, rounded up, plus the grace."""
    return -(-expires_at_ms // 1000) + TTL_GRACE_S


def record_attributes(record: Record) -> dict[str, Any]:
    """The record's attributes, without `key` and `version`, in the layout's DynamoDB form (boto3's: `B` as bytes)."""
    item: dict[str, Any] = {
        "fingerprint": {"S": record.fingerprint},
        "state": {"S": record.state},
        "lease_until_ms": _n(record.lease_until_ms),
        "expires_at_ms": _n(record.expires_at_ms),
        "ttl": _n(ttl_seconds(record.expires_at_ms)),
        "holder": _n(record.holder),
    }
    r = record.response
    if r is not None:
        item["status"] = _n(r.status)
        item["header_names"] = {"L": [{"S": name} for name, _ in r.headers]}
        item["header_values"] = {"L": [{"B": bytes(value)} for _, value in r.headers]}
        item["body"] = {"B": bytes(r.body)}
    c = record.checkpoint
    if c is not None:
        item["phase"] = {"S": c.phase}
        item["checkpoint"] = {"B": bytes(c.data)}
    return item


def encode_item(key: str, version: int, record: Record) -> dict[str, Any]:
    """The whole item for `record` at `version` under `key`."""
    return {"key": {"S": key}, "version": _n(version), **record_attributes(record)}


class _Undecodable(Exception):
    """Why an item does not decode; the store names the key around it."""


def _text(item: dict[str, Any], name: str, type_: str, what: str) -> str:
    """The text of attribute `name`, of DynamoDB type `type_` (`N` and `S` are text in DynamoDB's JSON)."""
    v = item.get(name)
    if v is None:
        raise _Undecodable(f"{name} is missing")
    text = v.get(type_) if isinstance(v, dict) else None
    if not isinstance(text, str):
        raise _Undecodable(f"{name} is not {what}")
    return text


def _number(item: dict[str, Any], name: str) -> int:
    text = _text(item, name, "N", "a number")
    if not re.fullmatch(r"[0-9]+", text) or int(text) > U64_MAX:
        raise _Undecodable(f"{name} {text} is not a whole number from 0 to 2^64 - 1")
    return int(text)


def _string(item: dict[str, Any], name: str) -> str:
    return _text(item, name, "S", "a string")


def _binary(v: Any, name: str) -> bytes:
    data = v.get("B") if isinstance(v, dict) else None
    if not isinstance(data, (bytes, bytearray)):
        raise _Undecodable(f"{name} is not binary")
    return bytes(data)


def _list(item: dict[str, Any], name: str) -> list[Any]:
    v = item[name]
    values = v.get("L") if isinstance(v, dict) else None
    if not isinstance(values, list):
        raise _Undecodable(f"{name} is not a list")
    return values


def _corrupt(key: str, why: str) -> StoreFault:
    return StoreFault("corrupt", f"{NAME} store: the record for key {key!r} does not decode: {why}")


def decode_item(key: str, item: dict[str, Any]) -> Entry:
    """The entry an item holds, whatever its expiry; `StoreFault("corrupt")` naming `key` when it does not decode."""
    try:
        state = _string(item, "state")
        if state not in ("processing", "done"):
            raise _Undecodable(f"state {state!r} is not processing or done")
        fingerprint = _string(item, "fingerprint")
        holder = _number(item, "holder")
        lease = _number(item, "lease_until_ms")
        expires = _number(item, "expires_at_ms")
        present = sum(name in item for name in RESPONSE)
        response = None
        if present == len(RESPONSE):
            status = _number(item, "status")
            if status > 0xFFFF:
                raise _Undecodable(f"status {status} is past 65535")
            names, values = _list(item, "header_names"), _list(item, "header_values")
            if len(names) != len(values):
                raise _Undecodable(f"{len(names)} header names but {len(values)} header values")
            headers = []
            for name, value in zip(names, values, strict=True):
                if not isinstance(name, dict) or not isinstance(name.get("S"), str):
                    raise _Undecodable("a header name is not a string")
                headers.append((name["S"], _binary(value, "header_values")))
            response = Response(status, headers, _binary(item["body"], "body"))
        elif present:
            raise _Undecodable("the response's status, header_names, header_values and body are only partly present")
        checkpoint = None
        if "phase" in item and "checkpoint" in item:
            checkpoint = Checkpoint(_string(item, "phase"), _binary(item["checkpoint"], "checkpoint"))
        elif "phase" in item or "checkpoint" in item:
            raise _Undecodable("the checkpoint's phase and data are only partly present")
        version = _number(item, "version")
    except _Undecodable as e:
        raise _corrupt(key, str(e)) from None
    return Entry(Record(fingerprint, state, holder, lease, expires, response, checkpoint), version)


def date_ms(date: str) -> int:
    """An HTTP `Date` (IMF-fixdate) in milliseconds since the Unix epoch: its second's start."""
    try:
        when = email.utils.parsedate_to_datetime(date)
    except (TypeError, ValueError):
        when = None
    if when is None or when.tzinfo is None or when.timestamp() < 0:
        raise ValueError(f"the Date header {date!r} does not parse")
    return int(when.timestamp()) * 1000


def _names(*names: str) -> dict[str, str]:
    """`#name` for each name: several of the layout's are DynamoDB reserved words."""
    return {f"#{name}": name for name in names}


class _Failed:
    """A request whose condition failed, with the item DynamoDB returned (if any)."""

    def __init__(self, item: dict[str, Any] | None):
        self.item = item


def _describe(error: Exception, timeout_ms: int) -> str:
    if isinstance(error, ClientError):
        err = error.response.get("Error", {})
        return f"{err.get('Code', 'error')}: {err.get('Message', error)}"
    if "timeout" in type(error).__name__.lower():
        return f"no answer within {timeout_ms} ms ({type(error).__name__})"
    return f"{type(error).__name__}: {error}"


class DynamoDbStore(Steps):
    """The store primitives of `wit/store.wit` on a DynamoDB table, for `Guard`.

    `endpoint`: a DynamoDB-compatible server (`http://127.0.0.1:8000`) or
    another endpoint; default AWS's for the region. `region`: default
    boto3's chain (`us-east-1` for an `http:` endpoint). `table`: 3 to 255
    of a-z, A-Z, 0-9, `_`, `-` and `.`. Credentials come from boto3's chain
    (dummy ones for an `http:` endpoint without `AWS_ACCESS_KEY_ID`), or
    `client=` an existing boto3 DynamoDB client. Opening fails
    (`StoreFault("unavailable")`) when the endpoint cannot be reached now;
    after that, each operation fails as unavailable while it cannot.
    Thread-safe (boto3's clients are)."""

    def __init__(
        self,
        *,
        endpoint: str | None = None,
        region: str | None = None,
        table: str = DEFAULT_TABLE,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        clock_sync_ms: int = CLOCK_SYNC_MS,
        client: Any = None,
    ):
        if not isinstance(table, str) or not TABLE_NAME.fullmatch(table):
            raise ValueError(f"table={table!r} must be 3 to 255 characters of a-z, A-Z, 0-9, _, - and .")
        if not isinstance(timeout_ms, int) or isinstance(timeout_ms, bool) or timeout_ms < 1:
            raise ValueError(f"timeout_ms {timeout_ms!r} must be a positive whole number of milliseconds")
        self.table = table
        self.timeout_ms = timeout_ms
        # The store's time authority (wit/clock.wit): AWS's clock, as DynamoDB's Date headers state it.
        self.clock = SyncedClock(
            "AWS's clock, from the Date header of DynamoDB's responses (whole seconds)", clock_sync_ms, resolution_ms=1_000
        )
        self._owned = client is None
        self.client = client if client is not None else self._client(endpoint, region)
        where = endpoint or "AWS's endpoint"
        try:
            self._ensure_table()
        except (ClientError, BotoCoreError, ValueError) as e:
            self.close()
            raise StoreFault("unavailable", f"{NAME} store: cannot open the table {table!r} at {where}: {_describe(e, timeout_ms)}") from e
        # The time authority: read now and every clock_sync_ms after, on the clock's thread.
        self.clock.read(self.server_time)
        unknown = clock_error(self.clock)
        if unknown is not None:
            self.close()
            raise StoreFault("unavailable", f"{NAME} store: cannot open the table {table!r} at {where}: {unknown}")
        self.clock.keep_synced(self.server_time)

    def _client(self, endpoint: str | None, region: str | None) -> Any:
        local = endpoint is not None and endpoint.startswith("http:")
        seconds = self.timeout_ms / 1000
        options: dict[str, Any] = {
            # One attempt: a write whose answer was lost may have been applied; the guard decides.
            "config": Config(connect_timeout=seconds, read_timeout=seconds, retries={"total_max_attempts": 1, "mode": "standard"}),
        }
        if endpoint is not None:
            options["endpoint_url"] = endpoint
        if region is not None:
            options["region_name"] = region
        elif local:
            options["region_name"] = "us-east-1"
        if local and not os.environ.get("AWS_ACCESS_KEY_ID"):
            options["aws_access_key_id"] = options["aws_secret_access_key"] = "idem"
        return boto3.session.Session().client("dynamodb", **options)

    def _ensure_table(self) -> None:
        table = self.table
        try:
            described = self.client.describe_table(TableName=table)["Table"]
            schema = described.get("KeySchema", [])
            if len(schema) != 1 or schema[0].get("AttributeName") != "key":
                raise ValueError(
                    f"the table {table!r} exists with another key; idem needs a table whose partition key is the string 'key' and nothing else"
                )
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                raise
            try:
                self.client.create_table(
                    TableName=table,
                    AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
                    KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
                    BillingMode="PAY_PER_REQUEST",
                )
            except ClientError as created:
                if created.response.get("Error", {}).get("Code") != "ResourceInUseException":
                    raise  # else another host created it first
        # A table just created is CREATING for a few seconds on AWS.
        wait = 0.1
        while self.client.describe_table(TableName=table)["Table"].get("TableStatus") != "ACTIVE":
            time.sleep(wait)
            wait = min(wait * 2, 2.0)
        ttl = self.client.describe_time_to_live(TableName=table).get("TimeToLiveDescription", {})
        on = ttl.get("TimeToLiveStatus") in ("ENABLED", "ENABLING")
        if on and ttl.get("AttributeName") == "ttl":
            return
        if on:
            raise ValueError(f"the table {table!r} has its TTL on {ttl.get('AttributeName')!r}; idem's records expire by 'ttl'")
        self.client.update_time_to_live(TableName=table, TimeToLiveSpecification={"Enabled": True, "AttributeName": "ttl"})

    # --- the primitives, as generators of requests (idem_guard.steps) -------
    #
    # A primitive yields `(operation, parameters)` and is sent the response, or
    # `_Failed` when the request's condition failed.

    def _send(self, command: tuple[str, dict[str, Any]], key: str) -> Any:
        operation, params = command
        try:
            return getattr(self.client, operation)(TableName=self.table, **params)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return _Failed(e.response.get("Item"))
            raise StoreFault("unavailable", f"{NAME} store: {_describe(e, self.timeout_ms)}") from e
        except BotoCoreError as e:
            raise StoreFault("unavailable", f"{NAME} store: {_describe(e, self.timeout_ms)}") from e

    @staticmethod
    def _get(key: str, now_ms: int) -> Commands:
        out = yield "get_item", {"Key": {"key": {"S": key}}, "ConsistentRead": True}
        if "Item" not in out:
            return None
        entry = decode_item(key, out["Item"])
        return entry if entry.record.expires_at_ms > now_ms else None

    @staticmethod
    def _insert(key: str, record: Record, now_ms: int) -> Commands:
        attributes = record_attributes(record)
        sets = ["#version = if_not_exists(#version, :zero) + :one"]
        removes = []
        values: dict[str, Any] = {":zero": _n(0), ":one": _n(1), ":now": _n(now_ms)}
        for name in CLAIMED:
            if name in attributes:
                sets.append(f"#{name} = :{name}")
                values[f":{name}"] = attributes[name]
            else:
                removes.append(f"#{name}")
        update = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
        out = yield "update_item", {
            "Key": {"key": {"S": key}},
            "UpdateExpression": update,
            "ConditionExpression": "attribute_not_exists(#key) OR #expires_at_ms <= :now",
            "ExpressionAttributeNames": _names("key", "version", *CLAIMED),
            "ExpressionAttributeValues": values,
            "ReturnValues": "UPDATED_NEW",
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        if not isinstance(out, _Failed):
            try:
                return _number(out.get("Attributes", {}), "version")
            except _Undecodable as e:
                raise StoreFault("unavailable", f"{NAME} store: the claim's answer: {e}") from None
        if out.item is None:
            raise StoreFault(
                "unavailable", f"{NAME} store: the claim's condition failed but DynamoDB returned no item (ReturnValuesOnConditionCheckFailure unsupported?)"
            )
        entry = decode_item(key, out.item)
        if entry.record.expires_at_ms <= now_ms:  # only an attribute of another type fails the condition so
            raise _corrupt(key, "its expires_at_ms is not a number DynamoDB compares")
        return entry

    @staticmethod
    def _replace(key: str, expected_version: int, record: Record, now_ms: int) -> Commands:
        if expected_version >= U64_MAX:
            return False  # its successor is no u64: refused, not an error
        out = yield "put_item", {
            "Item": encode_item(key, expected_version + 1, record),
            "ConditionExpression": "#version = :expected AND #expires_at_ms > :now",
            "ExpressionAttributeNames": _names("version", "expires_at_ms"),
            "ExpressionAttributeValues": {":expected": _n(expected_version), ":now": _n(now_ms)},
        }
        return not isinstance(out, _Failed)

    @staticmethod
    def _delete(key: str, expected_version: int | None, now_ms: int) -> Commands:
        condition, names, values = "#expires_at_ms > :now", ["expires_at_ms"], {":now": _n(now_ms)}
        if expected_version is not None:
            condition += " AND #version = :expected"
            names.append("version")
            values[":expected"] = _n(expected_version)
        out = yield "delete_item", {
            "Key": {"key": {"S": key}},
            "ConditionExpression": condition,
            "ExpressionAttributeNames": _names(*names),
            "ExpressionAttributeValues": values,
        }
        return not isinstance(out, _Failed)

    @staticmethod
    def _time() -> Commands:
        """AWS's time as a DynamoDB response dates it (whole seconds): an eventually consistent read of the clock key."""
        out = yield "get_item", {"Key": {"key": {"S": CLOCK_KEY}}, "ProjectionExpression": "#key", "ExpressionAttributeNames": _names("key")}
        date = out.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        if not isinstance(date, str):
            raise StoreFault("unavailable", f"{NAME} store: the response has no Date header")
        try:
            return date_ms(date)
        except ValueError as e:
            raise StoreFault("unavailable", f"{NAME} store: {e}") from None

    def purge_expired(self, now_ms: int, limit: int) -> int:
        """Deletes at most `limit` items expired at `now_ms` (a consistent scan, then a
        conditional delete of each that is still the expired one seen) and returns how
        many. DynamoDB's TTL frees them too: this is for operators who want it now."""
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"limit {limit!r} must be a positive whole number")
        expired: list[dict[str, Any]] = []
        start: dict[str, Any] | None = None
        while True:
            params: dict[str, Any] = {
                "ConsistentRead": True,
                "FilterExpression": "#expires_at_ms <= :now",
                "ExpressionAttributeNames": _names("expires_at_ms"),
                "ExpressionAttributeValues": {":now": _n(now_ms)},
            }
            if start is not None:
                params["ExclusiveStartKey"] = start
            page = self._send(("scan", params), "")
            expired.extend(page.get("Items", []))
            start = page.get("LastEvaluatedKey")
            if start is None or len(expired) >= limit:
                break
        purged = 0
        for item in expired[:limit]:
            if not isinstance(item.get("key", {}).get("S"), str) or not isinstance(item.get("version", {}).get("N"), str):
                continue  # not a record of this layout
            out = self._send(
                (
                    "delete_item",
                    {
                        "Key": {"key": item["key"]},
                        "ConditionExpression": "#version = :expected AND #expires_at_ms <= :now",
                        "ExpressionAttributeNames": _names("version", "expires_at_ms"),
                        "ExpressionAttributeValues": {":expected": item["version"], ":now": _n(now_ms)},
                    },
                ),
                item["key"]["S"],
            )
            purged += not isinstance(out, _Failed)
        return purged

    def close(self) -> None:
        """Stops reading the clock and closes the client's connections (only a client the store made)."""
        self.clock.stop()
        if self._owned:
            self.client.close()


class AsyncDynamoDbStore:
    """`DynamoDbStore` for `AsyncGuard`: `await store.get(...)` and so on, each
    primitive the synchronous store's run in a thread (`asyncio.to_thread`: boto3
    is synchronous). Open it with `await AsyncDynamoDbStore.open(...)` (options as
    `DynamoDbStore`'s) or `async with`; close with `await store.close()`. The clock
    is the synchronous store's, synced on its thread."""

    def __init__(self, store: DynamoDbStore):
        self.store = store
        self.clock = store.clock
        self.table = store.table

    @classmethod
    async def open(cls, **options: Any) -> AsyncDynamoDbStore:
        return cls(await asyncio.to_thread(lambda: DynamoDbStore(**options)))

    async def get(self, key: str, now_ms: int) -> Entry | None:
        return await asyncio.to_thread(self.store.get, key, now_ms)

    async def insert(self, key: str, record: Record, now_ms: int) -> int | Entry:
        return await asyncio.to_thread(self.store.insert, key, record, now_ms)

    async def replace(self, key: str, expected_version: int, record: Record, now_ms: int) -> bool:
        return await asyncio.to_thread(self.store.replace, key, expected_version, record, now_ms)

    async def delete(self, key: str, expected_version: int | None, now_ms: int) -> bool:
        return await asyncio.to_thread(self.store.delete, key, expected_version, now_ms)

    async def server_time(self) -> int:
        return await asyncio.to_thread(self.store.server_time)

    async def purge_expired(self, now_ms: int, limit: int) -> int:
        """`DynamoDbStore.purge_expired`, in a thread; an `AsyncGuard` over this store calls it every `purge_every_ms`."""
        return await asyncio.to_thread(self.store.purge_expired, now_ms, limit)

    async def close(self) -> None:
        await asyncio.to_thread(self.store.close)

    aclose = close

    async def __aenter__(self) -> AsyncDynamoDbStore:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()
