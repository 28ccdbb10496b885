"""The notifier port."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any


@dataclass(frozen=True)
class Reminder:
    """A message to a buyer: a payment reminder (``pay_reminder``) or an order-closed notice
    (``order_closed``, with its ``reason``). ``reminder_id`` is unique and the same on every retry: receivers
    use it to drop a repeat after a crash between sending and recording."""

    reminder_id: int
    kind: str
    order_id: int
    buyer_id: int
    amount: Decimal
    pay_deadline: datetime
    #: ``order_closed``: why the order was closed (its cancel event, such as ``pay_timeout``).
    reason: str | None = None
    #: The notice's envelope (docs/events.md: id, type, version, created_at, actor, data and
    #: the order's snapshot as it is sent): the body a webhook sends. None: built from the
    #: fields above without the order (:func:`dueflow.notifiers.webhook.payload`).
    envelope: Mapping[str, Any] | None = field(default=None, compare=False)


class Notifier(ABC):
    """Delivers reminders."""

    #: How many sends of one reminder may reach the receiver when no answer confirms any of
    #: them (each may have delivered it; receivers drop repeats by ``reminder_id``).
    max_deliveries: int = 3
    #: How many sends one handler may have under way at once; None: the provider concurrency
    #: (a send waits on a receiver). A notifier whose send waits on nothing sets it high, and a
    #: batch of notices then goes in one wave: one check before the sends and one record after
    #: them for the whole batch, where a wave of 32 made two write transactions per 32 notices.
    sends_at_once: int | None = None

    @abstractmethod
    async def send(self, reminder: Reminder) -> None:
        """Deliver ``reminder``, at most once per call: a send whose outcome is unknown is not
        repeated here.

        Raises:
            DeliveryUnknown: it was sent and not answered; it may have been delivered (the
                caller counts it and resends later, up to ``max_deliveries`` sends in all).
            BackendUnavailable: it was not delivered (the timer retries later).
        """

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
