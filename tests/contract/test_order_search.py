"""The operators' order list (service/order_search.py, store/order_search.py) on every database:
each filter, the search by each of its four kinds, cursor pages bound to their filters, the
CSV of every page, and the people reads (store/people.py)."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest
from sqlalchemy import update

from dueflow.exceptions import InvalidInput, NotFound
from dueflow.service import keys, order_search, orders, payments, people, refunds
from dueflow.store import schema
from dueflow.store.order_search import OrderFilter
from tests.conftest import START


async def ids(world, kept: OrderFilter, limit: int = 100) -> list[int]:
    page = await order_search.orders_page(world.deps, kept, after=None, limit=limit)
    assert page.next is None
    return [item["id"] for item in page.items]


async def place(world, count: int) -> list[int]:
    return [
        await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=await world.goods())
        for _ in range(count)
    ]


async def csv_rows(world, kept: OrderFilter) -> list[list[str]]:
    text = "".join([chunk async for chunk in order_search.orders_csv(world.deps, kept)])
    return list(csv.reader(io.StringIO(text)))


@pytest.fixture
async def shop(backend_world):
    """Orders of every kind the search finds: a plain one placed on day 1, a paid one with a
    refund on day 2 (the seller cancelled it), a show's paid order with its ticket on day 3
    (organized by ``other``). Returns ``(world, found)``: what each kind's search names."""
    world = backend_world
    plain = await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=await world.goods())
    world.clock.advance(timedelta(days=1))
    refunded = await orders.place_order(
        world.deps, buyer_id=world.buyer, goods_id=await world.goods()
    )
    pay_no, _ = await payments.record_manual_payment(world.deps, order_id=refunded, amount="12.50")
    await orders.cancel_by_seller(world.deps, order_id=refunded, user_id=world.seller)
    [refund] = await refunds.list_refunds(world.deps, state="pending_review")
    world.clock.advance(timedelta(days=1))
    show = await world.show(organizer=world.other)
    seats = await world.seats(show, ["A-1"])
    await payments.record_manual_payment(world.deps, order_id=seats["id"], amount=seats["amount"])
    [ticket] = (await orders.order_view(world.deps, seats["id"]))["tickets"]
    found = {
        "plain": plain,
        "refunded": refunded,
        "seats": seats["id"],
        "pay_no": pay_no,
        "refund_no": refund["refund_no"],
        "code": ticket["code"],
    }
    return world, found


async def test_every_order_newest_first_with_names(shop):
    world, found = shop
    page = await order_search.orders_page(world.deps, OrderFilter(), after=None, limit=10)
    assert [o["id"] for o in page.items] == [found["seats"], found["refunded"], found["plain"]]
    seats = page.items[0]
    assert (seats["buyer"], seats["seller"]) == ("buyer", "other")
    assert (seats["buyer_id"], seats["seller_id"]) == (world.buyer, world.other)
    assert page.items[1]["status"] == "cancelled_unshipped"


async def test_each_filter_keeps_its_orders(shop):
    world, found = shop
    given = {
        "status": ({"status": "pending_payment"}, [found["plain"]]),
        "flow": ({"flow": "tickets"}, [found["seats"]]),
        "buyer id": (
            {"buyer": str(world.buyer)},
            [found["seats"], found["refunded"], found["plain"]],
        ),
        "buyer name": ({"buyer": "other"}, []),
        "seller name": ({"seller": "seller"}, [found["refunded"], found["plain"]]),
        "seller id": ({"seller": str(world.other)}, [found["seats"]]),
        "unknown name": ({"seller": "nobody"}, []),
        "from day 2": ({"from": "2026-03-02"}, [found["seats"], found["refunded"]]),
        "to day 2": ({"to": "2026-03-02"}, [found["refunded"], found["plain"]]),
        "day 2 only": ({"from": "2026-03-02", "to": "2026-03-02"}, [found["refunded"]]),
        "before a time": (
            {"to": (START + timedelta(hours=1)).isoformat()},
            [found["plain"]],
        ),
        "two at once": (
            {"buyer": "buyer", "flow": "marketplace", "status": "cancelled_unshipped"},
            [found["refunded"]],
        ),
    }
    for name, (params, expected) in given.items():
        assert await ids(world, order_search.order_filter(params)) == expected, name


async def test_the_search_finds_an_order_by_each_of_its_four_kinds(shop):
    world, found = shop
    for text, expected in (
        (str(found["plain"]), found["plain"]),
        (f"#{found['seats']}", found["seats"]),
        (found["pay_no"], found["refunded"]),
        (found["refund_no"], found["refunded"]),
        (found["code"], found["seats"]),
    ):
        assert await ids(world, order_search.order_filter({"q": f" {text} "})) == [expected], text
    for text in ("999999", "nothing-like-it", found["code"][:-1], "9" * 30):
        assert await ids(world, order_search.order_filter({"q": text})) == [], text
    # with a filter too: both must hold
    both = order_search.order_filter({"q": found["pay_no"], "status": "pending_payment"})
    assert await ids(world, both) == []


