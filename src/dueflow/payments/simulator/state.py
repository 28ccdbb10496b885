"""The simulator's memory: trades, refunds, the notification outbox and the armed faults.

Everything lives in one process's memory and changes only through :class:`SimulatorState`'s
methods, none of which awaits, so every change is atomic under asyncio. Time comes from the
injected clock: a trade expires, and a WeChat refund settles, once the clock has passed its time
and :meth:`SimulatorState.advance` runs (every gateway call and every delivery round runs it).

Provider-neutral statuses are kept here; ``alipay.py`` and ``wechatpay.py`` spell them the
providers' way (``WAIT_BUYER_PAY`` / ``NOTPAY`` and so on).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import secrets
import uuid
from datetime import datetime, timedelta
from decimal import Decimal

from dueflow.exceptions import InvalidTransition
from dueflow.payments.simulator import SimulatorConfig
from dueflow.payments.simulator._records import (
    CST,
    OPERATIONS,
    ZERO,
    Attempt,
    Delivery,
    FailMode,
    Notification,
    Provider,
    Refund,
    RefundStatus,
    Trade,
    TradeStatus,
    operation_name,
)

__all__ = [
    "CST",
    "OPERATIONS",
    "ZERO",
    "Attempt",
    "Delivery",
    "FailMode",
    "Notification",
    "Provider",
    "Refund",
    "RefundStatus",
    "SimulatorState",
    "Trade",
    "TradeStatus",
    "operation_name",
]


class SimulatorState:
    """Trades, refunds, the outbox and the armed faults of one simulator instance."""

    def __init__(self, config: SimulatorConfig) -> None:
        self.config = config
        self.clock = config.clock
        self.trades: dict[tuple[Provider, str], Trade] = {}
        self.refunds: dict[tuple[Provider, str, str], Refund] = {}
        self.outbox: list[Notification] = []
        self.wake = asyncio.Event()
        self._failures: dict[tuple[Provider, str], FailMode] = {}
        self._pay_on_close: set[tuple[Provider, str]] = set()
        self._seq = itertools.count(1)

    def now(self) -> datetime:
        """The simulator's current time."""
        return self.clock.now()

    def advance(self) -> None:
        """Expire trades whose time has passed and settle refunds that are due."""
        now = self.now()
        for trade in self.trades.values():
            if trade.status is TradeStatus.WAITING and trade.time_expire <= now:
                self._close(trade, trade.time_expire)
        for refund in self.refunds.values():
            if refund.status is RefundStatus.PROCESSING and refund.settles_at <= now:
                self._settle(refund, refund.settles_at)

    def create_trade(
        self,
        provider: Provider,
        out_trade_no: str,
        *,
        amount: Decimal,
        subject: str,
        notify_url: str,
        time_expire: datetime,
        attach: str = "",
    ) -> Trade:
        """Record a new waiting trade (the caller has checked that the number is unused)."""
        now = self.now()
        trade = Trade(
            provider=provider,
            out_trade_no=out_trade_no,
            trade_no=_trade_no(provider, now),
            amount=amount,
            subject=subject,
            notify_url=notify_url,
            created_at=now,
            time_expire=time_expire,
            attach=attach,
        )
        self.trades[provider, out_trade_no] = trade
        return trade

    def trade(self, provider: Provider, out_trade_no: str) -> Trade | None:
        """The trade, whether or not the buyer has scanned it."""
        return self.trades.get((provider, out_trade_no))

    def visible_trade(self, provider: Provider, out_trade_no: str) -> Trade | None:
        """The trade as the provider's API sees it: an unscanned Alipay QR trade does not exist."""
        trade = self.trade(provider, out_trade_no)
        hidden = provider is Provider.ALIPAY and self.config.alipay_trade_on_scan
        if trade is None or (hidden and not trade.scanned):
            return None
        return trade

    def scan(self, trade: Trade) -> None:
        """The buyer scanned the code: the trade now exists at the provider."""
        if trade.status is TradeStatus.WAITING:
            trade.scanned = True
            trade.buyer_id = trade.buyer_id or _buyer_id(trade.provider)

    def pay(
        self, trade: Trade, *, copies: int = 1, delay: float = 0.0, drop: bool = False
    ) -> list[Notification]:
        """The buyer pays: the trade is paid and its notification queued.

        Args:
            trade: A waiting trade.
            copies: How many copies of the notification to send (same notify id).
            delay: Seconds before the first attempt.
            drop: Queue the notification but never send it.

        Raises:
            InvalidTransition: The trade is not waiting (paid, closed or expired).
        """
        self.advance()
        if trade.status is not TradeStatus.WAITING:
            raise InvalidTransition(
                f"trade {trade.out_trade_no} is {trade.status}", status=trade.status
            )
        self.scan(trade)
        trade.status, trade.paid_at = TradeStatus.PAID, self.now()
        event = "TRADE_SUCCESS" if trade.provider is Provider.ALIPAY else "TRANSACTION.SUCCESS"
        return self._enqueue(trade, event, copies=copies, delay=delay, drop=drop)

    def close(self, trade: Trade) -> bool:
        """Close a trade if it is waiting, after a payment armed by pay-on-close goes through.

        Returns:
            True if this call closed the trade; False if it was paid or closed already (the
            caller reads ``trade.status`` to say which).
        """
        self.advance()
        self.paid_on_close(trade)
        if trade.status is not TradeStatus.WAITING:
            return False
        self._close(trade, self.now())
        return True

    def cancel(self, trade: Trade) -> str:
        """Alipay's ``trade.cancel``: a waiting trade is closed, scanned or not (an unscanned
        code is void: scanning it later finds it closed), a paid one is refunded in full.

        Returns:
            The action taken: ``close``, ``refund``, or ``""`` (closed or refunded already).
        """
        self.advance()
        self.paid_on_close(trade)
        if trade.status is TradeStatus.WAITING:
            self._close(trade, self.now())
            return "close"
        if trade.status is TradeStatus.PAID and not trade.fully_refunded:
            left = trade.amount - trade.refunded
            self.refund(trade, trade.out_trade_no, amount=left, reason="cancel", notify_url="")
            return "refund"
        return ""

    def refund(
        self, trade: Trade, out_refund_no: str, *, amount: Decimal, reason: str, notify_url: str
    ) -> Refund:
        """Refund part or all of a paid trade (the caller has checked the amount and number)."""
        now = self.now()
        settles = (
            now if trade.provider is Provider.ALIPAY else now + self.config.refund_settle_after
        )
        refund = Refund(
            provider=trade.provider,
            out_refund_no=out_refund_no,
            out_trade_no=trade.out_trade_no,
            refund_id="50" + _digits(30),
            amount=amount,
            reason=reason,
            notify_url=notify_url,
            created_at=now,
            settles_at=settles,
        )
        trade.refunded += amount
        self.refunds[trade.provider, trade.out_trade_no, out_refund_no] = refund
        self.advance()
        return refund

    def find_refund(
        self, provider: Provider, out_refund_no: str, *, out_trade_no: str | None = None
    ) -> Refund | None:
        """The refund with this refund number (Alipay's are unique per trade, WeChat's per merchant)."""
        if out_trade_no is not None:
            return self.refunds.get((provider, out_trade_no, out_refund_no))
        found = (
            r for (p, _, no), r in self.refunds.items() if p is provider and no == out_refund_no
        )
        return next(found, None)

    def arm_failure(self, provider: Provider, operation: str, mode: FailMode) -> None:
        """Make the next call of ``operation`` fail the way ``mode`` says."""
        self._failures[provider, operation] = mode

    def take_failure(self, provider: Provider, operation: str) -> FailMode | None:
        """The failure armed for this call, disarmed as it is taken."""
        return self._failures.pop((provider, operation), None)

    def paid_on_close(self, trade: Trade) -> None:
        """A close (or cancel) reaches the trade: the payment armed by pay-on-close, if any,
        goes through first (an Alipay code nobody scanned is reached by cancel only)."""
        if (trade.provider, trade.out_trade_no) in self._pay_on_close:
            self._pay_on_close.discard((trade.provider, trade.out_trade_no))
            if trade.status is TradeStatus.WAITING:
                self.pay(trade)

    def arm_pay_on_close(self, trade: Trade) -> None:
        """Make the buyer pay this trade just as the next close (or Alipay cancel) request
        that reaches it arrives."""
        self._pay_on_close.add((trade.provider, trade.out_trade_no))

    def due_notifications(self, now: datetime) -> list[Notification]:
        """Pending notifications whose next attempt time has come."""
        return [
            n
            for n in self.outbox
            if n.delivery is Delivery.PENDING
            and n.next_attempt_at is not None
            and n.next_attempt_at <= now
        ]

    def next_event_at(self) -> datetime | None:
        """The earliest time something is due: an attempt, an expiry or a refund settling."""
        times = [n.next_attempt_at for n in self.outbox if n.delivery is Delivery.PENDING]
        times += [t.time_expire for t in self.trades.values() if t.status is TradeStatus.WAITING]
        times += [
            r.settles_at for r in self.refunds.values() if r.status is RefundStatus.PROCESSING
        ]
        return min((t for t in times if t is not None), default=None)

    def _close(self, trade: Trade, when: datetime) -> None:
        trade.status, trade.closed_at = TradeStatus.CLOSED, when
        # Alipay notifies TRADE_CLOSED by default; a QR trade nobody scanned never existed.
        existed = trade.scanned or not self.config.alipay_trade_on_scan
        if trade.provider is Provider.ALIPAY and existed:
            self._enqueue(trade, "TRADE_CLOSED")

    def _settle(self, refund: Refund, when: datetime) -> None:
        refund.status, refund.succeeded_at = RefundStatus.SUCCESS, when
        trade = self.trades[refund.provider, refund.out_trade_no]
        if refund.provider is Provider.WECHATPAY:
            self._enqueue(trade, "REFUND.SUCCESS", refund=refund, url=refund.notify_url)
        else:  # Alipay: TRADE_CLOSED once fully refunded, TRADE_SUCCESS with refund_fee before
            event = "TRADE_CLOSED" if trade.fully_refunded else "TRADE_SUCCESS"
            self._enqueue(trade, event, refund=refund)

    def _enqueue(
        self,
        trade: Trade,
        event: str,
        *,
        refund: Refund | None = None,
        url: str | None = None,
        copies: int = 1,
        delay: float = 0.0,
        drop: bool = False,
    ) -> list[Notification]:
        target = trade.notify_url if url is None else url
        if not target:
            return []
        now = self.now()
        notify_id = _notify_id(trade.provider, now)
        queued = [
            Notification(
                seq=next(self._seq),
                provider=trade.provider,
                event=event,
                notify_id=notify_id,
                url=target,
                trade=dataclasses.replace(trade),
                refund=None if refund is None else dataclasses.replace(refund),
                created_at=now,
                next_attempt_at=None if drop else now + timedelta(seconds=delay),
                delivery=Delivery.DROPPED if drop else Delivery.PENDING,
            )
            for _ in range(max(1, copies))
        ]
        self.outbox.extend(queued)
        self.wake.set()
        return queued


def _digits(count: int) -> str:
    return f"{secrets.randbelow(10**count):0{count}d}"


def _trade_no(provider: Provider, now: datetime) -> str:
    day = now.astimezone(CST).strftime("%Y%m%d")
    if provider is Provider.ALIPAY:
        return f"{day}22001{_digits(15)}"
    return f"4200000{_digits(3)}{day}{_digits(10)}"


def _buyer_id(provider: Provider) -> str:
    if provider is Provider.ALIPAY:
        return "2088" + _digits(12)
    return "oSim" + secrets.token_urlsafe(18)[:24]


def _notify_id(provider: Provider, now: datetime) -> str:
    if provider is Provider.ALIPAY:
        return now.astimezone(CST).strftime("%Y%m%d") + "00222" + _digits(21)
    return str(uuid.uuid4())
