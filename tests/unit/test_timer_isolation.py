"""One order a handler cannot act on holds up no other order of its batch, and is parked after
its attempts (issue 23, item 2): a real database trigger refuses its cancel."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta

from sqlalchemy import select

from dueflow.domain.timers import TimerKind
from dueflow.exceptions import Busy
from dueflow.service import operations
from dueflow.service import orders as order_service
from dueflow.service.deps import Deps
from dueflow.service.timeouts import HANDLERS
from dueflow.store.schema import orders
from dueflow.store.schema import timers as t_timers
from dueflow.store.timers import Claimed
from dueflow.worker import runner
from dueflow.worker.runner import Worker

K = TimerKind

#: A trigger that refuses to cancel one order (``{order_id}``), per dialect.
REFUSE = {
    "sqlite": [
        "CREATE TRIGGER refuse_cancel BEFORE UPDATE OF status ON orders "
        "WHEN NEW.id = {order_id} AND NEW.status = 'cancelled_unpaid' "
        "BEGIN SELECT RAISE(ABORT, 'order refused by a trigger'); END"
    ],
    "postgresql": [
        "CREATE OR REPLACE FUNCTION refuse_cancel() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN IF NEW.id = {order_id} AND NEW.status = 'cancelled_unpaid' THEN "
        "RAISE EXCEPTION 'order refused by a trigger'; END IF; RETURN NEW; END $$",
        "CREATE TRIGGER refuse_cancel BEFORE UPDATE ON orders "
        "FOR EACH ROW EXECUTE FUNCTION refuse_cancel()",
    ],
    "mysql": [
        "CREATE TRIGGER refuse_cancel BEFORE UPDATE ON orders FOR EACH ROW BEGIN "
        "IF NEW.id = {order_id} AND NEW.status = 'cancelled_unpaid' THEN "
        "SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'order refused by a trigger'; END IF; END"
    ],
}
ALLOW = {
    "sqlite": ["DROP TRIGGER IF EXISTS refuse_cancel"],
    "postgresql": [
        "DROP TRIGGER IF EXISTS refuse_cancel ON orders",
        "DROP FUNCTION IF EXISTS refuse_cancel()",
    ],
    "mysql": ["DROP TRIGGER IF EXISTS refuse_cancel"],
}


async def _run(world, statements: list[str]) -> None:
    async with world.deps.db.engine.begin() as conn:
        for statement in statements:
            await conn.exec_driver_sql(statement)


@contextlib.asynccontextmanager
async def refusing_cancel(world, order_id: int) -> AsyncIterator[None]:
    """While the block runs, the database refuses to cancel ``order_id``."""
    dialect = "mysql" if world.deps.db.dialect in ("mysql", "mariadb") else world.deps.db.dialect
    await _run(world, ALLOW[dialect])
    await _run(world, [s.format(order_id=order_id) for s in REFUSE[dialect]])
    try:
        yield
    finally:
        await _run(world, ALLOW[dialect])


async def fetch(world, query):
    async with world.deps.db.read() as conn:
        return list((await conn.execute(query)).all())


async def cancel_timer(world, order_id: int):
    (row,) = await fetch(
        world,
        select(t_timers).where(
            t_timers.c.order_id == order_id, t_timers.c.kind == K.CANCEL_UNPAID.value
        ),
    )
    return row


async def status(world, order_id: int) -> str:
    (row,) = await fetch(world, select(orders.c.status).where(orders.c.id == order_id))
    return str(row.status)


async def test_one_refused_order_holds_up_no_other_and_is_parked_after_its_attempts(
    backend_world, no_pauses
):
    """30 unpaid orders due within one second, one of them refused by a database trigger: the
    29 others are cancelled at their deadline, in the same run; the refused one is retried with
    backoff alone, parked on its last attempt, and cancelled once an operator runs it again."""
    world = backend_world
    placed = []
    for _ in range(30):
        goods_id = await world.goods()
        placed.append(
            await order_service.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)
        )
        world.clock.advance(timedelta(milliseconds=33))
    refused = placed[17]
    others = [order_id for order_id in placed if order_id != refused]
    world.clock.advance(timedelta(minutes=30))  # every pay deadline has passed, within 1 s
    now = world.clock.now()

    async with refusing_cancel(world, refused):
        await world.worker.drain()
        for order_id in others:
            assert await status(world, order_id) == "cancelled_unpaid"
            timer = await cancel_timer(world, order_id)
            assert (timer.state, timer.outcome, timer.attempts) == ("done", "cancelled", 1)
            assert timer.done_at == now
            assert timer.done_at - timer.deadline_at < timedelta(seconds=1)
        timer = await cancel_timer(world, refused)
        assert (timer.state, timer.attempts) == ("scheduled", 1)
        assert timer.due_at > now
        assert await status(world, refused) == "pending_payment"

        # Retried alone, with backoff, until its last attempt parks it.
        while timer.state == "scheduled":
            world.clock.advance(timer.due_at - world.clock.now())
            await world.worker.drain()
            timer = await cancel_timer(world, refused)
        max_attempts = world.deps.timer_max_attempts
        assert (timer.state, timer.attempts) == ("parked", max_attempts)
        assert timer.last_error
        assert timer.claim_token is None
        assert await status(world, refused) == "pending_payment"
        assert world.worker.stats.parked == 1
        # Parked: no worker takes it again, however long it waits.
        world.clock.advance(timedelta(days=1))
        assert await world.worker.drain() == 0
        assert (await cancel_timer(world, refused)).state == "parked"
        summary = await operations.summary(world.deps)
        assert summary["timers"]["parked"] == 1

    # The cause fixed (the trigger dropped), an operator runs it again: the order is cancelled.
    await operations.run_timer_now(world.deps, timer.id, actor="test")
    await world.worker.drain()
    assert await status(world, refused) == "cancelled_unpaid"
    timer = await cancel_timer(world, refused)
    assert (timer.state, timer.outcome) == ("done", "cancelled")


async def _unpaid_past_deadline(world, n: int) -> list[int]:
    placed = [
        await order_service.place_order(
            world.deps, buyer_id=world.buyer, goods_id=await world.goods()
        )
        for _ in range(n)
    ]
    world.clock.advance(timedelta(minutes=30))
    return placed


async def test_a_busy_share_goes_back_whole_without_splitting(world, no_pauses):
    """A busy lock is no one order's doing: past its reruns in place the share goes back whole,
    due again in seconds, each half never run (on MariaDB each run waits out the lock)."""
    seen: list[list[int]] = []

    async def busy(deps: Deps, batch: Sequence[Claimed]) -> None:
        seen.append([t.order_id for t in batch])
        raise Busy("order:1 is busy")

    worker = Worker(world.deps, handlers={**HANDLERS, K.CANCEL_UNPAID: busy})
    placed = await _unpaid_past_deadline(world, 4)
    await worker.run_once()
    assert seen == [placed] * (1 + len(runner.RERUN_PAUSES))
    assert worker.stats.splits == 0
    for order_id in placed:
        timer = await cancel_timer(world, order_id)
        assert (timer.state, timer.last_error) == ("scheduled", "Busy: order:1 is busy")
        assert timer.due_at == world.clock.now() + timedelta(seconds=2)


async def test_the_split_stops_at_its_budget_and_hands_the_rest_back_whole(world):
    """Each run of the handler takes a third of a lease of real time: one lease after the first
    failure the split stops, and what it has not run yet goes back whole."""
    lease = world.deps.lease.total_seconds()
    now = [0.0]
    seen: list[list[int]] = []
    placed = await _unpaid_past_deadline(world, 8)
    bad = placed[5]

    async def slow(deps: Deps, batch: Sequence[Claimed]) -> None:
        seen.append([t.order_id for t in batch])
        now[0] += lease / 3
        if bad in [t.order_id for t in batch]:
            raise RuntimeError("a bug trips on this order")
        await HANDLERS[K.CANCEL_UNPAID](deps, batch)

    worker = Worker(
        world.deps, handlers={**HANDLERS, K.CANCEL_UNPAID: slow}, monotonic=lambda: now[0]
    )
    await worker.run_once()
    # The whole, its halves, then [4, 5]; one lease has passed: [4], [5], [6, 7] are not run.
    assert seen == [placed, placed[:4], placed[4:], placed[4:6]]
    for order_id in placed[:4]:
        assert await status(world, order_id) == "cancelled_unpaid"
    for order_id in placed[4:]:
        timer = await cancel_timer(world, order_id)
        assert (timer.state, timer.last_error) == (
            "scheduled",
            "RuntimeError: a bug trips on this order",
        )
        assert await status(world, order_id) == "pending_payment"


async def test_a_failure_of_every_order_costs_a_bounded_number_of_runs(world):
    """A handler failing on every order (a code error) is not run on every half down to each
    timer (2n - 1 runs): the split spends its runs and hands the rest back whole."""
    runs = 0

    async def broken(deps: Deps, batch: Sequence[Claimed]) -> None:
        nonlocal runs
        runs += 1
        raise RuntimeError("a bug trips on every order")

    worker = Worker(world.deps, handlers={**HANDLERS, K.CANCEL_UNPAID: broken})
    placed = await _unpaid_past_deadline(world, 16)
    await worker.run_once()
    assert runs == 1 + runner.SPLIT_RUNS_PER_BIT * len(placed).bit_length() < 2 * len(placed) - 1
    for order_id in placed:
        timer = await cancel_timer(world, order_id)
        assert (timer.state, timer.attempts) == ("scheduled", 1)
