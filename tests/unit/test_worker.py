"""Every timer kind end to end through the Worker, with deadlines driven by the FakeClock."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta
from decimal import Decimal

import pytest
from sqlalchemy import delete, func, select, update

from dueflow.domain.timers import TimerKind
from dueflow.exceptions import BackendUnavailable, Busy
from dueflow.service import orders as order_service
from dueflow.service.deps import Deps
from dueflow.service.payments import record_manual_payment
from dueflow.service.timeouts import HANDLERS
from dueflow.store import timers
from dueflow.store.schema import goods, order_events, orders, refunds, reminders, reviews
from dueflow.store.schema import timers as t_timers
from dueflow.store.timers import Claimed
from dueflow.worker import runner
from dueflow.worker.runner import Worker
from tests.conftest import eventually

K = TimerKind
US = timedelta(microseconds=1)


async def place(world, buyer: int | None = None) -> int:
    goods_id = await world.goods()
    return await order_service.place_order(
        world.deps, buyer_id=buyer or world.buyer, goods_id=goods_id
    )


async def pay(world, order_id: int) -> None:
    await record_manual_payment(world.deps, order_id=order_id, amount="12.50")


async def ship(world, order_id: int) -> None:
    await order_service.ship(
        world.deps, order_id=order_id, user_id=world.seller, carrier="SF", tracking_no="SF1"
    )


async def fetch(world, query):
    async with world.deps.db.read() as conn:
        return list((await conn.execute(query)).all())


async def order(world, order_id: int):
    (row,) = await fetch(world, select(orders).where(orders.c.id == order_id))
    return row


async def goods_of(world, order_id: int):
    o = await order(world, order_id)
    (row,) = await fetch(world, select(goods).where(goods.c.id == o.goods_id))
    return row


async def timer(world, order_id: int, kind: TimerKind):
    (row,) = await fetch(
        world,
        select(t_timers).where(t_timers.c.order_id == order_id, t_timers.c.kind == kind.value),
    )
    return row


async def reminder_rows(world, order_id: int):
    return await fetch(world, select(reminders).where(reminders.c.order_id == order_id))


async def events(world, order_id: int, event: str):
    return await fetch(
        world,
        select(order_events).where(
            order_events.c.order_id == order_id, order_events.c.event == event
        ),
    )


async def reset_to_scheduled(world, timer_id: int) -> None:
    """A stray copy of a finished timer: scheduled and due again."""
    async with world.deps.db.write() as conn:
        await conn.execute(
            update(t_timers)
            .where(t_timers.c.id == timer_id)
            .values(state="scheduled", due_at=world.clock.now(), done_at=None, outcome=None)
        )


# pay_reminder -----------------------------------------------------------------------------


async def test_pay_reminder_is_sent_once_at_its_time(world):
    order_id = await place(world)
    world.clock.advance(timedelta(minutes=5) - US)
    assert await world.worker.drain() == 0
    assert world.notifier.sent == []

    world.clock.advance(US)
    assert await world.worker.drain() == 1
    (sent,) = world.notifier.sent
    (rem,) = await reminder_rows(world, order_id)
    o = await order(world, order_id)
    assert (rem.state, rem.kind, rem.sent_at) == ("sent", "pay_reminder", world.clock.now())
    assert sent.reminder_id == rem.id
    assert (sent.kind, sent.order_id, sent.buyer_id) == ("pay_reminder", order_id, world.buyer)
    assert sent.amount == Decimal("12.50")
    assert sent.pay_deadline == o.pay_deadline
    t = await timer(world, order_id, K.PAY_REMINDER)
    assert (t.state, t.outcome, t.attempts) == ("done", "sent", 1)
    assert o.status == "pending_payment"
    assert (await timer(world, order_id, K.CANCEL_UNPAID)).state == "scheduled"

    # A repeated delivery of the finished timer is dropped.
    assert await world.worker.deliver([t.id]) == 0
    assert len(world.notifier.sent) == 1

    # A stray copy of the timer runs, but the reminder row says it was sent.
    await reset_to_scheduled(world, t.id)
    assert await world.worker.drain() == 1
    t = await timer(world, order_id, K.PAY_REMINDER)
    assert (t.state, t.outcome) == ("done", "already sent")

    # A timer inserted afresh for the same order and kind: still no second reminder.
    async with world.deps.db.write() as conn:
        await conn.execute(delete(t_timers).where(t_timers.c.id == t.id))
        await timers.schedule(
            conn,
            [timers.NewTimer(order_id, K.PAY_REMINDER, world.clock.now())],
            world.clock.now(),
        )
    assert await world.worker.drain() == 1
    assert (await timer(world, order_id, K.PAY_REMINDER)).outcome == "already sent"

    assert len(world.notifier.sent) == 1
    assert len(await reminder_rows(world, order_id)) == 1


async def test_pay_reminder_not_sent_for_a_paid_or_cancelled_order(world):
    paid = await place(world)
    cancelled = await place(world)
    await pay(world, paid)
    await order_service.cancel_by_buyer(world.deps, order_id=cancelled, user_id=world.buyer)
    for order_id in (paid, cancelled):
        assert (await timer(world, order_id, K.PAY_REMINDER)).state == "cancelled"
    world.clock.advance(timedelta(minutes=5))
    assert await world.worker.drain() == 1  # the cancelled order's closed notice only
    assert [(r.kind, r.order_id) for r in world.notifier.sent] == [("order_closed", cancelled)]


async def test_pay_reminder_claimed_before_payment_is_skipped(world):
    """The race: a worker holds the reminder timer while the order is paid or cancelled."""
    paid = await place(world)
    cancelled = await place(world)
    world.clock.advance(timedelta(minutes=5))
    async with world.deps.db.write() as conn:
        claimed = await timers.claim_due(
            conn, now=world.clock.now(), limit=10, lease=world.deps.lease
        )
    assert {c.order_id for c in claimed} == {paid, cancelled}
    await pay(world, paid)
    await order_service.cancel_by_buyer(world.deps, order_id=cancelled, user_id=world.buyer)

    await world.worker.run_batch(claimed)
    assert world.notifier.sent == []
    assert (await timer(world, paid, K.PAY_REMINDER)).outcome == (
        "skipped: order is pending_shipment (paid before this timer)"
    )
    assert (await timer(world, cancelled, K.PAY_REMINDER)).outcome == (
        "skipped: order is cancelled_unpaid (cancelled before this timer)"
    )
    assert await reminder_rows(world, paid) == []
    assert await reminder_rows(world, cancelled) == []


async def test_notifier_failure_retries_with_backoff_then_sends_once(world):
    order_id = await place(world)
    world.notifier.fail_with = BackendUnavailable("webhook down")
    world.clock.advance(timedelta(minutes=5))
    failed_at = world.clock.now()
    assert await world.worker.drain() == 1
    assert world.notifier.sent == []
    (rem,) = await reminder_rows(world, order_id)
    assert rem.state == "pending" and rem.sent_at is None
    t = await timer(world, order_id, K.PAY_REMINDER)
    assert t.state == "scheduled"
    assert t.attempts == 1
    assert t.due_at == failed_at + timedelta(seconds=30)
    assert t.last_error == "BackendUnavailable: webhook down"
    assert t.claim_token is None and t.lease_until is None
    assert world.worker.stats.failed_batches == 0  # the handler itself did not fail

    # Second failure: 60 s.
    world.clock.advance(timedelta(seconds=30) - US)
    assert await world.worker.drain() == 0
    world.clock.advance(US)
    assert await world.worker.drain() == 1
    t = await timer(world, order_id, K.PAY_REMINDER)
    assert (t.attempts, t.due_at) == (2, world.clock.now() + timedelta(seconds=60))

    world.notifier.fail_with = None
    world.clock.advance(timedelta(seconds=60))
    assert await world.worker.drain() == 1
    (sent,) = world.notifier.sent
    (rem2,) = await reminder_rows(world, order_id)
    assert rem2.id == rem.id == sent.reminder_id  # the same reminder id on every retry
    assert (rem2.state, rem2.sent_at) == ("sent", world.clock.now())
    t = await timer(world, order_id, K.PAY_REMINDER)
    assert (t.state, t.outcome, t.attempts) == ("done", "sent", 3)

    world.clock.advance(timedelta(minutes=10))
    await world.worker.drain()
    assert len(world.notifier.sent) == 1


async def test_deliver_runs_the_due_ids_and_drops_the_rest(world):
    order_id = await place(world)
    remind = await timer(world, order_id, K.PAY_REMINDER)
    cancel = await timer(world, order_id, K.CANCEL_UNPAID)
    world.clock.advance(timedelta(minutes=5))
    assert await world.worker.deliver([cancel.id, remind.id, remind.id, 123_456]) == 1
    assert len(world.notifier.sent) == 1
    assert (await timer(world, order_id, K.PAY_REMINDER)).state == "done"
    cancel_after = await timer(world, order_id, K.CANCEL_UNPAID)
    assert (cancel_after.state, cancel_after.attempts) == ("scheduled", 0)
    assert await world.worker.deliver([remind.id]) == 0
    assert len(world.notifier.sent) == 1


# cancel_unpaid ----------------------------------------------------------------------------


async def test_cancel_unpaid_at_the_deadline_not_before(world):
    order_id = await place(world)
    deadline = (await order(world, order_id)).pay_deadline
    cancel_timer = await timer(world, order_id, K.CANCEL_UNPAID)
    assert cancel_timer.due_at == deadline

    # A delivery ahead of time is dropped.
    assert await world.worker.deliver([cancel_timer.id]) == 0

    world.clock.set(deadline - US)
    assert await world.worker.drain() == 1  # only the reminder
    assert await world.worker.deliver([cancel_timer.id]) == 0
    o = await order(world, order_id)
    assert o.status == "pending_payment"
    assert (await goods_of(world, order_id)).reserved_order_id == order_id
    assert (await timer(world, order_id, K.CANCEL_UNPAID)).state == "scheduled"

    world.clock.advance(US)
    assert await world.worker.drain() == 2  # the cancel, then its notice (due at the cancel)
    o = await order(world, order_id)
    assert (o.status, o.cancel_reason, o.cancelled_at) == (
        "cancelled_unpaid",
        "pay_timeout",
        deadline,
    )
    notice = await timer(world, order_id, K.ORDER_CLOSED)
    assert (notice.state, notice.due_at, notice.outcome) == ("done", deadline, "sent")
    g = await goods_of(world, order_id)
    assert (g.status, g.reserved_order_id) == ("on_sale", None)
    t = await timer(world, order_id, K.CANCEL_UNPAID)
    assert (t.state, t.outcome, t.done_at) == ("done", "cancelled", deadline)
    (ev,) = await events(world, order_id, "pay_timeout")
    assert (ev.actor, ev.from_status, ev.to_status) == (
        "timer",
        "pending_payment",
        "cancelled_unpaid",
    )

    # The goods can be bought again.
    again = await order_service.place_order(world.deps, buyer_id=world.other, goods_id=g.id)
    assert (await order(world, again)).status == "pending_payment"


async def test_cancel_unpaid_skips_an_order_paid_while_its_timer_was_claimed(world):
    order_id = await place(world)
    world.clock.advance(timedelta(minutes=30))
    async with world.deps.db.write() as conn:
        claimed = await timers.claim_due(
            conn, now=world.clock.now(), limit=10, lease=world.deps.lease
        )
    await pay(world, order_id)
    await world.worker.run_batch(claimed)
    assert (await order(world, order_id)).status == "pending_shipment"
    t = await timer(world, order_id, K.CANCEL_UNPAID)
    assert (t.state, t.outcome) == (
        "done",
        "skipped: order is pending_shipment (paid before this timer)",
    )
    assert (await goods_of(world, order_id)).status == "sold"


# cancel_unshipped -------------------------------------------------------------------------


async def test_cancel_unshipped_after_three_days(world):
    order_id = await place(world)
    await pay(world, order_id)
    o = await order(world, order_id)
    assert o.ship_deadline == world.clock.now() + timedelta(days=3)
    assert (await timer(world, order_id, K.CANCEL_UNPAID)).state == "cancelled"

    world.clock.set(o.ship_deadline - US)
    assert await world.worker.drain() == 0
    assert (await order(world, order_id)).status == "pending_shipment"

    world.clock.advance(US)
    assert await world.worker.drain() == 2  # the cancel, then its notice
    o = await order(world, order_id)
    assert (o.status, o.cancel_reason) == ("cancelled_unshipped", "ship_timeout")
    assert [(r.kind, r.reason) for r in world.notifier.sent] == [("order_closed", "ship_timeout")]
    (refund,) = await fetch(world, select(refunds).where(refunds.c.order_id == order_id))
    assert (refund.state, refund.reason, refund.amount) == (
        "pending_review",
        "ship_timeout",
        Decimal("12.50"),
    )
    g = await goods_of(world, order_id)
    assert (g.status, g.reserved_order_id) == ("off_sale", None)
    t = await timer(world, order_id, K.CANCEL_UNSHIPPED)
    assert (t.state, t.outcome) == ("done", "cancelled, refund pending review")
    assert len(await events(world, order_id, "ship_timeout")) == 1


# confirm_receipt --------------------------------------------------------------------------


async def test_confirm_receipt_after_ten_days_arms_auto_review(world):
    order_id = await place(world)
    await pay(world, order_id)
    await ship(world, order_id)
    o = await order(world, order_id)
    assert (await timer(world, order_id, K.CANCEL_UNSHIPPED)).state == "cancelled"

    world.clock.set(o.receive_deadline - US)
    assert await world.worker.drain() == 0
    assert (await order(world, order_id)).status == "shipped"

    world.clock.advance(US)
    assert await world.worker.drain() == 1
    now = world.clock.now()
    o = await order(world, order_id)
    assert (o.status, o.received_at) == ("received", now)
    assert o.review_deadline == now + timedelta(days=15)
    t = await timer(world, order_id, K.CONFIRM_RECEIPT)
    assert (t.state, t.outcome) == ("done", "received")
    review = await timer(world, order_id, K.AUTO_REVIEW)
    assert (review.state, review.due_at) == ("scheduled", o.review_deadline)
    assert len(await events(world, order_id, "receive_timeout")) == 1


# auto_review ------------------------------------------------------------------------------


async def test_auto_review_writes_defaults_only_for_roles_without_a_review(world):
    reviewed = await place(world)
    silent = await place(world)
    for order_id in (reviewed, silent):
        await pay(world, order_id)
        await ship(world, order_id)
        await order_service.confirm_receipt(world.deps, order_id=order_id, user_id=world.buyer)
    await order_service.review(
        world.deps, order_id=reviewed, user_id=world.buyer, rating=2, comment="slow"
    )
    deadline = (await order(world, reviewed)).review_deadline
    assert deadline == world.clock.now() + timedelta(days=15)

    world.clock.set(deadline - US)
    assert await world.worker.drain() == 0
    world.clock.advance(US)
    assert await world.worker.drain() == 2

    rows = {
        (r.order_id, r.role): r
        for r in await fetch(
            world, select(reviews).where(reviews.c.order_id.in_([reviewed, silent]))
        )
    }
    assert set(rows) == {
        (reviewed, "buyer"),
        (reviewed, "seller"),
        (silent, "buyer"),
        (silent, "seller"),
    }
    mine = rows[(reviewed, "buyer")]
    assert (mine.rating, mine.comment, mine.is_default) == (2, "slow", False)
    for key in ((reviewed, "seller"), (silent, "buyer"), (silent, "seller")):
        r = rows[key]
        assert (r.rating, r.is_default) == (5, True)
        assert r.author_id == (world.buyer if key[1] == "buyer" else world.seller)
    for order_id in (reviewed, silent):
        o = await order(world, order_id)
        assert (o.status, o.completed_at) == ("completed", world.clock.now())
        t = await timer(world, order_id, K.AUTO_REVIEW)
        assert (t.state, t.outcome) == ("done", "completed with default reviews")


# failures, batches, the loop ----------------------------------------------------------------


async def test_a_failing_handler_puts_its_timers_back_and_the_rest_of_the_batch_completes(world):
    async def boom(deps: Deps, batch: Sequence[Claimed]) -> None:
        raise RuntimeError("provider exploded")

    worker = Worker(world.deps, handlers={**HANDLERS, K.CANCEL_UNPAID: boom})
    early = await place(world)
    world.clock.advance(timedelta(minutes=25))
    late = await place(world)
    world.clock.advance(timedelta(minutes=5))
    now = world.clock.now()
    # Due now: early's reminder and cancel, late's reminder — one batch of two kinds.
    assert await worker.run_once() == 3
    assert worker.stats.failed_batches == 1
    assert worker.stats.reruns == 0  # a failure not known to pass is not run again at once
    assert worker.stats.by_kind == {"pay_reminder": 2, "cancel_unpaid": 1}

    t = await timer(world, early, K.CANCEL_UNPAID)
    assert t.state == "scheduled"
    assert t.attempts == 1
    assert t.due_at == now + timedelta(seconds=30)
    assert t.last_error == "RuntimeError: provider exploded"
    assert (await order(world, early)).status == "pending_payment"

    # The other kind went on: late's reminder sent; early's skipped (its pay deadline is now).
    assert [r.order_id for r in world.notifier.sent] == [late]
    assert (await timer(world, late, K.PAY_REMINDER)).outcome == "sent"
    assert (await timer(world, early, K.PAY_REMINDER)).outcome == ("skipped: pay deadline passed")

    # Once the handler works again, the timer fires after its backoff.
    world.clock.advance(timedelta(seconds=30) - US)
    assert await world.worker.drain() == 0
    world.clock.advance(US)
    assert await world.worker.drain() == 2  # the cancel, then its notice
    o = await order(world, early)
    assert o.status == "cancelled_unpaid"
    t = await timer(world, early, K.CANCEL_UNPAID)
    assert (t.state, t.outcome, t.attempts) == ("done", "cancelled", 2)


TRANSIENT = [BackendUnavailable("the database is unavailable"), Busy("order:1 is busy")]


async def failing_cancel(world, failures: list[Exception]) -> tuple[Worker, int]:
    """A worker whose unpaid cancels raise ``failures`` one by one before they work, and an
    order past its pay deadline."""

    async def flaky(deps: Deps, batch: Sequence[Claimed]) -> None:
        if failures:
            raise failures.pop()
        await HANDLERS[K.CANCEL_UNPAID](deps, batch)

    worker = Worker(world.deps, handlers={**HANDLERS, K.CANCEL_UNPAID: flaky})
    placed = await place(world)
    world.clock.advance(timedelta(minutes=30))
    return worker, placed


@pytest.mark.parametrize("error", TRANSIENT)
async def test_a_handler_failing_on_a_lost_connection_or_a_busy_lock_runs_again_in_place(
    world, error, no_pauses
):
    """A lost connection or a busy lock is usually over a moment later: the handler runs again
    under the same claim, the timer done at its first attempt, not handed back to wait for a
    backoff that grows with the timer's earlier failures (the chaos soak found unpaid cancels
    19-22 s late after pg_terminate_backend, 2 + 4 + 8 s of backoff)."""
    worker, placed = await failing_cancel(world, [error] * len(runner.RERUN_PAUSES))
    await worker.run_once()
    assert (await order(world, placed)).status == "cancelled_unpaid"
    t = await timer(world, placed, K.CANCEL_UNPAID)
    assert (t.state, t.outcome, t.attempts, t.last_error) == ("done", "cancelled", 1, None)
    assert worker.stats.reruns == len(runner.RERUN_PAUSES)
    assert worker.stats.failed_batches == 0


@pytest.mark.parametrize("error", TRANSIENT)
async def test_a_handler_still_failing_after_its_reruns_retries_in_seconds(world, error, no_pauses):
    """Past its reruns in place, the batch goes back and is tried again 2 s later, doubling,
    not after the 30 s backoff of other failures."""
    tries = 1 + len(runner.RERUN_PAUSES)
    worker, placed = await failing_cancel(world, [error] * (2 * tries))
    await worker.drain()
    t = await timer(world, placed, K.CANCEL_UNPAID)
    assert (t.state, t.attempts) == ("scheduled", 1)
    assert t.due_at == world.clock.now() + timedelta(seconds=2)
    assert t.last_error == f"{type(error).__name__}: {error}"
    world.clock.advance(timedelta(seconds=2))
    await worker.drain()
    t = await timer(world, placed, K.CANCEL_UNPAID)
    assert (t.state, t.attempts) == ("scheduled", 2)
    assert t.due_at == world.clock.now() + timedelta(seconds=4)
    world.clock.advance(timedelta(seconds=4))
    await worker.drain()
    assert (await order(world, placed)).status == "cancelled_unpaid"
    assert worker.stats.failed_batches == 2


async def test_a_rerun_in_place_runs_only_the_timers_still_claimed(world, no_pauses):
    """A handler whose first transaction committed (one order cancelled, its timer done)
    before the connection was lost runs again on the rest only: nothing is done twice."""
    seen: list[list[int]] = []

    async def half_then_lost(deps: Deps, batch: Sequence[Claimed]) -> None:
        seen.append([t.order_id for t in batch])
        if len(seen) == 1:
            await HANDLERS[K.CANCEL_UNPAID](deps, batch[:1])
            raise BackendUnavailable("the database is unavailable")
        await HANDLERS[K.CANCEL_UNPAID](deps, batch)

    worker = Worker(world.deps, handlers={**HANDLERS, K.CANCEL_UNPAID: half_then_lost})
    first, second = await place(world), await place(world)
    world.clock.advance(timedelta(minutes=30))
    await worker.run_once()
    assert seen == [[first, second], [second]]
    for placed in (first, second):
        assert (await order(world, placed)).status == "cancelled_unpaid"
        t = await timer(world, placed, K.CANCEL_UNPAID)
        assert (t.state, t.outcome, t.attempts) == ("done", "cancelled", 1)
        assert len(await events(world, placed, "pay_timeout")) == 1


async def test_a_rerun_stops_when_no_timer_of_the_batch_is_still_claimed(world, no_pauses):
    """Timers taken over meanwhile (their lease ran out and another worker claimed them) are
    not this handler's to run again."""
    calls = 0

    async def lost_after_takeover(deps: Deps, batch: Sequence[Claimed]) -> None:
        nonlocal calls
        calls += 1
        async with deps.db.write() as conn:
            await conn.execute(
                update(t_timers)
                .where(t_timers.c.id.in_([t.id for t in batch]))
                .values(claim_token="someone else")
            )
        raise BackendUnavailable("the database is unavailable")

    worker = Worker(world.deps, handlers={**HANDLERS, K.CANCEL_UNPAID: lost_after_takeover})
    placed = await place(world)
    world.clock.advance(timedelta(minutes=30))
    await worker.run_once()
    assert calls == 1
    t = await timer(world, placed, K.CANCEL_UNPAID)
    assert (t.state, t.claim_token, t.last_error) == ("claimed", "someone else", None)
    assert worker.stats.failed_batches == 0


