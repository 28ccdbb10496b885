"""The simulated Alipay's fields: answer codes (business failure, missing and invalid
arguments, no such trade), a trade's buyer and payment fields, amounts and Beijing times.

Private to :mod:`dueflow.payments.simulator.alipay`, which answers with them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from dueflow.payments.simulator.state import CST, Trade

Content = dict[str, Any]


def buyer(trade: Trade, *, query: bool = False) -> dict[str, str]:
    """The buyer's id and masked logon, once someone scanned."""
    if not trade.buyer_id:
        return {}
    logon = f"sim***@{trade.buyer_id[-4:]}.example.com"
    return {"buyer_user_id" if query else "buyer_id": trade.buyer_id, "buyer_logon_id": logon}


def paid_fields(trade: Trade, *, query: bool = False) -> Content:
    """Payment fields: a query answers ``fund_bill_list`` as an array, a notification as text."""
    if trade.paid_at is None:
        return {}
    total = amount(trade.amount)
    bills: Any = [{"amount": total, "fund_channel": "ALIPAYACCOUNT"}]
    if not query:
        bills = json.dumps([{"amount": total, "fundChannel": "ALIPAYACCOUNT"}])
    return {
        "send_pay_date" if query else "gmt_payment": beijing_time(trade.paid_at),
        "buyer_pay_amount": total,
        "receipt_amount": total,
        "invoice_amount": total,
        "point_amount": "0.00",
        "fund_bill_list": bills,
    }


def failure(sub_code: str, sub_msg: str) -> Content:
    """A business failure (``40004``)."""
    return {"code": "40004", "msg": "Business Failed", "sub_code": sub_code, "sub_msg": sub_msg}


def not_exist() -> Content:
    """``ACQ.TRADE_NOT_EXIST``."""
    return failure("ACQ.TRADE_NOT_EXIST", "交易不存在")


def missing(sub_code: str, sub_msg: str) -> Content:
    """A required argument missing (``40001``)."""
    return {
        "code": "40001",
        "msg": "Missing Required Arguments",
        "sub_code": sub_code,
        "sub_msg": sub_msg,
    }


def invalid(sub_code: str, sub_msg: str) -> Content:
    """An invalid argument (``40002``)."""
    return {"code": "40002", "msg": "Invalid Arguments", "sub_code": sub_code, "sub_msg": sub_msg}


def text(biz: Mapping[str, Any], name: str) -> str:
    """A text field, or empty."""
    value = biz.get(name)
    return value if isinstance(value, str) else ""


def amount(amount: Decimal) -> str:
    """Yuan with two decimals."""
    return str(amount.quantize(Decimal("0.01")))


def beijing_time(when: datetime, *, millis: bool = False) -> str:
    """``yyyy-MM-dd HH:mm:ss`` (``.SSS`` with ``millis``) in Beijing time."""
    local = when.astimezone(CST)
    text = local.strftime("%Y-%m-%d %H:%M:%S")
    return f"{text}.{local.microsecond // 1000:03d}" if millis else text
