"""Ending a claim: finished with an outcome, handed back with backoff (a retry), parked after
too many failures in a row, or re-armed for a later deadline."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain.timers import TimerState, backoff, is_stuck
from dueflow.store._timers_common import Claimed, by_token, held_under, in_state, locking
from dueflow.store.schema import timers


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
            .where(*held_under(conn, ids, token))
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
                .where(*held_under(conn, ids, token))
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
    for token, ids in by_token(claimed):
        guard = held_under(conn, ids, token)
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
            (await conn.execute(locking(conn, select(timers.c.id).where(*guard)))).scalars()
        )
        if mine:
            await conn.execute(statement.where(timers.c.id.in_(mine)))
            parked.extend(mine)
    return sorted(parked)


async def finish_by_token(
    conn: AsyncConnection, batch: Sequence[Claimed], outcomes: Mapping[int, str], now: datetime
) -> None:
    """:func:`finish` the timers of ``batch`` that have an outcome, each under its own claim
    token (a batch may hold claims of several tokens)."""
    for token, ids in by_token(batch):
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


async def rearm(conn: AsyncConnection, timer: Claimed, *, due_at: datetime) -> int:
    """Put a claimed timer back, due at ``due_at`` (its order's deadline moved later)."""
    result = await conn.execute(
        update(timers)
        .where(
            timers.c.id == timer.id,
            timers.c.claim_token == timer.token,
            in_state(TimerState.CLAIMED),
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
