"""Clocks: the only source of "now" in dueflow, so tests can drive deadlines without sleeping."""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta


def utcnow() -> datetime:
    """The wall-clock time, timezone-aware UTC."""
    return datetime.now(UTC)


class Clock(ABC):
    """Tells the time and waits for it."""

    @abstractmethod
    def now(self) -> datetime:
        """The current time, timezone-aware UTC."""

    @abstractmethod
    async def sleep_until(self, when: datetime, wake: asyncio.Event | None = None) -> None:
        """Return once ``when`` has come, or earlier once ``wake`` is set."""


async def _wait(wake: asyncio.Event | None, seconds: float) -> None:
    seconds = max(0.0, seconds)
    if wake is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(wake.wait(), timeout=seconds)


class SystemClock(Clock):
    """Real time."""

    def now(self) -> datetime:
        return utcnow()

    async def sleep_until(self, when: datetime, wake: asyncio.Event | None = None) -> None:
        await _wait(wake, (when - self.now()).total_seconds())


class ScaledClock(Clock):
    """Time that runs ``speed`` times faster than real time, from ``start`` (for demos)."""

    def __init__(self, *, speed: float, start: datetime | None = None) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.speed = speed
        self._start = start or utcnow()
        self._t0 = time.monotonic()

    def now(self) -> datetime:
        return self._start + timedelta(seconds=(time.monotonic() - self._t0) * self.speed)

    async def sleep_until(self, when: datetime, wake: asyncio.Event | None = None) -> None:
        await _wait(wake, (when - self.now()).total_seconds() / self.speed)


class FakeClock(Clock):
    """Time that moves only when a test moves it; sleepers wake when it passes their time."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._moved: asyncio.Condition | None = None
        #: Tasks inside :meth:`sleep_until` right now (tests wait for a loop to be asleep
        #: before they move the clock past its next wake-up).
        self.sleepers = 0

    def now(self) -> datetime:
        return self._now

    def set(self, when: datetime) -> None:
        """Move to ``when`` (never backwards)."""
        if when.tzinfo is None:
            raise ValueError("FakeClock needs a timezone-aware time")
        self._now = max(self._now, when)
        if self._moved is not None:
            condition = self._moved

            async def notify() -> None:
                async with condition:
                    condition.notify_all()

            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().create_task(notify())

    def advance(self, delta: timedelta | float) -> datetime:
        """Move forward by ``delta`` (seconds or a timedelta) and return the new time."""
        if not isinstance(delta, timedelta):
            delta = timedelta(seconds=delta)
        self.set(self._now + delta)
        return self._now

    async def sleep_until(self, when: datetime, wake: asyncio.Event | None = None) -> None:
        if self._moved is None:
            self._moved = asyncio.Condition()
        condition = self._moved
        self.sleepers += 1
        try:
            while self._now < when and not (wake is not None and wake.is_set()):
                async with condition:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(condition.wait(), timeout=0.05)
        finally:
            self.sleepers -= 1


#: Asks the authoritative clock (the database server's) for its time.
TimeSource = Callable[[], Awaitable[datetime]]


class DatabaseClock(Clock):
    """The database server's time, read through this machine's clock.

    Every process that shares a server database (API processes, workers, scanners on any
    number of machines) decides deadlines by one clock: the database's. ``now()`` is the local
    wall clock plus an offset measured against the database, so it costs nothing per call;
    :meth:`sync` re-measures it (:func:`dueflow.bootstrap.running` does so every
    ``resync`` while the process runs). The offset is taken at the midpoint of the round trip,
    so its error is at most half a round trip plus the local clock's drift until the next sync.
    A worker whose own clock runs a minute fast therefore still acts at the database's deadline
    and records the database's time.
    """

    def __init__(self, source: TimeSource, *, wall: Clock | None = None) -> None:
        """Read time from ``source`` (the database), carried between syncs by ``wall``."""
        self._source = source
        self._wall = wall or SystemClock()
        self.offset = timedelta(0)
        #: Whether :meth:`sync` has succeeded at least once.
        self.synced = False

    def now(self) -> datetime:
        return self._wall.now() + self.offset

    async def sleep_until(self, when: datetime, wake: asyncio.Event | None = None) -> None:
        await self._wall.sleep_until(when - self.offset, wake)

    async def sync(self, *, samples: int = 3) -> timedelta:
        """Measure the offset between the database's clock and the local one; returns it.

        Of ``samples`` readings the one with the shortest round trip is kept: its midpoint is
        the closest to the moment the database read its clock.
        """
        best: tuple[timedelta, timedelta] | None = None
        for _ in range(samples):
            before = self._wall.now()
            remote = await self._source()
            after = self._wall.now()
            reading = (after - before, remote - (before + (after - before) / 2))
            if best is None or reading[0] < best[0]:
                best = reading
        if best is not None:
            self.offset = best[1]
            self.synced = True
        return self.offset
