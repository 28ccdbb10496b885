"""SQLite for asyncio without a thread per statement.

SQLAlchemy's ``sqlite+aiosqlite`` dialect runs every cursor call (execute, fetch, close) on
aiosqlite's worker thread and waits for the answer on the event loop: measured here, a trivial
statement costs about 400 µs that way against 70 µs through the same SQLAlchemy code on plain
``sqlite3``. dueflow's statements are short (an indexed read, a conditional UPDATE of a few
rows), so this module gives the aiosqlite dialect a connection (through ``async_creator``) that
runs each call inline on the event loop, where SQLite answers in microseconds.

What must never block the loop is a lock wait. The connection is opened with SQLite's busy
timeout at zero; a statement refused with ``database is locked`` (it took no effect) is retried
here after an asyncio sleep, backing off, until :data:`BUSY_BUDGET` has passed, and only then
raised. In WAL mode that happens only at ``BEGIN IMMEDIATE`` while another process writes:
readers never wait, and this process queues its own writers before they reach SQLite
(:class:`dueflow.store.db.Database`).

Long statements (the reports' full-table counts) still hold the loop while they run, which is
why :meth:`dueflow.store.db.Database.report` reads through the threaded aiosqlite driver.

Nothing here waits on the disk: with ``synchronous=NORMAL`` a commit appends to the WAL without
an fsync, and checkpoints run on their own thread (``store/sqlite_checkpoint.py``). With
``synchronous=FULL`` a commit syncs the WAL; such a connection commits on a thread.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

#: How long a statement may wait for another process's write lock before it fails (Busy).
BUSY_BUDGET = 5.0
_FIRST_PAUSE = 0.001
_LONGEST_PAUSE = 0.05


def _locked(error: sqlite3.OperationalError) -> bool:
    text = str(error).lower()
    return "locked" in text or "busy" in text


async def _patiently(call: Callable[[], Any]) -> Any:
    """``call()``, retried after asyncio sleeps while SQLite says the database is locked."""
    pause = _FIRST_PAUSE
    give_up = time.monotonic() + BUSY_BUDGET
    while True:
        try:
            return call()
        except sqlite3.OperationalError as error:
            if not _locked(error) or time.monotonic() >= give_up:
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, _LONGEST_PAUSE)


class InlineCursor:
    """The asyncio cursor interface SQLAlchemy's aiosqlite dialect calls, answered inline."""

    def __init__(self, cursor: sqlite3.Cursor) -> None:
        self._cursor = cursor

    async def __aenter__(self) -> InlineCursor:
        return self

    async def __aexit__(self, *_: object) -> None:
        self._cursor.close()

    @property
    def description(self) -> Any:
        """The DB-API description of the last statement."""
        return self._cursor.description

    @property
    def rowcount(self) -> int:
        """Rows changed by the last statement."""
        return self._cursor.rowcount

    @property
    def lastrowid(self) -> int | None:
        """The rowid of the last inserted row."""
        return self._cursor.lastrowid

    @property
    def arraysize(self) -> int:
        """Rows per fetchmany by default."""
        return self._cursor.arraysize

    @arraysize.setter
    def arraysize(self, value: int) -> None:
        self._cursor.arraysize = value

    async def execute(self, sql: str, parameters: Sequence[Any] | None = None) -> InlineCursor:
        """Run one statement (waiting, without blocking, while another process writes)."""
        await _patiently(lambda: self._cursor.execute(sql, parameters or ()))
        return self

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> InlineCursor:
        """Run one statement for each parameter row."""
        rows = list(rows)
        await _patiently(lambda: self._cursor.executemany(sql, rows))
        return self

    async def fetchone(self) -> Any:
        """The next row."""
        return self._cursor.fetchone()

    async def fetchmany(self, size: int | None = None) -> list[Any]:
        """Up to ``size`` rows."""
        return self._cursor.fetchmany(size if size is not None else self._cursor.arraysize)

    async def fetchall(self) -> list[Any]:
        """The remaining rows."""
        return self._cursor.fetchall()

    async def close(self) -> None:
        """Close the cursor."""
        self._cursor.close()


class _Now:
    """Stands in for aiosqlite's request queue: SQLAlchemy sets the isolation level through it."""

    def put_nowait(self, item: tuple[asyncio.Future[Any], Callable[[], Any]]) -> None:
        future, function = item
        try:
            future.set_result(function())
        except Exception as error:
            future.set_exception(error)


class InlineConnection:
    """The asyncio connection interface SQLAlchemy's aiosqlite dialect calls, answered inline."""

    def __init__(self, connection: sqlite3.Connection, *, commit_off_loop: bool = False) -> None:
        self._conn = connection
        self._connection: sqlite3.Connection | None = connection
        self._tx = _Now()
        self._commit_off_loop = commit_off_loop

    @property
    def isolation_level(self) -> str | None:
        """The sqlite3 module's isolation level (None: we issue BEGIN ourselves)."""
        return self._conn.isolation_level

    def cursor(self) -> InlineCursor:
        """A new cursor (SQLAlchemy enters it with ``async with``)."""
        return InlineCursor(self._conn.cursor())

    async def execute(self, sql: str, parameters: Sequence[Any] | None = None) -> InlineCursor:
        """Run one statement on a new cursor."""
        return await self.cursor().execute(sql, parameters)

    async def commit(self) -> None:
        """Commit (waiting, without blocking, if SQLite is busy); on a thread when the commit
        waits for an fsync (``synchronous=FULL``). The connection is this transaction's alone
        meanwhile: nothing else runs on it until the commit returns."""
        if self._commit_off_loop:
            await asyncio.to_thread(self._conn.commit)
        else:
            await _patiently(self._conn.commit)

    async def rollback(self) -> None:
        """Roll back."""
        self._conn.rollback()

    async def create_function(self, *args: Any, **kwargs: Any) -> None:
        """Register an SQL function."""
        self._conn.create_function(*args, **kwargs)

    async def close(self) -> None:
        """Close the connection."""
        if self._connection is not None:
            self._connection = None
            self._conn.close()

    def stop(self) -> None:
        """Close at once (SQLAlchemy's terminate)."""
        if self._connection is not None:
            self._connection = None
            self._conn.close()


def creator(path: str, *, commit_off_loop: bool = False) -> Callable[[], Any]:
    """An ``async_creator`` for ``create_async_engine``: inline connections to ``path``, their
    commits on a thread if ``commit_off_loop``."""

    async def connect() -> InlineConnection:
        # timeout=0: SQLite never sleeps in its busy handler; we wait on the loop instead.
        return InlineConnection(
            sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False),
            commit_off_loop=commit_off_loop,
        )

    return connect
