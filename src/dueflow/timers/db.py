"""The ``db`` trigger: the worker sleeps until the earliest due time, woken early when a sooner
timer is scheduled in this process. Other processes' timers are found by the worker's next poll
(at most ``max_idle`` away) and by the scanner."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime

from dueflow.clock import Clock
from dueflow.store.timers import Armed
from dueflow.timers.base import Trigger


class DbTrigger(Trigger):
    """Polls the timers table, sleeping until the next due time."""

    scheme = "db"
    polls_database = True

    def __init__(self) -> None:
        self._wake: asyncio.Event | None = None
        self._until: datetime | None = None

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> DbTrigger:
        """``db`` takes no options."""
        return cls()

    def _event(self) -> asyncio.Event:
        if self._wake is None:
            self._wake = asyncio.Event()
        return self._wake

    async def armed(self, timers: Sequence[Armed]) -> None:
        if not timers:
            return
        earliest = min(t.due_at for t in timers)
        # Not waiting yet (between reading the next due time and sleeping): leave the event set
        # so the coming wait returns at once and the loop looks again.
        if self._until is None or earliest < self._until:
            self._event().set()

    async def wait(self, clock: Clock, until: datetime) -> Sequence[int] | None:
        event = self._event()
        self._until = until
        try:
            await clock.sleep_until(until, event)
        finally:
            self._until = None
            event.clear()
        return None

    def wake(self) -> None:
        self._event().set()
