"""Statements on the shop: SKUs and flash sales (units counted as stock, held, sold), coupon
templates and coupons.

Units move between counts by guarded updates only: taking ``q`` is ``stock = stock - q,
held = held + q WHERE stock >= q``, and every later move is the reverse or ``held -> sold``.
Rows are always touched in id order (SKUs before flash sales before coupons), so two
transactions never wait on each other in a cycle.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any, TypedDict, Unpack

from sqlalchemy import Row, Table, bindparam, case, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store import _rows, hot, tally
from dueflow.store.schema import (
    coupon_templates,
    coupons,
    flash_buyers,
    flash_sales,
    order_lines,
    orders,
    skus,
)

AVAILABLE = "available"
LOCKED = "locked"
USED = "used"
EXPIRED = "expired"


class NewSku(TypedDict):
    """A new SKU's columns as its seller gives them (``stock``: the units put on sale)."""

    seller_id: int
    title: str
    price: Decimal
    stock: int


async def insert_sku(conn: AsyncConnection, *, now: datetime, **sku: Unpack[NewSku]) -> int:
    """A new SKU with ``stock`` units on sale; returns its id."""
    return await _rows.add(
        conn, skus, sku, created_at=now, updated_at=now, **_all_on_sale(sku["stock"])
    )


def _all_on_sale(stock: int) -> dict[str, int]:
    """The unit counts of a new SKU or flash sale: all ``stock`` units on sale, none held or
    sold."""
    return {"stock": stock, "held": 0, "sold": 0, "stocked": stock}


async def get(
    conn: AsyncConnection, table: Table, item_id: int, *, for_update: bool = False
) -> Row[Any] | None:
    """One SKU or flash sale (``table``)."""
    query = select(table).where(table.c.id == item_id)
    return await _rows.first(conn, query, for_update=for_update)


async def many(conn: AsyncConnection, table: Table, item_ids: Sequence[int]) -> list[Row[Any]]:
    """SKUs or flash sales by id, in id order."""
    if not item_ids:
        return []
    query = select(table).where(table.c.id.in_(item_ids)).order_by(table.c.id)
    return list((await conn.execute(query)).all())


async def restock(conn: AsyncConnection, sku_id: int, quantity: int, now: datetime) -> bool:
    """Put ``quantity`` more units of the SKU on sale."""
    result = await conn.execute(
        update(skus)
        .where(skus.c.id == sku_id)
        .values(stock=skus.c.stock + quantity, stocked=skus.c.stocked + quantity, updated_at=now)
    )
    return result.rowcount == 1


def _take(table: Table) -> Any:
    """The guarded update that takes units of ``table`` (built once per table)."""
    c = table.c
    quantity = bindparam("quantity", type_=c.stock.type)
    return (
        update(table)
        .where(c.id == bindparam("item_id", type_=c.id.type), c.stock >= quantity)
        .values(
            stock=c.stock - quantity,
            held=c.held + quantity,
            updated_at=bindparam("now", type_=c.updated_at.type),
        )
    )


#: Every order of a rush runs these on the one contended row: compiled once, run hot.
_TAKE = {table.name: hot.Hot(_take(table)) for table in (skus, flash_sales)}
#: A flash sale's take answers its per-buyer limit (where the dialect has UPDATE ... RETURNING),
#: so the buyer is counted without reading the sale again.
_TAKE_FLASH = hot.Hot(_take(flash_sales).returning(flash_sales.c.per_buyer_limit))


async def take(
    conn: AsyncConnection, table: Table, item_id: int, quantity: int, now: datetime
) -> bool:
    """Hold ``quantity`` units of a SKU or flash sale, if that many are on sale (one guarded
    update; the row stays locked until the transaction ends)."""
    taken = await _TAKE[table.name].rowcount(conn, item_id=item_id, quantity=quantity, now=now)
    return taken == 1


async def take_flash(
    conn: AsyncConnection, sale_id: int, quantity: int, now: datetime
) -> int | None:
    """:func:`take` of a flash sale's units; the sale's per-buyer limit when taken, else None."""
    if not conn.dialect.update_returning:
        if not await take(conn, flash_sales, sale_id, quantity, now):
            return None
        sale = await get(conn, flash_sales, sale_id)
        assert sale is not None  # just taken
        return int(sale.per_buyer_limit)
    limit = await _TAKE_FLASH.scalar(conn, item_id=sale_id, quantity=quantity, now=now)
    return None if limit is None else int(limit)


