"""Reads of the timers: the next due time, what is scheduled among ids or in a window, an order's
timers, the dashboard's counts (by state, overdue, stuck) and lateness."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, text, union_all
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain.timers import TimerState
from dueflow.store._schema_timers import STUCK_TIMERS
from dueflow.store._timers_common import CLAIMED, SCHEDULED, Armed, in_state, walk
from dueflow.store.schema import timers


async def next_due_at(conn: AsyncConnection) -> datetime | None:
    """When the earliest scheduled timer is due."""
    query = select(func.min(timers.c.due_at)).where(timers.c.state == SCHEDULED)
    value: datetime | None = (await conn.execute(query)).scalar()
    return value


async def next_lease_end(conn: AsyncConnection) -> datetime | None:
    """When the earliest lease of a claim still held runs out (the scanner wakes then: a
    killed or frozen worker's claims come back a lease after its last claim or renewal)."""
    query = select(func.min(timers.c.lease_until)).where(timers.c.state == CLAIMED)
    value: datetime | None = (await conn.execute(query)).scalar()
    return value


async def scheduled_among(conn: AsyncConnection, ids: Sequence[int]) -> list[Armed]:
    """Those of ``ids`` that are scheduled, with their due times."""
    if not ids:
        return []
    query = select(timers.c.id, timers.c.due_at).where(
        timers.c.id.in_(ids), in_state(TimerState.SCHEDULED)
    )
    return [Armed(id=r.id, due_at=r.due_at) for r in (await conn.execute(query)).all()]


async def scheduled_between(
    conn: AsyncConnection,
    *,
    since: datetime | None,
    until: datetime,
    after: tuple[datetime, int] | None,
    limit: int,
) -> list[Armed]:
    """Scheduled timers due in (since, until], in (due_at, id) order after ``after``."""
    query = select(timers.c.id, timers.c.due_at).where(
        timers.c.state == SCHEDULED, timers.c.due_at <= until
    )
    if since is not None:
        query = query.where(timers.c.due_at > since)
    query = walk(query, after, limit)
    return [Armed(id=r.id, due_at=r.due_at) for r in (await conn.execute(query)).all()]


async def for_order(conn: AsyncConnection, order_id: int) -> list[Any]:
    """The order's timers."""
    query = select(timers).where(timers.c.order_id == order_id).order_by(timers.c.id)
    return list((await conn.execute(query)).all())


async def count_by_state(conn: AsyncConnection) -> dict[str, int]:
    """How many timers are in each state."""
    query = select(timers.c.state, func.count()).group_by(timers.c.state)
    return {state: count for state, count in (await conn.execute(query)).all()}


async def overdue(conn: AsyncConnection, *, now: datetime, grace: timedelta) -> int:
    """Live timers whose due time passed more than ``grace`` ago: a range of ix_timers_live
    per live state. (``state IN (...)`` is the partial index's own predicate: PostgreSQL then
    drops it and walks every live timer for the due times, 13 ms over 80,000 live timers for
    none overdue; one state at a time it is a seek, 0.1 ms.)"""
    due = now - grace
    per_state = [
        select(func.count())
        .select_from(timers)
        .where(timers.c.state == state, timers.c.due_at <= due)
        for state in (SCHEDULED, CLAIMED)
    ]
    query = select(per_state[0].scalar_subquery() + per_state[1].scalar_subquery())
    return int((await conn.execute(query)).scalar_one())


def overdue_first(due: datetime, limit: int) -> Any:
    """The ids and due times of the ``limit`` live timers due first at or before ``due`` (a
    subquery: ``id``, ``due_at``), each live state a range of ix_timers_live merged (as
    :func:`overdue`)."""
    per_state = [
        select(timers.c.id, timers.c.due_at)
        .where(timers.c.state == state, timers.c.due_at <= due)
        .order_by(timers.c.due_at, timers.c.id)
        .limit(limit)
        .subquery()
        for state in (SCHEDULED, CLAIMED)
    ]
    return union_all(*(select(part) for part in per_state)).subquery()


async def stuck(conn: AsyncConnection) -> int:
    """Live timers flagged stuck (the partial index of stuck timers' own predicate, so it
    serves under a generic prepared plan too)."""
    query = select(func.count()).select_from(timers).where(text(STUCK_TIMERS))
    return int((await conn.execute(query)).scalar_one())


async def get(conn: AsyncConnection, timer_id: int) -> Any:
    """The timer's row, or None."""
    return (await conn.execute(select(timers).where(timers.c.id == timer_id))).first()


async def lateness_since(
    conn: AsyncConnection, since: datetime, *, sample: int = 5000
) -> tuple[dict[str, int], list[tuple[str, float]]]:
    """Of the timers done since ``since`` on their first attempt (a retried timer's lateness is
    its failures' backoff, not the trigger's): how many of each kind, and (kind, seconds from
    deadline to firing) of the latest ``sample`` of them (an hour of a herd is 100,000s)."""
    where = (
        timers.c.done_at >= since,
        timers.c.state == TimerState.DONE.value,
        timers.c.attempts == 1,
    )
    counted = select(timers.c.kind, func.count()).where(*where).group_by(timers.c.kind)
    counts = {kind: int(n) for kind, n in (await conn.execute(counted)).all()}
    latest = (
        select(timers.c.kind, timers.c.deadline_at, timers.c.done_at)
        .where(*where)
        .order_by(timers.c.done_at.desc())
        .limit(sample)
    )
    rows = (await conn.execute(latest)).all()
    return counts, [(kind, (done - deadline).total_seconds()) for kind, deadline, done in rows]
