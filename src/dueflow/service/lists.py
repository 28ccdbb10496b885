"""The lists: goods on sale, a user's orders as buyer or seller, the catalogue (SKUs, shows,
flash sales, coupon templates), a user's coupons, the refunds and the users (for admins), and
who the caller is.

Every list is read in pages, newest first. A page ends with an opaque cursor: the last id it
showed and the filter it was made for, as URL-safe base64 of a small JSON object. The next page
is everything below that id under the same filter (keyset pagination, :mod:`dueflow.store.lists`),
so a walk from the first page to the last shows every row that existed when it began exactly
once, however many rows are inserted meanwhile (new rows have higher ids: they come before the
cursor, for the next walk). A cursor is a position, not a credential: a forged one only moves
the start of a page within what the caller may see anyway. One used with other filters than it
was made for is refused (:class:`~dueflow.exceptions.InvalidInput`), as is anything not a cursor.

Who sees what follows the single reads: the catalogue's ``GET /api/<kind>/{id}`` answers any
signed-in user, so its lists show every row to every signed-in user (filters narrow them, never
the caller); coupons are only ever the caller's own; refunds and users are for admins (the API
refuses anyone else before a list is read).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Row

from dueflow.domain import lifecycle
from dueflow.domain.lifecycle import OrderStatus
from dueflow.exceptions import InvalidInput
from dueflow.service import refunds, shop, tickets
from dueflow.service.accounts import User
from dueflow.service.deps import Deps
from dueflow.store import lists
from dueflow.store.lists import Party
from dueflow.store.shows import CANCELLED, ON_SALE

#: Rows per page unless asked otherwise, and the most a page may hold.
DEFAULT_LIMIT = 20
MAX_LIMIT = 100
#: Ids are positive 64-bit integers; a cursor naming anything else was not made here.
MAX_ID = 2**63 - 1

Scope = Mapping[str, str | int | bool | None]


@dataclass(frozen=True)
class Page:
    """One page of a list: its rows as plain dicts, and the cursor of the next page (None on
    the last)."""

    items: list[dict[str, Any]]
    next: str | None


def make_cursor(after: int, scope: Scope) -> str:
    """The cursor of the page after id ``after`` of the list ``scope`` describes."""
    raw = json.dumps({"after": after, "for": dict(scope)}, separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(raw.encode()).rstrip(b"=").decode()


def read_cursor(cursor: str | None, scope: Scope) -> int | None:
    """The id a page starts below (None for the first page).

    Raises:
        InvalidInput: ``cursor`` is not one a list gave, or was made for another ``scope``.
    """
    if cursor is None:
        return None
    found = _decoded(cursor)
    if not (isinstance(found, dict) and set(found) == {"after", "for"} and _is_id(found["after"])):
        raise InvalidInput("after: not a cursor this list gave", field="after")
    if found["for"] != dict(scope):
        raise InvalidInput(
            "after: the cursor was made for other filters; start again without it", field="after"
        )
    return int(found["after"])


def _decoded(cursor: str) -> Any:
    """The JSON inside ``cursor``, or None when it holds none."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        return json.loads(base64.b64decode(padded, altchars=b"-_", validate=True))
    except ValueError:  # binascii.Error, UnicodeDecodeError and JSONDecodeError are all one
        return None


def _is_id(value: Any) -> bool:
    return type(value) is int and 1 <= value <= MAX_ID


def _as_dict(row: Row[Any]) -> dict[str, Any]:
    return dict(row._mapping)


def _paged(
    rows: Sequence[Row[Any]],
    limit: int,
    scope: Scope,
    item: Callable[[Row[Any]], dict[str, Any]] = _as_dict,
) -> Page:
    """The first ``limit`` of ``rows`` (read one over, to know whether more follow), each as
    ``item`` makes it."""
    items = [item(row) for row in rows[:limit]]
    more = len(rows) > limit
    return Page(items, make_cursor(items[-1]["id"], scope) if more else None)


