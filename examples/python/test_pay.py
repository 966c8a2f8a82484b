"""The examples as a user runs them, over the installed `idem_guard` package:
examples/README.md shows pay.py verbatim, and it charges once per order."""

from __future__ import annotations

from pathlib import Path

import pytest
from pay import pay


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
