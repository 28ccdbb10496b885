"""The shop life through the services with the FakeClock: placing (the server's amount), paying,
shipping, receiving; every cancel and what it gives back (units, flash units, the buyer's
count, the coupon) exactly once; restocking; flash sale windows and per-buyer limits."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from sqlalchemy import select

from dueflow.domain.lifecycle import OrderEvent
from dueflow.exceptions import (
    InvalidInput,
    NotAllowed,
    NotFound,
    PurchaseLimitExceeded,
    SalesClosed,
)
from dueflow.service import lifecycle, orders, payments, shop
from dueflow.store import shop as shop_store
from dueflow.store.schema import flash_buyers

SHOP_PAY = timedelta(minutes=15)
FLASH_PAY = timedelta(minutes=5)
SHIP = timedelta(days=3)
RECEIVE = timedelta(days=10)


async def counts(world, sku_id: int) -> tuple[int, int, int]:
    """The SKU's (stock, held, sold); its ever-stocked units add up to them."""
    view = await shop.sku_view(world.deps, sku_id)
    assert view["stock"] + view["held"] + view["sold"] == view["stocked"]
    return view["stock"], view["held"], view["sold"]


async def sale_counts(world, sale_id: int) -> tuple[int, int, int]:
    """The flash sale's (stock, held, sold), checked against its stocked units."""
    view = await shop.flash_sale_view(world.deps, sale_id)
    assert view["stock"] + view["held"] + view["sold"] == view["stocked"]
    return view["stock"], view["held"], view["sold"]


async def counted(world, sale_id: int, buyer: int) -> int | None:
    """The units the buyer holds or bought at the sale (None: never ordered there)."""
    async with world.deps.db.read() as conn:
        return await conn.scalar(
            select(flash_buyers.c.units).where(
                flash_buyers.c.flash_sale_id == sale_id, flash_buyers.c.buyer_id == buyer
            )
        )


async def coupon(world, coupon_id: int):
    async with world.deps.db.read() as conn:
        return await shop_store.coupon(conn, coupon_id)


async def pay(world, view) -> None:
    await payments.record_manual_payment(world.deps, order_id=view["id"], amount=view["amount"])


async def status(world, order_id: int) -> str:
    return (await orders.order_view(world.deps, order_id))["status"]


async def test_placed_paid_shipped_received_completes_without_reviews(world):
    mug = await world.sku(stock=10, price="19.99", title="mug")
    pot = await world.sku(stock=5, price="0.10", title="teapot")
    coupon_id = await world.coupon(off="5.00", minimum="20.00")
    view = await shop.place_shop_order(
        world.deps,
        buyer_id=world.buyer,
        lines=[
            {"sku_id": pot, "quantity": 1},
            {"sku_id": mug, "quantity": 2},
            {"sku_id": pot, "quantity": 2},
            {"sku_id": mug, "quantity": 1},
        ],
        coupon_id=coupon_id,
    )
    assert (view["flow"], view["order_type"], view["status"]) == (
        "shop",
        "shop",
        "pending_payment",
    )
    # 3 x 19.99 + 3 x 0.10 - 5.00, exactly (floats would make 55.27000000000001).
    assert view["amount"] == Decimal("55.27")
    assert view["pay_deadline"] == world.clock.now() + SHOP_PAY
    assert [(line["kind"], line["item_id"], line["quantity"]) for line in view["lines"]] == [
        ("sku", mug, 3),
        ("sku", pot, 3),
        ("coupon", coupon_id, 1),
    ]
    assert [line["price"] for line in view["lines"]] == [
        Decimal("19.99"),
        Decimal("0.10"),
        Decimal("5.00"),
    ]
    assert await counts(world, mug) == (7, 3, 0)
    assert await counts(world, pot) == (2, 3, 0)
    locked = await coupon(world, coupon_id)
    assert (locked.state, locked.order_id) == ("locked", view["id"])

    await pay(world, view)
    paid = await orders.order_view(world.deps, view["id"])
    assert paid["status"] == "pending_shipment"
    assert paid["ship_deadline"] == world.clock.now() + SHIP
    assert await counts(world, mug) == (7, 0, 3)
    assert await counts(world, pot) == (2, 0, 3)
    used = await coupon(world, coupon_id)
    assert (used.state, used.order_id, used.used_at) == ("used", view["id"], world.clock.now())

    await orders.ship(
        world.deps, order_id=view["id"], user_id=world.seller, carrier="SF", tracking_no="1"
    )
    assert await status(world, view["id"]) == "shipped"
    await orders.confirm_receipt(world.deps, order_id=view["id"], user_id=world.buyer)
    done = await orders.order_view(world.deps, view["id"])
    assert done["status"] == "completed" and done["completed_at"] == world.clock.now()
    assert done["reviews"] == [] and done["review_deadline"] is None
    assert all(t["state"] != "scheduled" for t in done["timers"])
    assert "auto_review" not in {t["kind"] for t in done["timers"]}
    assert await counts(world, mug) == (7, 0, 3)
    world.clock.advance(timedelta(days=30))
    await world.worker.drain()
    assert await status(world, view["id"]) == "completed"


