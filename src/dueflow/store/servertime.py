"""The database server's own clock: the one clock every process sharing it decides by."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import text

from dueflow.store.db import Database

# The time now, not the transaction's start (PostgreSQL's now() is the latter).
_NOW = {
    "postgresql": text("SELECT clock_timestamp()"),
    "mysql": text("SELECT UTC_TIMESTAMP(6)"),
    # A mariadb+asyncmy:// URL keeps its own dialect name.
    "mariadb": text("SELECT UTC_TIMESTAMP(6)"),
}


def has_clock(db: Database) -> bool:
    """Whether the database runs its own server clock (SQLite runs in this process)."""
    return db.dialect in _NOW


async def server_now(db: Database) -> datetime:
    """The database server's time, timezone-aware UTC.

    Raises:
        ValueError: The database has no server clock (SQLite).
    """
    statement = _NOW.get(db.dialect)
    if statement is None:
        raise ValueError(f"{db.dialect} has no server clock")
    async with db.read() as conn:
        value = (await conn.execute(statement)).scalar_one()
    if not isinstance(value, datetime):
        raise ValueError(f"the database answered {value!r} for its time")
    # MySQL answers UTC without a zone; PostgreSQL answers an aware time in the session's zone.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
