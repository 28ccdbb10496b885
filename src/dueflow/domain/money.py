"""Money: Decimal yuan, converted to fen exactly."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from dueflow.exceptions import InvalidInput

MAX_AMOUNT = Decimal("100000000.00")
CENT = Decimal("0.01")
#: Plain decimal notation: no sign, exponent, underscores or spaces inside (``Decimal`` takes
#: ``"1e2"`` and ``"1_000"``; an amount must read as what it is).
DECIMAL_TEXT = re.compile(r"[0-9]+(\.[0-9]+)?")


def parse_yuan(value: object, *, field: str | None = None) -> Decimal:
    """A positive amount in yuan with at most two decimals (``"12.5"`` -> ``Decimal("12.50")``).

    Floats are refused: money never passes through binary floating point.

    Raises:
        InvalidInput: (naming ``field``, the input it came from) Not such an amount (a float, another notation, not above zero, above
            :data:`MAX_AMOUNT` or with fractions of a fen).
    """
    if isinstance(value, (bool, float)):
        raise InvalidInput("amounts are given as strings or integers, never floats", field=field)
    if isinstance(value, int) and abs(value) > MAX_AMOUNT:
        # Before str(): an int of over 4300 digits cannot even be written out.
        raise InvalidInput(f"an amount must be above 0 and at most {MAX_AMOUNT}", field=field)
    text = str(value).strip()
    if not DECIMAL_TEXT.fullmatch(text):
        raise InvalidInput(f"not an amount: {value!r} (write it like 12.50)", field=field)
    try:
        amount = Decimal(text)
    except (InvalidOperation, ValueError):
        raise InvalidInput(f"not an amount: {value!r}", field=field) from None
    if not amount.is_finite():
        raise InvalidInput(f"not an amount: {value!r}", field=field)
    # The range first: quantizing a huge amount overflows the decimal context.
    if amount <= 0 or amount > MAX_AMOUNT:
        raise InvalidInput(f"amount {value} must be above 0 and at most {MAX_AMOUNT}", field=field)
    if amount != amount.quantize(CENT):
        raise InvalidInput(f"amount {value} has more than two decimals", field=field)
    return amount.quantize(CENT)


def to_fen(amount: Decimal) -> int:
    """Yuan to fen, exactly; refuses fractions of a fen."""
    fen = amount * 100
    if fen != fen.to_integral_value():
        raise InvalidInput(f"amount {amount} is not a whole number of fen")
    return int(fen)


def from_fen(fen: int) -> Decimal:
    """Fen to yuan."""
    return (Decimal(fen) / 100).quantize(CENT)
