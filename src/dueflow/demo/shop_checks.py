"""The shop demo's own promises, read from the database, and its live table.

The engine's invariants (:func:`dueflow.service.report.check_invariants`) already say that units
add up and sit where their orders say, that coupons go with their orders, and that every cancel
wrote its one notice. Beside them the demo checks, each by one statement (one read of one
moment): every order's amount, a refund for every paid-then-cancelled order, and at the end the
units put on sale and that every notice was sent and delivered once.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from rich.table import Table
from sqlalchemy import and_, func, or_, select

from dueflow.demo.shop_crowd import Shop
from dueflow.domain.lifecycle import CANCELLED_STATUSES, OrderStatus
from dueflow.domain.money import CENT
from dueflow.domain.timers import TimerKind, TimerState
from dueflow.service.deps import Deps
from dueflow.store import shop
from dueflow.store.schema import (
    coupons,
    flash_sales,
    order_lines,
    payments,
    refunds,
    reminders,
    skus,
    timers,
)
from dueflow.store.schema import orders as t_orders

S = OrderStatus
#: The statuses of an order whose units are sold and whose coupon is used (paid, even if then
#: cancelled unshipped: the units stay sold, the coupon used).
PAID = tuple(s.value for s in (S.PENDING_SHIPMENT, S.SHIPPED, S.COMPLETED, S.CANCELLED_UNSHIPPED))
UNPAID = (S.PENDING_PAYMENT.value,)
DEAD = tuple(sorted(s.value for s in CANCELLED_STATUSES))
NOTICE = TimerKind.ORDER_CLOSED.value

AMOUNTS = "every order's amount: its lines less its coupon"
REFUNDED = "every paid-then-cancelled order has a refund"
STOCKED = "every SKU and flash sale stocked as put on sale"
NOTIFIED = "every cancelled order's notice sent once"
REPEATS = "every repeated Idempotency-Key answered its first order"

#: Paid payments of cancelled orders without a refund.
_UNREFUNDED = (
    select(payments.c.order_id)
    .join(t_orders, t_orders.c.id == payments.c.order_id)
    .outerjoin(refunds, refunds.c.payment_id == payments.c.id)
    .where(payments.c.state == "paid", t_orders.c.status.in_(DEAD), refunds.c.id.is_(None))
)

#: Cancelled orders whose notice is not sent once, and other orders with a notice.
_NOTICES = (
    select(t_orders.c.id)
    .outerjoin(reminders, and_(reminders.c.order_id == t_orders.c.id, reminders.c.kind == NOTICE))
    .where(
        or_(
            and_(
                t_orders.c.status.in_(DEAD),
                or_(
                    reminders.c.id.is_(None),
                    reminders.c.state != "sent",
                    reminders.c.deliveries != 1,
                ),
            ),
            and_(t_orders.c.status.not_in(DEAD), reminders.c.id.is_not(None)),
        )
    )
)

_LINES = (
    select(
        t_orders.c.id,
        t_orders.c.amount,
        order_lines.c.kind,
        order_lines.c.price,
        order_lines.c.quantity,
    )
    .join(order_lines, order_lines.c.order_id == t_orders.c.id)
    .where(t_orders.c.flow == "shop")
)


async def promises(
    deps: Deps, *, stocked: Mapping[int, int], flash_stocked: Mapping[int, int], over: bool
) -> dict[str, list[int]]:
    """The shop's promises and their offenders; with ``over`` (every order final, every notice
    due sent) also that every SKU (``stocked``) and flash sale (``flash_stocked``) has the units
    the seller put on sale, and that every cancelled order was told once."""
    async with deps.db.report() as conn:
        found = {REFUNDED: list((await conn.execute(_UNREFUNDED)).scalars())}
        found[AMOUNTS] = _wrong_amounts((await conn.execute(_LINES)).all())
        if over:
            units = [(skus, stocked), (flash_sales, flash_stocked)]
            found[STOCKED] = [
                row.id
                for table, expected in units
                for row in await conn.execute(select(table.c.id, table.c.stocked))
                if row.id in expected and row.stocked != expected[row.id]
            ]
            found[NOTIFIED] = sorted(set((await conn.execute(_NOTICES)).scalars()))
    return found


def _wrong_amounts(rows: Any) -> list[int]:
    """Orders whose amount is not their lines less their coupon (at least a cent)."""
    amounts: dict[int, Decimal] = {}
    due: defaultdict[int, Decimal] = defaultdict(Decimal)
    for order_id, amount, kind, price, quantity in rows:
        amounts[order_id] = Decimal(amount)
        due[order_id] += -Decimal(price) if kind == "coupon" else Decimal(price) * quantity
    return [oid for oid, amount in amounts.items() if amount != max(due[oid], CENT)]


async def notices_due(deps: Deps) -> int:
    """Order-closed notices still to send (their timers scheduled or claimed)."""
    live = (TimerState.SCHEDULED.value, TimerState.CLAIMED.value)
    query = select(func.count()).where(timers.c.kind == NOTICE, timers.c.state.in_(live))
    async with deps.db.report() as conn:
        return int(await conn.scalar(query) or 0)


async def units_table(deps: Deps) -> Table:
    """The units of every SKU and flash sale, and the coupons by state."""
    table = Table("units", "on sale", "held", "sold", "stocked", title="the shop")
    notices = (
        select(reminders.c.state, func.count())
        .where(reminders.c.kind == NOTICE)
        .group_by(reminders.c.state)
    )
    async with deps.db.report() as conn:
        for row in await conn.execute(select(skus).order_by(skus.c.id)):
            table.add_row(f"sku {row.id} {row.title}", *_counts(row))
        for row in await conn.execute(select(flash_sales).order_by(flash_sales.c.id)):
            table.add_row(f"flash sale {row.id} (sku {row.sku_id})", *_counts(row))
        per_state = select(coupons.c.state, func.count()).group_by(coupons.c.state)
        by_state = {str(state): int(n) for state, n in await conn.execute(per_state)}
        sent = {str(state): int(n) for state, n in await conn.execute(notices)}
    states = (shop.AVAILABLE, shop.LOCKED, shop.USED, shop.EXPIRED)
    table.add_row("coupons", *(f"{s} {by_state.get(s, 0)}" for s in states))
    table.add_row(
        "order-closed notices", ", ".join(f"{s} {n}" for s, n in sorted(sent.items())) or "none"
    )
    return table


def _counts(row: Any) -> tuple[str, str, str, str]:
    return str(row.stock), str(row.held), str(row.sold), str(row.stocked)


# --- the same from the API (the demo over HTTP) ----------------------------------------------

SOLD = "nothing held at the end, sold = the run's paid lines"
COUPONS = "every coupon as its order says, none locked"


def _notices(view: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [n for n in view["notices"] if n["kind"] == "order_closed"]


def told(view: Mapping[str, Any]) -> bool:
    """The order's one notice was sent and delivered once."""
    notices = _notices(view)
    return len(notices) == 1 and notices[0]["state"] == "sent" and notices[0]["deliveries"] == 1


