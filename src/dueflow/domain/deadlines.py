"""Deadline policy: how long each stage of an order may last.

Each stage's deadline counts from the event that opened it: the pay deadline from placing, the
ship deadline from ``paid_at``, the receive deadline from ``shipped_at``, the review deadline
from ``received_at``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta

from dueflow.exceptions import ConfigError, InvalidInput

# No stage lasts longer: deadlines stay far from the end of the calendar.
MAX_DURATION = timedelta(days=3650)
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")


def parse_duration(text: str | int | float | timedelta) -> timedelta:
    """Parse ``"30m"``, ``"10s"``, ``"3d"``, ``"1h30m"``, ``"250ms"`` or plain seconds.

    Raises:
        ConfigError: the text is not a duration (``"3x"``) or is negative.
    """
    if isinstance(text, timedelta):
        seconds = text.total_seconds()
    elif isinstance(text, int | float) and not isinstance(text, bool):
        try:
            seconds = float(text)
        except OverflowError:  # an int past float's range (not even repr() of it is safe)
            raise ConfigError(f"a duration is at most {MAX_DURATION.days} days") from None
    else:
        raw = str(text).strip().lower().replace(" ", "")
        if re.fullmatch(r"\d+(\.\d+)?", raw):
            seconds = float(raw)
        else:
            pos, seconds = 0, 0.0
            for match in _PART.finditer(raw):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _UNITS[match.group(2)]
                pos = match.end()
            if pos != len(raw) or not raw:
                raise ConfigError(
                    f"not a duration: {text!r} (use a number with s, m, h, d or w, like 30m or 3d)"
                )
    if seconds < 0:
        raise ConfigError(f"a duration cannot be negative: {text!r}")
    if seconds > MAX_DURATION.total_seconds():  # also refuses NaN-free overflow further down
        raise ConfigError(f"a duration is at most {MAX_DURATION.days} days: {text!r}")
    try:
        return timedelta(seconds=seconds)
    except (OverflowError, ValueError):  # too large for a timedelta, or NaN
        raise ConfigError(f"not a duration: {text!r} (out of range)") from None


def format_duration(delta: timedelta) -> str:
    """A short human form: ``1d2h``, ``30m``, ``45s``."""
    seconds = int(delta.total_seconds())
    if seconds == 0:
        return "0s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


@dataclass(frozen=True)
class StageDurations:
    """How long each stage may last; ``reminder`` is when an unpaid buyer is reminded."""

    reminder: timedelta
    pay: timedelta
    ship: timedelta
    receive: timedelta
    review: timedelta

    def override(self, changes: Mapping[str, str | timedelta]) -> StageDurations:
        """A copy with some durations replaced (keys: reminder, pay, ship, receive, review)."""
        names = {f.name for f in fields(self)}
        parsed: dict[str, timedelta] = {}
        for key, value in changes.items():
            name = key.removesuffix("_timeout").removesuffix("_after")
            if name not in names:
                raise ConfigError(f"unknown stage {key!r}; expected one of {sorted(names)}")
            parsed[name] = parse_duration(value)
        result = replace(self, **parsed)
        if result.pay <= timedelta(0):
            raise ConfigError("the pay timeout must be positive")
        return result


PROFILES: Mapping[str, StageDurations] = {
    "prod": StageDurations(
        reminder=timedelta(minutes=5),
        pay=timedelta(minutes=30),
        ship=timedelta(days=3),
        receive=timedelta(days=10),
        review=timedelta(days=15),
    ),
    "dev": StageDurations(
        reminder=timedelta(seconds=30),
        pay=timedelta(seconds=60),
        ship=timedelta(minutes=2),
        receive=timedelta(minutes=3),
        review=timedelta(minutes=3),
    ),
}

DEFAULT_ORDER_TYPE = "normal"


@dataclass(frozen=True)
class DeadlinePolicy:
    """Stage durations per order type."""

    by_type: Mapping[str, StageDurations]

    def durations(self, order_type: str) -> StageDurations:
        """The durations for ``order_type``."""
        try:
            return self.by_type[order_type]
        except KeyError:
            known = ", ".join(sorted(self.by_type))
            raise InvalidInput(f"unknown order type {order_type!r}; known: {known}") from None

    def pay_deadline(self, order_type: str, placed_at: datetime) -> datetime:
        """When an order placed at ``placed_at`` must be paid."""
        return placed_at + self.durations(order_type).pay

    def reminder_at(self, order_type: str, placed_at: datetime) -> datetime | None:
        """When to remind the buyer to pay, or None when the reminder would come too late."""
        durations = self.durations(order_type)
        if durations.reminder <= timedelta(0) or durations.reminder >= durations.pay:
            return None
        return placed_at + durations.reminder

    def ship_deadline(self, order_type: str, paid_at: datetime) -> datetime:
        """When an order paid at ``paid_at`` must be shipped."""
        return paid_at + self.durations(order_type).ship

    def receive_deadline(self, order_type: str, shipped_at: datetime) -> datetime:
        """When receipt of an order shipped at ``shipped_at`` is confirmed automatically."""
        return shipped_at + self.durations(order_type).receive

    def review_deadline(self, order_type: str, received_at: datetime) -> datetime:
        """When default reviews are written for an order received at ``received_at``."""
        return received_at + self.durations(order_type).review
