"""Migration 0010 (the shop) over a database at 0009, on SQLite, PostgreSQL and MariaDB.

At revision 0009 marketplace orders in every status and tickets orders in every status (with
their goods, seats, tickets, payments, refunds, discrepancies, reviews, timers, reminders and
timelines) are written through the services; upgrading to 0010 must leave every row of every
table as it was and add the shop's tables, empty, with their CHECKs enforced by the database
itself (a negative count, units that do not add up, a coupon locked to no order, more coupons
issued than the template allows: each refused). The schema then equals ``metadata`` (Alembic's
``compare_metadata``); the downgrade to 0009 gives back exactly the 0009 database; and once up
again, shop orders are placed, cancelled by the buyer and by the pay deadline, and paid over
it, while the old orders go on (their pay deadlines pass, their buyers are told).
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import delete, insert, inspect, select, update
from sqlalchemy.exc import DBAPIError

from dueflow.clock import FakeClock
from dueflow.domain import seating
from dueflow.service import accounts, orders, payments, report, shop, tickets
from dueflow.service.deps import Deps
from dueflow.store import migrate, schema
from dueflow.store.db import Database
from dueflow.worker.runner import Worker
from tests.conftest import START, RecordingNotifier
from tests.contract import migration_kit

SHOP_TABLES = {
    "skus",
    "flash_sales",
    "flash_buyers",
    "coupon_templates",
    "coupons",
    "idempotency_keys",
}
PRICES = {"A": Decimal("380.00"), "B": Decimal("180.00")}
#: What each order is once seeded at 0009, by its name in :func:`_seed_0009`.
SEEDED = {
    "timed_out": ("marketplace", "cancelled_unpaid", "pay_timeout"),
    "unpaid": ("marketplace", "pending_payment", None),
    "buyer_cancelled": ("marketplace", "cancelled_unpaid", "buyer_cancel"),
    "paid": ("marketplace", "pending_shipment", None),
    "shipped": ("marketplace", "shipped", None),
    "received": ("marketplace", "received", None),
    "completed": ("marketplace", "completed", None),
    "seller_cancelled": ("marketplace", "cancelled_unshipped", "seller_cancel"),
    "seats_unpaid": ("tickets", "pending_payment", None),
    "seats_paid": ("tickets", "paid", None),
    "seats_cancelled": ("tickets", "cancelled_unpaid", "buyer_cancel"),
    "show_cancelled_paid": ("tickets", "cancelled_paid", "show_cancel"),
    "show_cancelled_unpaid": ("tickets", "cancelled_unpaid", "show_cancel"),
}


async def _seed_0009(deps: Deps, clock: FakeClock) -> dict[str, int]:
    """Users, goods, two shows and an order in every status of both flows at 0009, written by
    the services (which touch only tables 0009 has); returns order name -> id, and the users
    as ``seller`` and ``buyer``."""
    seller = (await accounts.add_user(deps, "seller"))[0].id
    buyer = (await accounts.add_user(deps, "buyer"))[0].id
    worker = Worker(deps)
    ids: dict[str, int] = {}

    async def goods_order(name: str) -> int:
        goods = await accounts.add_goods(deps, seller_id=seller, title=name, price="20.50")
        ids[name] = await orders.place_order(deps, buyer_id=buyer, goods_id=goods)
        return ids[name]

    await goods_order("timed_out")
    clock.advance(timedelta(minutes=31))
    await worker.drain()  # its pay deadline passed: cancelled, the buyer told
    for name in ("unpaid", "buyer_cancelled", "paid", "shipped", "received", "completed"):
        await goods_order(name)
    await goods_order("seller_cancelled")
    await orders.cancel_by_buyer(deps, order_id=ids["buyer_cancelled"], user_id=buyer)
    # paid after the cancel: a discrepancy and a refund in review
    await payments.record_manual_payment(deps, order_id=ids["buyer_cancelled"], amount="20.50")
    for name in ("paid", "shipped", "received", "completed", "seller_cancelled"):
        await payments.record_manual_payment(deps, order_id=ids[name], amount="20.50")
    for name in ("shipped", "received", "completed"):
        await orders.ship(deps, order_id=ids[name], user_id=seller, carrier="SF", tracking_no="1")
    for name in ("received", "completed"):
        await orders.confirm_receipt(deps, order_id=ids[name], user_id=buyer)
    await orders.review(deps, order_id=ids["completed"], user_id=buyer, rating=4)
    await orders.review(deps, order_id=ids["completed"], user_id=seller, rating=5)
    await orders.cancel_by_seller(deps, order_id=ids["seller_cancelled"], user_id=seller)

    async def show() -> int:
        return await tickets.create_show(
            deps,
            organizer_id=seller,
            title="Winter concert",
            venue="Hall 1",
            starts_at=clock.now() + timedelta(days=30),
            sales_close_at=clock.now() + timedelta(days=29),
            seat_limit=4,
            seats=seating.parse_ranges("A:1-4,B:1-4", PRICES),
        )

    async def seats(name: str, show_id: int, labels: list[str]) -> None:
        placed = await tickets.place_ticket_order(
            deps, buyer_id=buyer, show_id=show_id, labels=labels, view=False
        )
        ids[name] = int(placed["id"])

    first, second = await show(), await show()
    await seats("seats_unpaid", first, ["A-1"])
    await seats("seats_paid", first, ["A-2", "B-1"])
    await seats("seats_cancelled", first, ["B-2"])
    await seats("show_cancelled_paid", second, ["A-1"])
    await seats("show_cancelled_unpaid", second, ["B-1"])
    await payments.record_manual_payment(deps, order_id=ids["seats_paid"], amount="560.00")
    await payments.record_manual_payment(deps, order_id=ids["show_cancelled_paid"], amount="380")
    await orders.cancel_by_buyer(deps, order_id=ids["seats_cancelled"], user_id=buyer)
    await tickets.cancel_show(deps, show_id=second, user_id=seller)
    await worker.drain()  # the show's cancels and every order_closed notice
    return ids | {"seller": seller, "buyer": buyer}


async def _every_row(db: Database, names: set[str]) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of these tables of ``metadata``, in key order, in the columns the database has
    at its revision (a later migration's columns are not there below it)."""
    found = {}
    async with db.read() as conn:
        for name in sorted(names):
            table = schema.metadata.tables[name]
            present = await conn.run_sync(
                lambda sync, n=name: {c["name"] for c in inspect(sync).get_columns(n)}
            )
            query = select(*(c for c in table.columns if c.name in present))
            query = query.order_by(*table.primary_key)
            found[name] = [tuple(r) for r in (await conn.execute(query)).all()]
    return found


