"""The worker: claim due timers in batches, run each kind's handler on its share of the batch."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from dueflow import logs
from dueflow.domain.timers import TimerKind, backoff, is_parked, quick_backoff
from dueflow.exceptions import BackendUnavailable, Busy
from dueflow.service.deps import Deps
from dueflow.service.timeouts import HANDLERS, Handler
from dueflow.store import timers
from dueflow.store.timers import Claimed

# The feeder, re-exported: callers start it beside the worker (``runner.run_feeder``).
from dueflow.worker.feeder import feed_between as feed_between
from dueflow.worker.feeder import run_feeder as run_feeder

log = logging.getLogger(__name__)
#: Real seconds a batch runs before its leases are renewed (every third of a lease from then).
HOLD_AFTER = 1.0
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
#: Handler runs the isolation of one failure may spend, per bit of the share's size: 4 x 8 = 32
#: runs for a share of 200, enough to find two failing timers (about 2 log2 n runs each),
#: where running every half of a share that fails whole (a code error, a failure of every
#: order) took 2n - 1. What is not isolated within that goes back whole.
SPLIT_RUNS_PER_BIT = 4


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


@dataclass
class Stats:
    """What a worker has done since it started."""

    claimed: int = 0
    batches: int = 0
    failed_batches: int = 0
    #: Times the loop found nothing to do and waited on its trigger.
    waits: int = 0
    #: Times the leases of a batch in progress were renewed.
    renewals: int = 0
    #: Times a handler ran again in place after a lost connection or a busy lock.
    reruns: int = 0
    #: Times a failed group was split in halves to find the timers that fail on their own.
    splits: int = 0
    #: Timers parked after their last attempt failed.
    parked: int = 0
    by_kind: dict[str, int] = field(default_factory=lambda: defaultdict(int))


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
        self._limit: int | None = None  # the next batch's size; None: batch_size
        self._lanes: asyncio.BoundedSemaphore | None = None  # made in the running loop
        self._running: set[asyncio.Task[None]] = set()

    async def run_batch(self, claimed: Sequence[Claimed]) -> None:
        """Run the handlers for a claimed batch, each kind alongside the others (a kind waiting
        on a provider holds up no other kind); a failing handler's share is split until the
        timers that fail on their own are found (:meth:`_isolate`): those go back with backoff
        and the error, and the rest of the batch goes on. While the batch runs, its
        claims are kept (:meth:`_holding`), so no lease runs out under work in hand."""
        by_kind: dict[TimerKind, list[Claimed]] = defaultdict(list)
        for timer in claimed:
            by_kind[timer.kind].append(timer)
        self.stats.claimed += len(claimed)
        self.stats.batches += 1
        self.deps.metrics.batch_size.observe(len(claimed))
        async with self._holding(claimed):
            await asyncio.gather(*(self._run_kind(kind, group) for kind, group in by_kind.items()))
        if not self.deps.trigger.polls_database:
            await self._rearm_retried(claimed)

    async def _run_kind(self, kind: TimerKind, group: Sequence[Claimed]) -> None:
        metrics = self.deps.metrics
        self.stats.by_kind[kind.value] += len(group)
        metrics.claimed(
            kind.value, [(t.deadline_at, t.attempts) for t in group], self.deps.clock.now()
        )
        # One observation per kind's share of a batch, its reruns in place included.
        with metrics.handler_duration.labels(kind.value).time():
            await self._run_handler(kind, group)

    async def _run_handler(self, kind: TimerKind, group: Sequence[Claimed]) -> None:
        """Run the kind's handler on ``group``; a lost connection or a busy lock runs it again
        in place (:data:`RERUN_PAUSES`) on the timers still claimed; what still fails is
        isolated (:meth:`_isolate`), but for a busy lock."""
        pauses = iter(RERUN_PAUSES)
        while True:
            try:
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
            budget = SplitBudget(
                until=self.monotonic() + self.deps.lease.total_seconds(),
                runs=SPLIT_RUNS_PER_BIT * len(group).bit_length(),
            )
            await self._isolate(kind, group, failure, budget)
            return

    async def _isolate(
        self, kind: TimerKind, group: Sequence[Claimed], exc: Exception, budget: SplitBudget
    ) -> None:
        """After the handler failed on ``group``: run each half of the timers still claimed
        again, and so on down to the timers that fail on their own, which alone go back
        (:meth:`_failed`). One order the handler cannot act on (a trigger refusing its update,
        a row a bug trips on) thus holds up no other order of the batch: handed back together
        they were due again together and failed together, for good. Each half runs once,
        without reruns in place. Bounded by ``budget`` (runs, and one lease of real time since
        the failure): past it, what is left goes back whole, as does the whole group if the
        database cannot even say which timers are still claimed (it is down, not refusing one
        order). A busy lock is never split: no one order causes it, and each half would wait
        on the lock again (on MariaDB innodb_lock_wait_timeout, 50 s a wait); the group goes
        back whole, due again in seconds."""
        if isinstance(exc, Busy):
            await self._failed(kind, group, exc)
            return
        if len(group) > 1:
            held = await self._claims_held(group)
            if held is None:
                await self._failed(kind, group, exc)
                return
            group = held
        if len(group) <= 1:
            if group:
                await self._failed(kind, group, exc)
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
                await self._failed(kind, half, exc)
                continue
            try:
                await self.handlers[kind](self.deps, half)
            except Exception as again:
                await self._isolate(kind, half, again, budget)
            else:
                self.deps.metrics.fired.labels(kind.value, "ran").inc(len(half))

    async def _failed(self, kind: TimerKind, group: Sequence[Claimed], exc: Exception) -> None:
        """Count a handler's failure and hand its timers back: due again after the backoff (2 s
        doubling after a lost connection or a busy lock, not the 30 s of other failures), or
        parked on their last attempt (``timer_max_attempts``)."""
        self.stats.failed_batches += 1
        self.deps.metrics.fired.labels(kind.value, "failed").inc(len(group))
        log.error("%s handler failed for %d timers", kind.value, len(group), exc_info=exc)
        delay = quick_backoff if isinstance(exc, BackendUnavailable | Busy) else backoff
        await self._give_back(kind, group, f"{type(exc).__name__}: {exc}", delay)

    async def _still_claimed(self, group: Sequence[Claimed]) -> list[Claimed]:
        """The timers of ``group`` still claimed under their token: a failing handler may have
        finished some in a transaction that committed before the failure, and those must not
        run twice. If even that read fails, every timer is kept: the give-back that follows
        another failure is guarded by the token too."""
        held = await self._claims_held(group)
        return list(group) if held is None else held

    async def _claims_held(self, group: Sequence[Claimed]) -> list[Claimed] | None:
        """:meth:`_still_claimed`, or None when the database could not say."""
        try:
            async with self.deps.db.read() as conn:
                return await timers.still_claimed(conn, group)
        except Exception:
            log.exception("could not read which of %d timers are still claimed", len(group))
            return None

    @contextlib.asynccontextmanager
    async def _holding(self, claimed: Sequence[Claimed]) -> AsyncIterator[None]:
        """Renew the batch's leases every third of a lease until the block ends, once it has
        run for :data:`HOLD_AFTER` (most batches end sooner and never write a renewal)."""
        done = asyncio.Event()
        keeper = asyncio.create_task(self._keep_leases(claimed, done))
        try:
            yield
        finally:
            # Told by the event, not cancelled: a renewal in flight finishes (a statement
            # cancelled mid-way is a pooled connection's trouble to come). Cancelled only if it
            # hangs for a whole lease, when the lease has run out anyway.
            done.set()
            await asyncio.wait({keeper}, timeout=self.deps.lease.total_seconds())
            if not keeper.done():
                keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeper

    async def _keep_leases(self, claimed: Sequence[Claimed], done: asyncio.Event) -> None:
        deps = self.deps
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
            self.stats.renewals += 1
            if not held:
                return

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

    async def _give_back(
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
        hold more claims.
        """
        deps = self.deps
        if self._running:
            async with deps.db.write() as conn:
                return await timers.claim_due(
                    conn, now=deps.clock.now(), limit=deps.batch_size, lease=deps.lease
                )
        limit = self._limit or deps.batch_size
        async with deps.db.write() as conn:
            claimed = await timers.claim_due(
                conn, now=deps.clock.now(), limit=limit, lease=deps.lease
            )
        full = len(claimed) == limit
        self._limit = (
            min(limit * 2, max(deps.max_batch_size, deps.batch_size)) if full else deps.batch_size
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
