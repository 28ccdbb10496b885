"""The seat cache's repair: every ``seat_reconcile_interval``, make the cache of each show whose
seats may still move exactly the database's states, counting what differed.

Which shows: those on sale that started less than :data:`AFTER_START` ago (after that no seat
moves: pay deadlines end well before), and cancelled ones in the same window while the database
still has seats held or sold for them (their ``show_cancel`` timers are letting them go), then
once more when it has none, so their seats end free in the cache too. A pass loads shows the
cache did not have (after a restart or FLUSHALL); loading those counts no repair.

A move committed while a show is being loaded (between the database read and the load, a few
milliseconds) may be overwritten by the older states; the next pass sets it right, and the
database decides every sale meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

from sqlalchemy import exists, select
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.seatcache.base import NoSeatCache
from dueflow.service.deps import Deps
from dueflow.store import shows
from dueflow.store.schema import seat_holds
from dueflow.store.schema import shows as t_shows

log = logging.getLogger(__name__)
#: Shows are reconciled until this long after they start.
AFTER_START = timedelta(days=1)


async def reconcile_once(deps: Deps, *, settled: set[int] | None = None) -> int:
    """One pass over the shows whose seats may move; returns how many seats were repaired
    (counted in ``dueflow_seat_cache_repairs_total``, logged when not 0).

    ``settled``: cancelled shows already reconciled with every seat free, skipped (the pass adds
    those it settles); without it every cancelled show of the window is reconciled.
    """
    if isinstance(deps.seat_cache, NoSeatCache):
        return 0
    async with deps.db.read() as conn:
        candidates = await _shows_whose_seats_may_move(conn, deps.clock.now())
    repairs = 0
    for show_id, cancelled, holding in candidates:
        if cancelled and not holding and settled is not None and show_id in settled:
            continue
        async with deps.db.read() as conn:
            states = await shows.hold_states(conn, show_id)
        # Loaded right after its own read, show by show: the window in which a move can be
        # overwritten by older states stays one round trip long.
        repaired = await deps.seat_cache.load(show_id, states)
        if repaired:
            log.warning("seat cache of show %d was wrong for %d seats; repaired", show_id, repaired)
        repairs += repaired
        if cancelled and not states and settled is not None:
            settled.add(show_id)
    if repairs:
        deps.metrics.seat_cache_repairs.inc(repairs)
    return repairs


async def _shows_whose_seats_may_move(
    conn: AsyncConnection, now: datetime
) -> list[tuple[int, bool, bool]]:
    """(show id, cancelled, any seat held or sold) for the shows on sale or cancelled that
    started less than :data:`AFTER_START` ago, in id order."""
    holding = exists().where(seat_holds.c.show_id == t_shows.c.id)
    query = (
        select(t_shows.c.id, t_shows.c.status, holding.label("holding"))
        .where(
            t_shows.c.starts_at > now - AFTER_START,
            t_shows.c.status.in_((shows.ON_SALE, shows.CANCELLED)),
        )
        .order_by(t_shows.c.id)
    )
    return [
        (int(r.id), r.status == shows.CANCELLED, bool(r.holding))
        for r in (await conn.execute(query)).all()
    ]


async def run_reconciler(deps: Deps, stop: asyncio.Event) -> None:
    """Reconcile at start and then every ``seat_reconcile_interval`` until ``stop`` is set; a
    pass that fails (the database is away) is logged and the next one runs on time."""
    settled: set[int] = set()
    while not stop.is_set():
        try:
            await reconcile_once(deps, settled=settled)
        except Exception:
            log.exception("seat cache reconcile failed; trying again next interval")
        await deps.clock.sleep_until(deps.clock.now() + deps.seat_reconcile_interval, stop)


def start(deps: Deps, stop: asyncio.Event) -> list[asyncio.Task[None]]:
    """The reconciler's task beside the scanner, when a seat cache is configured (none
    otherwise: without a cache there is nothing to repair)."""
    if isinstance(deps.seat_cache, NoSeatCache):
        return []
    return [asyncio.create_task(run_reconciler(deps, stop))]