async def test_0010_keeps_every_order_and_adds_the_shop(empty_url: str) -> None:
    clock, notifier = FakeClock(START), RecordingNotifier()
    db = Database.from_url(empty_url)
    try:
        await migrate.upgrade(db)
    finally:
        await db.dispose()
    async with migration_kit.running(empty_url, clock, notifier) as deps:
        # Seeded by today's services, then taken down to 0009: the services know only the
        # newest schema, and the orders and tables of 0009 are what 0010 must keep.
        ids = await _seed_0009(deps, clock)
        await migration_kit.downgrade(deps.db, "0009")
        assert await migrate.revisions(deps.db) == {"0009"}
        old_tables = await migrate.current_tables(deps.db) - {"alembic_version"}
        assert not SHOP_TABLES & old_tables
        # Orders cancelled by 0009's code had no order_closed notice: make two such.
        earlier = [ids["timed_out"], ids["seats_cancelled"]]
        async with deps.db.write() as conn:
            for table in (schema.timers, schema.reminders):
                await conn.execute(
                    delete(table).where(
                        table.c.order_id.in_(earlier), table.c.kind == "order_closed"
                    )
                )
        before = await _every_row(deps.db, old_tables)
        o = schema.orders.c
        async with deps.db.read() as conn:
            query = select(o.id, o.flow, o.status, o.cancel_reason)
            found = {r.id: tuple(r[1:]) for r in (await conn.execute(query)).all()}
        assert {name: found[ids[name]] for name in SEEDED} == SEEDED
        told = {r.order_id: r.reason for r in notifier.sent if r.kind == "order_closed"}
        assert told == {ids[n]: why for n, (_, status, why) in SEEDED.items() if why is not None}

        await migrate.upgrade(deps.db, "0010")
        assert await migrate.revisions(deps.db) == {"0010"}
        tables = await migrate.current_tables(deps.db) - {"alembic_version"}
        assert tables == old_tables | SHOP_TABLES
        after = await _every_row(deps.db, old_tables)
        assert {k: v for k, v in after.items() if k != "timers"} == {
            k: v for k, v in before.items() if k != "timers"
        }  # nothing changed but: the earlier cancels got a notice timer, done, saying so
        assert after["timers"][: len(before["timers"])] == before["timers"]
        t = schema.timers.c
        async with deps.db.read() as conn:
            added = (
                await conn.execute(
                    select(t.order_id, t.kind, t.state, t.outcome)
                    .where(t.id > max(row[0] for row in before["timers"]))
                    .order_by(t.order_id)
                )
            ).all()
        assert [tuple(r) for r in added] == [
            (
                oid,
                "order_closed",
                "done",
                "not sent: cancelled before dueflow sent order_closed notices",
            )
            for oid in sorted(earlier)
        ]
        await migrate.upgrade(deps.db)  # the newest schema, which today's services read
        assert (await report.check_invariants(deps, tolerance_seconds=0)).ok
        assert await _every_row(deps.db, SHOP_TABLES) == {name: [] for name in SHOP_TABLES}
        assert await migration_kit.schema_differences(deps.db) == []
        await _checks_refuse(deps, user_id=ids["buyer"], order_id=ids["unpaid"])

        await migration_kit.downgrade(deps.db, "0009")
        assert await migrate.revisions(deps.db) == {"0009"}
        assert await migrate.current_tables(deps.db) - {"alembic_version"} == old_tables
        assert await _every_row(deps.db, old_tables) == after
        await migrate.upgrade(deps.db)

        await migrate.upgrade(deps.db)
        assert await migration_kit.schema_differences(deps.db) == []
        await _shop_works(deps, clock, notifier, ids)

        # With shop data in it, the downgrade still runs: the shop's tables go (the orders
        # of the shop flow stay, for an operator).
        await migration_kit.downgrade(deps.db, "0009")
        assert not SHOP_TABLES & await migrate.current_tables(deps.db)


