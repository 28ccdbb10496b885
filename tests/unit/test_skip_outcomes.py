"""A timer that does nothing says why: its order moved on (and how), is gone, or the pay
deadline it reminds of has passed."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update

from dueflow.domain import timers as timer_rules
from dueflow.domain.lifecycle import OrderStatus
from dueflow.domain.timers import TimerKind
from dueflow.service import orders as order_service
from dueflow.store import timers
from dueflow.store.schema import orders
from dueflow.store.schema import timers as t_timers

K = TimerKind


def test_every_status_has_its_reason():
    for status in OrderStatus:
        outcome = timer_rules.skipped_moved_on(status.value)
        assert outcome.startswith(f"skipped: order is {status.value} (")
        assert "moved on" not in outcome
    assert timer_rules.skipped_moved_on("pending_shipment") == (
        "skipped: order is pending_shipment (paid before this timer)"
    )


async def place(world) -> int:
    goods_id = await world.goods()
    return await order_service.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)


async def claim(world, kind: TimerKind):
    async with world.deps.db.write() as conn:
        claimed = await timers.claim_due(
            conn, now=world.clock.now(), limit=10, lease=world.deps.lease
        )
    return [t for t in claimed if t.kind is kind]


async def outcome(world, order_id: int, kind: TimerKind) -> str:
    async with world.deps.db.read() as conn:
        query = select(t_timers.c.state, t_timers.c.outcome).where(
            t_timers.c.order_id == order_id, t_timers.c.kind == kind.value
        )
        (row,) = (await conn.execute(query)).all()
    assert row.state == "done"
    return str(row.outcome)


async def test_a_reminder_whose_order_was_cancelled_meanwhile_says_so(world):
    order_id = await place(world)
    world.clock.advance(timedelta(minutes=10))
    batch = await claim(world, K.PAY_REMINDER)  # claimed: the cancel leaves it to its worker
    await order_service.cancel_by_buyer(world.deps, order_id=order_id, user_id=world.buyer)
    await world.worker.run_batch(batch)
    assert await outcome(world, order_id, K.PAY_REMINDER) == (
        "skipped: order is cancelled_unpaid (cancelled before this timer)"
    )
    assert all(r.kind != K.PAY_REMINDER.value for r in world.notifier.sent)


async def test_a_reminder_past_the_pay_deadline_says_the_deadline_passed(world):
    order_id = await place(world)
    world.clock.advance(timedelta(minutes=31))  # both due; the reminder runs alone first
    await world.worker.run_batch(await claim(world, K.PAY_REMINDER))
    assert await outcome(world, order_id, K.PAY_REMINDER) == "skipped: pay deadline passed"
    assert world.notifier.sent == []


async def test_a_cancel_whose_order_was_paid_meanwhile_says_it_was_paid(world):
    order_id = await place(world)
    world.clock.advance(timedelta(minutes=31))
    batch = await claim(world, K.CANCEL_UNPAID)
    async with world.deps.db.write() as conn:  # paid while the cancel was claimed, say
        paid = OrderStatus.PENDING_SHIPMENT.value
        await conn.execute(update(orders).where(orders.c.id == order_id).values(status=paid))
    await world.worker.run_batch(batch)
    assert await outcome(world, order_id, K.CANCEL_UNPAID) == (
        "skipped: order is pending_shipment (paid before this timer)"
    )
