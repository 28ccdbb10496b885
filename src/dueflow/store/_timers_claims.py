"""Claiming due timers and holding the claims: by the due scan, by the ids a trigger delivered,
by the scanner's walk; leases renewed, claims handed back untouched, claims still held."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select, text, update
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain import timers as timer_rules
from dueflow.domain.timers import TimerState
from dueflow.store import tally
from dueflow.store._schema_timers import MUST_HAPPEN_KINDS
from dueflow.store._timers_common import (
    CLAIMED,
    KINDS,
    SCHEDULED,
    Claimed,
    by_token,
    held_under,
    in_state,
    locking,
    new_token,
    walk,
)
from dueflow.store.schema import timers


def _claimable(now: datetime) -> Any:
    return and_(timers.c.state == SCHEDULED, timers.c.due_at <= now)


def _lease_expired(now: datetime) -> Any:
    return and_(timers.c.state == CLAIMED, timers.c.lease_until <= now)


def _due_by_id(now: datetime) -> Any:
    """:func:`_claimable` for a claim by id."""
    return and_(in_state(TimerState.SCHEDULED), timers.c.due_at <= now)


_CLAIMED_COLUMNS = (
    timers.c.trace_parent,
    timers.c.id,
    timers.c.order_id,
    timers.c.kind,
    timers.c.deadline_at,
    timers.c.due_at,
    timers.c.attempts,
    timers.c.failures,
)


async def _take(
    conn: AsyncConnection, ids: Sequence[int], guard: Any, now: datetime, lease: timedelta
) -> list[Claimed]:
    if not ids:
        return []
    token = new_token()
    claim = (
        update(timers)
        .where(tally.among(conn, timers.c.id, ids), guard)
        .values(
            state=TimerState.CLAIMED.value,
            attempts=timers.c.attempts + 1,
            lease_until=now + lease,
            claim_token=token,
        )
    )
    if conn.dialect.update_returning:
        rows = list((await conn.execute(claim.returning(*_CLAIMED_COLUMNS))).all())
    else:
        await conn.execute(claim)
        query = select(*_CLAIMED_COLUMNS).where(timers.c.id.in_(ids), timers.c.claim_token == token)
        rows = list((await conn.execute(query)).all())
    rows.sort(key=lambda r: (r.due_at, r.id))
    return [
        Claimed(
            id=r.id,
            order_id=r.order_id,
            kind=KINDS[r.kind],
            deadline_at=r.deadline_at,
            due_at=r.due_at,
            attempts=r.attempts,
            token=token,
            failures=r.failures,
            trace_parent=r.trace_parent,
        )
        for r in rows
    ]


async def claim_due(
    conn: AsyncConnection, *, now: datetime, limit: int, lease: timedelta
) -> list[Claimed]:
    """Claim up to ``limit`` scheduled timers that are due, earliest first."""
    query = (
        select(timers.c.id)
        .where(_claimable(now))
        .order_by(timers.c.due_at, timers.c.id)
        .limit(limit)
    )
    ids = list((await conn.execute(locking(conn, query))).scalars())
    return await _take(conn, ids, _due_by_id(now), now, lease)


#: The must-happen kinds as literals, the very test ix_timers_must is partial on.
_MUST_HAPPEN = text(f"timers.kind IN {MUST_HAPPEN_KINDS}")


def must_happen_due(now: datetime, limit: int) -> Any:
    """The must-happen timers due at ``now``, earliest first (read by ``ix_timers_must``)."""
    return (
        select(timers.c.id)
        .where(_claimable(now), _MUST_HAPPEN)
        .order_by(timers.c.due_at, timers.c.id)
        .limit(limit)
    )


async def claim_due_first(
    conn: AsyncConnection, *, now: datetime, limit: int, lease: timedelta
) -> list[Claimed]:
    """The claim of a worker that is behind: up to ``limit`` due timers, the must-happen kinds
    first (``domain.timers.MUST_HAPPEN``, earliest due first, by ``ix_timers_must``), and a
    share (:func:`~dueflow.domain.timers.due_order_share`) taken in due order whatever the kind,
    which also gets whatever the must-happen timers leave. So messages still move, at that
    share of the claims at least, and are never later than in due order at that share's rate.
    One statement more than :func:`claim_due` (two reads, one update) for a whole batch."""
    share = timer_rules.due_order_share(limit)
    first = must_happen_due(now, limit - share)
    ids = list((await conn.execute(locking(conn, first))).scalars())
    # Rows this transaction locked already are not skipped: the oldest may be among them.
    oldest = (
        select(timers.c.id)
        .where(_claimable(now))
        .order_by(timers.c.due_at, timers.c.id)
        .limit(limit - len(ids))
    )
    taken = set(ids)
    ids += [i for i in (await conn.execute(locking(conn, oldest))).scalars() if i not in taken]
    return await _take(conn, ids, _due_by_id(now), now, lease)


async def claim_ids(
    conn: AsyncConnection, ids: Sequence[int], *, now: datetime, lease: timedelta
) -> list[Claimed]:
    """Claim these timers if they are scheduled and due; anything else (done, cancelled, claimed,
    not yet due) is left alone, so a stray or repeated delivery never acts."""
    return await _take(conn, sorted(set(ids)), _due_by_id(now), now, lease)


async def claim_overdue(
    conn: AsyncConnection,
    *,
    now: datetime,
    cutoff: datetime,
    after: tuple[datetime, int] | None,
    limit: int,
    lease: timedelta,
) -> tuple[list[Claimed], tuple[datetime, int] | None]:
    """The scanner's walk: claim scheduled timers due at or before ``cutoff`` and claims whose
    lease has expired, in (due_at, id) order after ``after``. Returns the claims and where the
    walk stands (None once nothing is left)."""
    missed = or_(
        and_(timers.c.state == SCHEDULED, timers.c.due_at <= cutoff),
        _lease_expired(now),
    )
    query = walk(select(timers.c.id, timers.c.due_at).where(missed), after, limit)
    rows = list((await conn.execute(locking(conn, query))).all())
    if not rows:
        return [], None
    still = or_(
        and_(in_state(TimerState.SCHEDULED), timers.c.due_at <= cutoff),
        and_(in_state(TimerState.CLAIMED), timers.c.lease_until <= now),
    )
    claimed = await _take(conn, [r.id for r in rows], still, now, lease)
    return claimed, (rows[-1].due_at, rows[-1].id)


async def release_claims(conn: AsyncConnection, claimed: Sequence[Claimed]) -> int:
    """Hand claims back untouched (graceful shutdown): scheduled again, the attempt not counted."""
    changed = 0
    for token, ids in by_token(claimed):
        result = await conn.execute(
            update(timers)
            .where(*held_under(conn, ids, token))
            .values(
                state=TimerState.SCHEDULED.value,
                attempts=timers.c.attempts - 1,
                lease_until=None,
                claim_token=None,
            )
        )
        changed += int(result.rowcount)
    return changed


async def extend_lease(
    conn: AsyncConnection, claimed: Sequence[Claimed], *, until: datetime
) -> int:
    """Keep holding claims still being worked on: their lease runs to ``until``. Claims that
    were finished, retried or taken over meanwhile are left alone. Returns how many were held."""
    held = 0
    for token, ids in by_token(claimed):
        result = await conn.execute(
            update(timers).where(*held_under(conn, ids, token)).values(lease_until=until)
        )
        held += int(result.rowcount)
    return held


async def still_claimed(conn: AsyncConnection, claimed: Sequence[Claimed]) -> list[Claimed]:
    """Those of ``claimed`` still held under their claim token: not finished, retried or taken
    over since (a handler's transaction that committed before a failure finished its timers)."""
    held: set[int] = set()
    for token, ids in by_token(claimed):
        query = select(timers.c.id).where(*held_under(conn, ids, token))
        held.update((await conn.execute(query)).scalars())
    return [t for t in claimed if t.id in held]
