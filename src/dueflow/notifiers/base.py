"""The notifier port."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal


@dataclass(frozen=True)
class Reminder:
    """A reminder to deliver. ``reminder_id`` is unique and the same on every retry: receivers
    use it to drop a repeat after a crash between sending and recording."""

    reminder_id: int
    kind: str
    order_id: int
    buyer_id: int
    amount: Decimal
    pay_deadline: datetime


class Notifier(ABC):
    """Delivers reminders."""

    @abstractmethod
    async def send(self, reminder: Reminder) -> None:
        """Deliver ``reminder``.

        Raises:
            BackendUnavailable: it could not be delivered (the timer retries later).
        """

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
