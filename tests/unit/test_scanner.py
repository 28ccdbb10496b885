"""The scanner: what the trigger missed (past a grace) and expired leases, fired exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import select

from dueflow.domain.timers import TimerKind
from dueflow.exceptions import BackendUnavailable
from dueflow.service import orders as order_service
from dueflow.service.deps import Deps
from dueflow.service.reminders import pay_reminder
from dueflow.service.timeouts import HANDLERS
from dueflow.store import timers
from dueflow.store.schema import order_events, orders
from dueflow.store.schema import timers as t_timers
from dueflow.store.timers import Claimed
from dueflow.worker.runner import Worker
from dueflow.worker.scanner import ScanReport, run_scanner, scan_once
from tests.conftest import eventually

K = TimerKind
US = timedelta(microseconds=1)


async def place(world) -> int:
    goods_id = await world.goods()
    return await order_service.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)


async def fetch(world, query):
    async with world.deps.db.read() as conn:
        return list((await conn.execute(query)).all())


async def timer(world, order_id: int, kind: TimerKind):
    (row,) = await fetch(
        world,
        select(t_timers).where(t_timers.c.order_id == order_id, t_timers.c.kind == kind.value),
    )
    return row


async def status(world, order_id: int) -> str:
    (row,) = await fetch(world, select(orders.c.status).where(orders.c.id == order_id))
    return str(row.status)


async def test_scan_fires_timers_past_the_grace_and_skips_those_within(world):
    assert world.deps.scan_grace == timedelta(seconds=5)
    first = await place(world)
    world.clock.advance(3)
    second = await place(world)
    # first's reminder is 5 s + 1 µs overdue; second's only 2 s + 1 µs: within the grace.
    world.clock.advance(timedelta(minutes=5, seconds=2) + US)

    report = await scan_once(world.worker)
    assert (report.claimed, report.batches, report.failed_batches, report.errors) == (1, 1, 0, 0)
    assert report.seconds >= 0
    assert [r.order_id for r in world.notifier.sent] == [first]
    assert (await timer(world, first, K.PAY_REMINDER)).outcome == "sent"
    assert (await timer(world, second, K.PAY_REMINDER)).state == "scheduled"

    world.clock.advance(3)
    report = await scan_once(world.worker)
    assert (report.claimed, report.batches) == (1, 1)
    assert [r.order_id for r in world.notifier.sent] == [first, second]

    report = await scan_once(world.worker)
    assert report == ScanReport(seconds=report.seconds)
    assert len(world.notifier.sent) == 2


async def test_scan_walks_in_batches(world):
    world.deps.batch_size = 2
    ids = [await place(world) for _ in range(5)]
    world.clock.advance(timedelta(minutes=6))
    report = await scan_once(world.worker)
    assert (report.claimed, report.batches, report.failed_batches) == (5, 3, 0)
    assert sorted(r.order_id for r in world.notifier.sent) == ids
    for order_id in ids:
        assert (await timer(world, order_id, K.PAY_REMINDER)).state == "done"
        assert (await timer(world, order_id, K.CANCEL_UNPAID)).state == "scheduled"


async def test_expired_lease_is_reclaimed_and_finished_exactly_once(world):
    order_id = await place(world)
    world.clock.advance(timedelta(minutes=30))
    # A worker claims both timers of the order and dies.
    async with world.deps.db.write() as conn:
        dead = await timers.claim_due(conn, now=world.clock.now(), limit=10, lease=world.deps.lease)
    assert {c.kind for c in dead} == {K.PAY_REMINDER, K.CANCEL_UNPAID}

    # While the lease holds, the scanner leaves the claims alone.
    world.clock.advance(world.deps.lease - US)
    report = await scan_once(world.worker)
    assert report.claimed == 0
    assert await status(world, order_id) == "pending_payment"

    world.clock.advance(US)
    report = await scan_once(world.worker)
    assert (report.claimed, report.failed_batches) == (2, 0)
    assert await status(world, order_id) == "cancelled_unpaid"
    cancel = await timer(world, order_id, K.CANCEL_UNPAID)
    assert (cancel.state, cancel.outcome, cancel.attempts) == ("done", "cancelled", 2)
    remind = await timer(world, order_id, K.PAY_REMINDER)
    assert remind.state == "done" and remind.outcome.startswith("skipped")

    # The dead worker comes back and runs its stale batch: its claim is no fence any more.
    await world.worker.run_batch(dead)
    assert (await timer(world, order_id, K.CANCEL_UNPAID)).attempts == 2
    assert (await scan_once(world.worker)).claimed == 0
    assert await world.worker.drain() == 1  # the one notice of the one cancel

    cancellations = await fetch(
        world,
        select(order_events).where(
            order_events.c.order_id == order_id, order_events.c.to_status == "cancelled_unpaid"
        ),
    )
    assert len(cancellations) == 1
    assert cancellations[0].event == "pay_timeout"
    assert [(r.kind, r.reason) for r in world.notifier.sent] == [("order_closed", "pay_timeout")]
    notices = await fetch(
        world,
        select(t_timers).where(t_timers.c.order_id == order_id, t_timers.c.kind == "order_closed"),
    )
    assert [(t.state, t.outcome) for t in notices] == [("done", "sent")]


async def test_a_failing_batch_does_not_stop_the_pass(world):
    world.deps.batch_size = 1
    ids = [await place(world) for _ in range(3)]
    bad = ids[1]

    async def flaky(deps: Deps, batch: Sequence[Claimed]) -> None:
        if any(t.order_id == bad for t in batch):
            raise RuntimeError("provider exploded")
        await pay_reminder(deps, batch)

    worker = Worker(world.deps, handlers={**HANDLERS, K.PAY_REMINDER: flaky})
    world.clock.advance(timedelta(minutes=6))
    now = world.clock.now()
    report = await scan_once(worker)
    assert (report.claimed, report.batches, report.failed_batches, report.errors) == (3, 3, 1, 0)
    assert [r.order_id for r in world.notifier.sent] == [ids[0], ids[2]]
    t = await timer(world, bad, K.PAY_REMINDER)
    assert t.state == "scheduled"
    assert t.due_at == now + timedelta(seconds=30)
    assert t.last_error == "RuntimeError: provider exploded"

    # Backed off past the grace: the next pass takes it (and the handler now works).
    world.clock.advance(timedelta(seconds=36))
    report = await scan_once(world.worker)
    assert (report.claimed, report.failed_batches) == (1, 0)
    assert sorted(r.order_id for r in world.notifier.sent) == sorted(ids)


async def test_the_cutoff_is_fixed_at_the_start_of_the_pass(world):
    world.deps.batch_size = 1
    first = await place(world)
    world.clock.advance(timedelta(minutes=1))
    second = await place(world)

    async def slow(deps: Deps, batch: Sequence[Claimed]) -> None:
        await pay_reminder(deps, batch)
        world.clock.advance(timedelta(minutes=10))  # a long batch: second becomes overdue

    worker = Worker(world.deps, handlers={**HANDLERS, K.PAY_REMINDER: slow})
    world.clock.advance(timedelta(minutes=4, seconds=10))  # first's reminder 10 s overdue
    report = await scan_once(worker)
    assert report.claimed == 1
    assert [r.order_id for r in world.notifier.sent] == [first]
    assert (await timer(world, second, K.PAY_REMINDER)).state == "scheduled"

    report = await scan_once(world.worker)
    assert report.claimed == 1  # the next pass has a new cutoff
    assert (await timer(world, second, K.PAY_REMINDER)).state == "done"


async def test_a_claim_error_ends_the_pass_and_is_counted(world, monkeypatch):
    await place(world)
    world.clock.advance(timedelta(minutes=6))

    async def broken(*args: object, **kwargs: object) -> None:
        raise BackendUnavailable("database gone")

    monkeypatch.setattr(timers, "claim_overdue", broken)
    report = await scan_once(world.worker)
    assert (report.claimed, report.batches, report.errors) == (0, 0, 1)
    monkeypatch.undo()
    report = await scan_once(world.worker)
    assert (report.claimed, report.errors) == (1, 0)


async def test_scanner_and_worker_never_both_act(world):
    """A timer the worker is running (live lease) is not the scanner's; done ones neither."""
    order_id = await place(world)
    world.clock.advance(timedelta(minutes=31))
    async with world.deps.db.write() as conn:
        held = await timers.claim_due(conn, now=world.clock.now(), limit=10, lease=world.deps.lease)
    assert (await scan_once(world.worker)).claimed == 0
    await world.worker.run_batch(held)
    assert await status(world, order_id) == "cancelled_unpaid"
    world.clock.advance(world.deps.lease * 2)
    # only the cancel's notice is overdue now (no worker ran to take it when it was armed)
    assert (await scan_once(world.worker)).claimed == 1
    assert (await timer(world, order_id, K.ORDER_CLOSED)).outcome == "sent"
    assert (await timer(world, order_id, K.CANCEL_UNPAID)).attempts == 1
    assert (await scan_once(world.worker)).claimed == 0


