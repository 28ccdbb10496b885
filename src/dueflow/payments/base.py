"""The payments port."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from enum import StrEnum

from dueflow.domain import money
from dueflow.exceptions import InvalidInput, NotAllowed, NotificationRejected


class StartAnswer(StrEnum):
    """What became of the attempt's start request (the call that creates the trade).

    Close-or-query trusts a provider's "no such trade" only when no request of ours can still
    create it: after a :attr:`REFUSED` start.
    """

    #: No answer came back (a timeout, a gateway timeout, a crash): the request may still be on
    #: its way and create the trade later.
    UNKNOWN = "unknown"
    #: The provider handed out the pay URL: the trade exists (Alipay: once scanned).
    CREATED = "created"
    #: The provider (or a proxy in front of it) answered without a pay URL, or the request was
    #: never sent: our one start request is over and created nothing the buyer was shown.
    REFUSED = "refused"


#: HTTP statuses with which a proxy gives up waiting for the provider, which may still be
#: working on the request: such an answer is no answer.
GATEWAY_TIMEOUTS = frozenset({504, 524})


@dataclass(frozen=True)
class Attempt:
    """A payment attempt as a provider needs it."""

    pay_no: str
    order_id: int
    provider: str
    amount: Decimal
    expires_at: datetime
    start: StartAnswer = StartAnswer.UNKNOWN


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
    #: What the provider gave back on its own while closing (Alipay's cancel refunds a trade
    #: paid in the meantime): the trade is closed, its payment (if notified) needs no refund of
    #: ours. None: nothing was given back.
    refunded: Decimal | None = None

    @classmethod
    def closed(cls, reason: str = "", *, refunded: Decimal | None = None) -> CloseOutcome:
        """The trade is closed and the order may be cancelled: never paid, or paid and given
        back in full by the provider itself (``refunded``)."""
        return cls(CloseResult.CLOSED_UNPAID, reason=reason, refunded=refunded)

    @classmethod
    def paid(cls, payment: VerifiedPayment) -> CloseOutcome:
        """The trade was paid: confirm it instead of cancelling."""
        return cls(CloseResult.PAID, payment=payment)

    @classmethod
    def unknown(cls, reason: str) -> CloseOutcome:
        """No trustworthy answer: never cancel on a guess, try again later."""
        return cls(CloseResult.UNKNOWN, reason=reason)


@dataclass(frozen=True)
class PayStart:
    """Where the buyer pays: a page or QR-code URL (Alipay) or a code URL (WeChat Pay)."""

    pay_url: str


class NotificationEvent(StrEnum):
    """What a verified notification reports."""

    PAID = "paid"
    CLOSED = "closed"
    REFUND = "refund"
    OTHER = "other"


class RefundResult(StrEnum):
    """Where a refund stands at the provider.

    ``NOT_FOUND`` is a definite answer about the refund number, not about the money: the provider
    has no refund by that number (the request never reached it, or was lost before it was
    processed). It is never final: the refund is submitted again with the same number.

    ``ALREADY_REFUNDED`` is final: the provider refuses the refund because the trade's money
    went back already by another way than this refund number (Alipay's trade.cancel of a trade
    paid meanwhile), at least the refund's amount, as the provider's own records say.
    """

    SUCCEEDED = "succeeded"
    PROCESSING = "processing"
    FAILED = "failed"
    UNKNOWN = "unknown"
    NOT_FOUND = "not_found"
    ALREADY_REFUNDED = "already_refunded"


@dataclass(frozen=True)
class RefundOutcome:
    """A provider's answer about a refund."""

    result: RefundResult
    reason: str = ""


@dataclass(frozen=True)
class RefundRequest:
    """A refund as a provider needs it; ``refund_no`` is fixed and reused on every retry."""

    refund_no: str
    pay_no: str
    amount: Decimal
    total: Decimal
    reason: str


