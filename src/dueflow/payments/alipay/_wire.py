"""Alipay's wire: Beijing-time timestamps, the answer codes, a failed call, an answer's
description, a notification's form body and what a notification reports.

Private to :mod:`dueflow.payments.alipay.provider`, which re-exports its public constants.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import parse_qsl

from dueflow.exceptions import MalformedNotification
from dueflow.payments import money_wire
from dueflow.payments.base import (
    NotificationEvent,
    ProviderNotification,
    RefundOutcome,
    RefundResult,
)

BEIJING = timezone(timedelta(hours=8), "CST")
"""Alipay's timestamps and ``time_expire`` are Beijing time."""
MAX_NOTIFICATION_BYTES = 64 * 1024
SUCCESS_CODE = "10000"
PAID_STATUSES = frozenset({"TRADE_SUCCESS", "TRADE_FINISHED"})
DEFINITE_REFUND_FAILURES = frozenset(
    {
        "ACQ.TRADE_HAS_FINISHED",
        "ACQ.REFUND_AMT_NOT_EQUAL_TOTAL",
        "ACQ.SELLER_BALANCE_NOT_ENOUGH",
        "ACQ.REASON_TRADE_REFUND_FEE_ERR",
        "ACQ.TRADE_NOT_EXIST",
    }
)
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


class CallFailed(Exception):
    """No trustworthy answer: transport trouble, a non-200 status or a bad signature.

    ``answered``: something did answer (the call is over and can take no effect later)."""

    def __init__(self, reason: str, *, answered: bool = False) -> None:
        self.reason = reason
        self.answered = answered
        super().__init__(reason)


def beijing(when: datetime) -> str:
    """``yyyy-MM-dd HH:mm:ss`` in Beijing time."""
    return when.astimezone(BEIJING).strftime(TIME_FORMAT)


def describe(content: Mapping[str, Any]) -> str:
    parts = (content.get(k) for k in ("code", "msg", "sub_code", "sub_msg"))
    return " ".join(str(p) for p in parts if p) or "no code"


def parse_form(body: bytes) -> dict[str, str]:
    """The URL-decoded form parameters; a repeated key is refused (which one was signed?)."""
    if len(body) > MAX_NOTIFICATION_BYTES:
        raise MalformedNotification(f"the notification is over {MAX_NOTIFICATION_BYTES} bytes")
    try:
        text = body.decode("utf-8")
        pairs = parse_qsl(text, keep_blank_values=True, errors="strict")
    except ValueError as exc:
        raise MalformedNotification(f"the notification is not UTF-8 form data: {exc}") from None
    params: dict[str, str] = {}
    for key, value in pairs:
        if key in params:
            raise MalformedNotification(f"the notification repeats {key!r}")
        params[key] = value
    if not params:
        raise MalformedNotification("the notification is empty")
    return params


def notification(params: Mapping[str, str]) -> ProviderNotification:
    """What a verified notification for this merchant reports: a refund, a payment, a close.

    Raises:
        MalformedNotification: No ``out_trade_no``, or an unreadable amount.
    """
    pay_no = params.get("out_trade_no", "")
    if not pay_no:
        raise MalformedNotification("the notification has no out_trade_no")
    amount = money_wire.parse_alipay_amount(params.get("total_amount"))
    status = params.get("trade_status", "")
    trade_no = params.get("trade_no") or None
    refund_no = params.get("out_biz_no") or None
    if refund_no is not None or params.get("refund_fee"):
        # A refund: TRADE_CLOSED once fully refunded, TRADE_SUCCESS after a partial one.
        return ProviderNotification(
            NotificationEvent.REFUND,
            pay_no,
            amount=amount,
            provider_trade_no=trade_no,
            refund_no=refund_no,
            refund=RefundOutcome(RefundResult.SUCCEEDED, params.get("refund_fee", "")),
            state=status,
        )
    if status in PAID_STATUSES:
        event = NotificationEvent.PAID
    elif status == "TRADE_CLOSED":
        event = NotificationEvent.CLOSED
    else:
        event = NotificationEvent.OTHER
    return ProviderNotification(
        event, pay_no, amount=amount, provider_trade_no=trade_no, state=status
    )
