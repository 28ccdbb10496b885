"""The promises of docs/design.md checked against the database: in full (every order: ``dueflow
status --full``, the dashboard's full check, the demos), or over the latest changes (the
dashboard and ``dueflow status``: the orders that moved last, a bounded read however many orders
there are, labelled as such).

A bounded check runs the same statements, each limited to the orders that moved last and to what
they hold (their goods, shows, SKUs, flash sales, coupons, notices). An order left past its
deadline is found among every live order in both: a forgotten order is one that did not move.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, literal_column, select, union_all
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain.lifecycle import OrderStatus
from dueflow.service import reads, shop_checks
from dueflow.service.deps import Deps
from dueflow.service.shop_checks import within
from dueflow.store import aftersale, holds
from dueflow.store.schema import (
    coupons,
    flash_sales,
    goods,
    order_lines,
    reviews,
    seat_holds,
    show_buyers,
    shows,
    skus,
)
from dueflow.store.schema import orders as t_orders

#: How many of the latest changed orders a bounded check reads.
RECENT = 1000

_DEADLINES = {
    OrderStatus.PENDING_PAYMENT: t_orders.c.pay_deadline,
    OrderStatus.PENDING_SHIPMENT: t_orders.c.ship_deadline,
    OrderStatus.SHIPPED: t_orders.c.receive_deadline,
    OrderStatus.RECEIVED: t_orders.c.review_deadline,
}


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


@dataclass(frozen=True)
class Checked:
    """A check and what it covered: every order (``full``), or the ``orders`` that moved
    last, since ``since`` (the oldest change read; None: no order yet)."""

    invariants: Invariants
    full: bool
    orders: int
    since: datetime | None
    #: What a bounded check reads at most (the label's N).
    limit: int


async def check_invariants(deps: Deps, *, tolerance_seconds: float = 5.0) -> Invariants:
    """Check every promise over every order: nothing held by a dead order, no order left past
    its deadline (beyond ``tolerance_seconds``), no reminder or review twice, no goods held by
    two live orders, the seats, the shop's units and coupons, the cancels' notices."""
    return await _check(deps, deps.clock.now(), tolerance_seconds, None)


async def check_full(deps: Deps, *, tolerance_seconds: float = 5.0) -> Checked:
    """:func:`check_invariants`, labelled as the full check."""
    async with deps.db.report() as conn:
        count = int((await conn.execute(select(func.count()).select_from(t_orders))).scalar_one())
    found = await _check(deps, deps.clock.now(), tolerance_seconds, None)
    return Checked(found, full=True, orders=count, since=None, limit=count)


async def check_recent(
    deps: Deps,
    *,
    limit: int = RECENT,
    tolerance_seconds: float = 5.0,
    lanes: asyncio.Semaphore | None = None,
) -> Checked:
    """Check the promises over the ``limit`` orders that moved last (and every live order for
    the deadlines): a bounded read, whatever the number of orders. Its statements run side by
    side on PostgreSQL and MariaDB (:mod:`dueflow.service.reads`, within ``lanes``)."""
    o = t_orders.c
    latest = (
        select(o.id, o.updated_at, o.goods_id, o.show_id).order_by(o.updated_at.desc()).limit(limit)
    )
    async with lanes or contextlib.nullcontext(), deps.db.report() as conn:
        rows = (await conn.execute(latest)).all()
    among = Among(
        orders=sorted(int(row.id) for row in rows),
        goods=sorted({int(row.goods_id) for row in rows if row.goods_id is not None}),
        shows=sorted({int(row.show_id) for row in rows if row.show_id is not None}),
    )
    found = await _check(deps, deps.clock.now(), tolerance_seconds, among, lanes)
    since = min((row.updated_at for row in rows), default=None)
    return Checked(found, full=False, orders=len(rows), since=since, limit=limit)


@dataclass(frozen=True)
class Among:
    """What a bounded check covers: the orders that moved last, their goods and shows."""

    orders: list[int]
    goods: list[int]
    shows: list[int]


#: A check's statements, each with the fields of :class:`Invariants` its result fills (a list
#: of ids each, in that order).
Parts = list[tuple[tuple[str, ...], reads.Part]]


async def _check(
    deps: Deps,
    now: datetime,
    tolerance_seconds: float,
    scope: Among | None,
    lanes: asyncio.Semaphore | None = None,
) -> Invariants:
    """Every promise, over the orders of ``scope`` (None: every order). The statements are read
    side by side (:func:`dueflow.service.reads.each`): those that need nothing but the scope,
    with what its orders hold; then the shop's, over those items."""
    among = None if scope is None else scope.orders
    late = now - timedelta(seconds=tolerance_seconds)
    dead = [s.value for s in OrderStatus if s.is_cancelled]
    parts = _order_parts(late, dead, scope) + _seat_parts(dead, scope)
    parts.append((("cancels_not_notified",), _bound(shop_checks.cancels_not_notified, dead, among)))
    result = Invariants()
    if scope is None:
        parts += _shop_parts(None, None)
        _fill(result, parts, await reads.each(deps, [part for _, part in parts], lanes=lanes))
        return result
    first = [part for _, part in parts]
    found = await reads.each(deps, [*first, _bound(_held_by, among)], lanes=lanes)
    _fill(result, parts, found[:-1])
    shop = _shop_parts(found[-1], among)
    if shop:
        _fill(result, shop, await reads.each(deps, [part for _, part in shop], lanes=lanes))
    return result