async def test_receipt_is_automatic_at_the_receive_deadline(world):
    sku_id = await world.sku(stock=2)
    view = await world.shop_order({sku_id: 1})
    await pay(world, view)
    await orders.ship(
        world.deps, order_id=view["id"], user_id=world.seller, carrier="SF", tracking_no="9"
    )
    world.clock.advance(RECEIVE - timedelta(seconds=1))
    await world.worker.drain()
    assert await status(world, view["id"]) == "shipped"
    world.clock.advance(timedelta(seconds=1))
    assert await world.worker.drain() == 1
    done = await orders.order_view(world.deps, view["id"])
    assert done["status"] == "completed" and done["reviews"] == []
    assert [e["event"] for e in done["timeline"]][-1] == "receive_timeout"
    assert "auto_review" not in {t["kind"] for t in done["timers"]}
    assert await counts(world, sku_id) == (1, 0, 1)


async def test_the_amount_is_never_below_a_cent(world):
    sku_id = await world.sku(stock=5, price="3.00")
    coupon_id = await world.coupon(off="50.00", minimum="0")
    view = await world.shop_order({sku_id: 2}, coupon=coupon_id)
    assert view["amount"] == Decimal("0.01")
    [coupon_line] = [line for line in view["lines"] if line["kind"] == "coupon"]
    assert coupon_line["price"] == Decimal("50.00")
    await pay(world, view)
    assert await status(world, view["id"]) == "pending_shipment"


async def test_flash_order_amount_and_lines(world):
    sku_id = await world.sku(stock=20, price="99.00", title="kettle")
    sale_id = await world.flash_sale(sku_id, stock=5, price="9.90", limit=3)
    view = await shop.place_flash_order(
        world.deps, buyer_id=world.buyer, flash_sale_id=sale_id, quantity=3
    )
    assert (view["order_type"], view["amount"]) == ("flash", Decimal("29.70"))
    assert view["pay_deadline"] == world.clock.now() + FLASH_PAY
    assert [(line["kind"], line["item_id"], line["price"]) for line in view["lines"]] == [
        ("sku", sku_id, Decimal("9.90")),
        ("flash", sale_id, Decimal("0.00")),
    ]
    assert await counts(world, sku_id) == (17, 3, 0)
    assert await sale_counts(world, sale_id) == (2, 3, 0)
    await pay(world, view)
    assert await counts(world, sku_id) == (17, 0, 3)
    assert await sale_counts(world, sale_id) == (2, 0, 3)
    assert await counted(world, sale_id, world.buyer) == 3


