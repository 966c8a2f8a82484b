"""The package as a user gets it: build.sh builds the wheel, a fresh venv
installs it offline (`pip install --no-index --find-links`) with wasmtime as
its one dependency, and a script there guards a function twice with one key,
with `Guard` and with `AsyncGuard`, using the component the wheel ships (no
IDEM_COMPONENT). The wasmtime wheel comes from $IDEM_WHEELHOUSE
(run-polyglot-tests.sh fills it from requirements-dev.txt), else `pip download`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import idem_guard

PACKAGE = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import asyncio
import idem_guard
from idem_guard import AsyncGuard, Guard, Response

effects = []

def charge(fence):
    effects.append(fence)
    return Response(200, [("content-type", b"application/json")], b'{"charge": %d}' % len(effects))

guard = Guard()
first = guard.run("pay:o-1", "cents=1000", charge)
again = guard.run("pay:o-1", "cents=1000", charge)
assert (first.kind, again.kind) == ("executed", "replayed"), (first, again)
assert again.response == first.response, (first, again)
assert effects == [1], effects

async def main():
    guard = AsyncGuard()

    async def charge_async(fence):
        await asyncio.sleep(0)
        effects.append(fence)
        return Response(201, [], b"async charge %d" % len(effects))

    first = await guard.run("pay:o-2", "cents=1000", charge_async)
    again = await guard.run("pay:o-2", "cents=1000", charge_async)
    assert (first.kind, again.kind) == ("executed", "replayed"), (first, again)
    assert again.response.body == first.response.body == b"async charge 2", (first, again)

asyncio.run(main())
assert effects == [1, 1], effects
print("guarded", idem_guard.__file__)
"""


def run(*args: object, **kwargs: object) -> str:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{args} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_built_wheel_installs_offline_in_a_fresh_venv_and_guards_once_sync_and_async(tmp_path: Path) -> None:
    # The component this run tests (the installed package's, or IDEM_COMPONENT's) goes into the wheel.
    component = os.environ.get("IDEM_COMPONENT") or str(idem_guard.DEFAULT_COMPONENT)
    wheels = tmp_path / "wheels"
    built = run("bash", PACKAGE / "build.sh", "", wheels, env={**os.environ, "IDEM_COMPONENT": component})
    assert built.strip().endswith("idem_guard-0.2.0-py3-none-any.whl")

    wheelhouse = os.environ.get("IDEM_WHEELHOUSE")
    if not wheelhouse:
        wheelhouse = tmp_path / "wheelhouse"
        run(sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", wheelhouse, "wasmtime==50.0.1")

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    run(
        venv / "bin" / "pip", "install", "--quiet", "--disable-pip-version-check",
        "--no-index", "--find-links", wheels, "--find-links", wheelhouse, "idem-guard",
    )
    env = {k: v for k, v in os.environ.items() if k not in ("IDEM_COMPONENT", "PYTHONPATH")}
    out = run(venv / "bin" / "python", "-c", SCRIPT, env=env, cwd=tmp_path)
    assert out.startswith("guarded ") and str(venv) in out, out
