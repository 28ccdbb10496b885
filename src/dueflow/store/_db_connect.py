"""Connecting: the async driver for a URL, connects bounded in time, SQLite's pragmas and its
``BEGIN IMMEDIATE`` writes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import exc
from sqlalchemy.engine import make_url

from dueflow.exceptions import (
    ConfigError,
)
from dueflow.store import sqlite_inline

_ASYNC_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+asyncpg",
    "postgres": "postgresql+asyncpg",
    "mysql": "mysql+asyncmy",
    "mariadb": "mysql+asyncmy",
}
SQLITE_BUSY_TIMEOUT_MS = 5000
#: Connections a PostgreSQL or MySQL engine keeps, opened as needed and never more. All are kept
#: once opened: a pool that kept 5 and closed each of 10 more on its way back churned under a load
#: of 5 to 15 transactions at once (two API processes at 16 requests each opened ~11 connections
#: a second, each a new PostgreSQL backend and asyncpg's setup of its type codecs).
POOL_SIZE = 15
#: Inline SQLite connections kept open (as many again may open beyond, closed on return). A
#: connection in-process is cheap; a request waiting for one is not: the pool's queue lets a new
#: checkout take a connection given back before the waiter woken for it runs, and that waiter
#: goes to the back of the queue again. With 15 connections and 64 clients in a flash sale, some
#: requests waited 14-22 s (p99) while others went through in milliseconds.
SQLITE_INLINE_POOL = 64
#: ``PRAGMA synchronous`` in WAL mode: NORMAL syncs only at checkpoints (a power cut may lose the
#: last commits, never the file); FULL syncs the WAL at each commit, off the event loop.
SQLITE_SYNCHRONOUS = ("NORMAL", "FULL")


def async_url(url: str) -> str:
    """Map a plain database URL (``sqlite:///x.db``) to its asyncio driver's URL.

    Raises:
        ConfigError: Not a database URL, an unsupported database, or SQLite in memory.
    """
    try:
        parsed = make_url(url)
    except (exc.ArgumentError, ValueError):  # ValueError: a port that is not a number
        raise ConfigError(f"not a database URL: {url!r}") from None
    backend = parsed.drivername.split("+", 1)[0]
    if backend not in _ASYNC_DRIVERS:
        raise ConfigError(f"unsupported database {backend!r} in {url!r}")
    if backend == "sqlite" and parsed.database in (None, "", ":memory:"):
        # Its statements and its reports go through two connections: one file for both.
        raise ConfigError("dueflow needs an SQLite file, not an in-memory database")
    if "+" in parsed.drivername:
        return url
    return parsed.set(drivername=_ASYNC_DRIVERS[backend]).render_as_string(hide_password=False)


def sqlite_connect(synchronous: str) -> Callable[[Any, Any], None]:
    """The ``connect`` listener of dueflow's SQLite engines."""
    if synchronous not in SQLITE_SYNCHRONOUS:
        raise ConfigError(f"SQLite synchronous must be NORMAL or FULL, not {synchronous!r}")

    def connect(dbapi_connection: Any, _record: Any) -> None:
        _sqlite_pragmas(dbapi_connection, synchronous)

    return connect


def _sqlite_pragmas(dbapi_connection: Any, synchronous: str) -> None:
    # Inline connections wait for locks on the event loop (sqlite_inline), never in SQLite.
    inline = isinstance(dbapi_connection.driver_connection, sqlite_inline.InlineConnection)
    set_pragmas(
        dbapi_connection,
        [
            "journal_mode=WAL",
            f"synchronous={synchronous}",
            # A commit only appends to the WAL; the checkpoints (which wait on the disk) run on
            # a thread of their own (sqlite_checkpoint), never inside a commit on the event loop.
            "wal_autocheckpoint=0",
            f"busy_timeout={0 if inline else SQLITE_BUSY_TIMEOUT_MS}",
            "foreign_keys=ON",
            # A larger page cache (64 MiB, bounded) keeps big timer and order tables off the
            # disk path.
            "cache_size=-65536",
            "temp_store=MEMORY",
        ],
    )


def set_pragmas(dbapi_connection: Any, pragmas: Sequence[str]) -> None:
    """Set up a new SQLite connection: ``PRAGMA`` each of ``pragmas`` (``name=value``), in
    order, and no implicit BEGIN by the driver."""
    # We issue BEGIN ourselves (IMMEDIATE for writes) instead of the driver's implicit BEGIN.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    for pragma in pragmas:
        cursor.execute(f"PRAGMA {pragma}")
    cursor.close()


_BEGIN_READ = "BEGIN DEFERRED"
_BEGIN_WRITE = "BEGIN IMMEDIATE"


def sqlite_begin(conn: Any) -> None:
    """The ``begin`` listener of dueflow's SQLite engines: a write takes the write lock at
    BEGIN, so two writers never deadlock on a lock upgrade.

    BEGIN goes to the driver's cursor, announced to the ``before_cursor_execute`` listeners as
    SQLAlchemy would (the statement counts see it), without Core's execution machinery: that
    cost more than SQLite's BEGIN itself, once a transaction (measured: ~1.5% of a place's
    CPU). A driver error goes through the connection's own error handling, as a statement's
    does (SQLAlchemy's begin leaves errors of its listeners unwrapped): ``database is locked``
    is SQLAlchemy's OperationalError, which :func:`dueflow.store.db.translate` makes Busy."""
    sql = _BEGIN_READ if conn.get_execution_options().get("dueflow_read") else _BEGIN_WRITE
    for listener in conn.dispatch.before_cursor_execute:
        listener(conn, None, sql, (), None, False)
    cursor = conn.connection.cursor()
    try:
        cursor.execute(sql)
    except BaseException as error:
        conn._handle_dbapi_exception(error, sql, (), cursor, None)
        raise  # not reached: the handler raises
    finally:
        cursor.close()