@dataclass(frozen=True)
class ProviderNotification:
    """A notification whose signature (and decryption) checked out."""

    event: NotificationEvent
    pay_no: str
    amount: Decimal | None = None
    provider_trade_no: str | None = None
    refund_no: str | None = None
    refund: RefundOutcome | None = None
    state: str = ""


class PaymentProvider(ABC):
    """One payment provider."""

    name: str = ""
    #: The most one trade can carry, in yuan: the provider's own limit, or the largest amount
    #: dueflow takes anywhere (:data:`dueflow.domain.money.MAX_AMOUNT`, what an operator may
    #: record as a manual payment) for a provider without one.
    max_amount: Decimal = money.MAX_AMOUNT

    def check_amount(self, amount: Decimal) -> None:
        """Refuse an amount this provider can never take, before an attempt is stored.

        Raises:
            InvalidInput: ``amount`` is above :attr:`max_amount`.
        """
        if amount > self.max_amount:
            raise InvalidInput(
                f"{self.name} takes at most {self.max_amount} yuan per payment, not {amount}: "
                "pay with another provider"
            )

    async def start(self, attempt: Attempt, *, subject: str) -> PayStart:
        """Create the trade at the provider, expiring at ``attempt.expires_at``.

        Raises:
            ProviderUnavailable: the provider did not answer clearly.
        """
        raise NotAllowed(f"{self.name} payments cannot be started by the buyer")

    def verify_notification(
        self, body: bytes, headers: Mapping[str, str], now: datetime
    ) -> ProviderNotification:
        """Verify a raw notification and say what it reports.

        Raises:
            NotificationRejected: bad signature, stale, malformed, another merchant's.
        """
        raise NotificationRejected(f"{self.name} sends no notifications")

    async def refund(self, request: RefundRequest) -> RefundOutcome:
        """Ask for the refund (idempotent by ``refund_no``); never raises for the provider's
        own trouble: that is :attr:`RefundResult.UNKNOWN`."""
        return RefundOutcome(RefundResult.UNKNOWN, f"{self.name} cannot refund")

    async def refund_status(self, request: RefundRequest) -> RefundOutcome:
        """Where the refund stands now (same contract as :meth:`refund`).

        A provider that has no refund by ``request.refund_no`` answers
        :attr:`RefundResult.NOT_FOUND`, never :attr:`RefundResult.FAILED`: the caller then
        submits it again.
        """
        return await self.refund(request)

    async def refunded_on_its_own(self, request: RefundRequest) -> RefundOutcome:
        """Whether the provider gave the trade's money back by itself, not by
        ``request.refund_no``: :attr:`RefundResult.ALREADY_REFUNDED` (the amount in the
        reason) when at least ``request.amount`` went back, :attr:`RefundResult.NOT_FOUND` when
        it did not, :attr:`RefundResult.UNKNOWN` when it cannot tell. Never raises for the
        provider's trouble.

        The default is a provider that never refunds by itself (WeChat Pay's close never
        refunds; a manual payment has no provider): NOT_FOUND.
        """
        return RefundOutcome(RefundResult.NOT_FOUND, f"{self.name} refunds only when asked")

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""

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

    def largest_amount(self) -> Decimal:
        """The most any configured provider takes in one payment: an order owing more could
        never be paid."""
        return max((p.max_amount for p in self._by_name.values()), default=Decimal(0))

    def check_payable(self, amount: Decimal) -> None:
        """Refuse a total no configured provider takes, before an order holds anything for it.

        Raises:
            InvalidInput: ``amount`` is above :meth:`largest_amount` (the message names it).
        """
        largest = self.largest_amount()
        if amount > largest:
            takers = ", ".join(
                n for n, p in sorted(self._by_name.items()) if p.max_amount == largest
            )
            raise InvalidInput(
                f"the order's total {amount} is above {largest} yuan, the most one payment can"
                f" carry here ({takers or 'no payment provider is configured'})"
            )

    async def aclose(self) -> None:
        """Close every provider's connections."""
        for provider in self._by_name.values():
            await provider.aclose()
