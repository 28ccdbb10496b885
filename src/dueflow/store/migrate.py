"""Run the Alembic migrations programmatically over the application's own engine, and tell
whether a schema is at the revision this code needs (``serve``, ``worker`` and ``/readyz`` ask)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import exc, inspect, text

from dueflow.exceptions import NotMigrated
from dueflow.store.db import Database

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
HEAD = "0008"


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
    """Bring the schema up to ``revision``."""
    if revision == "head" and await at_head(db):
        return
    from alembic import command

    async with db.engine.begin() as conn:
        await conn.run_sync(lambda sync: command.upgrade(alembic_config(sync), revision))


async def current_tables(db: Database) -> set[str]:
    """The tables that exist now (for status checks and tests)."""
    async with db.engine.connect() as conn:
        names = await conn.run_sync(lambda sync: inspect(sync).get_table_names())
    return set(names)
