"""``dueflow demo --flow shop`` in fast time, and the demo's own checks.

The whole demo runs through the CLI on a SQLite file and must exit 0 with every promise it prints
holding, and the file it leaves must say the same (read with plain SQL). A demo on a database
where one order's amount was tampered with must exit 1 and name that order. Each of the demo's
own checks (in process from the database, over HTTP from the API's views) is shown to find the
broken promise it names, on real orders of a FakeClock world, and to pass once it is repaired.
"""

from __future__ import annotations

import asyncio
import sqlite3
from decimal import Decimal
from pathlib import Path

from sqlalchemy import delete, update
from typer.testing import CliRunner

from dueflow import bootstrap, cli
from dueflow.clock import FakeClock
from dueflow.config import load_settings
from dueflow.demo import shop_checks as demo_shop_checks
from dueflow.demo.shop_crowd import Shop
from dueflow.service import accounts, orders, payments, shop
from dueflow.store.schema import orders as t_orders
from dueflow.store.schema import refunds
from tests.conftest import START

#: The demo's own promises, each printed with PASS at the end of a good run.
OWN = (
    demo_shop_checks.AMOUNTS,
    demo_shop_checks.REFUNDED,
    demo_shop_checks.STOCKED,
    demo_shop_checks.NOTIFIED,
    demo_shop_checks.REPEATS,
)
#: Some of the engine's (service/report.py), printed beside them.
ENGINE = (
    "SKU stock + held + sold = stocked",
    "flash sale units held only by unpaid orders",
    "no coupon used twice",
    "every cancelled order notified once",
)


