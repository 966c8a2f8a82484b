"""The package as a user gets it: build.sh builds the wheel, a fresh venv
installs it offline (`pip install --no-index --find-links`) with its extras
(`idem-guard[redis,postgres]`: wasmtime, redis, psycopg with its bundled
libpq, psycopg_pool), and scripts there guard a function twice with one key
— with `Guard` and `AsyncGuard` on the built-in memory store, and on Redis
and PostgreSQL with the sync and the async stores — using the component and
the on-store layout files the wheel ships (no IDEM_COMPONENT, no checkout).
The dependencies' wheels come from $IDEM_WHEELHOUSE (run-polyglot-tests.sh
fills it from requirements-dev.txt), else `pip download` them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import idem_guard
from stores import server_url, unique

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


NETSTORES = r"""
import asyncio, os, sys
import idem_guard
from idem_guard import AsyncGuard, Guard, Response
from idem_guard.postgres import AsyncPostgresStore, PostgresStore
from idem_guard.redis import AsyncRedisStore, RedisStore

redis_url, postgres_url, prefix, table = sys.argv[1:5]
effects = []

def charge(fence):
    effects.append(fence)
    return Response(200, [], b"charged %d" % len(effects))

def twice(guard, key):
    first = guard.run(key, "cents=1000", charge)
    again = guard.run(key, "cents=1000", charge)
    assert (first.kind, again.kind) == ("executed", "replayed"), (first, again)
    assert again.response == first.response, (first, again)

with RedisStore(redis_url, prefix=prefix) as store:
    twice(Guard(store=store), "pay:o-1")
with PostgresStore(postgres_url, table=table) as store:
    twice(Guard(store=store), "pay:o-1")

async def main():
    async def charge_async(fence):
        await asyncio.sleep(0)
        return charge(fence)

    async def twice_async(guard, key):
        assert guard.replays
        first = await guard.run(key, "cents=1000", charge_async)
        again = await guard.run(key, "cents=1000", charge_async)
        assert (first.kind, again.kind) == ("executed", "replayed"), (first, again)

    async with AsyncRedisStore(redis_url, prefix=prefix) as store:
        await twice_async(AsyncGuard(store=store), "pay:o-2")
    async with await AsyncPostgresStore.open(postgres_url, table=table) as store:
        await twice_async(AsyncGuard(store=store), "pay:o-2")

asyncio.run(main())
assert effects == [1, 1, 1, 1], effects
print("guarded", idem_guard.__file__)
"""


def run(*args: object, **kwargs: object) -> str:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)
    assert done.returncode == 0, f"{args} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the built wheel and its extras installed offline."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    # The component this run tests (the installed package's, or IDEM_COMPONENT's) goes into the wheel.
    component = os.environ.get("IDEM_COMPONENT") or str(idem_guard.DEFAULT_COMPONENT)
    wheels = tmp_path / "wheels"
    built = run("bash", PACKAGE / "build.sh", "", wheels, env={**os.environ, "IDEM_COMPONENT": component})
    assert built.strip().endswith("idem_guard-0.3.0-py3-none-any.whl")

    wheelhouse = os.environ.get("IDEM_WHEELHOUSE")
    if not wheelhouse:
        wheelhouse = tmp_path / "wheelhouse"
        run(
            sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
            "--dest", wheelhouse, "-r", PACKAGE / "requirements-dev.txt",
        )

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    run(
        venv / "bin" / "pip", "install", "--quiet", "--disable-pip-version-check",
        "--no-index", "--find-links", wheels, "--find-links", wheelhouse, "idem-guard[redis,postgres]",
    )
    return venv


def user_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in ("IDEM_COMPONENT", "PYTHONPATH")}


def test_the_built_wheel_installs_offline_in_a_fresh_venv_and_guards_once_sync_and_async(venv: Path, tmp_path: Path) -> None:
    out = run(venv / "bin" / "python", "-c", SCRIPT, env=user_env(), cwd=tmp_path)
    assert out.startswith("guarded ") and str(venv) in out, out


def test_the_installed_wheel_guards_once_on_redis_and_postgres_sync_and_async(venv: Path, tmp_path: Path) -> None:
    redis_url, postgres_url = server_url("IDEM_TEST_REDIS_URL"), server_url("IDEM_TEST_POSTGRES_URL")
    import psycopg
    import redis

    prefix, table = unique("wheel") + ":", unique("wheel")
    try:
        out = run(venv / "bin" / "python", "-c", NETSTORES, redis_url, postgres_url, prefix, table, env=user_env(), cwd=tmp_path)
        assert out.startswith("guarded ") and str(venv) in out, out
    finally:
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)
        client.close()
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(
                f"DROP TABLE IF EXISTS {table}; DROP FUNCTION IF EXISTS {table}_claim; "
                f"DROP FUNCTION IF EXISTS {table}_try_claim; DELETE FROM idem_schema WHERE table_name = '{table}'"
            )
