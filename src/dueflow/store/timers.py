"""Statements on timers: the durable truth of every deadline.

A timer is scheduled in the same transaction as the order change that needs it, claimed with a
lease and a claim token when due, and finished (done, with its outcome) in the same transaction as
the order transition it causes. Failures go back to scheduled with a backoff, counted in a row
(``failures``: a handler's own retry, finish or re-arm sets it back to 0); at
``timer_max_attempts`` failures in a row a timer is parked until an operator runs it again.
"""

from __future__ import annotations

import secrets
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Integer,
    String,
    and_,
    false,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql.expression import ColumnClause

from dueflow.domain.timers import TimerKind, TimerState, backoff, is_stuck
from dueflow.store import tally
from dueflow.store.schema import orders, timers
from dueflow.store.types import UTCDateTime

SKIP_LOCKED_DIALECTS = {"postgresql", "mysql", "mariadb"}
# States compared as SQL literals, not parameters: the planner then knows a query stays inside the
# partial index on live timers (PostgreSQL, SQLite) even as a generic prepared plan.
SCHEDULED: ColumnClause[str] = literal_column("'scheduled'")
CLAIMED: ColumnClause[str] = literal_column("'claimed'")
PARKED: ColumnClause[str] = literal_column("'parked'")
_KINDS = {kind.value: kind for kind in TimerKind}
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


@dataclass(frozen=True)
class NewTimer:
    """A timer to schedule."""

    order_id: int
    kind: TimerKind
    due_at: datetime


@dataclass(frozen=True)
class Armed:
    """A scheduled timer as a trigger needs to know it."""

    id: int
    due_at: datetime


@dataclass(frozen=True)
class Claimed:
    """A timer this worker holds under ``token`` until ``lease_until``."""

    id: int
    order_id: int
    kind: TimerKind
    deadline_at: datetime
    due_at: datetime
    attempts: int
    token: str
    #: The handler's failures on it in a row before this claim.
    failures: int = 0


def new_token() -> str:
    """A fresh claim token (the fence that tells our claim from a later one)."""
    return secrets.token_hex(8)


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
    if conn.dialect.insert_executemany_returning:
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
_SCHEDULE_RETURNING = insert(timers).returning(*_WRITTEN)


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
    kinds = ORDER_LIFE_KINDS if kinds is None else kinds
    guard = [
        tally.among(conn, timers.c.order_id, order_ids),
        # By the orders' (order_id, kind) index, never the live-timers one: SQLite's planner
        # otherwise walks every scheduled timer for each pay or cancel.
        func.coalesce(timers.c.state, "").in_(_WAITING),
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
    statement = insert(timers).from_select([*columns, "created_at"], rows)
    if conn.dialect.insert_returning:
        result = await conn.execute(statement.returning(timers.c.id))
        return [Armed(id=timer_id, due_at=due_at) for timer_id in result.scalars()]
    await conn.execute(statement)
    query = select(timers.c.id).where(
        tally.among(conn, timers.c.order_id, order_ids), timers.c.kind == kind.value
    )
    return [Armed(id=timer_id, due_at=due_at) for timer_id in (await conn.execute(query)).scalars()]


#: The states an order move cancels and an operator's "run again" revives.
_WAITING = (TimerState.SCHEDULED.value, TimerState.PARKED.value)


def _claimable(now: datetime) -> Any:
    return and_(timers.c.state == SCHEDULED, timers.c.due_at <= now)


def _lease_expired(now: datetime) -> Any:
    return and_(timers.c.state == CLAIMED, timers.c.lease_until <= now)


def _in_state(state: TimerState) -> Any:
    """The state test of a statement that finds its timers by id, written so that no index can
    serve it (COALESCE of a column that is never NULL): the planner then goes by the ids. With a
    plain ``state = 'claimed'`` PostgreSQL may walk the live-timers index over every claim in
    flight instead (after a herd its statistics still say there are hardly any): thousands of
    rows read for each statement of a batch."""
    return func.coalesce(timers.c.state, "") == state.value


def _due_by_id(now: datetime) -> Any:
    """:func:`_claimable` for a claim by id."""
    return and_(_in_state(TimerState.SCHEDULED), timers.c.due_at <= now)


_CLAIMED_COLUMNS = (
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
            kind=_KINDS[r.kind],
            deadline_at=r.deadline_at,
            due_at=r.due_at,
            attempts=r.attempts,
            token=token,
            failures=r.failures,
        )
        for r in rows
    ]


def _locking(conn: AsyncConnection, query: Any) -> Any:
    if conn.dialect.name in SKIP_LOCKED_DIALECTS:
        return query.with_for_update(skip_locked=True)
    return query


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
    ids = list((await conn.execute(_locking(conn, query))).scalars())
    return await _take(conn, ids, _due_by_id(now), now, lease)


