"""People, for operators (``/admin/users``): the users, one user with their orders and the
service keys they made, and the names the admin pages show beside the ids they hold."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dueflow.exceptions import InvalidInput, NotFound
from dueflow.service import keys, lists
from dueflow.service.deps import Deps
from dueflow.store import order_search, people
from dueflow.store.order_search import OrderFilter

#: A user's keys shown on their page (a user makes few).
KEYS_SHOWN = 50


async def users_page(deps: Deps, *, after: str | None, limit: int) -> lists.Page:
    """A page of users, newest first: id, name, display name, admin flag, created_at and the
    host's external id (None for users made by ``dueflow users add``). One statement.

    Raises:
        InvalidInput: a bad cursor or limit.
    """
    scope: lists.Scope = {"list": "admin_users"}
    position = lists.read_cursor(after, scope)
    if not 1 <= limit <= lists.MAX_LIMIT:
        raise InvalidInput(f"limit: from 1 to {lists.MAX_LIMIT}", field="limit")
    async with deps.db.read() as conn:
        rows = await people.users_page(conn, after=position, limit=limit)
    items = [dict(row._mapping) for row in rows[:limit]]
    more = len(rows) > limit
    return lists.Page(items, lists.make_cursor(items[-1]["id"], scope) if more else None)


async def user_page(deps: Deps, user_id: int, *, orders_shown: int) -> dict[str, Any]:
    """The user with ``as_buyer`` and ``as_seller`` (how many orders they have on each side),
    ``orders_as_buyer`` and ``orders_as_seller`` (the newest ``orders_shown`` of each, as the
    orders list shows them) and ``keys``: the newest :data:`KEYS_SHOWN` service keys they made
    (four statements, one read transaction).

    Raises:
        NotFound: no such user.
    """
    async with deps.db.read() as conn:
        row = await people.user_with_counts(conn, user_id)
        if row is None:
            raise NotFound(f"no user {user_id}")
        made = await people.keys_made_by(conn, user_id, limit=KEYS_SHOWN)
        bought = await order_search.orders_page(
            conn, OrderFilter(buyer=user_id), after=None, limit=orders_shown
        )
        sold = await order_search.orders_page(
            conn, OrderFilter(seller=user_id), after=None, limit=orders_shown
        )
    now = deps.clock.now()
    return {
        **row._mapping,
        "keys": [keys.view(key, now) for key in made],
        "orders_as_buyer": [dict(r._mapping) for r in bought[:orders_shown]],
        "orders_as_seller": [dict(r._mapping) for r in sold[:orders_shown]],
    }


async def names(deps: Deps, user_ids: Iterable[int | None]) -> dict[int, str]:
    """The names of these users, by id (None and unknown ids left out). One statement."""
    wanted = {user_id for user_id in user_ids if user_id is not None}
    if not wanted:
        return {}
    async with deps.db.read() as conn:
        return await people.names(conn, wanted)