def _checked_limit(limit: int, most: int = MAX_LIMIT) -> int:
    if not 1 <= limit <= most:
        raise InvalidInput(f"limit: from 1 to {most}", field="limit")
    return limit


async def goods_list(
    deps: Deps, caller: User, *, seller_id: int | None, after: str | None, limit: int
) -> Page:
    """Goods on sale, newest first; with ``seller_id`` only that seller's. The caller's own
    goods are listed in every status (sold and off sale too), anyone else's only on sale.

    Raises:
        InvalidInput: a bad cursor or limit.
    """
    own = seller_id is not None and seller_id == caller.id
    scope: Scope = {"list": "goods", "seller_id": seller_id, "own": own}
    position = read_cursor(after, scope)
    async with deps.db.read() as conn:
        rows = await lists.goods_page(
            conn,
            seller_id=seller_id,
            on_sale_only=not own,
            after=position,
            limit=_checked_limit(limit),
        )
    return _paged(rows, limit, scope)


def _known_flow(flow: str | None) -> str | None:
    if flow is not None and flow not in lifecycle.LIFECYCLES:
        known = ", ".join(sorted(lifecycle.LIFECYCLES))
        raise InvalidInput(f"flow: unknown flow {flow!r} (known: {known})", field="flow")
    return flow


async def orders_list(
    deps: Deps,
    caller: User,
    *,
    role: Party,
    status: OrderStatus | None,
    flow: str | None,
    after: str | None,
    limit: int,
) -> Page:
    """The caller's orders as ``role`` (never anyone else's, admins included), newest first,
    optionally in one status and of one flow.

    Raises:
        InvalidInput: an unknown flow, a bad cursor or limit.
    """
    status_value = status.value if status is not None else None
    scope: Scope = {
        "list": "orders",
        "user": caller.id,
        "role": role,
        "status": status_value,
        "flow": _known_flow(flow),
    }
    position = read_cursor(after, scope)
    async with deps.db.read() as conn:
        rows = await lists.orders_page(
            conn,
            party=role,
            user_id=caller.id,
            status=status_value,
            flow=flow,
            after=position,
            limit=_checked_limit(limit),
        )
    return _paged(rows, limit, scope)


async def _catalogue(
    deps: Deps,
    kind: str,
    equal: dict[str, int | str | None],
    after: str | None,
    limit: int,
    item: Callable[[Row[Any]], dict[str, Any]] = _as_dict,
) -> Page:
    """A page of the catalogue list ``kind`` (:data:`dueflow.store.lists.CATALOGUE`), the
    same for every caller; its cursor is bound to ``equal``."""
    scope: Scope = {"list": kind, **equal}
    position = read_cursor(after, scope)
    async with deps.db.read() as conn:
        rows = await lists.catalogue_page(
            conn, kind, equal=equal, after=position, limit=_checked_limit(limit)
        )
    return _paged(rows, limit, scope, item)


async def skus_list(deps: Deps, *, seller_id: int | None, after: str | None, limit: int) -> Page:
    """SKUs, newest first, optionally one seller's (each as ``GET /api/skus/{id}`` shows it).

    Raises:
        InvalidInput: a bad cursor or limit.
    """
    return await _catalogue(deps, "skus", {"seller_id": seller_id}, after, limit)


#: The statuses a show is stored in (``sales`` is worked out from them and the clock).
SHOW_STATUSES = (ON_SALE, CANCELLED)