async def test_run_once_respects_the_batch_size(world):
    world.deps.batch_size = 3
    world.deps.max_batch_size = 3
    ids = []
    for _ in range(7):
        ids.append(await place(world))
        world.clock.advance(1)
    world.clock.advance(timedelta(minutes=5))
    assert await world.worker.run_once() == 3
    assert [r.order_id for r in world.notifier.sent] == ids[:3]  # earliest first
    states = [(await timer(world, oid, K.PAY_REMINDER)).state for oid in ids]
    assert states == ["done"] * 3 + ["scheduled"] * 4
    assert world.worker.stats.batches == 1

    assert await world.worker.drain() == 4
    assert world.worker.stats.batches == 3  # 3 + 3 + 1
    assert sorted(r.order_id for r in world.notifier.sent) == ids
    (count,) = await fetch(world, select(func.count()).select_from(reminders))
    assert count[0] == 7


async def test_batches_grow_under_a_backlog_and_shrink_after(world):
    world.deps.batch_size = 2
    world.deps.max_batch_size = 5
    for _ in range(14):
        await place(world)
    world.clock.advance(timedelta(minutes=5))
    sizes = []
    while n := await world.worker.run_once():
        sizes.append(n)
    assert sizes == [2, 4, 5, 3]  # doubled while full, capped at 5, the rest
    assert len(world.notifier.sent) == 14
    await place(world)
    world.clock.advance(timedelta(minutes=5))
    assert await world.worker.run_once() == 1  # back to the normal size: a partial batch