async def claim_ids(
    conn: AsyncConnection, ids: Sequence[int], *, now: datetime, lease: timedelta
) -> list[Claimed]:
    """Claim these timers if they are scheduled and due; anything else (done, cancelled, claimed,
    not yet due) is left alone, so a stray or repeated delivery never acts."""
    return await _take(conn, sorted(set(ids)), _due_by_id(now), now, lease)


def _walk(query: Any, after: tuple[datetime, int] | None, limit: int) -> Any:
    """The next page of a walk in (due_at, id) order, after the cursor ``after``."""
    if after is not None:
        query = query.where(
            or_(
                timers.c.due_at > after[0],
                and_(timers.c.due_at == after[0], timers.c.id > after[1]),
            )
        )
    return query.order_by(timers.c.due_at, timers.c.id).limit(limit)


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
    query = _walk(select(timers.c.id, timers.c.due_at).where(missed), after, limit)
    rows = list((await conn.execute(_locking(conn, query))).all())
    if not rows:
        return [], None
    still = or_(
        and_(_in_state(TimerState.SCHEDULED), timers.c.due_at <= cutoff),
        and_(_in_state(TimerState.CLAIMED), timers.c.lease_until <= now),
    )
    claimed = await _take(conn, [r.id for r in rows], still, now, lease)
    return claimed, (rows[-1].due_at, rows[-1].id)


async def finish(
    conn: AsyncConnection, outcomes: Mapping[int, str], *, token: str, now: datetime
) -> int:
    """Mark these claimed timers done with their outcomes (only while the claim is still ours)."""
    by_outcome: dict[str, list[int]] = defaultdict(list)
    for timer_id, outcome in outcomes.items():
        by_outcome[outcome[:200]].append(timer_id)
    done = 0
    for outcome, ids in by_outcome.items():
        result = await conn.execute(
            update(timers)
            .where(
                tally.among(conn, timers.c.id, ids),
                timers.c.claim_token == token,
                _in_state(TimerState.CLAIMED),
            )
            .values(
                state=TimerState.DONE.value,
                outcome=outcome,
                done_at=now,
                lease_until=None,
                failures=0,
            )
        )
        done += int(result.rowcount)
    return done


async def retry(
    conn: AsyncConnection,
    claimed: Sequence[Claimed],
    *,
    error: str,
    now: datetime,
    delay: Callable[[int], timedelta] = backoff,
    failed: bool = False,
) -> int:
    """Hand claimed timers back with the error, due again after ``delay(attempts)`` (the
    backoff); flag the stuck ones. ``failed``: the handler failed on them (the worker's
    hand-back), one more failure in a row; else it is the handler's own retry (a refund still
    processing, a payment state not known yet), which sets the failures back to 0."""
    by_attempts: dict[int, list[Claimed]] = defaultdict(list)
    for timer in claimed:
        by_attempts[timer.attempts].append(timer)
    changed = 0
    for attempts, group in by_attempts.items():
        tokens = {t.token for t in group}
        for token in tokens:
            ids = [t.id for t in group if t.token == token]
            result = await conn.execute(
                update(timers)
                .where(
                    tally.among(conn, timers.c.id, ids),
                    timers.c.claim_token == token,
                    _in_state(TimerState.CLAIMED),
                )
                .values(
                    state=TimerState.SCHEDULED.value,
                    due_at=now + delay(attempts),
                    stuck=is_stuck(attempts),
                    last_error=error[:2000],
                    lease_until=None,
                    claim_token=None,
                    failures=timers.c.failures + 1 if failed else 0,
                )
            )
            changed += int(result.rowcount)
    return changed


async def park(
    conn: AsyncConnection, claimed: Sequence[Claimed], *, error: str, now: datetime
) -> list[int]:
    """Park claimed timers whose handler failed on them ``timer_max_attempts`` times in a row:
    no worker takes them again until :func:`run_now`. Returns the ids of those parked (still
    ours to park: not finished, retried or taken over since)."""
    parked: list[int] = []
    for token, ids in _by_token(claimed):
        guard = (
            tally.among(conn, timers.c.id, ids),
            timers.c.claim_token == token,
            _in_state(TimerState.CLAIMED),
        )
        statement = (
            update(timers)
            .where(*guard)
            .values(
                state=TimerState.PARKED.value,
                outcome="parked: its handler kept failing on it",
                last_error=error[:2000],
                done_at=now,
                lease_until=None,
                claim_token=None,
                failures=timers.c.failures + 1,
            )
        )
        if conn.dialect.update_returning:
            parked.extend((await conn.execute(statement.returning(timers.c.id))).scalars())
            continue
        # No UPDATE ... RETURNING (MariaDB): the rows still ours, locked, then parked.
        mine = list(
            (await conn.execute(_locking(conn, select(timers.c.id).where(*guard)))).scalars()
        )
        if mine:
            await conn.execute(statement.where(timers.c.id.in_(mine)))
            parked.extend(mine)
    return sorted(parked)


def _by_token(claimed: Sequence[Claimed]) -> list[tuple[str, list[int]]]:
    """The claims' ids grouped by the claim token they are held under."""
    groups: dict[str, list[int]] = defaultdict(list)
    for timer in claimed:
        groups[timer.token].append(timer.id)
    return list(groups.items())


