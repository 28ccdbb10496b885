"""The list reads: pages of goods, of a party's orders, of the catalogue (SKUs, shows, flash
sales, coupon templates), of a user's coupons, of the refunds and of the users, newest first, by
keyset on id.

A page is ``WHERE <filter> AND id < :after ORDER BY id DESC LIMIT :limit + 1``: the extra row
only says whether another page follows. Every filter is equalities on the leading columns of one
index whose last column is id (schema.py), so a page is one range read of that index whatever
the table's size, and rows inserted meanwhile (higher ids) never shift the pages still to come.
"""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import ColumnElement, Row, Select, Table, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store import payments, shop
from dueflow.store.goods import ON_SALE
from dueflow.store.schema import (
    coupon_templates,
    flash_sales,
    goods,
    orders,
    shows,
    skus,
    users,
)

Party = Literal["buyer", "seller"]

_PARTY_COLUMN = {"buyer": orders.c.buyer_id, "seller": orders.c.seller_id}


def _page(
    table: Table, where: list[ColumnElement[bool]], after: int | None, limit: int
) -> Select[Any]:
    """``table``'s rows matching ``where`` below id ``after``, newest first, ``limit`` + 1."""
    return _below(select(table), table, where, after, limit)


def _below(
    query: Select[Any],
    table: Table,
    where: list[ColumnElement[bool]],
    after: int | None,
    limit: int,
) -> Select[Any]:
    """``query`` kept to ``where`` and ids of ``table`` below ``after``, newest first,
    ``limit`` + 1."""
    if after is not None:
        where = [*where, table.c.id < after]
    return query.where(*where).order_by(table.c.id.desc()).limit(limit + 1)


async def goods_page(
    conn: AsyncConnection,
    *,
    seller_id: int | None,
    on_sale_only: bool,
    after: int | None,
    limit: int,
) -> list[Row[Any]]:
    """Up to ``limit + 1`` goods below id ``after``, newest first: on sale (held ones too:
    ``reserved_order_id`` says which), or in every status when not ``on_sale_only``; only the
    seller's when ``seller_id`` is given. One statement."""
    where: list[ColumnElement[bool]] = []
    if on_sale_only:
        where.append(goods.c.status == ON_SALE)
    if seller_id is not None:
        where.append(goods.c.seller_id == seller_id)
    query = _page(goods, where, after, limit)
    return list((await conn.execute(query)).all())


async def orders_page(
    conn: AsyncConnection,
    *,
    party: Party,
    user_id: int,
    status: str | None,
    flow: str | None,
    after: int | None,
    limit: int,
) -> list[Row[Any]]:
    """Up to ``limit + 1`` orders below id ``after`` where ``user_id`` is the ``party``, newest
    first, optionally in one status and of one flow. One statement."""
    where: list[ColumnElement[bool]] = [_PARTY_COLUMN[party] == user_id]
    if status is not None:
        where.append(orders.c.status == status)
    if flow is not None:
        # Not in the indexes: a party's orders are mostly of one flow (a buyer of tickets
        # rarely buys second-hand too), so the range read filters out few rows.
        where.append(orders.c.flow == flow)
    query = _page(orders, where, after, limit)
    return list((await conn.execute(query)).all())


async def order_counts(conn: AsyncConnection, user_id: int) -> tuple[int, int]:
    """How many orders ``user_id`` has as buyer and as seller (one statement)."""
    as_buyer = select(func.count()).select_from(orders).where(orders.c.buyer_id == user_id)
    as_seller = select(func.count()).select_from(orders).where(orders.c.seller_id == user_id)
    both = select(as_buyer.scalar_subquery(), as_seller.scalar_subquery())
    row = (await conn.execute(both)).one()
    return int(row[0]), int(row[1])


#: The catalogue lists and the columns their filters may name: each filter alone is the
#: leading column of an index ending in id (_schema_shop.py, _schema_shows.py).
CATALOGUE: dict[str, tuple[Table, frozenset[str]]] = {
    "skus": (skus, frozenset({"seller_id"})),
    "shows": (shows, frozenset({"organizer_id", "status"})),
    "flash_sales": (flash_sales, frozenset({"sku_id", "seller_id"})),
    "coupon_templates": (coupon_templates, frozenset({"seller_id"})),
}


async def catalogue_page(
    conn: AsyncConnection,
    kind: str,
    *,
    equal: dict[str, int | str | None],
    after: int | None,
    limit: int,
) -> list[Row[Any]]:
    """Up to ``limit + 1`` rows of the catalogue list ``kind`` (a key of :data:`CATALOGUE`)
    below id ``after``, newest first, where each column of ``equal`` not None has its value.
    One statement; with two filters the first the index holds is read as a range and the
    other filters it (a seller's shows or a SKU's flash sales are few)."""
    table, columns = CATALOGUE[kind]
    if not set(equal) <= columns:
        raise ValueError(f"{kind} are not filtered by {sorted(set(equal) - columns)}")
    where = [table.c[name] == value for name, value in equal.items() if value is not None]
    return list((await conn.execute(_page(table, where, after, limit))).all())


async def users_page(conn: AsyncConnection, *, after: int | None, limit: int) -> list[Row[Any]]:
    """Up to ``limit + 1`` users below id ``after``, newest first: id, name, admin, created_at
    (never the token's hash). One statement over the primary key."""
    query = select(users.c.id, users.c.name, users.c.is_admin.label("admin"), users.c.created_at)
    return list((await conn.execute(_below(query, users, [], after, limit))).all())


async def coupons_page(
    conn: AsyncConnection, *, user_id: int, after: int | None, limit: int
) -> list[Row[Any]]:
    """Up to ``limit + 1`` of the user's coupons below id ``after``, newest first, with their
    template's terms. One statement (ix_coupons_user_id_id, the template by its key)."""
    return await shop.coupons_of(conn, user_id, after=after, limit=limit + 1)


async def refunds_page(
    conn: AsyncConnection, *, state: str | None, after: int | None, limit: int
) -> list[Row[Any]]:
    """Up to ``limit + 1`` refunds below id ``after``, newest first, optionally in one state,
    with their attempt's pay number and total. One statement (ix_refunds_state_id or the
    primary key, the attempt by its key)."""
    return await payments.refunds_in(conn, state=state, after=after, limit=limit + 1)
