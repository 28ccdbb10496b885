"""Statements on goods: the hold is one conditional update, the release another."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any, TypedDict, Unpack

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store import _rows, hot, tally
from dueflow.store.schema import goods

ON_SALE = "on_sale"
SOLD = "sold"
OFF_SALE = "off_sale"


class NewGoods(TypedDict):
    """New goods' columns as their seller gives them."""

    seller_id: int
    title: str
    price: Decimal


async def insert_goods(conn: AsyncConnection, *, now: datetime, **item: Unpack[NewGoods]) -> int:
    """Put goods on sale; returns their id."""
    return await _rows.add(conn, goods, item, status=ON_SALE, created_at=now, updated_at=now)


#: Placing's read and guarded hold of the goods, run hot (docs/architecture.md, "How hot
#: statements run").
_GET = hot.Hot(select(goods).where(goods.c.id == bindparam("goods_id")))
_HOLD = hot.Hot(
    update(goods)
    .where(
        goods.c.id == bindparam("goods_id"),
        goods.c.status == ON_SALE,
        goods.c.reserved_order_id.is_(None),
    )
    .values(reserved_order_id=bindparam("order_id"), updated_at=bindparam("now"))
)
#: Releasing and selling move only goods still on sale (taking off sale moves them whatever
#: their status).
#: The status test of a statement that finds its goods by their holders, written so that no
#: index serves it (COALESCE of a column that is never NULL): with a plain ``status = 'on_sale'``
#: SQLite's planner walks ``ix_goods_status_id`` over every goods on sale (all 100,000 of a
#: herd's, held ones are on sale) for each batch, instead of looking up the batch's holders.
_STILL_ON_SALE = func.coalesce(goods.c.status, "") == ON_SALE


async def get(conn: AsyncConnection, goods_id: int) -> hot.HotRow | None:
    """The goods with this id."""
    return await _GET.first(conn, goods_id=goods_id)


async def hold_goods(conn: AsyncConnection, goods_id: int, order_id: int, now: datetime) -> bool:
    """Hold the goods for ``order_id`` if they are on sale and held by nobody."""
    return await _HOLD.rowcount(conn, goods_id=goods_id, order_id=order_id, now=now) == 1


async def release_goods(conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
    """Put back on sale what these orders hold (only where they are the holder)."""
    return await _update_held(
        conn, order_ids, _STILL_ON_SALE, reserved_order_id=None, updated_at=now
    )


#: A paid order's goods sold (one order a confirm), run hot.
_SELL_ONE = hot.Hot(
    update(goods)
    .where(goods.c.reserved_order_id == bindparam("order_id"), _STILL_ON_SALE)
    .values(status=SOLD, updated_at=bindparam("now"))
)


async def sell_goods(conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
    """Mark as sold the goods these (now paid) orders hold."""
    if len(order_ids) == 1:
        return await _SELL_ONE.rowcount(conn, order_id=order_ids[0], now=now)
    return await _update_held(conn, order_ids, _STILL_ON_SALE, status=SOLD, updated_at=now)


async def take_off_sale(conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
    """Take off sale what these orders hold and clear the hold (the seller never shipped it)."""
    return await _update_held(
        conn, order_ids, status=OFF_SALE, reserved_order_id=None, updated_at=now
    )


async def _update_held(
    conn: AsyncConnection, order_ids: Sequence[int], *guards: Any, **values: Any
) -> int:
    """One update of the goods these orders hold (where ``guards`` also hold): sets ``values``,
    returns how many rows it changed; no statement for no orders."""
    if not order_ids:
        return 0
    result = await conn.execute(
        update(goods)
        .where(tally.among(conn, goods.c.reserved_order_id, order_ids), *guards)
        .values(**values)
    )
    return int(result.rowcount)
