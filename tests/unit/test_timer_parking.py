"""Parking counts a handler's failures in a row, not claims; an order move cancels a parked
timer, schedule_again revives one, and park() touches only claims still ours (issue 23,
item 2 review)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import select, update

from dueflow.domain.timers import TimerKind, quick_backoff
from dueflow.exceptions import Busy
from dueflow.payments.base import RefundOutcome, RefundResult
from dueflow.service import orders as order_service
from dueflow.service import refunds
from dueflow.service.deps import Deps
from dueflow.service.payments import record_manual_payment
from dueflow.service.timeouts import HANDLERS
from dueflow.store import timers
from dueflow.store.schema import timers as t_timers
from dueflow.store.timers import Claimed
from dueflow.worker import runner
from dueflow.worker.runner import Worker
from tests.unit.test_refunds import ScriptedProvider, unshipped_refund, use

K = TimerKind


async def place(world) -> int:
    return await order_service.place_order(
        world.deps, buyer_id=world.buyer, goods_id=await world.goods()
    )


async def timer_of(world, order_id: int, kind: TimerKind):
    async with world.deps.db.read() as conn:
        query = select(t_timers).where(
            t_timers.c.order_id == order_id, t_timers.c.kind == kind.value
        )
        return (await conn.execute(query)).one()


async def boom(deps: Deps, batch: Sequence[Claimed]) -> None:
    raise RuntimeError("a bug trips on this order")


async def parked(world, order_id: int, kind: TimerKind) -> None:
    """Park the order's ``kind`` timer the way the worker does: its handler fails on it, here
    on its first failure (timer_max_attempts 1)."""
    world.deps.timer_max_attempts = 1
    try:
        row = await timer_of(world, order_id, kind)
        world.clock.advance(max(row.due_at - world.clock.now(), timedelta(0)))
        await Worker(world.deps, handlers={**HANDLERS, kind: boom}).drain()
    finally:
        world.deps.timer_max_attempts = 20
    assert (await timer_of(world, order_id, kind)).state == "parked"


async def test_a_handlers_own_retries_are_no_failures_and_park_nothing(world):
    """A timer claimed and retried by its handler many times (a payment state unknown, a
    refund still processing) is not parked at its first failure; at max failures in a row it
    is, and a retry of its handler's own in between starts the count again."""
    last = world.deps.timer_max_attempts
    script = ["retry"] * (last + 5) + ["fail"] * (last - 1) + ["retry"] + ["fail"] * last

    async def scripted(deps: Deps, batch: Sequence[Claimed]) -> None:
        if script.pop(0) == "fail":
            raise RuntimeError("a bug trips on this order")
        async with deps.db.write() as conn:
            await timers.retry(
                conn,
                batch,
                error="payment state unknown",
                now=deps.clock.now(),
                delay=quick_backoff,
            )

    worker = Worker(world.deps, handlers={**HANDLERS, K.CANCEL_UNPAID: scripted})
    order_id = await place(world)
    world.clock.advance(timedelta(minutes=30))
    states = []
    row = await timer_of(world, order_id, K.CANCEL_UNPAID)
    while script and row.state == "scheduled":
        states.append((row.state, row.failures))
        world.clock.advance(max(row.due_at - world.clock.now(), timedelta(0)))
        await worker.drain()
        row = await timer_of(world, order_id, K.CANCEL_UNPAID)
    assert not script
    assert (row.state, row.failures, row.attempts) == ("parked", last, 3 * last + 5)
    assert ("scheduled", 1) in states  # the first failure, after last + 5 claims
    assert ("scheduled", last - 1) in states and ("scheduled", 0) in states
    assert worker.stats.parked == 1


async def test_a_payment_cancels_a_parked_timer(world):
    order_id = await place(world)
    await parked(world, order_id, K.CANCEL_UNPAID)
    await record_manual_payment(world.deps, order_id=order_id, amount="12.50")
    row = await timer_of(world, order_id, K.CANCEL_UNPAID)
    assert (row.state, row.outcome) == ("cancelled", "order moved on")


