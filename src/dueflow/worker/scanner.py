"""The safety net: every scan interval, claim what the trigger missed (timers due more than a
grace period ago) and claims whose lease expired (a killed worker), and run the same handlers."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from dueflow.store import timers
from dueflow.worker.runner import Worker

log = logging.getLogger(__name__)


@dataclass
class ScanReport:
    """What one scanner pass did."""

    claimed: int = 0
    batches: int = 0
    failed_batches: int = 0
    errors: int = 0
    seconds: float = 0.0


async def scan_once(worker: Worker, stop: asyncio.Event | None = None) -> ScanReport:
    """One pass: walk by (due_at, id) up to a cutoff fixed at the start, in batches, past
    failures. Once ``stop`` is set the pass ends after the batch in progress. Counted in
    ``dueflow_scanner_{passes,claimed,errors}_total``."""
    deps = worker.deps
    metrics = deps.metrics
    report = ScanReport()
    started = time.perf_counter()
    now = deps.clock.now()
    cutoff = now - deps.scan_grace
    after = None
    failed_before = worker.stats.failed_batches
    while stop is None or not stop.is_set():
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
        except Exception:
            report.errors += 1
            metrics.scanner_errors.inc()
            log.exception("scanner could not claim; ending this pass")
            break
        if after is None:
            break
        if claimed:
            report.claimed += len(claimed)
            report.batches += 1
            metrics.scanner_claimed.inc(len(claimed))
            await worker.run_batch(claimed)
    report.failed_batches = worker.stats.failed_batches - failed_before
    report.seconds = time.perf_counter() - started
    metrics.scanner_passes.inc()
    if report.claimed:
        log.warning("scanner fired %d missed timers in %d batches", report.claimed, report.batches)
    return report


async def run_scanner(worker: Worker, stop: asyncio.Event) -> None:
    """Scan at start and then every scan interval until ``stop`` is set."""
    deps = worker.deps
    while not stop.is_set():
        await scan_once(worker, stop)
        await deps.clock.sleep_until(deps.clock.now() + deps.scan_interval, stop)