async def test_run_scanner_scans_at_start_and_every_interval(world):
    order_id = await place(world)
    world.clock.advance(timedelta(minutes=6))
    stop = asyncio.Event()
    task = asyncio.create_task(run_scanner(world.worker, stop))
    try:
        await eventually(lambda: world.notifier.sent)  # lets the task run; no deadline waited
        assert [r.order_id for r in world.notifier.sent] == [order_id]
        assert await status(world, order_id) == "pending_payment"
        # the scanner is asleep until its next interval before the clock moves past it
        await eventually(lambda: world.clock.sleepers == 1)

        world.clock.advance(timedelta(minutes=25))  # past the pay deadline and an interval
        await eventually(lambda: _is(world, order_id, "cancelled_unpaid"))
        assert await status(world, order_id) == "cancelled_unpaid"
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=5)
    assert (await timer(world, order_id, K.CANCEL_UNPAID)).outcome == "cancelled"


async def _is(world, order_id: int, wanted: str) -> bool:
    return await status(world, order_id) == wanted


async def test_a_dead_workers_claims_come_back_when_their_lease_ends_not_at_the_next_interval(
    world,
):
    world.deps.scan_interval = timedelta(minutes=5)
    order_id = await place(world)
    world.clock.advance(timedelta(minutes=6))
    # A worker claims the due reminder and dies (killed, or frozen past its lease).
    async with world.deps.db.write() as conn:
        dead = await timers.claim_due(conn, now=world.clock.now(), limit=10, lease=world.deps.lease)
    assert [c.kind for c in dead] == [K.PAY_REMINDER]
    lease_end = world.clock.now() + world.deps.lease
    stop = asyncio.Event()
    task = asyncio.create_task(run_scanner(world.worker, stop))
    try:
        # The first pass finds the claim still held; the scanner sleeps, reading the leases a
        # quarter lease apart, until the lease ends (not until its interval, 5 min away).
        await eventually(lambda: world.clock.sleepers == 1)
        assert world.notifier.sent == []
        world.clock.set(lease_end)
        await eventually(lambda: world.notifier.sent)
        assert [r.order_id for r in world.notifier.sent] == [order_id]
        assert world.worker.stats.lease_wakes == 1
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=5)
    row = await timer(world, order_id, K.PAY_REMINDER)
    # Taken back and sent at the lease's end: a lease after the dead claim, to the microsecond.
    assert (row.state, row.outcome, row.attempts, row.done_at) == ("done", "sent", 2, lease_end)


