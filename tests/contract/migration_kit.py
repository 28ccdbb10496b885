"""What the migration tests share: an empty database of a test's own on a server, the
downgrade to a revision, the services over a database, and the schema's differences from
``metadata`` as Alembic's autogenerate sees them (the ``empty_url`` fixture is in conftest)."""

from __future__ import annotations

from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import create_async_engine

from dueflow import bootstrap
from dueflow.clock import FakeClock
from dueflow.config import load_settings
from dueflow.store import migrate, schema
from dueflow.store.db import Database, async_url
from tests.conftest import RecordingNotifier


async def server_database(server: str, create: bool, name: str) -> None:
    """Create (after dropping) or drop the database ``name`` on a server."""
    engine = create_async_engine(async_url(server), isolation_level="AUTOCOMMIT")
    postgres = engine.dialect.name == "postgresql"
    quoted = f'"{name}"' if postgres else f"`{name}`"
    try:
        async with engine.connect() as conn:
            force = " WITH (FORCE)" if postgres else ""
            await conn.execute(text(f"DROP DATABASE IF EXISTS {quoted}{force}"))
            if create:
                await conn.execute(text(f"CREATE DATABASE {quoted}"))
    finally:
        await engine.dispose()


async def downgrade(db: Database, revision: str) -> None:
    """Take the database down to ``revision``."""
    # SQLite rebuilds tables: its migrations run with foreign keys off, as upgrade's do.
    async with migrate._schema_engine(db) as engine, engine.begin() as conn:
        await conn.run_sync(lambda sync: command.downgrade(migrate.alembic_config(sync), revision))


def running(url: str, clock: FakeClock, notifier: RecordingNotifier) -> Any:
    """The services over the database at ``url`` (migrated by the test, never here)."""
    settings = load_settings(database_url=url, profile="prod")
    return bootstrap.running(settings, clock=clock, notifier=notifier, migrate_sqlite=False)


async def schema_differences(db: Database) -> list[Any]:
    """What Alembic's autogenerate would change to make the database equal ``metadata``."""

    def compare(sync: Any) -> list[Any]:
        context = MigrationContext.configure(sync, opts={"compare_type": True})
        return list(compare_metadata(context, schema.metadata))

    async with db.engine.connect() as conn:
        found = await conn.run_sync(compare)
    if db.dialect == "mysql":  # partial indexes made only where the database has them (ddl_if)
        found = [d for d in found if not _only_partial(d)]
    return [d for d in found if _matters(d)]


#: Indexes the schema makes on PostgreSQL and SQLite only (``ddl_if``): MySQL has no partial
#: index, and autogenerate does not know ``ddl_if``.
ONLY_PARTIAL = {
    "ix_timers_must",
    "ix_orders_pay_due",
    "ix_orders_ship_due",
    "ix_orders_receive_due",
    "ix_orders_review_due",
    "ix_timers_stuck",
}


def _only_partial(difference: Any) -> bool:
    return (
        isinstance(difference, tuple)
        and difference[0] == "add_index"
        and difference[1].name in ONLY_PARTIAL
    )


def _matters(difference: Any) -> bool:
    """Everything but a binary column's size class: MariaDB stores ``LargeBinary(2**20)``
    (notifications.body, older than 0009) as MEDIUMBLOB, which holds exactly that."""
    if isinstance(difference, list):  # column changes come grouped per column
        return any(_matters(d) for d in difference)
    if difference[0] != "modify_type":
        return True
    existing, wanted = difference[5], difference[6]
    return not (existing.python_type is bytes and wanted.python_type is bytes)


async def columns(db: Database, table: str) -> set[str]:
    async with db.engine.connect() as conn:
        found = await conn.run_sync(lambda sync: inspect(sync).get_columns(table))
    return {c["name"] for c in found}
