"""The worker: claim due timers in batches, run each kind's handler on its share of the batch."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from dueflow.domain.timers import TimerKind
from dueflow.service.deps import Deps
from dueflow.service.timeouts import HANDLERS, Handler
from dueflow.store import timers
from dueflow.store.timers import Claimed

log = logging.getLogger(__name__)


@dataclass
class Stats:
    """What a worker has done since it started."""

    claimed: int = 0
    batches: int = 0
    failed_batches: int = 0
    #: Times the loop found nothing to do and waited on its trigger.
    waits: int = 0
    by_kind: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class Worker:
    """Runs due timers. Any number may run at once: claims are exclusive."""

    def __init__(self, deps: Deps, *, handlers: Mapping[TimerKind, Handler] = HANDLERS) -> None:
        self.deps = deps
        self.handlers = handlers
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.stats = Stats()
        self._limit: int | None = None  # the next batch's size; None: batch_size

    async def run_batch(self, claimed: Sequence[Claimed]) -> None:
        """Run the handlers for a claimed batch; a failing handler puts its timers back with
        backoff and the error, and the rest of the batch goes on."""
        by_kind: dict[TimerKind, list[Claimed]] = defaultdict(list)
        for timer in claimed:
            by_kind[timer.kind].append(timer)
        self.stats.claimed += len(claimed)
        self.stats.batches += 1
        metrics = self.deps.metrics
        for kind, group in by_kind.items():
            self.stats.by_kind[kind.value] += len(group)
            metrics.claimed(
                kind.value, [(t.deadline_at, t.attempts) for t in group], self.deps.clock.now()
            )
            try:
                await self.handlers[kind](self.deps, group)
            except Exception as exc:
                self.stats.failed_batches += 1
                metrics.fired.labels(kind.value, "failed").inc(len(group))
                log.exception("%s handler failed for %d timers", kind.value, len(group))
                await self._give_back(group, f"{type(exc).__name__}: {exc}")
            else:
                metrics.fired.labels(kind.value, "ran").inc(len(group))
        if not self.deps.trigger.polls_database:
            await self._rearm_retried(claimed)

    async def _rearm_retried(self, claimed: Sequence[Claimed]) -> None:
        """Timers of the batch that went back to scheduled (backoff, re-armed) are handed to the
        trigger again, so a retry fires on time rather than at the next scan."""
        try:
            async with self.deps.db.read() as conn:
                again = await timers.scheduled_among(conn, [t.id for t in claimed])
        except Exception:
            log.exception("could not read retried timers; the scanner covers them")
            return
        await self.deps.arm(again)

    async def _give_back(self, group: Sequence[Claimed], error: str) -> None:
        try:
            async with self.deps.db.write() as conn:
                await timers.retry(conn, group, error=error, now=self.deps.clock.now())
        except Exception:
            # The lease expires and the scanner takes the timers back.
            log.exception("could not hand back %d timers; their lease will expire", len(group))

    async def run_once(self) -> int:
        """Claim one batch of due timers and run it; returns how many were claimed.

        Under a backlog (the batch came back full) the next batch is twice as large, up to
        ``max_batch_size``, so a herd of deadlines pays the per-batch costs fewer times; the
        first partial batch brings it back to ``batch_size``.
        """
        deps = self.deps
        limit = self._limit or deps.batch_size
        async with deps.db.write() as conn:
            claimed = await timers.claim_due(
                conn, now=deps.clock.now(), limit=limit, lease=deps.lease
            )
        full = len(claimed) == limit
        self._limit = (
            min(limit * 2, max(deps.max_batch_size, deps.batch_size)) if full else deps.batch_size
        )
        if claimed:
            await self.run_batch(claimed)
        return len(claimed)

    async def deliver(self, timer_ids: Sequence[int]) -> int:
        """Run timers a trigger handed over; those not scheduled and due are dropped."""
        async with self.deps.db.write() as conn:
            claimed = await timers.claim_ids(
                conn, timer_ids, now=self.deps.clock.now(), lease=self.deps.lease
            )
        if claimed:
            await self.run_batch(claimed)
        return len(claimed)

    async def drain(self) -> int:
        """Run batches until nothing is due; returns how many timers were claimed."""
        total = 0
        while n := await self.run_once():
            total += n
        return total

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set. A batch in progress finishes.

        With the ``db`` trigger: drain what is due, then sleep until the next due time (at most
        ``max_idle``) or until woken. With a trigger that hands over ids: run what it delivers,
        then acknowledge it; what it misses the scanner finds.
        """
        deps = self.deps
        while not stop.is_set():
            try:
                if deps.trigger.polls_database:
                    await self._poll_once()
                else:
                    await self._delivered_once()
            except Exception:
                log.exception("worker loop error; retrying shortly")
                await deps.clock.sleep_until(deps.clock.now() + deps.max_idle, stop)

    async def _poll_once(self) -> None:
        deps = self.deps
        if await self.run_once():
            return
        async with deps.db.read() as conn:
            next_due = await timers.next_due_at(conn)
        until = deps.clock.now() + deps.max_idle
        if next_due is not None and next_due < until:
            until = next_due
        self.stats.waits += 1
        await deps.trigger.wait(deps.clock, until)

    async def _delivered_once(self) -> None:
        deps = self.deps
        self.stats.waits += 1
        ids = await deps.trigger.wait(deps.clock, deps.clock.now() + deps.max_idle)
        if ids:
            await self.deliver(ids)
            await deps.trigger.ack(ids)


async def run_feeder(worker: Worker, stop: asyncio.Event, *, full_every: int = 10) -> None:
    """Hand the trigger the scheduled timers that come within its horizon, once a scan interval;
    every ``full_every`` passes, all of them again (a trigger that lost its state catches up)."""
    deps = worker.deps
    horizon = deps.trigger.horizon
    if horizon is None:
        return
    fed_until = None
    passes = 0
    while not stop.is_set():
        try:
            until = deps.clock.now() + horizon
            since = None if passes % full_every == 0 else fed_until
            await feed_between(worker, since, until)
            fed_until = until
            passes += 1
        except Exception:
            log.exception("feeder pass failed; the scanner covers due timers")
        await deps.clock.sleep_until(deps.clock.now() + deps.scan_interval, stop)


async def feed_between(worker: Worker, since: datetime | None, until: datetime) -> int:
    """Feed the trigger every scheduled timer due in (since, until]; returns how many."""
    deps = worker.deps
    after: tuple[datetime, int] | None = None
    fed = 0
    while True:
        async with deps.db.read() as conn:
            page = await timers.scheduled_between(
                conn, since=since, until=until, after=after, limit=deps.max_batch_size
            )
        if not page:
            return fed
        await deps.trigger.feed(page)
        fed += len(page)
        after = (page[-1].due_at, page[-1].id)
