"""SQLite statements run inline on the event loop; a wait for another process's write lock does
not block the loop, and ends in Busy after the budget."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from sqlalchemy import text

from dueflow.exceptions import BackendUnavailable, Busy
from dueflow.store import sqlite_inline
from dueflow.store.db import Database
from tests.conftest import eventually


@pytest.fixture
async def db(db_path):
    database = Database.from_url(f"sqlite:///{db_path}")
    yield database
    await database.dispose()


@pytest.fixture
def other_writer(db_path):
    """Another process's connection, as SQLite sees it: holds the write lock until released."""
    conn = sqlite3.connect(db_path, isolation_level=None, timeout=0)
    conn.execute("BEGIN IMMEDIATE")
    yield conn
    conn.close()


async def driver_of(conn) -> object:
    return (await conn.get_raw_connection()).driver_connection


async def test_reads_and_writes_are_inline_and_reports_threaded(db):
    async with db.read() as conn:
        assert isinstance(await driver_of(conn), sqlite_inline.InlineConnection)
        assert (await conn.execute(text("PRAGMA busy_timeout"))).scalar() == 0
    async with db.write() as conn:
        assert isinstance(await driver_of(conn), sqlite_inline.InlineConnection)
    async with db.report() as conn:
        assert not isinstance(await driver_of(conn), sqlite_inline.InlineConnection)
        assert (await conn.execute(text("PRAGMA busy_timeout"))).scalar() == 5000


async def test_a_write_waits_for_another_writer_without_blocking_the_loop(db, other_writer):
    async def write() -> None:
        async with db.write() as conn:
            await conn.execute(text("UPDATE users SET name = name WHERE id = 0"))

    waiting = asyncio.create_task(write())
    # The write holds this process's writer queue while SQLite refuses it the lock ...
    assert await eventually(lambda: db._write_lock is not None and db._write_lock.locked())
    # ... and the loop goes on: a read answers meanwhile (WAL readers never wait).
    async with db.read() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM users"))).scalar() == 0
    assert not waiting.done()
    other_writer.execute("COMMIT")
    await asyncio.wait_for(waiting, timeout=5)


async def test_a_write_gives_up_busy_after_the_budget(db, other_writer, monkeypatch):
    monkeypatch.setattr(sqlite_inline, "BUSY_BUDGET", 0.1)
    with pytest.raises(Busy, match="database busy"):
        async with db.write() as conn:
            await conn.execute(text("UPDATE users SET name = name WHERE id = 0"))
    other_writer.execute("COMMIT")
    async with db.write() as conn:  # the connection is usable again
        await conn.execute(text("UPDATE users SET name = name WHERE id = 0"))


async def test_other_errors_are_not_retried(db):
    with pytest.raises(BackendUnavailable, match="database is unavailable"):  # text: in the log
        async with db.read() as conn:
            await conn.execute(text("SELECT * FROM no_such_table"))
