"""The operators' reads of people (``/admin/users``): users newest first, one user with how
many orders they have on each side, the service keys they made, and the names of a few users
(for pages that show ids)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import Row, Select, func, or_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store.keys import PUBLIC as KEY_COLUMNS
from dueflow.store.schema import api_keys, orders, users

#: What the pages show of a user (never the token's hash).
COLUMNS = (
    users.c.id,
    users.c.name,
    users.c.display_name,
    users.c.is_admin.label("admin"),
    users.c.created_at,
    users.c.external_id,
)


async def users_page(conn: AsyncConnection, *, after: int | None, limit: int) -> list[Row[Any]]:
    """Up to ``limit + 1`` users below id ``after``, newest first. One statement, a range read
    of the primary key."""
    query: Select[Any] = select(*COLUMNS).order_by(users.c.id.desc()).limit(limit + 1)
    if after is not None:
        query = query.where(users.c.id < after)
    return list((await conn.execute(query)).all())


async def user_with_counts(conn: AsyncConnection, user_id: int) -> Row[Any] | None:
    """The user, with ``as_buyer`` and ``as_seller``: how many orders they have on each side.
    One statement (two counts over ix_orders_buyer_id_id and ix_orders_seller_id_id)."""
    as_buyer = select(func.count()).select_from(orders).where(orders.c.buyer_id == user_id)
    as_seller = select(func.count()).select_from(orders).where(orders.c.seller_id == user_id)
    query: Select[Any] = select(
        *COLUMNS,
        as_buyer.scalar_subquery().label("as_buyer"),
        as_seller.scalar_subquery().label("as_seller"),
    ).where(users.c.id == user_id)
    found: Row[Any] | None = (await conn.execute(query)).first()
    return found


async def keys_made_by(conn: AsyncConnection, user_id: int, *, limit: int) -> list[Row[Any]]:
    """The newest ``limit`` service keys the user made, themselves (``created_by`` is
    ``user:<id>``) or through a key acting for them (``user:<id>@key:<key>``). One statement
    (keys are few: no index on ``created_by``)."""
    actor = f"user:{user_id}"
    query: Select[Any] = (
        select(*KEY_COLUMNS)
        .where(or_(api_keys.c.created_by == actor, api_keys.c.created_by.startswith(f"{actor}@")))
        .order_by(api_keys.c.id.desc())
        .limit(limit)
    )
    return list((await conn.execute(query)).all())


async def names(conn: AsyncConnection, user_ids: Collection[int]) -> dict[int, str]:
    """The names of these users (ids of no user are left out). One statement."""
    if not user_ids:
        return {}
    query = select(users.c.id, users.c.name).where(users.c.id.in_(sorted(set(user_ids))))
    return {row.id: row.name for row in (await conn.execute(query)).all()}
