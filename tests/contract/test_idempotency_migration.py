"""Migration 0017 (idempotent POSTs) on SQLite, PostgreSQL and MariaDB: placing's keys written
before it keep answering across the upgrade (the first answer kept, or the order as it is now
for a key that kept none), each now its buyer's (``user:<id>``) on ``POST /api/orders``; down
again, placing's keys are kept with their buyer (the order's) and the other routes' are
dropped; up again, the schema equals ``metadata``."""

from __future__ import annotations

from typing import Any

from sqlalchemy import column, func, inspect, select, table, update

from dueflow.clock import FakeClock
from dueflow.store import migrate, schema
from dueflow.store.db import Database
from tests.conftest import START, RecordingNotifier
from tests.contract import migration_kit
from tests.unit.api import Api
from tests.unit.api.shop_world import fails, shop_api

#: idempotency_keys as revision 0012 has it.
COLUMNS_0012 = {
    "id",
    "buyer_id",
    "key",
    "request_hash",
    "order_id",
    "status_code",
    "body",
    "created_at",
}


async def _keys(db: Database) -> list[dict[str, Any]]:
    """Every row of idempotency_keys with every column it has now, as the driver gives them
    (``buyer_id`` is not in ``metadata``)."""
    name = schema.idempotency_keys.name
    async with db.engine.connect() as conn:
        found = await conn.run_sync(lambda sync: inspect(sync).get_columns(name))
        names = sorted(c["name"] for c in found)
        query = select(*(column(n) for n in names)).select_from(table(name)).order_by(column("id"))
        return [dict(r) for r in (await conn.execute(query)).mappings().all()]


async def _place(api: Api, goods_id: int, key: str) -> Any:
    return await api.call(
        "POST",
        "/api/orders",
        "buyer",
        json={"goods_id": goods_id},
        headers={"Idempotency-Key": key},
    )


async def test_0017_keeps_placing_keys_answering(empty_url: str) -> None:
    db = Database.from_url(empty_url)
    try:
        await migrate.upgrade(db)
    finally:
        await db.dispose()
    async with (
        migration_kit.running(empty_url, FakeClock(START), RecordingNotifier()) as deps,
        shop_api(deps) as api,
    ):
        goods = [await api.goods() for _ in range(3)]
        first = await _place(api, goods[0], "old-1")
        second = await _place(api, goods[1], "old-2")
        assert (first.status_code, second.status_code) == (201, 201), second.text
        async with deps.db.write() as conn:  # its placer kept no answer
            await conn.execute(
                update(schema.idempotency_keys)
                .where(schema.idempotency_keys.c.key == "old-2")
                .values(status_code=None, body=None)
            )
        created = await api.call(
            "POST",
            "/api/goods",
            "buyer",
            json={"title": "tent", "price": "1.00"},
            headers={"Idempotency-Key": "goods-1"},
        )
        assert created.status_code == 201, created.text
        at_head = await _keys(deps.db)

        await migration_kit.downgrade(deps.db, "0012")
        assert await migrate.revisions(deps.db) == {"0012"}
        old = await _keys(deps.db)
        assert set(old[0]) == COLUMNS_0012
        kept = ("id", "key", "request_hash", "order_id", "status_code", "body", "created_at")
        placing = [r for r in at_head if r["route"] == "/api/orders"]
        assert [{k: r[k] for k in kept} for r in old] == [{k: r[k] for k in kept} for r in placing]
        assert {r["buyer_id"] for r in old} == {api.ids["buyer"]}

        await migrate.upgrade(deps.db)
        assert await migration_kit.schema_differences(deps.db) == []
        assert await _keys(deps.db) == [
            {**r, "effect_id": None, "locked_until": None} for r in placing
        ]
        assert {r["principal"] for r in placing} == {f"user:{api.ids['buyer']}"}

        # Placing's keys answer as before the migration.
        again = await _place(api, goods[0], "old-1")
        assert (again.status_code, again.content) == (201, first.content)
        view = await _place(api, goods[1], "old-2")
        assert view.status_code == 201, view.text
        now = await api.call("GET", f"/api/orders/{second.json()['id']}", "buyer")
        assert view.json() == now.json()
        fails(await _place(api, goods[2], "old-1"), 409, "idempotency_key_reused")
        async with deps.db.read() as conn:
            orders = await conn.scalar(select(func.count()).select_from(schema.orders))
        assert orders == 2
