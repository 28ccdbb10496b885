"""The trigger contract. A trigger wakes workers at the due time; it never decides anything.

Losing everything a trigger holds costs lateness (the scanner fires the timers within its
interval), never a deadline: the timers table is the truth.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import datetime

from dueflow.clock import Clock
from dueflow.store.timers import Armed


class Trigger(ABC):
    """Tells workers when timers are due."""

    scheme: str = ""

    @abstractmethod
    async def armed(self, timers: Sequence[Armed]) -> None:
        """Learn about timers that were just committed as scheduled.

        Called after the commit that wrote them. Must not raise for trouble of the trigger's own:
        the caller logs and counts the failure, and the scanner covers the timer.
        """

    @abstractmethod
    async def wait(self, clock: Clock, until: datetime) -> Sequence[int] | None:
        """Wait until ``until`` or until something earlier becomes due.

        Returns the ids of timers it hands over (the worker claims them in the database, which
        drops any that are done, cancelled or not yet due), or None to mean "claim whatever is
        due from the database".
        """

    @abstractmethod
    def wake(self) -> None:
        """Make a pending :meth:`wait` return now (new work, or shutting down)."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
