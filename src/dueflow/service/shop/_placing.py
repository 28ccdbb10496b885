"""Placing a shop order (SKU lines and a coupon) or a flash order: all its units and its
coupon or nothing, in one transaction, touching rows in id order."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Row, bindparam, select
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain.money import CENT
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
from dueflow.service.shop._rules import (
    FLASH_ORDER_TYPE,
    MAX_LINES,
    MAX_QUANTITY,
    SHOP_ORDER_TYPE,
    _count,
    _user,
)
from dueflow.store import holds, idempotency, shop, timers
from dueflow.store.schema import flash_sales, skus


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


def _check_window(sale: Row[Any], now: datetime) -> None:
    if now < sale.starts_at:
        raise SalesClosed(f"flash sale {sale.id} starts at {sale.starts_at.isoformat()}")
    if now >= sale.ends_at:
        raise SalesClosed(f"flash sale {sale.id} ended at {sale.ends_at.isoformat()}")


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
        raise InvalidInput(f"lines: 1 to {MAX_LINES} lines of sku_id and quantity", field="lines")
    wanted: dict[int, int] = {}
    for n, line in enumerate(lines):
        if not isinstance(line, Mapping):
            raise InvalidInput(
                "lines: each line is an object of sku_id and quantity", field=f"lines[{n}]"
            )
        sku_id = _count(
            line.get("sku_id"), "sku_id", low=1, high=2**63 - 1, field=f"lines[{n}].sku_id"
        )
        quantity = _count(
            line.get("quantity"),
            "quantity",
            low=1,
            high=MAX_QUANTITY,
            field=f"lines[{n}].quantity",
        )
        wanted[sku_id] = wanted.get(sku_id, 0) + quantity
        if wanted[sku_id] > MAX_QUANTITY:
            raise InvalidInput(
                f"quantity of sku {sku_id} is at most {MAX_QUANTITY}",
                field=f"lines[{n}].quantity",
            )
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
            raise InvalidInput(
                "one order buys from one seller; these SKUs have several", field="lines"
            )
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
    """The order, its lines, its timers, its first event and its key, then its holds (each
    kind in the flow's order).

    The holds come last: their guarded updates lock the rows every order of a rush updates
    (the SKU, the flash sale) until the commit, so nothing that needs no such lock is written
    while they are held. A hold refused rolls everything back, the timers and event with it."""
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
    placed = await order_service.finish_placing(
        conn, deps, order, lines, key, now=now, detail=detail
    )
    holder = holds.Holder(order["id"], buyer_id)
    for kind in holds.FLOW_KINDS["shop"]:
        of_kind = [line for line in lines if line.kind == kind]
        if of_kind:
            await deps.holds.of(kind).hold(conn, holder, of_kind, now)
    return placed
