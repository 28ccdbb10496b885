"""Times given by people (a show's start, a sale's window, a coupon's validity): ISO 8601 with
their UTC offset, within what every database stores.

MariaDB's ``DATETIME`` holds 1000-01-01 to 9999-12-31 (UTC, as dueflow stores it); PostgreSQL
and SQLite hold more, but a time one database refuses is refused on all of them. A time near the
calendar's edges may not even convert to UTC in Python (``9999-12-31T23:59:59-12:00``), so the
range is checked on the aware time itself, before any conversion.
"""

from __future__ import annotations

from datetime import UTC, datetime

from dueflow.exceptions import InvalidInput

#: The earliest and the latest time dueflow stores (on every database).
EARLIEST = datetime(1000, 1, 1, tzinfo=UTC)
LATEST = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
#: How a time is written.
EXAMPLE = "2026-12-24T19:30:00+08:00"


def problem(when: datetime) -> str | None:
    """What makes ``when`` a time dueflow cannot store, or None when it can."""
    if when.tzinfo is None or when.utcoffset() is None:
        return f"give the offset, like {EXAMPLE}"
    # Aware datetimes compare without converting, so this cannot overflow.
    if not EARLIEST <= when <= LATEST:
        return (
            f"{when.isoformat()} is outside the times dueflow stores "
            f"({EARLIEST.isoformat()} to {LATEST.isoformat()})"
        )
    return None


def parse(value: object) -> datetime:
    """ISO 8601 text with its offset as the time in UTC.

    Raises:
        ValueError: not such text, no offset, or outside :data:`EARLIEST` to :data:`LATEST`
            (the message says which; the caller names the field).
    """
    if isinstance(value, datetime):
        when = value
    elif isinstance(value, str):
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"not an ISO 8601 time: {value!r} (write it like {EXAMPLE})") from None
    else:
        raise ValueError(f"a time is ISO 8601 text, like {EXAMPLE}")
    wrong = problem(when)
    if wrong is not None:
        raise ValueError(wrong)
    return when.astimezone(UTC)


def storable(when: datetime, what: str) -> datetime:
    """``when`` in UTC, for a use case that stores it as ``what``.

    Raises:
        InvalidInput: ``when`` has no offset or is outside :data:`EARLIEST` to :data:`LATEST`.
    """
    wrong = problem(when)
    if wrong is not None:
        raise InvalidInput(f"{what}: {wrong}", field=what)
    return when.astimezone(UTC)
