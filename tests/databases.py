"""Each test run's own server databases (issue 23, item 11).

Two checkouts testing at once (a branch while CI tests main) must not share a database: every
run creates ``dueflow_test_<run>`` on PostgreSQL and on MariaDB when the session starts and drops
it, with every database a test derived from it (``<name>_shop_mig``, ``<name>_empty`` ...), when
the session ends. ``<run>`` is ``DUEFLOW_TEST_RUN`` when set (letters and digits, so no run's
name is another's followed by ``_``), followed by the pytest-xdist worker's name (``gw0``) in a
parallel run, else ``p<pid>``; databases left by a run that was killed
(``dueflow_test_p<pid>`` of a process that no longer exists here) are dropped by the next run.
Runs in other PID namespaces sharing the servers (containers) must each set ``DUEFLOW_TEST_RUN``
and leave ``p<digits>`` names alone: they cannot see each other's processes. ``DUEFLOW_TEST_POSTGRES_URL`` / ``DUEFLOW_TEST_MYSQL_URL`` name a database of one's
own instead (it is used as it is, never dropped).
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
from urllib.parse import urlsplit

PREFIX = "dueflow_test_"
GIVEN_RUN = os.environ.get("DUEFLOW_TEST_RUN")
#: pytest-xdist's worker name ("gw0", "gw1", ...), so the workers of one named run (``-n 2``
#: with ``DUEFLOW_TEST_RUN`` set) each have their own databases too.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
RUN = f"{GIVEN_RUN}{_WORKER}" if GIVEN_RUN else f"p{os.getpid()}"
if GIVEN_RUN is not None and (
    not re.fullmatch(r"[A-Za-z0-9]{1,30}", GIVEN_RUN) or re.fullmatch(r"p\d+", GIVEN_RUN)
):
    raise SystemExit(
        f"DUEFLOW_TEST_RUN must be 1-30 letters or digits, and not p<digits> (the name of an"
        f" unnamed run): {GIVEN_RUN!r}"
    )
NAME = f"{PREFIX}{RUN}"

SERVERS = {
    "postgres": "postgresql://postgres@127.0.0.1:5432",
    "mysql": "mysql://root@127.0.0.1:3306",
}
GIVEN = {
    "postgres": os.environ.get("DUEFLOW_TEST_POSTGRES_URL"),
    "mysql": os.environ.get("DUEFLOW_TEST_MYSQL_URL"),
}


def url(name: str) -> str:
    """The URL tests use for backend ``name`` (``postgres`` or ``mysql``)."""
    return GIVEN[name] or f"{SERVERS[name]}/{NAME}"


def _answers(server: str) -> bool:
    parts = urlsplit(server)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 0), 2):
            return True
    except OSError:
        return False


def _left_by_a_dead_run(database: str) -> bool:
    match = re.fullmatch(rf"{PREFIX}p(\d+)(_\w*)?", database)
    return match is not None and not os.path.exists(f"/proc/{match.group(1)}")


def _ours(database: str) -> bool:
    return database == NAME or database.startswith(f"{NAME}_")


async def _postgres(create: bool) -> None:
    import asyncpg

    conn = await asyncpg.connect(f"{SERVERS['postgres']}/postgres")
    try:
        names = [r[0] for r in await conn.fetch("SELECT datname FROM pg_database")]
        for name in names:
            if _ours(name) or _left_by_a_dead_run(name):
                await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if create:
            await conn.execute(f'CREATE DATABASE "{NAME}"')
    finally:
        await conn.close()


async def _mysql(create: bool) -> None:
    import asyncmy

    conn = await asyncmy.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        async with conn.cursor() as cur:
            await cur.execute("SHOW DATABASES")
            names = [r[0] for r in await cur.fetchall()]
            for name in names:
                if _ours(name) or _left_by_a_dead_run(name):
                    await cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
            if create:
                await cur.execute(f"CREATE DATABASE `{NAME}`")
    finally:
        conn.close()


def _each(create: bool) -> None:
    for name, work in (("postgres", _postgres), ("mysql", _mysql)):
        if GIVEN[name] is None and _answers(SERVERS[name]):
            asyncio.run(work(create))


def create() -> None:
    """At the session's start: this run's databases, empty (a server that does not answer is
    passed over: its tests skip, or fail under CI)."""
    _each(create=True)


def drop() -> None:
    """At the session's end: this run's databases and every one derived from them."""
    _each(create=False)
