"""What operators do and read beyond the order life: run a stuck timer now, timer lateness over
a recent window, and one summary of the system for the dashboard and ``GET /api/admin/summary``."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import select, text

from dueflow.domain.timers import TimerState
from dueflow.exceptions import NotFound, TimerNotWaiting
from dueflow.service import report
from dueflow.service.deps import Deps
from dueflow.store import schema, timers

log = logging.getLogger(__name__)

LATENESS_WINDOW = timedelta(hours=1)
LIVE = (TimerState.SCHEDULED.value, TimerState.CLAIMED.value)
TIMER_STATES = ("stuck", *(state.value for state in TimerState))
FINISHED = (TimerState.DONE.value, TimerState.CANCELLED.value)


@dataclass(frozen=True)
class Lateness:
    """Seconds from deadline to firing of the timers of one kind done in the window."""

    kind: str
    count: int
    p50: float
    p99: float
    max: float


async def run_timer_now(deps: Deps, timer_id: int, *, actor: str) -> dict[str, Any]:
    """Make a timer past its deadline (overdue, backing off, or stuck) due now and wake the
    worker; returns the timer as it is then.

    Raises:
        NotFound: no such timer.
        TimerNotWaiting: its deadline is still ahead, a worker holds it, or it is over.
    """
    now = deps.clock.now()
    async with deps.db.write() as conn:
        armed = await timers.run_now(conn, timer_id, now=now)
        if armed is None:
            row = await timers.get(conn, timer_id)
            if row is None:
                raise NotFound(f"no timer {timer_id}")
            if row.state == TimerState.SCHEDULED.value:
                # Firing early would act before the deadline (close a buyer's open payment,
                # remind too soon): only a timer past its deadline runs now.
                raise TimerNotWaiting(
                    f"timer {timer_id} is not due: its deadline is {row.deadline_at:%Y-%m-%d %H:%M:%S} UTC"
                )
            raise TimerNotWaiting(f"timer {timer_id} is {row.state}, not waiting")
        row = await timers.get(conn, timer_id)
    log.info("timer %d run now by %s", timer_id, actor, extra={"timer_id": timer_id})
    await deps.arm([armed])
    return dict(row._mapping)


async def lateness(deps: Deps, window: timedelta = LATENESS_WINDOW) -> list[Lateness]:
    """Per kind, how many timers fired in the last ``window`` (first attempts) and their
    lateness, p50/p99/max over the latest 5,000 of them."""
    async with deps.db.report() as conn:
        counts, found = await timers.lateness_since(conn, deps.clock.now() - window)
    by_kind: dict[str, list[float]] = defaultdict(list)
    for kind, seconds in found:
        by_kind[kind].append(seconds)
    result = []
    for kind, count in sorted(counts.items()):
        values = sorted(by_kind.get(kind, [0.0]))
        result.append(
            Lateness(kind, count, percentile(values, 50), percentile(values, 99), values[-1])
        )
    return result


def percentile(sorted_values: list[float], pct: float) -> float:
    """The nearest-rank percentile of already sorted values (0.0 for none)."""
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(pct / 100 * (len(sorted_values) - 1))))
    return sorted_values[index]


async def summary(deps: Deps) -> dict[str, Any]:
    """Counts, overdue and stuck timers, refunds, discrepancies, lateness over the last hour and
    the invariants, as one JSON-ready mapping: every order and timer counted, every order
    checked (the dashboard and ``dueflow status`` read less: docs/benchmarks.md)."""
    snap = await report.snapshot(deps, full=True)
    checked = await report.check_invariants(deps)
    return {
        "at": snap.at,
        "orders": snap.orders,
        "timers": snap.timers,
        "overdue": snap.overdue,
        "stuck": snap.stuck,
        "refunds": snap.refunds,
        "discrepancies": snap.discrepancies,
        "lateness_last_hour": [vars(item) for item in await lateness(deps)],
        "invariants": {"ok": checked.ok, **vars(checked)},
    }


async def overdue_timers(deps: Deps, limit: int = 100) -> list[dict[str, Any]]:
    """Live timers past due by more than the scan grace, oldest first, with their order's
    status."""
    t_timers, t_orders = schema.timers, schema.orders
    first = timers.overdue_first(deps.clock.now() - deps.scan_grace, limit)
    query = (
        select(t_timers, t_orders.c.status.label("order_status"))
        .join(first, first.c.id == t_timers.c.id)
        .join(t_orders, t_orders.c.id == t_timers.c.order_id)
        .order_by(t_timers.c.due_at, t_timers.c.id)
        .limit(limit)
    )
    async with deps.db.report() as conn:
        return [dict(r._mapping) for r in (await conn.execute(query)).all()]


async def timers_in_state(deps: Deps, state: str, limit: int = 100) -> list[dict[str, Any]]:
    """Timers in one state, soonest due first (done and cancelled: the latest finished first);
    ``stuck`` means live timers flagged stuck."""
    t_timers = schema.timers
    query = select(t_timers).order_by(t_timers.c.due_at, t_timers.c.id).limit(limit)
    if state == "stuck":
        # The partial index of stuck timers' own predicate (store/_schema_timers.py).
        query = query.where(text(schema.STUCK_TIMERS))
    elif state == TimerState.PARKED.value:
        # A literal, not a parameter: PostgreSQL's partial index of parked timers then serves
        # the dashboard's list even under a generic prepared plan.
        query = query.where(t_timers.c.state == timers.PARKED)
    elif state in FINISHED:
        # Done and cancelled timers pile up by the million: the latest finished first, read
        # backwards along ix_timers_done_at.
        query = (
            select(t_timers)
            .where(t_timers.c.state == state, t_timers.c.done_at.is_not(None))
            .order_by(t_timers.c.done_at.desc(), t_timers.c.id.desc())
            .limit(limit)
        )
    else:
        query = query.where(t_timers.c.state == state)
    async with deps.db.report() as conn:
        return [dict(r._mapping) for r in (await conn.execute(query)).all()]


async def discrepancies(deps: Deps, limit: int = 100) -> list[dict[str, Any]]:
    """Recorded payment discrepancies, newest first."""
    table = schema.discrepancies
    query = select(table).order_by(table.c.id.desc()).limit(limit)
    async with deps.db.report() as conn:
        return [dict(r._mapping) for r in (await conn.execute(query)).all()]
