"""Statements on reminders and reviews: each exists at most once (unique per order and kind/role)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Column, Row, and_, case, func, insert, or_, select, true, update
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store import tally
from dueflow.store.schema import orders, reminders, reviews

REMINDER_PENDING = "pending"
REMINDER_SENDING = "sending"
REMINDER_SENT = "sent"
#: Sent, never confirmed, and no more sends (out of sends, or its order moved on).
REMINDER_UNKNOWN = "unknown"


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
    of_orders = and_(tally.among(conn, reminders.c.order_id, order_ids), reminders.c.kind == kind)
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
        tally.among(conn, reminders.c.order_id, order_ids), reminders.c.kind == kind
    )
    return {order_id: state for order_id, state in (await conn.execute(query)).all()}


async def renew_reminders(
    conn: AsyncConnection,
    reminder_ids: Sequence[int],
    *,
    token: str,
    wave: str,
    now: datetime,
    lease: timedelta,
    max_deliveries: int,
    order_statuses: Sequence[str],
    deadline: Column[Any] | None,
) -> set[int]:
    """Right before their sends: count a delivery and extend the claim's lease of each of these
    reminders that may still go out. That is: the claim is still ours (``token``: nobody took
    it after our lease ran out), it has sends left, and its order is still in one of
    ``order_statuses`` (with ``deadline`` ahead, if given). One statement for all of them; each
    renewed reminder is then held under ``wave`` (a fresh token) until its outcome is recorded,
    which is how the dialects without UPDATE ... RETURNING learn which were renewed. Returns
    the ids to send."""
    if not reminder_ids:
        return set()
    # The order is reached by its id alone: the status test is one no index serves (after a
    # herd PostgreSQL's statistics say no order is cancelled, and it would walk the status
    # index for every reminder).
    status = func.coalesce(orders.c.status, "")
    guard = [orders.c.id == reminders.c.order_id, status.in_(order_statuses)]
    if deadline is not None:
        guard.append(deadline > now)
    order_waits = select(orders.c.id).where(*guard).exists()
    statement = (
        update(reminders)
        .where(
            tally.among(conn, reminders.c.id, reminder_ids),
            reminders.c.claim_token == token,
            reminders.c.state == REMINDER_SENDING,
            reminders.c.deliveries < max_deliveries,
            order_waits,
        )
        .values(deliveries=reminders.c.deliveries + 1, lease_until=now + lease, claim_token=wave)
    )
    if conn.dialect.update_returning:
        return set((await conn.execute(statement.returning(reminders.c.id))).scalars())
    await conn.execute(statement)
    held = select(reminders.c.id).where(
        tally.among(conn, reminders.c.id, reminder_ids), reminders.c.claim_token == wave
    )
    return set((await conn.execute(held)).scalars())


async def settle_reminders(
    conn: AsyncConnection, reminder_ids: Sequence[int], *, token: str, sent: bool, now: datetime
) -> int:
    """Record that these claimed reminders were sent, or give them back to be sent later; a
    send given back provably did not deliver, so it is not counted. Returns how many were
    still ours."""
    values: dict[str, Any] = (
        {"state": REMINDER_SENT, "sent_at": now, "lease_until": None}
        if sent
        else {
            "state": REMINDER_PENDING,
            "claim_token": None,
            "lease_until": None,
            "deliveries": case((reminders.c.deliveries > 0, reminders.c.deliveries - 1), else_=0),
        }
    )
    return await _settle(conn, reminder_ids, token, values)


async def settle_reminder(
    conn: AsyncConnection, reminder_id: int, *, token: str, sent: bool, now: datetime
) -> bool:
    """:func:`settle_reminders` for one reminder: whether it was still ours."""
    return await settle_reminders(conn, [reminder_id], token=token, sent=sent, now=now) == 1


async def record_unknowns(
    conn: AsyncConnection, reminder_ids: Sequence[int], *, token: str, give_up: bool
) -> int:
    """Record sends whose outcome is unknown (they stay counted): the reminders are given back
    to be sent again later, or, with ``give_up``, never sent again."""
    state = REMINDER_UNKNOWN if give_up else REMINDER_PENDING
    values = {"state": state, "claim_token": None, "lease_until": None}
    return await _settle(conn, reminder_ids, token, values)


async def _settle(
    conn: AsyncConnection, reminder_ids: Sequence[int], token: str, values: dict[str, Any]
) -> int:
    if not reminder_ids:
        return 0
    result = await conn.execute(
        update(reminders)
        .where(
            tally.among(conn, reminders.c.id, reminder_ids),
            reminders.c.claim_token == token,
            reminders.c.state == REMINDER_SENDING,
        )
        .values(**values)
    )
    return int(result.rowcount)


async def give_up_reminders(
    conn: AsyncConnection, order_ids: Sequence[int], *, kind: str, now: datetime
) -> int:
    """The reminders of orders that moved on which may have been delivered (sent without an
    answer) and wait to be sent again: never sent again, their outcome unknown."""
    if not order_ids:
        return 0
    waiting = or_(
        reminders.c.state == REMINDER_PENDING,
        and_(reminders.c.state == REMINDER_SENDING, reminders.c.lease_until <= now),
    )
    result = await conn.execute(
        update(reminders)
        .where(
            tally.among(conn, reminders.c.order_id, order_ids),
            reminders.c.kind == kind,
            reminders.c.deliveries > 0,
            waiting,
        )
        .values(state=REMINDER_UNKNOWN, claim_token=None, lease_until=None)
    )
    return int(result.rowcount)


async def reminder(conn: AsyncConnection, reminder_id: int) -> Row[Any] | None:
    """One reminder row."""
    query = select(reminders).where(reminders.c.id == reminder_id)
    return (await conn.execute(query)).first()


async def reminders_by_id(conn: AsyncConnection, reminder_ids: Sequence[int]) -> list[Row[Any]]:
    """These reminder rows."""
    if not reminder_ids:
        return []
    query = select(reminders).where(reminders.c.id.in_(reminder_ids))
    return list((await conn.execute(query)).all())


async def delivered_twice(conn: AsyncConnection, among: Sequence[int] | None = None) -> list[int]:
    """The orders (of ``among``; None: every order) with a reminder that may have reached its
    receiver more than once."""
    query = (
        select(reminders.c.order_id)
        .where(reminders.c.deliveries > 1)
        .where(true() if among is None else tally.among(conn, reminders.c.order_id, among))
        .distinct()
        .order_by(reminders.c.order_id)
    )
    return list((await conn.execute(query)).scalars())


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


async def reminders_for(conn: AsyncConnection, order_id: int) -> list[Row[Any]]:
    """The order's reminders and notices (kind, state, deliveries, created_at, sent_at)."""
    query = (
        select(
            reminders.c.kind,
            reminders.c.state,
            reminders.c.deliveries,
            reminders.c.created_at,
            reminders.c.sent_at,
        )
        .where(reminders.c.order_id == order_id)
        .order_by(reminders.c.id)
    )
    rows: list[Any] = list((await conn.execute(query)).all())
    return rows
