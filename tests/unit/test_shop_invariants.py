"""The shop's invariants in :func:`report.check_invariants`: they hold over a whole shop life
(paid, shipped, received, cancelled every way, expired, a flash sale, coupons) and each one
reports its offenders when it is broken behind the engine's back, by a direct SQL write."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import timedelta
from decimal import Decimal

import pytest
from sqlalchemy import delete, insert, select, text, update

from dueflow.service import orders, payments, report, shop
from dueflow.service.report import Invariants
from dueflow.store.schema import (
    coupons,
    flash_buyers,
    flash_sales,
    order_lines,
    reminders,
    skus,
    timers,
)
from dueflow.store.schema import orders as t_orders

SHOP_PAY = timedelta(minutes=15)


@dataclass
class Shop:
    """A shop after a life: what is still live, and the ids of what it was built from."""

    sku: int
    other_sku: int
    sale: int
    coupon: int
    spare_coupon: int
    pending: int  # a shop order awaiting payment, holding 2 sku units and ``coupon``
    pending_flash: int  # a flash order awaiting payment, holding 1 unit of the sale
    paid: int  # a paid shop order (units sold, its coupon used)
    cancelled: int  # cancelled by the buyer before paying


async def pay(world, view) -> None:
    await payments.record_manual_payment(world.deps, order_id=view["id"], amount=view["amount"])


async def check(world) -> Invariants:
    return await report.check_invariants(world.deps, tolerance_seconds=0)


def broken(found: Invariants) -> dict[str, list[int]]:
    """The invariants that do not hold, with their offenders."""
    return {f.name: getattr(found, f.name) for f in fields(found) if getattr(found, f.name)}


@pytest.fixture
async def life(world) -> Shop:
    return await live_shop(world)


async def live_shop(world) -> Shop:
    """Every way through the shop's life, the worker drained (notices sent) after each step."""
    deps = world.deps
    sku = await world.sku(stock=20, price="25.00", title="mug")
    other_sku = await world.sku(stock=5, price="8.00", title="spoon")
    sale = await world.flash_sale(other_sku, stock=3, price="1.00", limit=2)
    # Completed: paid with a coupon, shipped, received.
    done = await world.shop_order({sku: 1, other_sku: 1}, coupon=await world.coupon())
    await pay(world, done)
    await orders.ship(
        deps, order_id=done["id"], user_id=world.seller, carrier="SF", tracking_no="SF1"
    )
    await orders.confirm_receipt(deps, order_id=done["id"], user_id=world.buyer)
    # Paid and then not shipped: cancelled by the seller, a refund in review.
    unshipped = await world.shop_order({sku: 2}, coupon=await world.coupon())
    await pay(world, unshipped)
    await orders.cancel_by_seller(deps, order_id=unshipped["id"], user_id=world.seller)
    # Cancelled by the buyer with a coupon: units and coupon back.
    cancelled = await world.shop_order({sku: 3}, coupon=await world.coupon())
    await orders.cancel_by_buyer(deps, order_id=cancelled["id"], user_id=world.buyer)
    # Never paid: a shop order and a flash order expire.
    await world.shop_order({sku: 1, other_sku: 2}, buyer=world.other)
    await shop.place_flash_order(deps, buyer_id=world.other, flash_sale_id=sale, quantity=2)
    world.clock.advance(SHOP_PAY + timedelta(seconds=1))
    await world.worker.drain()
    # Paid at the flash sale; and still live: a shop order and a flash order.
    flash_paid = await shop.place_flash_order(
        deps, buyer_id=world.other, flash_sale_id=sale, quantity=1
    )
    await pay(world, flash_paid)
    paid = await world.shop_order({other_sku: 1})
    await pay(world, paid)
    coupon = await world.coupon()
    pending = await world.shop_order({sku: 2}, coupon=coupon)
    pending_flash = await shop.place_flash_order(
        deps, buyer_id=world.buyer, flash_sale_id=sale, quantity=1
    )
    await world.worker.drain()
    return Shop(
        sku=sku,
        other_sku=other_sku,
        sale=sale,
        coupon=coupon,
        spare_coupon=await world.coupon(),
        pending=pending["id"],
        pending_flash=pending_flash["id"],
        paid=paid["id"],
        cancelled=cancelled["id"],
    )


