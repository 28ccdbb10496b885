"""Migration 0021 (the order list's indexes) on SQLite, PostgreSQL and MariaDB: up from an empty
database the schema equals ``metadata``; down to 0018 the two indexes are gone (the
one-column status index stays); up again they are back."""

from __future__ import annotations

from sqlalchemy import func, inspect, select, text

from dueflow.store import migrate, schema
from dueflow.store.db import Database
from tests.contract import migration_kit

NEW = {"ix_orders_status_id", "ix_orders_created_at_id"}


async def _order_indexes(db: Database) -> set[str]:
    async with db.engine.connect() as conn:
        if db.dialect == "sqlite":  # its reflection here lists none: ask the catalogue
            query = "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'orders'"
            return set((await conn.execute(text(query))).scalars())
        found = await conn.run_sync(lambda sync: inspect(sync).get_indexes("orders"))
    return {index["name"] for index in found}


async def test_0021_adds_the_two_indexes_and_takes_them_back(empty_url: str) -> None:
    db = Database.from_url(empty_url)
    try:
        await migrate.upgrade(db)
        assert await _order_indexes(db) >= NEW
        assert await migration_kit.schema_differences(db) == []
        await migration_kit.downgrade(db, "0018")
        assert not NEW & await _order_indexes(db)
        assert "ix_orders_status" in await _order_indexes(db)
        await migrate.upgrade(db)
        assert await _order_indexes(db) >= NEW
        assert await migration_kit.schema_differences(db) == []
        async with db.read() as conn:
            assert (
                await conn.execute(select(func.count()).select_from(schema.orders))
            ).scalar() == 0
    finally:
        await db.dispose()