async def units_of(conn: AsyncConnection, order_ids: Sequence[int], kind: str) -> list[Row[Any]]:
    """The units of ``kind`` these orders hold: rows of (item_id, buyer_id, units), in item
    order."""
    if not order_ids:
        return []
    query = (
        select(
            order_lines.c.item_id,
            orders.c.buyer_id,
            func.sum(order_lines.c.quantity).label("units"),
        )
        .join(orders, orders.c.id == order_lines.c.order_id)
        .where(tally.among(conn, order_lines.c.order_id, order_ids), order_lines.c.kind == kind)
        .group_by(order_lines.c.item_id, orders.c.buyer_id)
        .order_by(order_lines.c.item_id, orders.c.buyer_id)
    )
    rows: list[Any] = list((await conn.execute(query)).all())
    return rows


def per_item(rows: Sequence[Row[Any]]) -> dict[int, int]:
    """Units per item of :func:`units_of` rows, in item order."""
    found: dict[int, int] = defaultdict(int)
    for row in rows:
        found[int(row.item_id)] += int(row.units)
    return dict(sorted(found.items()))


async def give_back(
    conn: AsyncConnection, table: Table, units: Mapping[int, int], now: datetime
) -> int:
    """Held units go back on sale (a cancel before payment); returns how many. Set-based: one
    UPDATE per distinct amount or per chunk of items (:func:`dueflow.store.tally.add_each`),
    the rows locked in id order first."""
    c = table.c
    await tally.add_each(
        conn,
        table,
        (c.id,),
        {(item_id,): n for item_id, n in units.items()},
        lambda n: {"stock": c.stock + n, "held": c.held - n, "updated_at": now},
    )
    return sum(units.values())


async def sell(conn: AsyncConnection, table: Table, units: Mapping[int, int], now: datetime) -> int:
    """Held units are sold (the order was paid); returns how many."""
    c = table.c
    for item_id in sorted(units):
        await conn.execute(
            update(table)
            .where(c.id == item_id)
            .values(held=c.held - units[item_id], sold=c.sold + units[item_id], updated_at=now)
        )
    return sum(units.values())


async def count_buyer(
    conn: AsyncConnection, *, flash_sale_id: int, buyer_id: int, quantity: int, limit: int
) -> int | None:
    """Count ``quantity`` more units against the buyer's limit for the sale: one guarded update
    of the buyer's row (:func:`dueflow.store.tally.count_against`). Returns None when counted,
    else what the buyer already holds or bought."""
    key = {"flash_sale_id": flash_sale_id, "buyer_id": buyer_id}
    return await tally.count_against(conn, flash_buyers, key, "units", quantity, limit)


async def uncount_buyers(conn: AsyncConnection, rows: Sequence[Row[Any]]) -> None:
    """Released flash units no longer count against their buyers (rows of :func:`units_of`):
    set-based, as :func:`give_back`."""
    per_buyer: dict[tally.Key, int] = defaultdict(int)
    for r in rows:
        per_buyer[(int(r.item_id), int(r.buyer_id))] += int(r.units)
    await tally.uncount(conn, flash_buyers, ("flash_sale_id", "buyer_id"), "units", per_buyer)


class NewFlashSale(TypedDict):
    """A new flash sale's columns (``stock``: the SKU's units it puts on sale)."""

    sku_id: int
    seller_id: int
    price: Decimal
    stock: int
    starts_at: datetime
    ends_at: datetime
    per_buyer_limit: int
    created_at: datetime
    updated_at: datetime


async def insert_flash_sale(conn: AsyncConnection, **sale: Unpack[NewFlashSale]) -> int:
    """A new flash sale (its units all on sale); returns its id."""
    return await _rows.add(conn, flash_sales, sale, **_all_on_sale(sale["stock"]))


class NewTemplate(TypedDict):
    """A new coupon template's columns: its terms and how many coupons it may issue."""

    seller_id: int
    title: str
    amount_off: Decimal
    min_amount: Decimal
    valid_from: datetime
    valid_until: datetime
    total: int
    created_at: datetime


