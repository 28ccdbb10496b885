"""What the use cases need, wired once by :mod:`dueflow.bootstrap`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from dueflow.clock import Clock
from dueflow.domain.deadlines import DeadlinePolicy
from dueflow.domain.timers import MAX_ATTEMPTS
from dueflow.locks.base import Locks, NoLocks
from dueflow.metrics.prometheus import Metrics
from dueflow.notifiers.base import Notifier
from dueflow.payments.base import Providers
from dueflow.seatcache.base import NoSeatCache, SeatCache
from dueflow.store.db import Database
from dueflow.store.holds import Holds
from dueflow.store.timers import Armed
from dueflow.timers.base import Trigger

log = logging.getLogger(__name__)


@dataclass
class Deps:
    """The adapters and policies a use case may call."""

    db: Database
    clock: Clock
    policy: DeadlinePolicy
    providers: Providers
    notifier: Notifier
    trigger: Trigger
    holds: Holds = field(default_factory=Holds.build)
    seat_cache: SeatCache = field(default_factory=NoSeatCache)
    locks: Locks = field(default_factory=NoLocks)
    lock_ttl: timedelta = timedelta(seconds=10)
    batch_size: int = 200
    max_batch_size: int = 2000
    lease: timedelta = timedelta(seconds=60)
    max_idle: timedelta = timedelta(seconds=1)
    scan_interval: timedelta = timedelta(seconds=60)
    scan_grace: timedelta = timedelta(seconds=5)
    seat_reconcile_interval: timedelta = timedelta(seconds=60)
    provider_concurrency: int = 32
    worker_batches: int = 4
    #: A timer whose handler failed this many times in a row is parked (``TimerState.PARKED``).
    timer_max_attempts: int = MAX_ATTEMPTS
    #: Webhook endpoints may reach private, loopback and link-local addresses
    #: (``DUEFLOW_WEBHOOK_ALLOW_PRIVATE``; :mod:`dueflow.notifiers.addresses`).
    webhook_allow_private: bool = False
    trigger_errors: int = 0
    metrics: Metrics = field(default_factory=Metrics)

    def __post_init__(self) -> None:
        # Errors a trigger handles itself (a claim that failed while waiting) are counted in
        # this process's metrics, however the Deps was built.
        self.trigger.count_errors(self._trigger_failed)
        self.metrics.watch_trigger(self.trigger.scheme)

    def _trigger_failed(self, operation: str) -> None:
        self.metrics.trigger_failed(self.trigger.scheme, operation)

    async def arm(self, armed: Sequence[Armed]) -> None:
        """Tell the trigger about committed timers. Trigger trouble never fails the caller: the
        timer row is the truth and the scanner fires it within its interval."""
        if not armed:
            return
        try:
            await self.trigger.armed(armed)
        except Exception:
            self.trigger_errors += 1
            self._trigger_failed("arm")
            log.exception(
                "trigger failed to arm %d timers; the scanner will cover them", len(armed)
            )

    async def ack(self, timer_ids: Sequence[int]) -> None:
        """Acknowledge delivered timers to the trigger; a failure is counted and raised (the
        trigger delivers them again and the claim drops those already done)."""
        try:
            await self.trigger.ack(timer_ids)
        except Exception:
            self._trigger_failed("ack")
            raise

    async def feed(self, timers: Sequence[Armed]) -> None:
        """Hand the trigger timers within its horizon (the feeder); a failure is counted and
        raised (the feeder's next pass and the scanner cover them)."""
        try:
            await self.trigger.feed(timers)
        except Exception:
            self._trigger_failed("feed")
            raise
