"""Migration 0021 (the order list's indexes) on SQLite, PostgreSQL and MariaDB: up from an empty
database the schema equals ``metadata``; down to 0018 the two indexes are gone (the
one-column status index stays); up again they are back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import func, inspect, select, text
from sqlalchemy.engine import make_url

from dueflow.store import migrate, schema
from dueflow.store.db import Database
from tests.conftest import SERVICE_URLS, require_service
from tests.contract.test_flow_migration import _schema_differences, _server_database
from tests.contract.test_shop_migration import _downgrade

NEW = {"ix_orders_status_id", "ix_orders_created_at_id"}


def _own_name(server: str) -> str:
    return f"{make_url(server).database}_search_mig"


@pytest.fixture(
    params=[
        pytest.param("sqlite"),
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
async def empty_url(request: pytest.FixtureRequest, tmp_path: Any) -> AsyncIterator[str]:
    """An empty database of its own on each backend, dropped after."""
    name = request.param
    if name == "sqlite":
        yield f"sqlite:///{tmp_path / 'search-mig.db'}"
        return
    require_service(name, "127.0.0.1", 5432 if name == "postgres" else 3306)
    base = SERVICE_URLS[name]
    assert base is not None
    await _server_database(base, True, _own_name(base))
    try:
        yield make_url(base).set(database=_own_name(base)).render_as_string(hide_password=False)
    finally:
        await _server_database(base, False, _own_name(base))


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
        assert await _schema_differences(db) == []
        await _downgrade(db, "0018")
        assert not NEW & await _order_indexes(db)
        assert "ix_orders_status" in await _order_indexes(db)
        await migrate.upgrade(db)
        assert await _order_indexes(db) >= NEW
        assert await _schema_differences(db) == []
        async with db.read() as conn:
            assert (
                await conn.execute(select(func.count()).select_from(schema.orders))
            ).scalar() == 0
    finally:
        await db.dispose()
