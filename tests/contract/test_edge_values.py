"""Values at the edges on every database: the same largest order total (what one payment can
carry) and the same range of times are taken on SQLite, PostgreSQL and MariaDB, and what is past
them is refused the same way, holding nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from dueflow.domain import seating, times
from dueflow.domain.money import MAX_AMOUNT
from dueflow.exceptions import InvalidInput
from dueflow.service import shop, tickets
from tests.conftest import table_snapshot

TOP = str(MAX_AMOUNT)


async def test_the_largest_payable_total_is_the_same_on_every_database(backend_world):
    w = backend_world
    sku_id = await w.sku(stock=200, price=TOP)
    sale_id = await w.flash_sale(sku_id, stock=5, price=TOP, limit=5)
    show_id = await tickets.create_show(
        w.deps,
        organizer_id=w.seller,
        title="Gala",
        venue="Hall 1",
        starts_at=w.clock.now() + timedelta(days=30),
        sales_close_at=w.clock.now() + timedelta(days=29),
        seat_limit=4,
        seats=seating.parse_ranges("A:1-2", {"A": MAX_AMOUNT}),
    )
    before = await table_snapshot(w.deps)
    refusals = [
        lambda: w.shop_order({sku_id: 2}),  # 200,000,000.00: taken by SQLite before the fix
        lambda: w.shop_order({sku_id: 50}),  # taken by PostgreSQL and MariaDB before the fix
        lambda: w.shop_order({sku_id: 101}),  # past NUMERIC(12,2): unstorable_value there
        lambda: shop.place_flash_order(w.deps, buyer_id=w.buyer, flash_sale_id=sale_id, quantity=2),
        lambda: w.seats(show_id, ["A-1", "A-2"]),
    ]
    for placing in refusals:
        with pytest.raises(InvalidInput, match=f"above {TOP} yuan"):
            await placing()
    assert await table_snapshot(w.deps) == before
    placed = await w.shop_order({sku_id: 1})
    assert placed["amount"] == MAX_AMOUNT == w.deps.providers.largest_amount()


async def test_times_at_the_edges_are_stored_and_past_them_refused(backend_world):
    w = backend_world
    tpl = await shop.create_template(
        w.deps,
        seller_id=w.seller,
        title="forever",
        amount_off="1.00",
        min_amount="0",
        valid_from=datetime.fromisoformat("1000-01-01T08:00:00+08:00"),
        valid_until=datetime.fromisoformat("9999-12-31T11:59:59.999999-12:00"),
        total=1,
    )
    assert (tpl["valid_from"], tpl["valid_until"]) == (times.EARLIEST, times.LATEST)
    assert (await shop.template_view(w.deps, tpl["id"]))["valid_until"] == times.LATEST
    before = await table_snapshot(w.deps)
    for valid_from, valid_until, field in (
        ("0999-12-31T23:59:59+00:00", "2030-01-01T00:00:00+00:00", "valid_from"),
        ("0001-01-01T00:00:00+14:00", "2030-01-01T00:00:00+00:00", "valid_from"),
        ("2026-01-01T00:00:00+00:00", "9999-12-31T23:59:59-12:00", "valid_until"),
    ):
        with pytest.raises(InvalidInput, match=f"{field}: .* outside the times dueflow stores"):
            await shop.create_template(
                w.deps,
                seller_id=w.seller,
                title="t",
                amount_off="1.00",
                min_amount="0",
                valid_from=datetime.fromisoformat(valid_from),
                valid_until=datetime.fromisoformat(valid_until),
                total=1,
            )
    with pytest.raises(InvalidInput, match="starts_at: give the offset"):
        await tickets.create_show(
            w.deps,
            organizer_id=w.seller,
            title="t",
            venue="v",
            starts_at=datetime(2030, 1, 1),
            sales_close_at=datetime(2029, 1, 1, tzinfo=UTC),
            seat_limit=1,
            seats=seating.parse_ranges("A:1-1", {"A": Decimal("1.00")}),
        )
    assert await table_snapshot(w.deps) == before
