"""The shop admin pages over the ASGI app on SQLite with a FakeClock: the SKU list and a SKU's
page (units, flash sales, newest orders), the flash sales with sold/held/left and their
windows, a buyer's coupons, a shop order's page (lines, coupon, notices sent), the navigation,
the broken shop invariants on the dashboard and in the summary, escaping, and the session
every admin page needs."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import update

from dueflow.api.app import create_app
from dueflow.service import accounts, orders, payments, shop
from dueflow.store.schema import flash_sales, skus, users
from tests.unit.api.test_admin_pages import log_in

PAGES = (
    "/admin/skus",
    "/admin/skus/1",
    "/admin/flash-sales",
    "/admin/coupons",
    "/admin/coupons?user=buyer",
    "/admin/users/1/coupons",
)


@pytest.fixture
async def admin(world) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """A client and an admin's token, not logged in yet."""
    _, token = await accounts.add_user(world.deps, "root", admin=True)
    app = create_app(world.deps, session_secret="s" * 32, session_ttl=timedelta(hours=1))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dueflow") as client:
        yield client, token


@pytest.fixture
async def client(admin) -> httpx.AsyncClient:
    """A client logged in as an admin."""
    client, token = admin
    await log_in(client, token)
    return client


async def pay(world, view) -> None:
    await payments.record_manual_payment(world.deps, order_id=view["id"], amount=view["amount"])


def row_of(html: str, table_id: str, href: str) -> str:
    """The table row (of the table with ``table_id``) that links to ``href``."""
    table = html[html.index(f'id="{table_id}"') :].split("</table>")[0]
    return table[table.index(f'href="{href}"') :].split("</tr>")[0]


def numbers(row: str) -> list[str]:
    return re.findall(r'<td class="num">([^<]*)</td>', row)


async def test_the_sku_list_counts_each_skus_units_newest_first(client, world):
    mug = await world.sku(stock=10, price="25.00", title="mug")
    spoon = await world.sku(stock=4, price="3.50", title="spoon")
    paid = await world.shop_order({mug: 3})
    await pay(world, paid)
    await world.shop_order({mug: 2, spoon: 1})
    page = await client.get("/admin/skus")
    assert page.status_code == 200
    table = page.text[page.text.index('id="skus"') :]
    assert re.findall(r'<td><a href="/admin/skus/(\d+)">', table) == [str(spoon), str(mug)]
    # price, stock, held, sold, stocked
    assert numbers(row_of(page.text, "skus", f"/admin/skus/{mug}")) == [
        "¥25.00",
        "5",
        "2",
        "3",
        "10",
    ]
    assert numbers(row_of(page.text, "skus", f"/admin/skus/{spoon}")) == [
        "¥3.50",
        "3",
        "1",
        "0",
        "4",
    ]
    assert "seller" in row_of(page.text, "skus", f"/admin/skus/{mug}")


async def test_an_empty_shop_says_so(client):
    assert "no SKUs yet" in (await client.get("/admin/skus")).text
    assert "no flash sales" in (await client.get("/admin/flash-sales")).text


