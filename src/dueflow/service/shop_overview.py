"""What operators read of the shop: every SKU with its units, one SKU with its flash sales and
its newest orders, every flash sale with what it sold, holds and has left.

Reads only, each a fixed number of statements however many rows (counted in each docstring).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Row, select

from dueflow.exceptions import NotFound
from dueflow.service.deps import Deps
from dueflow.store import holds
from dueflow.store.schema import flash_sales, order_lines, orders, skus, users

#: Where a flash sale's window is at an instant.
UPCOMING, OPEN, ENDED = "upcoming", "open", "ended"


def window(sale: Mapping[str, Any], now: datetime) -> str:
    """``upcoming``, ``open`` or ``ended``: where the sale's window is at ``now``."""
    starts_at, ends_at = sale["starts_at"], sale["ends_at"]
    if now < starts_at:
        return UPCOMING
    return OPEN if now < ends_at else ENDED


def _sale(row: Row[Any], now: datetime) -> dict[str, Any]:
    sale = dict(row._mapping)
    sale["window"] = window(sale, now)
    return sale


async def skus_overview(deps: Deps, limit: int = 200) -> list[dict[str, Any]]:
    """The newest ``limit`` SKUs, newest first, with their units (stock, held, sold, stocked)
    and their seller's name: one statement."""
    query = (
        select(skus, users.c.name.label("seller"))
        .join(users, users.c.id == skus.c.seller_id)
        .order_by(skus.c.id.desc())
        .limit(limit)
    )
    async with deps.db.report() as conn:
        return [dict(r._mapping) for r in await conn.execute(query)]


async def sku_page(deps: Deps, sku_id: int, orders_limit: int = 500) -> dict[str, Any]:
    """The SKU with its seller's name, its flash sales (``flash_sales``, newest first) and the
    newest ``orders_limit`` orders holding its units (``orders``: each with its buyer's name,
    and the units and price each of its line): three statements.

    Raises:
        NotFound: no such SKU.
    """
    now = deps.clock.now()
    line = order_lines.c
    by_order = (
        select(
            orders.c.id,
            orders.c.order_type,
            orders.c.status,
            orders.c.amount,
            orders.c.created_at,
            orders.c.buyer_id,
            users.c.name.label("buyer"),
            line.quantity,
            line.price,
        )
        .join(orders, orders.c.id == line.order_id)
        .join(users, users.c.id == orders.c.buyer_id)
        .where(line.kind == holds.SkuHold.kind, line.item_id == sku_id)
        .order_by(orders.c.id.desc())
        .limit(orders_limit)
    )
    async with deps.db.report() as conn:
        found = (
            await conn.execute(
                select(skus, users.c.name.label("seller"))
                .join(users, users.c.id == skus.c.seller_id)
                .where(skus.c.id == sku_id)
            )
        ).first()
        if found is None:
            raise NotFound(f"no sku {sku_id}")
        sales = await conn.execute(
            select(flash_sales)
            .where(flash_sales.c.sku_id == sku_id)
            .order_by(flash_sales.c.id.desc())
        )
        page = dict(found._mapping)
        page["flash_sales"] = [_sale(r, now) for r in sales]
        page["orders"] = [dict(r._mapping) for r in await conn.execute(by_order)]
    return page


async def flash_sales_overview(deps: Deps, limit: int = 200) -> list[dict[str, Any]]:
    """The newest ``limit`` flash sales, newest first, each with its SKU's title (``title``)
    and where its window is (``window``): one statement."""
    query = (
        select(flash_sales, skus.c.title)
        .join(skus, skus.c.id == flash_sales.c.sku_id)
        .order_by(flash_sales.c.id.desc())
        .limit(limit)
    )
    now = deps.clock.now()
    async with deps.db.report() as conn:
        return [_sale(r, now) for r in await conn.execute(query)]