async def test_pay_timeout_gives_everything_back_once(world):
    mug = await world.sku(stock=4, price="30.00")
    pot = await world.sku(stock=4, price="10.00")
    coupon_id = await world.coupon(off="5.00", minimum="20.00")
    view = await world.shop_order({mug: 2, pot: 1}, coupon=coupon_id)
    world.clock.advance(SHOP_PAY - timedelta(seconds=1))
    await world.worker.drain()
    assert await status(world, view["id"]) == "pending_payment"
    assert await counts(world, mug) == (2, 2, 0)
    world.clock.advance(timedelta(seconds=1))
    await world.worker.drain()
    gone = await orders.order_view(world.deps, view["id"])
    assert (gone["status"], gone["cancel_reason"]) == ("cancelled_unpaid", "pay_timeout")
    assert await counts(world, mug) == (4, 0, 0)
    assert await counts(world, pot) == (4, 0, 0)
    back = await coupon(world, coupon_id)
    assert (back.state, back.order_id) == ("available", None)
    [released] = [e for e in gone["timeline"] if e["event"] == "released"]
    assert "back in stock" in released["detail"] and "back to the buyer" in released["detail"]
    await _cancel_again(world, view["id"], OrderEvent.PAY_TIMEOUT)
    assert await counts(world, mug) == (4, 0, 0)
    assert (await coupon(world, coupon_id)).state == "available"
    # The coupon and the units serve the next order.
    again = await world.shop_order({mug: 4}, coupon=coupon_id)
    assert again["amount"] == Decimal("115.00")


async def _cancel_again(world, order_id: int, event: OrderEvent) -> None:
    """A second cancel of the same order (a repeated timer, a second worker) moves nothing."""
    async with world.deps.db.write() as conn:
        moved = await lifecycle.cancel_unpaid(
            conn,
            world.deps,
            [order_id],
            now=world.clock.now(),
            event=event,
            actor="test",
            due_only=False,
        )
    assert moved == []
    await world.worker.drain()


async def test_flash_pay_timeout_restores_the_sale_and_the_buyer_count(world):
    sku_id = await world.sku(stock=10)
    sale_id = await world.flash_sale(sku_id, stock=3, limit=2)
    view = await shop.place_flash_order(
        world.deps, buyer_id=world.buyer, flash_sale_id=sale_id, quantity=2
    )
    assert await counted(world, sale_id, world.buyer) == 2
    world.clock.advance(FLASH_PAY - timedelta(seconds=1))
    await world.worker.drain()
    assert await status(world, view["id"]) == "pending_payment"
    world.clock.advance(timedelta(seconds=1))
    await world.worker.drain()
    assert await status(world, view["id"]) == "cancelled_unpaid"
    assert await counts(world, sku_id) == (10, 0, 0)
    assert await sale_counts(world, sale_id) == (3, 0, 0)
    assert await counted(world, sale_id, world.buyer) == 0
    await _cancel_again(world, view["id"], OrderEvent.PAY_TIMEOUT)
    assert await sale_counts(world, sale_id) == (3, 0, 0)
    assert await counted(world, sale_id, world.buyer) == 0


async def test_buyer_cancel_gives_everything_back_once(world):
    sku_id = await world.sku(stock=10)
    sale_id = await world.flash_sale(sku_id, stock=3, limit=1)
    coupon_id = await world.coupon(off="5.00", minimum="20.00")
    shop_view = await world.shop_order({sku_id: 2}, coupon=coupon_id)
    flash_view = await shop.place_flash_order(
        world.deps, buyer_id=world.buyer, flash_sale_id=sale_id, quantity=1
    )
    assert await counts(world, sku_id) == (7, 3, 0)
    for view in (shop_view, flash_view):
        await orders.cancel_by_buyer(world.deps, order_id=view["id"], user_id=world.buyer)
        gone = await orders.order_view(world.deps, view["id"])
        assert (gone["status"], gone["cancel_reason"]) == ("cancelled_unpaid", "buyer_cancel")
    assert await counts(world, sku_id) == (10, 0, 0)
    assert await sale_counts(world, sale_id) == (3, 0, 0)
    assert await counted(world, sale_id, world.buyer) == 0
    assert (await coupon(world, coupon_id)).state == "available"
    # The pay deadline passing later moves nothing back a second time.
    world.clock.advance(SHOP_PAY)
    await world.worker.drain()
    assert await counts(world, sku_id) == (10, 0, 0)
    assert await sale_counts(world, sale_id) == (3, 0, 0)


