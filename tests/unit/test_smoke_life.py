from __future__ import annotations

from datetime import timedelta

from dueflow.service import orders, payments
from dueflow.service.orders import order_view


async def test_unpaid_order_is_cancelled_at_deadline(world):
    goods_id = await world.goods()
    order_id = await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)
    world.clock.advance(timedelta(minutes=5))
    assert await world.worker.drain() == 1
    world.clock.advance(timedelta(minutes=25))
    assert await world.worker.drain() == 2  # the cancel, then the buyer's notice
    view = await order_view(world.deps, order_id)
    assert view["status"] == "cancelled_unpaid"
    assert [(r.kind, r.reason) for r in world.notifier.sent] == [
        ("pay_reminder", None),
        ("order_closed", "pay_timeout"),
    ]


async def test_full_life(world):
    goods_id = await world.goods()
    order_id = await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)
    await payments.record_manual_payment(world.deps, order_id=order_id, amount="12.50")
    await orders.ship(
        world.deps, order_id=order_id, user_id=world.seller, carrier="SF", tracking_no="1"
    )
    world.clock.advance(timedelta(days=10))
    await world.worker.drain()
    world.clock.advance(timedelta(days=15))
    await world.worker.drain()
    view = await order_view(world.deps, order_id)
    assert view["status"] == "completed"
    assert len(view["reviews"]) == 2
