"""Statements on timers: the durable truth of every deadline.

A timer is scheduled in the same transaction as the order change that needs it, claimed with a
lease and a claim token when due, and finished (done, with its outcome) in the same transaction as
the order transition it causes. Failures go back to scheduled with a backoff, counted in a row
(``failures``: a handler's own retry, finish or re-arm sets it back to 0); at
``timer_max_attempts`` failures in a row a timer is parked until an operator runs it again.

This module writes and revives timers (schedule, cancel, schedule again, run now) and is the one
callers import: the rest lives in private modules behind it and is re-exported here, so a call
stays ``timers.claim_due(...)``, ``timers.retry(...)``:

- ``_timers_common``: the records (``NewTimer``, ``Armed``, ``Claimed``), states and guards
- ``_timers_claims``: claiming (due, by id, the scanner's walk) and holding claims (leases)
- ``_timers_handback``: finishing, retrying, parking and re-arming claimed timers
- ``_timers_reads``: reads for the trigger feed and the dashboard
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Integer,
    String,
    and_,
    bindparam,
    false,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow import tracing
from dueflow.domain.timers import TimerKind, TimerState
from dueflow.store import hot, tally
from dueflow.store._timers_claims import (
    claim_due,
    claim_due_first,
    claim_ids,
    claim_overdue,
    extend_lease,
    release_claims,
    still_claimed,
)
from dueflow.store._timers_common import (
    CLAIMED,
    PARKED,
    SCHEDULED,
    SKIP_LOCKED_DIALECTS,
    WAITING,
    Armed,
    Claimed,
    NewTimer,
    new_token,
)
from dueflow.store._timers_handback import (
    finish,
    finish_by_token,
    finish_or_retry,
    park,
    rearm,
    retry,
)
from dueflow.store._timers_reads import (
    count_by_state,
    for_order,
    get,
    lateness_since,
    next_due_at,
    next_lease_end,
    overdue,
    overdue_first,
    scheduled_among,
    scheduled_between,
    stuck,
)
from dueflow.store.schema import orders, timers
from dueflow.store.types import UTCDateTime

__all__ = [
    "CLAIMED",
    "ORDER_LIFE_KINDS",
    "PARKED",
    "SCHEDULED",
    "SKIP_LOCKED_DIALECTS",
    "Armed",
    "Claimed",
    "NewTimer",
    "cancel_for_orders",
    "claim_due",
    "claim_due_first",
    "claim_ids",
    "claim_overdue",
    "count_by_state",
    "extend_lease",
    "finish",
    "finish_by_token",
    "finish_or_retry",
    "for_order",
    "get",
    "lateness_since",
    "new_token",
    "next_due_at",
    "next_lease_end",
    "overdue",
    "overdue_first",
    "park",
    "rearm",
    "release_claims",
    "retry",
    "run_now",
    "schedule",
    "schedule_again",
    "schedule_for_orders",
    "schedule_rows",
    "scheduled_among",
    "scheduled_between",
    "still_claimed",
    "stuck",
]

#: The kinds an order move makes obsolete (not REFUND_CHECK: a refund is followed to the end;
#: not CLOSE_ATTEMPTS: a paid order's leftover trades are closed whatever the order does next).
#: Nor SHOW_CANCEL: a show's cancel outlives the payment (a paid order of a cancelled show is
#: cancelled too). Nor ORDER_CLOSED: the buyer is told of the cancel that wrote it.
ORDER_LIFE_KINDS = tuple(
    kind
    for kind in TimerKind
    if kind
    not in (
        TimerKind.REFUND_CHECK,
        TimerKind.CLOSE_ATTEMPTS,
        TimerKind.SHOW_CANCEL,
        TimerKind.ORDER_CLOSED,
    )
)  # Enum(value) is slow on hot paths


async def schedule(conn: AsyncConnection, new: Sequence[NewTimer], now: datetime) -> list[Armed]:
    """Write timers (one per order and kind); returns them for the trigger."""
    return [Armed(id=r["id"], due_at=r["due_at"]) for r in await schedule_rows(conn, new, now)]


async def schedule_rows(
    conn: AsyncConnection, new: Sequence[NewTimer], now: datetime
) -> list[dict[str, Any]]:
    """:func:`schedule`, returning the rows as written with their ids (one multi-row INSERT,
    with RETURNING where the dialect has it), in id order."""
    if not new:
        return []
    rows = [
        {
            "order_id": t.order_id,
            "kind": t.kind.value,
            "deadline_at": t.due_at,
            "due_at": t.due_at,
            "state": TimerState.SCHEDULED.value,
            "attempts": 0,
            "failures": 0,
            "stuck": False,
            "created_at": now,
        }
        for t in new
    ]
    traceparent = tracing.current_traceparent()
    if traceparent is not None:  # while tracing is off the INSERT is the same as without it
        for row in rows:
            row["trace_parent"] = traceparent
    written: Sequence[Any]
    if traceparent is None and conn.dialect.insert_returning and len(rows) <= 2:
        # Run hot: one multi-row INSERT ... RETURNING (a placing transaction's two timers).
        statement = hot.inserting(timers, _SCHEDULE_COLUMNS, len(rows), _WRITTEN)
        written = await statement.all(conn, rows)
    elif conn.dialect.insert_executemany_returning:
        written = (await conn.execute(_SCHEDULE_RETURNING, rows)).all()
    else:
        await conn.execute(_SCHEDULE, rows)
        query = select(*_WRITTEN).where(
            or_(
                *(and_(timers.c.order_id == t.order_id, timers.c.kind == t.kind.value) for t in new)
            )
        )
        written = (await conn.execute(query)).all()
    ids = {(r.order_id, r.kind): r.id for r in written}
    for row in rows:
        row["id"] = ids[(row["order_id"], row["kind"])]
    return sorted(rows, key=lambda row: row["id"])


#: Built once (schedule runs in every placing transaction).
_WRITTEN = (timers.c.id, timers.c.order_id, timers.c.kind)
_SCHEDULE = insert(timers)
_SCHEDULE_COLUMNS = (
    "order_id",
    "kind",
    "deadline_at",
    "due_at",
    "state",
    "attempts",
    "failures",
    "stuck",
    "created_at",
)
_SCHEDULE_RETURNING = insert(timers).returning(*_WRITTEN)


#: :func:`cancel_for_orders` of one order's order-life timers (a payment's confirm), run hot;
#: its kinds and states are constants, so no IN list.
_CANCEL_ONE = hot.Hot(
    update(timers)
    .where(
        timers.c.order_id == bindparam("order_id"),
        or_(*(func.coalesce(timers.c.state, "") == state for state in WAITING)),
        or_(*(timers.c.kind == kind.value for kind in ORDER_LIFE_KINDS)),
    )
    .values(
        state=TimerState.CANCELLED.value,
        outcome=bindparam("reason", type_=timers.c.outcome.type),
        done_at=bindparam("now", type_=timers.c.done_at.type),
        lease_until=None,
    )
)


async def cancel_for_orders(
    conn: AsyncConnection,
    order_ids: Sequence[int],
    now: datetime,
    *,
    kinds: Iterable[TimerKind] | None = None,
    reason: str = "order moved on",
) -> int:
    """Cancel the scheduled and parked timers of these orders (claimed ones finish and see the
    order moved; a parked one is obsolete). By default only the order-life kinds: a refund's
    check outlives every move."""
    if not order_ids:
        return 0
    if len(order_ids) == 1 and kinds is None:
        return await _CANCEL_ONE.rowcount(conn, order_id=order_ids[0], now=now, reason=reason)
    kinds = ORDER_LIFE_KINDS if kinds is None else kinds
    guard = [
        tally.among(conn, timers.c.order_id, order_ids),
        # By the orders' (order_id, kind) index, never the live-timers one: SQLite's planner
        # otherwise walks every scheduled timer for each pay or cancel.
        func.coalesce(timers.c.state, "").in_(WAITING),
        timers.c.kind.in_([k.value for k in kinds]),
    ]
    result = await conn.execute(
        update(timers)
        .where(*guard)
        .values(state=TimerState.CANCELLED.value, outcome=reason, done_at=now, lease_until=None)
    )
    return int(result.rowcount)


async def schedule_for_orders(
    conn: AsyncConnection,
    order_ids: Sequence[int],
    kind: TimerKind,
    due_at: datetime,
    now: datetime,
) -> list[Armed]:
    """Write one ``kind`` timer due at ``due_at`` for each of these orders (a batch's notices):
    one INSERT ... SELECT, no parameters per row; returns them for the trigger."""
    if not order_ids:
        return []
    rows = select(
        orders.c.id,
        literal(kind.value, String),
        literal(due_at, UTCDateTime),
        literal(due_at, UTCDateTime),
        SCHEDULED,
        literal(0, Integer),
        false(),
        literal(now, UTCDateTime),
    ).where(tally.among(conn, orders.c.id, order_ids))
    columns = ["order_id", "kind", "deadline_at", "due_at", "state", "attempts", "stuck"]
    columns.append("created_at")
    traceparent = tracing.current_traceparent()
    if traceparent is not None:
        rows = rows.add_columns(literal(traceparent, String))
        columns.append("trace_parent")
    statement = insert(timers).from_select(columns, rows)
    if conn.dialect.insert_returning:
        result = await conn.execute(statement.returning(timers.c.id))
        return [Armed(id=timer_id, due_at=due_at) for timer_id in result.scalars()]
    await conn.execute(statement)
    query = select(timers.c.id).where(
        tally.among(conn, timers.c.order_id, order_ids), timers.c.kind == kind.value
    )
    return [Armed(id=timer_id, due_at=due_at) for timer_id in (await conn.execute(query)).scalars()]


async def schedule_again(
    conn: AsyncConnection, order_id: int, kind: TimerKind, due_at: datetime, now: datetime
) -> list[Armed]:
    """Make sure the order's ``kind`` timer is scheduled: a finished or parked one is scheduled
    again at ``due_at``, a missing one is created, a live one is left as it is."""
    result = await conn.execute(
        update(timers)
        .where(
            timers.c.order_id == order_id,
            timers.c.kind == kind.value,
            timers.c.state.in_(
                [TimerState.DONE.value, TimerState.CANCELLED.value, TimerState.PARKED.value]
            ),
        )
        .values(
            state=TimerState.SCHEDULED.value,
            due_at=due_at,
            deadline_at=due_at,
            attempts=0,
            failures=0,
            stuck=False,
            claim_token=None,
            lease_until=None,
            outcome=None,
            last_error=None,
            done_at=None,
        )
    )
    if result.rowcount:
        return [Armed(id=r.id, due_at=due_at) for r in await _of_kind(conn, order_id, kind)]
    if await _of_kind(conn, order_id, kind):
        return []
    return await schedule(conn, [NewTimer(order_id, kind, due_at)], now)


async def _of_kind(conn: AsyncConnection, order_id: int, kind: TimerKind) -> list[Any]:
    query = select(timers.c.id).where(timers.c.order_id == order_id, timers.c.kind == kind.value)
    return list((await conn.execute(query)).all())


async def run_now(conn: AsyncConnection, timer_id: int, *, now: datetime) -> Armed | None:
    """Make a scheduled timer whose deadline has passed (overdue, or waiting out a backoff,
    or stuck), or a parked one, due now and clear its stuck flag; None when it is neither
    (claimed by a worker, done or cancelled) or its deadline is still ahead. Its attempts and
    failures are kept, so a timer that fails again is flagged stuck (or parked) again at once."""
    result = await conn.execute(
        update(timers)
        .where(
            timers.c.id == timer_id,
            timers.c.state.in_(WAITING),
            timers.c.deadline_at <= now,
        )
        .values(
            state=TimerState.SCHEDULED.value, due_at=now, stuck=False, outcome=None, done_at=None
        )
    )
    return Armed(id=timer_id, due_at=now) if result.rowcount else None
