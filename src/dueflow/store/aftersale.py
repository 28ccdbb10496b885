"""Statements on reminders and reviews: each exists at most once (unique per order and kind/role)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Row, and_, insert, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store.schema import reminders, reviews

REMINDER_PENDING = "pending"
REMINDER_SENDING = "sending"
REMINDER_SENT = "sent"


async def claim_reminders(
    conn: AsyncConnection,
    order_ids: Sequence[int],
    *,
    kind: str,
    now: datetime,
    lease: timedelta,
    token: str,
) -> list[Row[Any]]:
    """Take, for this handler alone, the reminders of these orders that still need sending
    (creating the missing ones): pending ones, and ones whose sender's lease ran out."""
    if not order_ids:
        return []
    of_orders = and_(reminders.c.order_id.in_(order_ids), reminders.c.kind == kind)
    existing = {
        r for r in (await conn.execute(select(reminders.c.order_id).where(of_orders))).scalars()
    }
    missing = [oid for oid in order_ids if oid not in existing]
    if missing:
        await conn.execute(
            insert(reminders),
            [
                {"order_id": oid, "kind": kind, "state": REMINDER_PENDING, "created_at": now}
                for oid in missing
            ],
        )
    takeable = or_(
        reminders.c.state == REMINDER_PENDING,
        and_(reminders.c.state == REMINDER_SENDING, reminders.c.lease_until <= now),
    )
    await conn.execute(
        update(reminders)
        .where(of_orders, takeable)
        .values(state=REMINDER_SENDING, claim_token=token, lease_until=now + lease)
    )
    mine = select(reminders).where(of_orders, reminders.c.claim_token == token)
    return list((await conn.execute(mine)).all())


async def reminder_states(
    conn: AsyncConnection, order_ids: Sequence[int], *, kind: str
) -> dict[int, str]:
    """The state of each order's reminder of ``kind``."""
    if not order_ids:
        return {}
    query = select(reminders.c.order_id, reminders.c.state).where(
        reminders.c.order_id.in_(order_ids), reminders.c.kind == kind
    )
    return {order_id: state for order_id, state in (await conn.execute(query)).all()}


async def settle_reminder(
    conn: AsyncConnection, reminder_id: int, *, token: str, sent: bool, now: datetime
) -> bool:
    """Record that a claimed reminder was sent, or give it back to be sent later."""
    values: dict[str, Any] = (
        {"state": REMINDER_SENT, "sent_at": now, "lease_until": None}
        if sent
        else {"state": REMINDER_PENDING, "claim_token": None, "lease_until": None}
    )
    result = await conn.execute(
        update(reminders)
        .where(
            reminders.c.id == reminder_id,
            reminders.c.claim_token == token,
            reminders.c.state == REMINDER_SENDING,
        )
        .values(**values)
    )
    return result.rowcount == 1


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
