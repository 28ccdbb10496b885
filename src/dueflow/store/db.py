"""The database handle: one engine, write and read transactions, driver errors translated once.

A driver's text never leaves this module in an exception (a client may be shown the message): it
is logged here, and the exception says only what kind of trouble it was (:func:`translate`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event, exc
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from dueflow import logs
from dueflow.exceptions import (
    BackendUnavailable,
    Busy,
    ConfigError,
    Conflict,
    DatabaseUnavailable,
    DueflowError,
    UnstorableValue,
)
from dueflow.store import sqlite_checkpoint, sqlite_inline

log = logging.getLogger(__name__)

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
#: Seconds a pooled connection may sit unused and still be handed out unchecked. One that sat
#: longer is pinged first (asyncpg: BEGIN, an empty statement, ROLLBACK): a ping on every checkout
#: cost 6 round trips an order (two checkouts) on a path of 11.
PING_AFTER_IDLE = 1.0
#: Inline SQLite connections kept open (as many again may open beyond, closed on return). A
#: connection in-process is cheap; a request waiting for one is not: the pool's queue lets a new
#: checkout take a connection given back before the waiter woken for it runs, and that waiter
#: goes to the back of the queue again. With 15 connections and 64 clients in a flash sale, some
#: requests waited 14-22 s (p99) while others went through in milliseconds.
SQLITE_INLINE_POOL = 64
#: ``PRAGMA synchronous`` in WAL mode: NORMAL syncs only at checkpoints (a power cut may lose the
#: last commits, never the file); FULL syncs the WAL at each commit, off the event loop.
SQLITE_SYNCHRONOUS = ("NORMAL", "FULL")
#: Seconds a new PostgreSQL or MySQL connection may take, handshake included, before the server
#: counts as unreachable (asyncpg waits 60 s; asyncmy bounds the TCP connect only, so a server
#: that accepts and never answers held a request for good).
CONNECT_SECONDS = 5.0


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


def _bounded_connect(engine: AsyncEngine) -> None:
    """Make each connection ``engine`` opens give up after :data:`CONNECT_SECONDS`, and a server
    not reached fail as the driver's OperationalError, a DB-API error like any other (so
    :func:`translate` takes it). asyncpg raises the socket's own error (ConnectionRefusedError,
    socket.gaierror for a host that does not resolve), which SQLAlchemy passes on as it is: it
    reached the API's handler as a 500 with a traceback, request after request."""
    dbapi = engine.dialect.loaded_dbapi
    driver_connect = getattr(dbapi, engine.dialect.driver).connect

    async def connect(*args: Any, **kwargs: Any) -> Any:
        try:
            async with asyncio.timeout(CONNECT_SECONDS):
                return await driver_connect(*args, **kwargs)
        except OSError as error:  # refused, reset, timed out, a host that does not resolve
            reason = str(error) or f"no answer in {CONNECT_SECONDS:g} s"
            raise dbapi.OperationalError(
                f"cannot connect: {type(error).__name__}: {reason}"
            ) from error

    def do_connect(_dialect: Any, _record: Any, _cargs: Any, cparams: dict[str, Any]) -> None:
        cparams["async_creator_fn"] = connect

    event.listen(engine.sync_engine, "do_connect", do_connect)


def _sqlite_connect(synchronous: str) -> Callable[[Any, Any], None]:
    """The ``connect`` listener of dueflow's SQLite engines."""
    if synchronous not in SQLITE_SYNCHRONOUS:
        raise ConfigError(f"SQLite synchronous must be NORMAL or FULL, not {synchronous!r}")

    def connect(dbapi_connection: Any, _record: Any) -> None:
        _sqlite_pragmas(dbapi_connection, synchronous)

    return connect


