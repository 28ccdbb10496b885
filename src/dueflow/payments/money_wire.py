"""Amounts on the wire, exactly: Alipay yuan strings and WeChat Pay integer fen.

Money is ``Decimal`` yuan inside dueflow. Alipay sends and takes yuan strings (``"2.00"``; a
``"10.0"`` equals ``"10.00"``), WeChat Pay integer fen (``amount.total``). Nothing here passes
through a float.

Each provider's range is checked before any arithmetic: WeChat Pay's amounts are an int32 of fen
(at most :data:`WECHAT_MAX_AMOUNT`), Alipay's at most :data:`ALIPAY_MAX_AMOUNT`. A value outside
it is refused like any other malformed field, never left to overflow the decimal context.
"""

from __future__ import annotations

import re
from decimal import Decimal

from dueflow.domain import money
from dueflow.exceptions import AmountMismatch, InvalidInput, MalformedNotification

_ALIPAY_AMOUNT = re.compile(r"[0-9]{1,9}(\.[0-9]{1,2})?")

#: WeChat Pay's ``amount`` fields are an int32 of fen.
WECHAT_MAX_FEN = 2**31 - 1
#: The most one WeChat Pay trade or refund can carry, in yuan: 21,474,836.47.
WECHAT_MAX_AMOUNT = money.from_fen(WECHAT_MAX_FEN)
#: The most one Alipay trade can carry, in yuan (``total_amount`` is [0.01, 100000000]).
ALIPAY_MAX_AMOUNT = Decimal("100000000.00")


def alipay_amount(amount: Decimal) -> str:
    """An amount as Alipay takes it: yuan with two decimals (``Decimal("12.5")`` -> ``"12.50"``).

    Raises:
        InvalidInput: The amount is not positive, above :data:`ALIPAY_MAX_AMOUNT` or has
            fractions of a fen.
    """
    exact = money.parse_yuan(amount)
    if exact > ALIPAY_MAX_AMOUNT:
        raise InvalidInput(f"Alipay takes at most {ALIPAY_MAX_AMOUNT} yuan, not {amount}")
    return str(exact)


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
        raise MalformedNotification(f"not an Alipay amount: {_shown(text)}")
    try:
        amount = money.parse_yuan(text)
    except InvalidInput as exc:
        raise MalformedNotification(f"not an Alipay amount: {exc.message}") from None
    if amount > ALIPAY_MAX_AMOUNT:
        raise MalformedNotification(f"Alipay amount {text} is above {ALIPAY_MAX_AMOUNT}")
    return amount


def wechat_total(amount: Decimal) -> int:
    """An amount as WeChat Pay takes it: integer fen (``Decimal("12.50")`` -> ``1250``).

    Raises:
        InvalidInput: The amount is not positive, above :data:`WECHAT_MAX_AMOUNT` or has
            fractions of a fen.
    """
    fen = money.to_fen(money.parse_yuan(amount))
    if fen > WECHAT_MAX_FEN:
        raise InvalidInput(f"WeChat Pay takes at most {WECHAT_MAX_AMOUNT} yuan, not {amount}")
    return fen


def parse_wechat_total(total: object) -> Decimal:
    """The yuan amount of a WeChat Pay amount field such as ``amount.total`` (integer fen).

    Raises:
        MalformedNotification: Not a JSON integer (floats, strings and booleans are refused),
            or not between 1 and :data:`WECHAT_MAX_FEN`.
    """
    if isinstance(total, bool) or not isinstance(total, int):
        raise MalformedNotification(f"amount.total is not an integer: {_shown(total)}")
    # The range before any arithmetic: 10**30 fen would overflow the decimal context.
    if not 0 < total <= WECHAT_MAX_FEN:
        raise MalformedNotification(
            f"amount.total {_shown(total)} is not between 1 and {WECHAT_MAX_FEN} fen"
        )
    return money.from_fen(total)


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


def _shown(value: object) -> str:
    """A received value as an error message may quote it: short, whatever its size."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return "(a number of over 30 digits)"  # str() of a huge int is slow, or refused
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}..."
