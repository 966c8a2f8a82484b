#!/usr/bin/env python3
"""The canonical fingerprint of `wit/guard.wit`, written from its doc alone.

A third party's native implementation, kept beside the test vectors it
checks: `python3 conformance/fingerprint.py` recomputes every vector in
`fingerprint-vectors.json` (and `fingerprint-canonical.json`) and exits
non-zero on the first mismatch. Standard library only.
"""

import hashlib
import json
import pathlib
import sys


def _part(out, data: bytes) -> None:
    out.update(len(data).to_bytes(8, "big"))
    out.update(data)


def _ascii_upper(data: bytes) -> bytes:
    return bytes(b - 0x20 if 0x61 <= b <= 0x7A else b for b in data)


def _ascii_lower(data: bytes) -> bytes:
    return bytes(b + 0x20 if 0x41 <= b <= 0x5A else b for b in data)


def fingerprint(method: str, path: str, headers, body: bytes) -> str:
    """`headers` is a list of (name: str, value: bytes) pairs."""
    pairs = sorted((_ascii_lower(name.encode()), bytes(value)) for name, value in headers)
    h = hashlib.sha256()
    _part(h, b"idem-fingerprint-v1")
    _part(h, _ascii_upper(method.encode()))
    _part(h, path.encode())
    _part(h, len(pairs).to_bytes(8, "big"))
    for name, value in pairs:
        _part(h, name)
        _part(h, value)
    _part(h, body)
    return "sha256:" + h.hexdigest()


def decode_bytes(value) -> bytes:
    """A scenario's bytes: a UTF-8 string, or {"hex": "…"} (conformance/README.md)."""
    if isinstance(value, dict):
        return bytes.fromhex(value["hex"])
    return value.encode()


def check(scenario_file: pathlib.Path) -> int:
    scenario = json.loads(scenario_file.read_text())
    checked = 0
    for step in scenario["steps"]:
        if step["op"] != "fingerprint":
            continue
        r = step["request"]
        headers = [(name, decode_bytes(value)) for name, value in r["headers"]]
        got = fingerprint(r["method"], r["path"], headers, decode_bytes(r["body"]))
        want = step["expect"]["fingerprint"]
        if got != want:
            sys.exit(f"{scenario_file.name}: {r!r}: computed {got}, expected {want}")
        checked += 1
    return checked


if __name__ == "__main__":
    here = pathlib.Path(__file__).parent
    total = sum(check(here / f) for f in ("fingerprint-canonical.json", "fingerprint-vectors.json"))
    print(f"{total} fingerprint vectors match")