async def finish_by_token(
    conn: AsyncConnection, batch: Sequence[Claimed], outcomes: Mapping[int, str], now: datetime
) -> None:
    """:func:`finish` the timers of ``batch`` that have an outcome, each under its own claim
    token (a batch may hold claims of several tokens)."""
    for token, ids in _by_token(batch):
        mine = {timer_id: outcomes[timer_id] for timer_id in ids if timer_id in outcomes}
        if mine:
            await finish(conn, mine, token=token, now=now)


async def finish_or_retry(
    conn: AsyncConnection,
    batch: Sequence[Claimed],
    failing: Mapping[int, str],
    *,
    done: str,
    error: str,
    now: datetime,
) -> None:
    """Finish the batch's timers as ``done``, except those whose order is in ``failing``
    (order id -> why): they go back with backoff and ``error`` followed by the reasons."""
    await finish_by_token(
        conn, batch, {t.id: done for t in batch if t.order_id not in failing}, now
    )
    again = [t for t in batch if t.order_id in failing]
    if again:
        reasons = "; ".join(sorted({failing[t.order_id] for t in again}))
        await retry(conn, again, error=f"{error}: {reasons}"[:500], now=now)


async def release_claims(conn: AsyncConnection, claimed: Sequence[Claimed]) -> int:
    """Hand claims back untouched (graceful shutdown): scheduled again, the attempt not counted."""
    changed = 0
    for token, ids in _by_token(claimed):
        result = await conn.execute(
            update(timers)
            .where(tally.among(conn, timers.c.id, ids), timers.c.claim_token == token)
            .where(_in_state(TimerState.CLAIMED))
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
    for token, ids in _by_token(claimed):
        result = await conn.execute(
            update(timers)
            .where(tally.among(conn, timers.c.id, ids), timers.c.claim_token == token)
            .where(_in_state(TimerState.CLAIMED))
            .values(lease_until=until)
        )
        held += int(result.rowcount)
    return held


async def still_claimed(conn: AsyncConnection, claimed: Sequence[Claimed]) -> list[Claimed]:
    """Those of ``claimed`` still held under their claim token: not finished, retried or taken
    over since (a handler's transaction that committed before a failure finished its timers)."""
    held: set[int] = set()
    for token, ids in _by_token(claimed):
        query = select(timers.c.id).where(
            tally.among(conn, timers.c.id, ids),
            timers.c.claim_token == token,
            _in_state(TimerState.CLAIMED),
        )
        held.update((await conn.execute(query)).scalars())
    return [t for t in claimed if t.id in held]


async def next_due_at(conn: AsyncConnection) -> datetime | None:
    """When the earliest scheduled timer is due."""
    query = select(func.min(timers.c.due_at)).where(timers.c.state == SCHEDULED)
    value: datetime | None = (await conn.execute(query)).scalar()
    return value


async def scheduled_among(conn: AsyncConnection, ids: Sequence[int]) -> list[Armed]:
    """Those of ``ids`` that are scheduled, with their due times."""
    if not ids:
        return []
    query = select(timers.c.id, timers.c.due_at).where(
        timers.c.id.in_(ids), _in_state(TimerState.SCHEDULED)
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
    query = _walk(query, after, limit)
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
    """Live timers whose due time passed more than ``grace`` ago."""
    query = (
        select(func.count())
        .select_from(timers)
        .where(
            timers.c.state.in_([TimerState.SCHEDULED.value, TimerState.CLAIMED.value]),
            timers.c.due_at <= now - grace,
        )
    )
    return int((await conn.execute(query)).scalar_one())


async def stuck(conn: AsyncConnection) -> int:
    """Live timers flagged stuck."""
    query = (
        select(func.count())
        .select_from(timers)
        .where(
            timers.c.stuck.is_(True),
            timers.c.state.in_([TimerState.SCHEDULED.value, TimerState.CLAIMED.value]),
        )
    )
    return int((await conn.execute(query)).scalar_one())


async def rearm(conn: AsyncConnection, timer: Claimed, *, due_at: datetime) -> int:
    """Put a claimed timer back, due at ``due_at`` (its order's deadline moved later)."""
    result = await conn.execute(
        update(timers)
        .where(
            timers.c.id == timer.id,
            timers.c.claim_token == timer.token,
            _in_state(TimerState.CLAIMED),
        )
        .values(
            state=TimerState.SCHEDULED.value,
            due_at=due_at,
            attempts=timers.c.attempts - 1,
            failures=0,
            lease_until=None,
            claim_token=None,
        )
    )
    return int(result.rowcount)


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
            timers.c.state.in_(_WAITING),
            timers.c.deadline_at <= now,
        )
        .values(
            state=TimerState.SCHEDULED.value, due_at=now, stuck=False, outcome=None, done_at=None
        )
    )
    return Armed(id=timer_id, due_at=now) if result.rowcount else None


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
