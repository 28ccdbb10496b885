"""The shows admin pages over the ASGI app on SQLite with a FakeClock: the list, a show's page
with its seat grid, counts and orders, the dashboard's seat counts, a tickets order's page,
escaping, and the session every admin page needs."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import timedelta
from decimal import Decimal

import httpx
import pytest

from dueflow.api.app import create_app
from dueflow.domain import seating
from dueflow.seatcache.base import SeatCache
from dueflow.service import accounts, orders, payments, tickets
from tests.unit.api.test_admin_pages import log_in


@pytest.fixture
async def client(world) -> AsyncIterator[httpx.AsyncClient]:
    """A client logged in as an admin."""
    _, token = await accounts.add_user(world.deps, "root", admin=True)
    app = create_app(world.deps, session_secret="s" * 32, session_ttl=timedelta(hours=1))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dueflow") as client:
        await log_in(client, token)
        yield client


async def sale(world) -> tuple[int, int, int]:
    """A show of A:1-4 (380) and B:1-4 (180): A-1, A-2 held by one order, B-3 sold to
    another. Returns (show, held order, paid order)."""
    show_id = await world.show("A:1-4,B:1-4")
    held = await world.seats(show_id, ["A-1", "A-2"])
    paid = await world.seats(show_id, ["B-3"], buyer=world.other)
    await payments.record_manual_payment(world.deps, order_id=paid["id"], amount="180.00")
    return show_id, held["id"], paid["id"]


def seats_of(html: str) -> dict[str, tuple[str, str | None]]:
    """Seat label -> (its classes, the link it has or None), from the drawn grid."""
    grid = html[html.index('id="seat-map"') :]
    found = {}
    for tag, attrs in re.findall(r"<(a|span) (class=\"seat [^\"]*\"[^>]*)>", grid):
        label = re.search(r'data-seat="([^"]+)"', attrs)
        if label is None:  # the legend's samples
            continue
        classes = re.search(r'class="([^"]+)"', attrs).group(1)
        href = re.search(r'href="([^"]+)"', attrs)
        assert (tag == "a") == (href is not None)
        found[label.group(1)] = (classes, href.group(1) if href else None)
    return found


async def test_the_show_page_draws_every_seat_in_its_state_linking_to_its_order(client, world):
    show_id, held, paid = await sale(world)
    page = await client.get(f"/admin/shows/{show_id}")
    assert page.status_code == 200
    assert "Winter concert" in page.text and "Hall 1" in page.text
    seats = seats_of(page.text)
    assert len(seats) == 8
    assert seats["A-1"] == seats["A-2"] == ("seat held", f"/admin/orders/{held}")
    assert seats["B-3"] == ("seat sold", f"/admin/orders/{paid}")
    free = {label for label, (classes, _) in seats.items() if classes == "seat free"}
    assert free == {"A-3", "A-4", "B-1", "B-2", "B-4"}
    assert all(seats[label][1] is None for label in free)
    # The legend names each state by its own class.
    legend = page.text[page.text.index('class="legend"') :]
    for state in ("free", "held", "sold"):
        assert f'<span class="seat {state}">' in legend
    # Sections in the show's order, each its own block.
    assert page.text.index("Section A") < page.text.index("Section B")
    counts = page.text[page.text.index('id="seat-counts"') : page.text.index('id="seat-map"')]
    assert re.search(r"<b>5</b> free", counts)
    assert re.search(r"<b>2</b> held", counts)
    assert re.search(r"<b>1</b> sold", counts)


async def test_the_show_page_lists_its_orders_newest_first(client, world):
    show_id, held, paid = await sale(world)
    cancelled = await world.seats(show_id, ["A-4"])
    await orders.cancel_by_buyer(world.deps, order_id=cancelled["id"], user_id=world.buyer)
    page = await client.get(f"/admin/shows/{show_id}")
    table = page.text[page.text.index('id="show-orders"') :]
    rows = re.findall(r'<a href="/admin/orders/(\d+)">', table)
    assert rows == [str(cancelled["id"]), str(paid), str(held)]
    row_of_held = table[table.index(f'href="/admin/orders/{held}"') :].split("</tr>")[0]
    assert "pending_payment" in row_of_held and "¥760.00" in row_of_held
    assert "A-1, A-2" in row_of_held
    row_of_paid = table[table.index(f'href="/admin/orders/{paid}"') :].split("</tr>")[0]
    assert "paid" in row_of_paid and "B-3" in row_of_paid
    # The cancelled order let A-4 go: free again, no link.
    assert seats_of(page.text)["A-4"] == ("seat free", None)
    assert "cancelled_unpaid" in table


async def test_the_show_list_counts_each_shows_seats_newest_first(client, world):
    first, _, _ = await sale(world)
    second = await world.show("A:1-3")
    page = await client.get("/admin/shows")
    assert page.status_code == 200
    table = page.text[page.text.index('id="shows"') :]
    linked = re.findall(r'<td><a href="/admin/shows/(\d+)">', table)
    assert linked == [str(second), str(first)]
    row_of_first = table[table.index(f'href="/admin/shows/{first}"') :].split("</tr>")[0]
    cells = re.findall(r'<td class="num">(\d+)</td>', row_of_first)
    assert cells == ["5", "2", "1"]
    row_of_second = table[table.index(f'href="/admin/shows/{second}"') :].split("</tr>")[0]
    assert re.findall(r'<td class="num">(\d+)</td>', row_of_second) == ["3", "0", "0"]
    assert "on_sale" in row_of_first and "Hall 1" in row_of_first


async def test_the_dashboard_counts_held_and_sold_seats_of_every_show(client, world):
    await sale(world)
    other = await world.show("A:1-5")
    await world.seats(other, ["A-1", "A-2", "A-3"])
    page = await client.get("/admin")
    assert page.status_code == 200
    assert re.search(r'id="seats-held"><b>5</b> seats held', page.text)
    assert re.search(r'id="seats-sold"><b>1</b> seats sold', page.text)
    assert '<a href="/admin/shows"' in page.text  # the nav


async def test_a_tickets_orders_page_shows_its_seats_and_ticket_codes(client, world):
    show_id, held, paid = await sale(world)
    page = await client.get(f"/admin/orders/{paid}")
    assert page.status_code == 200
    assert "ticket (tickets)" in page.text
    assert f'<a href="/admin/shows/{show_id}">#{show_id}</a>' in page.text
    view = await orders.order_view(world.deps, paid)
    [ticket] = view["tickets"]
    tickets_table = page.text[page.text.index('id="order-tickets"') :].split("</table>")[0]
    assert f"<code>{ticket['code']}</code>" in tickets_table and "B-3" in tickets_table
    lines = page.text[page.text.index('id="order-lines"') :].split("</table>")[0]
    assert "B-3" in lines and "¥180.00" in lines
    unpaid = await client.get(f"/admin/orders/{held}")
    lines = unpaid.text[unpaid.text.index('id="order-lines"') :].split("</table>")[0]
    assert "A-1" in lines and "A-2" in lines
    assert "issued when the order is paid" in unpaid.text
    # A goods order's page has no seats section.
    goods_order = await orders.place_order(
        world.deps, buyer_id=world.buyer, goods_id=await world.goods()
    )
    goods_page = await client.get(f"/admin/orders/{goods_order}")
    assert 'id="order-lines"' not in goods_page.text
    assert "normal (marketplace)" in goods_page.text


async def test_a_show_title_with_markup_renders_as_text(client, world):
    script = "<script>alert('x')</script>"
    now = world.clock.now()
    show_id = await tickets.create_show(
        world.deps,
        organizer_id=world.seller,
        title=f"{script} & co",
        venue='<img src=x onerror="alert(1)">',
        starts_at=now + timedelta(days=2),
        sales_close_at=now + timedelta(days=1),
        seat_limit=4,
        seats=seating.parse_ranges("A:1-2", {"A": Decimal("10.00")}),
    )
    for path in (f"/admin/shows/{show_id}", "/admin/shows"):
        page = await client.get(path)
        assert page.status_code == 200
        assert "<script>alert" not in page.text and "<img src=x" not in page.text
        assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; co" in page.text
        assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in page.text


async def test_a_section_with_rows_is_drawn_row_by_row_in_seat_number_order(client, world):
    now = world.clock.now()
    labels = ["P-B-2", "P-B-1", "P-A-1", "P-A-2", "P-A-3", "Q-1"]
    show_id = await tickets.create_show(
        world.deps,
        organizer_id=world.seller,
        title="Stalls",
        venue="Hall 2",
        starts_at=now + timedelta(days=2),
        sales_close_at=now + timedelta(days=1),
        seat_limit=4,
        seats=[seating.seat(label, Decimal("50.00")) for label in labels],
    )
    page = await client.get(f"/admin/shows/{show_id}")
    grid = page.text[page.text.index('id="seat-map"') :]
    rows = re.findall(r'<div class="seat-row">(.*?)</div>', grid, re.S)
    drawn = [
        (
            re.findall(r'<span class="row-name">([^<]+)</span>', row),
            re.findall(r'data-seat="([^"]+)"', row),
        )
        for row in rows
    ]
    assert drawn == [
        (["B"], ["P-B-1", "P-B-2"]),
        (["A"], ["P-A-1", "P-A-2", "P-A-3"]),
        ([], ["Q-1"]),
    ]
    assert grid.index("Section P") < grid.index("Section Q")


async def test_an_unknown_or_malformed_show_is_not_found(client, world):
    for path in ("/admin/shows/999", "/admin/shows/abc", "/admin/shows/0", f"/admin/shows/{2**64}"):
        page = await client.get(path)
        assert page.status_code == 404, path
        assert "no show" in page.text


async def test_the_show_pages_need_an_admin_session(world):
    show_id = await world.show()
    _, user_token = await accounts.add_user(world.deps, "plain")
    app = create_app(world.deps, session_secret="s" * 32)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dueflow") as client:
        for path in ("/admin/shows", f"/admin/shows/{show_id}"):
            # No session, and a user's API token is no session either.
            for headers in ({}, {"Authorization": f"Bearer {user_token}"}):
                answer = await client.get(path, headers=headers)
                assert answer.status_code == 303
                assert answer.headers["location"] == f"/admin/login?next={path}"
        refused = await client.post("/admin/login", data={"token": user_token})
        assert refused.status_code == 401
        assert (await client.get("/admin/shows")).status_code == 303


class LyingCache(SeatCache):
    """A cache that says every seat of every show is free (a FLUSHALL'd, reloaded-empty one)."""

    async def moved(self, moves: Sequence[object]) -> None:
        return None

    async def states(self, show_id: int) -> Mapping[str, str] | None:
        return {}

    async def taken(self, show_id: int, labels: Sequence[str]) -> set[str] | None:
        return None

    async def load(self, show_id: int, states: Mapping[str, str]) -> int:
        return 0


async def test_a_seat_the_cache_calls_free_but_an_order_holds_is_marked_and_linked(client, world):
    show_id, held, _ = await sale(world)
    world.deps.seat_cache = LyingCache()
    page = await client.get(f"/admin/shows/{show_id}")
    seats = seats_of(page.text)
    assert seats["A-1"] == ("seat free stale", f"/admin/orders/{held}")
    assert seats["A-3"] == ("seat free", None)
    # The counts are the database's.
    counts = page.text[page.text.index('id="seat-counts"') : page.text.index('id="seat-map"')]
    assert re.search(r"<b>2</b> held", counts)
