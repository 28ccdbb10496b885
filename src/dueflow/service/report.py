"""What operators look at: counts, overdue and stuck timers, lateness, and the invariants."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain.lifecycle import OrderStatus
from dueflow.domain.timers import TimerState
from dueflow.service import shop_checks
from dueflow.service.deps import Deps
from dueflow.store import aftersale, events, holds, orders, payments, timers
from dueflow.store import shows as show_store
from dueflow.store.schema import (
    flash_sales,
    goods,
    reviews,
    seat_holds,
    seats,
    show_buyers,
    shows,
    skus,
)
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
    #: When the longest-processing refund was submitted; None if no refund is processing.
    refund_processing_since: datetime | None = None

    @property
    def refund_processing_seconds(self) -> float:
        """How long the longest-processing refund has been processing (0: none is)."""
        since = self.refund_processing_since
        return 0.0 if since is None else max(0.0, (self.at - since).total_seconds())


@dataclass
class Invariants:
    """The promises of docs/design.md, checked against the database; each list names offenders."""

    held_by_dead_order: list[int] = field(default_factory=list)
    past_deadline: list[int] = field(default_factory=list)
    reminders_twice: list[int] = field(default_factory=list)
    reviews_twice: list[int] = field(default_factory=list)
    goods_held_twice: list[int] = field(default_factory=list)
    #: Orders of a dead (cancelled) status still holding a seat.
    seats_held_by_dead_order: list[int] = field(default_factory=list)
    #: Seats (ids) held or sold twice (the unique key forbids it: this checks the key is there).
    seats_held_twice: list[int] = field(default_factory=list)
    #: Shows (ids) where a buyer's counted seats differ from the seats they hold, or pass the
    #: show's limit.
    seat_limits_broken: list[int] = field(default_factory=list)
    #: SKUs (ids) whose counts are negative or do not add up: stock + held + sold != stocked.
    units_unbalanced: list[int] = field(default_factory=list)
    #: SKUs (ids) whose held units differ from the units of their unpaid orders (held by a
    #: dead order, or a live order's units not held).
    units_held_by_dead_order: list[int] = field(default_factory=list)
    #: SKUs (ids) whose sold units differ from the units of their paid orders.
    units_sold_unpaid: list[int] = field(default_factory=list)
    #: The same three promises for flash sales (ids).
    flash_units_unbalanced: list[int] = field(default_factory=list)
    flash_units_held_by_dead_order: list[int] = field(default_factory=list)
    flash_units_sold_unpaid: list[int] = field(default_factory=list)
    #: Flash sales (ids) where a buyer's counted units differ from the units of the buyer's
    #: unpaid and paid orders, or pass the sale's per-buyer limit.
    flash_limits_broken: list[int] = field(default_factory=list)
    #: Coupons (ids) locked by an order that no longer awaits payment.
    coupons_locked_by_dead_order: list[int] = field(default_factory=list)
    #: Coupons (ids) used by an order that was never paid.
    coupons_used_by_unpaid_order: list[int] = field(default_factory=list)
    #: Coupons (ids) on the lines of two orders that took them (neither cancelled unpaid).
    coupons_used_twice: list[int] = field(default_factory=list)
    #: Orders (ids) with a coupon's discount that do not hold the coupon, or holding a coupon
    #: without its discount on their lines.
    coupons_not_with_their_order: list[int] = field(default_factory=list)
    #: Cancelled orders (ids) without exactly one order_closed notice (timer and reminder row).
    cancels_not_notified: list[int] = field(default_factory=list)

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
            refund_processing_since=await payments.processing_since(conn),
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
            .where(t_orders.c.status.in_(live), t_orders.c.goods_id.is_not(None))
            .group_by(t_orders.c.goods_id)
            .having(func.count() > 1)
        )
        result.goods_held_twice = list((await conn.execute(double)).scalars())
        await _check_seats(conn, result, dead)
        await _check_shop(conn, result, dead)
    return result


async def _check_seats(conn: AsyncConnection, result: Invariants, dead: list[str]) -> None:
    """The seat promises: no seat held by a dead order or twice, every buyer's count equal to
    the seats they hold and within the show's limit."""
    by_dead = (
        select(seat_holds.c.order_id)
        .join(t_orders, t_orders.c.id == seat_holds.c.order_id)
        .where(t_orders.c.status.in_(dead))
        .distinct()
    )
    result.seats_held_by_dead_order = list((await conn.execute(by_dead)).scalars())
    twice = select(seat_holds.c.seat_id).group_by(seat_holds.c.seat_id).having(func.count() > 1)
    result.seats_held_twice = list((await conn.execute(twice)).scalars())
    held = (
        select(seat_holds.c.show_id, seat_holds.c.buyer_id, func.count().label("n"))
        .group_by(seat_holds.c.show_id, seat_holds.c.buyer_id)
        .subquery()
    )
    counted = (
        select(show_buyers.c.show_id)
        .join(shows, shows.c.id == show_buyers.c.show_id)
        .outerjoin(
            held,
            (held.c.show_id == show_buyers.c.show_id) & (held.c.buyer_id == show_buyers.c.buyer_id),
        )
        .where(
            (func.coalesce(held.c.n, 0) != show_buyers.c.seats)
            | (show_buyers.c.seats > shows.c.seat_limit)
        )
        .distinct()
    )
    result.seat_limits_broken = list((await conn.execute(counted)).scalars())


