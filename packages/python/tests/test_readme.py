"""Every ```python block of packages/python/README.md and examples/README.md
runs as written (issue #17): each runs in a fresh subprocess of this
interpreter, twice (a second run finds the keys the first left on a shared
server, and replays), and must exit 0. Every ```sh block of
packages/python/README.md runs too, once, with bash from the repository's
root and this interpreter's scripts (ruff, mypy) first on PATH. A block marked
`<!-- snippet: skip — why -->` on the line above its fence is counted but
not run. The number of blocks each README holds is asserted, so removing a
fence cannot make this pass.

The READMEs are found from this file's place in the repository, so the test
runs the same against the installed wheel (examples/run-polyglot-tests.sh).
A block that names the local Redis or PostgreSQL server needs
IDEM_TEST_REDIS_URL / IDEM_TEST_POSTGRES_URL, as the other store tests do:
it fails without them, unless IDEM_TEST_SKIP_NETSTORES=1.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stores import server_url

ROOT = Path(__file__).resolve().parents[3]

# (README relative to the repository root, language) -> how many ```python blocks (run by
# test_readme_block_runs_as_written) or ```sh blocks (test_readme_shell_block_runs_as_written) it holds.
BLOCKS = {
    ("packages/python/README.md", "python"): 7,
    ("examples/README.md", "python"): 5,
    ("packages/python/README.md", "sh"): 3,
}

SERVERS = (("redis://", "IDEM_TEST_REDIS_URL"), ("postgres://", "IDEM_TEST_POSTGRES_URL"))
SKIP = re.compile(r"^<!--\s*snippet:\s*skip\b\s*(.*?)\s*-->$")


def blocks(markdown: str, lang: str) -> list[tuple[int, str, str | None]]:
    """The ```lang blocks of a Markdown text: (line, code, skip reason or None)."""
    lines = markdown.split("\n")
    found = []
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```" + lang:
            start = i
            code = []
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                code.append(lines[i])
                i += 1
            assert i < len(lines), f"the block at line {start + 1} is not closed"
            marker = SKIP.match(lines[start - 1].strip()) if start else None
            found.append((start + 1, "\n".join(code) + "\n", (marker.group(1) or "marked skip") if marker else None))
        i += 1
    return found


def _found(readme: str, lang: str) -> list[tuple[int, str, str | None]]:
    return blocks((ROOT / readme).read_text(), lang)


@pytest.mark.parametrize(("readme", "lang"), sorted(BLOCKS))
def test_readme_holds_the_expected_blocks(readme: str, lang: str) -> None:
    found = _found(readme, lang)
    expected = BLOCKS[readme, lang]
    assert len(found) == expected, f"{readme}: expected {expected} ```{lang} blocks, found {len(found)}"


def _cases(lang: str, id_suffix: str) -> list[Any]:
    return [
        pytest.param(readme, line, code, skip, id=f"{readme}:{line}{id_suffix}")
        for readme, of in sorted(BLOCKS)
        if of == lang
        for line, code, skip in _found(readme, lang)
    ]


CASES = _cases("python", "")
SHELL_CASES = _cases("sh", ":sh")


@pytest.mark.parametrize(("readme", "line", "code", "skip"), CASES)
def test_readme_block_runs_as_written(readme: str, line: int, code: str, skip: str | None, tmp_path: Path) -> None:
    if skip is not None:
        pytest.skip(skip)
    for scheme, var in SERVERS:
        if scheme in code:
            server_url(var)  # fails (or skips, with IDEM_TEST_SKIP_NETSTORES=1) when unset
    for attempt in ("first", "second"):
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (
            f"{readme}:{line} failed on its {attempt} run (exit {done.returncode}):\n"
            f"{done.stderr}\n--- the block:\n{code}"
        )


@pytest.mark.parametrize(("readme", "line", "code", "skip"), SHELL_CASES)
def test_readme_shell_block_runs_as_written(readme: str, line: int, code: str, skip: str | None) -> None:
    if skip is not None:
        pytest.skip(skip)
    scripts = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": scripts + os.pathsep + os.environ.get("PATH", "")}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{readme}:{line} failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}\n--- the block:\n{code}"
