"""Reading the shop's rows for tests/unit/test_shop_model.py: the database as the model
(tests/unit/shop_model.py) says it, and the shop's promises on the rows alone.

A plain synchronous engine reads every table once per check, outside the code under test.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from decimal import Decimal
from typing import Any

from sqlalchemy import Engine, select

from dueflow.store.schema import (
    coupon_templates,
    coupons,
    discrepancies,
    flash_buyers,
    flash_sales,
    order_events,
    order_lines,
    refunds,
    reminders,
    skus,
)
from dueflow.store.schema import orders as t_orders
from dueflow.store.schema import payments as t_payments
from dueflow.store.schema import timers as t_timers
from tests.unit.shop_model import CANCELLED, CENT, PAID, Line, stages

#: The tables both checks read, by name.
TABLES = {
    t.name: t
    for t in (
        t_orders,
        order_lines,
        skus,
        flash_sales,
        flash_buyers,
        coupons,
        coupon_templates,
        t_timers,
        reminders,
        t_payments,
        refunds,
        discrepancies,
        order_events,
    )
}


def read(engine: Engine) -> dict[str, list[Any]]:
    """Every row of :data:`TABLES`, in key order (one read for both checks)."""
    with engine.connect() as conn:
        return {
            name: list(conn.execute(select(t).order_by(*t.primary_key)).all())
            for name, t in TABLES.items()
        }


def db_snapshot(rows: dict[str, list[Any]]) -> dict[str, Any]:
    """The database as :meth:`Model.snapshot` says it."""
    assert {(o.flow, o.order_type in ("shop", "flash")) for o in rows["orders"]} <= {("shop", True)}
    events: dict[int, list[str]] = {o.id: [] for o in rows["orders"]}
    for e in rows["order_events"]:
        if e.event != "place":
            events[e.order_id].append(e.event)
        else:
            assert events[e.order_id] == [], "placed twice"
    lines: dict[int, list[Line]] = defaultdict(list)
    for x in rows["order_lines"]:
        lines[x.order_id].append((x.kind, x.item_id, x.label, x.price, x.quantity))
    assert {r.state for r in rows["refunds"]} <= {"pending_review"}
    timer_rows = rows["timers"]
    timers = {(t.order_id, t.kind): (t.state, t.due_at, t.attempts) for t in timer_rows}
    assert len(timers) == len(timer_rows), "two timers of one kind for an order"
    return {
        "orders": {
            o.id: (o.order_type, o.buyer_id, o.seller_id, *stages(o)) for o in rows["orders"]
        },
        "lines": dict(lines),
        "skus": {s.id: (s.stock, s.held, s.sold, s.stocked) for s in rows["skus"]},
        "sales": {s.id: (s.stock, s.held, s.sold, s.stocked) for s in rows["flash_sales"]},
        "flash_buyers": {(b.flash_sale_id, b.buyer_id): b.units for b in rows["flash_buyers"]},
        "coupons": {c.id: (c.template_id, c.user_id, c.state, c.order_id) for c in rows["coupons"]},
        "issued": {t.id: t.issued for t in rows["coupon_templates"]},
        "timers": timers,
        "reminders": {(r.order_id, r.kind): r.state for r in rows["reminders"]},
        "paid_attempts": dict(Counter(p.order_id for p in rows["payments"] if p.state == "paid")),
        "refunds": dict(Counter(r.order_id for r in rows["refunds"])),
        "discrepancies": sorted((d.order_id, d.kind) for d in rows["discrepancies"]),
        "events": events,
    }


def structural_invariants(rows: dict[str, list[Any]], *, drained: bool) -> None:
    """The shop's promises, read from the rows alone (whatever the model says)."""
    by_id = {o.id: o for o in rows["orders"]}
    line_rows = rows["order_lines"]
    lines = defaultdict(list)
    for x in line_rows:
        lines[x.order_id].append(x)
    # units: stock + held + sold = stocked, none negative; held = what unpaid orders hold, sold
    # = what paid ones bought
    for kind, table in (("sku", "skus"), ("flash", "flash_sales")):
        held: Counter[int] = Counter()
        sold: Counter[int] = Counter()
        for x in line_rows:
            if x.kind == kind:
                status = by_id[x.order_id].status
                if status == "pending_payment":
                    held[x.item_id] += x.quantity
                elif status in PAID:
                    sold[x.item_id] += x.quantity
        for r in rows[table]:
            assert min(r.stock, r.held, r.sold) >= 0, (kind, r)
            assert r.stock + r.held + r.sold == r.stocked, (kind, r)
            assert (r.held, r.sold) == (held[r.id], sold[r.id]), (kind, r, held, sold)
    # a flash buyer's count is what their live and paid orders hold, within the limit
    limits = {s.id: s.per_buyer_limit for s in rows["flash_sales"]}
    counted: Counter[tuple[int, int]] = Counter()
    for x in line_rows:
        o = by_id[x.order_id]
        if x.kind == "flash" and o.status != "cancelled_unpaid":
            counted[(x.item_id, o.buyer_id)] += x.quantity
    for b in rows["flash_buyers"]:
        key = (b.flash_sale_id, b.buyer_id)
        assert b.units == counted[key] <= limits[b.flash_sale_id], (b, counted)
    assert set(counted) <= {(b.flash_sale_id, b.buyer_id) for b in rows["flash_buyers"]}
    _coupon_invariants(by_id, lines, rows["coupons"], rows["coupon_templates"])
    # amounts: lines minus the coupon, at least a cent
    for o in rows["orders"]:
        got = lines[o.id]
        total = sum((x.price * x.quantity for x in got if x.kind == "sku"), start=Decimal(0))
        off = sum((x.price for x in got if x.kind == "coupon"), start=Decimal(0))
        assert o.amount == max(total - off, CENT), (o.id, o.amount, total, off)
    _notice_invariants(by_id, rows["timers"], rows["reminders"], drained=drained)