async def shows_list(
    deps: Deps, *, organizer_id: int | None, status: str | None, after: str | None, limit: int
) -> Page:
    """Shows, newest first, optionally one organizer's and in one status (``on_sale`` or
    ``cancelled``); each as ``GET /api/shows/{id}`` shows it but for its seat counts (that
    read counts every seat of the show).

    Raises:
        InvalidInput: an unknown status, a bad cursor or limit.
    """
    if status is not None and status not in SHOW_STATUSES:
        raise InvalidInput(
            f"status: unknown show status {status!r} (known: on_sale, cancelled)", field="status"
        )
    now = deps.clock.now()

    def item(row: Row[Any]) -> dict[str, Any]:
        return {**row._mapping, "sales": tickets.sales(row, now)}

    equal: dict[str, int | str | None] = {"organizer_id": organizer_id, "status": status}
    return await _catalogue(deps, "shows", equal, after, limit, item)


async def flash_sales_list(
    deps: Deps, *, seller_id: int | None, sku_id: int | None, after: str | None, limit: int
) -> Page:
    """Flash sales, newest first (over, running and to come), optionally one seller's and of
    one SKU.

    Raises:
        InvalidInput: a bad cursor or limit.
    """
    equal: dict[str, int | str | None] = {"sku_id": sku_id, "seller_id": seller_id}
    return await _catalogue(deps, "flash_sales", equal, after, limit)


async def templates_list(
    deps: Deps, *, seller_id: int | None, after: str | None, limit: int
) -> Page:
    """Coupon templates, newest first (expired ones too), optionally one seller's.

    Raises:
        InvalidInput: a bad cursor or limit.
    """
    return await _catalogue(deps, "coupon_templates", {"seller_id": seller_id}, after, limit)


async def coupons_list(deps: Deps, caller: User, *, after: str | None, limit: int) -> Page:
    """The caller's coupons, newest first, each with its template's terms and its state now
    (an available one past its validity reads ``expired``).

    Raises:
        InvalidInput: a bad cursor or limit.
    """
    scope: Scope = {"list": "coupons", "user": caller.id}
    position = read_cursor(after, scope)
    now = deps.clock.now()
    async with deps.db.read() as conn:
        rows = await lists.coupons_page(
            conn, user_id=caller.id, after=position, limit=_checked_limit(limit)
        )
    return _paged(rows, limit, scope, lambda row: shop.coupon_json(row, now))


#: The refunds list keeps the page size it had before it had cursors.
MAX_REFUNDS_LIMIT = 1000


async def refunds_list(deps: Deps, *, state: str | None, after: str | None, limit: int) -> Page:
    """Refunds (for admins), newest first, optionally in one state, with their attempt's pay
    number and total.

    Raises:
        InvalidInput: an unknown state, a bad cursor or limit.
    """
    if state is not None and state not in refunds.STATES:
        raise InvalidInput(
            f"unknown refund state {state!r}; known: {', '.join(refunds.STATES)}", field="state"
        )
    scope: Scope = {"list": "refunds", "state": state}
    position = read_cursor(after, scope)
    async with deps.db.read() as conn:
        rows = await lists.refunds_page(
            conn,
            state=state,
            after=position,
            limit=_checked_limit(limit, MAX_REFUNDS_LIMIT),
        )
    return _paged(rows, limit, scope)


async def users_list(deps: Deps, *, after: str | None, limit: int) -> Page:
    """The users (for admins), newest first: id, name, admin flag, created_at.

    Raises:
        InvalidInput: a bad cursor or limit.
    """
    scope: Scope = {"list": "users"}
    position = read_cursor(after, scope)
    async with deps.db.read() as conn:
        rows = await lists.users_page(conn, after=position, limit=_checked_limit(limit))
    return _paged(rows, limit, scope)


async def me(deps: Deps, caller: User) -> dict[str, Any]:
    """The caller (id, name, admin flag) and how many orders they have as buyer and as seller
    (one statement: two counts over the party indexes)."""
    async with deps.db.read() as conn:
        as_buyer, as_seller = await lists.order_counts(conn, caller.id)
    return {
        "id": caller.id,
        "name": caller.name,
        "admin": caller.is_admin,
        "orders_as_buyer": as_buyer,
        "orders_as_seller": as_seller,
    }
