"""The shop's promises, checked against the database for :func:`report.check_invariants`
(which names each list's field): the units of every SKU and flash sale, the buyers' counts of
flash sales, coupons, and one order_closed notice per cancelled order.

Each check is one statement, so it sees one instant even while orders move (a statement reads
one snapshot on every backend); each returns the offenders' ids, in id order. Each takes the ids
it is limited to (the items or orders of the latest changes, service/invariants.py), or None:
every row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Table, and_, func, literal, or_, select, true, union
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain.lifecycle import OrderStatus
from dueflow.domain.timers import TimerKind
from dueflow.store import holds, shop, tally
from dueflow.store.schema import coupons, flash_buyers, flash_sales, order_lines, reminders
from dueflow.store.schema import orders as t_orders
from dueflow.store.schema import timers as t_timers

#: An order awaiting payment holds its units and its coupon; one cancelled before paying has
#: let them go; every other order was paid (its units sold, its coupon used), cancelled or not.
_UNPAID = OrderStatus.PENDING_PAYMENT.value
_NEVER_PAID = OrderStatus.CANCELLED_UNPAID.value


def within(conn: AsyncConnection, column: Any, ids: Sequence[int] | None) -> ColumnElement[bool]:
    """``column`` among ``ids`` (one array parameter on PostgreSQL: store/tally.py); no limit
    at all when ``ids`` is None (the full check)."""
    return true() if ids is None else tally.among(conn, column, ids)


@dataclass(frozen=True)
class CouponScope:
    """What the coupon checks are limited to: the coupons of these orders, these coupons
    (None each: every one)."""

    orders: Sequence[int] | None = None
    coupons: Sequence[int] | None = None


def _units_on_lines(kind: str, *where: Any) -> Any:
    """Units of ``kind`` on the lines of the orders matching ``where``, per item."""
    line = order_lines.c
    return (
        select(line.item_id, func.sum(line.quantity).label("units"))
        .join(t_orders, t_orders.c.id == line.order_id)
        .where(line.kind == kind, *where)
        .group_by(line.item_id)
        .subquery()
    )


async def _ids(conn: AsyncConnection, query: Any) -> list[int]:
    """The ids ``query`` selects."""
    return [int(i) for i in (await conn.execute(query)).scalars()]


async def units_promises(
    conn: AsyncConnection, table: Table, kind: str, ids: Sequence[int] | None = None
) -> tuple[list[int], list[int], list[int]]:
    """For SKUs or flash sales (``table``, whose units are lines of ``kind``; those of ``ids``):
    those whose counts do not add up, whose held units are not their unpaid orders', whose sold
    units are not their paid orders'. Each one statement, so each sees one instant."""
    if ids is not None and not ids:
        return [], [], []
    c = table.c
    unbalanced = select(c.id).where(
        within(conn, c.id, ids),
        or_(c.stock < 0, c.held < 0, c.sold < 0, c.stock + c.held + c.sold != c.stocked),
    )
    mine = within(conn, order_lines.c.item_id, ids)
    live = _units_on_lines(kind, t_orders.c.status == _UNPAID, mine)
    held = (
        select(c.id)
        .outerjoin(live, live.c.item_id == c.id)
        .where(within(conn, c.id, ids), c.held != func.coalesce(live.c.units, 0))
    )
    paid = _units_on_lines(kind, t_orders.c.status.not_in([_UNPAID, _NEVER_PAID]), mine)
    sold = (
        select(c.id)
        .outerjoin(paid, paid.c.item_id == c.id)
        .where(within(conn, c.id, ids), c.sold != func.coalesce(paid.c.units, 0))
    )
    return (
        await _ids(conn, unbalanced.order_by(c.id)),
        await _ids(conn, held.order_by(c.id)),
        await _ids(conn, sold.order_by(c.id)),
    )


async def flash_limits_broken(conn: AsyncConnection, ids: Sequence[int] | None = None) -> list[int]:
    """Flash sales (of ``ids``) where a buyer's count is not the units of the buyer's orders
    that took them (unpaid or paid), or passes the sale's limit: one statement."""
    if ids is not None and not ids:
        return []
    line, fb = order_lines.c, flash_buyers.c
    took = (
        select(line.item_id, t_orders.c.buyer_id, func.sum(line.quantity).label("units"))
        .join(t_orders, t_orders.c.id == line.order_id)
        .where(
            line.kind == holds.FlashHold.kind,
            t_orders.c.status != _NEVER_PAID,
            within(conn, line.item_id, ids),
        )
        .group_by(line.item_id, t_orders.c.buyer_id)
        .subquery()
    )
    same_buyer = and_(took.c.item_id == fb.flash_sale_id, took.c.buyer_id == fb.buyer_id)
    miscounted = (
        select(fb.flash_sale_id.label("sale_id"))
        .join(flash_sales, flash_sales.c.id == fb.flash_sale_id)
        .outerjoin(took, same_buyer)
        .where(
            within(conn, fb.flash_sale_id, ids),
            or_(
                fb.units != func.coalesce(took.c.units, 0),
                fb.units > flash_sales.c.per_buyer_limit,
            ),
        )
    )
    uncounted = (
        select(took.c.item_id.label("sale_id"))
        .outerjoin(flash_buyers, same_buyer)
        .where(fb.buyer_id.is_(None))
    )
    either = union(miscounted, uncounted).subquery()
    return await _ids(conn, select(either.c.sale_id).order_by(either.c.sale_id))


