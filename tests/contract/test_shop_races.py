"""Real races in the shop on SQLite, PostgreSQL and MariaDB: the last units, one coupon, a
flash sale, a per-buyer limit, and lines in opposite orders.

Contenders run as several "processes" (:func:`tests.contract.race_harness.race`): each a
thread with its own event loop and Deps, released together by a barrier, its contenders started
together on connections of their own. Clocks are FakeClocks set to one instant. Every assertion
is on the database: the counts of each SKU and flash sale (stock + held + sold = stocked, none
below zero), the coupons, the per-buyer counts, the orders.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from decimal import Decimal

from sqlalchemy import select

from dueflow.exceptions import CouponUnusable, OutOfStock, PurchaseLimitExceeded
from dueflow.service import orders
from dueflow.service.payments import PaymentOutcome
from dueflow.store.schema import order_lines
from dueflow.store.schema import orders as t_orders
from tests.conftest import START
from tests.contract.race_harness import Body, buyers, race, rows
from tests.contract.shop_kit import (
    PROCESSES,
    all_balanced,
    buyer_units,
    cancelling,
    coupon_row,
    flashing,
    orders_of,
    paying,
    placing,
    sale_counts,
    sku_counts,
    split,
)

# --- many buyers, the last units --------------------------------------------------------------


async def test_fifty_buyers_for_the_last_three_units_three_orders(backend_world, backend_url):
    world = backend_world
    people = await buyers(world, 50, "rush")
    for round_no in range(3):
        # Round 0 buys the scarce SKU alone; the others take a plentiful SKU first (a lower
        # id, so it is taken first), which every refused order must leave untouched.
        plenty = await world.sku(stock=100, title=f"saucer {round_no}")
        scarce = await world.sku(stock=10, title=f"mug {round_no}")
        await world.shop_order({scarce: 7}, buyer=world.other)  # 3 left
        lines = [(scarce, 1)] if round_no == 0 else [(scarce, 1), (plenty, 1)]
        bodies = [placing(b, lines) for b in people]
        outcomes = await asyncio.to_thread(race, backend_url, START, bodies, processes=PROCESSES)
        won, refused = split(outcomes)
        assert len(won) == 3, Counter(map(repr, refused))
        assert len(refused) == 47
        assert all(isinstance(e, OutOfStock) for e in refused), Counter(map(repr, refused))
        assert all(
            e.message == f"sku {scarce} (mug {round_no}): 0 left, 1 asked" for e in refused
        ), Counter(e.message for e in refused)
        assert await sku_counts(world.deps, scarce) == (0, 10, 0, 10)
        taken = 0 if round_no == 0 else 3
        assert await sku_counts(world.deps, plenty) == (100 - taken, taken, 0, 100)
        placed = [o for o in await orders_of(world.deps, people) if o.status == "pending_payment"]
        assert sorted(o.id for o in placed) == sorted(won)
        assert {(o.status, o.order_type, o.amount) for o in placed} == {
            ("pending_payment", "shop", Decimal("25.00") * len(lines))
        }
        assert len({o.buyer_id for o in placed}) == 3
        held = await rows(world.deps, select(order_lines).where(order_lines.c.order_id.in_(won)))
        assert Counter((line.item_id, line.quantity) for line in held) == Counter(
            {(sku, 1): 3 for sku, _ in lines}
        )
        for order in placed:  # take the orders out of the next round's count
            await orders.cancel_by_buyer(world.deps, order_id=order.id, user_id=order.buyer_id)
        assert await sku_counts(world.deps, scarce) == (3, 7, 0, 10)
    await all_balanced(world.deps)


# --- one coupon, two orders -------------------------------------------------------------------


async def test_one_coupon_in_two_orders_at_once_is_locked_by_one(backend_world, backend_url):
    world = backend_world
    for round_no in range(6):
        first = await world.sku(stock=5, title=f"kettle {round_no}")
        # Even rounds: each order buys its own SKU, so only the coupon is contended; odd
        # rounds: both buy the same SKU too. From round 2 one order starts first, in turn.
        second = first if round_no % 2 else await world.sku(stock=5, title=f"pot {round_no}")
        coupon_id = await world.coupon(off="5.00", minimum="20.00")
        bodies = [placing(world.buyer, [(sku, 1)], coupon_id) for sku in (first, second)]
        outcomes = await asyncio.to_thread(
            race,
            backend_url,
            START,
            bodies,
            processes=2,
            first=None if round_no < 2 else round_no % 2,
        )
        won, refused = split(outcomes)
        assert len(won) == 1, outcomes
        (error,) = refused
        assert isinstance(error, CouponUnusable), error
        assert f"coupon {coupon_id} " in error.message, error.message
        (order_id,) = won
        held = await coupon_row(world.deps, coupon_id)
        assert (held.state, held.order_id) == ("locked", order_id)
        (placed,) = await rows(
            world.deps,
            select(t_orders)
            .join(order_lines, order_lines.c.order_id == t_orders.c.id)
            .where(order_lines.c.kind == "coupon", order_lines.c.item_id == coupon_id),
        )
        assert (placed.id, placed.amount) == (order_id, Decimal("20.00"))
        winner = outcomes.index(next(o for o in outcomes if o.error is None))
        if first == second:
            assert await sku_counts(world.deps, first) == (4, 1, 0, 5)
        else:  # the refused order's units went back with its transaction
            taken = [first, second][winner]
            untouched = [first, second][1 - winner]
            assert await sku_counts(world.deps, taken) == (4, 1, 0, 5)
            assert await sku_counts(world.deps, untouched) == (5, 0, 0, 5)
    assert len(await orders_of(world.deps, [world.buyer])) == 6
    await all_balanced(world.deps)


# --- a flash sale -----------------------------------------------------------------------------


async def test_flash_sale_of_ten_units_and_a_hundred_buyers_ten_orders(backend_world, backend_url):
    world = backend_world
    people = await buyers(world, 100, "flash")
    for round_no in range(2):
        sku_id = await world.sku(stock=50, title=f"phone {round_no}")
        sale_id = await world.flash_sale(sku_id, stock=10, price="9.90", limit=1)
        bodies = [flashing(b, sale_id) for b in people]
        outcomes = await asyncio.to_thread(race, backend_url, START, bodies, processes=PROCESSES)
        won, refused = split(outcomes)
        assert len(won) == 10, Counter(map(repr, refused))
        assert all(isinstance(e, OutOfStock) for e in refused), Counter(map(repr, refused))
        assert all(
            e.message.startswith(f"flash sale {sale_id}") and "0 left, 1 asked" in e.message
            for e in refused
        ), Counter(e.message for e in refused)
        assert await sale_counts(world.deps, sale_id) == (0, 10, 0, 10)
        assert await sku_counts(world.deps, sku_id) == (40, 10, 0, 50)
        placed = [o for o in await orders_of(world.deps, people) if o.id in won]
        assert len(placed) == 10
        assert {(o.status, o.order_type, o.amount) for o in placed} == {
            ("pending_payment", "flash", Decimal("9.90"))
        }
        assert await buyer_units(world.deps, sale_id) == {o.buyer_id: 1 for o in placed}
    await all_balanced(world.deps)


async def test_one_buyer_six_flash_orders_at_once_against_a_limit_of_two(
    backend_world, backend_url
):
    world = backend_world
    for round_no in range(3):
        sku_id = await world.sku(stock=20, title=f"watch {round_no}")
        sale_id = await world.flash_sale(sku_id, stock=10, price="9.90", limit=2)
        bodies = [flashing(world.buyer, sale_id) for _ in range(6)]
        outcomes = await asyncio.to_thread(race, backend_url, START, bodies, processes=3)
        won, refused = split(outcomes)
        assert len(won) == 2, outcomes
        assert all(isinstance(e, PurchaseLimitExceeded) for e in refused), refused
        assert await sale_counts(world.deps, sale_id) == (8, 2, 0, 10)
        assert await sku_counts(world.deps, sku_id) == (18, 2, 0, 20)
        assert await buyer_units(world.deps, sale_id) == {world.buyer: 2}
    await all_balanced(world.deps)


# --- lines in opposite orders, a cancel and a payment over the same SKUs ------------------------


async def test_opposite_line_orders_cancels_and_payments_never_deadlock(backend_world, backend_url):
    world = backend_world
    pairs = 5
    people = await buyers(world, 2 * pairs, "pair")
    for round_no in range(4):
        bodies: list[Body] = []
        watched: list[tuple[int, int]] = []
        for k in range(pairs):
            x = await world.sku(stock=20, title=f"left {round_no}.{k}")
            y = await world.sku(stock=20, title=f"right {round_no}.{k}")
            watched.append((x, y))
            to_cancel = await world.shop_order({y: 2, x: 2})
            to_pay = await world.shop_order({x: 3, y: 3})
            bodies += [
                placing(people[2 * k], [(x, 1), (y, 2)]),
                placing(people[2 * k + 1], [(y, 2), (x, 1)]),
                cancelling(world.buyer, to_cancel["id"]),
                paying(to_pay["id"], to_pay["amount"]),
            ]
        outcomes = await asyncio.to_thread(race, backend_url, START, bodies, processes=PROCESSES)
        assert [o.error for o in outcomes] == [None] * len(bodies), outcomes
        assert [o.value for o in outcomes[3::4]] == [PaymentOutcome.CONFIRMED] * pairs
        for x, y in watched:  # 1 + 1 held and 3 sold of x; 2 + 2 held and 3 sold of y
            assert await sku_counts(world.deps, x) == (15, 2, 3, 20)
            assert await sku_counts(world.deps, y) == (13, 4, 3, 20)
    await all_balanced(world.deps)
