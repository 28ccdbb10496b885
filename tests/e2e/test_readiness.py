"""Readiness tells the truth (issue 9, item 11): ``serve`` and ``worker`` refuse a server database
that was never migrated (exit 2, "run dueflow migrate"), ``/readyz`` answers 503 naming what is
not ready (a schema behind, a trigger backend down) while ``/healthz`` stays a liveness check,
and on SQLite ``serve`` still migrates its own file."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from dueflow import bootstrap
from dueflow.api.app import create_app
from dueflow.config import load_settings
from dueflow.store import migrate
from dueflow.store.db import Database, async_url
from tests.conftest import SERVICE_URLS, require_service
from tests.contract.conftest import REDIS_URL
from tests.e2e import live

pytestmark = pytest.mark.slow


def _clean_env(database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
    env.update({"DUEFLOW_DATABASE_URL": database_url, "DUEFLOW_PROFILE": "dev"})
    return env


async def _recreate(server_url: str, name: str) -> None:
    """Drop and create database ``name`` on the server of ``server_url``."""
    engine = create_async_engine(async_url(server_url), isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            await conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        await engine.dispose()


@pytest.fixture
async def empty_pg() -> AsyncIterator[str]:
    """The URL of a PostgreSQL database that exists and was never migrated."""
    require_service("postgres", "127.0.0.1", 5432)
    base = SERVICE_URLS["postgres"]
    assert base is not None
    name = f"{make_url(base).database}_empty"
    await _recreate(base, name)
    yield make_url(base).set(database=name).render_as_string(hide_password=False)


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(live.DUEFLOW), *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.postgres
@pytest.mark.parametrize("command", ["serve", "worker"])
def test_an_unmigrated_server_database_is_refused_with_exit_2(empty_pg, command):
    args = ["serve", "--port", str(live.free_port())] if command == "serve" else ["worker"]
    done = _run(args, _clean_env(empty_pg))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "run `dueflow migrate`" in done.stderr
    assert "never migrated" in done.stderr
    assert "Traceback" not in done.stderr
    assert "serving on" not in done.stderr


async def _downgrade_one(url: str) -> None:
    from alembic import command

    db = Database.from_url(url)
    try:
        async with db.engine.begin() as conn:
            await conn.run_sync(lambda sync: command.downgrade(migrate.alembic_config(sync), "-1"))
    finally:
        await db.dispose()


async def _upgrade(url: str) -> None:
    db = Database.from_url(url)
    try:
        await migrate.upgrade(db)
    finally:
        await db.dispose()


@pytest.fixture
def served_pg(empty_pg: str, tmp_path: Path) -> Iterator[live.Served]:
    """``dueflow serve`` over a PostgreSQL database migrated with ``dueflow migrate``."""
    migrated = _run(["migrate"], _clean_env(empty_pg))
    assert migrated.returncode == 0, migrated.stderr
    with live.serve(tmp_path, {"DUEFLOW_DATABASE_URL": empty_pg}, dev_users=False) as served:
        yield served


@pytest.mark.postgres
async def test_readyz_answers_503_while_the_schema_is_behind(served_pg, empty_pg):
    async with httpx.AsyncClient(base_url=served_pg.base, timeout=10) as client:
        ready = await client.get("/readyz")
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
        await _downgrade_one(empty_pg)
        behind = await client.get("/readyz")
        assert behind.status_code == 503, behind.text
        body = behind.json()
        assert body["status"] == "unavailable"
        assert set(body["not_ready"]) == {"schema"}
        assert f"needs {migrate.HEAD}: run `dueflow migrate`" in body["not_ready"]["schema"]
        assert (await client.get("/healthz")).status_code == 200  # alive all the same
        await _upgrade(empty_pg)
        assert (await client.get("/readyz")).status_code == 200


def test_serve_on_a_fresh_sqlite_file_migrates_it_and_is_ready(tmp_path):
    with live.serve(tmp_path, dev_users=False) as served:
        answer = httpx.get(f"{served.base}/readyz", timeout=10)
        assert (answer.status_code, answer.json()) == (200, {"status": "ready"})
    assert served.db.exists()


@pytest.mark.parametrize("reachable", [True, False], ids=["redis up", "redis down"])
async def test_readyz_names_a_trigger_backend_that_does_not_answer(db_path, reachable):
    if reachable:
        require_service("redis", "127.0.0.1", 6379)
    trigger_url = REDIS_URL if reachable else f"redis://127.0.0.1:{live.free_port()}/0"
    settings = load_settings(
        database_url=f"sqlite:///{db_path}", profile="prod", trigger_url=trigger_url
    )
    async with bootstrap.running(settings, migrate_sqlite=False) as deps:
        transport = httpx.ASGITransport(app=create_app(deps))
        async with httpx.AsyncClient(transport=transport, base_url="http://dueflow") as client:
            answer = await client.get("/readyz")
    if reachable:
        assert (answer.status_code, answer.json()) == (200, {"status": "ready"})
    else:
        assert answer.status_code == 503
        assert answer.json()["not_ready"] == {
            "trigger": "the redis trigger's backend does not answer"
        }
        assert "Connect" not in answer.text  # the client library's text is for the log


@pytest.mark.parametrize("host", ["127.0.0.1", "dueflow-db.invalid"], ids=["refused", "no DNS"])
def test_migrate_on_an_unreachable_database_says_so_without_a_traceback(host):
    """Issue 23, item 13: `dueflow migrate` on a database that cannot be reached printed the
    driver's traceback; it says the database is unavailable and exits 1."""
    url = f"postgresql://postgres@{host}:{live.free_port()}/dueflow"
    done = _run(["migrate"], _clean_env(url))
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "error: The database is unavailable; try again later." in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