def _sqlite_pragmas(dbapi_connection: Any, synchronous: str) -> None:
    # We issue BEGIN ourselves (IMMEDIATE for writes) instead of the driver's implicit BEGIN.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA synchronous={synchronous}")
    # A commit only appends to the WAL; the checkpoints (which wait on the disk) run on a
    # thread of their own (sqlite_checkpoint), never inside a commit on the event loop.
    cursor.execute("PRAGMA wal_autocheckpoint=0")
    # Inline connections wait for locks on the event loop (sqlite_inline), never in SQLite.
    inline = isinstance(dbapi_connection.driver_connection, sqlite_inline.InlineConnection)
    cursor.execute(f"PRAGMA busy_timeout={0 if inline else SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    # A larger page cache (64 MiB, bounded) keeps big timer and order tables off the disk path.
    cursor.execute("PRAGMA cache_size=-65536")
    cursor.execute("PRAGMA temp_store=MEMORY")
    cursor.close()


def _sqlite_begin(conn: Any) -> None:
    # A write takes the write lock at BEGIN, so two writers never deadlock on a lock upgrade.
    mode = "DEFERRED" if conn.get_execution_options().get("dueflow_read") else "IMMEDIATE"
    conn.exec_driver_sql(f"BEGIN {mode}")


_IDLE_SINCE = "dueflow_idle_since"


class Liveness:
    """Which pooled connections of a PostgreSQL or MySQL engine are pinged at checkout: one
    that sat unused for PING_AFTER_IDLE seconds or more, and every one given back before a
    dropped connection was last found. Under load no checkout pings.

    A dead connection found by a ping is replaced before the request uses it, with every
    connection opened before it (a restart ends them all), so a database restarted while the
    pool was quiet costs no request. One found dead by a request instead (used a moment before
    the restart) fails that request as BackendUnavailable and is replaced; SQLAlchemy does that
    for its own statements, :meth:`found` for hot statements (store/hot.py), which run on the
    driver connection past SQLAlchemy's error handling. A restart fails the requests in flight
    and a few more, never every request after it.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self.dialect = engine.dialect
        self.dropped_at = float("-inf")
        event.listen(engine.sync_engine, "checkin", self._checkin)
        event.listen(engine.sync_engine, "checkout", self._checkout)
        event.listen(engine.sync_engine, "handle_error", self._handle_error)

    @staticmethod
    def _handle_error(context: Any) -> None:
        """A protocol left mid-operation is a lost connection to SQLAlchemy too: the connection
        is replaced, with every one opened before it (not given back to the pool, where it
        failed the next request to take it)."""
        if _protocol_broken(context.original_exception):
            context.is_disconnect = True

    def _lost(self, error: Any, dbapi_connection: Any) -> bool:
        return _protocol_broken(error) or bool(
            self.dialect.is_disconnect(error, dbapi_connection, None)
        )

    @staticmethod
    def _checkin(_dbapi_connection: Any, record: Any) -> None:
        if record is not None:
            record.info[_IDLE_SINCE] = time.monotonic()

    def _checkout(self, dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get(_IDLE_SINCE)
        if since is None:
            return  # fresh
        if since > self.dropped_at and time.monotonic() - since < PING_AFTER_IDLE:
            return  # used a moment ago, after the last connection found dropped
        try:
            self.dialect.do_ping(dbapi_connection)
        except self.dialect.loaded_dbapi.Error as error:
            if self._lost(error, dbapi_connection):
                # SQLAlchemy replaces this connection and every one opened before it.
                raise exc.InvalidatePoolError(str(error)) from error
            raise

    async def found(self, conn: AsyncConnection, error: exc.DBAPIError) -> None:
        """After ``error`` on ``conn``: a connection the database dropped, not yet seen so by
        SQLAlchemy, is replaced, and those given back before now are pinged at checkout."""
        if error.connection_invalidated or conn.invalidated:
            return
        raw = await conn.get_raw_connection()
        # A hot statement's error is the driver's own (asyncpg's has no DB-API class).
        orig: Any = error.orig
        if self._lost(orig, raw.dbapi_connection):
            self.dropped_at = time.monotonic()
            await conn.invalidate()


def _protocol_broken(error: BaseException | None) -> bool:
    """asyncpg's InternalClientError ("cannot switch to state 12; another operation (2) is in
    progress"): the connection's protocol was left in the middle of an operation, so it can
    never run another, though it is not closed. About one connection in ten that the server
    terminates in the middle of a transaction fails so rather than as "connection is closed"
    (the chaos soak's pg_terminate_backend); SQLAlchemy 2.1's asyncpg dialect does not count it
    as a disconnect."""
    return error is not None and type(error).__name__ == "InternalClientError"


#: What the driver errors are translated to, with the message a client may see (an unreachable
#: database is a DatabaseUnavailable, which names it).
MESSAGES: dict[type[DueflowError], str] = {
    Conflict: "the change conflicts with what is stored",
    UnstorableValue: "a value cannot be stored: text the database refuses, or a number out of range",
    Busy: "database busy, try again",
    BackendUnavailable: DatabaseUnavailable().message,
}
#: Words of the lock errors that carry no SQLSTATE to go by (SQLite's, MySQL's lock wait).
_LOCK_WORDS = ("locked", "busy", "deadlock", "could not serialize", "lock wait timeout")


DriverError = exc.DBAPIError | exc.TimeoutError | UnicodeEncodeError


def translate(error: DriverError) -> DueflowError:
    """A driver error as dueflow's own, the driver's text logged and kept out of its message.

    A constraint violation (SQLSTATE class 23) is a Conflict and a value the database cannot
    hold (class 22, or text the driver cannot encode, such as a lone surrogate) is an
    UnstorableValue: retrying the same request cannot help. A deadlock, serialization failure
    (class 40) or lock wait is Busy; anything else (unreachable, no schema, no pooled
    connection free in time) DatabaseUnavailable, logged a line a second at most however many
    requests meet it (:func:`dueflow.logs.throttled`).
    """
    kind = _kind(error)
    detail = error.orig if isinstance(error, exc.DBAPIError) else error
    if kind is BackendUnavailable:
        logs.throttled(
            log, logging.WARNING, str(detail), "database unavailable: %s", detail or repr(detail)
        )
        return DatabaseUnavailable(MESSAGES[kind])
    level = logging.INFO if kind in (Busy, Conflict) else logging.WARNING
    log.log(level, "database error taken as %s: %s", kind.__name__, detail)
    return kind(MESSAGES[kind])


def _kind(error: DriverError) -> type[DueflowError]:
    if isinstance(error, exc.TimeoutError):
        return BackendUnavailable  # every pooled connection busy connecting or in use
    if isinstance(error, UnicodeEncodeError | exc.DataError):
        return UnstorableValue
    if isinstance(error, exc.IntegrityError):
        return Conflict
    state = str(getattr(error.orig, "sqlstate", None) or "")
    if state.startswith("22"):
        return UnstorableValue
    if state.startswith("23"):
        return Conflict
    text = str(error.orig).lower()
    if state.startswith("40") or state == "55P03" or any(w in text for w in _LOCK_WORDS):
        return Busy
    return BackendUnavailable


AfterCommit = Callable[[], Awaitable[None]]
_AFTER_COMMIT = "dueflow_after_commit"


def after_commit(conn: AsyncConnection, hook: AfterCommit) -> None:
    """Run ``hook`` once the write transaction of ``conn`` has committed (never if it rolls
    back); a failing hook is logged, never raised."""
    hooks = conn.info.get(_AFTER_COMMIT)
    if hooks is None:
        raise RuntimeError("after_commit needs a connection of Database.write()")
    hooks.append(hook)


class Database:
    """One engine and its transactions."""

    def __init__(
        self,
        engine: AsyncEngine,
        report_engine: AsyncEngine | None = None,
        checkpointer: sqlite_checkpoint.Checkpointer | None = None,
        liveness: Liveness | None = None,
    ) -> None:
        self.engine = engine
        # What replaces pooled connections the database dropped (PostgreSQL and MySQL).
        self.liveness = liveness
        # Long reads (reports' full-table counts) on SQLite go through the threaded driver, so
        # they do not hold the event loop; elsewhere the one engine serves them too.
        self.report_engine = report_engine or engine
        # SQLite has one writer at a time. Queueing our own writers here, instead of letting
        # them poll in SQLite's busy handler (which sleeps up to 100 ms a try), keeps lock
        # waits in this process fair and short; other processes still wait in busy_timeout.
        self._write_lock: asyncio.Lock | None = None
        # SQLite's WAL checkpoints, started by the first write (every process that writes has
        # one) and finished by dispose.
        self.checkpointer = checkpointer

    @classmethod
    def from_url(
        cls, url: str, *, echo: bool = False, sqlite_synchronous: str = "NORMAL"
    ) -> Database:
        """A handle on the database at ``url`` (plain or driver-qualified); on SQLite,
        ``sqlite_synchronous`` is NORMAL or FULL (docs/architecture.md, durability)."""
        full = async_url(url)
        parsed = make_url(full)
        kwargs: dict[str, Any] = {"echo": echo}
        if parsed.get_backend_name() == "sqlite":
            if parsed.database:
                Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
            kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}
        else:
            kwargs["pool_size"] = POOL_SIZE
            kwargs["max_overflow"] = 0
        if parsed.get_backend_name() in ("mysql", "mariadb"):
            # The same semantics as PostgreSQL's default: conditional UPDATEs and FOR UPDATE
            # see the latest committed row, and InnoDB takes no gap locks (far fewer deadlocks).
            kwargs["isolation_level"] = "READ COMMITTED"
        if parsed.get_backend_name() != "sqlite":
            engine = create_async_engine(full, **kwargs)
            _bounded_connect(engine)
            return cls(engine, liveness=Liveness(engine))
        connect = _sqlite_connect(sqlite_synchronous)
        # With FULL a commit waits for an fsync of the WAL: that wait goes to a thread.
        creator = sqlite_inline.creator(
            parsed.database or "", commit_off_loop=sqlite_synchronous != "NORMAL"
        )
        inline = create_async_engine(
            full,
            echo=echo,
            async_creator=creator,
            pool_size=SQLITE_INLINE_POOL,
            max_overflow=SQLITE_INLINE_POOL,
        )
        threaded = create_async_engine(full, **kwargs)
        for engine in (inline, threaded):
            event.listen(engine.sync_engine, "connect", connect)
            event.listen(engine.sync_engine, "begin", _sqlite_begin)
        return cls(inline, threaded, sqlite_checkpoint.Checkpointer(parsed.database or ""))

    @property
    def dialect(self) -> str:
        """``sqlite``, ``postgresql`` or ``mysql``."""
        return self.engine.dialect.name

    @asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncConnection]:
        """A write transaction: committed on success, rolled back on any error. What was
        registered with :func:`after_commit` runs after the commit, outside every lock."""
        hooks: list[AfterCommit] = []
        if self.dialect != "sqlite":
            async with self._write(hooks) as conn:
                yield conn
        else:
            if self._write_lock is None:
                self._write_lock = asyncio.Lock()
            if self.checkpointer is not None:
                self.checkpointer.start(self._write_lock)
            async with self._write_lock, self._write(hooks) as conn:
                yield conn
            if self.checkpointer is not None:
                self.checkpointer.committed()
        for hook in hooks:
            try:
                await hook()
            except Exception:
                # What runs after a commit is a copy of the truth (a cache): its trouble is
                # logged and repaired later, never a failure of what committed.
                log.exception("an after-commit step failed; the committed change stands")

    @asynccontextmanager
    async def _write(self, hooks: list[AfterCommit]) -> AsyncIterator[AsyncConnection]:
        try:
            async with self.engine.begin() as conn:
                conn.info[_AFTER_COMMIT] = hooks
                try:
                    yield conn
                except exc.DBAPIError as error:
                    await self._dropped(conn, error)
                    raise
                finally:
                    # A connection the server dropped mid-transaction refuses even this read
                    # (PendingRollbackError) until rolled back, which the exit does: that must
                    # not hide the dropped connection's error (BackendUnavailable) behind it.
                    with contextlib.suppress(exc.PendingRollbackError):
                        conn.info.pop(_AFTER_COMMIT, None)
        except (exc.DBAPIError, exc.TimeoutError, UnicodeEncodeError) as error:
            raise translate(error) from error

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """A read-only transaction (on SQLite it takes no write lock)."""
        async with self._read(self.engine) as conn:
            yield conn

    @asynccontextmanager
    async def report(self) -> AsyncIterator[AsyncConnection]:
        """A read-only transaction for long reads (counts over whole tables): on SQLite it runs
        on the driver's thread, so the event loop goes on meanwhile."""
        async with self._read(self.report_engine) as conn:
            yield conn

    @asynccontextmanager
    async def _read(self, engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
        try:
            async with engine.connect() as conn:
                conn = await conn.execution_options(dueflow_read=True)
                async with conn.begin():
                    try:
                        yield conn
                    except exc.DBAPIError as error:
                        await self._dropped(conn, error)
                        raise
        except (exc.DBAPIError, exc.TimeoutError, UnicodeEncodeError) as error:
            raise translate(error) from error

    async def _dropped(self, conn: AsyncConnection, error: exc.DBAPIError) -> None:
        if self.liveness is not None:
            await self.liveness.found(conn, error)

    async def dispose(self) -> None:
        """Close every pooled connection; on SQLite, then checkpoint the WAL a last time."""
        await self.engine.dispose()
        if self.report_engine is not self.engine:
            await self.report_engine.dispose()
        if self.checkpointer is not None:
            await self.checkpointer.close()
