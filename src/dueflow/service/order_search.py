"""Finding orders, for operators (``/admin/orders`` and its CSV): every order, newest first,
kept to filters and a search, in cursor pages (:mod:`dueflow.service.lists`'s cursor, bound to
the filters it was made for), or all of them as CSV.

The filters come as the page's query parameters, as text: ``status``, ``flow``, ``buyer`` and
``seller`` (a user's id, or a name), ``from`` and ``to`` (a day, ``2026-03-01``, in UTC: ``to``
takes in the whole day; or a time with its offset: ``to`` is then the first instant left out),
and ``q``, one search box: an order id (``#`` allowed), a payment number (pay_no), a refund
number (refund_no) or a ticket code, whichever it is.
"""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import Row

from dueflow.domain import lifecycle, times
from dueflow.domain.lifecycle import OrderStatus
from dueflow.exceptions import InvalidInput
from dueflow.service import lists
from dueflow.service.deps import Deps
from dueflow.store import order_search
from dueflow.store.order_search import OrderFilter, Person

#: The query parameters that filter the list (the cursor and the page size are not filters).
FILTERS = ("status", "flow", "buyer", "seller", "from", "to", "q")
#: Rows per CSV page read (each page its own short read transaction).
CSV_PAGE = 1000
#: The CSV's columns, in order.
CSV_HEADER = (
    "order_id",
    "status",
    "flow",
    "order_type",
    "amount",
    "placed_at",
    "buyer_id",
    "buyer",
    "seller_id",
    "seller",
)
_STATUSES = tuple(s.value for s in OrderStatus)
#: The longest search text worth looking up (a refund_no, the longest of the four, is 40).
_MAX_SEARCH = 64


def order_filter(params: Mapping[str, str]) -> OrderFilter:
    """The filter the query parameters ``params`` describe (blank ones keep nothing out).

    Raises:
        InvalidInput: an unknown status or flow, a day or time that is none, a search too long.
    """
    given = {name: params.get(name, "").strip() for name in FILTERS}
    status, flow = given["status"] or None, given["flow"] or None
    if status is not None and status not in _STATUSES:
        raise InvalidInput(
            f"status: unknown status {status!r} (known: {', '.join(_STATUSES)})", field="status"
        )
    if flow is not None and flow not in lifecycle.LIFECYCLES:
        known = ", ".join(sorted(lifecycle.LIFECYCLES))
        raise InvalidInput(f"flow: unknown flow {flow!r} (known: {known})", field="flow")
    if len(given["q"]) > _MAX_SEARCH:
        raise InvalidInput(f"q: at most {_MAX_SEARCH} characters", field="q")
    return OrderFilter(
        status=status,
        flow=flow,
        buyer=_person(given["buyer"]),
        seller=_person(given["seller"]),
        placed_from=_instant(given["from"], "from", end_of_day=False),
        placed_before=_instant(given["to"], "to", end_of_day=True),
        search=given["q"] or None,
    )


def _person(value: str) -> Person | None:
    """A user's id (digits) or name; None when blank."""
    if not value:
        return None
    if value.isascii() and value.isdigit():
        return int(value) if int(value) <= lists.MAX_ID else value
    return value


def _instant(value: str, name: str, *, end_of_day: bool) -> datetime | None:
    """A day (its start, or with ``end_of_day`` the next day's start) or a time, in UTC."""
    if not value:
        return None
    try:
        if len(value) == len("2026-03-01"):
            day = date.fromisoformat(value)
            start = datetime(day.year, day.month, day.day, tzinfo=UTC)
            return start + timedelta(days=1) if end_of_day else start
        return times.parse(value)
    except (ValueError, OverflowError) as exc:
        raise InvalidInput(
            f"{name}: a day like 2026-03-01 or a time like {times.EXAMPLE} ({exc})", field=name
        ) from None


def _scope(kept: OrderFilter) -> lists.Scope:
    """The filter as a cursor's scope (JSON values only)."""
    scope: dict[str, str | int | None] = {"list": "admin_orders"}
    for name, value in asdict(kept).items():
        scope[name] = value.isoformat() if isinstance(value, datetime) else value
    return scope


async def orders_page(
    deps: Deps, kept: OrderFilter, *, after: str | None, limit: int
) -> lists.Page:
    """A page of the orders ``kept`` keeps, newest first, each with its buyer's and seller's
    names (one statement).

    Raises:
        InvalidInput: a bad cursor (or one made for other filters) or limit.
    """
    scope = _scope(kept)
    position = lists.read_cursor(after, scope)
    if not 1 <= limit <= lists.MAX_LIMIT:
        raise InvalidInput(f"limit: from 1 to {lists.MAX_LIMIT}", field="limit")
    async with deps.db.read() as conn:
        rows = await order_search.orders_page(conn, kept, after=position, limit=limit)
    items = [dict(row._mapping) for row in rows[:limit]]
    more = len(rows) > limit
    return lists.Page(items, lists.make_cursor(items[-1]["id"], scope) if more else None)


async def orders_csv(deps: Deps, kept: OrderFilter) -> AsyncIterator[str]:
    """Every order ``kept`` keeps as CSV text, newest first: the header, then a chunk per page
    of :data:`CSV_PAGE` rows (one statement each, in a read transaction of its own, so a long
    export holds no transaction open; orders placed meanwhile come before the first page and
    are left out, as in a walk through the pages)."""
    yield _csv_lines([CSV_HEADER])
    after: int | None = None
    while True:
        async with deps.db.read() as conn:
            rows = await order_search.orders_page(conn, kept, after=after, limit=CSV_PAGE)
        page = rows[:CSV_PAGE]
        if page:
            yield _csv_lines([_csv_row(row) for row in page])
        if len(rows) <= CSV_PAGE:
            return
        after = page[-1].id


def _csv_row(row: Row[Any]) -> tuple[object, ...]:
    return (
        row.id,
        row.status,
        row.flow,
        row.order_type,
        row.amount,
        row.created_at.isoformat(),
        row.buyer_id,
        _cell(row.buyer),
        row.seller_id,
        _cell(row.seller),
    )


def _cell(name: str) -> str:
    """A name as a CSV cell a spreadsheet shows as text: one starting like a formula (``=``,
    ``+``, ``-``, ``@``) is quoted with a leading apostrophe, so opening the export runs
    nothing a user chose as their name."""
    return f"'{name}" if name[:1] in ("=", "+", "-", "@", "\t", "\r") else name


def _csv_lines(rows: list[tuple[object, ...]]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\r\n").writerows(rows)
    return out.getvalue()