async def coupons_locked_by_dead_order(
    conn: AsyncConnection, scope: CouponScope = CouponScope()
) -> list[int]:
    """Coupons locked by an order that no longer awaits payment."""
    cp, o = coupons.c, t_orders.c
    locked = (
        select(cp.id).join(t_orders, o.id == cp.order_id).where(within(conn, o.id, scope.orders))
    )
    return await _ids(
        conn, locked.where(cp.state == shop.LOCKED, o.status != _UNPAID).order_by(cp.id)
    )


async def coupons_used_by_unpaid_order(
    conn: AsyncConnection, scope: CouponScope = CouponScope()
) -> list[int]:
    """Coupons used by an order that was never paid."""
    cp, o = coupons.c, t_orders.c
    used = (
        select(cp.id)
        .join(t_orders, o.id == cp.order_id)
        .where(cp.state == shop.USED, within(conn, o.id, scope.orders))
    )
    return await _ids(conn, used.where(o.status.in_([_UNPAID, _NEVER_PAID])).order_by(cp.id))


async def coupons_used_twice(conn: AsyncConnection, ids: Sequence[int] | None = None) -> list[int]:
    """Coupons on the lines of two orders that took them (neither cancelled unpaid: an order
    cancelled before paying gave its coupon back, and keeps its line as what was bought)."""
    if ids is not None and not ids:
        return []
    line, o = order_lines.c, t_orders.c
    taken = (
        select(line.item_id)
        .join(t_orders, o.id == line.order_id)
        .where(
            line.kind == holds.CouponHold.kind,
            o.status != _NEVER_PAID,
            within(conn, line.item_id, ids),
        )
        .group_by(line.item_id)
        .having(func.count(line.order_id.distinct()) > 1)
    )
    return await _ids(conn, taken.order_by(line.item_id))


async def coupons_not_with_their_order(
    conn: AsyncConnection, scope: CouponScope = CouponScope()
) -> list[int]:
    """Orders that took a coupon's discount (on their lines) without holding the coupon, and
    orders holding a coupon without its discount: one statement."""
    cp, line, o = coupons.c, order_lines.c, t_orders.c
    unheld = (
        select(o.id.label("order_id"))
        .join(order_lines, line.order_id == o.id)
        .outerjoin(coupons, cp.id == line.item_id)
        .where(
            line.kind == holds.CouponHold.kind,
            o.status != _NEVER_PAID,
            within(conn, o.id, scope.orders),
            or_(cp.order_id.is_(None), cp.order_id != o.id),
        )
    )
    discounted = (
        select(literal(1))
        .where(
            line.order_id == cp.order_id, line.kind == holds.CouponHold.kind, line.item_id == cp.id
        )
        .exists()
    )
    undiscounted = select(cp.order_id.label("order_id")).where(
        cp.order_id.is_not(None), within(conn, cp.order_id, scope.orders), ~discounted
    )
    either = union(unheld, undiscounted).subquery()
    return await _ids(conn, select(either.c.order_id).order_by(either.c.order_id))


async def cancels_not_notified(
    conn: AsyncConnection, dead: list[str], among: Sequence[int] | None = None
) -> list[int]:
    """Cancelled orders without exactly one ``order_closed`` notice: one timer (written by the
    cancel) and at most one reminder row (its sending). The unique keys forbid two of either:
    this checks they are there."""
    kind = TimerKind.ORDER_CLOSED.value
    per_timer = _per_order(conn, t_timers, kind, among)
    per_row = _per_order(conn, reminders, kind, among)
    query = (
        select(t_orders.c.id)
        .outerjoin(per_timer, per_timer.c.order_id == t_orders.c.id)
        .outerjoin(per_row, per_row.c.order_id == t_orders.c.id)
        .where(
            t_orders.c.status.in_(dead),
            within(conn, t_orders.c.id, among),
            or_(func.coalesce(per_timer.c.n, 0) != 1, func.coalesce(per_row.c.n, 0) > 1),
        )
        .order_by(t_orders.c.id)
    )
    return await _ids(conn, query)


def _per_order(conn: AsyncConnection, table: Table, kind: str, among: Sequence[int] | None) -> Any:
    """How many rows of ``kind`` in ``table`` each order (of ``among``) has (``n``, per
    ``order_id``)."""
    return (
        select(table.c.order_id, func.count().label("n"))
        .where(table.c.kind == kind, within(conn, table.c.order_id, among))
        .group_by(table.c.order_id)
        .subquery()
    )
