"""Every refusal of the shop is a clear error and changes nothing: every table (SKUs, flash
sales and their buyers, coupons, orders, order lines, timers, events ...) reads the same before
and after."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from dueflow.exceptions import (
    CouponUnusable,
    DueflowError,
    InvalidInput,
    NotAllowed,
    NotFound,
    OutOfStock,
    PurchaseLimitExceeded,
    SalesClosed,
)
from dueflow.service import payments, shop
from tests.conftest import table_snapshot


async def refused(world, error: type[DueflowError], words: str, call) -> None:
    """``call()`` raises ``error`` naming ``words`` and leaves every table as it was."""
    before = await table_snapshot(world.deps)
    with pytest.raises(error) as info:
        await call()
    assert type(info.value) is error, info.value
    assert words in info.value.message, info.value.message
    assert await table_snapshot(world.deps) == before


def order(world, lines: Any, coupon: Any = None, buyer: int | None = None):
    """A call placing a shop order of raw ``lines`` (dicts of sku_id and quantity)."""
    return lambda: shop.place_shop_order(
        world.deps,
        buyer_id=world.buyer if buyer is None else buyer,
        lines=lines,
        coupon_id=coupon,
    )


def units(world, sku_id: int, quantity: Any, coupon: Any = None):
    return order(world, [{"sku_id": sku_id, "quantity": quantity}], coupon)


async def template(world, *, seller: int | None = None, starts_in=timedelta(0), **terms):
    now = world.clock.now() + starts_in
    values = {
        "title": "5 off",
        "amount_off": "5.00",
        "min_amount": "20.00",
        "valid_from": now,
        "valid_until": now + timedelta(days=7),
        "total": 10,
        **terms,
    }
    return await shop.create_template(
        world.deps, seller_id=world.seller if seller is None else seller, **values
    )


async def issue(world, tpl, to: int | None = None) -> int:
    view = await shop.issue_coupon(
        world.deps,
        template_id=tpl["id"],
        issuer_id=tpl["seller_id"],
        user_id=world.buyer if to is None else to,
    )
    return int(view["id"])


async def test_out_of_stock_names_the_sku_and_what_is_left(world):
    plenty = await world.sku(stock=10, title="plenty")
    scarce = await world.sku(stock=3, title="scarce")
    await world.shop_order({scarce: 1}, buyer=world.other)
    both = [{"sku_id": plenty, "quantity": 2}, {"sku_id": scarce, "quantity": 3}]
    await refused(world, OutOfStock, f"sku {scarce} (scarce): 2 left, 3 asked", order(world, both))
    # Repeats of a SKU add up before they are compared with what is left.
    twice = [{"sku_id": scarce, "quantity": 2}, {"sku_id": scarce, "quantity": 1}]
    await refused(world, OutOfStock, "2 left, 3 asked", order(world, twice))
    empty = await world.sku(stock=0, title="empty")
    await refused(world, OutOfStock, f"sku {empty} (empty): 0 left", units(world, empty, 1))


async def test_skus_that_cannot_be_ordered_together_or_at_all(world):
    mine = await world.sku()
    await refused(world, NotFound, "no sku 999", units(world, 999, 1))
    await refused(
        world,
        NotFound,
        "no sku 998, 999",
        order(world, [{"sku_id": n, "quantity": 1} for n in (999, mine, 998)]),
    )
    theirs = await shop.create_sku(
        world.deps, seller_id=world.other, title="lamp", price="8.00", stock=5
    )
    two_sellers = [{"sku_id": mine, "quantity": 1}, {"sku_id": theirs["id"], "quantity": 1}]
    await refused(world, InvalidInput, "one seller", order(world, two_sellers))
    await refused(
        world,
        NotAllowed,
        "your own",
        order(world, [{"sku_id": mine, "quantity": 1}], buyer=world.seller),
    )
    await refused(
        world, NotFound, "no user 4242", order(world, [{"sku_id": mine, "quantity": 1}], buyer=4242)
    )


async def test_coupons_that_cannot_go_with_the_order(world):
    sku_id = await world.sku(stock=10, price="25.00")
    plain = await template(world)
    others = await issue(world, plain, to=world.other)
    await refused(
        world, NotAllowed, f"coupon {others} is not yours", units(world, sku_id, 1, others)
    )
    await refused(world, NotFound, "no coupon 777", units(world, sku_id, 1, 777))

    locked = await issue(world, plain)
    holder = await world.shop_order({sku_id: 1}, coupon=locked)
    await refused(
        world, CouponUnusable, f"locked by order {holder['id']}", units(world, sku_id, 1, locked)
    )
    used = await issue(world, plain)
    paid = await world.shop_order({sku_id: 1}, coupon=used)
    await payments.record_manual_payment(world.deps, order_id=paid["id"], amount=paid["amount"])
    await refused(world, CouponUnusable, f"coupon {used} was used", units(world, sku_id, 1, used))

    later = await issue(world, await template(world, starts_in=timedelta(hours=1)))
    await refused(world, CouponUnusable, "is valid from", units(world, sku_id, 1, later))
    elsewhere = await issue(world, await template(world, seller=world.other))
    await refused(world, CouponUnusable, "another seller's", units(world, sku_id, 1, elsewhere))
    big = await issue(world, await template(world, min_amount="50.01"))
    await refused(
        world,
        CouponUnusable,
        "at least 50.01; this one is 50.00",
        units(world, sku_id, 2, big),
    )
    for bad in (True, 0, -3, "9", 2**63):
        await refused(world, InvalidInput, "coupon_id", units(world, sku_id, 1, bad))

    short = await issue(
        world, await template(world, valid_until=world.clock.now() + timedelta(minutes=1))
    )
    world.clock.advance(timedelta(minutes=1))
    await refused(world, CouponUnusable, f"coupon {short} expired", units(world, sku_id, 1, short))


async def test_coupon_templates_and_issuing_refused(world):
    tpl = await template(world, total=1)
    await issue(world, tpl)
    await refused(
        world,
        CouponUnusable,
        f"all 1 coupons of template {tpl['id']} were issued",
        lambda: issue(world, tpl),
    )
    other_tpl = await template(world)
    await refused(
        world,
        NotAllowed,
        "only the seller",
        lambda: shop.issue_coupon(
            world.deps, template_id=other_tpl["id"], issuer_id=world.buyer, user_id=world.buyer
        ),
    )
    await refused(
        world,
        NotFound,
        "no coupon template 999",
        lambda: shop.issue_coupon(
            world.deps, template_id=999, issuer_id=world.seller, user_id=world.buyer
        ),
    )
    await refused(world, NotFound, "no user 4242", lambda: issue(world, other_tpl, to=4242))
    now = world.clock.now()
    bad_terms = [
        ({"amount_off": "abc"}, "not an amount"),
        ({"amount_off": "1.234"}, "two decimals"),
        ({"amount_off": "0"}, "above 0"),
        ({"min_amount": "-1"}, "min_amount"),
        ({"valid_until": now}, "valid_until must be after"),
        ({"total": 0}, "total"),
        ({"total": True}, "total"),
        ({"title": "  "}, "title"),
    ]
    for terms, words in bad_terms:
        await refused(world, InvalidInput, words, lambda t=terms: template(world, **t))
    await refused(world, NotFound, "no user 4242", lambda: template(world, seller=4242))
    world.clock.advance(timedelta(days=7))
    await refused(world, CouponUnusable, "expired", lambda: issue(world, other_tpl))


@pytest.mark.parametrize(
    ("lines", "words"),
    [
        ([], "1 to 50 lines"),
        ("sku 1", "1 to 50 lines"),
        ([{"sku_id": 1, "quantity": 1}] * 51, "1 to 50 lines"),
        ([{"sku_id": "SKU", "quantity": 1}], "sku_id"),
        ([{"quantity": 1}], "sku_id"),
        ([{"sku_id": 0, "quantity": 1}], "sku_id"),
        ([{"sku_id": "S", "quantity": 0}], "quantity"),
        ([{"sku_id": "S", "quantity": -2}], "quantity"),
        ([{"sku_id": "S", "quantity": True}], "quantity"),
        ([{"sku_id": "S", "quantity": 1.0}], "quantity"),
        ([{"sku_id": "S", "quantity": "2"}], "quantity"),
        ([{"sku_id": "S", "quantity": 10_001}], "quantity is a whole number from 1 to 10000"),
        ([{"sku_id": "S", "quantity": 10_000}, {"sku_id": "S", "quantity": 1}], "at most 10000"),
    ],
)
async def test_bad_lines(world, lines, words):
    sku_id = await world.sku(stock=20_000)
    lines = (
        [{k: (sku_id if v == "S" else v) for k, v in line.items()} for line in lines]
        if isinstance(lines, list)
        else lines
    )
    await refused(world, InvalidInput, words, order(world, lines))


async def test_flash_orders_refused(world):
    sku_id = await world.sku(stock=10)
    sale_id = await world.flash_sale(sku_id, stock=3, limit=2)

    def buy(quantity: Any = 1, buyer: int | None = None, sale: int = sale_id):
        return lambda: shop.place_flash_order(
            world.deps,
            buyer_id=world.buyer if buyer is None else buyer,
            flash_sale_id=sale,
            quantity=quantity,
        )

    await shop.place_flash_order(
        world.deps, buyer_id=world.other, flash_sale_id=sale_id, quantity=2
    )
    await refused(world, OutOfStock, f"flash sale {sale_id}: 1 left, 2 asked", buy(2))
    await refused(world, NotFound, "no flash sale 99", buy(sale=99))
    await refused(world, NotAllowed, "your own flash sale", buy(buyer=world.seller))
    await refused(world, NotFound, "no user 4242", buy(buyer=4242))
    for bad in (0, -1, True, 10_001, "1", None):
        await refused(world, InvalidInput, "quantity", buy(bad))
    await shop.place_flash_order(
        world.deps, buyer_id=world.buyer, flash_sale_id=sale_id, quantity=1
    )
    await shop.restock(world.deps, sku_id=sku_id, user_id=world.seller, quantity=1)
    wider = await world.flash_sale(sku_id, stock=5, limit=2)
    await shop.place_flash_order(world.deps, buyer_id=world.buyer, flash_sale_id=wider, quantity=2)
    await refused(
        world, PurchaseLimitExceeded, "you hold or bought 2 and asked for 1 more", buy(sale=wider)
    )
    world.clock.advance(timedelta(hours=1))
    await refused(world, SalesClosed, "ended at", buy(sale=wider))


async def test_skus_and_flash_sales_refused_at_creation(world):
    sku_id = await world.sku(stock=5)
    now = world.clock.now()

    def new_sku(**given: Any):
        values = {"seller_id": world.seller, "title": "mug", "price": "2.00", "stock": 1, **given}
        return lambda: shop.create_sku(world.deps, **values)

    for price in ("abc", "-1", "1.234", "", "1e3", 2.5, "0", "100000000.01"):
        await refused(world, InvalidInput, "amount", new_sku(price=price))
    for stock in (-1, True, "3", 10_000_001):
        await refused(world, InvalidInput, "stock", new_sku(stock=stock))
    for title in ("", " ", "a\x00b", "x" * 201, 7):
        await refused(world, InvalidInput, "title", new_sku(title=title))
    await refused(world, NotFound, "no user 4242", new_sku(seller_id=4242))

    def new_sale(**given: Any):
        values = {
            "seller_id": world.seller,
            "sku_id": sku_id,
            "price": "1.00",
            "stock": 2,
            "starts_at": now,
            "ends_at": now + timedelta(hours=1),
            "per_buyer_limit": 1,
            **given,
        }
        return lambda: shop.create_flash_sale(world.deps, **values)

    await refused(world, InvalidInput, "ends_at must be after", new_sale(ends_at=now))
    await refused(world, InvalidInput, "5 units on sale, not 6", new_sale(stock=6))
    await refused(world, InvalidInput, "not an amount", new_sale(price="free"))
    for stock in (0, -1, True):
        await refused(world, InvalidInput, "stock", new_sale(stock=stock))
    for limit in (0, True, 10_001):
        await refused(world, InvalidInput, "per_buyer_limit", new_sale(per_buyer_limit=limit))
    await refused(world, NotFound, "no sku 99", new_sale(sku_id=99))
    await refused(world, NotAllowed, "only the seller", new_sale(seller_id=world.other))
    for missing in (
        lambda: shop.sku_view(world.deps, 99),
        lambda: shop.flash_sale_view(world.deps, 99),
        lambda: shop.template_view(world.deps, 99),
    ):
        await refused(world, NotFound, "99", missing)
