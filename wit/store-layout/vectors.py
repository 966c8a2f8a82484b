#!/usr/bin/env python3
"""Writes vectors.json: records with their Redis value and PostgreSQL row,
encoded from the layout in README.md by this independent encoder (it shares
no code with any store). Run it from anywhere after changing the layout;
every store's tests check their own encoder and decoder against the file."""

import json
import os
import struct

U64_MAX = 2**64 - 1


def put(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def redis_value(version, r, legacy=False):
    out = f"{version} {r['expires_at_ms']}\n".encode()
    out += struct.pack(">Q", r["lease_until_ms"])
    out += bytes([0 if r["state"] == "processing" else 1])
    out += put(r["fingerprint"].encode())
    resp = r["response"]
    if resp is None:
        out += b"\0"
    else:
        out += b"\1" + struct.pack(">H", resp["status"])
        out += struct.pack(">I", len(resp["headers"]))
        for name, value in resp["headers"]:
            out += put(name.encode()) + put(bytes.fromhex(value))
        out += put(bytes.fromhex(resp["body"]))
    if legacy:
        return out
    out += struct.pack(">Q", r["holder"])
    cp = r["checkpoint"]
    if cp is None:
        out += b"\0"
    else:
        out += b"\1" + put(cp["phase"].encode()) + put(bytes.fromhex(cp["data"]))
    return out


def i64(v):
    return v - 2**64 if v >= 2**63 else v


def sql_time(v):
    return min(v, 2**63 - 1)


def postgres_row(version, r):
    resp, cp = r["response"], r["checkpoint"]
    return {
        "version": version,
        "fingerprint": r["fingerprint"],
        "state": r["state"],
        "lease_until_ms": sql_time(r["lease_until_ms"]),
        "expires_at_ms": sql_time(r["expires_at_ms"]),
        "status": None if resp is None else resp["status"],
        "header_names": None if resp is None else [n for n, _ in resp["headers"]],
        "header_values": None if resp is None else [v for _, v in resp["headers"]],
        "body": None if resp is None else resp["body"],
        "holder": i64(r["holder"]),
        "phase": None if cp is None else cp["phase"],
        "checkpoint": None if cp is None else cp["data"],
    }


# DynamoDB's TTL attribute: epoch seconds, the record's expiry rounded up plus
# this grace, so that DynamoDB never deletes a record a guard still sees live.
TTL_GRACE_S = 60


def dynamodb_item(version, r):
    """The item's attributes after `key`, in DynamoDB's JSON (`B` values hex here)."""
    resp, cp = r["response"], r["checkpoint"]
    item = {
        "version": {"N": str(version)},
        "fingerprint": {"S": r["fingerprint"]},
        "state": {"S": r["state"]},
        "lease_until_ms": {"N": str(r["lease_until_ms"])},
        "expires_at_ms": {"N": str(r["expires_at_ms"])},
        "ttl": {"N": str(-(-r["expires_at_ms"] // 1000) + TTL_GRACE_S)},
        "holder": {"N": str(r["holder"])},
    }
    if resp is not None:
        item["status"] = {"N": str(resp["status"])}
        item["header_names"] = {"L": [{"S": n} for n, _ in resp["headers"]]}
        item["header_values"] = {"L": [{"B": v} for _, v in resp["headers"]]}
        item["body"] = {"B": resp["body"]}
    if cp is not None:
        item["phase"] = {"S": cp["phase"]}
        item["checkpoint"] = {"B": cp["data"]}
    return item


def record(fingerprint, state, holder, lease_until_ms, expires_at_ms, response=None, checkpoint=None):
    return {
        "fingerprint": fingerprint, "state": state, "holder": holder,
        "lease_until_ms": lease_until_ms, "expires_at_ms": expires_at_ms,
        "response": response, "checkpoint": checkpoint,
    }


FP = "v1:" + "0123456789abcdef" * 4
LEASE, EXPIRES = 1_700_000_030_000, 1_700_086_400_000
RECORDS = [
    ("processing, no response", 1, record(FP, "processing", 0x0123456789ABCDEF, LEASE, EXPIRES)),
    ("done with headers and a binary body", 2, record(
        FP, "done", 7, 1_700_000_000_500, EXPIRES,
        response={"status": 201, "headers": [["content-type", "application/json".encode().hex()],
                                             ["x-empty", ""], ["set-cookie", "00ff0a"]],
                  "body": "7b226964223a317d00ff"})),
    ("processing after a checkpoint, holder above 2^63", 5, record(
        "custom-fp", "processing", U64_MAX - 1, 1_700_000_060_000, EXPIRES,
        checkpoint={"phase": "charged", "data": "636861726765642031"})),
    ("done, empty response, a checkpoint kept from the claim", 3, record(
        "x", "done", 1, 0, 1,
        response={"status": 204, "headers": [], "body": ""},
        checkpoint={"phase": "r\u00e9serv\u00e9", "data": ""})),
    ("times at the top of u64", 18446744073709551614, record(FP, "processing", 2**63, U64_MAX, U64_MAX)),
]

# Values written by 0.1 hosts: no holder, no checkpoint; read as holder 0.
LEGACY = [
    ("0.1 processing", 1, record(FP, "processing", 0, LEASE, EXPIRES)),
    ("0.1 done", 4, record(
        FP, "done", 0, 1_700_000_000_500, EXPIRES,
        response={"status": 200, "headers": [["etag", "2231323322"]], "body": "6f6b"})),
]

# Redis values no store may accept: each read is corrupt.
CORRUPT = [
    ("no header", b"\x00\x01"),
    ("a sign in the header", b"+1 5\n" + bytes(8) + b"\0" + put(b"x") + b"\0" + bytes(8) + b"\0"),
    ("state 2", b"1 5\n" + bytes(8) + b"\2" + put(b"x") + b"\0" + bytes(8) + b"\0"),
    ("fingerprint length past the end", b"1 5\n" + bytes(8) + b"\0" + struct.pack(">I", 9) + b"x"),
    ("a byte after the checkpoint", b"1 5\n" + bytes(8) + b"\0" + put(b"x") + b"\0" + bytes(8) + b"\0" + b"\0"),
    ("half a holder", b"1 5\n" + bytes(8) + b"\0" + put(b"x") + b"\0" + bytes(4)),
]


# DynamoDB items no store may accept: each read is corrupt.
def _item(**changes):
    item = dynamodb_item(1, record(FP, "processing", 1, LEASE, EXPIRES))
    for k, v in changes.items():
        if v is None:
            del item[k]
        else:
            item[k] = v
    return item


CORRUPT_DYNAMODB = [
    ("state paused", _item(state={"S": "paused"})),
    ("a negative version", _item(version={"N": "-1"})),
    ("a version past u64", _item(version={"N": "18446744073709551616"})),
    ("a fractional time", _item(expires_at_ms={"N": "1700086400000.5"})),
    ("the expiry as a string", _item(expires_at_ms={"S": "1700086400000"})),
    ("no fingerprint", _item(fingerprint=None)),
    ("no holder", _item(holder=None)),
    ("a status without the rest of the response", _item(status={"N": "200"})),
    ("more header names than values", {**dynamodb_item(1, RECORDS[1][2]),
                                       "header_names": {"L": [{"S": "a"}, {"S": "b"}, {"S": "c"}, {"S": "d"}]}}),
    ("a status past u16", {**dynamodb_item(1, RECORDS[1][2]), "status": {"N": "65536"}}),
    ("a phase without its data", _item(phase={"S": "charged"})),
]

# The time authority's readings (README.md, "Time"): what a Redis TIME reply
# (via time.lua) reads as, in milliseconds since the Unix epoch.
REDIS_TIME = [
    (["1765000000", "0"], 1_765_000_000_000),
    (["1765000000", "999999"], 1_765_000_000_999),
    (["1765000000", "123456"], 1_765_000_000_123),
    (["0", "1000"], 1),
]
# And a reading's arithmetic: the server said `server_ms` between monotonic
# instants `sent` and `received`; the host's time at monotonic `at`, and the
# error bound then (ceil(rtt/2) + 1, plus 0.1 ms per second since the read, rounded up).
READINGS = [
    {"server_ms": 1_765_000_000_000, "sent": 1_000, "received": 1_004, "at": 1_004,
     "now_ms": 1_765_000_000_002, "error_ms": 3},
    {"server_ms": 1_765_000_000_000, "sent": 1_000, "received": 1_005, "at": 11_005,
     "now_ms": 1_765_000_010_003, "error_ms": 5},
]


# DynamoDB's time authority is the `Date` header of its responses, in whole
# seconds (README.md, DynamoDB): the reading is the middle of the second it
# names, and its error bound half a second more: ceil(rtt/2) + 500 + 1.
DATE_HEADER = [
    ("Mon, 08 Dec 2025 05:46:40 GMT", 1_765_172_800_000),
    ("Thu, 01 Jan 1970 00:00:01 GMT", 1_000),
]
DATE_READINGS = [
    {"server_ms": 1_765_000_000_000, "sent": 1_000, "received": 1_004, "at": 1_004,
     "now_ms": 1_765_000_000_502, "error_ms": 503},
    {"server_ms": 1_765_000_000_000, "sent": 1_000, "received": 1_005, "at": 11_005,
     "now_ms": 1_765_000_010_503, "error_ms": 505},
]


def record_json(r):
    # u64s as decimal strings: JSON numbers lose them past 2^53.
    out = dict(r)
    for k in ("holder", "lease_until_ms", "expires_at_ms"):
        out[k] = str(r[k])
    return out


def row_json(row):
    out = dict(row)
    for k in ("version", "holder", "lease_until_ms", "expires_at_ms"):
        out[k] = str(row[k])
    return out


def main():
    doc = {
        "about": "Generated by vectors.py from the layout in README.md. u64 and i64 values are decimal "
                 "strings; bytes are lowercase hex. Each record: `redis` is the whole value stored at "
                 "{prefix}{key} for it at `version`, `postgres` its row's columns after `key`, and "
                 "`dynamodb` its item's attributes after `key` in DynamoDB's JSON (`B` values in hex). "
                 "`legacy_redis` values were written by 0.1 hosts and read as these records (holder 0, "
                 "no checkpoint). `corrupt_redis` values and `corrupt_dynamodb` items must read as corrupt. `time`: the time "
                 "authority's readings (README.md, \"Time\"): `redis_time` maps a TIME reply to "
                 "milliseconds; `readings` gives a reading (monotonic `sent`/`received`, ms) and the "
                 "host's time and error bound at monotonic `at`; `dynamodb_date` maps a `Date` header to "
                 "milliseconds, and `dynamodb_readings` are readings of it (whole seconds).",
        "records": [
            {"name": n, "version": str(v), "record": record_json(r),
             "redis": redis_value(v, r).hex(), "postgres": row_json(postgres_row(v, r)),
             "dynamodb": dynamodb_item(v, r)}
            for n, v, r in RECORDS
        ],
        "legacy_redis": [
            {"name": n, "version": str(v), "record": record_json(r), "redis": redis_value(v, r, legacy=True).hex()}
            for n, v, r in LEGACY
        ],
        "corrupt_redis": [{"name": n, "redis": b.hex()} for n, b in CORRUPT],
        "corrupt_dynamodb": [{"name": n, "dynamodb": item} for n, item in CORRUPT_DYNAMODB],
        "time": {
            "redis_time": [{"reply": reply, "ms": str(ms)} for reply, ms in REDIS_TIME],
            "readings": [{k: str(v) for k, v in r.items()} for r in READINGS],
            "dynamodb_date": [{"date": d, "ms": str(ms)} for d, ms in DATE_HEADER],
            "dynamodb_readings": [{k: str(v) for k, v in r.items()} for r in DATE_READINGS],
        },
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vectors.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