def from_views(
    shop: Shop,
    views: Mapping[int, Mapping[str, Any]],
    units: Mapping[str, Mapping[int, Mapping[str, Any]]],
    coupons: Iterable[Mapping[str, Any]],
    repeats: Sequence[bool],
) -> dict[str, list[int]]:
    """The run's own promises from the API: ``views`` of its orders, ``units`` (``"sku"`` and
    ``"flash"`` views by id), its buyers' ``coupons``, the verdicts of its repeated requests."""
    sold: Counter[tuple[str, int]] = Counter()
    for view in views.values():
        if view["status"] in PAID:
            for line in view["lines"]:
                sold[(line["kind"], line["item_id"])] += line["quantity"]
    expected = {"sku": shop.stocked, "flash": {shop.flash_sale_id: shop.flash_stocked}}
    return {
        STOCKED: [
            i
            for kind, by_id in units.items()
            for i, v in by_id.items()
            if v["stocked"] != expected[kind].get(i)
        ],
        SOLD: [
            i
            for kind, by_id in units.items()
            for i, v in by_id.items()
            if v["held"] != 0 or v["sold"] != sold[(kind, i)]
        ],
        COUPONS: _coupons_astray(views, coupons),
        AMOUNTS: [oid for oid, v in views.items() if Decimal(v["amount"]) != _due(v)],
        REFUNDED: [
            oid
            for oid, v in views.items()
            if v["status"] in DEAD
            and any(p["state"] == "paid" for p in v["payments"])
            and not v["refunds"]
        ],
        NOTIFIED: [
            oid
            for oid, v in views.items()
            if (v["status"] in DEAD and not told(v)) or (v["status"] not in DEAD and _notices(v))
        ],
        REPEATS: [n for n, same in enumerate(repeats) if not same],
    }


def _due(view: Mapping[str, Any]) -> Decimal:
    """What the order's lines come to, less its coupon, at least a cent."""
    total = Decimal(0)
    for line in view["lines"]:
        price = Decimal(line["price"])
        total += -price if line["kind"] == "coupon" else price * line["quantity"]
    return max(total, CENT)


def _coupons_astray(
    views: Mapping[int, Mapping[str, Any]], coupons: Iterable[Mapping[str, Any]]
) -> list[int]:
    """Coupons locked at the end, used by no paid order of the run holding it, or on the lines
    of two orders that took it."""
    takers: dict[int, list[int]] = {}
    for oid, view in views.items():
        if view["status"] in PAID:
            for line in view["lines"]:
                if line["kind"] == "coupon":
                    takers.setdefault(line["item_id"], []).append(oid)
    astray = [cid for cid, oids in takers.items() if len(oids) > 1]
    for coupon in coupons:
        if coupon["state"] == "locked":
            astray.append(coupon["id"])
        if coupon["state"] == "used" and takers.get(coupon["id"]) != [coupon["order_id"]]:
            astray.append(coupon["id"])
    return sorted(set(astray))
