"""Every buyer and seller action on SQLite with the controllable clock, checked in the database."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from sqlalchemy import select

from dueflow.exceptions import (
    GoodsUnavailable,
    InvalidInput,
    InvalidTransition,
    NotAllowed,
    NotFound,
)
from dueflow.service import orders, payments, shop
from dueflow.service.orders import order_view
from dueflow.store import payments as payment_store
from dueflow.store import schema
from tests.conftest import START, table_snapshot


async def snapshot(world) -> dict[str, list[tuple]]:
    return await table_snapshot(world.deps)


async def goods_row(world, goods_id):
    async with world.deps.db.read() as conn:
        return (await conn.execute(select(schema.goods).where(schema.goods.c.id == goods_id))).one()


async def timers_by_kind(world, order_id) -> dict[str, object]:
    async with world.deps.db.read() as conn:
        rows = (
            await conn.execute(select(schema.timers).where(schema.timers.c.order_id == order_id))
        ).all()
    return {r.kind: r for r in rows}


async def place(world, price="12.50", **kwargs):
    goods_id = await world.goods(price)
    order_id = await orders.place_order(
        world.deps, buyer_id=kwargs.pop("buyer", world.buyer), goods_id=goods_id, **kwargs
    )
    return goods_id, order_id


async def pay(world, order_id, amount="12.50"):
    pay_no, outcome = await payments.record_manual_payment(
        world.deps, order_id=order_id, amount=amount
    )
    assert outcome is payments.PaymentOutcome.CONFIRMED
    return pay_no


async def ship(world, order_id):
    await orders.ship(
        world.deps, order_id=order_id, user_id=world.seller, carrier="SF", tracking_no="SF123"
    )


async def received_order(world):
    goods_id, order_id = await place(world)
    await pay(world, order_id)
    await ship(world, order_id)
    await orders.confirm_receipt(world.deps, order_id=order_id, user_id=world.buyer)
    return goods_id, order_id


# ---------------------------------------------------------------- place_order


async def test_place_order_holds_goods_and_schedules_timers(world):
    goods_id, order_id = await place(world)
    view = await order_view(world.deps, order_id)
    assert view["status"] == "pending_payment"
    assert view["amount"] == Decimal("12.50")
    assert view["order_type"] == "normal"
    assert view["flow"] == "marketplace"
    assert view["buyer_id"] == world.buyer
    assert view["seller_id"] == world.seller
    assert view["goods_id"] == goods_id
    assert view["created_at"] == START
    assert view["pay_deadline"] == START + timedelta(minutes=30)
    for column in ("paid_at", "ship_deadline", "shipped_at", "cancelled_at", "completed_at"):
        assert view[column] is None

    item = await goods_row(world, goods_id)
    assert item.reserved_order_id == order_id
    assert item.status == "on_sale"

    found = await timers_by_kind(world, order_id)
    assert set(found) == {"cancel_unpaid", "pay_reminder"}
    assert found["cancel_unpaid"].due_at == START + timedelta(minutes=30)
    assert found["cancel_unpaid"].deadline_at == START + timedelta(minutes=30)
    assert found["pay_reminder"].due_at == START + timedelta(minutes=5)
    for timer in found.values():
        assert timer.state == "scheduled"
        assert timer.attempts == 0
        assert timer.stuck is False

    assert [(e["event"], e["to_status"], e["actor"]) for e in view["timeline"]] == [
        ("place", "pending_payment", f"user:{world.buyer}")
    ]
    assert view["payments"] == [] and view["refunds"] == [] and view["reviews"] == []


async def test_a_flash_sale_order_has_the_flash_types_short_pay_deadline(world):
    # The buyer no longer picks the order type: buying from a flash sale makes it ``flash``.
    sale_id = await world.flash_sale(await world.sku(), stock=5)
    view = await shop.place_flash_order(
        world.deps, buyer_id=world.buyer, flash_sale_id=sale_id, quantity=1
    )
    assert (view["order_type"], view["flow"]) == ("flash", "shop")
    assert view["pay_deadline"] == START + timedelta(minutes=5)
    found = await timers_by_kind(world, view["id"])
    assert found["cancel_unpaid"].due_at == START + timedelta(minutes=5)
    assert found["pay_reminder"].due_at == START + timedelta(minutes=2)


async def test_place_order_second_buyer_gets_goods_unavailable_and_nothing_changes(world):
    goods_id, first = await place(world)
    before = await snapshot(world)
    with pytest.raises(GoodsUnavailable):
        await orders.place_order(world.deps, buyer_id=world.other, goods_id=goods_id)
    # the same buyer cannot hold it twice either
    with pytest.raises(GoodsUnavailable):
        await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)
    after = await snapshot(world)
    assert after == before
    assert len(after["orders"]) == 1
    assert len(after["timers"]) == 2
    assert len(after["order_events"]) == 1
    assert (await goods_row(world, goods_id)).reserved_order_id == first


async def test_place_order_on_sold_goods(world):
    goods_id, order_id = await place(world)
    await pay(world, order_id)
    before = await snapshot(world)
    with pytest.raises(GoodsUnavailable, match="sold"):
        await orders.place_order(world.deps, buyer_id=world.other, goods_id=goods_id)
    assert await snapshot(world) == before


async def test_place_order_own_goods_not_allowed(world):
    goods_id = await world.goods()
    before = await snapshot(world)
    with pytest.raises(NotAllowed):
        await orders.place_order(world.deps, buyer_id=world.seller, goods_id=goods_id)
    assert await snapshot(world) == before
    assert (await goods_row(world, goods_id)).reserved_order_id is None


async def test_place_order_unknown_goods_or_buyer(world):
    goods_id = await world.goods()
    before = await snapshot(world)
    with pytest.raises(NotFound):
        await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id + 999)
    with pytest.raises(NotFound):
        await orders.place_order(world.deps, buyer_id=9999, goods_id=goods_id)
    assert await snapshot(world) == before


async def test_order_view_unknown_order(world):
    with pytest.raises(NotFound):
        await order_view(world.deps, 12345)


# ---------------------------------------------------------------- buyer cancel


async def test_buyer_cancel_releases_goods_and_cancels_timers(world):
    goods_id, order_id = await place(world)
    # an open manual attempt, as if the buyer chose to pay by bank transfer
    async with world.deps.db.write() as conn:
        await payment_store.insert_attempt(
            conn,
            pay_no="20260301manualopen0001",
            order_id=order_id,
            provider="manual",
            amount=Decimal("12.50"),
            expires_at=START + timedelta(minutes=30),
            now=START,
        )
    world.clock.advance(timedelta(minutes=3))
    await orders.cancel_by_buyer(world.deps, order_id=order_id, user_id=world.buyer)
    now = START + timedelta(minutes=3)

    view = await order_view(world.deps, order_id)
    assert view["status"] == "cancelled_unpaid"
    assert view["cancelled_at"] == now
    assert view["cancel_reason"] == "buyer_cancel"
    item = await goods_row(world, goods_id)
    assert item.reserved_order_id is None
    assert item.status == "on_sale"
    # the buyer's notice is written as a timer due now, in the cancel's transaction
    timers = {t["kind"]: (t["state"], t["due_at"]) for t in view["timers"]}
    assert timers == {
        "cancel_unpaid": ("cancelled", START + timedelta(minutes=30)),
        "pay_reminder": ("cancelled", START + timedelta(minutes=5)),
        "order_closed": ("scheduled", now),
    }
    assert view["notices"] == []
    assert [(p["state"], p["handled_at"]) for p in view["payments"]] == [("closed", now)]
    cancelled, released = view["timeline"][-2:]
    assert cancelled["event"] == "buyer_cancel"
    assert cancelled["from_status"] == "pending_payment"
    assert cancelled["to_status"] == "cancelled_unpaid"
    assert (released["event"], released["detail"]) == ("released", f"goods {goods_id} back on sale")
    assert view["refunds"] == []

    # the goods can be ordered again, and the old timers never fire
    again = await orders.place_order(world.deps, buyer_id=world.other, goods_id=goods_id)
    assert (await goods_row(world, goods_id)).reserved_order_id == again
    # only the closed notice, and the new order's reminder and deadline fire (the cancelled
    # order's own timers are dead)
    world.clock.advance(timedelta(minutes=5))
    assert await world.worker.drain() == 2
    sent = [(r.kind, r.order_id, r.reason) for r in world.notifier.sent]
    assert sent == [("order_closed", order_id, "buyer_cancel"), ("pay_reminder", again, None)]
    [notice] = (await order_view(world.deps, order_id))["notices"]
    assert (notice["kind"], notice["state"], notice["deliveries"]) == ("order_closed", "sent", 1)
    world.clock.advance(timedelta(minutes=25))
    assert await world.worker.drain() == 2  # the new order's cancel, then its notice
    assert (await order_view(world.deps, order_id))["status"] == "cancelled_unpaid"
    sent = [(r.kind, r.order_id, r.reason) for r in world.notifier.sent]
    assert sent[2:] == [("order_closed", again, "pay_timeout")]
    assert (await order_view(world.deps, again))["status"] == "cancelled_unpaid"


async def test_cancel_by_stranger_or_seller_not_allowed(world):
    _, order_id = await place(world)
    before = await snapshot(world)
    for user in (world.other, world.seller):
        with pytest.raises(NotAllowed):
            await orders.cancel_by_buyer(world.deps, order_id=order_id, user_id=user)
    assert await snapshot(world) == before


async def test_cancel_unknown_order(world):
    with pytest.raises(NotFound):
        await orders.cancel_by_buyer(world.deps, order_id=777, user_id=world.buyer)


async def test_cancel_twice(world):
    _, order_id = await place(world)
    await orders.cancel_by_buyer(world.deps, order_id=order_id, user_id=world.buyer)
    before = await snapshot(world)
    with pytest.raises(InvalidTransition) as info:
        await orders.cancel_by_buyer(world.deps, order_id=order_id, user_id=world.buyer)
    assert info.value.status == "cancelled_unpaid"
    assert "cancelled_unpaid" in info.value.message
    assert await snapshot(world) == before


async def test_cancel_after_payment_is_invalid_transition(world):
    goods_id, order_id = await place(world)
    await pay(world, order_id)
    before = await snapshot(world)
    with pytest.raises(InvalidTransition) as info:
        await orders.cancel_by_buyer(world.deps, order_id=order_id, user_id=world.buyer)
    assert info.value.status == "pending_shipment"
    assert "pending_shipment" in str(info.value)
    assert await snapshot(world) == before
    item = await goods_row(world, goods_id)
    assert item.status == "sold"
    assert item.reserved_order_id == order_id


# ---------------------------------------------------------------- ship


BAD_LABELS = [
    ("", "SF1"),
    ("   ", "SF1"),
    ("SF", ""),
    ("SF", "   "),
    ("x" * 65, "SF1"),
    ("SF", "1" * 65),
    ("S\nF", "SF1"),
    ("SF", "1\x002"),
    (None, "SF1"),
]


async def test_ship_validates_carrier_and_tracking_no(world):
    _, order_id = await place(world)
    await pay(world, order_id)
    before = await snapshot(world)
    for carrier, tracking_no in BAD_LABELS:
        with pytest.raises(InvalidInput):
            await orders.ship(
                world.deps,
                order_id=order_id,
                user_id=world.seller,
                carrier=carrier,
                tracking_no=tracking_no,
            )
    assert await snapshot(world) == before
    assert (await order_view(world.deps, order_id))["status"] == "pending_shipment"


async def test_ship_accepts_64_characters_and_strips(world):
    _, order_id = await place(world)
    await pay(world, order_id)
    await orders.ship(
        world.deps,
        order_id=order_id,
        user_id=world.seller,
        carrier="  " + "c" * 64 + " ",
        tracking_no="t" * 64,
    )
    view = await order_view(world.deps, order_id)
    assert view["carrier"] == "c" * 64
    assert view["tracking_no"] == "t" * 64


async def test_ship_by_someone_else_not_allowed(world):
    _, order_id = await place(world)
    await pay(world, order_id)
    before = await snapshot(world)
    for user in (world.buyer, world.other):
        with pytest.raises(NotAllowed):
            await orders.ship(
                world.deps, order_id=order_id, user_id=user, carrier="SF", tracking_no="1"
            )
    assert await snapshot(world) == before


async def test_ship_unpaid_is_invalid_transition(world):
    _, order_id = await place(world)
    before = await snapshot(world)
    with pytest.raises(InvalidTransition) as info:
        await ship(world, order_id)
    assert info.value.status == "pending_payment"
    assert "pending_payment" in info.value.message
    assert await snapshot(world) == before


async def test_ship_unknown_order(world):
    with pytest.raises(NotFound):
        await ship(world, 4242)


async def test_ship_moves_to_shipped_with_receive_deadline(world):
    _, order_id = await place(world)
    await pay(world, order_id)
    shipped_at = world.clock.advance(timedelta(hours=20))
    await ship(world, order_id)
    view = await order_view(world.deps, order_id)
    assert view["status"] == "shipped"
    assert view["shipped_at"] == shipped_at
    assert view["carrier"] == "SF"
    assert view["tracking_no"] == "SF123"
    assert view["receive_deadline"] == shipped_at + timedelta(days=10)
    found = await timers_by_kind(world, order_id)
    assert found["cancel_unshipped"].state == "cancelled"
    assert found["confirm_receipt"].state == "scheduled"
    assert found["confirm_receipt"].due_at == shipped_at + timedelta(days=10)
    last = view["timeline"][-1]
    assert (last["event"], last["from_status"], last["to_status"]) == (
        "ship",
        "pending_shipment",
        "shipped",
    )
    assert last["actor"] == f"user:{world.seller}"

    # shipping again is refused and changes nothing
    before = await snapshot(world)
    with pytest.raises(InvalidTransition) as info:
        await ship(world, order_id)
    assert info.value.status == "shipped"
    assert await snapshot(world) == before

    # the ship deadline no longer applies
    world.clock.advance(timedelta(days=3))
    await world.worker.drain()
    assert (await order_view(world.deps, order_id))["status"] == "shipped"


# ---------------------------------------------------------------- seller cancel


async def test_seller_cancel_takes_goods_off_sale_and_refunds_once(world):
    goods_id, order_id = await place(world)
    pay_no = await pay(world, order_id)
    cancelled_at = world.clock.advance(timedelta(hours=5))
    await orders.cancel_by_seller(world.deps, order_id=order_id, user_id=world.seller)

    view = await order_view(world.deps, order_id)
    assert view["status"] == "cancelled_unshipped"
    assert view["cancelled_at"] == cancelled_at
    assert view["cancel_reason"] == "seller_cancel"
    item = await goods_row(world, goods_id)
    assert item.status == "off_sale"
    assert item.reserved_order_id is None
    assert len(view["refunds"]) == 1
    refund = view["refunds"][0]
    assert refund["refund_no"] == "R" + pay_no
    assert refund["state"] == "pending_review"
    assert refund["amount"] == Decimal("12.50")
    assert refund["provider"] == "manual"
    assert refund["reason"] == "seller_cancel"
    assert refund["payment_id"] == view["payments"][0]["id"]
    assert {t["kind"]: t["state"] for t in view["timers"]}["cancel_unshipped"] == "cancelled"
    assert [(e["event"], e["to_status"]) for e in view["timeline"]][-3:] == [
        ("seller_cancel", "cancelled_unshipped"),
        ("released", None),
        ("refund_created", None),
    ]
    assert view["timeline"][-1]["detail"] == f"{refund['refund_no']} 12.50 seller_cancel"

    # a second cancel is refused: still exactly one refund
    before = await snapshot(world)
    with pytest.raises(InvalidTransition) as info:
        await orders.cancel_by_seller(world.deps, order_id=order_id, user_id=world.seller)
    assert info.value.status == "cancelled_unshipped"
    assert await snapshot(world) == before
    assert len(before["refunds"]) == 1

    # off-sale goods cannot be ordered; the ship deadline timer does nothing
    with pytest.raises(GoodsUnavailable):
        await orders.place_order(world.deps, buyer_id=world.other, goods_id=goods_id)
    world.clock.advance(timedelta(days=3))
    assert await world.worker.drain() == 1  # the seller's cancel's notice only
    assert [(r.kind, r.reason) for r in world.notifier.sent] == [("order_closed", "seller_cancel")]
    assert len((await order_view(world.deps, order_id))["refunds"]) == 1


async def test_seller_cancel_refused_cases(world):
    _, order_id = await place(world)
    before = await snapshot(world)
    with pytest.raises(InvalidTransition) as info:
        await orders.cancel_by_seller(world.deps, order_id=order_id, user_id=world.seller)
    assert info.value.status == "pending_payment"
    assert await snapshot(world) == before
    await pay(world, order_id)
    before = await snapshot(world)
    for user in (world.buyer, world.other):
        with pytest.raises(NotAllowed):
            await orders.cancel_by_seller(world.deps, order_id=order_id, user_id=user)
    assert await snapshot(world) == before
    await ship(world, order_id)
    before = await snapshot(world)
    with pytest.raises(InvalidTransition) as info:
        await orders.cancel_by_seller(world.deps, order_id=order_id, user_id=world.seller)
    assert info.value.status == "shipped"
    assert await snapshot(world) == before
    with pytest.raises(NotFound):
        await orders.cancel_by_seller(world.deps, order_id=999, user_id=world.seller)


# ---------------------------------------------------------------- confirm receipt


async def test_confirm_receipt(world):
    _, order_id = await place(world)
    await pay(world, order_id)
    await ship(world, order_id)
    received_at = world.clock.advance(timedelta(days=2, minutes=7))
    await orders.confirm_receipt(world.deps, order_id=order_id, user_id=world.buyer)
    view = await order_view(world.deps, order_id)
    assert view["status"] == "received"
    assert view["received_at"] == received_at
    assert view["review_deadline"] == received_at + timedelta(days=15)
    found = await timers_by_kind(world, order_id)
    assert found["confirm_receipt"].state == "cancelled"
    assert found["auto_review"].state == "scheduled"
    assert found["auto_review"].due_at == received_at + timedelta(days=15)
    last = view["timeline"][-1]
    assert (last["event"], last["from_status"], last["to_status"], last["actor"]) == (
        "confirm_receipt",
        "shipped",
        "received",
        f"user:{world.buyer}",
    )
    # the old receive deadline passing does nothing
    world.clock.advance(timedelta(days=10))
    assert await world.worker.drain() == 0
    assert (await order_view(world.deps, order_id))["status"] == "received"


async def test_confirm_receipt_refused_cases(world):
    _, order_id = await place(world)
    before = await snapshot(world)
    with pytest.raises(InvalidTransition) as info:
        await orders.confirm_receipt(world.deps, order_id=order_id, user_id=world.buyer)
    assert info.value.status == "pending_payment"
    await pay(world, order_id)
    with pytest.raises(InvalidTransition) as info:
        await orders.confirm_receipt(world.deps, order_id=order_id, user_id=world.buyer)
    assert info.value.status == "pending_shipment"
    await ship(world, order_id)
    before = await snapshot(world)
    for user in (world.seller, world.other):
        with pytest.raises(NotAllowed):
            await orders.confirm_receipt(world.deps, order_id=order_id, user_id=user)
    assert await snapshot(world) == before
    await orders.confirm_receipt(world.deps, order_id=order_id, user_id=world.buyer)
    before = await snapshot(world)
    with pytest.raises(InvalidTransition) as info:
        await orders.confirm_receipt(world.deps, order_id=order_id, user_id=world.buyer)
    assert info.value.status == "received"
    assert await snapshot(world) == before


# ---------------------------------------------------------------- review


async def test_review_rating_validation(world):
    _, order_id = await received_order(world)
    before = await snapshot(world)
    for rating in (0, 6, -1, True, False, "5", 4.5, None):
        for user in (world.buyer, world.seller):
            with pytest.raises(InvalidInput):
                await orders.review(world.deps, order_id=order_id, user_id=user, rating=rating)
    assert await snapshot(world) == before
    for rating in (1, 5):  # the bounds are accepted
        user = world.buyer if rating == 1 else world.seller
        await orders.review(world.deps, order_id=order_id, user_id=user, rating=rating)
    view = await order_view(world.deps, order_id)
    assert sorted((r["role"], r["rating"]) for r in view["reviews"]) == [
        ("buyer", 1),
        ("seller", 5),
    ]


async def test_review_comment_length(world):
    _, order_id = await received_order(world)
    before = await snapshot(world)
    with pytest.raises(InvalidInput):
        await orders.review(
            world.deps, order_id=order_id, user_id=world.buyer, rating=5, comment="x" * 501
        )
    assert await snapshot(world) == before
    role = await orders.review(
        world.deps, order_id=order_id, user_id=world.buyer, rating=1, comment=" " + "y" * 500 + " "
    )
    assert role == "buyer"
    reviews = (await order_view(world.deps, order_id))["reviews"]
    assert [(r["role"], r["rating"], r["comment"], r["is_default"]) for r in reviews] == [
        ("buyer", 1, "y" * 500, False)
    ]


async def test_review_wrong_status(world):
    _, order_id = await place(world)
    await pay(world, order_id)
    await ship(world, order_id)
    before = await snapshot(world)
    with pytest.raises(InvalidTransition) as info:
        await orders.review(world.deps, order_id=order_id, user_id=world.buyer, rating=5)
    assert info.value.status == "shipped"
    assert "shipped" in info.value.message
    assert await snapshot(world) == before


async def test_review_stranger_and_unknown_order(world):
    _, order_id = await received_order(world)
    before = await snapshot(world)
    with pytest.raises(NotAllowed):
        await orders.review(world.deps, order_id=order_id, user_id=world.other, rating=5)
    with pytest.raises(NotFound):
        await orders.review(world.deps, order_id=order_id + 100, user_id=world.buyer, rating=5)
    assert await snapshot(world) == before


async def test_review_same_role_twice(world):
    _, order_id = await received_order(world)
    assert await orders.review(world.deps, order_id=order_id, user_id=world.seller, rating=4)
    before = await snapshot(world)
    with pytest.raises(InvalidTransition) as info:
        await orders.review(world.deps, order_id=order_id, user_id=world.seller, rating=5)
    assert info.value.status == "received"
    assert await snapshot(world) == before
    assert (await order_view(world.deps, order_id))["status"] == "received"


async def test_both_reviews_complete_the_order(world):
    _, order_id = await received_order(world)
    world.clock.advance(timedelta(days=1))
    assert (
        await orders.review(
            world.deps, order_id=order_id, user_id=world.buyer, rating=5, comment="great"
        )
        == "buyer"
    )
    assert (await order_view(world.deps, order_id))["status"] == "received"
    completed_at = world.clock.advance(timedelta(days=1))
    assert (
        await orders.review(world.deps, order_id=order_id, user_id=world.seller, rating=4)
        == "seller"
    )
    view = await order_view(world.deps, order_id)
    assert view["status"] == "completed"
    assert view["completed_at"] == completed_at
    assert sorted((r["role"], r["rating"], r["is_default"]) for r in view["reviews"]) == [
        ("buyer", 5, False),
        ("seller", 4, False),
    ]
    assert {t["kind"]: t["state"] for t in view["timers"]}["auto_review"] == "cancelled"
    last = view["timeline"][-1]
    assert (last["event"], last["from_status"], last["to_status"]) == (
        "reviews_complete",
        "received",
        "completed",
    )
    # the review deadline passing writes no default review
    world.clock.advance(timedelta(days=15))
    assert await world.worker.drain() == 0
    assert len((await order_view(world.deps, order_id))["reviews"]) == 2
    # and a completed order takes no more reviews
    with pytest.raises(InvalidTransition) as info:
        await orders.review(world.deps, order_id=order_id, user_id=world.buyer, rating=5)
    assert info.value.status == "completed"


async def test_review_deadline_writes_default_review_for_the_missing_role(world):
    _, order_id = await received_order(world)
    await orders.review(world.deps, order_id=order_id, user_id=world.buyer, rating=2)
    world.clock.advance(timedelta(days=15))
    assert await world.worker.drain() == 1
    view = await order_view(world.deps, order_id)
    assert view["status"] == "completed"
    assert sorted((r["role"], r["rating"], r["is_default"]) for r in view["reviews"]) == [
        ("buyer", 2, False),
        ("seller", 5, True),
    ]


async def test_non_text_labels_and_comments_are_refused(world):
    from dueflow.exceptions import InvalidInput

    with pytest.raises(InvalidInput, match="carrier is text"):
        await orders.ship(world.deps, order_id=1, user_id=world.seller, carrier=7, tracking_no="x")
    with pytest.raises(InvalidInput, match="comment is text"):
        await orders.review(world.deps, order_id=1, user_id=world.buyer, rating=5, comment=7)
