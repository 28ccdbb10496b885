"""The worker: claim due timers in batches, run each kind's handler on its share of the batch."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence

from dueflow import logs, tracing
from dueflow.domain import timers as timer_rules
from dueflow.domain.timers import TimerKind
from dueflow.exceptions import BackendUnavailable, Busy
from dueflow.service.deps import Deps
from dueflow.service.timeouts import HANDLERS, Handler
from dueflow.store import timers
from dueflow.store.timers import Claimed
from dueflow.worker import isolation, leases

# The feeder, re-exported: callers start it beside the worker (``runner.run_feeder``).
from dueflow.worker.feeder import feed_between as feed_between
from dueflow.worker.feeder import run_feeder as run_feeder

# The isolation's budget and the stats, re-exported (tests read ``runner.SPLIT_RUNS_PER_BIT``).
from dueflow.worker.isolation import SPLIT_RUNS_PER_BIT as SPLIT_RUNS_PER_BIT
from dueflow.worker.isolation import Isolation
from dueflow.worker.isolation import SplitBudget as SplitBudget
from dueflow.worker.stats import Stats as Stats

log = logging.getLogger(__name__)
#: Real seconds the claim loop waits for a batch before it leaves the batch running in its
#: lane and claims the next one: long enough for any batch of database work, short against a
#: provider's timeout.
DETACH_AFTER = 0.2
#: Real seconds a handler that failed on a lost database connection or a busy lock waits before
#: it runs again in place, on those of its timers still claimed; one pause a try. The pool that
#: found its connection dropped has replaced it, and a lock is held for a request's length: a
#: moment later the next try usually goes through. Handing the timers back instead cost a
#: re-claim and a backoff that grows with every earlier failure of the timer (2, 4, 8 s): the
#: chaos soak found unpaid cancels 19-22 s late after pg_terminate_backend.
RERUN_PAUSES = (0.2, 1.0)


class Worker:
    """Runs due timers. Any number may run at once: claims are exclusive."""

    def __init__(
        self,
        deps: Deps,
        *,
        handlers: Mapping[TimerKind, Handler] = HANDLERS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.deps = deps
        self.handlers = handlers
        #: Real time, for the isolation's budget (a cost in the lane, not a deadline).
        self.monotonic = monotonic
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.stats = Stats()
        self._isolation = Isolation(deps, handlers, self.stats, monotonic)
        self._limit: int | None = None  # the next batch's size; None: batch_size
        self._behind = False  # the last claim came back full: must-happen kinds first
        self._lanes: asyncio.BoundedSemaphore | None = None  # made in the running loop
        self._running: set[asyncio.Task[None]] = set()

    async def run_batch(self, claimed: Sequence[Claimed]) -> None:
        """Run the handlers for a claimed batch, each kind alongside the others (a kind waiting
        on a provider holds up no other kind); a failing handler's share is split until the
        timers that fail on their own are found (:meth:`Isolation.isolate`): those go back with
        backoff and the error, and the rest of the batch goes on. While the batch runs, its
        claims are kept (:func:`leases.holding`), so no lease runs out under work in hand."""
        by_kind: dict[TimerKind, list[Claimed]] = defaultdict(list)
        for timer in claimed:
            by_kind[timer.kind].append(timer)
        self.stats.claimed += len(claimed)
        self.stats.batches += 1
        self.deps.metrics.batch_size.observe(len(claimed))
        async with leases.holding(self.deps, self.stats, claimed):
            await asyncio.gather(*(self._run_kind(kind, group) for kind, group in by_kind.items()))
        if not self.deps.trigger.polls_database:
            await self._rearm_retried(claimed)

    async def _run_kind(self, kind: TimerKind, group: Sequence[Claimed]) -> None:
        metrics = self.deps.metrics
        self.stats.by_kind[kind.value] += len(group)
        metrics.claimed(
            kind.value, [(t.deadline_at, t.attempts) for t in group], self.deps.clock.now()
        )
        # One observation per kind's share of a batch, its reruns in place included; one span,
        # linked to the span that armed each timer (a trace of its own).
        with (
            metrics.handler_duration.labels(kind.value).time(),
            tracing.span(
                f"timer {kind.value}",
                kind=tracing.CONSUMER,
                attributes={"dueflow.timer.kind": kind.value, "dueflow.timers": len(group)},
                links=(t.trace_parent for t in group),
                root=True,
            ),
        ):
            await self._run_handler(kind, group)

    async def _run_handler(self, kind: TimerKind, group: Sequence[Claimed]) -> None:
        """Run the kind's handler on ``group``; a lost connection or a busy lock runs it again
        in place (:data:`RERUN_PAUSES`) on the timers still claimed; what still fails is
        isolated (:meth:`Isolation.isolate`), but for a busy lock."""
        pauses = iter(RERUN_PAUSES)
        while True:
            try:
                with isolation.bound(kind, group):
                    await self.handlers[kind](self.deps, group)
            except (BackendUnavailable, Busy) as exc:
                if await _paused(pauses, exc, f"{kind.value} handler for {len(group)} timers"):
                    self.stats.reruns += 1
                    group = await self._still_claimed(group)
                    if not group:
                        return
                    continue
                failure: Exception = exc
            except Exception as exc:
                failure = exc
            else:
                self.deps.metrics.fired.labels(kind.value, "ran").inc(len(group))
                return
            await self._isolation.after(kind, group, failure)
            return

    async def _still_claimed(self, group: Sequence[Claimed]) -> list[Claimed]:
        """The timers of ``group`` still claimed under their token: a failing handler may have
        finished some in a transaction that committed before the failure, and those must not
        run twice. If even that read fails, every timer is kept: the give-back that follows
        another failure is guarded by the token too."""
        held = await self._isolation.claims_held(group)
        return list(group) if held is None else held

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

    async def run_once(self) -> int:
        """Claim one batch of due timers and run it; returns how many were claimed."""
        claimed = await self._claim_due()
        if claimed:
            await self.run_batch(claimed)
        return len(claimed)

    async def _claim_due(self) -> list[Claimed]:
        """Claim one batch of due timers.

        Under a backlog (the batch came back full) the next batch is twice as large, up to
        ``max_batch_size``, so a herd of deadlines pays the per-batch costs fewer times; the
        first partial batch brings it back to ``batch_size``. Beside batches still running in
        their lanes a batch is ``batch_size`` and grows nothing: a slow batch is not a reason to
        hold more claims. Behind (the last batch came back full), a claim takes the must-happen
        kinds first and keeps a share for due order (:func:`timers.claim_due_first`): a cancel
        holding a seat is not left behind a wall of reminders.
        """
        deps = self.deps
        limit = deps.batch_size if self._running else (self._limit or deps.batch_size)
        claim = timers.claim_due_first if self._behind else timers.claim_due
        async with deps.db.write() as conn:
            claimed = await claim(conn, now=deps.clock.now(), limit=limit, lease=deps.lease)
        # (Nearly) full: a claim behind may come back short by its share, which found the
        # must-happen timers it had just taken.
        self._behind = len(claimed) >= max(1, limit - timer_rules.due_order_share(limit))
        if not self._running:
            self._limit = (
                min(limit * 2, max(deps.max_batch_size, deps.batch_size))
                if self._behind
                else deps.batch_size
            )
        return claimed

    async def deliver(self, timer_ids: Sequence[int]) -> int:
        """Run timers a trigger handed over; those not scheduled and due are dropped."""
        claimed = await self._claim_ids(timer_ids)
        if claimed:
            await self.run_batch(claimed)
        return len(claimed)

    async def _claim_ids(self, timer_ids: Sequence[int]) -> list[Claimed]:
        """Claim the timers a trigger delivered. A lost connection or a busy lock is tried again
        in place (:data:`RERUN_PAUSES`): the trigger has handed the ids over, and given up, they
        would wait for the trigger's own lease (60 s) or the scanner's next pass."""
        pauses = iter(RERUN_PAUSES)
        while True:
            try:
                async with self.deps.db.write() as conn:
                    return await timers.claim_ids(
                        conn, timer_ids, now=self.deps.clock.now(), lease=self.deps.lease
                    )
            except (BackendUnavailable, Busy) as exc:
                if not await _paused(pauses, exc, f"claiming {len(timer_ids)} delivered timers"):
                    raise

    async def drain(self) -> int:
        """Run batches until nothing is due; returns how many timers were claimed."""
        total = 0
        while n := await self.run_once():
            total += n
        return total

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set; the batches in progress finish.

        A batch still running after :data:`DETACH_AFTER` (it waits on a provider) goes on in
        its lane while the loop claims the next one, up to ``worker_batches`` batches at once
        (shared by every loop of this worker), so a slow close never delays a deadline that
        needs no provider for more than that. With the ``db``
        trigger: claim what is due, else sleep until the next due time (at most ``max_idle``)
        or until woken. With a trigger that hands over ids: run what it delivers, then
        acknowledge it; what it misses the scanner finds.
        """
        deps = self.deps
        if self._lanes is None:
            self._lanes = asyncio.BoundedSemaphore(deps.worker_batches)
        lanes = self._lanes
        try:
            while not stop.is_set():
                await lanes.acquire()
                lane = Lane(lanes)
                if stop.is_set():  # stopped while waiting for a lane: claim nothing more
                    lane.release()
                    break
                try:
                    if deps.trigger.polls_database:
                        await self._poll_once(lane)
                    else:
                        await self._delivered_once(lane)
                except Exception as exc:
                    lane.release()
                    logs.failed(log, "worker loop error; retrying shortly", exc)
                    await deps.clock.sleep_until(deps.clock.now() + deps.max_idle, stop)
        finally:
            if self._running:
                await asyncio.gather(*self._running, return_exceptions=True)

    def start(
        self,
        claimed: Sequence[Claimed],
        lane: Lane,
        then: Callable[[], Awaitable[None]] | None = None,
    ) -> asyncio.Task[None]:
        """Run a claimed batch in its own task, holding a lane until it (and ``then``) ends."""

        async def go() -> None:
            try:
                await self.run_batch(claimed)
                if then is not None:
                    await then()
            except Exception:
                log.exception("batch of %d timers failed; their leases will expire", len(claimed))
            finally:
                lane.release()

        task = asyncio.create_task(go())
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return task

    async def detach(
        self,
        claimed: Sequence[Claimed],
        lane: Lane,
        then: Callable[[], Awaitable[None]] | None = None,
    ) -> asyncio.Task[None]:
        """:meth:`start` the batch and wait for it :data:`DETACH_AFTER` at most; it goes on in
        its lane after that."""
        batch = self.start(claimed, lane, then)
        await asyncio.wait({batch}, timeout=DETACH_AFTER)
        return batch

    async def _poll_once(self, lane: Lane) -> None:
        """Holding one lane: start a batch in it, or give it back and wait for the next due."""
        deps = self.deps
        claimed = await self._claim_due()
        if claimed:
            await self.detach(claimed, lane)
            return
        lane.release()
        async with deps.db.read() as conn:
            next_due = await timers.next_due_at(conn)
        until = deps.clock.now() + deps.max_idle
        if next_due is not None and next_due < until:
            until = next_due
        self.stats.waits += 1
        await deps.trigger.wait(deps.clock, until)

    async def _delivered_once(self, lane: Lane) -> None:
        """Holding one lane: run what the trigger delivers in it, or give it back."""
        deps = self.deps
        self.stats.waits += 1
        ids = await deps.trigger.wait(deps.clock, deps.clock.now() + deps.max_idle)
        if not ids:
            lane.release()
            return
        delivered = list(ids)
        claimed = await self._claim_ids(delivered)
        if claimed:
            await self.detach(claimed, lane, then=lambda: deps.ack(delivered))
            return
        lane.release()
        await deps.ack(delivered)


async def _paused(pauses: Iterator[float], error: Exception, what: str) -> bool:
    """After ``what`` failed on a lost connection or a busy lock: wait the next of ``pauses``
    and say so (True), or False when none is left."""
    pause = next(pauses, None)
    if pause is None:
        return False
    log.warning("%s failed (%s); trying again in %.1f s", what, type(error).__name__, pause)
    await asyncio.sleep(pause)
    return True


class Lane:
    """One of a worker's lanes, held by the loop or by the batch it started; given back once,
    whichever of them gives it back first (an error after a lane was given back must not give
    it back again)."""

    def __init__(self, lanes: asyncio.BoundedSemaphore) -> None:
        self._lanes: asyncio.BoundedSemaphore | None = lanes

    def release(self) -> None:
        lanes, self._lanes = self._lanes, None
        if lanes is not None:
            lanes.release()
