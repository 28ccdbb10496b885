"""Amounts on the wire, exactly: Alipay yuan strings and WeChat Pay integer fen.

Money is ``Decimal`` yuan inside dueflow. Alipay sends and takes yuan strings (``"2.00"``; a
``"10.0"`` equals ``"10.00"``), WeChat Pay integer fen (``amount.total``). Nothing here passes
through a float.
"""

from __future__ import annotations

import re
from decimal import Decimal

from dueflow.domain import money
from dueflow.exceptions import AmountMismatch, InvalidInput, MalformedNotification

_ALIPAY_AMOUNT = re.compile(r"[0-9]{1,9}(\.[0-9]{1,2})?")


def alipay_amount(amount: Decimal) -> str:
    """An amount as Alipay takes it: yuan with two decimals (``Decimal("12.5")`` -> ``"12.50"``).

    Raises:
        InvalidInput: The amount is not positive, too large or has fractions of a fen.
    """
    return str(money.parse_yuan(amount))


def parse_alipay_amount(text: object) -> Decimal:
    """A positive yuan amount from an Alipay field such as ``total_amount``.

    Args:
        text: The field as received: digits with at most two decimals, e.g. ``"10.0"``.

    Returns:
        The amount, quantized to the fen (``"10.0"`` -> ``Decimal("10.00")``).

    Raises:
        MalformedNotification: Not such a string, or not above zero.
    """
    if not isinstance(text, str) or not _ALIPAY_AMOUNT.fullmatch(text):
        raise MalformedNotification(f"not an Alipay amount: {text!r}")
    try:
        return money.parse_yuan(text)
    except InvalidInput as exc:
        raise MalformedNotification(f"not an Alipay amount: {exc.message}") from None


def wechat_total(amount: Decimal) -> int:
    """An amount as WeChat Pay takes it: integer fen (``Decimal("12.50")`` -> ``1250``).

    Raises:
        InvalidInput: The amount is not positive, too large or has fractions of a fen.
    """
    return money.to_fen(money.parse_yuan(amount))


def parse_wechat_total(total: object) -> Decimal:
    """The yuan amount of a WeChat Pay ``amount.total`` (integer fen).

    Raises:
        MalformedNotification: Not a JSON integer (floats, strings and booleans are refused),
            or not above zero.
    """
    if isinstance(total, bool) or not isinstance(total, int):
        raise MalformedNotification(f"amount.total is not an integer: {total!r}")
    try:
        return money.parse_yuan(money.from_fen(total))
    except InvalidInput as exc:
        raise MalformedNotification(f"bad amount.total: {exc.message}") from None


def check_alipay_amount(text: object, expected: Decimal) -> Decimal:
    """Require an Alipay amount field to equal what the payment owes, as decimals.

    Returns:
        The parsed amount.

    Raises:
        MalformedNotification: The field is not an amount.
        AmountMismatch: It differs from ``expected``.
    """
    amount = parse_alipay_amount(text)
    if amount != expected:
        raise AmountMismatch(f"notified {amount} yuan, the payment owes {expected}")
    return amount


def check_wechat_total(total: object, expected: Decimal) -> Decimal:
    """Require a WeChat Pay ``amount.total`` (fen) to equal what the payment owes, in fen.

    Returns:
        The amount in yuan.

    Raises:
        MalformedNotification: The field is not a positive integer.
        AmountMismatch: It differs from ``expected``.
    """
    amount = parse_wechat_total(total)
    if money.to_fen(amount) != money.to_fen(expected):
        raise AmountMismatch(f"notified {total} fen, the payment owes {money.to_fen(expected)}")
    return amount
