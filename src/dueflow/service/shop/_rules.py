"""The shop's limits and the checks of what sellers and buyers type in."""

from __future__ import annotations

from decimal import Decimal

from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain import text
from dueflow.domain.lifecycle import OrderStatus
from dueflow.domain.money import parse_yuan
from dueflow.exceptions import (
    InvalidInput,
    NotFound,
)
from dueflow.store import users

S = OrderStatus


SHOP_ORDER_TYPE = "shop"


FLASH_ORDER_TYPE = "flash"


MAX_LINES = 50


MAX_QUANTITY = 10_000


MAX_UNITS = 10_000_000


def _title(value: str) -> str:
    if not isinstance(value, str):
        raise InvalidInput("a title is text", field="title")
    title = value.strip()
    if not 1 <= len(title) <= 200:
        raise InvalidInput("a title is 1-200 characters", field="title")
    # The one rule of free text (dueflow.domain.text): emoji joiners, right-to-left marks and
    # no-break spaces are text people write, though str.isprintable() refuses them.
    problem = text.refused_character(title)
    if problem is not None:
        raise InvalidInput(f"the title {problem}", field="title")
    return title


def _count(value: object, what: str, *, low: int, high: int, field: str | None = None) -> int:
    """``value`` when a whole number from ``low`` to ``high``; else InvalidInput naming
    ``field`` (by default ``what``)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"{what} is a whole number from {low} to {high}", field=field or what)
    return value


def _zero_or_yuan(value: object, what: str) -> Decimal:
    """An amount that may also be zero (a coupon without a minimum)."""
    if (
        isinstance(value, str | int)
        and not isinstance(value, bool)
        and str(value).strip()
        in (
            "0",
            "0.0",
            "0.00",
        )
    ):
        return Decimal("0.00")
    try:
        return parse_yuan(value)
    except InvalidInput as exc:
        raise InvalidInput(f"{what}: {exc.message}", field=what) from None


async def _user(conn: AsyncConnection, user_id: int) -> None:
    if await users.by_id(conn, user_id) is None:
        raise NotFound(f"no user {user_id}")