async def test_a_lease_renewed_meanwhile_is_read_again_and_left_alone(world):
    world.deps.scan_interval = timedelta(minutes=5)
    order_id = await place(world)
    world.clock.advance(timedelta(minutes=6))
    async with world.deps.db.write() as conn:
        held = await timers.claim_due(conn, now=world.clock.now(), limit=10, lease=world.deps.lease)
    stop = asyncio.Event()
    task = asyncio.create_task(run_scanner(world.worker, stop))
    try:
        await eventually(lambda: world.clock.sleepers == 1)
        # Its worker is alive: it renews the lease a third of a lease on, as leases.holding does.
        world.clock.advance(world.deps.lease / 3)
        async with world.deps.db.write() as conn:
            renewed_end = world.clock.now() + world.deps.lease
            assert await timers.extend_lease(conn, held, until=renewed_end) == 1
        world.clock.advance(world.deps.lease * 2 / 3)  # the first lease's end: renewed, kept
        await eventually(lambda: world.clock.sleepers == 1)
        assert world.notifier.sent == []
        world.clock.set(renewed_end)  # then the worker died: taken back at the renewed end
        await eventually(lambda: world.notifier.sent)
        assert world.worker.stats.lease_wakes == 1
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=5)
    row = await timer(world, order_id, K.PAY_REMINDER)
    assert (row.state, row.outcome, row.done_at) == ("done", "sent", renewed_end)
