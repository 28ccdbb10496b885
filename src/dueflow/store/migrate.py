"""Run the Alembic migrations programmatically over the application's own engine, and tell
whether a schema is at the revision this code needs (``serve``, ``worker`` and ``/readyz`` ask)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import event, exc, inspect, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from dueflow.exceptions import NotMigrated
from dueflow.store import _db_connect
from dueflow.store.db import SQLITE_BUSY_TIMEOUT_MS, Database

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(connection: Any = None) -> Any:
    """An Alembic config pointing at dueflow's migrations (no alembic.ini needed)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


# The newest revision in migrations/versions (a test keeps this in step with the scripts).
HEAD = "0022"


async def at_head(db: Database) -> bool:
    """The schema is already at :data:`HEAD` (checked without loading Alembic)."""
    try:
        async with db.engine.connect() as conn:
            result = await conn.execute(text("SELECT version_num FROM alembic_version"))
            return {row[0] for row in result} == {HEAD}
    except exc.DBAPIError:
        return False


async def revisions(db: Database) -> set[str]:
    """The revisions the schema is at: empty for a database that was never migrated.

    Raises:
        BackendUnavailable: the database cannot be reached.
    """
    async with db.read() as conn:
        if not await conn.run_sync(lambda sync: inspect(sync).has_table("alembic_version")):
            return set()
        result = await conn.execute(text("SELECT version_num FROM alembic_version"))
        return {row[0] for row in result}


def behind(found: set[str]) -> str | None:
    """What is wrong with a schema at ``found`` revisions, or None when it is at :data:`HEAD`."""
    if found == {HEAD}:
        return None
    at = ", ".join(sorted(found)) or "none (never migrated)"
    return f"the database schema is at revision {at}, this dueflow needs {HEAD}"


async def require_head(db: Database) -> None:
    """Go on only over a schema at :data:`HEAD` (``serve`` and ``worker`` start with this).

    Raises:
        NotMigrated: the schema was never migrated or is at another revision.
        BackendUnavailable: the database cannot be reached.
    """
    problem = behind(await revisions(db))
    if problem is not None:
        raise NotMigrated(f"{problem}: run `dueflow migrate`")


async def upgrade(db: Database, revision: str = "head") -> None:
    """Bring the schema up to ``revision``.

    Raises:
        DatabaseUnavailable: the database cannot be reached.
    """
    async with db.read():
        pass  # one that cannot be reached says so (the schema engine's errors are Alembic's)
    if revision == "head" and await at_head(db):
        return
    from alembic import command

    async with _schema_engine(db) as engine, engine.begin() as conn:
        await conn.run_sync(lambda sync: command.upgrade(alembic_config(sync), revision))
        if db.dialect == "sqlite":
            await _check_foreign_keys(conn)


@asynccontextmanager
async def _schema_engine(db: Database) -> AsyncIterator[AsyncEngine]:
    """The engine migrations run on. SQLite changes a table by rebuilding it, which its foreign
    keys refuse while other tables refer to it: there migrations get a connection of their own
    with foreign keys off (checked whole before the commit), never one of the pool's."""
    if db.dialect != "sqlite":
        yield db.engine
        return
    engine = create_async_engine(db.report_engine.url, poolclass=NullPool)
    event.listen(engine.sync_engine, "connect", _without_foreign_keys)
    event.listen(engine.sync_engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"))
    try:
        yield engine
    finally:
        await engine.dispose()


def _without_foreign_keys(dbapi_connection: Any, _record: Any) -> None:
    pragmas = ["journal_mode=WAL", f"busy_timeout={SQLITE_BUSY_TIMEOUT_MS}", "foreign_keys=OFF"]
    _db_connect.set_pragmas(dbapi_connection, pragmas)


async def _check_foreign_keys(conn: AsyncConnection) -> None:
    broken = (await conn.exec_driver_sql("PRAGMA foreign_key_check")).all()
    if broken:
        raise RuntimeError(f"a migration left rows that refer to nothing: {broken[:5]}")


async def current_tables(db: Database) -> set[str]:
    """The tables that exist now (for status checks and tests)."""
    async with db.engine.connect() as conn:
        names = await conn.run_sync(lambda sync: inspect(sync).get_table_names())
    return set(names)