async def test_a_skus_page_shows_its_units_flash_sales_and_newest_orders(client, world):
    mug = await world.sku(stock=10, price="25.00", title="mug")
    sale = await world.flash_sale(mug, stock=4, price="9.90", limit=2)
    first = await world.shop_order({mug: 2})
    await pay(world, first)
    flash = await shop.place_flash_order(
        world.deps, buyer_id=world.other, flash_sale_id=sale, quantity=2
    )
    cancelled = await world.shop_order({mug: 1})
    await orders.cancel_by_buyer(world.deps, order_id=cancelled["id"], user_id=world.buyer)
    page = await client.get(f"/admin/skus/{mug}")
    assert page.status_code == 200
    counts = page.text[page.text.index('id="sku-counts"') :].split("</section>")[0]
    # 10 stocked: 4 in the flash sale's quota are still SKU stock until ordered.
    for figure in ("<b>6</b> in stock", "<b>2</b> held", "<b>2</b> sold", "<b>10</b> stocked"):
        assert figure in counts
    sales = page.text[page.text.index('id="sku-flash-sales"') :].split("</table>")[0]
    assert f"#{sale}" in sales
    # price, sold, held, left, of, limit
    assert numbers(sales) == ["¥9.90", "0", "2", "2", "4", "2 a buyer"]
    assert "open" in sales
    table = page.text[page.text.index('id="sku-orders"') :]
    linked = re.findall(r'<a href="/admin/orders/(\d+)">', table)
    assert linked == [str(cancelled["id"]), str(flash["id"]), str(first["id"])]
    flash_row = row_of(page.text, "sku-orders", f"/admin/orders/{flash['id']}")
    assert "flash" in flash_row and "other" in flash_row and "pending_payment" in flash_row
    assert numbers(flash_row) == ["2", "¥9.90", "¥19.80"]
    paid_row = row_of(page.text, "sku-orders", f"/admin/orders/{first['id']}")
    assert "pending_shipment" in paid_row and numbers(paid_row) == ["2", "¥25.00", "¥50.00"]
    assert "cancelled_unpaid" in row_of(page.text, "sku-orders", f"/admin/orders/{cancelled['id']}")


async def test_the_flash_sales_show_sold_held_left_their_window_and_limit(client, world):
    mug = await world.sku(stock=20, title="mug")
    now = world.clock.now()

    async def sale(starts: timedelta, ends: timedelta, limit: int) -> int:
        view = await shop.create_flash_sale(
            world.deps,
            seller_id=world.seller,
            sku_id=mug,
            price="5.00",
            stock=5,
            starts_at=now + starts,
            ends_at=now + ends,
            per_buyer_limit=limit,
        )
        return int(view["id"])

    ended = await sale(timedelta(0), timedelta(minutes=1), 1)
    async with world.deps.db.write() as conn:  # its window passed (an ended one is refused)
        await conn.execute(
            update(flash_sales)
            .where(flash_sales.c.id == ended)
            .values(starts_at=now - timedelta(hours=2), ends_at=now - timedelta(hours=1))
        )
    live = await sale(timedelta(0), timedelta(hours=1), 3)
    upcoming = await sale(timedelta(days=1), timedelta(days=2), 2)
    bought = await shop.place_flash_order(
        world.deps, buyer_id=world.buyer, flash_sale_id=live, quantity=2
    )
    await pay(world, bought)
    await shop.place_flash_order(world.deps, buyer_id=world.other, flash_sale_id=live, quantity=1)
    page = await client.get("/admin/flash-sales")
    assert page.status_code == 200
    table = page.text[page.text.index('id="flash-sales"') :].split("</table>")[0]
    rows = table.split("<tr")[2:]  # past the head
    assert [re.search(r"<td>#(\d+)</td>", r).group(1) for r in rows] == [
        str(upcoming),
        str(live),
        str(ended),
    ]
    by_id = dict(zip((upcoming, live, ended), rows, strict=True))
    # price, sold, held, left, of, limit
    assert numbers(by_id[live]) == ["¥5.00", "2", "1", "2", "5", "3 a buyer"]
    assert numbers(by_id[ended]) == ["¥5.00", "0", "0", "5", "5", "1 a buyer"]
    assert "s-open" in by_id[live] and "s-ended" in by_id[ended]
    assert "s-upcoming" in by_id[upcoming]
    assert "2026-03-02 12:00:00 – 2026-03-03 12:00:00" in by_id[upcoming]
    assert f'href="/admin/skus/{mug}"' in by_id[live]


