"""What a worker has done since it started (read by the scanner, the CLI and the tests)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


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
    #: Scanner passes started because a lease still held ran out (not the scan interval).
    lease_wakes: int = 0
    #: Timers parked after their last attempt failed.
    parked: int = 0
    by_kind: dict[str, int] = field(default_factory=lambda: defaultdict(int))
