"""The safety net: every scan interval, claim what the trigger missed (timers due more than a
grace period ago) and claims whose lease expired (a killed worker), and run the same handlers.
Between passes it wakes as soon as the earliest lease still held runs out.

A pass claims batch after batch and runs each in a lane of its own, as the worker's loop does
(:meth:`Worker.detach`): a batch still running after
:data:`~dueflow.worker.runner.DETACH_AFTER` goes on while the pass claims the next one, so a
timer at the end of a long walk (a trigger that lost everything, a worker frozen with its
claims) waits for no other batch's provider calls and commits. Passes start a scan interval
apart, however long the one before took."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from dueflow import logs
from dueflow.store import timers
from dueflow.worker.runner import Lane, Worker

log = logging.getLogger(__name__)


@dataclass
class ScanReport:
    """What one scanner pass did (``failed_batches``: known once its batches ended, so only
    from :func:`scan_once`)."""

    claimed: int = 0
    batches: int = 0
    failed_batches: int = 0
    errors: int = 0
    seconds: float = 0.0


class Scanner:
    """Passes of one worker's scanner, their batches at most ``worker_batches`` at once (lanes
    of the scanner's own: the worker's loops hold theirs while they wait on the trigger)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._lanes = asyncio.BoundedSemaphore(worker.deps.worker_batches)
        self._running: set[asyncio.Task[None]] = set()

    async def scan(self, stop: asyncio.Event | None = None) -> ScanReport:
        """One pass: walk by (due_at, id) up to a cutoff fixed at the start, in batches, past
        failures; the batches may still run when it returns (:meth:`settle` waits for them).
        Once ``stop`` is set the pass claims nothing more. Counted in
        ``dueflow_scanner_{passes,claimed,errors}_total``."""
        worker = self.worker
        deps = worker.deps
        metrics = deps.metrics
        report = ScanReport()
        started = time.perf_counter()
        cutoff = deps.clock.now() - deps.scan_grace
        after = None
        while stop is None or not stop.is_set():
            await self._lanes.acquire()  # a lane first: no claim waits unrun for one
            lane = Lane(self._lanes)
            try:
                async with deps.db.write() as conn:
                    claimed, after = await timers.claim_overdue(
                        conn,
                        now=deps.clock.now(),
                        cutoff=cutoff,
                        after=after,
                        limit=deps.batch_size,
                        lease=deps.lease,
                    )
            except Exception as exc:
                lane.release()
                report.errors += 1
                metrics.scanner_errors.inc()
                logs.failed(log, "scanner could not claim; ending this pass", exc)
                break
            if not claimed:
                lane.release()
                if after is None:
                    break
                continue
            report.claimed += len(claimed)
            report.batches += 1
            metrics.scanner_claimed.inc(len(claimed))
            batch = await worker.detach(claimed, lane)
            if not batch.done():
                self._running.add(batch)
                batch.add_done_callback(self._running.discard)
        report.seconds = time.perf_counter() - started
        metrics.scanner_passes.inc()
        if report.claimed:
            log.warning(
                "scanner fired %d missed timers in %d batches", report.claimed, report.batches
            )
        return report

    async def settle(self) -> None:
        """Wait for the batches this scanner started."""
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)


async def scan_once(worker: Worker, stop: asyncio.Event | None = None) -> ScanReport:
    """One pass (:meth:`Scanner.scan`), returning once its batches have ended."""
    scanner = Scanner(worker)
    failed_before = worker.stats.failed_batches
    report = await scanner.scan(stop)
    await scanner.settle()
    report.failed_batches = worker.stats.failed_batches - failed_before
    return report


#: The least time (the deps' clock) between the start of one pass and a pass a lease's end wakes: a claim
#: whose lease ran out but which the pass could not take (locked a moment) is not chased in a
#: busy loop.
PASS_GAP = timedelta(seconds=1)
#: The earliest lease end is read this many times a lease (at most once a scan interval), so a
#: claim made after a read is seen before its lease runs out.
LEASE_READS = 4


async def run_scanner(worker: Worker, stop: asyncio.Event) -> None:
    """Scan at start and then every scan interval (start to start), and as soon as a claim's
    lease runs out (:func:`_wait_for_pass`), until ``stop`` is set; the batches in progress
    end before it returns."""
    deps = worker.deps
    scanner = Scanner(worker)
    try:
        while not stop.is_set():
            began = deps.clock.now()
            await scanner.scan(stop)
            await _wait_for_pass(worker, began, stop)
    finally:
        await scanner.settle()


async def _wait_for_pass(worker: Worker, began: datetime, stop: asyncio.Event) -> None:
    """Sleep until the next pass: a scan interval after ``began``, or the end of the earliest
    lease still held, whichever comes first (a lease renewed meanwhile is read again before a
    pass starts). So a killed or frozen worker's claims come back one lease after its last
    claim or renewal, not a lease and then up to a whole scan interval later."""
    deps = worker.deps
    interval_over = began + deps.scan_interval
    watch = min(deps.scan_interval, deps.lease / LEASE_READS)
    while not stop.is_set():
        now = deps.clock.now()
        if now >= interval_over:
            return
        try:
            async with deps.db.read() as conn:
                lease_end = await timers.next_lease_end(conn)
        except Exception as exc:
            logs.failed(log, "scanner could not read the leases; waiting for its interval", exc)
            lease_end = None
        if lease_end is not None:
            lease_end = max(lease_end, began + PASS_GAP)
            if lease_end <= now:
                worker.stats.lease_wakes += 1
                return
        wake = min(interval_over, now + watch)
        if lease_end is not None:
            wake = min(wake, lease_end)
        await deps.clock.sleep_until(wake, stop)
