"""What the shop races share: reading SKUs, flash sales, coupons and orders back, and the
contenders (:func:`tests.contract.race_harness.race` runs them)."""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from typing import Any

from sqlalchemy import select

from dueflow.service import orders, payments, shop
from dueflow.service.deps import Deps
from dueflow.service.payments import PaymentOutcome
from dueflow.store.schema import coupons, flash_buyers, flash_sales, order_events, skus
from dueflow.store.schema import orders as t_orders
from tests.contract.race_harness import Body, Outcome, rows

PROCESSES = 4


# --- reading the database ---------------------------------------------------------------------


async def one(deps: Deps, query: Any) -> Any:
    (row,) = await rows(deps, query)
    return row


def counts_of(row: Any) -> tuple[int, int, int, int]:
    """(stock, held, sold, stocked) of a SKU or flash sale row, after checking they balance."""
    found = (row.stock, row.held, row.sold, row.stocked)
    assert min(found) >= 0, found
    assert row.stock + row.held + row.sold == row.stocked, found
    return found


async def sku_counts(deps: Deps, sku_id: int) -> tuple[int, int, int, int]:
    return counts_of(await one(deps, select(skus).where(skus.c.id == sku_id)))


async def sale_counts(deps: Deps, sale_id: int) -> tuple[int, int, int, int]:
    return counts_of(await one(deps, select(flash_sales).where(flash_sales.c.id == sale_id)))


async def all_balanced(deps: Deps) -> None:
    """Every SKU and flash sale: stock + held + sold = stocked, none below zero."""
    for row in await rows(deps, select(skus)) + await rows(deps, select(flash_sales)):
        counts_of(row)


async def coupon_row(deps: Deps, coupon_id: int) -> Any:
    return await one(deps, select(coupons).where(coupons.c.id == coupon_id))


async def orders_of(deps: Deps, buyer_ids: list[int]) -> list[Any]:
    query = select(t_orders).where(t_orders.c.buyer_id.in_(buyer_ids)).order_by(t_orders.c.id)
    return await rows(deps, query)


async def buyer_units(deps: Deps, sale_id: int) -> dict[int, int]:
    """buyer id -> units counted against the sale's limit (rows at zero left out)."""
    query = select(flash_buyers).where(flash_buyers.c.flash_sale_id == sale_id)
    return {r.buyer_id: r.units for r in await rows(deps, query) if r.units}


async def events_of(deps: Deps, order_id: int) -> Counter[str]:
    query = select(order_events.c.event).where(order_events.c.order_id == order_id)
    return Counter(r.event for r in await rows(deps, query))


def placing(buyer_id: int, lines: list[tuple[int, int]], coupon_id: int | None = None) -> Body:
    """A contender placing a shop order of ``lines`` (sku id, quantity), in that order."""

    async def body(deps: Deps) -> int:
        placed = await shop.place_shop_order(
            deps,
            buyer_id=buyer_id,
            lines=[{"sku_id": s, "quantity": q} for s, q in lines],
            coupon_id=coupon_id,
        )
        return int(placed["id"])

    return body


def flashing(buyer_id: int, sale_id: int, quantity: int = 1) -> Body:
    async def body(deps: Deps) -> int:
        placed = await shop.place_flash_order(
            deps, buyer_id=buyer_id, flash_sale_id=sale_id, quantity=quantity
        )
        return int(placed["id"])

    return body


def split(outcomes: list[Outcome]) -> tuple[list[Any], list[BaseException]]:
    won = [o.value for o in outcomes if o.error is None]
    refused = [o.error for o in outcomes if o.error is not None]
    return won, refused


def cancelling(buyer_id: int, order_id: int) -> Body:
    async def body(deps: Deps) -> str:
        await orders.cancel_by_buyer(deps, order_id=order_id, user_id=buyer_id)
        return "cancelled"

    return body


def paying(order_id: int, amount: Decimal) -> Body:
    async def body(deps: Deps) -> PaymentOutcome:
        _, outcome = await payments.record_manual_payment(deps, order_id=order_id, amount=amount)
        return outcome

    return body
