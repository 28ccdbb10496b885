"""SQLite commits only append to the WAL; the checkpointer moves it into the database file off
the event loop, keeps it bounded past a reader's old snapshot, and checkpoints a last time on
dispose. A process killed after its commits, before any checkpoint, loses none of them."""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from sqlalchemy import text

from dueflow.config import load_settings
from dueflow.exceptions import ConfigError
from dueflow.store.db import Database
from dueflow.store.sqlite_checkpoint import Bounds, Checkpointer
from tests.conftest import eventually

#: Bounds no test reaches by itself: the tests call the checkpointer when they want it.
NEVER = Bounds(interval=10**9, wal_bytes=2**62, hard_bytes=2**62)


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def scratch(db_path: Path) -> Path:
    """The test's database with a table of its own, and no WAL."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("CREATE TABLE scratch (n INTEGER, filler TEXT)")
    conn.close()
    assert not Path(f"{db_path}-wal").exists()
    return db_path


@pytest.fixture
async def db(scratch: Path):
    database = Database.from_url(f"sqlite:///{scratch}")
    assert database.checkpointer is not None
    database.checkpointer.bounds = NEVER
    yield database
    await database.dispose()


async def commit_rows(db: Database, count: int, start: int = 0) -> None:
    for n in range(start, start + count):
        async with db.write() as conn:
            await conn.execute(
                text("INSERT INTO scratch VALUES (:n, :filler)"), {"n": n, "filler": "x" * 200}
            )


def rows_in_file_alone(db_path: Path, tmp_path: Path) -> int:
    """The rows the database file holds by itself, without its WAL."""
    alone = tmp_path / "alone.db"
    shutil.copyfile(db_path, alone)
    conn = sqlite3.connect(alone)
    try:
        return int(conn.execute("SELECT count(*) FROM scratch").fetchone()[0])
    finally:
        conn.close()


async def test_a_commit_only_appends_to_the_wal(db, db_path):
    async with db.write() as conn:
        assert (await conn.execute(text("PRAGMA wal_autocheckpoint"))).scalar() == 0
        assert (await conn.execute(text("PRAGMA synchronous"))).scalar() == 1  # NORMAL
    before = db_path.read_bytes()
    wal = db.checkpointer.wal_bytes()
    # More pages than SQLite's own automatic checkpoint (1,000) would have let through.
    await commit_rows(db, 1200)
    assert db_path.read_bytes() == before
    assert db.checkpointer.wal_bytes() > wal + 1000 * 4096
    async with db.read() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM scratch"))).scalar() == 1200


async def test_a_checkpoint_moves_the_wal_into_the_file_and_resets_it(db, db_path, tmp_path):
    await commit_rows(db, 50)
    assert rows_in_file_alone(db_path, tmp_path) == 0
    outcome = await db.checkpointer.checkpoint()
    assert (outcome.reset, outcome.reset_done) == ("RESTART", True)
    assert outcome.copied == outcome.frames > 0
    assert rows_in_file_alone(db_path, tmp_path) == 50
    # RESTART keeps the file and the next commit writes it from the start: it does not grow.
    size = db.checkpointer.wal_bytes()
    await commit_rows(db, 1, start=50)
    assert db.checkpointer.wal_bytes() == size
    # A WAL that reached wal_bytes is truncated.
    db.checkpointer.bounds = Bounds(interval=10**9, wal_bytes=size, hard_bytes=2**62)
    outcome = await db.checkpointer.checkpoint()
    assert (outcome.reset, outcome.reset_done) == ("TRUNCATE", True)
    assert db.checkpointer.wal_bytes() == 0
    assert rows_in_file_alone(db_path, tmp_path) == 51


async def test_the_wal_stays_bounded_past_a_reader_holding_an_old_snapshot(
    db, db_path, tmp_path, caplog
):
    clock = Clock()
    checkpointer = Checkpointer(
        str(db_path),
        Bounds(interval=10**9, wal_bytes=0, hard_bytes=2**20, hard_wait=0),
        monotonic=clock,
    )
    reader = sqlite3.connect(db_path, isolation_level=None)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM scratch").fetchone() == (0,)  # its snapshot
    try:
        await commit_rows(db, 20)
        # Below the hard bound: what the reader still needs is not copied, and no reset waits.
        outcome = await checkpointer.checkpoint()
        assert outcome.copied < outcome.frames
        assert outcome.reset is None
        await commit_rows(db, 300, start=20)
        checkpointer.committed()  # the checkpointer of another process that wrote them
        assert checkpointer.wal_bytes() >= 2**20
        assert checkpointer.due_in() == 0.0  # the hard bound makes it due at once
        with caplog.at_level(logging.WARNING, logger="dueflow.store.sqlite_checkpoint"):
            outcome = await checkpointer.checkpoint()
        assert (outcome.reset, outcome.reset_done) == ("TRUNCATE", False)
        assert "a reader holds an old snapshot" in caplog.text
        # Not again at once (each try holds the writers): after the back-off.
        assert checkpointer.due_in() == pytest.approx(checkpointer.bounds.interval)
        reader.execute("COMMIT")
        clock.now += checkpointer.bounds.hard_backoff
        assert checkpointer.due_in() == 0.0
        outcome = await checkpointer.checkpoint()
        assert (outcome.reset, outcome.reset_done) == ("TRUNCATE", True)
        assert checkpointer.wal_bytes() == 0
        assert rows_in_file_alone(db_path, tmp_path) == 320
    finally:
        reader.close()
        await checkpointer.close()


async def test_a_checkpoint_is_due_an_interval_after_a_commit_or_at_a_size(scratch):
    clock = Clock()
    checkpointer = Checkpointer(
        str(scratch), Bounds(interval=0.5, wal_bytes=256 * 1024), monotonic=clock
    )
    assert checkpointer.due_in() is None  # nothing committed: nothing to do
    assert await checkpointer.step() is None
    checkpointer.committed()
    clock.now += 0.2
    assert checkpointer.due_in() == pytest.approx(0.3)
    assert await checkpointer.step() is None
    clock.now += 0.3
    assert checkpointer.due_in() == 0.0
    assert await checkpointer.step() is not None
    assert checkpointer.due_in() is None
    # Another process's writes (no checkpoint of their own) make the WAL large: due at once.
    other = sqlite3.connect(scratch, isolation_level=None)
    other.execute("PRAGMA wal_autocheckpoint=0")
    for n in range(100):
        other.execute("INSERT INTO scratch VALUES (?, ?)", (n, "x" * 4000))
    checkpointer.committed()
    assert checkpointer.wal_bytes() >= 256 * 1024
    assert checkpointer.due_in() == 0.0
    outcome = await checkpointer.step()
    assert outcome is not None and (outcome.reset, outcome.reset_done) == ("TRUNCATE", True)
    other.close()
    await checkpointer.close()


async def test_the_first_write_starts_the_checkpointer_and_it_runs_when_due(scratch):
    db = Database.from_url(f"sqlite:///{scratch}")
    checkpointer = db.checkpointer
    assert checkpointer is not None and not checkpointer.running
    checkpointer.bounds = Bounds(interval=0)
    async with db.read() as conn:  # a read does not start it
        await conn.execute(text("SELECT 1"))
    assert not checkpointer.running
    try:
        await commit_rows(db, 3)
        assert checkpointer.running
        assert await eventually(lambda: checkpointer.last is not None)
        assert checkpointer.last is not None and checkpointer.last.reset_done
    finally:
        await db.dispose()
    assert not checkpointer.running


async def test_dispose_checkpoints_a_last_time(db, db_path, tmp_path):
    checkpointer = db.checkpointer
    await commit_rows(db, 30)
    assert checkpointer.running
    await db.dispose()
    assert not checkpointer.running
    assert not any(t.name.startswith("dueflow-checkpoint") for t in threading.enumerate())
    assert checkpointer.wal_bytes() == 0  # truncated (or gone with the last connection)
    assert rows_in_file_alone(db_path, tmp_path) == 30


async def test_a_failing_checkpoint_is_logged_and_tried_again(tmp_path, caplog):
    checkpointer = Checkpointer(str(tmp_path / "no" / "such" / "dir.db"), Bounds(interval=0))
    with caplog.at_level(logging.WARNING, logger="dueflow.store.sqlite_checkpoint"):
        checkpointer.start(asyncio.Lock())
        checkpointer.committed()
        assert await eventually(lambda: "an SQLite checkpoint failed" in caplog.text)
        assert checkpointer.running  # it goes on
        await checkpointer.close()
    assert "the last SQLite checkpoint failed" in caplog.text
    assert not checkpointer.running


async def test_a_closed_checkpointer_that_never_ran_does_nothing(db_path):
    checkpointer = Checkpointer(str(db_path))
    await checkpointer.close()
    assert checkpointer.last is None


CRASH = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from sqlalchemy import text
    from dueflow.store.db import Database
    from dueflow.store.sqlite_checkpoint import Bounds

    async def main():
        db = Database.from_url("sqlite:///" + sys.argv[1])
        db.checkpointer.bounds = Bounds(interval=10**9, wal_bytes=2**62, hard_bytes=2**62)
        for n in range(200):
            async with db.write() as conn:
                await conn.execute(text("INSERT INTO scratch VALUES (:n, 'x')"), {"n": n})
        print("committed", db.checkpointer.last, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    asyncio.run(main())
    """
)