def _valid_rows(user_id: int) -> dict[str, dict[str, Any]]:
    """A valid row of each shop table (the flash sale of SKU 1, the coupon of template 1, the
    count of flash sale 1), by table name."""
    at = START
    units = {"stock": 1, "held": 0, "sold": 0, "stocked": 1, "created_at": at, "updated_at": at}
    return {
        "skus": {"seller_id": user_id, "title": "mug", "price": Decimal("1.00"), **units},
        "flash_sales": {
            "sku_id": 1,
            "seller_id": user_id,
            "price": Decimal("0.50"),
            "starts_at": at,
            "ends_at": at + timedelta(hours=1),
            "per_buyer_limit": 1,
            **units,
        },
        "coupon_templates": {
            "seller_id": user_id,
            "title": "5 off",
            "amount_off": Decimal("5.00"),
            "min_amount": Decimal("0.00"),
            "valid_from": at,
            "valid_until": at + timedelta(days=1),
            "total": 2,
            "issued": 0,
            "created_at": at,
        },
        "coupons": {
            "template_id": 1,
            "user_id": user_id,
            "state": "available",
            "valid_until": at + timedelta(days=1),
            "issued_at": at,
            "updated_at": at,
        },
        "flash_buyers": {"flash_sale_id": 1, "buyer_id": user_id, "units": 0},
    }


BELOW_ZERO = {"stock": -1, "held": 1, "stocked": 0}  # adds up, but a count is negative
#: (table, what breaks the valid row, the CHECK the database names when it refuses it)
BROKEN = [
    ("skus", BELOW_ZERO, "ck_skus_counts_not_negative"),
    ("skus", {"stocked": 2}, "ck_skus_units_balance"),
    ("flash_sales", BELOW_ZERO, "ck_flash_sales_counts_not_negative"),
    ("flash_sales", {"sold": 1}, "ck_flash_sales_units_balance"),
    ("flash_buyers", {"units": -1}, "ck_flash_buyers_units_not_negative"),
    ("coupon_templates", {"issued": 3}, "ck_coupon_templates_issued_within_total"),
    ("coupon_templates", {"issued": -1}, "ck_coupon_templates_issued_within_total"),
    ("coupons", {"state": "locked"}, "ck_coupons_order_when_taken"),
    ("coupons", {"state": "used"}, "ck_coupons_order_when_taken"),
]