async def insert_template(conn: AsyncConnection, **tpl: Unpack[NewTemplate]) -> int:
    """A new coupon template (none issued yet); returns its id."""
    return await _rows.add(conn, coupon_templates, tpl, issued=0)


async def template(
    conn: AsyncConnection, template_id: int, *, for_update: bool = False
) -> Row[Any] | None:
    """One coupon template."""
    query = select(coupon_templates).where(coupon_templates.c.id == template_id)
    return await _rows.first(conn, query, for_update=for_update)


async def issue(conn: AsyncConnection, tpl: Row[Any], user_id: int, now: datetime) -> int | None:
    """Issue one coupon of the template to the user, if the template has any left (a guarded
    update of its count); returns the coupon id, or None when all were issued."""
    c = coupon_templates.c
    result = await conn.execute(
        update(coupon_templates)
        .where(c.id == tpl.id, c.issued < c.total)
        .values(issued=c.issued + 1)
    )
    if result.rowcount != 1:
        return None
    new_coupon = {"template_id": tpl.id, "user_id": user_id, "valid_until": tpl.valid_until}
    return await _rows.add(
        conn, coupons, new_coupon, state=AVAILABLE, issued_at=now, updated_at=now
    )


def _coupon_columns() -> list[Any]:
    t = coupon_templates.c
    return [
        *coupons.c,
        t.seller_id,
        t.title,
        t.amount_off,
        t.min_amount,
        t.valid_from,
    ]


async def coupon(conn: AsyncConnection, coupon_id: int) -> Row[Any] | None:
    """A coupon with its template's terms (seller_id, title, amount_off, min_amount,
    valid_from)."""
    query = (
        select(*_coupon_columns())
        .join(coupon_templates, coupon_templates.c.id == coupons.c.template_id)
        .where(coupons.c.id == coupon_id)
    )
    return (await conn.execute(query)).first()


async def coupons_of(
    conn: AsyncConnection, user_id: int, limit: int = 500, *, after: int | None = None
) -> list[Row[Any]]:
    """The user's coupons, newest first (below id ``after`` if given), with their terms."""
    query = (
        select(*_coupon_columns())
        .join(coupon_templates, coupon_templates.c.id == coupons.c.template_id)
        .where(coupons.c.user_id == user_id)
        .order_by(coupons.c.id.desc())
        .limit(limit)
    )
    if after is not None:
        query = query.where(coupons.c.id < after)
    return list((await conn.execute(query)).all())


def coupon_state(row: Row[Any], now: datetime) -> str:
    """What a coupon is for its owner now: an available one past its validity is expired."""
    if row.state == AVAILABLE and row.valid_until <= now:
        return EXPIRED
    return str(row.state)


async def lock_coupon(
    conn: AsyncConnection, coupon_id: int, *, buyer_id: int, order_id: int, now: datetime
) -> bool:
    """Lock the buyer's available, valid coupon to the order (one guarded update)."""
    c = coupons.c
    result = await conn.execute(
        update(coupons)
        .where(
            c.id == coupon_id,
            c.user_id == buyer_id,
            c.state == AVAILABLE,
            c.valid_until > now,
        )
        .values(state=LOCKED, order_id=order_id, updated_at=now)
    )
    return result.rowcount == 1


async def return_coupons(conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
    """Coupons locked by these cancelled unpaid orders go back to their owners (expired when
    their validity ended meanwhile); returns how many."""
    if not order_ids:
        return 0
    c = coupons.c
    result = await conn.execute(
        update(coupons)
        .where(tally.among(conn, c.order_id, order_ids), c.state == LOCKED)
        .values(
            state=case((c.valid_until <= now, EXPIRED), else_=AVAILABLE),
            order_id=None,
            updated_at=now,
        )
    )
    return int(result.rowcount)


async def use_coupons(conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
    """Coupons locked by these paid orders are used."""
    if not order_ids:
        return 0
    c = coupons.c
    result = await conn.execute(
        update(coupons)
        .where(c.order_id.in_(order_ids), c.state == LOCKED)
        .values(state=USED, used_at=now, updated_at=now)
    )
    return int(result.rowcount)
