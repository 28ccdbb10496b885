"""The payments port."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from enum import StrEnum

from dueflow.exceptions import InvalidInput


@dataclass(frozen=True)
class Attempt:
    """A payment attempt as a provider needs it."""

    pay_no: str
    order_id: int
    provider: str
    amount: Decimal
    expires_at: datetime


@dataclass(frozen=True)
class VerifiedPayment:
    """A payment a provider vouched for (a verified notification, a query answer, an operator)."""

    pay_no: str
    amount: Decimal
    provider_trade_no: str | None = None


class CloseResult(StrEnum):
    """What closing a trade found."""

    CLOSED_UNPAID = "closed_unpaid"
    PAID = "paid"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class CloseOutcome:
    """The answer of close-or-query."""

    result: CloseResult
    payment: VerifiedPayment | None = None
    reason: str = ""

    @classmethod
    def closed(cls, reason: str = "") -> CloseOutcome:
        """The trade is closed and was never paid: safe to cancel."""
        return cls(CloseResult.CLOSED_UNPAID, reason=reason)

    @classmethod
    def paid(cls, payment: VerifiedPayment) -> CloseOutcome:
        """The trade was paid: confirm it instead of cancelling."""
        return cls(CloseResult.PAID, payment=payment)

    @classmethod
    def unknown(cls, reason: str) -> CloseOutcome:
        """No trustworthy answer: never cancel on a guess, try again later."""
        return cls(CloseResult.UNKNOWN, reason=reason)


class PaymentProvider(ABC):
    """One payment provider."""

    name: str = ""

    @abstractmethod
    async def close_or_query(self, attempt: Attempt, now: datetime) -> CloseOutcome:
        """Close the attempt's trade so it can no longer be paid, and say whether it was paid.

        Must not raise for the provider's own trouble: a timeout, a system error or an answer
        that fails verification is :meth:`CloseOutcome.unknown`.
        """


class Providers:
    """The configured providers by name."""

    def __init__(self, providers: Iterable[PaymentProvider]) -> None:
        self._by_name = {p.name: p for p in providers}

    def get(self, name: str) -> PaymentProvider:
        """The provider called ``name``."""
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(sorted(self._by_name))
            raise InvalidInput(f"unknown payment provider {name!r}; known: {known}") from None

    def names(self) -> list[str]:
        """The configured providers' names."""
        return sorted(self._by_name)