async def wait_for(predicate, seconds: float = 5.0) -> None:
    """Give the worker task time to run (real time only; deadlines move by the FakeClock)."""
    if not await eventually(predicate, seconds):
        raise AssertionError("the worker loop did not get there in time")


async def test_run_loop_sleeps_until_the_due_time_and_wakes(world):
    order_id = await place(world)
    stop = asyncio.Event()
    task = asyncio.create_task(world.worker.run(stop))
    try:
        # Nothing is due: the loop is asleep until the clock moves.
        await wait_for(lambda: world.clock.sleepers == 1)
        assert world.worker.stats.claimed == 0
        assert (await timer(world, order_id, K.PAY_REMINDER)).state == "scheduled"

        world.clock.advance(timedelta(minutes=5))

        async def reminded() -> bool:
            return (await timer(world, order_id, K.PAY_REMINDER)).state == "done"

        await wait_for(reminded)
        assert len(world.notifier.sent) == 1
        assert (await order(world, order_id)).status == "pending_payment"

        world.clock.advance(timedelta(minutes=25))

        async def cancelled() -> bool:
            return (await order(world, order_id)).status == "cancelled_unpaid"

        await wait_for(cancelled)
        assert (await timer(world, order_id, K.CANCEL_UNPAID)).outcome == "cancelled"

        # The cancel's notice is armed after its commit: the loop wakes for it, no clock move.
        async def told() -> bool:
            return (await timer(world, order_id, K.ORDER_CLOSED)).state == "done"

        await wait_for(told)
        assert [r.kind for r in world.notifier.sent] == ["pay_reminder", "order_closed"]
        assert world.worker.stats.claimed == 3
    finally:
        stop.set()
        world.deps.trigger.wake()
        await asyncio.wait_for(task, timeout=5)
    assert task.done() and task.exception() is None


