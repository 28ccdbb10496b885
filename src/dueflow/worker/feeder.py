"""The feeder: hands a trigger with a horizon (Redis, RabbitMQ) the scheduled timers that come
within it, a scan interval at a time, and all of them again when the trigger lost them."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Protocol

from dueflow import logs
from dueflow.clock import Clock
from dueflow.service.deps import Deps
from dueflow.store import timers

#: The worker's log, under the name it had before the feeder left runner.py (log filters).
log = logging.getLogger("dueflow.worker.runner")


class Fed(Protocol):
    """What the feeder needs of a worker: its dependencies."""

    @property
    def deps(self) -> Deps: ...


async def run_feeder(worker: Fed, stop: asyncio.Event, *, full_every: int = 10) -> None:
    """Hand the trigger the scheduled timers that come within its horizon, once a scan interval;
    all of them again at once when the trigger says it lost them (:meth:`Trigger.lost`: a Redis
    flushed or restarted), and every ``full_every`` passes (a trigger that lost its state unseen
    catches up). A trigger that sees the loss itself (:meth:`Trigger.watch_lost`: a claim after
    a Redis restart) starts the next pass at once: waiting for the interval left the timers due
    meanwhile to the scanner (the soak found them 25-30 s late after a 3 s Redis restart)."""
    deps = worker.deps
    horizon = deps.trigger.horizon
    if horizon is None:
        return
    seen_lost = asyncio.Event()
    deps.trigger.watch_lost(seen_lost.set)
    fed_until = None
    passes = 0
    refeed = False  # a loss told whose full feed has not succeeded yet
    while not stop.is_set():
        seen_lost.clear()
        began = deps.clock.now()
        try:
            until = began + horizon
            if await deps.trigger.lost():
                if passes:
                    log.warning(
                        "the %s trigger lost its timers; feeding them all again",
                        deps.trigger.scheme,
                    )
                refeed = True
            since = None if refeed or passes % full_every == 0 else fed_until
            await feed_between(worker, since, until)
            fed_until = until
            passes += 1
            refeed = False
        except Exception as exc:
            logs.failed(log, "feeder pass failed; the scanner covers due timers", exc)
            # Not again at the next sign of a loss: a pass that failed fails a moment later too.
            await deps.clock.sleep_until(began + deps.max_idle, stop)
        await _sleep_or_lost(deps.clock, deps.clock.now() + deps.scan_interval, stop, seen_lost)


async def _sleep_or_lost(
    clock: Clock, until: datetime, stop: asyncio.Event, seen_lost: asyncio.Event
) -> None:
    """Sleep until ``until``, or until ``stop`` or ``seen_lost`` is set."""
    if seen_lost.is_set():
        return
    sleeper = asyncio.ensure_future(clock.sleep_until(until, stop))
    told = asyncio.ensure_future(seen_lost.wait())
    try:
        await asyncio.wait({sleeper, told}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (sleeper, told):
            task.cancel()
        await asyncio.gather(sleeper, told, return_exceptions=True)


async def feed_between(worker: Fed, since: datetime | None, until: datetime) -> int:
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
        await deps.feed(page)
        fed += len(page)
        after = (page[-1].due_at, page[-1].id)
