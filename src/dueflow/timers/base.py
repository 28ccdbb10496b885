"""The trigger contract. A trigger wakes workers at the due time; it never decides anything.

Losing everything a trigger holds costs lateness (the scanner fires the timers within its
interval), never a deadline: the timers table is the truth.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from dueflow.clock import Clock
from dueflow.store.timers import Armed


class Trigger(ABC):
    """Tells workers when timers are due."""

    scheme: str = ""
    #: True when workers find due timers by querying the database themselves (the ``db``
    #: trigger); False when the trigger hands them ids.
    polls_database: bool = False
    #: Only timers due within this horizon are handed to the trigger (by :meth:`armed` and by
    #: the feeder); None when the trigger needs no feeding.
    horizon: timedelta | None = None

    #: Told the operation each time the trigger handles an error of its backend itself
    #: (:meth:`wait` logs and pauses); :meth:`count_errors` sets it.
    _error_counter: Callable[[str], None] | None = None
    #: Told when the trigger sees it may lack timers; :meth:`watch_lost` sets it.
    _lost_hook: Callable[[], None] | None = None

    @classmethod
    @abstractmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> Trigger:
        """A trigger configured by ``url``; ``clock`` tells it the time (the system clock if
        None)."""

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

    async def ack(self, timer_ids: Sequence[int]) -> None:  # noqa: B027 - optional hook
        """The worker has handled (or dropped) these delivered timers: forget them."""

    async def feed(self, timers: Sequence[Armed]) -> None:
        """The feeder hands over scheduled timers that came within the horizon (and, now and
        then, all of them again, to recover what the trigger lost). Same contract as
        :meth:`armed`."""
        await self.armed(timers)

    async def lost(self) -> bool:
        """Whether the backend may lack timers it should hold since this was last asked: it
        lost what it was fed (a Redis flushed, or restarted without its data: told to whichever
        process asks first), or it failed this process (arming may have failed meanwhile). The
        feeder then feeds every scheduled timer within the horizon again at once, rather than
        leave them to the scanner. Never raises: False when it cannot tell (a trigger that
        cannot tell at all recovers by the feeder's periodic full feed)."""
        return False

    def watch_lost(self, hook: Callable[[], None]) -> None:
        """Have ``hook()`` called as soon as the trigger sees that :meth:`lost` would say True
        (its backend answers again after failing, or a claim finds what it was fed gone), so
        the feeder asks at once, not at its next pass. A trigger that cannot see it never
        calls it."""
        self._lost_hook = hook

    def _seen_lost(self) -> None:
        """Backends call this where they see they may lack timers (for the feeder)."""
        if self._lost_hook is not None:
            self._lost_hook()

    def count_errors(self, counter: Callable[[str], None]) -> None:
        """Have ``counter(operation)`` called for each error the trigger handles itself."""
        self._error_counter = counter

    def _handled_error(self, operation: str) -> None:
        """Backends call this where they swallow an error of their own (for the metrics)."""
        if self._error_counter is not None:
            self._error_counter(operation)

    async def ping(self) -> None:  # noqa: B027 - optional hook
        """Check that the trigger's backend answers (``/readyz`` asks); a trigger with no
        backend of its own (``db``) has nothing to check.

        Raises:
            BackendUnavailable: the backend does not answer.
        """

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
