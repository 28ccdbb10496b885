"""The list reads: pages of goods and of a party's orders, newest first, by keyset on id.

A page is ``WHERE <filter> AND id < :after ORDER BY id DESC LIMIT :limit + 1``: the extra row
only says whether another page follows. Every filter is equalities on the leading columns of one
index whose last column is id (schema.py), so a page is one range read of that index whatever
the table's size, and rows inserted meanwhile (higher ids) never shift the pages still to come.
"""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import ColumnElement, Row, Select, Table, func, select
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store.goods import ON_SALE
from dueflow.store.schema import goods, orders

Party = Literal["buyer", "seller"]

_PARTY_COLUMN = {"buyer": orders.c.buyer_id, "seller": orders.c.seller_id}


def _page(
    table: Table, where: list[ColumnElement[bool]], after: int | None, limit: int
) -> Select[Any]:
    """``table``'s rows matching ``where`` below id ``after``, newest first, ``limit`` + 1."""
    if after is not None:
        where = [*where, table.c.id < after]
    return select(table).where(*where).order_by(table.c.id.desc()).limit(limit + 1)


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