async def _short_coupon(world, valid_for: timedelta) -> int:
    """A coupon of the seller's valid from now for ``valid_for``, issued to the buyer."""
    now = world.clock.now()
    tpl = await shop.create_template(
        world.deps,
        seller_id=world.seller,
        title="short",
        amount_off="2.00",
        min_amount="0",
        valid_from=now,
        valid_until=now + valid_for,
        total=5,
    )
    issued = await shop.issue_coupon(
        world.deps, template_id=tpl["id"], issuer_id=world.seller, user_id=world.buyer
    )
    return int(issued["id"])


async def test_a_coupon_whose_validity_ended_while_locked_comes_back_expired(world):
    sku_id = await world.sku(stock=5)
    by_timeout = await _short_coupon(world, timedelta(minutes=10))
    by_buyer = await _short_coupon(world, timedelta(minutes=10))
    first = await world.shop_order({sku_id: 1}, coupon=by_timeout)
    second = await world.shop_order({sku_id: 1}, coupon=by_buyer)
    world.clock.advance(timedelta(minutes=12))
    await orders.cancel_by_buyer(world.deps, order_id=second["id"], user_id=world.buyer)
    world.clock.advance(SHOP_PAY)
    await world.worker.drain()
    assert await status(world, first["id"]) == "cancelled_unpaid"
    for coupon_id in (by_timeout, by_buyer):
        row = await coupon(world, coupon_id)
        assert (row.state, row.order_id, row.used_at) == ("expired", None, None)
    assert {c["state"] for c in await shop.coupons_of(world.deps, world.buyer)} == {"expired"}
    assert await counts(world, sku_id) == (5, 0, 0)


async def test_a_coupon_still_valid_comes_back_available_at_the_edge(world):
    """Valid until exactly the cancel: ``valid_until`` is the first instant it is not."""
    sku_id = await world.sku(stock=5)
    coupon_id = await _short_coupon(world, SHOP_PAY + timedelta(seconds=1))
    await world.shop_order({sku_id: 1}, coupon=coupon_id)
    world.clock.advance(SHOP_PAY)
    await world.worker.drain()
    assert (await coupon(world, coupon_id)).state == "available"


@pytest.mark.parametrize("how", ["ship_timeout", "seller_cancel"])
async def test_paid_order_cancelled_unshipped_keeps_units_sold_and_coupon_used(world, how):
    sku_id = await world.sku(stock=5, price="40.00")
    sale_id = await world.flash_sale(sku_id, stock=2, limit=2)
    coupon_id = await world.coupon(off="5.00", minimum="20.00")
    shop_view = await world.shop_order({sku_id: 2}, coupon=coupon_id)
    flash_view = await shop.place_flash_order(
        world.deps, buyer_id=world.buyer, flash_sale_id=sale_id, quantity=2
    )
    for view in (shop_view, flash_view):
        await pay(world, view)
    if how == "ship_timeout":
        world.clock.advance(SHIP)
        await world.worker.drain()
    else:
        for view in (shop_view, flash_view):
            await orders.cancel_by_seller(world.deps, order_id=view["id"], user_id=world.seller)
    for view in (shop_view, flash_view):
        gone = await orders.order_view(world.deps, view["id"])
        assert (gone["status"], gone["cancel_reason"]) == ("cancelled_unshipped", how)
        [refund] = gone["refunds"]
        assert (refund["state"], refund["amount"]) == ("pending_review", view["amount"])
        [forfeited] = [e for e in gone["timeline"] if e["event"] == "released"]
        assert "kept out of stock" in forfeited["detail"]
    assert await counts(world, sku_id) == (1, 0, 4)
    assert await sale_counts(world, sale_id) == (0, 0, 2)
    assert await counted(world, sale_id, world.buyer) == 2
    used = await coupon(world, coupon_id)
    assert (used.state, used.order_id) == ("used", shop_view["id"])