def test_a_process_killed_after_its_commits_loses_none_of_them(scratch, tmp_path):
    db_path = scratch
    done = subprocess.run(
        [sys.executable, "-c", CRASH, str(db_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert done.stdout.strip() == "committed None"  # no checkpoint ran
    assert Path(f"{db_path}-wal").stat().st_size > 0
    assert rows_in_file_alone(db_path, tmp_path) == 0  # every row only in the WAL
    conn = sqlite3.connect(db_path)
    try:
        rows = conn.execute("SELECT count(*), min(n), max(n) FROM scratch").fetchone()
    finally:
        conn.close()
    assert rows == (200, 0, 199)


async def test_full_synchronous_commits_on_a_thread(scratch):
    db = Database.from_url(f"sqlite:///{scratch}", sqlite_synchronous="FULL")
    seen: list[tuple[str, int]] = []
    try:
        async with db.write() as conn:
            assert (await conn.execute(text("PRAGMA synchronous"))).scalar() == 2  # FULL
            raw = (await conn.get_raw_connection()).driver_connection
            raw._conn.set_trace_callback(lambda sql: seen.append((sql, threading.get_ident())))
            await conn.execute(text("INSERT INTO scratch VALUES (1, 'x')"))
        raw._conn.set_trace_callback(None)
    finally:
        await db.dispose()
    threads = {sql.split()[0]: ident for sql, ident in seen}
    assert threads["INSERT"] == threading.get_ident()
    assert threads["COMMIT"] != threading.get_ident()


def test_synchronous_is_normal_or_full():
    assert load_settings(database_url="sqlite:///x.db").sqlite_synchronous == "NORMAL"
    assert load_settings(sqlite_synchronous="full").sqlite_synchronous == "FULL"
    with pytest.raises(ConfigError):
        Database.from_url("sqlite:///x.db", sqlite_synchronous="OFF")


async def test_close_right_after_a_commit_woke_the_task_stops_it(scratch):
    checkpointer = Checkpointer(str(scratch), Bounds(interval=10**9))
    checkpointer.start(asyncio.Lock())
    await asyncio.sleep(0)  # the task waits for a commit
    checkpointer.committed()  # ... which wakes it, as the close cancels it
    await asyncio.wait_for(checkpointer.close(), timeout=10)
    assert not checkpointer.running


async def test_close_does_not_wait_for_a_write_lock_never_released(scratch):
    lock = asyncio.Lock()
    await lock.acquire()  # a writer's task abandoned in its transaction
    checkpointer = Checkpointer(str(scratch), Bounds(interval=0))
    checkpointer.start(lock)
    checkpointer.committed()
    assert await eventually(lambda: lock._waiters)  # the task waits for the lock to reset
    await asyncio.wait_for(checkpointer.close(), timeout=10)
    assert checkpointer.last is not None and checkpointer.last.reset == "TRUNCATE"
    assert not checkpointer.running
