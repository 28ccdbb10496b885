"""The effects that go with each move, shared by people's actions and timers.

Each function runs inside the caller's write transaction, moves the orders that are still in
the expected status (one conditional UPDATE per group), and does in the same transaction
everything the move implies: holds, timers, refunds, timeline. It returns the orders it moved.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain.lifecycle import OrderEvent, OrderStatus
from dueflow.domain.timers import TimerKind
from dueflow.service.deps import Deps
from dueflow.store import aftersale, events, orders, payments, timers
from dueflow.store.schema import orders as t_orders

S = OrderStatus
DEFAULT_RATING = 5
DEFAULT_COMMENT = "Default positive review."


async def cancel_unpaid(
    conn: AsyncConnection,
    deps: Deps,
    order_ids: Sequence[int],
    *,
    now: datetime,
    event: OrderEvent,
    actor: str,
    due_only: bool,
) -> list[Row[Any]]:
    """pending_payment -> cancelled_unpaid; release the goods, close attempts, cancel timers."""
    moved = await orders.move(
        conn,
        order_ids,
        expected=S.PENDING_PAYMENT,
        to=deps.lifecycle.next_status(S.PENDING_PAYMENT, event),
        now=now,
        values={"cancelled_at": now, "cancel_reason": event.value},
        due=t_orders.c.pay_deadline if due_only else None,
    )
    ids = [r.id for r in moved]
    await orders.record_events(
        conn,
        ids,
        event=event.value,
        actor=actor,
        now=now,
        from_status=S.PENDING_PAYMENT,
        to_status=S.CANCELLED_UNPAID,
    )
    await deps.hold.release(conn, ids, now)
    await _released(conn, deps, moved, "back on sale", actor=actor, now=now)
    await payments.close_open(conn, ids, now)
    await timers.cancel_for_orders(conn, ids, now)
    return moved


async def cancel_unshipped(
    conn: AsyncConnection,
    deps: Deps,
    order_ids: Sequence[int],
    *,
    now: datetime,
    event: OrderEvent,
    actor: str,
    due_only: bool,
) -> list[Row[Any]]:
    """pending_shipment -> cancelled_unshipped; a refund in review, the goods taken off sale."""
    moved = await orders.move(
        conn,
        order_ids,
        expected=S.PENDING_SHIPMENT,
        to=deps.lifecycle.next_status(S.PENDING_SHIPMENT, event),
        now=now,
        values={"cancelled_at": now, "cancel_reason": event.value},
        due=t_orders.c.ship_deadline if due_only else None,
    )
    ids = [r.id for r in moved]
    await orders.record_events(
        conn,
        ids,
        event=event.value,
        actor=actor,
        now=now,
        from_status=S.PENDING_SHIPMENT,
        to_status=S.CANCELLED_UNSHIPPED,
    )
    await deps.hold.forfeit(conn, ids, now)
    await _released(conn, deps, moved, "taken off sale", actor=actor, now=now)
    paid = await payments.for_orders(conn, ids, state=payments.PAID)
    await payments.create_refunds(conn, paid, reason=event.value, now=now, actor=actor)
    await timers.cancel_for_orders(conn, ids, now)
    return moved


async def _released(
    conn: AsyncConnection,
    deps: Deps,
    moved: Sequence[Row[Any]],
    how: str,
    *,
    actor: str,
    now: datetime,
) -> None:
    """The ``released`` event of each cancelled order: what it held, and where that went."""
    entries = [(r.id, f"{deps.hold.held(r)} {how}") for r in moved]
    await events.record_each(conn, entries, event="released", actor=actor, now=now)


async def receive(
    conn: AsyncConnection,
    deps: Deps,
    order_ids: Sequence[int],
    *,
    now: datetime,
    event: OrderEvent,
    actor: str,
    due_only: bool,
) -> tuple[list[Row[Any]], list[timers.Armed]]:
    """shipped -> received; the review deadline and its auto_review timer."""
    moved = await orders.move(
        conn,
        order_ids,
        expected=S.SHIPPED,
        to=deps.lifecycle.next_status(S.SHIPPED, event),
        now=now,
        values=lambda order_type: {
            "received_at": now,
            "review_deadline": deps.policy.review_deadline(order_type, now),
        },
        due=t_orders.c.receive_deadline if due_only else None,
    )
    ids = [r.id for r in moved]
    await timers.cancel_for_orders(conn, ids, now)
    armed = await timers.schedule(
        conn,
        [
            timers.NewTimer(
                r.id, TimerKind.AUTO_REVIEW, deps.policy.review_deadline(r.order_type, now)
            )
            for r in moved
        ],
        now,
    )
    await orders.record_events(
        conn,
        ids,
        event=event.value,
        actor=actor,
        now=now,
        from_status=S.SHIPPED,
        to_status=S.RECEIVED,
    )
    return moved, armed


async def complete(
    conn: AsyncConnection,
    deps: Deps,
    order_ids: Sequence[int],
    *,
    now: datetime,
    event: OrderEvent,
    actor: str,
    due_only: bool,
) -> list[Row[Any]]:
    """received -> completed; a default positive review for whoever has none."""
    moved = await orders.move(
        conn,
        order_ids,
        expected=S.RECEIVED,
        to=deps.lifecycle.next_status(S.RECEIVED, event),
        now=now,
        values={"completed_at": now},
        due=t_orders.c.review_deadline if due_only else None,
    )
    ids = [r.id for r in moved]
    reviewed = await aftersale.reviewed_roles(conn, ids)
    defaults = [
        {
            "order_id": r.id,
            "role": role,
            "author_id": r.buyer_id if role == "buyer" else r.seller_id,
            "rating": DEFAULT_RATING,
            "comment": DEFAULT_COMMENT,
            "is_default": True,
            "created_at": now,
        }
        for r in moved
        for role in ("buyer", "seller")
        if role not in reviewed[r.id]
    ]
    await aftersale.insert_reviews(conn, defaults)
    await timers.cancel_for_orders(conn, ids, now)
    await orders.record_events(
        conn,
        ids,
        event=event.value,
        actor=actor,
        now=now,
        from_status=S.RECEIVED,
        to_status=S.COMPLETED,
    )
    return moved
