"""Run the Alembic migrations programmatically over the application's own engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import inspect

from dueflow.store.db import Database

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(connection: Any = None) -> Config:
    """An Alembic config pointing at dueflow's migrations (no alembic.ini needed)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


async def upgrade(db: Database, revision: str = "head") -> None:
    """Bring the schema up to ``revision``."""
    async with db.engine.begin() as conn:
        await conn.run_sync(lambda sync: command.upgrade(alembic_config(sync), revision))


async def current_tables(db: Database) -> set[str]:
    """The tables that exist now (for status checks and tests)."""
    async with db.engine.connect() as conn:
        names = await conn.run_sync(lambda sync: inspect(sync).get_table_names())
    return set(names)
