"""The simulator's records: providers, trade, refund and delivery statuses, the armed fault
modes, the operations faults are armed on, and the trades, refunds and outbox notifications.

Private to :mod:`dueflow.payments.simulator.state`, which re-exports all of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from enum import StrEnum

CST = timezone(timedelta(hours=8), "CST")
"""China Standard Time: both providers write their times in Beijing time."""

ZERO = Decimal("0.00")


class Provider(StrEnum):
    """The simulated payment providers."""

    ALIPAY = "alipay"
    WECHATPAY = "wechatpay"


class TradeStatus(StrEnum):
    """A trade's life: waiting for the buyer, then paid or closed (for good)."""

    WAITING = "waiting"
    PAID = "paid"
    CLOSED = "closed"


class RefundStatus(StrEnum):
    """Alipay refunds succeed at once; WeChat refunds are processing for a while first."""

    PROCESSING = "processing"
    SUCCESS = "success"


class Delivery(StrEnum):
    """Where a notification stands."""

    PENDING = "pending"
    ACKNOWLEDGED = "acknowledged"
    DROPPED = "dropped"
    GAVE_UP = "gave_up"


class FailMode(StrEnum):
    """How the next call of an operation fails (``POST /control/fail-next``)."""

    SYSTEM_ERROR = "SYSTEM_ERROR"
    SERVER_ERROR = "5xx"
    TIMEOUT = "timeout"
    #: The request is lost on its way (nothing done); the client sees what ``timeout`` shows.
    LOST = "lost"


OPERATIONS: dict[Provider, dict[str, str]] = {
    Provider.ALIPAY: {
        "alipay.trade.precreate": "precreate",
        "alipay.trade.query": "query",
        "alipay.trade.close": "close",
        "alipay.trade.cancel": "cancel",
        "alipay.trade.refund": "refund",
        "alipay.trade.fastpay.refund.query": "refund_query",
    },
    Provider.WECHATPAY: {
        name: name for name in ("native", "query", "close", "refund", "refund_query")
    },
}
"""Each provider's operations, by the name its API uses, mapped to the short name faults use."""


def operation_name(provider: Provider, name: str) -> str | None:
    """The short operation name for ``name`` (a short name or an Alipay method), or None."""
    table = OPERATIONS[provider]
    return table.get(name) or (name if name in table.values() else None)


@dataclass
class Trade:
    """A trade at the provider (Alipay ``trade_no`` / WeChat ``transaction_id``)."""

    provider: Provider
    out_trade_no: str
    trade_no: str
    amount: Decimal
    subject: str
    notify_url: str
    created_at: datetime
    time_expire: datetime
    attach: str = ""
    buyer_id: str = ""
    status: TradeStatus = TradeStatus.WAITING
    scanned: bool = False
    paid_at: datetime | None = None
    closed_at: datetime | None = None
    refunded: Decimal = ZERO

    @property
    def fully_refunded(self) -> bool:
        """Whether refunds have given back the whole amount."""
        return self.refunded >= self.amount


@dataclass
class Refund:
    """A refund, known by the merchant's refund number (``out_request_no`` / ``out_refund_no``)."""

    provider: Provider
    out_refund_no: str
    out_trade_no: str
    refund_id: str
    amount: Decimal
    reason: str
    notify_url: str
    created_at: datetime
    settles_at: datetime
    status: RefundStatus = RefundStatus.PROCESSING
    succeeded_at: datetime | None = None


@dataclass
class Attempt:
    """One delivery attempt of a notification."""

    at: datetime
    status_code: int | None
    detail: str


@dataclass
class Notification:
    """An outbox entry: one copy of one notification, retried until acknowledged.

    Attributes:
        event: ``TRADE_SUCCESS`` / ``TRADE_CLOSED`` (Alipay), ``TRANSACTION.SUCCESS`` /
            ``REFUND.SUCCESS`` (WeChat).
        notify_id: Alipay's ``notify_id`` or WeChat's event ``id``; the same in every copy
            and every retry.
        trade: A snapshot of the trade when the event happened.
        refund: A snapshot of the refund, for refund events.
        body: WeChat's body, encrypted once and resent as is (headers are signed per attempt).
    """

    seq: int
    provider: Provider
    event: str
    notify_id: str
    url: str
    trade: Trade
    refund: Refund | None
    created_at: datetime
    next_attempt_at: datetime | None
    delivery: Delivery = Delivery.PENDING
    attempts: list[Attempt] = field(default_factory=list)
    body: bytes | None = None
