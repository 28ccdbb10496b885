"""Migration 0009 over orders written by 0008, on SQLite, PostgreSQL and MariaDB.

From revision 0008, marketplace orders in every status are written with SQL as that schema has
them (``orders.profile``, ``goods_id`` required); upgrading to 0009 must keep every one working:
``flow`` is ``marketplace``, ``goods_id`` stays, each order gets its goods line (the title, the
order's amount); an unpaid one can then be cancelled and another paid through the services over
that database; the schema equals ``metadata``; and without tickets orders the downgrade to 0008
gives back the old columns with every order in them.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import Column, MetaData, Table, insert, select, text

from dueflow import bootstrap
from dueflow.clock import FakeClock
from dueflow.config import load_settings
from dueflow.service import orders, payments
from dueflow.service.payments import PaymentOutcome
from dueflow.store import migrate, schema
from dueflow.store.db import Database
from tests.conftest import START
from tests.contract import migration_kit

#: Every status a marketplace order could be in at 0008, with when it got there.
STATUSES = [
    "pending_payment",
    "pending_payment",
    "pending_shipment",
    "shipped",
    "received",
    "completed",
    "cancelled_unpaid",
    "cancelled_unshipped",
]

#: ``orders`` as revision 0008 has it: ``profile`` for the flow, no ``show_id``.
_OLD = MetaData()
orders_0008 = Table(
    "orders",
    _OLD,
    *[
        Column("profile" if c.name == "flow" else c.name, c.type, primary_key=c.primary_key)
        for c in schema.orders.columns
        if c.name != "show_id"
    ],
)


async def _seed_0008(db: Database) -> dict[int, dict[str, Any]]:
    """Two users, one goods item per order, and an order in each status, as 0008 writes them;
    returns order id -> what was written."""
    at = START
    written: dict[int, dict[str, Any]] = {}
    async with db.engine.begin() as conn:
        for user_id, name in ((1, "seller"), (2, "buyer")):
            await conn.execute(
                insert(schema.users).values(
                    id=user_id, name=name, token_hash=f"h{user_id}", is_admin=False, created_at=at
                )
            )
        for order_id, status in enumerate(STATUSES, start=1):
            price = Decimal(f"{order_id}0.50")
            pending = status == "pending_payment"
            sold = status in ("pending_shipment", "shipped", "received", "completed")
            await conn.execute(
                insert(schema.goods).values(
                    id=order_id,
                    seller_id=1,
                    title=f"camera {order_id}",
                    price=price,
                    status="sold" if sold else "off_sale" if "unshipped" in status else "on_sale",
                    reserved_order_id=order_id if pending or sold else None,
                    created_at=at,
                    updated_at=at,
                )
            )
            row = {
                "id": order_id,
                "profile": "marketplace",
                "order_type": "normal",
                "buyer_id": 2,
                "seller_id": 1,
                "goods_id": order_id,
                "amount": price,
                "status": status,
                "created_at": at,
                "pay_deadline": at + timedelta(minutes=30),
                "paid_at": at if sold or "unshipped" in status else None,
                "cancel_reason": {"cancelled_unpaid": "pay_timeout"}.get(status),
                "updated_at": at,
            }
            await conn.execute(insert(orders_0008).values(**row))
            written[order_id] = row
    return written


async def test_0009_keeps_every_marketplace_order_working(empty_url):
    db = Database.from_url(empty_url)
    try:
        await migrate.upgrade(db, "0008")
        assert await migrate.revisions(db) == {"0008"}
        written = await _seed_0008(db)
        await migrate.upgrade(db)
        assert await migrate.revisions(db) == {migrate.HEAD}
        async with db.read() as conn:
            moved = (await conn.execute(select(schema.orders).order_by(schema.orders.c.id))).all()
            lines = (
                await conn.execute(select(schema.order_lines).order_by(schema.order_lines.c.id))
            ).all()
        assert [(o.id, o.flow, o.goods_id, o.show_id, o.status) for o in moved] == [
            (i, "marketplace", i, None, w["status"]) for i, w in written.items()
        ]
        assert [(x.order_id, x.kind, x.item_id, x.label, x.quantity, x.price) for x in lines] == [
            (i, "goods", i, f"camera {i}", 1, w["amount"]) for i, w in written.items()
        ]
        assert await migration_kit.schema_differences(db) == []
    finally:
        await db.dispose()
    await _orders_still_work(empty_url)
    db = Database.from_url(empty_url)
    try:
        await migration_kit.downgrade(db, "0008")
        assert await migrate.revisions(db) == {"0008"}
        columns = await migration_kit.columns(db, "orders")
        assert "profile" in columns and not {"flow", "show_id"} & columns
        assert not {"order_lines", "shows", "seats", "seat_holds", "tickets"} & set(
            await migrate.current_tables(db)
        )
        async with db.read() as conn:
            back = (await conn.execute(text("SELECT id, profile FROM orders ORDER BY id"))).all()
        assert [tuple(r) for r in back] == [(i, "marketplace") for i in written]
        await migrate.upgrade(db)  # and up again: each order gets its one line again
        async with db.read() as conn:
            count = await conn.scalar(text("SELECT COUNT(*) FROM order_lines"))
        assert count == len(written)
        assert await migration_kit.schema_differences(db) == []
    finally:
        await db.dispose()


async def _orders_still_work(url: str) -> None:
    """Over the migrated database: cancel one unpaid order, pay the other, read every view."""
    settings = load_settings(database_url=url, profile="prod")
    clock = FakeClock(START + timedelta(minutes=1))
    async with bootstrap.running(settings, clock=clock, migrate_sqlite=False) as deps:
        await orders.cancel_by_buyer(deps, order_id=1, user_id=2)
        _, outcome = await payments.record_manual_payment(deps, order_id=2, amount="20.50")
        assert outcome is PaymentOutcome.CONFIRMED
        cancelled, paid = await orders.order_view(deps, 1), await orders.order_view(deps, 2)
        assert (cancelled["status"], cancelled["cancel_reason"]) == (
            "cancelled_unpaid",
            "buyer_cancel",
        )
        assert paid["status"] == "pending_shipment"
        assert paid["ship_deadline"] == clock.now() + timedelta(days=3)
        assert [t["kind"] for t in paid["timers"] if t["state"] == "scheduled"] == [
            "cancel_unshipped"
        ]
        for order_id in range(1, len(STATUSES) + 1):
            view = await orders.order_view(deps, order_id)
            assert view["flow"] == "marketplace"
            assert [line["label"] for line in view["lines"]] == [f"camera {order_id}"]
        async with deps.db.read() as conn:
            goods = {
                r.id: (r.status, r.reserved_order_id)
                for r in (await conn.execute(select(schema.goods))).all()
            }
        assert goods[1] == ("on_sale", None)  # back on sale
        assert goods[2] == ("sold", 2)
