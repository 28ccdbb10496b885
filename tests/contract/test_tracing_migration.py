"""Migration 0019 (trace parents) on SQLite, PostgreSQL and MariaDB: at the head, orders placed
with tracing on keep their traceparent on their timers and events; down to 0018 the column goes
and every row stays; up again, the column is back (NULL on the rows written before) and the
schema equals ``metadata``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from sqlalchemy import func, select

from dueflow import tracing
from dueflow.clock import FakeClock
from dueflow.service import accounts, orders
from dueflow.store import migrate, schema
from dueflow.store.db import Database
from tests.conftest import START, RecordingNotifier
from tests.contract import migration_kit

TABLES = ("timers", "order_events")


@pytest.fixture
def traced() -> Iterator[None]:
    tracing.start([InMemorySpanExporter()])
    try:
        yield
    finally:
        tracing.stop()


async def _kept(db: Database) -> dict[str, list[str | None]]:
    """Each table's traceparents, by id."""
    found = {}
    async with db.read() as conn:
        for name in TABLES:
            table = schema.metadata.tables[name]
            query = select(table.c.trace_parent).order_by(table.c.id)
            found[name] = list((await conn.execute(query)).scalars())
    return found


async def _counts(db: Database) -> dict[str, int]:
    async with db.read() as conn:
        return {
            name: int(
                await conn.scalar(select(func.count()).select_from(schema.metadata.tables[name]))
            )
            for name in TABLES
        }


async def test_0019_adds_and_drops_the_trace_parents_keeping_every_row(
    empty_url: str, traced: None
) -> None:
    db = Database.from_url(empty_url)
    try:
        await migrate.upgrade(db)
    finally:
        await db.dispose()
    async with migration_kit.running(empty_url, FakeClock(START), RecordingNotifier()) as deps:
        seller = (await accounts.add_user(deps, "seller"))[0].id
        buyer = (await accounts.add_user(deps, "buyer"))[0].id
        with tracing.span("placing"):
            parent = tracing.current_traceparent()
            goods = await accounts.add_goods(deps, seller_id=seller, title="tent", price="9")
            await orders.place_order(deps, buyer_id=buyer, goods_id=goods)
        kept = await _kept(deps.db)
        assert parent is not None
        assert {name: set(values) for name, values in kept.items()} == {
            "timers": {parent},
            "order_events": {parent},
        }
        counts = await _counts(deps.db)

        await migration_kit.downgrade(deps.db, "0018")
        assert await migrate.revisions(deps.db) == {"0018"}
        for name in TABLES:
            assert "trace_parent" not in await migration_kit.columns(deps.db, name)

        await migrate.upgrade(deps.db)
        assert await migration_kit.schema_differences(deps.db) == []
        assert await _counts(deps.db) == counts
        assert await _kept(deps.db) == {name: [None] * len(v) for name, v in kept.items()}