async def test_a_buyers_coupons_are_found_by_name_or_id_with_their_states(client, world):
    mug = await world.sku(stock=10, price="25.00")
    used = await world.coupon(off="5.00", minimum="20.00")
    locked = await world.coupon(off="3.00", minimum="0")
    await pay(world, await world.shop_order({mug: 1}, coupon=used))
    short = await shop.create_template(
        world.deps,
        seller_id=world.seller,
        title="half an hour",
        amount_off="1.00",
        min_amount="0",
        valid_from=world.clock.now(),
        valid_until=world.clock.now() + timedelta(minutes=30),
        total=1,
    )
    await shop.issue_coupon(
        world.deps, template_id=short["id"], issuer_id=world.seller, user_id=world.buyer
    )
    world.clock.advance(timedelta(minutes=31))  # the third expires (the session lasts)
    pending = await world.shop_order({mug: 1}, coupon=locked)
    found = await client.get("/admin/coupons?user=buyer")
    assert found.status_code == 303
    assert found.headers["location"] == f"/admin/users/{world.buyer}/coupons"
    by_id = await client.get(f"/admin/coupons?user=%23{world.buyer}")
    assert by_id.headers["location"] == f"/admin/users/{world.buyer}/coupons"
    page = await client.get(f"/admin/users/{world.buyer}/coupons")
    assert page.status_code == 200
    assert '<span id="coupon-owner">buyer</span>' in page.text
    table = page.text[page.text.index('id="coupons"') :].split("</table>")[0]
    rows = table.split("<tr")[2:]
    assert len(rows) == 3
    expired, held, spent = rows  # newest first
    assert "s-expired" in expired and "¥1.00" in expired
    assert "s-locked" in held and f'href="/admin/orders/{pending["id"]}"' in held
    assert "s-used" in spent and "¥5.00" in spent and "¥20.00" in spent
    assert "2026-03-01 12:00:00" in spent  # used at
    empty = await client.get(f"/admin/users/{world.other}/coupons")
    assert "no coupons" in empty.text
    form = await client.get("/admin/coupons")
    assert form.status_code == 200 and 'id="find-coupons"' in form.text
    assert 'id="coupons"' not in form.text


async def test_a_shop_orders_page_shows_its_lines_coupon_and_notices(client, world):
    mug = await world.sku(stock=10, price="19.99", title="mug")
    pot = await world.sku(stock=5, price="0.10", title="teapot")
    coupon_id = await world.coupon(off="5.00", minimum="20.00")
    view = await world.shop_order({mug: 2, pot: 3}, coupon=coupon_id)
    waiting = await client.get(f"/admin/orders/{view['id']}")
    assert "none</td>" in waiting.text.split('id="order-notices"')[1].split("</table>")[0]
    await orders.cancel_by_buyer(world.deps, order_id=view["id"], user_id=world.buyer)
    cancelled = await client.get(f"/admin/orders/{view['id']}")
    notices = cancelled.text.split('id="order-notices"')[1].split("</table>")[0]
    assert "the order_closed notice waits for the worker" in notices
    await world.worker.drain()
    page = await client.get(f"/admin/orders/{view['id']}")
    assert page.status_code == 200
    assert "2026-03-01 12:00:00 (buyer_cancel)" in page.text
    lines = page.text.split('id="order-lines"')[1].split("</table>")[0]
    mug_row = lines[lines.index(f'href="/admin/skus/{mug}"') :].split("</tr>")[0]
    assert "mug" in mug_row and numbers(mug_row) == ["2", "¥19.99", "¥39.98"]
    pot_row = lines[lines.index(f'href="/admin/skus/{pot}"') :].split("</tr>")[0]
    assert numbers(pot_row) == ["3", "¥0.10", "¥0.30"]
    assert "coupon" not in lines  # the coupon has its own place
    coupon = page.text.split('id="order-coupon"')[1].split("</p>")[0]
    assert f'href="/admin/users/{world.buyer}/coupons">coupon #{coupon_id}</a>' in coupon
    assert "5.00 off: ¥5.00 off" in coupon
    notices = page.text.split('id="order-notices"')[1].split("</table>")[0]
    assert "order_closed" in notices and "s-sent" in notices
    assert numbers(notices) == ["1"]  # one delivery