async def _checks_refuse(deps: Deps, *, user_id: int, order_id: int) -> None:
    """Each CHECK refuses the row that breaks it (and an unguarded update below zero), in the
    database itself; the valid rows pass. Leaves the shop's tables empty."""
    valid = _valid_rows(user_id)
    engine = deps.db.engine
    async with engine.begin() as conn:  # what the others refer to: ids 1
        for name in ("skus", "flash_sales", "coupon_templates"):
            await conn.execute(insert(schema.metadata.tables[name]).values(**valid[name]))
    broken = [*BROKEN, ("coupons", {"order_id": order_id}, "ck_coupons_order_when_taken")]
    for name, changes, constraint in broken:
        with pytest.raises(DBAPIError) as refused:
            async with engine.begin() as conn:
                table = schema.metadata.tables[name]
                await conn.execute(insert(table).values(**(valid[name] | changes)))
        assert constraint in str(refused.value.orig), (name, changes, refused.value.orig)
    c = schema.skus.c
    with pytest.raises(DBAPIError) as refused:
        async with engine.begin() as conn:
            await conn.execute(
                update(schema.skus).values(stock=c.stock - 2, held=c.held + 2).where(c.id == 1)
            )
    assert "ck_skus_counts_not_negative" in str(refused.value.orig)
    async with engine.begin() as conn:
        for name in ("coupons", "flash_buyers"):  # valid too
            await conn.execute(insert(schema.metadata.tables[name]).values(**valid[name]))
        for name in ("coupons", "flash_buyers", "flash_sales", "skus", "coupon_templates"):
            await conn.execute(schema.metadata.tables[name].delete())


async def _shop_works(
    deps: Deps, clock: FakeClock, notifier: RecordingNotifier, ids: dict[str, int]
) -> None:
    """Over the migrated database: a shop order with a coupon placed and cancelled by the
    buyer, a flash order closed by its pay deadline, one paid; the old unpaid orders' deadlines
    pass too; every cancelled order's buyer told once."""
    clock.advance(timedelta(days=1))
    seller, buyer = ids["seller"], ids["buyer"]
    worker = Worker(deps)
    sku = await shop.create_sku(deps, seller_id=seller, title="mug", price="25.00", stock=3)
    tpl = await shop.create_template(
        deps,
        seller_id=seller,
        title="5 off",
        amount_off="5.00",
        min_amount="20.00",
        valid_from=clock.now(),
        valid_until=clock.now() + timedelta(days=1),
        total=2,
    )
    coupon = await shop.issue_coupon(deps, template_id=tpl["id"], issuer_id=seller, user_id=buyer)
    sale = await shop.create_flash_sale(
        deps,
        seller_id=seller,
        sku_id=sku["id"],
        price="9.90",
        stock=2,
        starts_at=clock.now(),
        ends_at=clock.now() + timedelta(hours=1),
        per_buyer_limit=1,
    )
    lines = [{"sku_id": sku["id"], "quantity": 2}]
    placed = await shop.place_shop_order(deps, buyer_id=buyer, lines=lines, coupon_id=coupon["id"])
    assert (placed["amount"], placed["order_type"]) == (Decimal("45.00"), "shop")
    await orders.cancel_by_buyer(deps, order_id=placed["id"], user_id=buyer)
    flash = await shop.place_flash_order(deps, buyer_id=buyer, flash_sale_id=sale["id"], quantity=1)
    clock.advance(timedelta(minutes=5))
    await worker.drain()
    again = await shop.place_shop_order(deps, buyer_id=buyer, lines=lines, coupon_id=coupon["id"])
    await payments.record_manual_payment(deps, order_id=again["id"], amount="45.00")
    await worker.drain()
    views = {i: await orders.order_view(deps, i) for i in (placed["id"], flash["id"])}
    assert [(v["status"], v["cancel_reason"]) for v in views.values()] == [
        ("cancelled_unpaid", "buyer_cancel"),
        ("cancelled_unpaid", "pay_timeout"),
    ]
    assert (await orders.order_view(deps, again["id"]))["status"] == "pending_shipment"
    got = await shop.sku_view(deps, sku["id"])
    assert (got["stock"], got["held"], got["sold"], got["stocked"]) == (1, 0, 2, 3)
    got = await shop.flash_sale_view(deps, sale["id"])
    assert (got["stock"], got["held"], got["sold"], got["stocked"]) == (2, 0, 0, 2)
    (mine,) = await shop.coupons_of(deps, buyer)
    assert (mine["state"], mine["order_id"]) == ("used", again["id"])
    async with deps.db.read() as conn:
        counted = (await conn.execute(select(schema.flash_buyers.c.units))).scalars().all()
    assert counted == [0]
    old = {name: await orders.order_view(deps, ids[name]) for name in ("unpaid", "seats_unpaid")}
    assert {n: (v["status"], v["cancel_reason"]) for n, v in old.items()} == {
        "unpaid": ("cancelled_unpaid", "pay_timeout"),
        "seats_unpaid": ("cancelled_unpaid", "pay_timeout"),
    }
    closed = [r.order_id for r in notifier.sent if r.kind == "order_closed"]
    assert len(closed) == len(set(closed))
    assert {placed["id"], flash["id"], ids["unpaid"], ids["seats_unpaid"]} <= set(closed)
