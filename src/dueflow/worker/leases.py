"""Holding a batch's claims while it runs: its leases are renewed every third of a lease, so no
lease runs out under work in hand."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence

from dueflow.service.deps import Deps
from dueflow.store import timers
from dueflow.store.timers import Claimed
from dueflow.worker.stats import Stats

#: The worker's log, under the name it had before the leases left runner.py (log filters).
log = logging.getLogger("dueflow.worker.runner")
#: Real seconds a batch runs before its leases are renewed (every third of a lease from then).
HOLD_AFTER = 1.0


@contextlib.asynccontextmanager
async def holding(deps: Deps, stats: Stats, claimed: Sequence[Claimed]) -> AsyncIterator[None]:
    """Renew the batch's leases every third of a lease until the block ends, once it has
    run for :data:`HOLD_AFTER` (most batches end sooner and never write a renewal)."""
    done = asyncio.Event()
    keeper = asyncio.create_task(_keep_leases(deps, stats, claimed, done))
    try:
        yield
    finally:
        # Told by the event, not cancelled: a renewal in flight finishes (a statement
        # cancelled mid-way is a pooled connection's trouble to come). Cancelled only if it
        # hangs for a whole lease, when the lease has run out anyway.
        done.set()
        await asyncio.wait({keeper}, timeout=deps.lease.total_seconds())
        if not keeper.done():
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper


async def _keep_leases(
    deps: Deps, stats: Stats, claimed: Sequence[Claimed], done: asyncio.Event
) -> None:
    # Short leases (tests, a fast demo clock) are renewed before a third of them is gone.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done.wait(), min(HOLD_AFTER, deps.lease.total_seconds() / 3))
    while not done.is_set():
        await deps.clock.sleep_until(deps.clock.now() + deps.lease / 3, done)
        if done.is_set():
            return
        try:
            async with deps.db.write() as conn:
                now = deps.clock.now()
                held = await timers.extend_lease(conn, claimed, until=now + deps.lease)
        except Exception:
            log.exception("could not renew %d leases; trying again", len(claimed))
            continue
        stats.renewals += 1
        if not held:
            return