async def test_a_flash_orders_page_links_its_sale_and_goods_orders_have_no_lines(client, world):
    mug = await world.sku(stock=10, title="mug")
    sale = await world.flash_sale(mug, stock=3, price="9.90")
    flash = await shop.place_flash_order(
        world.deps, buyer_id=world.buyer, flash_sale_id=sale, quantity=1
    )
    page = await client.get(f"/admin/orders/{flash['id']}")
    lines = page.text.split('id="order-lines"')[1].split("</table>")[0]
    assert f"flash sale #{sale}</a>" in lines and f'href="/admin/skus/{mug}"' in lines
    assert page.text.split('id="order-coupon"')[1].startswith(">none</p>")
    goods_order = await orders.place_order(
        world.deps, buyer_id=world.buyer, goods_id=await world.goods()
    )
    plain = await client.get(f"/admin/orders/{goods_order}")
    assert plain.status_code == 200
    assert 'id="order-shop"' not in plain.text and 'id="order-notices"' in plain.text


async def test_the_navigation_links_the_shop_pages(client):
    page = await client.get("/admin/skus")
    nav = page.text[page.text.index("<nav>") : page.text.index("</nav>")]
    for href in ("/admin/skus", "/admin/flash-sales", "/admin/coupons"):
        assert f'href="{href}"' in nav
    assert '<a href="/admin/skus" aria-current="page">' in nav
    flash = await client.get("/admin/flash-sales")
    assert '<a href="/admin/flash-sales" aria-current="page">' in flash.text


async def test_titles_are_escaped(client, world):
    mug = await world.sku(title="<script>alert(1)</script>")
    for path in ("/admin/skus", f"/admin/skus/{mug}"):
        page = await client.get(path)
        assert "<script>alert" not in page.text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.text


async def test_the_dashboard_and_the_summary_name_a_broken_shop_invariant(admin, world):
    client, token = admin
    await log_in(client, token)
    mug = await world.sku(stock=10)
    await world.shop_order({mug: 2})
    assert 'id="invariants"><b>hold</b>' in (await client.get("/admin")).text
    async with world.deps.db.write() as conn:  # a held unit no order holds
        await conn.execute(update(skus).values(stock=skus.c.stock - 1, held=skus.c.held + 1))
    page = await client.get("/admin")
    assert 'id="invariants"><b>BROKEN</b>' in page.text
    assert f"<li>units_held_by_dead_order: {mug}</li>" in page.text
    headers = {"Authorization": f"Bearer {token}"}
    summary = (await client.get("/api/admin/summary", headers=headers)).json()
    assert summary["invariants"]["ok"] is False
    assert summary["invariants"]["units_held_by_dead_order"] == [mug]
    assert summary["invariants"]["coupons_used_twice"] == []


@pytest.mark.parametrize(
    "path",
    [
        "/admin/skus/424242",
        "/admin/skus/abc",
        "/admin/skus/0",
        "/admin/users/424242/coupons",
        "/admin/users/abc/coupons",
        "/admin/coupons?user=nobody",
        "/admin/coupons?user=424242",
    ],
)
async def test_a_missing_id_is_a_404_page(client, path):
    page = await client.get(path)
    assert page.status_code == 404
    assert "Not found" in page.text


async def test_the_pages_need_an_admins_session(admin, world):
    client, token = admin
    for path in PAGES:
        answer = await client.get(path)
        assert answer.status_code == 303, path
        assert answer.headers["location"].startswith("/admin/login?next=/admin")
    # A user who is no longer an admin loses the session on every page.
    await log_in(client, token)
    assert (await client.get("/admin/skus")).status_code == 200
    async with world.deps.db.write() as conn:
        await conn.execute(update(users).where(users.c.name == "root").values(is_admin=False))
    for path in PAGES:
        assert (await client.get(path)).status_code == 303, path
