"""The orders and users pages over the ASGI app (SQLite; the reads on every database are in
tests/contract/test_order_search.py): the list with its filters, search and pages, the CSV,
the dashboard's links to the list, the users pages, and names where ids were shown."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest

from dueflow.api.app import create_app
from dueflow.service import accounts, keys, orders, payments
from tests.unit.api.test_admin_pages import BASE, log_in
from tests.unit.test_refunds import unshipped_refund


@pytest.fixture
async def client(world) -> AsyncIterator[httpx.AsyncClient]:
    """A client logged in as an admin."""
    _, token = await accounts.add_user(world.deps, "root", admin=True)
    app = create_app(world.deps, session_secret="s" * 32, session_ttl=timedelta(hours=1))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        await log_in(c, token)
        yield c


def listed(html: str) -> list[int]:
    table = html[html.index('id="orders"') :]
    return [int(n) for n in re.findall(r'<td><a href="/admin/orders/(\d+)">', table)]


async def place(world, count: int) -> list[int]:
    return [
        await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=await world.goods())
        for _ in range(count)
    ]


async def test_the_pages_need_an_admin_session(world):
    app = create_app(world.deps, session_secret="s" * 32, session_ttl=timedelta(hours=1))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as anonymous:
        for path in (
            "/admin/orders",
            "/admin/orders.csv?flow=tickets",
            "/admin/users",
            "/admin/users/1",
        ):
            answer = await anonymous.get(path)
            assert answer.status_code == 303, path
            assert answer.headers["location"].startswith("/admin/login?next=/admin"), path


async def test_the_list_filters_searches_and_pages(client, world):
    order_id, _ = await unshipped_refund(world)
    placed = await place(world, 3)
    page = await client.get("/admin/orders")
    assert page.status_code == 200
    assert listed(page.text) == [*reversed(placed), order_id]
    assert f'<a href="/admin/users/{world.buyer}">buyer</a>' in page.text
    assert f'<a href="/admin/users/{world.seller}">seller</a>' in page.text

    kept = await client.get("/admin/orders", params={"status": "cancelled_unshipped"})
    assert listed(kept.text) == [order_id]
    assert "<option selected>cancelled_unshipped</option>" in kept.text
    [payment] = (await orders.order_view(world.deps, order_id))["payments"]
    by_pay_no = await client.get("/admin/orders", params={"q": payment["pay_no"]})
    assert listed(by_pay_no.text) == [order_id]
    none = await client.get("/admin/orders", params={"q": "no-such-thing"})
    assert listed(none.text) == [] and "no orders match" in none.text


async def test_the_next_link_walks_the_pages_with_the_filters(client, world, monkeypatch):
    from dueflow.api.admin_pages import orders as order_pages

    monkeypatch.setattr(order_pages, "PAGE_SIZE", 2)
    placed = await place(world, 5)
    seen, url = [], "/admin/orders?flow=marketplace&buyer=buyer"
    while url:
        page = await client.get(url)
        seen += listed(page.text)
        found = re.search(r'<a href="(/admin/orders\?[^"]+)" id="orders-next"', page.text)
        url = found.group(1).replace("&amp;", "&") if found else ""
        if url:
            assert "flow=marketplace" in url and "buyer=buyer" in url
    assert seen == list(reversed(placed))


async def test_bad_filters_and_cursors_answer_422(client):
    for query in ("status=lost", "flow=barter", "from=2026-02-30", "after=nonsense"):
        answer = await client.get(f"/admin/orders?{query}")
        assert answer.status_code == 422, query
        assert "Bad filter" in answer.text
    assert (await client.get("/admin/orders.csv?to=soon")).status_code == 422
    assert (await client.get("/admin/users?after=nonsense")).status_code == 422


async def test_the_csv_link_exports_what_is_filtered(client, world):
    order_id, _ = await unshipped_refund(world)
    await place(world, 2)
    page = await client.get("/admin/orders", params={"status": "cancelled_unshipped"})
    [link] = re.findall(r'<a href="([^"]+)" id="orders-csv"', page.text)
    assert link == "/admin/orders.csv?status=cancelled_unshipped"
    answer = await client.get(link)
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "text/csv; charset=utf-8"
    assert answer.headers["content-disposition"].startswith('attachment; filename="orders-')
    rows = list(csv.reader(io.StringIO(answer.text)))
    assert rows[0][:2] == ["order_id", "status"]
    assert [r[0] for r in rows[1:]] == [str(order_id)]
    everything = await client.get("/admin/orders.csv")
    assert len(list(csv.reader(io.StringIO(everything.text)))) == 1 + 3


async def test_the_old_find_box_still_opens_an_order(client, world):
    [order_id] = await place(world, 1)
    answer = await client.get("/admin/orders", params={"id": f"#{order_id}"})
    assert answer.status_code == 303
    assert answer.headers["location"] == f"/admin/orders/{order_id}"


async def test_the_dashboards_counts_link_to_the_filtered_list(client, world):
    await place(world, 2)
    page = await client.get("/admin")
    counts = page.text[page.text.index('id="orders-by-status"') :]
    assert '<a href="/admin/orders?status=pending_payment">2</a>' in counts


async def test_users_list_and_a_users_page(client, world):
    order_id, _ = await unshipped_refund(world)
    made, _ = await keys.add_key(
        world.deps, name="shop", scopes=["orders"], expires_at=None, by=f"user:{world.seller}"
    )
    users = await client.get("/admin/users")
    assert users.status_code == 200
    for name in ("root", "seller", "buyer", "other"):
        assert f">{name}</a>" in users.text
    seller = await client.get(f"/admin/users/{world.seller}")
    assert seller.status_code == 200
    assert f'<a href="/admin/orders?seller={world.seller}" id="sold">1 orders</a>' in seller.text
    assert f'<a href="/admin/orders?buyer={world.seller}" id="bought">0 orders</a>' in seller.text
    assert f'<a href="/admin/orders/{order_id}">#{order_id}</a>' in seller.text
    keys_table = seller.text[seller.text.index('id="user-keys"') :]
    assert f"<td>{made['id']}</td>" in keys_table and "<td>shop</td>" in keys_table
    assert "none (made by dueflow users add)" in seller.text
    assert (await client.get("/admin/users/999")).status_code == 404
    assert (await client.get("/admin/users/abc")).status_code == 404


async def test_people_are_named_where_their_ids_are_shown(client, world):
    order_id, _ = await unshipped_refund(world)
    order = await client.get(f"/admin/orders/{order_id}")
    people = order.text[order.text.index('id="order-people"') :]
    assert people.startswith(
        f'id="order-people"><a href="/admin/users/{world.buyer}">buyer</a> / '
        f'<a href="/admin/users/{world.seller}">seller</a>'
    )
    timeline = order.text[order.text.index('id="timeline"') :]
    # the seller's cancel, by name; the provider's and the system's moves as they are
    assert f'<td><a href="/admin/users/{world.seller}">seller</a></td>' in timeline
    show_id = await world.show(organizer=world.other)
    show = await client.get(f"/admin/shows/{show_id}")
    assert f'id="show-organizer"><a href="/admin/users/{world.other}">other</a>' in show.text
    await world.coupon()
    coupons = await client.get(f"/admin/users/{world.buyer}/coupons")
    assert f'<td><a href="/admin/users/{world.seller}">seller</a></td>' in coupons.text
    sku = await world.sku()
    await payments.record_manual_payment(
        world.deps, order_id=(await world.shop_order({sku: 1}))["id"], amount="25.00"
    )
    for path in ("/admin/skus", f"/admin/skus/{sku}"):
        assert f'<a href="/admin/users/{world.seller}">seller</a>' in (await client.get(path)).text
    assert (
        f'<a href="/admin/users/{world.buyer}">buyer</a>'
        in (await client.get(f"/admin/skus/{sku}")).text
    )
