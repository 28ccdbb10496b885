"""How the command line shows orders and snapshots."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from rich.console import Console
from rich.table import Table

from dueflow.service.report import Invariants, Snapshot

ORDER_STATUSES = (
    "pending_payment",
    "pending_shipment",
    "shipped",
    "received",
    "completed",
    "cancelled_unpaid",
    "cancelled_unshipped",
)


def _when(value: Any) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S") if value is not None else "-"


#: A table's column: the row's field as text (None as an empty cell), or a function of the row.
Column = str | Callable[[Mapping[str, Any]], str]


def table_of(
    rows: Iterable[Mapping[str, Any]], columns: Mapping[str, Column], title: str | None = None
) -> Table:
    """A table with the ``columns`` (heading: field or function) and a line per row."""
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*(_cell(row, column) for column in columns.values()))
    return table


def _cell(row: Mapping[str, Any], column: Column) -> str:
    if callable(column):
        return column(row)
    return "" if row[column] is None else str(row[column])


def lines_text(lines: list[dict[str, Any]]) -> str:
    """A shop order's lines in words: ``sku 3 x2 at 25.00, coupon 7 (-5.00)``."""
    parts = []
    for line in lines:
        if line["kind"] == "coupon":
            parts.append(f"coupon {line['item_id']} (-{line['price']})")
        elif line["kind"] == "flash":
            parts.append(f"flash sale {line['item_id']} x{line['quantity']}")
        else:
            parts.append(f"{line['kind']} {line['item_id']} x{line['quantity']} at {line['price']}")
    return ", ".join(parts) or "nothing"


def _held(view: dict[str, Any]) -> str:
    if view.get("show_id") is not None:
        seats = ", ".join(line["label"] for line in view.get("lines", []))
        return f"show {view['show_id']} seats {seats}"
    if view.get("goods_id") is not None:
        return f"goods {view['goods_id']}"
    return lines_text(view.get("lines", []))


def print_order(console: Console, view: dict[str, Any]) -> None:
    """An order, what it holds, its notices, its timers and its timeline."""
    held = _held(view)
    console.print(
        f"order {view['id']} ({view['order_type']}) [bold]{view['status']}[/bold] "
        f"amount {view['amount']}  buyer {view['buyer_id']}  seller {view['seller_id']}  "
        f"{held}",
        soft_wrap=True,
    )
    for ticket in view.get("tickets", []):
        console.print(f"  ticket {ticket['seat']}: {ticket['code']} ({ticket['state']})")
    for name in ("pay_deadline", "ship_deadline", "receive_deadline", "review_deadline"):
        if view.get(name) is not None:
            console.print(f"  {name.replace('_', ' ')}: {_when(view[name])} UTC")
    if view.get("cancelled_at") is not None:
        console.print(f"  cancelled: {_when(view['cancelled_at'])} UTC ({view['cancel_reason']})")
    for notice in view.get("notices", []):
        console.print(
            f"  notice {notice['kind']}: {notice['state']}, {notice['deliveries']} deliveries,"
            f" sent {_when(notice['sent_at'])}"
        )
    timers: dict[str, Column] = {
        "timer": "id",
        "kind": "kind",
        "due": lambda t: _when(t["due_at"]),
        "state": "state",
        "attempts": "attempts",
        "outcome": "outcome",
    }
    console.print(table_of(view["timers"], timers, title="timers"))
    timeline: dict[str, Column] = {
        "at": lambda e: _when(e["at"]),
        "event": "event",
        "actor": "actor",
        "from": "from_status",
        "to": "to_status",
        "detail": "detail",
    }
    console.print(table_of(view["timeline"], timeline, title="timeline"))
    for refund in view["refunds"]:
        console.print(
            f"  refund {refund['refund_no']} {refund['amount']} {refund['state']} ({refund['reason']})"
        )


def snapshot_table(snap: Snapshot, title: str = "dueflow status") -> Table:
    """Orders by status, timers by state, and the alarms."""
    table = Table("what", "count", title=title)
    # The marketplace's statuses always (a zero says something too), other flows' when present.
    others = sorted(status for status in snap.orders if status not in ORDER_STATUSES)
    for status in (*ORDER_STATUSES, *others):
        table.add_row(f"orders {status}", str(snap.orders.get(status, 0)))
    # Done and cancelled timers are counted by `status --full` only (millions, nothing to do).
    finished = ("done", "cancelled") if snap.full else ()
    for state in ("scheduled", "claimed", "parked", *finished):
        table.add_row(f"timers {state}", str(snap.timers.get(state, 0)))
    table.add_row("timers overdue", str(snap.overdue), style="red" if snap.overdue else None)
    table.add_row("timers stuck", str(snap.stuck), style="red" if snap.stuck else None)
    for state, count in sorted(snap.refunds.items()):
        table.add_row(f"refunds {state}", str(count))
    table.add_row(
        "discrepancies", str(snap.discrepancies), style="yellow" if snap.discrepancies else None
    )
    for kind, count in snap.attention.items():
        style = "red" if count else None
        table.add_row(f"needs attention: {kind.replace('_', ' ')}", str(count), style=style)
    return table


def print_snapshot(console: Console, snap: Snapshot) -> None:
    """The status table."""
    console.print(snapshot_table(snap))


def invariants_table(inv: Invariants) -> Table:
    """Each invariant with PASS or the offenders."""
    table = Table("invariant", "result", title="invariants")
    checks = (
        ("no goods held by a cancelled order", inv.held_by_dead_order),
        ("no order left past a deadline", inv.past_deadline),
        ("no reminder sent twice", inv.reminders_twice),
        ("no review written twice", inv.reviews_twice),
        ("no goods held by two live orders", inv.goods_held_twice),
        ("no seat held by a cancelled order", inv.seats_held_by_dead_order),
        ("no seat held or sold twice", inv.seats_held_twice),
        ("every buyer within the show's seat limit", inv.seat_limits_broken),
        ("SKU stock + held + sold = stocked", inv.units_unbalanced),
        ("SKU units held only by unpaid orders", inv.units_held_by_dead_order),
        ("SKU units sold only to paid orders", inv.units_sold_unpaid),
        ("flash sale stock + held + sold = stocked", inv.flash_units_unbalanced),
        ("flash sale units held only by unpaid orders", inv.flash_units_held_by_dead_order),
        ("flash sale units sold only to paid orders", inv.flash_units_sold_unpaid),
        ("every buyer within the flash sale's limit", inv.flash_limits_broken),
        ("no coupon locked by a dead order", inv.coupons_locked_by_dead_order),
        ("no coupon used by an unpaid order", inv.coupons_used_by_unpaid_order),
        ("no coupon used twice", inv.coupons_used_twice),
        ("every coupon with the order it discounts", inv.coupons_not_with_their_order),
        ("every cancelled order notified once", inv.cancels_not_notified),
    )
    for name, offenders in checks:
        verdict = "[green]PASS[/green]" if not offenders else f"[red]FAIL[/red] {offenders[:10]}"
        table.add_row(name, verdict)
    return table
