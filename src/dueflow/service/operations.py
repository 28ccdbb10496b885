"""What operators do and read beyond the order life: run a stuck timer now, timer lateness over
a recent window, and one summary of the system for the dashboard and ``GET /api/admin/summary``."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from dueflow.exceptions import NotFound, TimerNotWaiting
from dueflow.service import report
from dueflow.service.deps import Deps
from dueflow.store import timers

log = logging.getLogger(__name__)

LATENESS_WINDOW = timedelta(hours=1)


@dataclass(frozen=True)
class Lateness:
    """Seconds from deadline to firing of the timers of one kind done in the window."""

    kind: str
    count: int
    p50: float
    p99: float
    max: float


async def run_timer_now(deps: Deps, timer_id: int, *, actor: str) -> None:
    """Make a waiting (or stuck) timer due now and wake the worker.

    Raises:
        NotFound: no such timer.
        TimerNotWaiting: a worker holds it, or it is done or cancelled.
    """
    now = deps.clock.now()
    async with deps.db.write() as conn:
        armed = await timers.run_now(conn, timer_id, now=now)
        if armed is None:
            row = await timers.get(conn, timer_id)
            if row is None:
                raise NotFound(f"no timer {timer_id}")
            raise TimerNotWaiting(f"timer {timer_id} is {row.state}, not waiting")
    log.info("timer %d run now by %s", timer_id, actor, extra={"timer_id": timer_id})
    await deps.arm([armed])


async def lateness(deps: Deps, window: timedelta = LATENESS_WINDOW) -> list[Lateness]:
    """Per kind, the lateness of the timers fired in the last ``window`` (first attempts)."""
    async with deps.db.read() as conn:
        found = await timers.lateness_since(conn, deps.clock.now() - window)
    by_kind: dict[str, list[float]] = defaultdict(list)
    for kind, seconds in found:
        by_kind[kind].append(seconds)
    result = []
    for kind, values in sorted(by_kind.items()):
        values.sort()
        result.append(
            Lateness(kind, len(values), percentile(values, 50), percentile(values, 99), values[-1])
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
    the invariants, as one JSON-ready mapping."""
    snap = await report.snapshot(deps)
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
