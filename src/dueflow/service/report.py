"""What operators look at: counts, overdue and stuck timers, lateness, what needs attention;
the invariants are :mod:`dueflow.service.invariants`' (re-exported here)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, select

from dueflow.domain.timers import TimerState
from dueflow.exceptions import Busy, Conflict
from dueflow.service import attention, reads
from dueflow.service.deps import Deps
from dueflow.service.invariants import (
    Checked,
    Invariants,
    check_full,
    check_invariants,
    check_recent,
)
from dueflow.store import counts, events, payments, timers
from dueflow.store import shows as show_store
from dueflow.store.schema import seat_holds, seats, shows
from dueflow.store.schema import timers as t_timers

log = logging.getLogger(__name__)

__all__ = [
    "Checked",
    "Invariants",
    "Snapshot",
    "check_full",
    "check_invariants",
    "check_recent",
    "snapshot_and_check",
]


@dataclass
class Snapshot:
    """The system at one instant."""

    at: datetime
    orders: dict[str, int]
    timers: dict[str, int]
    overdue: int
    stuck: int
    refunds: dict[str, int]
    discrepancies: int
    #: Order events the events webhook has not delivered yet.
    event_backlog: int = 0
    #: When the longest-processing refund was submitted; None if no refund is processing.
    refund_processing_since: datetime | None = None
    #: What needs a person, by kind (:data:`attention.KINDS`).
    attention: dict[str, int] = field(default_factory=dict)
    #: Every order and timer counted (``dueflow status --full``); else the orders in a final
    #: status are kept counted up to a watermark, and the timers done or cancelled left out.
    full: bool = False

    @property
    def refund_processing_seconds(self) -> float:
        """How long the longest-processing refund has been processing (0: none is)."""
        since = self.refund_processing_since
        return 0.0 if since is None else max(0.0, (self.at - since).total_seconds())


async def snapshot(
    deps: Deps, *, full: bool = False, lanes: asyncio.Semaphore | None = None
) -> Snapshot:
    """Counts by status and state, overdue and stuck timers, refunds, discrepancies, what needs
    attention. Orders in a final status are kept counted up to a watermark
    (:mod:`dueflow.store.counts`, moved here when due) and timers are counted in their live
    states (scheduled, claimed, parked) alone, unless ``full``: every order and timer counted.
    The counts are read side by side on PostgreSQL and MariaDB (:mod:`dueflow.service.reads`,
    within ``lanes``)."""
    now = deps.clock.now()
    if not full:
        async with lanes or contextlib.nullcontext():  # one of the page's connections
            await _catch_up(deps, now)
    grace = deps.scan_grace
    found = await reads.each(
        deps,
        [
            counts.count_all if full else counts.count_by_status,
            timers.count_by_state if full else counts.live_timers_by_state,
            lambda conn: timers.overdue(conn, now=now, grace=grace),
            timers.stuck,
            payments.count_refunds_by_state,
            payments.count_discrepancies,
            events.backlog,
            payments.processing_since,
            lambda conn: attention.counts(conn, now),
        ],
        lanes=lanes,
    )
    orders, by_state, overdue, stuck, refunds, discrepancies, backlog, since, waiting = found
    return Snapshot(
        at=now,
        orders=orders,
        timers=by_state,
        overdue=overdue,
        stuck=stuck,
        refunds=refunds,
        discrepancies=discrepancies,
        event_backlog=backlog,
        refund_processing_since=since,
        attention=waiting,
        full=full,
    )


async def snapshot_and_check(deps: Deps) -> tuple[Snapshot, Checked]:
    """:func:`snapshot` and :func:`check_recent` (what ``dueflow status`` shows), read side by
    side on PostgreSQL and MariaDB within one page's lanes, one after the other on SQLite."""
    if not reads.side_by_side(deps):
        return await snapshot(deps), await check_recent(deps)
    lanes = reads.lanes()
    snap, checked = await asyncio.gather(
        snapshot(deps, lanes=lanes), check_recent(deps, lanes=lanes)
    )
    return snap, checked


async def _catch_up(deps: Deps, now: datetime) -> None:
    """Move the final statuses' watermark when it is due; another process doing so at the same
    instant wins (its window is added once)."""
    async with deps.db.report() as conn:
        if not await counts.due(conn, now):
            return
    try:
        async with deps.db.write() as conn:
            await counts.catch_up(conn, now)
    except (Busy, Conflict):
        log.info("the order counts' watermark is being moved by another process")


async def refund_counts(deps: Deps) -> dict[str, int]:
    """How many refunds are in each state (the snapshot's refunds alone)."""
    async with deps.db.report() as conn:
        return await payments.count_refunds_by_state(conn)


async def lateness_seconds(deps: Deps) -> list[float]:
    """For every timer done on its first attempt, seconds from its deadline to its firing."""
    async with deps.db.report() as conn:
        query = select(t_timers.c.deadline_at, t_timers.c.done_at).where(
            and_(t_timers.c.state == TimerState.DONE.value, t_timers.c.attempts == 1)
        )
        rows = (await conn.execute(query)).all()
    return sorted((done - deadline).total_seconds() for deadline, done in rows)


async def seats_taken(deps: Deps) -> dict[str, int]:
    """How many seats of all shows are held by unpaid orders and sold: one grouped count of the
    live seat holds."""
    query = select(seat_holds.c.state, func.count()).group_by(seat_holds.c.state)
    async with deps.db.report() as conn:
        found = {str(state): int(n) for state, n in (await conn.execute(query)).all()}
    return {state: found.get(state, 0) for state in (show_store.HELD, show_store.SOLD)}


async def shows_overview(deps: Deps, limit: int = 200) -> list[dict[str, Any]]:
    """The newest ``limit`` shows, newest first, each with how many of its seats are free, held
    and sold (``seats``): three statements however many shows."""
    newest = select(shows).order_by(shows.c.id.desc()).limit(limit)
    async with deps.db.report() as conn:
        found = [dict(r._mapping) for r in await conn.execute(newest)]
        ids = [show["id"] for show in found]
        per_show = select(seats.c.show_id, func.count()).where(seats.c.show_id.in_(ids))
        totals: dict[int, int] = {
            show_id: int(n) for show_id, n in await conn.execute(per_show.group_by(seats.c.show_id))
        }
        per_state = select(seat_holds.c.show_id, seat_holds.c.state, func.count()).where(
            seat_holds.c.show_id.in_(ids)
        )
        taken = {
            (show_id, state): int(n)
            for show_id, state, n in await conn.execute(
                per_state.group_by(seat_holds.c.show_id, seat_holds.c.state)
            )
        }
    for show in found:
        held = taken.get((show["id"], show_store.HELD), 0)
        sold = taken.get((show["id"], show_store.SOLD), 0)
        free = totals.get(show["id"], 0) - held - sold
        show["seats"] = {show_store.FREE: free, show_store.HELD: held, show_store.SOLD: sold}
    return found
