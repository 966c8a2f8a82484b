"""What the Python host does beyond the shared scenarios: store errors reach
the guest as `err` (not a trap), a trapped instance is replaced, the
README's snippet is the code tested here."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest

from idem_guard import Guard, GuardError, ManualClock, MemoryStore, Response
from pay import pay


def guard_over(store: MemoryStore) -> Guard:
    return Guard.load(store=store, clock=ManualClock(1_000), lease_ms=100, retention_ms=10_000)


def test_a_store_error_from_replace_reaches_the_guest_as_err_not_a_trap() -> None:
    # `replace` returns `result<option<u64>, store-error>`, the shape wasmtime-py
    # 50.0.1 cannot lower an `err` for without idem_guard's OptionType fix.
    store = MemoryStore()
    guard = guard_over(store)
    _, claim = guard.begin("k", "fp")
    store.fault("replace", "error", "store timeout", count=1)
    with pytest.raises(GuardError) as err:
        guard.complete(claim, Response(200, [], b"x"))
    assert err.value.kind == "unavailable"
    assert "store replace of key \"k\" failed: store timeout" in err.value.detail
    assert guard.replaced == 0, "the guest saw the error; the instance did not trap"
    guard.complete(claim, Response(200, [], b"x"))
    assert guard.begin("k", "fp") == ("replay", Response(200, [], b"x"))


def test_a_host_bug_traps_the_instance_which_is_replaced() -> None:
    store = MemoryStore()
    guard = guard_over(store)
    _, claim = guard.begin("k", "fp")
    store.fault("replace", "trap", count=1)
    with pytest.raises(GuardError) as err:
        guard.complete(claim, Response(200, [], b"x"))
    assert err.value.kind == "unavailable" and "instance replaced" in err.value.detail
    assert guard.replaced == 1
    # The fresh instance works, and the trapped call stored nothing: the claim still holds.
    assert guard.begin("k", "fp") == ("in-flight", 100)
    guard.complete(claim, Response(200, [], b"x"))
    assert guard.begin("k", "fp")[0] == "replay"


def test_the_fingerprint_is_the_documented_encoding() -> None:
    # Recomputed here from the WIT's description, independently of the component.
    def expected(method: str, path: str, headers: list[tuple[str, bytes]], body: bytes) -> str:
        h = hashlib.sha256()

        def part(b: bytes) -> None:
            h.update(struct.pack(">Q", len(b)))
            h.update(b)

        ordered = sorted((n.lower().encode(), v) for n, v in headers)
        for p in (b"idem-fingerprint-v1", method.upper().encode(), path.encode(), struct.pack(">Q", len(ordered))):
            part(p)
        for n, v in ordered:
            part(n)
            part(v)
        part(body)
        return "sha256:" + h.hexdigest()

    guard = guard_over(MemoryStore())
    headers = [("X-Tenant", b"acme"), ("content-type", b"application/json")]
    assert guard.fingerprint("post", "/pay", headers, b'{"qty":1}') == expected("post", "/pay", headers, b'{"qty":1}')
    assert guard.fingerprint("GET", "/", [], b"\x00\xff") == expected("GET", "/", [], b"\x00\xff")


class Ledger:
    def __init__(self) -> None:
        self.charges: list[str] = []

    def charge(self, order_id: str, cents: int, fence: int) -> dict:
        self.charges.append(order_id)
        return {"order": order_id, "cents": cents, "fence": fence, "n": len(self.charges)}


def test_the_readme_snippet_is_pay_py_and_it_charges_once_per_order() -> None:
    source = (Path(__file__).parent / "pay.py").read_text().strip()
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    assert source in readme, "examples/README.md must show pay.py verbatim"

    ledger = Ledger()
    first = pay(ledger, "o-1", 1000)
    assert pay(ledger, "o-1", 1000) == first
    assert ledger.charges == ["o-1"]
    with pytest.raises(RuntimeError, match="not run: conflict"):
        pay(ledger, "o-1", 2000)
    assert ledger.charges == ["o-1"]
