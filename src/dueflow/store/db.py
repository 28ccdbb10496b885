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

from dueflow import tracing
from dueflow.store import sqlite_checkpoint, sqlite_inline

# Connecting and the error translation, re-exported (``db.async_url``, ``db.translate``, ...).
from dueflow.store._db_connect import POOL_SIZE as POOL_SIZE
from dueflow.store._db_connect import SQLITE_BUSY_TIMEOUT_MS as SQLITE_BUSY_TIMEOUT_MS
from dueflow.store._db_connect import SQLITE_INLINE_POOL as SQLITE_INLINE_POOL
from dueflow.store._db_connect import SQLITE_SYNCHRONOUS as SQLITE_SYNCHRONOUS
from dueflow.store._db_connect import async_url as async_url
from dueflow.store._db_connect import sqlite_begin, sqlite_connect
from dueflow.store._db_errors import MESSAGES as MESSAGES
from dueflow.store._db_errors import protocol_broken
from dueflow.store._db_errors import translate as translate

log = logging.getLogger(__name__)

#: Seconds a pooled connection may sit unused and still be handed out unchecked. One that sat
#: longer is pinged first (asyncpg: BEGIN, an empty statement, ROLLBACK): a ping on every checkout
#: cost 6 round trips an order (two checkouts) on a path of 11.
PING_AFTER_IDLE = 1.0
#: Seconds a new PostgreSQL or MySQL connection may take, handshake included, before the server
#: counts as unreachable (asyncpg waits 60 s; asyncmy bounds the TCP connect only, so a server
#: that accepts and never answers held a request for good).
CONNECT_SECONDS = 5.0


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
        if protocol_broken(context.original_exception):
            context.is_disconnect = True

    def _lost(self, error: Any, dbapi_connection: Any) -> bool:
        return protocol_broken(error) or bool(
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


AfterCommit = Callable[[], Awaitable[None]]
_AFTER_COMMIT = "dueflow_after_commit"


def after_commit(conn: AsyncConnection, hook: AfterCommit) -> None:
    """Run ``hook`` once the write transaction of ``conn`` has committed (never if it rolls
    back); a failing hook is logged, never raised."""
    hooks = conn.info.get(_AFTER_COMMIT)
    if hooks is None:
        raise RuntimeError("after_commit needs a connection of Database.write()")
    hooks.append(hook)


BeforeCommit = Callable[[], Awaitable[None]]
_BEFORE_COMMIT = "dueflow_before_commit"


def before_commit(conn: AsyncConnection, key: str, hook: BeforeCommit) -> bool:
    """Run ``hook`` last in the write transaction of ``conn``, once per ``key`` (registering
    the same key again keeps the first hook); False when ``conn`` is no connection of
    Database.write() (the caller then does the work at once)."""
    hooks = conn.info.get(_BEFORE_COMMIT)
    if hooks is None:
        return False
    hooks.setdefault(key, hook)
    return True


_TRANSACTION = "dueflow_transaction"


def transaction_state(conn: AsyncConnection) -> dict[str, Any] | None:
    """What the write transaction of ``conn`` keeps for its own end (work marked or deferred
    to its last statements), dropped when it commits or rolls back, so nothing of it reaches
    the next transaction on the pooled connection; None when ``conn`` is no connection of
    Database.write()."""
    state: dict[str, Any] | None = conn.info.get(_TRANSACTION)
    return state


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
        connect = sqlite_connect(sqlite_synchronous)
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
            event.listen(engine.sync_engine, "begin", sqlite_begin)
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
        with tracing.transaction("write", self.dialect):
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
                last: dict[str, BeforeCommit] = {}
                conn.info[_BEFORE_COMMIT] = last
                conn.info[_TRANSACTION] = {}
                try:
                    yield conn
                    for hook in last.values():
                        await hook()
                except exc.DBAPIError as error:
                    await self._dropped(conn, error)
                    raise
                finally:
                    # A connection the server dropped mid-transaction refuses even this read
                    # (PendingRollbackError) until rolled back, which the exit does: that must
                    # not hide the dropped connection's error (BackendUnavailable) behind it.
                    with contextlib.suppress(exc.PendingRollbackError):
                        conn.info.pop(_AFTER_COMMIT, None)
                        conn.info.pop(_BEFORE_COMMIT, None)
                        conn.info.pop(_TRANSACTION, None)
        except (exc.DBAPIError, exc.TimeoutError, UnicodeEncodeError) as error:
            raise translate(error) from error

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """A read-only transaction (on SQLite it takes no write lock)."""
        with tracing.transaction("read", self.dialect):
            async with self._read(self.engine) as conn:
                yield conn

    @asynccontextmanager
    async def report(self) -> AsyncIterator[AsyncConnection]:
        """A read-only transaction for long reads (counts over whole tables): on SQLite it runs
        on the driver's thread, so the event loop goes on meanwhile."""
        with tracing.transaction("report", self.dialect):
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
