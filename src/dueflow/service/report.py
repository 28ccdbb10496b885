"""What operators look at: counts, overdue and stuck timers, lateness, and the invariants."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import and_, func, select

from dueflow.domain.lifecycle import OrderStatus
from dueflow.domain.timers import TimerState
from dueflow.service.deps import Deps
from dueflow.store import aftersale, events, orders, payments, timers
from dueflow.store.schema import goods, reviews
from dueflow.store.schema import orders as t_orders
from dueflow.store.schema import timers as t_timers


@dataclass
class Snapshot:
    """The system at one instant."""

    at: datetime
    orders: dict[str, int]
    timers: dict[str, int]
    overdue: int
    stuck: int
    refunds: dict[str, int]
    discrepancies: int
    #: Order events the events webhook has not delivered yet.
    event_backlog: int = 0


@dataclass
class Invariants:
    """The promises of docs/design.md, checked against the database; each list names offenders."""

    held_by_dead_order: list[int] = field(default_factory=list)
    past_deadline: list[int] = field(default_factory=list)
    reminders_twice: list[int] = field(default_factory=list)
    reviews_twice: list[int] = field(default_factory=list)
    goods_held_twice: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every invariant holds."""
        return not any(vars(self).values())


async def snapshot(deps: Deps) -> Snapshot:
    """Counts by status and state, overdue and stuck timers, refunds and discrepancies."""
    now = deps.clock.now()
    async with deps.db.report() as conn:
        return Snapshot(
            at=now,
            orders=await orders.count_by_status(conn),
            timers=await timers.count_by_state(conn),
            overdue=await timers.overdue(conn, now=now, grace=deps.scan_grace),
            stuck=await timers.stuck(conn),
            refunds=await payments.count_refunds_by_state(conn),
            discrepancies=await payments.count_discrepancies(conn),
            event_backlog=await events.backlog(conn),
        )


async def refund_counts(deps: Deps) -> dict[str, int]:
    """How many refunds are in each state (the snapshot's refunds alone)."""
    async with deps.db.report() as conn:
        return await payments.count_refunds_by_state(conn)


_DEADLINES = {
    OrderStatus.PENDING_PAYMENT: t_orders.c.pay_deadline,
    OrderStatus.PENDING_SHIPMENT: t_orders.c.ship_deadline,
    OrderStatus.SHIPPED: t_orders.c.receive_deadline,
    OrderStatus.RECEIVED: t_orders.c.review_deadline,
}


async def check_invariants(deps: Deps, *, tolerance_seconds: float = 5.0) -> Invariants:
    """Check the promises: nothing held by a dead order, no order left past its deadline (beyond
    ``tolerance_seconds``), no reminder or review twice, no goods held by two live orders."""
    now = deps.clock.now()
    late = now - timedelta(seconds=tolerance_seconds)
    result = Invariants()
    dead = [s.value for s in OrderStatus if s.is_cancelled]
    async with deps.db.report() as conn:
        held = select(goods.c.id).join(t_orders, t_orders.c.id == goods.c.reserved_order_id)
        result.held_by_dead_order = list(
            (await conn.execute(held.where(t_orders.c.status.in_(dead)))).scalars()
        )
        for status, column in _DEADLINES.items():
            query = select(t_orders.c.id).where(t_orders.c.status == status.value, column < late)
            result.past_deadline += list((await conn.execute(query)).scalars())
        # Deliveries, not rows: one row per reminder is a unique key, but one row can be sent
        # more than once (a lease lost mid-batch, a resend after an unanswered send).
        result.reminders_twice = await aftersale.delivered_twice(conn)
        twice = (
            select(reviews.c.order_id)
            .group_by(reviews.c.order_id, reviews.c.role)
            .having(func.count() > 1)
        )
        result.reviews_twice = list((await conn.execute(twice)).scalars())
        live = [s.value for s in OrderStatus if not s.is_cancelled]
        double = (
            select(t_orders.c.goods_id)
            .where(t_orders.c.status.in_(live))
            .group_by(t_orders.c.goods_id)
            .having(func.count() > 1)
        )
        result.goods_held_twice = list((await conn.execute(double)).scalars())
    return result


async def lateness_seconds(deps: Deps) -> list[float]:
    """For every timer done on its first attempt, seconds from its deadline to its firing."""
    async with deps.db.report() as conn:
        query = select(t_timers.c.deadline_at, t_timers.c.done_at).where(
            and_(t_timers.c.state == TimerState.DONE.value, t_timers.c.attempts == 1)
        )
        rows = (await conn.execute(query)).all()
    return sorted((done - deadline).total_seconds() for deadline, done in rows)
