"""``dueflow migrate``: create or upgrade the database schema."""

from __future__ import annotations

from dueflow.cli._common import out, run, settings_or_exit
from dueflow.cli._lazy import migrations


def migrate() -> None:
    """Create or upgrade the database schema."""
    from dueflow.store.db import Database

    settings = settings_or_exit()

    async def go() -> None:
        db = Database.from_url(
            settings.database_url, sqlite_synchronous=settings.sqlite_synchronous
        )
        try:
            await migrations.upgrade(db)
        finally:
            await db.dispose()

    run(go())
    out.print(f"database at {settings.database_url} is up to date")