async def _check_shop(conn: AsyncConnection, result: Invariants, dead: list[str]) -> None:
    """The shop promises (:mod:`dueflow.service.shop_checks`): units, flash sale counts,
    coupons, and a notice for every cancelled order (of every flow)."""
    (
        result.units_unbalanced,
        result.units_held_by_dead_order,
        result.units_sold_unpaid,
    ) = await shop_checks.units_promises(conn, skus, holds.SkuHold.kind)
    (
        result.flash_units_unbalanced,
        result.flash_units_held_by_dead_order,
        result.flash_units_sold_unpaid,
    ) = await shop_checks.units_promises(conn, flash_sales, holds.FlashHold.kind)
    result.flash_limits_broken = await shop_checks.flash_limits_broken(conn)
    result.coupons_locked_by_dead_order = await shop_checks.coupons_locked_by_dead_order(conn)
    result.coupons_used_by_unpaid_order = await shop_checks.coupons_used_by_unpaid_order(conn)
    result.coupons_used_twice = await shop_checks.coupons_used_twice(conn)
    result.coupons_not_with_their_order = await shop_checks.coupons_not_with_their_order(conn)
    result.cancels_not_notified = await shop_checks.cancels_not_notified(conn, dead)


async def lateness_seconds(deps: Deps) -> list[float]:
    """For every timer done on its first attempt, seconds from its deadline to its firing."""
    async with deps.db.report() as conn:
        query = select(t_timers.c.deadline_at, t_timers.c.done_at).where(
            and_(t_timers.c.state == TimerState.DONE.value, t_timers.c.attempts == 1)
        )
        rows = (await conn.execute(query)).all()
    return sorted((done - deadline).total_seconds() for deadline, done in rows)


async def seats_taken(deps: Deps) -> dict[str, int]:
    """How many seats of all shows are held by unpaid orders and sold: one grouped count of the
    live seat holds."""
    query = select(seat_holds.c.state, func.count()).group_by(seat_holds.c.state)
    async with deps.db.report() as conn:
        found = {str(state): int(n) for state, n in (await conn.execute(query)).all()}
    return {state: found.get(state, 0) for state in (show_store.HELD, show_store.SOLD)}


async def shows_overview(deps: Deps, limit: int = 200) -> list[dict[str, Any]]:
    """The newest ``limit`` shows, newest first, each with how many of its seats are free, held
    and sold (``seats``): three statements however many shows."""
    newest = select(shows).order_by(shows.c.id.desc()).limit(limit)
    async with deps.db.report() as conn:
        found = [dict(r._mapping) for r in await conn.execute(newest)]
        ids = [show["id"] for show in found]
        per_show = select(seats.c.show_id, func.count()).where(seats.c.show_id.in_(ids))
        totals: dict[int, int] = {
            show_id: int(n) for show_id, n in await conn.execute(per_show.group_by(seats.c.show_id))
        }
        per_state = select(seat_holds.c.show_id, seat_holds.c.state, func.count()).where(
            seat_holds.c.show_id.in_(ids)
        )
        taken = {
            (show_id, state): int(n)
            for show_id, state, n in await conn.execute(
                per_state.group_by(seat_holds.c.show_id, seat_holds.c.state)
            )
        }
    for show in found:
        held = taken.get((show["id"], show_store.HELD), 0)
        sold = taken.get((show["id"], show_store.SOLD), 0)
        free = totals.get(show["id"], 0) - held - sold
        show["seats"] = {show_store.FREE: free, show_store.HELD: held, show_store.SOLD: sold}
    return found