async def write(world, *statements, unchecked: bool = False) -> None:
    """Run statements in one transaction; ``unchecked``: with SQLite's CHECK constraints off
    (the counts' checks are the last line the invariants stand behind)."""
    async with world.deps.db.write() as conn:
        if unchecked:
            await conn.exec_driver_sql("PRAGMA ignore_check_constraints = ON")
        try:
            for statement in statements:
                await conn.execute(statement)
        finally:
            if unchecked:
                await conn.exec_driver_sql("PRAGMA ignore_check_constraints = OFF")


async def test_the_invariants_hold_over_a_whole_shop_life(world, life):
    found = await check(world)
    assert broken(found) == {} and found.ok
    # The life went every way it can: its final statuses, and a notice for each cancel.
    async with world.deps.db.read() as conn:
        statuses = set((await conn.execute(select(t_orders.c.status))).scalars())
        notices = (
            await conn.execute(select(reminders.c.state).where(reminders.c.kind == "order_closed"))
        ).scalars()
        assert sorted(notices) == ["sent"] * 4
    assert statuses == {
        "completed",
        "cancelled_unshipped",
        "cancelled_unpaid",
        "pending_shipment",
        "pending_payment",
    }
    sku = await shop.sku_view(world.deps, life.sku)
    assert (sku["stock"], sku["held"], sku["sold"]) == (15, 2, 3)


async def test_a_cancel_that_gives_nothing_back_is_seen_on_every_count(world, life):
    await cancel_by_status_alone(world, life)


async def test_the_checks_run_on_every_backend(backend_world):
    life = await live_shop(backend_world)
    assert broken(await check(backend_world)) == {}
    await cancel_by_status_alone(backend_world, life)


async def cancel_by_status_alone(world, life: Shop) -> None:
    """The live orders cancelled by a bare status write (no release, no notice): every count
    they hold names them."""
    await write(
        world,
        update(t_orders)
        .where(t_orders.c.id.in_([life.pending, life.pending_flash]))
        .values(status="cancelled_unpaid"),
    )
    assert broken(await check(world)) == {
        "units_held_by_dead_order": [life.sku, life.other_sku],
        "flash_units_held_by_dead_order": [life.sale],
        "flash_limits_broken": [life.sale],
        "coupons_locked_by_dead_order": [life.coupon],
        "cancels_not_notified": [life.pending, life.pending_flash],
    }


async def test_units_that_do_not_add_up_are_named(world, life):
    await write(
        world,
        update(skus).where(skus.c.id == life.sku).values(stocked=skus.c.stocked + 1),
        # adds up (-1 + 1 held + 1 sold), but below zero
        update(flash_sales).where(flash_sales.c.id == life.sale).values(stock=-1, stocked=1),
        unchecked=True,
    )
    assert broken(await check(world)) == {
        "units_unbalanced": [life.sku],
        "flash_units_unbalanced": [life.sale],
    }


async def test_units_held_without_an_order_are_named(world, life):
    # Balanced (the CHECKs pass), but one held unit no unpaid order holds.
    await write(
        world,
        update(skus)
        .where(skus.c.id == life.other_sku)
        .values(stock=skus.c.stock - 1, held=skus.c.held + 1),
    )
    assert broken(await check(world)) == {"units_held_by_dead_order": [life.other_sku]}


async def test_units_sold_without_a_payment_are_named(world, life):
    # The unpaid orders' units marked sold (a settle without the payment).
    await write(
        world,
        update(skus).where(skus.c.id == life.sku).values(held=0, sold=skus.c.sold + 2),
        update(flash_sales).where(flash_sales.c.id == life.sale).values(held=0, sold=2),
    )
    assert broken(await check(world)) == {
        "units_held_by_dead_order": [life.sku],
        "units_sold_unpaid": [life.sku],
        "flash_units_held_by_dead_order": [life.sale],
        "flash_units_sold_unpaid": [life.sale],
    }


async def test_a_paid_orders_units_not_sold_are_named(world, life):
    await write(
        world,
        update(skus)
        .where(skus.c.id == life.other_sku)
        .values(stock=skus.c.stock + 1, sold=skus.c.sold - 1),
    )
    assert broken(await check(world)) == {"units_sold_unpaid": [life.other_sku]}


