"""A payment started while a cancel is closing trades: the cancel must not leave a payable trade.

The provider here is a fake of the port whose close call lets another attempt be started in
between (the interleaving a second browser tab produces)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dueflow.exceptions import Busy
from dueflow.payments.base import CloseOutcome, PaymentProvider, Providers
from dueflow.payments.manual import ManualProvider
from dueflow.service import orders
from dueflow.store import payments as payment_store


class Meanwhile(PaymentProvider):
    """Closes every trade, and the first time it is asked, another attempt appears."""

    name = "meanwhile"

    def __init__(self, world) -> None:
        self.world = world
        self.started = False

    async def close_or_query(self, attempt, now):
        if not self.started:
            self.started = True
            async with self.world.deps.db.write() as conn:
                await payment_store.insert_attempt(
                    conn,
                    pay_no=f"B{attempt.pay_no}"[:32],
                    order_id=attempt.order_id,
                    provider=self.name,
                    amount=attempt.amount,
                    expires_at=attempt.expires_at,
                    now=now,
                )
        return CloseOutcome.closed()


async def order_with_attempt(world) -> int:
    world.deps.providers = Providers([ManualProvider(), Meanwhile(world)])
    order_id = await orders.place_order(
        world.deps, buyer_id=world.buyer, goods_id=await world.goods()
    )
    view = await orders.order_view(world.deps, order_id)
    async with world.deps.db.write() as conn:
        await payment_store.insert_attempt(
            conn,
            pay_no="A1",
            order_id=order_id,
            provider="meanwhile",
            amount=view["amount"],
            expires_at=view["pay_deadline"],
            now=world.clock.now(),
        )
    return order_id


async def test_a_buyer_cancel_refuses_when_a_payment_was_started_meanwhile(world):
    order_id = await order_with_attempt(world)
    with pytest.raises(Busy, match="started meanwhile"):
        await orders.cancel_by_buyer(world.deps, order_id=order_id, user_id=world.buyer)
    view = await orders.order_view(world.deps, order_id)
    assert view["status"] == "pending_payment"
    assert sorted(p["state"] for p in view["payments"]) == ["open", "open"]
    # Trying again closes both trades, then cancels.
    await orders.cancel_by_buyer(world.deps, order_id=order_id, user_id=world.buyer)
    assert (await orders.order_view(world.deps, order_id))["status"] == "cancelled_unpaid"


async def test_the_deadline_timer_retries_when_a_payment_was_started_meanwhile(world):
    order_id = await order_with_attempt(world)
    world.clock.advance(timedelta(minutes=30))
    await world.worker.drain()
    view = await orders.order_view(world.deps, order_id)
    assert view["status"] == "pending_payment"
    timer = next(t for t in view["timers"] if t["kind"] == "cancel_unpaid")
    assert timer["state"] == "scheduled"
    assert "started meanwhile" in timer["last_error"]
    world.clock.advance(timedelta(seconds=30))
    await world.worker.drain()
    assert (await orders.order_view(world.deps, order_id))["status"] == "cancelled_unpaid"
