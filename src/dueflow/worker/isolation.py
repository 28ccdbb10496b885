"""Failure isolation: after a handler failed on its share of a batch, the timers that fail on
their own are found by running halves again, within a budget, and alone go back (with backoff, or
parked after ``timer_max_attempts`` failures in a row); the rest of the batch goes on."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta

from dueflow import logs
from dueflow.domain.timers import TimerKind, backoff, is_parked, quick_backoff
from dueflow.exceptions import BackendUnavailable, Busy
from dueflow.service.deps import Deps
from dueflow.service.timeouts import Handler
from dueflow.store import timers
from dueflow.store.timers import Claimed
from dueflow.worker.stats import Stats

#: The worker's log, under the name it had before the isolation left runner.py (log filters).
log = logging.getLogger("dueflow.worker.runner")
#: Handler runs the isolation of one failure may spend, per bit of the share's size: 4 x 8 = 32
#: runs for a share of 200, enough to find two failing timers (about 2 log2 n runs each),
#: where running every half of a share that fails whole (a code error, a failure of every
#: order) took 2n - 1. What is not isolated within that goes back whole.
SPLIT_RUNS_PER_BIT = 4


def bound(kind: TimerKind, group: Sequence[Claimed]) -> AbstractContextManager[None]:
    """What the lines a handler logs on ``group`` carry (:func:`logs.bound`): the kind, and for
    a single timer its id and its order. (A line about one order of a larger share names it
    with ``extra=``.) The trace id is the handler span's, which links to the spans that armed
    the timers; :class:`logs.ContextFilter` puts it on every line while tracing is on."""
    if len(group) != 1:
        return logs.bound(timer_kind=kind.value)
    [timer] = group
    return logs.bound(timer_kind=kind.value, timer_id=timer.id, order_id=timer.order_id)


@dataclass
class SplitBudget:
    """What the isolation of one handler failure may still spend: handler runs, and real time
    up to ``until`` (a monotonic time, one lease after the failure)."""

    until: float
    runs: int

    def take(self, now: float) -> bool:
        """Take one run if any is left and the time is not spent; False once spent."""
        if self.runs <= 0 or now >= self.until:
            return False
        self.runs -= 1
        return True


class Isolation:
    """A worker's handling of handler failures: its dependencies, handlers and stats are the
    worker's own."""

    def __init__(
        self,
        deps: Deps,
        handlers: Mapping[TimerKind, Handler],
        stats: Stats,
        monotonic: Callable[[], float],
    ) -> None:
        self.deps = deps
        self.handlers = handlers
        self.stats = stats
        #: Real time, for the budget (a cost in the lane, not a deadline).
        self.monotonic = monotonic

    async def after(self, kind: TimerKind, group: Sequence[Claimed], exc: Exception) -> None:
        """The handler failed on ``group`` (reruns in place spent): :meth:`isolate` it with a
        fresh budget of :data:`SPLIT_RUNS_PER_BIT` runs per bit of its size and one lease of
        real time."""
        budget = SplitBudget(
            until=self.monotonic() + self.deps.lease.total_seconds(),
            runs=SPLIT_RUNS_PER_BIT * len(group).bit_length(),
        )
        await self.isolate(kind, group, exc, budget)

    async def isolate(
        self, kind: TimerKind, group: Sequence[Claimed], exc: Exception, budget: SplitBudget
    ) -> None:
        """After the handler failed on ``group``: run each half of the timers still claimed
        again, and so on down to the timers that fail on their own, which alone go back
        (:meth:`failed`). One order the handler cannot act on (a trigger refusing its update,
        a row a bug trips on) thus holds up no other order of the batch: handed back together
        they were due again together and failed together, for good. Each half runs once,
        without reruns in place. Bounded by ``budget`` (runs, and one lease of real time since
        the failure): past it, what is left goes back whole, as does the whole group if the
        database cannot even say which timers are still claimed (it is down, not refusing one
        order). A busy lock is never split: no one order causes it, and each half would wait
        on the lock again (on MariaDB innodb_lock_wait_timeout, 50 s a wait); the group goes
        back whole, due again in seconds."""
        if isinstance(exc, Busy):
            await self.failed(kind, group, exc)
            return
        if len(group) > 1:
            held = await self.claims_held(group)
            if held is None:
                await self.failed(kind, group, exc)
                return
            group = held
        if len(group) <= 1:
            if group:
                await self.failed(kind, group, exc)
            return
        self.stats.splits += 1
        log.warning(
            "%s handler failed for %d timers (%s); running each half again",
            kind.value,
            len(group),
            type(exc).__name__,
        )
        middle = len(group) // 2
        for half in (group[:middle], group[middle:]):
            if not budget.take(self.monotonic()):
                log.warning(
                    "%s: the isolation of a failure spent its budget; %d timers go back whole",
                    kind.value,
                    len(half),
                )
                await self.failed(kind, half, exc)
                continue
            try:
                with bound(kind, half):
                    await self.handlers[kind](self.deps, half)
            except Exception as again:
                await self.isolate(kind, half, again, budget)
            else:
                self.deps.metrics.fired.labels(kind.value, "ran").inc(len(half))

    async def failed(self, kind: TimerKind, group: Sequence[Claimed], exc: Exception) -> None:
        """Count a handler's failure and hand its timers back: due again after the backoff (2 s
        doubling after a lost connection or a busy lock, not the 30 s of other failures), or
        parked on their last attempt (``timer_max_attempts``)."""
        self.stats.failed_batches += 1
        self.deps.metrics.fired.labels(kind.value, "failed").inc(len(group))
        log.error("%s handler failed for %d timers", kind.value, len(group), exc_info=exc)
        delay = quick_backoff if isinstance(exc, BackendUnavailable | Busy) else backoff
        await self.give_back(kind, group, f"{type(exc).__name__}: {exc}", delay)

    async def claims_held(self, group: Sequence[Claimed]) -> list[Claimed] | None:
        """The timers of ``group`` still claimed under their token, or None when the database could not say."""
        try:
            async with self.deps.db.read() as conn:
                return await timers.still_claimed(conn, group)
        except Exception:
            log.exception("could not read which of %d timers are still claimed", len(group))
            return None

    async def give_back(
        self,
        kind: TimerKind,
        group: Sequence[Claimed],
        error: str,
        delay: Callable[[int], timedelta],
    ) -> None:
        """Hand failed timers back after ``delay``, one more failure in a row each; those
        reaching ``timer_max_attempts`` failures in a row are parked."""
        last = self.deps.timer_max_attempts
        parking = [t for t in group if is_parked(t.failures + 1, last)]
        again = [t for t in group if not is_parked(t.failures + 1, last)]
        try:
            async with self.deps.db.write() as conn:
                now = self.deps.clock.now()
                await timers.retry(conn, again, error=error, now=now, delay=delay, failed=True)
                parked_ids = set(await timers.park(conn, parking, error=error, now=now))
        except Exception:
            # The lease expires and the scanner takes the timers back.
            log.exception("could not hand back %d timers; their lease will expire", len(group))
            return
        # Only those park() parked: one finished, retried or taken over meanwhile is not.
        parked = [t for t in parking if t.id in parked_ids]
        if not parked:
            return
        self.stats.parked += len(parked)
        self.deps.metrics.fired.labels(kind.value, "parked").inc(len(parked))
        for timer in parked:
            # Never parked silently: an error line per timer, beside the dashboard's list,
            # the dueflow_timers_parked gauge and its alert.
            log.error(
                "%s timer %d of order %d parked after %d failures in a row: %s; run it "
                "again once the cause is fixed (dueflow timers run-again %d)",
                kind.value,
                timer.id,
                timer.order_id,
                timer.failures + 1,
                error,
                timer.id,
                extra={"order_id": timer.order_id, "timer_id": timer.id},
            )
