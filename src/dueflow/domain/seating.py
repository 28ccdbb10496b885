"""Seat maps: seat labels (``A-12``, ``B-3-7``), the compact form the CLI takes
(``A:1-20,B:1-20``) and the rules a show's seats keep."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from dueflow.exceptions import InvalidInput, SeatLimitExceeded

#: A label: a section, an optional row, a seat number: ``A-12``, ``Stalls-C-7``.
LABEL = re.compile(
    r"^(?P<section>[A-Za-z][A-Za-z0-9]{0,7})(?:-(?P<row>[A-Za-z0-9]{1,8}))?-(?P<number>[1-9][0-9]{0,3})$"
)
#: Seats one show may have (a seat map is read whole).
MAX_SEATS = 5000
#: The per-buyer limit is at most this many seats (and at least one).
MAX_SEAT_LIMIT = 50
DEFAULT_SEAT_LIMIT = 4
_RANGE = re.compile(
    r"^(?P<section>[A-Za-z][A-Za-z0-9]{0,7}):(?P<first>[1-9][0-9]{0,3})-(?P<last>[1-9][0-9]{0,3})$"
)


@dataclass(frozen=True)
class SeatSpec:
    """One seat as the organizer declares it."""

    label: str
    section: str
    row: str | None
    number: int
    tier: str
    price: Decimal


def parse_label(label: str) -> tuple[str, str | None, int]:
    """(section, row, number) of a label.

    Raises:
        InvalidInput: not a seat label.
    """
    match = LABEL.match(label) if isinstance(label, str) else None
    if match is None:
        raise InvalidInput(
            f"not a seat label: {label!r} (a section, an optional row and a number: A-12, A-C-7)"
        )
    return match["section"], match["row"], int(match["number"])


def seat(label: str, price: Decimal, tier: str | None = None) -> SeatSpec:
    """A seat from its label; its tier is its section unless given."""
    section, row, number = parse_label(label)
    return SeatSpec(label, section, row, number, tier or section, price)


def parse_ranges(
    spec: str,
    prices: Mapping[str, Decimal],
    *,
    give_price: str = "give --price {section}=...",
) -> list[SeatSpec]:
    """Seats from the compact form ``A:1-20,B:1-20`` (section, first and last number), priced
    by section (``prices["A"]``). ``give_price`` says how to price a section that has none
    (the CLI's option by default; ``{section}`` is replaced by the section).

    Raises:
        InvalidInput: a part is not ``SECTION:FIRST-LAST``, a range runs backwards, a section
            has no price, the ranges hold more than :data:`MAX_SEATS` seats (counted before
            any is made).
    """
    ranges: list[tuple[str, int, int]] = []
    count = 0
    for part in (p.strip() for p in spec.split(",")):
        match = _RANGE.match(part)
        if match is None:
            raise InvalidInput(f"not a seat range: {part!r} (use SECTION:FIRST-LAST, like A:1-20)")
        section, first, last = match["section"], int(match["first"]), int(match["last"])
        if last < first:
            raise InvalidInput(f"seat range {part!r} runs backwards")
        if section not in prices:
            hint = give_price.format(section=section)
            raise InvalidInput(f"section {section} has no price ({hint})")
        count += last - first + 1
        if count > MAX_SEATS:
            raise InvalidInput(f"a show has 1 to {MAX_SEATS} seats: these ranges hold more")
        ranges.append((section, first, last))
    return [
        seat(f"{section}-{n}", prices[section])
        for section, first, last in ranges
        for n in range(first, last + 1)
    ]


def check_seats(seats: Sequence[SeatSpec]) -> None:
    """A show's seats: 1 to :data:`MAX_SEATS`, labels unique, prices positive.

    Raises:
        InvalidInput: naming the seat or the rule.
    """
    if not 1 <= len(seats) <= MAX_SEATS:
        raise InvalidInput(f"a show has 1 to {MAX_SEATS} seats, not {len(seats)}")
    seen: set[str] = set()
    for spec in seats:
        if spec.label in seen:
            raise InvalidInput(f"seat {spec.label} is listed twice")
        seen.add(spec.label)
        if spec.price <= 0:
            raise InvalidInput(f"seat {spec.label}: a price is positive")


def check_request(labels: Sequence[str], limit: int) -> list[str]:
    """The seats a buyer asks for: 1 to ``limit`` distinct labels.

    Raises:
        InvalidInput: none, a repeat, or a label that is not one.
        SeatLimitExceeded: more than the show's per-buyer limit in one order.
    """
    if not labels:
        raise InvalidInput("name at least one seat")
    for label in labels:
        parse_label(label)
    if len(set(labels)) != len(labels):
        raise InvalidInput("a seat is named twice")
    if len(labels) > limit:
        raise SeatLimitExceeded(
            f"this show allows {limit} seats a buyer; you asked for {len(labels)}"
        )
    return list(labels)
