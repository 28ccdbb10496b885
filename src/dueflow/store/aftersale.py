"""Statements on reminders and reviews: each exists at most once (unique per order and kind/role)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store.schema import reminders, reviews

REMINDER_PENDING = "pending"
REMINDER_SENT = "sent"


async def claim_reminders(
    conn: AsyncConnection, order_ids: Sequence[int], *, kind: str, now: datetime
) -> list[Row[Any]]:
    """The reminders of these orders that still need sending, creating the missing ones."""
    if not order_ids:
        return []
    query = select(reminders).where(reminders.c.order_id.in_(order_ids), reminders.c.kind == kind)
    existing = {r.order_id for r in (await conn.execute(query)).all()}
    missing = [oid for oid in order_ids if oid not in existing]
    if missing:
        await conn.execute(
            insert(reminders),
            [
                {"order_id": oid, "kind": kind, "state": REMINDER_PENDING, "created_at": now}
                for oid in missing
            ],
        )
    pending = query.where(reminders.c.state == REMINDER_PENDING)
    return list((await conn.execute(pending)).all())


async def mark_sent(conn: AsyncConnection, reminder_ids: Sequence[int], now: datetime) -> int:
    """Mark reminders sent."""
    if not reminder_ids:
        return 0
    result = await conn.execute(
        update(reminders)
        .where(reminders.c.id.in_(reminder_ids), reminders.c.state == REMINDER_PENDING)
        .values(state=REMINDER_SENT, sent_at=now)
    )
    return int(result.rowcount)


async def reviewed_roles(conn: AsyncConnection, order_ids: Sequence[int]) -> dict[int, set[str]]:
    """Which roles have reviewed each order."""
    result: dict[int, set[str]] = {oid: set() for oid in order_ids}
    if not order_ids:
        return result
    query = select(reviews.c.order_id, reviews.c.role).where(reviews.c.order_id.in_(order_ids))
    for order_id, role in (await conn.execute(query)).all():
        result[order_id].add(role)
    return result


async def insert_reviews(conn: AsyncConnection, rows: Sequence[dict[str, Any]]) -> None:
    """Write reviews (the caller has checked none exists for the role; the unique key backs it)."""
    if rows:
        await conn.execute(insert(reviews), list(rows))


async def for_order(conn: AsyncConnection, order_id: int) -> list[Row[Any]]:
    """The order's reviews."""
    query = select(reviews).where(reviews.c.order_id == order_id).order_by(reviews.c.id)
    return list((await conn.execute(query)).all())