async def test_a_reminder_another_handler_is_sending_is_not_sent_again(world):
    from dueflow.store import aftersale

    order_id = await place(world)
    now = world.clock.now()
    async with world.deps.db.write() as conn:  # another handler claimed it and is sending
        [taken] = await aftersale.claim_reminders(
            conn,
            [order_id],
            kind="pay_reminder",
            now=now,
            lease=timedelta(minutes=10),
            token="other",
        )
    world.clock.advance(timedelta(minutes=5))
    await world.worker.drain()
    assert world.notifier.sent == []
    row = await timer(world, order_id, TimerKind.PAY_REMINDER)
    assert (row.state, row.last_error) == ("scheduled", "being sent by another worker")
    async with world.deps.db.write() as conn:  # the other handler's send returned
        assert await aftersale.settle_reminder(
            conn, taken.id, token="other", sent=True, now=world.clock.now()
        )
    world.clock.advance(timedelta(seconds=30))
    await world.worker.drain()
    assert world.notifier.sent == []
    assert (await timer(world, order_id, TimerKind.PAY_REMINDER)).outcome == "already sent"


async def test_a_reminder_whose_sender_died_is_sent_once_its_lease_runs_out(world):
    from dueflow.store import aftersale

    order_id = await place(world)
    async with world.deps.db.write() as conn:
        await aftersale.claim_reminders(
            conn,
            [order_id],
            kind="pay_reminder",
            now=world.clock.now(),
            lease=timedelta(minutes=1),
            token="dead",
        )
    world.clock.advance(timedelta(minutes=5))  # past the dead sender's lease
    await world.worker.drain()
    assert [r.order_id for r in world.notifier.sent] == [order_id]