def _coupon_invariants(
    by_id: dict[int, Any], lines: dict[int, list[Any]], coupon_rows: list[Any], tpls: list[Any]
) -> None:
    """Locked iff its order awaits payment, used iff its order was paid, else available or
    expired and free; no coupon in two live orders; issued = coupons of the template."""
    naming: dict[int, list[Any]] = defaultdict(list)
    for order_id, got in lines.items():
        mine = [x for x in got if x.kind == "coupon"]
        assert len(mine) <= 1, f"order {order_id} has two coupons"
        for x in mine:
            naming[x.item_id].append(by_id[order_id])
    for c in coupon_rows:
        pending = [o.id for o in naming[c.id] if o.status == "pending_payment"]
        paid = [o.id for o in naming[c.id] if o.status in PAID]
        assert len(pending) + len(paid) <= 1, f"coupon {c.id} in orders {pending + paid}"
        assert all(o.buyer_id == c.user_id for o in naming[c.id]), c
        if c.state == "locked":
            assert pending == [c.order_id], (c, pending)
        elif c.state == "used":
            assert paid == [c.order_id], (c, paid)
        else:
            assert c.state in ("available", "expired") and c.order_id is None, c
            assert not pending and not paid, (c, pending, paid)
    issued = Counter(c.template_id for c in coupon_rows)
    for t in tpls:
        assert t.issued == issued[t.id] <= t.total, t


def _notice_invariants(
    by_id: dict[int, Any], timer_rows: list[Any], reminder_rows: list[Any], *, drained: bool
) -> None:
    """Every cancelled order has one order_closed notice: scheduled until a worker ran it,
    then sent; no other order has one."""
    closing = {t.order_id: t for t in timer_rows if t.kind == "order_closed"}
    notices = {r.order_id: r for r in reminder_rows if r.kind == "order_closed"}
    cancelled = {o.id for o in by_id.values() if o.status in CANCELLED}
    assert set(closing) == cancelled, (sorted(closing), sorted(cancelled))
    for order_id, t in closing.items():
        if t.state == "done":
            assert notices[order_id].state == "sent" and notices[order_id].deliveries == 1
        else:
            assert not drained and t.state == "scheduled" and order_id not in notices, t
    assert set(notices) <= cancelled