def _fill(result: Invariants, parts: Parts, found: Sequence[Any]) -> None:
    """Add what each part found to its fields of ``result`` (a part filling several answers
    a tuple of lists)."""
    for (fields, _), value in zip(parts, found, strict=True):
        values = value if len(fields) > 1 else (value,)
        for name, ids in zip(fields, values, strict=True):
            setattr(result, name, getattr(result, name) + list(ids))


def _bound(check: Any, *args: Any) -> reads.Part:
    """``check(conn, *args)`` as a part."""

    async def part(conn: AsyncConnection) -> Any:
        return await check(conn, *args)

    return part


def _order_parts(late: datetime, dead: list[str], scope: Among | None) -> Parts:
    """The orders' own promises: goods, deadlines, reminders, reviews."""
    among = None if scope is None else scope.orders
    their_goods = None if scope is None else scope.goods
    parts: Parts = []
    # A bounded check skips what its orders cannot hold (no goods, no show, no coupon among
    # them): each statement saved is a round trip on every refresh.
    if their_goods is None or their_goods:

        async def held_by_dead_order(conn: AsyncConnection) -> list[int]:
            held = select(goods.c.id).join(t_orders, t_orders.c.id == goods.c.reserved_order_id)
            return await _ids(
                conn,
                held.where(t_orders.c.status.in_(dead), within(conn, goods.c.id, their_goods)),
            )

        async def goods_held_twice(conn: AsyncConnection) -> list[int]:
            live = [s.value for s in OrderStatus if not s.is_cancelled]
            double = (
                select(t_orders.c.goods_id)
                .where(t_orders.c.status.in_(live), t_orders.c.goods_id.is_not(None))
                .where(within(conn, t_orders.c.goods_id, their_goods))
                .group_by(t_orders.c.goods_id)
                .having(func.count() > 1)
            )
            return await _ids(conn, double)

        parts += [
            (("held_by_dead_order",), held_by_dead_order),
            (("goods_held_twice",), goods_held_twice),
        ]
    # A literal status: the partial index of that status' deadline serves it, under a generic
    # prepared plan too (store/_schema_orders.py); the four in one statement.
    past = union_all(
        *(
            select(t_orders.c.id).where(
                t_orders.c.status == literal_column(f"'{status.value}'"), column < late
            )
            for status, column in _DEADLINES.items()
        )
    )
    parts.append((("past_deadline",), _bound(_ids, past)))

    async def reviews_twice(conn: AsyncConnection) -> list[int]:
        twice = (
            select(reviews.c.order_id)
            .where(within(conn, reviews.c.order_id, among))
            .group_by(reviews.c.order_id, reviews.c.role)
            .having(func.count() > 1)
        )
        return await _ids(conn, twice)

    # Deliveries, not rows: one row per reminder is a unique key, but one row can be sent
    # more than once (a lease lost mid-batch, a resend after an unanswered send).
    parts.append((("reminders_twice",), _bound(aftersale.delivered_twice, among)))
    parts.append((("reviews_twice",), reviews_twice))
    return parts


async def _ids(conn: AsyncConnection, query: Any) -> list[int]:
    """The ids ``query`` selects."""
    return [int(i) for i in (await conn.execute(query)).scalars()]


