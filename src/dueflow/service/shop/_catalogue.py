"""What sellers put on sale (SKUs with stock, coupon templates, flash sales) and the coupons
buyers get."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Row, Table
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain import times
from dueflow.domain.money import parse_yuan
from dueflow.exceptions import (
    CouponUnusable,
    InvalidInput,
    NotAllowed,
    NotFound,
)
from dueflow.service.deps import Deps
from dueflow.service.shop._rules import (
    MAX_QUANTITY,
    MAX_UNITS,
    _count,
    _title,
    _user,
    _zero_or_yuan,
)
from dueflow.store import shop
from dueflow.store.schema import flash_sales, skus


async def create_sku(
    deps: Deps, *, seller_id: int, title: str, price: str | Decimal, stock: int
) -> dict[str, Any]:
    """A new SKU of the seller with ``stock`` units on sale; answers its view.

    Raises:
        InvalidInput: bad title, price or stock.
        NotFound: no such seller.
    """
    title = _title(title)
    amount = parse_yuan(price, field="price")
    stock = _count(stock, "stock", low=0, high=MAX_UNITS)
    async with deps.db.write() as conn:
        await _user(conn, seller_id)
        sku_id = await shop.insert_sku(
            conn, seller_id=seller_id, title=title, price=amount, stock=stock, now=deps.clock.now()
        )
        return await _view_in(conn, skus, sku_id)


#: What a row of each table is called in a NotFound.
_WHAT = {skus: "sku", flash_sales: "flash sale"}


async def _view_in(conn: AsyncConnection, table: Table, row_id: int) -> dict[str, Any]:
    """The SKU's or flash sale's row (``table``) as its view.

    Raises:
        NotFound: no such row.
    """
    row = await shop.get(conn, table, row_id)
    if row is None:
        raise NotFound(f"no {_WHAT[table]} {row_id}")
    return dict(row._mapping)


async def sku_view(deps: Deps, sku_id: int) -> dict[str, Any]:
    """The SKU: its price and its units on sale (stock), held, sold and ever stocked.

    Raises:
        NotFound: no such SKU.
    """
    async with deps.db.read() as conn:
        return await _view_in(conn, skus, sku_id)


async def restock(deps: Deps, *, sku_id: int, user_id: int, quantity: int) -> dict[str, Any]:
    """The seller puts ``quantity`` more units on sale; answers the SKU's view.

    Raises:
        InvalidInput: quantity not 1..MAX_QUANTITY.
        NotFound: no such SKU.
        NotAllowed: not the SKU's seller.
    """
    quantity = _count(quantity, "quantity", low=1, high=MAX_UNITS)
    async with deps.db.write() as conn:
        row = await shop.get(conn, skus, sku_id, for_update=True)
        if row is None:
            raise NotFound(f"no sku {sku_id}")
        if row.seller_id != user_id:
            raise NotAllowed(f"only the seller of sku {sku_id} may restock it")
        await shop.restock(conn, sku_id, quantity, deps.clock.now())
        return await _view_in(conn, skus, sku_id)


async def create_template(
    deps: Deps,
    *,
    seller_id: int,
    title: str,
    amount_off: str | Decimal,
    min_amount: str | Decimal,
    valid_from: datetime,
    valid_until: datetime,
    total: int,
) -> dict[str, Any]:
    """A coupon template of the seller (for orders of the seller's SKUs); answers its view.

    Raises:
        InvalidInput: bad title or amounts, validity not a window, total not 1..MAX_UNITS.
        NotFound: no such seller.
    """
    title = _title(title)
    off = parse_yuan(amount_off, field="amount_off")
    minimum = _zero_or_yuan(min_amount, "min_amount")
    valid_from = times.storable(valid_from, "valid_from")
    valid_until = times.storable(valid_until, "valid_until")
    if valid_until <= valid_from:
        raise InvalidInput("valid_until must be after valid_from", field="valid_until")
    total = _count(total, "total", low=1, high=MAX_UNITS)
    async with deps.db.write() as conn:
        await _user(conn, seller_id)
        template_id = await shop.insert_template(
            conn,
            seller_id=seller_id,
            title=title,
            amount_off=off,
            min_amount=minimum,
            valid_from=valid_from,
            valid_until=valid_until,
            total=total,
            created_at=deps.clock.now(),
        )
        row = await shop.template(conn, template_id)
    assert row is not None
    return dict(row._mapping)


async def template_view(deps: Deps, template_id: int) -> dict[str, Any]:
    """A coupon template with how many were issued.

    Raises:
        NotFound: no such template.
    """
    async with deps.db.read() as conn:
        row = await shop.template(conn, template_id)
    if row is None:
        raise NotFound(f"no coupon template {template_id}")
    return dict(row._mapping)


async def issue_coupon(
    deps: Deps, *, template_id: int, issuer_id: int, user_id: int, admin: bool = False
) -> dict[str, Any]:
    """Issue one coupon of the template to ``user_id`` (by the template's seller, or an
    admin); answers the coupon's view.

    Raises:
        NotFound: no such template or user.
        NotAllowed: the issuer is neither the template's seller nor an admin.
        CouponUnusable: (a 409) every coupon of the template was issued, or it expired.
    """
    now = deps.clock.now()
    async with deps.db.write() as conn:
        tpl = await shop.template(conn, template_id)
        if tpl is None:
            raise NotFound(f"no coupon template {template_id}")
        if tpl.seller_id != issuer_id and not admin:
            raise NotAllowed(f"only the seller of coupon template {template_id} may issue it")
        await _user(conn, user_id)
        if tpl.valid_until <= now:
            raise CouponUnusable(f"coupon template {template_id} expired")
        coupon_id = await shop.issue(conn, tpl, user_id, now)
        if coupon_id is None:
            raise CouponUnusable(f"all {tpl.total} coupons of template {template_id} were issued")
        row = await shop.coupon(conn, coupon_id)
    assert row is not None
    return coupon_json(row, now)


def coupon_json(row: Row[Any], now: datetime) -> dict[str, Any]:
    """A coupon as its owner sees it (an available one past its validity reads expired)."""
    view = dict(row._mapping)
    view["state"] = shop.coupon_state(row, now)
    return view


async def coupons_of(deps: Deps, user_id: int) -> list[dict[str, Any]]:
    """The user's coupons, newest first."""
    now = deps.clock.now()
    async with deps.db.read() as conn:
        return [coupon_json(r, now) for r in await shop.coupons_of(conn, user_id)]


async def create_flash_sale(
    deps: Deps,
    *,
    seller_id: int,
    sku_id: int,
    price: str | Decimal,
    stock: int,
    starts_at: datetime,
    ends_at: datetime,
    per_buyer_limit: int,
) -> dict[str, Any]:
    """A flash sale of the seller's SKU with its own price and units; answers its view. Its
    units are a quota of the SKU's: a flash order holds units of both.

    Raises:
        InvalidInput: bad price, stock, window or limit; more units than the SKU has on sale.
        NotFound: no such SKU.
        NotAllowed: not the SKU's seller.
    """
    amount = parse_yuan(price, field="price")
    stock = _count(stock, "stock", low=1, high=MAX_UNITS)
    limit = _count(per_buyer_limit, "per_buyer_limit", low=1, high=MAX_QUANTITY)
    starts_at = times.storable(starts_at, "starts_at")
    ends_at = times.storable(ends_at, "ends_at")
    if ends_at <= starts_at:
        raise InvalidInput("ends_at must be after starts_at", field="ends_at")
    now = deps.clock.now()
    if ends_at <= now:
        # Every order for it would be refused as closed.
        raise InvalidInput(
            f"ends_at {ends_at.isoformat()} has passed: the sale would take no orders",
            field="ends_at",
        )
    async with deps.db.write() as conn:
        sku = await shop.get(conn, skus, sku_id)
        if sku is None:
            raise NotFound(f"no sku {sku_id}")
        if sku.seller_id != seller_id:
            raise NotAllowed(f"only the seller of sku {sku_id} may put it on a flash sale")
        if stock > sku.stock:
            raise InvalidInput(
                f"sku {sku_id} has {sku.stock} units on sale, not {stock}", field="stock"
            )
        sale_id = await shop.insert_flash_sale(
            conn,
            sku_id=sku_id,
            seller_id=seller_id,
            price=amount,
            stock=stock,
            starts_at=starts_at,
            ends_at=ends_at,
            per_buyer_limit=limit,
            created_at=now,
            updated_at=now,
        )
        return await _view_in(conn, flash_sales, sale_id)


async def flash_sale_view(deps: Deps, sale_id: int) -> dict[str, Any]:
    """The flash sale with its units on sale (stock), held and sold.

    Raises:
        NotFound: no such flash sale.
    """
    async with deps.db.read() as conn:
        return await _view_in(conn, flash_sales, sale_id)
