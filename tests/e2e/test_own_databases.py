"""Two test runs at once on one machine (issue 23, item 11): each creates its own PostgreSQL and
MariaDB databases, uses only those, and drops them, and what a killed run left is dropped by the
next one."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import asyncmy
import asyncpg
import pytest

from tests import databases
from tests.conftest import require_service

ROOT = Path(__file__).resolve().parents[2]
#: A contract test that writes users and orders on both server databases.
TARGET = "tests/contract/test_store_contract.py"

pytestmark = [pytest.mark.postgres, pytest.mark.mysql, pytest.mark.slow, pytest.mark.serial]


async def _postgres(statement: str) -> set[str]:
    conn = await asyncpg.connect(f"{databases.SERVERS['postgres']}/postgres")
    try:
        return {r[0] for r in await conn.fetch(statement)}
    finally:
        await conn.close()


async def _mysql(statement: str) -> set[str]:
    conn = await asyncmy.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        async with conn.cursor() as cur:
            await cur.execute(statement)
            return {r[0] for r in await cur.fetchall()}
    finally:
        conn.close()


def test_two_runs_at_once_each_use_and_drop_their_own_databases() -> None:
    require_service("postgres", "127.0.0.1", 5432)
    require_service("mysql", "127.0.0.1", 3306)
    dead = f"{databases.PREFIX}p999999999"  # no such process: a run that was killed
    asyncio.run(_postgres(f'CREATE DATABASE "{dead}"'))
    asyncio.run(_mysql(f"CREATE DATABASE `{dead}`"))

    env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_TEST_")}
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", TARGET]
    args += ["-k", "postgres or mysql"]
    runs = [
        subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(2)
    ]
    outputs = [(run.communicate(timeout=240)[0].decode(), run.returncode) for run in runs]
    for output, code in outputs:
        assert code == 0, output
        assert " passed" in output and "skipped" not in output, output

    names = asyncio.run(_postgres("SELECT datname FROM pg_database"))
    names |= asyncio.run(_mysql("SHOW DATABASES"))
    left = {n for n in names if n.startswith(databases.PREFIX)}
    assert dead not in left
    for run in runs:  # each run's own, and every database derived from it, dropped at its end
        name = f"{databases.PREFIX}p{run.pid}"
        assert not {n for n in left if n == name or n.startswith(f"{name}_")}, left


@pytest.mark.parametrize(
    "run",
    [
        'x"; DROP DATABASE test; --',  # SQL
        "ci_2",  # would make run "ci" take dueflow_test_ci_2 for one of its own
        "p123",  # would be taken for the unnamed run of process 123, and dropped once it ends
    ],
)
def test_a_run_name_that_could_reach_another_runs_databases_is_refused(run: str) -> None:
    env = {**os.environ, "DUEFLOW_TEST_RUN": run}
    done = subprocess.run(
        [sys.executable, "-c", "import tests.databases"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "DUEFLOW_TEST_RUN must be" in done.stderr


def test_the_suite_uses_this_runs_databases() -> None:
    from tests.conftest import SERVICE_URLS

    for name in ("postgres", "mysql"):
        if databases.GIVEN[name] is None:
            assert str(SERVICE_URLS[name]).endswith(f"/{databases.NAME}")


@pytest.mark.parametrize(
    ("worker", "name"), [("", "dueflow_test_ci"), ("gw1", "dueflow_test_cigw1")]
)
def test_each_worker_of_a_named_parallel_run_has_its_own_databases(worker: str, name: str) -> None:
    env = {**os.environ, "DUEFLOW_TEST_RUN": "ci", "PYTEST_XDIST_WORKER": worker}
    done = subprocess.run(
        [sys.executable, "-c", "import tests.databases as d; print(d.NAME)"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == name
