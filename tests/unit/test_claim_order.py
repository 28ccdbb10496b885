"""A worker that is behind claims the must-happen timers first, and still moves the messages."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from sqlalchemy import func, select, text

from dueflow.domain import timers as timer_rules
from dueflow.domain.timers import MESSAGES, MUST_HAPPEN, TimerKind
from dueflow.service import orders as order_service
from dueflow.service.deps import Deps
from dueflow.service.timeouts import HANDLERS, Handler
from dueflow.store import _timers_claims, timers
from dueflow.store.schema import timers as t_timers
from dueflow.store.timers import Claimed
from dueflow.worker.runner import Worker

K = TimerKind
PAST_PAY_DEADLINE = "skipped: pay deadline passed"


def test_every_kind_is_must_happen_or_a_message():
    assert set(TimerKind) == MUST_HAPPEN | MESSAGES
    assert not MUST_HAPPEN & MESSAGES
    assert {K.PAY_REMINDER, K.ORDER_CLOSED, K.CLOSE_ATTEMPTS} == MESSAGES
    assert [timer_rules.due_order_share(n) for n in (1, 4, 200, 2000)] == [1, 1, 10, 100]


def recording(claims: list[list[TimerKind]]) -> dict[TimerKind, Handler]:
    """The handlers, each batch's kinds written down (one list per batch, by the first kind
    that runs: the kinds of a batch run side by side)."""

    def wrap(kind: TimerKind, handler: Handler) -> Handler:
        async def run(deps: Deps, batch: Sequence[Claimed]) -> None:
            claims[-1].extend(kind for _ in batch)
            await handler(deps, batch)

        return run

    return {kind: wrap(kind, handler) for kind, handler in HANDLERS.items()}


async def count(world, query) -> int:
    async with world.deps.db.read() as conn:
        return int((await conn.execute(query)).scalar_one())


async def test_a_backlog_is_claimed_cancels_first_and_the_notices_still_go_out(backend_world):
    world = backend_world
    world.deps.batch_size = world.deps.max_batch_size = 4
    orders = 12
    for _ in range(orders):
        goods_id = await world.goods()
        await order_service.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)
    # The worker fell behind: every reminder and then every pay deadline (30 min) due.
    world.clock.advance(timedelta(minutes=40))
    claims: list[list[TimerKind]] = []
    worker = Worker(world.deps, handlers=recording(claims))
    while True:
        claims.append([])
        if not await worker.run_once():
            claims.pop()
            break

    share = timer_rules.due_order_share(4)
    # The first claim is in due order (the worker does not know yet it is behind): reminders.
    assert claims[0] == [K.PAY_REMINDER] * 4
    # From then on, every claim holds at most its share of messages while cancels are due, and
    # at least that share while messages are due: no cancel waits behind a wall of reminders,
    # and the messages move at a share of every claim.
    cancels_left = orders
    for claim in claims[1:]:
        messages = sum(kind in MESSAGES for kind in claim)
        if cancels_left > len(claim) - share:
            assert messages == share, claims
        cancels_left -= claim.count(K.CANCEL_UNPAID)
    assert cancels_left == 0
    # The last cancel is claimed in the claim ceil(12 / 3) after the first.
    last_cancel = max(i for i, claim in enumerate(claims) if K.CANCEL_UNPAID in claim)
    assert last_cancel == 1 + (orders + (4 - share) - 1) // (4 - share) - 1

    # Every notice went out, once; every reminder went out or was cancelled with its order.
    closed = [r for r in world.notifier.sent if r.kind == K.ORDER_CLOSED.value]
    assert len(closed) == orders == len({r.order_id for r in closed})
    kinds = select(func.count()).select_from(t_timers)
    done = kinds.where(t_timers.c.state == "done")
    assert await count(world, done.where(t_timers.c.kind == K.CANCEL_UNPAID.value)) == orders
    assert await count(world, done.where(t_timers.c.kind == K.ORDER_CLOSED.value)) == orders
    cancelled = kinds.where(t_timers.c.state == "cancelled")
    reminder = t_timers.c.kind == K.PAY_REMINDER.value
    # Past the pay deadline a reminder is not sent; it is finished with the reason.
    async with world.deps.db.read() as conn:
        outcomes = (
            await conn.execute(
                select(t_timers.c.outcome).where(reminder, t_timers.c.state == "done")
            )
        ).scalars()
        finished = sorted(outcomes)
    assert len(finished) >= 4 + share  # the first claim's, and a share of each next one
    assert set(finished) == {PAST_PAY_DEADLINE}
    assert len(finished) + await count(world, cancelled.where(reminder)) == orders
    async with world.deps.db.read() as conn:
        assert await timers.next_due_at(conn) is None


async def test_sqlite_reads_the_must_happen_timers_by_their_index(world):
    """Without statistics SQLite took ix_timers_parked and walked past every message due."""
    query = _timers_claims.must_happen_due(world.clock.now(), 100)
    async with world.deps.db.read() as conn:
        compiled = query.compile(conn.engine, compile_kwargs={"literal_binds": True})
        plan = (await conn.execute(text(f"EXPLAIN QUERY PLAN {compiled}"))).all()
    assert [row[-1] for row in plan] == [
        "SEARCH timers USING INDEX ix_timers_must (state=? AND due_at<?)"
    ]