async def test_a_buyer_cancel_cancels_a_parked_timer(world):
    order_id = await place(world)
    await parked(world, order_id, K.CANCEL_UNPAID)
    await order_service.cancel_by_buyer(world.deps, order_id=order_id, user_id=world.buyer)
    row = await timer_of(world, order_id, K.CANCEL_UNPAID)
    assert (row.state, row.outcome) == ("cancelled", "order moved on")


async def test_a_refund_becoming_final_cancels_its_parked_check(world):
    use(world, ScriptedProvider([RefundResult.PROCESSING]))
    order_id, refund_id = await unshipped_refund(world, "scripted")
    assert await refunds.approve(world.deps, refund_id) == "processing"
    await parked(world, order_id, K.REFUND_CHECK)
    [refund] = [r for r in await refunds.list_refunds(world.deps) if r["id"] == refund_id]
    outcome = RefundOutcome(RefundResult.SUCCEEDED, "done")
    assert await refunds.record_answer(world.deps, refund["refund_no"], outcome) == "succeeded"
    row = await timer_of(world, order_id, K.REFUND_CHECK)
    assert (row.state, row.outcome) == ("cancelled", "refunds final")


async def test_schedule_again_revives_a_parked_timer(world):
    order_id = await place(world)
    await parked(world, order_id, K.CANCEL_UNPAID)
    due = world.clock.now() + timedelta(minutes=5)
    async with world.deps.db.write() as conn:
        armed = await timers.schedule_again(conn, order_id, K.CANCEL_UNPAID, due, world.clock.now())
    row = await timer_of(world, order_id, K.CANCEL_UNPAID)
    assert [a.id for a in armed] == [row.id]
    assert (row.state, row.due_at, row.attempts, row.failures) == ("scheduled", due, 0, 0)
    assert (row.outcome, row.last_error, row.done_at) == (None, None, None)


async def test_park_does_nothing_once_the_claim_token_is_lost(world):
    order_id = await place(world)
    world.clock.advance(timedelta(minutes=30))
    async with world.deps.db.write() as conn:
        claimed = await timers.claim_due(
            conn, now=world.clock.now(), limit=10, lease=world.deps.lease
        )
        [claim] = [c for c in claimed if c.kind == K.CANCEL_UNPAID]
        await conn.execute(
            update(t_timers).where(t_timers.c.id == claim.id).values(claim_token="someone else")
        )
    async with world.deps.db.write() as conn:
        assert await timers.park(conn, [claim], error="boom", now=world.clock.now()) == []
    row = await timer_of(world, order_id, K.CANCEL_UNPAID)
    assert (row.state, row.claim_token, row.failures, row.last_error) == (
        "claimed",
        "someone else",
        0,
        None,
    )


async def test_only_the_timers_park_parked_are_logged_and_counted(world, no_pauses, caplog):
    """A timer taken over while its handler failed is not parked by us: no line, no count."""
    world.deps.timer_max_attempts = 1
    first, second = await place(world), await place(world)
    world.clock.advance(timedelta(minutes=30))
    runs = 0

    async def busy_after_takeover(deps: Deps, batch: Sequence[Claimed]) -> None:
        nonlocal runs
        runs += 1
        if runs == 1 + len(runner.RERUN_PAUSES):  # the last try: the second is taken over
            async with deps.db.write() as conn:
                await conn.execute(
                    update(t_timers)
                    .where(t_timers.c.order_id == second)
                    .values(claim_token="someone else")
                )
        raise Busy("order:1 is busy")

    worker = Worker(world.deps, handlers={**HANDLERS, K.CANCEL_UNPAID: busy_after_takeover})
    with caplog.at_level(logging.ERROR, logger="dueflow.worker.runner"):
        await worker.run_once()
    kept = await timer_of(world, first, K.CANCEL_UNPAID)
    taken = await timer_of(world, second, K.CANCEL_UNPAID)
    assert (kept.state, taken.state, taken.claim_token) == ("parked", "claimed", "someone else")
    assert worker.stats.parked == 1
    lines = [r.getMessage() for r in caplog.records if " parked after " in r.getMessage()]
    assert len(lines) == 1
    assert f"timer {kept.id} of order {first} parked" in lines[0]