def _seat_parts(dead: list[str], scope: Among | None) -> Parts:
    """The seat promises: no seat held by a dead order or twice, every buyer's count equal to
    the seats they hold and within the show's limit (over the orders and shows of ``scope``)."""
    among, show_ids = (None, None) if scope is None else (scope.orders, scope.shows)
    if show_ids is not None and not show_ids:
        return []  # seats are held by orders of a show only

    async def by_dead(conn: AsyncConnection) -> list[int]:
        query = (
            select(seat_holds.c.order_id)
            .join(t_orders, t_orders.c.id == seat_holds.c.order_id)
            .where(t_orders.c.status.in_(dead), within(conn, seat_holds.c.order_id, among))
            .distinct()
        )
        return await _ids(conn, query)

    async def twice(conn: AsyncConnection) -> list[int]:
        query = (
            select(seat_holds.c.seat_id)
            .where(within(conn, seat_holds.c.show_id, show_ids))
            .group_by(seat_holds.c.seat_id)
            .having(func.count() > 1)
        )
        return await _ids(conn, query)

    async def counted(conn: AsyncConnection) -> list[int]:
        held = (
            select(seat_holds.c.show_id, seat_holds.c.buyer_id, func.count().label("n"))
            .where(within(conn, seat_holds.c.show_id, show_ids))
            .group_by(seat_holds.c.show_id, seat_holds.c.buyer_id)
            .subquery()
        )
        same = (held.c.show_id == show_buyers.c.show_id) & (
            held.c.buyer_id == show_buyers.c.buyer_id
        )
        query = (
            select(show_buyers.c.show_id)
            .join(shows, shows.c.id == show_buyers.c.show_id)
            .outerjoin(held, same)
            .where(
                within(conn, show_buyers.c.show_id, show_ids),
                (func.coalesce(held.c.n, 0) != show_buyers.c.seats)
                | (show_buyers.c.seats > shows.c.seat_limit),
            )
            .distinct()
        )
        return await _ids(conn, query)

    return [
        (("seats_held_by_dead_order",), by_dead),
        (("seats_held_twice",), twice),
        (("seat_limits_broken",), counted),
    ]


#: What a bounded check's orders hold: item ids per line kind, and whether a coupon names one
#: of them.
Held = tuple[dict[str, list[int]], bool]


async def _held_by(conn: AsyncConnection, among: list[int]) -> Held:
    """What the orders ``among`` hold, per line kind; and, when no line of theirs is a coupon,
    whether a coupon names one of them anyway (else the coupon checks have nothing to look at)."""
    lines = select(order_lines.c.kind, order_lines.c.item_id).where(
        within(conn, order_lines.c.order_id, among)
    )
    found: dict[str, set[int]] = {}
    for kind, item_id in (await conn.execute(lines)).all():
        found.setdefault(str(kind), set()).add(int(item_id))
    items = {kind: sorted(ids) for kind, ids in found.items()}
    if items.get(holds.CouponHold.kind):
        return items, True
    query = select(coupons.c.id).where(within(conn, coupons.c.order_id, among)).limit(1)
    return items, (await conn.execute(query)).first() is not None


def _shop_parts(held: Held | None, among: list[int] | None) -> Parts:
    """The shop promises (:mod:`dueflow.service.shop_checks`): units, flash sale counts,
    coupons, over the items ``held`` (None: every one)."""

    def of(kind: str) -> list[int] | None:
        return None if held is None else held[0].get(kind, [])

    sku_ids, flash_ids = of(holds.SkuHold.kind), of(holds.FlashHold.kind)
    coupon_ids = of(holds.CouponHold.kind)
    # An empty list of items has nothing to check: no part (no connection taken for it).
    parts: Parts = []
    if sku_ids is None or sku_ids:
        parts.append(
            (
                ("units_unbalanced", "units_held_by_dead_order", "units_sold_unpaid"),
                _bound(shop_checks.units_promises, skus, holds.SkuHold.kind, sku_ids),
            )
        )
    if flash_ids is None or flash_ids:
        parts += [
            (
                (
                    "flash_units_unbalanced",
                    "flash_units_held_by_dead_order",
                    "flash_units_sold_unpaid",
                ),
                _bound(shop_checks.units_promises, flash_sales, holds.FlashHold.kind, flash_ids),
            ),
            (("flash_limits_broken",), _bound(shop_checks.flash_limits_broken, flash_ids)),
        ]
    if coupon_ids is None or coupon_ids:
        parts.append((("coupons_used_twice",), _bound(shop_checks.coupons_used_twice, coupon_ids)))
    if held is None or held[1]:
        checks = shop_checks.CouponScope(orders=among, coupons=coupon_ids)
        parts += [
            (
                ("coupons_locked_by_dead_order",),
                _bound(shop_checks.coupons_locked_by_dead_order, checks),
            ),
            (
                ("coupons_used_by_unpaid_order",),
                _bound(shop_checks.coupons_used_by_unpaid_order, checks),
            ),
            (
                ("coupons_not_with_their_order",),
                _bound(shop_checks.coupons_not_with_their_order, checks),
            ),
        ]
    return parts