async def test_pages_walk_every_order_once_and_their_cursor_keeps_its_filters(shop):
    world, found = shop
    extra = [
        await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=await world.goods())
        for _ in range(4)
    ]
    kept = order_search.order_filter({"flow": "marketplace"})
    seen, after = [], None
    while True:
        page = await order_search.orders_page(world.deps, kept, after=after, limit=2)
        seen += [o["id"] for o in page.items]
        if page.next is None:
            break
        after = page.next
    assert seen == [*reversed(extra), found["refunded"], found["plain"]]
    first = await order_search.orders_page(world.deps, kept, after=None, limit=2)
    other = order_search.order_filter({"flow": "tickets"})
    with pytest.raises(InvalidInput, match="other filters"):
        await order_search.orders_page(world.deps, other, after=first.next, limit=2)
    with pytest.raises(InvalidInput, match="not a cursor"):
        await order_search.orders_page(world.deps, kept, after="nonsense", limit=2)


async def test_the_csv_holds_every_filtered_order_over_many_pages(shop, monkeypatch):
    world, found = shop
    monkeypatch.setattr(order_search, "CSV_PAGE", 2)  # three pages for five orders
    extra = [
        await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=await world.goods())
        for _ in range(3)
    ]
    rows = await csv_rows(world, order_search.order_filter({"flow": "marketplace"}))
    assert rows[0] == list(order_search.CSV_HEADER)
    assert [int(r[0]) for r in rows[1:]] == [*reversed(extra), found["refunded"], found["plain"]]
    refunded = rows[4]
    assert refunded[1:6] == [
        "cancelled_unshipped",
        "marketplace",
        "normal",
        "12.50",
        (START + timedelta(days=1)).isoformat(),
    ]
    assert refunded[6:] == [str(world.buyer), "buyer", str(world.seller), "seller"]
    by_ticket = await csv_rows(world, order_search.order_filter({"q": found["code"]}))
    assert [r[0] for r in by_ticket] == ["order_id", str(found["seats"])]
    assert await csv_rows(world, order_search.order_filter({"status": "completed"})) == [
        list(order_search.CSV_HEADER)
    ]


async def test_bad_filters_are_refused_with_the_field(shop):
    for params, field in (
        ({"status": "lost"}, "status"),
        ({"flow": "barter"}, "flow"),
        ({"from": "2026-13-01"}, "from"),
        ({"to": "yesterday"}, "to"),
        ({"to": "2026-03-01T10:00:00"}, "to"),  # a time needs its offset
        ({"q": "x" * 65}, "q"),
    ):
        with pytest.raises(InvalidInput) as refused:
            order_search.order_filter(params)
        assert refused.value.field == field, params


async def test_users_pages_a_user_with_their_orders_and_keys(shop):
    world, found = shop
    page = await people.users_page(world.deps, after=None, limit=2)
    assert [u["name"] for u in page.items] == ["other", "buyer"]
    rest = await people.users_page(world.deps, after=page.next, limit=2)
    assert [u["name"] for u in rest.items] == ["seller"] and rest.next is None
    assert rest.items[0]["external_id"] is None and rest.items[0]["admin"] is False
    made, _ = await keys.add_key(
        world.deps, name="shop", scopes=["orders"], expires_at=None, by=f"user:{world.seller}"
    )
    await keys.add_key(world.deps, name="cli", scopes=["orders"], expires_at=None, by="cli")
    seller = await people.user_page(world.deps, world.seller, orders_shown=1)
    assert (seller["as_buyer"], seller["as_seller"]) == (0, 2)
    assert [o["id"] for o in seller["orders_as_seller"]] == [found["refunded"]]
    assert seller["orders_as_buyer"] == []
    assert [k["id"] for k in seller["keys"]] == [made["id"]]
    buyer = await people.user_page(world.deps, world.buyer, orders_shown=5)
    assert buyer["as_buyer"] == 3 and buyer["keys"] == []
    with pytest.raises(NotFound):
        await people.user_page(world.deps, 10**9, orders_shown=1)
    names = await people.names(world.deps, [world.buyer, world.other, None, 10**9])
    assert names == {world.buyer: "buyer", world.other: "other"}


async def test_a_span_of_times_is_paged_in_placing_order(shop):
    """Kept to placing times, the list is newest first by placing time, then id: an order
    numbered after another but placed before it (its time taken before its row was numbered)
    comes after it, and a walk through the pages shows every order of the span once, ties of
    one instant included."""
    world, found = shop
    late = await place(world, 3)  # all at day 3's instant: ties
    async with world.deps.db.write() as conn:
        await conn.execute(
            update(schema.orders)
            .where(schema.orders.c.id == late[1])
            .values(created_at=START + timedelta(days=1, hours=1))
        )
    kept = order_search.order_filter({"from": "2026-03-01", "to": "2026-03-03"})
    seen, after = [], None
    while True:
        page = await order_search.orders_page(world.deps, kept, after=after, limit=2)
        seen += [o["id"] for o in page.items]
        if page.next is None:
            break
        after = page.next
    # day 3: the two left of the late ones, then the show's order (ids descending in the tie);
    # day 2, an hour in: the one moved back; day 2: the refunded; day 1: the plain one
    assert seen == [late[2], late[0], found["seats"], late[1], found["refunded"], found["plain"]]
    text = "".join([chunk async for chunk in order_search.orders_csv(world.deps, kept)])
    assert [int(r[0]) for r in list(csv.reader(io.StringIO(text)))[1:]] == seen
    one_day = order_search.order_filter({"from": "2026-03-02", "to": "2026-03-02"})
    assert await ids(world, one_day) == [late[1], found["refunded"]]
