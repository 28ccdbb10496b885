"""Discrepancies: money a payment attempt and its order disagree about (paid twice, paid after
the cancel, given back by the provider, another amount), recorded for an operator to settle."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain.events import attempt_data
from dueflow.store import orders, payments


async def record(
    conn: AsyncConnection,
    attempt: Row[Any],
    kind: str,
    detail: str,
    *,
    actor: str,
    now: datetime,
    **data: Any,
) -> None:
    """In the caller's write transaction: the discrepancy ``kind`` of the attempt, and its
    entry on the order's timeline (``kind: detail``; its data the kind, the attempt's provider,
    pay_no and amount, and what the kind adds, ``data``: docs/events.md)."""
    order_id = attempt.order_id
    await payments.record_discrepancy(
        conn, kind=kind, order_id=order_id, payment_id=attempt.id, detail=detail, now=now
    )
    await orders.record_events(
        conn,
        [order_id],
        event="discrepancy",
        actor=actor,
        now=now,
        detail=f"{kind}: {detail}",
        data={"kind": kind, **attempt_data(attempt), **data},
    )