async def test_restock_puts_more_units_on_sale(world):
    sku_id = await world.sku(stock=1)
    await world.shop_order({sku_id: 1})
    view = await shop.restock(world.deps, sku_id=sku_id, user_id=world.seller, quantity=4)
    assert (view["stock"], view["held"], view["stocked"]) == (4, 1, 5)
    assert await counts(world, sku_id) == (4, 1, 0)
    with pytest.raises(NotAllowed):
        await shop.restock(world.deps, sku_id=sku_id, user_id=world.buyer, quantity=1)
    with pytest.raises(NotFound):
        await shop.restock(world.deps, sku_id=sku_id + 99, user_id=world.seller, quantity=1)
    for bad in (0, -1, True, "2"):
        with pytest.raises(InvalidInput):
            await shop.restock(world.deps, sku_id=sku_id, user_id=world.seller, quantity=bad)
    assert await counts(world, sku_id) == (4, 1, 0)


async def test_a_flash_sale_sells_only_in_its_window(world):
    sku_id = await world.sku(stock=10)
    now = world.clock.now()
    sale = await shop.create_flash_sale(
        world.deps,
        seller_id=world.seller,
        sku_id=sku_id,
        price="1.00",
        stock=5,
        starts_at=now + timedelta(minutes=10),
        ends_at=now + timedelta(minutes=20),
        per_buyer_limit=5,
    )

    async def buy():
        return await shop.place_flash_order(
            world.deps, buyer_id=world.buyer, flash_sale_id=sale["id"], quantity=1
        )

    with pytest.raises(SalesClosed, match="starts at"):
        await buy()
    world.clock.advance(timedelta(minutes=10))
    assert (await buy())["status"] == "pending_payment"
    world.clock.advance(timedelta(minutes=10) - timedelta(microseconds=1))
    assert (await buy())["status"] == "pending_payment"
    world.clock.advance(timedelta(microseconds=1))
    with pytest.raises(SalesClosed, match="ended at"):
        await buy()
    assert await sale_counts(world, sale["id"]) == (3, 2, 0)


async def test_the_per_buyer_limit_counts_held_and_bought_units(world):
    sku_id = await world.sku(stock=20)
    sale_id = await world.flash_sale(sku_id, stock=10, limit=2)

    async def buy(quantity: int = 1, buyer: int | None = None):
        return await shop.place_flash_order(
            world.deps,
            buyer_id=world.buyer if buyer is None else buyer,
            flash_sale_id=sale_id,
            quantity=quantity,
        )

    with pytest.raises(PurchaseLimitExceeded, match="allows 2"):
        await buy(3)
    paid = await buy()
    await pay(world, paid)
    held = await buy()
    with pytest.raises(PurchaseLimitExceeded, match="you hold or bought 2"):
        await buy()
    assert await counted(world, sale_id, world.buyer) == 2
    # Someone else's limit is their own.
    await buy(2, buyer=world.other)
    # Released units count again: the cancelled order's unit may be bought once more.
    await orders.cancel_by_buyer(world.deps, order_id=held["id"], user_id=world.buyer)
    assert await counted(world, sale_id, world.buyer) == 1
    await buy()
    with pytest.raises(PurchaseLimitExceeded):
        await buy()
    assert await counted(world, sale_id, world.buyer) == 2
    assert await sale_counts(world, sale_id) == (6, 3, 1)
    assert await counts(world, sku_id) == (16, 3, 1)
