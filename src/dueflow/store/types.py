"""Column types that behave the same on SQLite, PostgreSQL and MySQL.

The migrations build their tables with these types too: what one makes in a database must
never change, or old revisions would make another schema than they did.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import BigInteger, Column, DateTime, Dialect, Integer, Numeric, String
from sqlalchemy.dialects import mysql
from sqlalchemy.types import TypeDecorator

CENT = Decimal("0.01")
#: The most a text column without a length holds on every backend: MySQL's TEXT, in bytes.
TEXT_BYTES = 65_535

# SQLite needs INTEGER PRIMARY KEY for rowid aliasing; elsewhere ids are 64-bit.
Id = BigInteger().with_variant(Integer(), "sqlite")


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC in Python; naive UTC (microseconds kept) in the database.

    Storing naive UTC keeps comparisons and indexes identical across backends: SQLite compares
    the ISO text, the others compare native timestamps.
    """

    impl = DateTime
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime(timezone=False))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("dueflow stores only timezone-aware datetimes")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        return _aware(value)

    def result_processor(self, dialect: Dialect, coltype: Any) -> Any:
        """:meth:`process_result_value` alone, in place of the wrapped type's processor and
        this one's: every driver here but SQLite's returns datetimes, and SQLite's ISO text is
        read by ``datetime.fromisoformat`` (C) rather than DateTime's regular expression. A
        herd's snapshots read twenty of these columns an order: the two calls and the regular
        expression were a tenth of the SQLite worker's time."""
        return _aware


def _aware(value: Any) -> datetime | None:
    """A stored UTC time (naive datetime, or SQLite's ISO text) as an aware datetime."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    aware: datetime = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return aware


class Money(TypeDecorator[Decimal]):
    """Yuan as an exact Decimal with two places: NUMERIC(12, 2) where the database has decimals,
    text on SQLite (whose NUMERIC would store a binary float)."""

    impl = Numeric(12, 2, asdecimal=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(String(16))
        return dialect.type_descriptor(Numeric(12, 2, asdecimal=True))

    def process_bind_param(self, value: Decimal | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        if not isinstance(value, Decimal):
            raise TypeError("money is bound as Decimal only")
        exact = value.quantize(CENT)
        if exact != value:
            raise ValueError(f"{value} has more than two decimals")
        return str(exact) if dialect.name == "sqlite" else exact

    def process_result_value(self, value: Any, dialect: Dialect) -> Decimal | None:
        if value is None:
            return None
        return Decimal(str(value)).quantize(CENT)


def fit(column: Column[Any], text: str | None) -> str | None:
    """``text`` cut to what ``column`` holds: a ``String(n)`` its first n characters, a text
    column without a length :data:`TEXT_BYTES` of UTF-8 (on a character boundary).

    SQLite keeps any length; PostgreSQL and MySQL refuse a longer value, which would fail the
    whole write it belongs to (a refund's final answer, say) over a message nobody reads whole.
    """
    if text is None:
        return None
    length = getattr(column.type, "length", None)
    if length is not None:
        return text[:length]
    if len(text) * 4 <= TEXT_BYTES:  # no UTF-8 character is longer than 4 bytes
        return text
    return text.encode("utf-8")[:TEXT_BYTES].decode("utf-8", errors="ignore")


#: Text of at most 255 characters compared byte for byte everywhere: MySQL's and MariaDB's usual
#: collations fold case (and accents), so ``abc`` and ``ABC`` would be one host's one user there
#: (a host's ids are its own and case matters in them).
ExactText = String(255).with_variant(
    mysql.VARCHAR(255, collation="utf8mb4_bin"), "mysql", "mariadb"
)
