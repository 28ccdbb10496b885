"""The shop: SKUs with stock, coupons, flash sales, and orders of several lines.

An order takes all its units and its coupon or nothing, in one transaction, touching rows in
id order (SKUs, then the flash sale, then the coupon); the server computes the amount (lines
minus the coupon, never below 0.01) and picks the order type: ``shop`` for SKU lines, ``flash``
for a flash sale. What an order holds goes back through the one cancel code of every flow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Row, bindparam, select
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain import text, times
from dueflow.domain.lifecycle import OrderStatus
from dueflow.domain.money import CENT, parse_yuan
from dueflow.exceptions import (
    CouponUnusable,
    InvalidInput,
    NotAllowed,
    NotFound,
    OutOfStock,
    SalesClosed,
)
from dueflow.service import orders as order_service
from dueflow.service.deps import Deps
from dueflow.store import holds, idempotency, shop, timers, users
from dueflow.store.schema import flash_sales, skus

S = OrderStatus
SHOP_ORDER_TYPE = "shop"
FLASH_ORDER_TYPE = "flash"
MAX_LINES = 50
MAX_QUANTITY = 10_000
MAX_UNITS = 10_000_000


def _title(value: str) -> str:
    if not isinstance(value, str):
        raise InvalidInput("a title is text")
    title = value.strip()
    if not 1 <= len(title) <= 200:
        raise InvalidInput("a title is 1-200 characters")
    # The one rule of free text (dueflow.domain.text): emoji joiners, right-to-left marks and
    # no-break spaces are text people write, though str.isprintable() refuses them.
    problem = text.refused_character(title)
    if problem is not None:
        raise InvalidInput(f"the title {problem}")
    return title


def _count(value: object, what: str, *, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"{what} is a whole number from {low} to {high}")
    return value


def _zero_or_yuan(value: object, what: str) -> Decimal:
    """An amount that may also be zero (a coupon without a minimum)."""
    if (
        isinstance(value, str | int)
        and not isinstance(value, bool)
        and str(value).strip()
        in (
            "0",
            "0.0",
            "0.00",
        )
    ):
        return Decimal("0.00")
    try:
        return parse_yuan(value)
    except InvalidInput as exc:
        raise InvalidInput(f"{what}: {exc.message}") from None


async def _user(conn: AsyncConnection, user_id: int) -> None:
    if await users.by_id(conn, user_id) is None:
        raise NotFound(f"no user {user_id}")


# --- SKUs -----------------------------------------------------------------------------------


async def create_sku(
    deps: Deps, *, seller_id: int, title: str, price: str | Decimal, stock: int
) -> dict[str, Any]:
    """A new SKU of the seller with ``stock`` units on sale; answers its view.

    Raises:
        InvalidInput: bad title, price or stock.
        NotFound: no such seller.
    """
    title = _title(title)
    amount = parse_yuan(price)
    stock = _count(stock, "stock", low=0, high=MAX_UNITS)
    async with deps.db.write() as conn:
        await _user(conn, seller_id)
        sku_id = await shop.insert_sku(
            conn, seller_id=seller_id, title=title, price=amount, stock=stock, now=deps.clock.now()
        )
        return await _sku_in(conn, sku_id)


async def _sku_in(conn: AsyncConnection, sku_id: int) -> dict[str, Any]:
    row = await shop.get(conn, skus, sku_id)
    if row is None:
        raise NotFound(f"no sku {sku_id}")
    return dict(row._mapping)


async def sku_view(deps: Deps, sku_id: int) -> dict[str, Any]:
    """The SKU: its price and its units on sale (stock), held, sold and ever stocked.

    Raises:
        NotFound: no such SKU.
    """
    async with deps.db.read() as conn:
        return await _sku_in(conn, sku_id)


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
        return await _sku_in(conn, sku_id)


# --- coupons --------------------------------------------------------------------------------


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
    off = parse_yuan(amount_off)
    minimum = _zero_or_yuan(min_amount, "min_amount")
    valid_from = times.storable(valid_from, "valid_from")
    valid_until = times.storable(valid_until, "valid_until")
    if valid_until <= valid_from:
        raise InvalidInput("valid_until must be after valid_from")
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


def _usable(
    coupon: Row[Any] | None,
    coupon_id: int,
    buyer_id: int,
    seller_id: int,
    amount: Decimal,
    now: datetime,
) -> Row[Any]:
    """The coupon may go with this order, or the reason it may not."""
    if coupon is None:
        raise NotFound(f"no coupon {coupon_id}")
    if coupon.user_id != buyer_id:
        raise NotAllowed(f"coupon {coupon_id} is not yours")
    state = shop.coupon_state(coupon, now)
    if state == shop.LOCKED:
        raise CouponUnusable(f"coupon {coupon_id} is locked by order {coupon.order_id}")
    if state == shop.USED:
        raise CouponUnusable(f"coupon {coupon_id} was used")
    if state == shop.EXPIRED:
        raise CouponUnusable(f"coupon {coupon_id} expired at {coupon.valid_until.isoformat()}")
    if coupon.valid_from > now:
        raise CouponUnusable(f"coupon {coupon_id} is valid from {coupon.valid_from.isoformat()}")
    if coupon.seller_id != seller_id:
        raise CouponUnusable(f"coupon {coupon_id} is for another seller's goods")
    if amount < coupon.min_amount:
        raise CouponUnusable(
            f"coupon {coupon_id} needs an order of at least {coupon.min_amount}; this one is"
            f" {amount}"
        )
    return coupon


# --- flash sales ----------------------------------------------------------------------------


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
    amount = parse_yuan(price)
    stock = _count(stock, "stock", low=1, high=MAX_UNITS)
    limit = _count(per_buyer_limit, "per_buyer_limit", low=1, high=MAX_QUANTITY)
    starts_at = times.storable(starts_at, "starts_at")
    ends_at = times.storable(ends_at, "ends_at")
    if ends_at <= starts_at:
        raise InvalidInput("ends_at must be after starts_at")
    now = deps.clock.now()
    if ends_at <= now:
        # Every order for it would be refused as closed.
        raise InvalidInput(
            f"ends_at {ends_at.isoformat()} has passed: the sale would take no orders"
        )
    async with deps.db.write() as conn:
        sku = await shop.get(conn, skus, sku_id)
        if sku is None:
            raise NotFound(f"no sku {sku_id}")
        if sku.seller_id != seller_id:
            raise NotAllowed(f"only the seller of sku {sku_id} may put it on a flash sale")
        if stock > sku.stock:
            raise InvalidInput(f"sku {sku_id} has {sku.stock} units on sale, not {stock}")
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
        return await _sale_in(conn, sale_id)


async def _sale_in(conn: AsyncConnection, sale_id: int) -> dict[str, Any]:
    row = await shop.get(conn, flash_sales, sale_id)
    if row is None:
        raise NotFound(f"no flash sale {sale_id}")
    return dict(row._mapping)


async def flash_sale_view(deps: Deps, sale_id: int) -> dict[str, Any]:
    """The flash sale with its units on sale (stock), held and sold.

    Raises:
        NotFound: no such flash sale.
    """
    async with deps.db.read() as conn:
        return await _sale_in(conn, sale_id)


def _check_window(sale: Row[Any], now: datetime) -> None:
    if now < sale.starts_at:
        raise SalesClosed(f"flash sale {sale.id} starts at {sale.starts_at.isoformat()}")
    if now >= sale.ends_at:
        raise SalesClosed(f"flash sale {sale.id} ended at {sale.ends_at.isoformat()}")


# --- placing --------------------------------------------------------------------------------

#: A flash sale and its SKU's title in one read (built once: every flash order starts here).
_SALE_AND_TITLE = (
    select(flash_sales, skus.c.title.label("sku_title"))
    .join(skus, skus.c.id == flash_sales.c.sku_id)
    .where(flash_sales.c.id == bindparam("sale_id"))
)


def wanted_lines(lines: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    """Units wanted per SKU (repeats of a SKU add up), in SKU order.

    Raises:
        InvalidInput: no lines, too many, a bad SKU id or quantity.
    """
    if not isinstance(lines, list | tuple) or not 1 <= len(lines) <= MAX_LINES:
        raise InvalidInput(f"lines: 1 to {MAX_LINES} lines of sku_id and quantity")
    wanted: dict[int, int] = {}
    for line in lines:
        if not isinstance(line, Mapping):
            raise InvalidInput("lines: each line is an object of sku_id and quantity")
        sku_id = _count(line.get("sku_id"), "sku_id", low=1, high=2**63 - 1)
        quantity = _count(line.get("quantity"), "quantity", low=1, high=MAX_QUANTITY)
        wanted[sku_id] = wanted.get(sku_id, 0) + quantity
        if wanted[sku_id] > MAX_QUANTITY:
            raise InvalidInput(f"quantity of sku {sku_id} is at most {MAX_QUANTITY}")
    return dict(sorted(wanted.items()))


def _at_least_a_cent(amount: Decimal) -> Decimal:
    return max(amount, CENT).quantize(CENT)


async def place_shop_order(
    deps: Deps,
    *,
    buyer_id: int,
    lines: Sequence[Mapping[str, Any]],
    coupon_id: int | None = None,
    key: idempotency.Key | None = None,
    buyer_known: bool = False,
) -> dict[str, Any]:
    """Hold the units of every line, and the coupon, for a new ``shop`` order, or nothing;
    answers the new order's view. ``buyer_known``: the caller has just read the buyer
    (authenticated them), so placing does not read it again.

    Raises:
        InvalidInput: bad lines; SKUs of more than one seller.
        NotFound: no such SKU, coupon or buyer.
        NotAllowed: the buyer sells these SKUs; the coupon is someone else's.
        OutOfStock: a SKU has fewer units on sale than asked (named, with what is left).
        CouponUnusable: the coupon is expired, used, locked by another order, another
            seller's, or the order is below its minimum.
    """
    wanted = wanted_lines(lines)
    if coupon_id is not None:
        coupon_id = _count(coupon_id, "coupon_id", low=1, high=2**63 - 1)
    deps.policy.durations(SHOP_ORDER_TYPE)
    now = deps.clock.now()
    async with deps.db.write() as conn:
        found = {r.id: r for r in await shop.many(conn, skus, list(wanted))}
        missing = [sku_id for sku_id in wanted if sku_id not in found]
        if missing:
            raise NotFound(f"no sku {', '.join(map(str, missing))}")
        sellers = {r.seller_id for r in found.values()}
        if len(sellers) > 1:
            raise InvalidInput("one order buys from one seller; these SKUs have several")
        (seller_id,) = sellers
        if seller_id == buyer_id:
            raise NotAllowed("you cannot buy your own SKUs")
        if not buyer_known:
            await _user(conn, buyer_id)
        # Refused before anything is written: a rush is mostly refusals.
        for sku_id, quantity in wanted.items():
            if found[sku_id].stock < quantity:
                row = found[sku_id]
                raise OutOfStock(f"sku {sku_id} ({row.title}): {row.stock} left, {quantity} asked")
        held = [
            holds.Line("sku", sku_id, found[sku_id].title, found[sku_id].price, quantity)
            for sku_id, quantity in wanted.items()
        ]
        total = sum((line.price * line.quantity for line in held), start=Decimal(0))
        coupon = None
        if coupon_id is not None:
            coupon = _usable(
                await shop.coupon(conn, coupon_id), coupon_id, buyer_id, seller_id, total, now
            )
            held.append(holds.Line("coupon", coupon.id, coupon.title, coupon.amount_off))
        amount = _at_least_a_cent(total - (coupon.amount_off if coupon else 0))
        detail = ", ".join(f"sku {i} x{q}" for i, q in wanted.items())
        if coupon is not None:
            detail += f", coupon {coupon.id}"
        placed, armed = await _insert(
            conn,
            deps,
            buyer_id=buyer_id,
            seller_id=seller_id,
            order_type=SHOP_ORDER_TYPE,
            amount=amount,
            lines=held,
            key=key,
            now=now,
            detail=f"{detail} for {amount}",
        )
    await deps.arm(armed)
    return placed


async def place_flash_order(
    deps: Deps,
    *,
    buyer_id: int,
    flash_sale_id: int,
    quantity: int,
    key: idempotency.Key | None = None,
    buyer_known: bool = False,
) -> dict[str, Any]:
    """Hold units of a flash sale (and of its SKU) for a new ``flash`` order, or nothing;
    answers the new order's view. A sale out of units is refused by a read alone, the one
    read of the sale and its SKU.
    ``buyer_known``: as :func:`place_shop_order`.

    Raises:
        InvalidInput: bad quantity.
        NotFound: no such flash sale or buyer.
        NotAllowed: the buyer is the seller.
        SalesClosed: the sale has not started or has ended.
        OutOfStock: the sale (or its SKU) has fewer units than asked.
        PurchaseLimitExceeded: past the sale's per-buyer limit (counting what the buyer holds).
    """
    quantity = _count(quantity, "quantity", low=1, high=MAX_QUANTITY)
    deps.policy.durations(FLASH_ORDER_TYPE)
    now = deps.clock.now()
    async with deps.db.read() as conn:
        sale = (await conn.execute(_SALE_AND_TITLE, {"sale_id": flash_sale_id})).first()
    if sale is None:
        raise NotFound(f"no flash sale {flash_sale_id}")
    _check_window(sale, now)
    if sale.stock < quantity:
        raise OutOfStock(f"flash sale {sale.id}: {sale.stock} left, {quantity} asked")
    if sale.seller_id == buyer_id:
        raise NotAllowed("you cannot buy at your own flash sale")
    # Nothing is read again: what placing uses of the sale and its SKU (prices, seller,
    # window, title) never changes, and their units are taken by guarded updates.
    async with deps.db.write() as conn:
        if not buyer_known:
            await _user(conn, buyer_id)
        held = [
            holds.Line("sku", sale.sku_id, sale.sku_title, sale.price, quantity),
            holds.Line("flash", sale.id, f"flash sale {sale.id}", Decimal("0.00"), quantity),
        ]
        amount = _at_least_a_cent(sale.price * quantity)
        placed, armed = await _insert(
            conn,
            deps,
            buyer_id=buyer_id,
            seller_id=sale.seller_id,
            order_type=FLASH_ORDER_TYPE,
            amount=amount,
            lines=held,
            key=key,
            now=now,
            detail=f"flash sale {sale.id} x{quantity} for {amount}",
        )
    await deps.arm(armed)
    return placed


async def _insert(
    conn: AsyncConnection,
    deps: Deps,
    *,
    buyer_id: int,
    seller_id: int,
    order_type: str,
    amount: Decimal,
    lines: Sequence[holds.Line],
    key: idempotency.Key | None,
    now: datetime,
    detail: str,
) -> tuple[dict[str, Any], list[timers.Armed]]:
    """The order, its lines and its holds (each kind in the flow's order), its timers, its
    first event and its key."""
    order = await order_service.insert_placed(
        conn,
        deps,
        flow="shop",
        order_type=order_type,
        buyer_id=buyer_id,
        seller_id=seller_id,
        amount=amount,
        lines=lines,
        now=now,
    )
    holder = holds.Holder(order["id"], buyer_id)
    for kind in holds.FLOW_KINDS["shop"]:
        of_kind = [line for line in lines if line.kind == kind]
        if of_kind:
            await deps.holds.of(kind).hold(conn, holder, of_kind, now)
    return await order_service.finish_placing(conn, deps, order, lines, key, now=now, detail=detail)