@pytest.mark.parametrize("how", ["miscounted", "over the limit", "uncounted"])
async def test_a_flash_buyers_count_off_is_named(world, life, how):
    buyer = flash_buyers.c
    mine = (buyer.flash_sale_id == life.sale) & (buyer.buyer_id == world.buyer)
    statement = {
        "miscounted": update(flash_buyers).where(mine).values(units=0),
        "over the limit": update(flash_sales)
        .where(flash_sales.c.id == life.sale)
        .values(per_buyer_limit=0),
        "uncounted": delete(flash_buyers).where(mine),
    }[how]
    await write(world, statement)
    assert broken(await check(world)) == {"flash_limits_broken": [life.sale]}


async def test_a_coupon_used_by_an_unpaid_order_is_named(world, life):
    await write(
        world,
        update(coupons).where(coupons.c.id == life.coupon).values(state="used"),
    )
    assert broken(await check(world)) == {"coupons_used_by_unpaid_order": [life.coupon]}


async def test_a_coupon_on_two_orders_is_named(world, life):
    # The paid order's lines gain the pending order's coupon: two orders discounted by one.
    await write(
        world,
        insert(order_lines).values(
            order_id=life.paid,
            kind="coupon",
            item_id=life.coupon,
            label="5.00 off",
            quantity=1,
            price=Decimal("5.00"),
        ),
    )
    assert broken(await check(world)) == {
        "coupons_used_twice": [life.coupon],
        "coupons_not_with_their_order": [life.paid],
    }


async def test_a_coupon_reused_after_its_order_was_cancelled_is_not_twice(world, life):
    # The cancelled order's coupon line stays (what was bought); it took the coupon no more.
    async with world.deps.db.read() as conn:
        given_back = await conn.scalar(
            select(order_lines.c.item_id).where(
                order_lines.c.order_id == life.cancelled, order_lines.c.kind == "coupon"
            )
        )
    again = await world.shop_order({life.sku: 1}, coupon=given_back)
    found = await check(world)
    assert broken(found) == {}
    assert again["status"] == "pending_payment"


async def test_a_discount_kept_without_its_coupon_is_named(world, life):
    await write(
        world,
        update(coupons).where(coupons.c.id == life.coupon).values(state="available", order_id=None),
    )
    assert broken(await check(world)) == {"coupons_not_with_their_order": [life.pending]}


async def test_a_coupon_locked_by_an_order_without_its_discount_is_named(world, life):
    await write(
        world,
        update(coupons)
        .where(coupons.c.id == life.spare_coupon)
        .values(state="locked", order_id=life.pending_flash),
    )
    assert broken(await check(world)) == {"coupons_not_with_their_order": [life.pending_flash]}


async def test_a_cancel_without_its_notice_is_named(world, life):
    await write(
        world,
        delete(reminders).where(reminders.c.order_id == life.cancelled),
        delete(timers).where(timers.c.order_id == life.cancelled, timers.c.kind == "order_closed"),
    )
    assert broken(await check(world)) == {"cancels_not_notified": [life.cancelled]}


async def test_a_notice_written_twice_is_named(world, life):
    # The unique key forbids it: the table is rebuilt without it to break the promise.
    async with world.deps.db.write() as conn:
        await conn.execute(text("CREATE TABLE reminders_copy AS SELECT * FROM reminders"))
        await conn.execute(text("DROP TABLE reminders"))
        await conn.execute(text("ALTER TABLE reminders_copy RENAME TO reminders"))
        row = (
            await conn.execute(
                select(reminders).where(
                    reminders.c.order_id == life.cancelled, reminders.c.kind == "order_closed"
                )
            )
        ).one()
        await conn.execute(insert(reminders).values({**row._mapping, "id": row.id + 1000}))
    assert broken(await check(world)) == {"cancels_not_notified": [life.cancelled]}


async def test_an_uncancelled_order_needs_no_notice_and_a_fresh_cancel_has_one(world, life):
    # Cancelled, its notice not sent yet (the worker not run): its timer is the notice.
    await orders.cancel_by_buyer(world.deps, order_id=life.pending, user_id=world.buyer)
    assert broken(await check(world)) == {}