def _demo(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli.app, ["demo", "--flow", "shop", "--no-live", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def _rows(db: Path, sql: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def test_the_shop_demo_keeps_every_promise(tmp_path: Path):
    db = tmp_path / "shop.db"
    code, out = _demo("--orders", "10", "--speed", "20", "--db", str(db))
    assert code == 0, out
    assert "dueflow demo --flow shop: 10 buyers, 5 SKUs, 3 coupon templates" in out
    flat = " ".join(out.split())  # rich wraps long lines
    for promise in (*OWN, *ENGINE):
        assert promise in flat, promise
    assert "FAIL" not in out and "all invariants hold" in out
    # The wrong turns are always taken: another buyer's coupon, SKUs of two sellers.
    assert "(not_allowed)" in flat and "(invalid_input)" in flat
    # What the file says after: every unit back or sold, nothing held, the restock counted ...
    assert _rows(
        db, "select count(*) from skus where stock + held + sold != stocked or held != 0"
    ) == [(0,)]
    assert _rows(
        db, "select count(*) from flash_sales where stock + held + sold != stocked or held != 0"
    ) == [(0,)]
    assert _rows(db, "select stocked from skus where title = 'poster'") == [(6,)]
    # ... no coupon left locked, every order final and placed once under its key ...
    assert _rows(db, "select count(*) from coupons where state = 'locked'") == [(0,)]
    statuses = dict(_rows(db, "select status, count(*) from orders group by status"))
    assert set(statuses) <= {"completed", "cancelled_unpaid", "cancelled_unshipped"}, statuses
    assert _rows(db, "select count(*) from orders") == _rows(
        db, "select count(distinct order_id) from idempotency_keys"
    )
    assert _rows(db, "select count(*) from orders where order_type = 'shop'")[0][0] > 0
    # ... and every cancelled order told once.
    told = _rows(
        db,
        "select o.id, r.state, r.deliveries from orders o left join reminders r "
        "on r.order_id = o.id and r.kind = 'order_closed' where o.status like 'cancelled%'",
    )
    assert told and all(state == "sent" and deliveries == 1 for _, state, deliveries in told)


def test_a_broken_promise_fails_the_demo(tmp_path: Path):
    """An order whose amount is not its lines (written behind dueflow's back) is named and
    the demo exits 1."""
    db = tmp_path / "broken.db"

    async def tampered() -> int:
        settings = load_settings(database_url=f"sqlite:///{db}", profile="dev")
        async with bootstrap.running(settings, clock=FakeClock(START)) as deps:
            seller, _ = await accounts.add_user(deps, "old-seller")
            buyer, _ = await accounts.add_user(deps, "old-buyer")
            sku = await shop.create_sku(
                deps, seller_id=seller.id, title="lamp", price="30.00", stock=2
            )
            order = await shop.place_shop_order(
                deps, buyer_id=buyer.id, lines=[{"sku_id": sku["id"], "quantity": 1}]
            )
            async with deps.db.write() as conn:
                where = t_orders.c.id == order["id"]
                await conn.execute(update(t_orders).where(where).values(amount=Decimal("0.50")))
            return int(order["id"])

    order_id = asyncio.run(tampered())
    code, out = _demo("--orders", "3", "--speed", "60", "--db", str(db))
    assert code == 1, out
    (row,) = [line for line in out.splitlines() if demo_shop_checks.AMOUNTS in line]
    assert f"FAIL [{order_id}]" in row
    assert "invariants broken" in out


async def _promises(world, **known):
    stocked = known.get("stocked", {})
    return await demo_shop_checks.promises(
        world.deps, stocked=stocked, flash_stocked=known.get("flash", {}), over=True
    )


async def test_each_check_finds_what_it_names(world):
    sku = await world.sku(stock=10, price="25.00")
    coupon = await world.coupon(off="5.00", minimum="20.00")
    placed = await world.shop_order({sku: 2}, coupon=coupon)
    assert str(placed["amount"]) == "45.00"
    found = await _promises(world, stocked={sku: 10})
    assert all(not offenders for offenders in found.values()), found

    # An amount that is not the lines less the coupon.
    async with world.deps.db.write() as conn:
        where = t_orders.c.id == placed["id"]
        await conn.execute(update(t_orders).where(where).values(amount=Decimal("50.00")))
    assert (await _promises(world, stocked={sku: 10}))[demo_shop_checks.AMOUNTS] == [placed["id"]]
    async with world.deps.db.write() as conn:
        await conn.execute(update(t_orders).where(where).values(amount=Decimal("45.00")))

    # Units put on sale behind the demo's back.
    await shop.restock(world.deps, sku_id=sku, user_id=world.seller, quantity=3)
    assert (await _promises(world, stocked={sku: 10}))[demo_shop_checks.STOCKED] == [sku]
    assert (await _promises(world, stocked={sku: 13}))[demo_shop_checks.STOCKED] == []

    # A cancel whose notice was not sent yet, then sent once.
    await orders.cancel_by_buyer(world.deps, order_id=placed["id"], user_id=world.buyer)
    assert (await _promises(world))[demo_shop_checks.NOTIFIED] == [placed["id"]]
    await world.worker.drain()
    assert (await _promises(world))[demo_shop_checks.NOTIFIED] == []
    assert len(world.notifier.sent) == 1


async def test_a_paid_then_cancelled_order_needs_its_refund(world):
    sku = await world.sku(stock=3)
    placed = await world.shop_order({sku: 1})
    await payments.record_manual_payment(world.deps, order_id=placed["id"], amount="25.00")
    await orders.cancel_by_seller(world.deps, order_id=placed["id"], user_id=world.seller)
    await world.worker.drain()
    assert (await _promises(world))[demo_shop_checks.REFUNDED] == []
    async with world.deps.db.write() as conn:
        await conn.execute(delete(refunds))
    assert (await _promises(world))[demo_shop_checks.REFUNDED] == [placed["id"]]


async def test_the_http_checks_read_the_same_from_views(world):
    """:func:`demo_shop_checks.from_views` on the views the API answers, then on the same views
    with one thing wrong at a time."""
    sku = await world.sku(stock=10, price="25.00")
    sale = await world.flash_sale(sku, stock=4, price="9.90", limit=2)
    coupon = await world.coupon(off="5.00", minimum="20.00")
    paid = await world.shop_order({sku: 2}, coupon=coupon)
    await payments.record_manual_payment(world.deps, order_id=paid["id"], amount="45.00")
    dropped = await world.shop_order({sku: 1})
    await orders.cancel_by_buyer(world.deps, order_id=dropped["id"], user_id=world.buyer)
    await world.worker.drain()
    the_shop = Shop({"mug": (sku, Decimal("25.00"))}, sale, 0, START, {sku: 10}, 4)

    async def read() -> tuple[dict, dict, list]:
        views = {
            oid: await orders.order_view(world.deps, oid) for oid in (paid["id"], dropped["id"])
        }
        units = {
            "sku": {sku: await shop.sku_view(world.deps, sku)},
            "flash": {sale: await shop.flash_sale_view(world.deps, sale)},
        }
        return views, units, await shop.coupons_of(world.deps, world.buyer)

    views, units, coupons = await read()
    found = demo_shop_checks.from_views(the_shop, views, units, coupons, [True])
    assert all(not offenders for offenders in found.values()), found

    wrong = {**views, paid["id"]: {**views[paid["id"]], "amount": Decimal("50.00")}}
    assert demo_shop_checks.from_views(the_shop, wrong, units, coupons, [])[
        demo_shop_checks.AMOUNTS
    ] == [paid["id"]]
    locked = [{**c, "state": "locked"} for c in coupons]
    assert demo_shop_checks.from_views(the_shop, views, units, locked, [])[
        demo_shop_checks.COUPONS
    ] == [coupon]
    silent = {**views, dropped["id"]: {**views[dropped["id"]], "notices": []}}
    assert demo_shop_checks.from_views(the_shop, silent, units, coupons, [])[
        demo_shop_checks.NOTIFIED
    ] == [dropped["id"]]
    short = {**the_shop.stocked, sku: 9}
    moved = Shop(the_shop.skus, sale, 0, START, short, 4)
    assert demo_shop_checks.from_views(moved, views, units, coupons, [])[
        demo_shop_checks.STOCKED
    ] == [sku]
    assert demo_shop_checks.from_views(the_shop, views, units, coupons, [True, False])[
        demo_shop_checks.REPEATS
    ] == [1]
    # A paid order's units that the SKU does not count as sold.
    held = {**units, "sku": {sku: {**units["sku"][sku], "sold": 0}}}
    assert demo_shop_checks.from_views(the_shop, views, held, coupons, [])[
        demo_shop_checks.SOLD
    ] == [sku]
