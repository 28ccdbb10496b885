"""The shows routes over HTTP: a show's seat map says whether its seats are for sale, and a
show of 5,000 seats is put on sale in one body."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from tests.unit.api import Api, running_api, table_snapshot


@pytest.fixture
async def api(world) -> AsyncIterator[Api]:
    async with running_api(world.deps) as api:
        yield api


async def seat_map(api: Api, show_id: int) -> dict[str, Any]:
    answer = await api.call("GET", f"/api/shows/{show_id}/seats", "buyer")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def states(seat_map: dict[str, Any]) -> dict[str, str]:
    return {s["label"]: s["state"] for s in seat_map["seats"]}


async def refused_for_sales_closed(api: Api, show_id: int, label: str) -> None:
    body = {"show_id": show_id, "seats": [label]}
    answer = await api.call("POST", "/api/orders", "buyer", json=body)
    assert answer.status_code == 409, answer.text
    assert answer.json()["error"]["code"] == "sales_closed"


async def test_a_cancelled_shows_seats_are_not_for_sale(api, world):
    show_id = await api.show()
    await api.ticket_order(show_id, ["A-1"])
    on_sale = await seat_map(api, show_id)
    assert states(on_sale) == {
        "A-1": "held",
        "A-2": "free",
        "A-3": "free",
        "B-1": "free",
        "B-2": "free",
    }
    assert on_sale["sales"] == "open"
    answer = await api.call("POST", f"/api/shows/{show_id}/cancel", "seller")
    assert answer.status_code == 200, answer.text
    # A-1 stays held until the worker cancels its order; no other seat is for sale.
    cancelled = await seat_map(api, show_id)
    assert states(cancelled) == {
        "A-1": "held",
        "A-2": "not_for_sale",
        "A-3": "not_for_sale",
        "B-1": "not_for_sale",
        "B-2": "not_for_sale",
    }
    assert cancelled["sales"] == "cancelled"
    show = await api.call("GET", f"/api/shows/{show_id}", "buyer")
    assert (show.json()["status"], show.json()["sales"]) == ("cancelled", "cancelled")
    await refused_for_sales_closed(api, show_id, "A-2")
    await world.worker.drain()
    released = await seat_map(api, show_id)
    assert set(states(released).values()) == {"not_for_sale"}
    assert released["sales"] == "cancelled"


async def test_seats_are_not_for_sale_once_sales_close_or_the_show_starts(api, world):
    show_id = await api.show()  # sales close in 29 days, the show starts in 30
    await api.ticket_order(show_id, ["B-1"])
    world.clock.advance(timedelta(days=29))
    closed = await seat_map(api, show_id)
    assert Counter(states(closed).values()) == Counter(not_for_sale=4, held=1)
    assert closed["sales"] == "closed"
    show = await api.call("GET", f"/api/shows/{show_id}", "buyer")
    assert (show.json()["status"], show.json()["sales"]) == ("on_sale", "closed")
    await refused_for_sales_closed(api, show_id, "A-2")
    world.clock.advance(timedelta(days=1))
    await world.worker.drain()  # the unpaid order's deadline passed long ago
    started = await seat_map(api, show_id)
    assert set(states(started).values()) == {"not_for_sale"}
    assert started["sales"] == "started"


def new_show(api: Api, **seats: Any) -> dict[str, Any]:
    """A show's body, on sale for 29 days, with these seat fields."""
    now = api.deps.clock.now()
    return {
        "title": "Stadium night",
        "venue": "Stadium",
        "starts_at": (now + timedelta(days=30)).isoformat(),
        "sales_close_at": (now + timedelta(days=29)).isoformat(),
        **seats,
    }


async def test_a_show_of_5000_seats_is_put_on_sale_over_http(api):
    body = new_show(
        api,
        seat_ranges="A:1-2500, B:1-2499",
        prices={"A": "380.00", "B": "180"},
        seats=[{"label": "VIP-1", "price": "1280.00", "tier": "vip"}],
    )
    answer = await api.call("POST", "/api/shows", "seller", json=body)
    assert answer.status_code == 201, answer.text
    show = answer.json()
    assert show["seats"] == {"free": 5000, "held": 0, "sold": 0}
    listed = (await seat_map(api, show["id"]))["seats"]
    assert len(listed) == 5000
    by_label = {s["label"]: (s["section"], s["number"], s["tier"], s["price"]) for s in listed}
    assert by_label["VIP-1"] == ("VIP", 1, "vip", "1280.00")
    assert by_label["A-2500"] == ("A", 2500, "A", "380.00")
    assert by_label["B-1"] == ("B", 1, "B", "180.00")
    assert "B-2500" not in by_label
    answer = await api.call(
        "POST", "/api/orders", "buyer", json={"show_id": show["id"], "seats": ["A-2500", "B-7"]}
    )
    assert answer.status_code == 201, answer.text
    assert answer.json()["amount"] == "560.00"


async def test_bad_seat_ranges_are_refused_naming_the_problem_and_change_nothing(api):
    one = {"A": "10.00"}
    refusals = [
        ({"seat_ranges": "A:1-2500,B:1-2501", "prices": {"A": "1", "B": "1"}}, "1 to 5000 seats"),
        ({"seat_ranges": "A:1-9999," * 400 + "A:1-1", "prices": one}, "1 to 5000 seats"),
        ({"seat_ranges": "A:5-1", "prices": one}, "seat range 'A:5-1' runs backwards"),
        ({"seat_ranges": "A1-5", "prices": one}, "not a seat range: 'A1-5'"),
        ({"seat_ranges": "A:1-5,B:1-5", "prices": one}, "section B has no price"),
        ({"seat_ranges": "A:1-5", "prices": {"A": "1", "C": "1"}}, "no seat range of section C"),
        ({"seat_ranges": "A:1-5", "prices": {"A": "0"}}, "prices.A: amount 0 must be above 0"),
        ({"seat_ranges": "A:1-5", "prices": {"A-1": "1"}}, "prices.A-1"),
        (
            {"seat_ranges": "A:1-5", "prices": one, "seats": [{"label": "A-3", "price": "1"}]},
            "seat A-3 is listed twice",
        ),
        ({"seat_ranges": "A:1-5"}, "seat_ranges go with prices"),
        ({"prices": one, "seats": [{"label": "A-3", "price": "1"}]}, "seat_ranges go with"),
        ({}, "give the seats"),
    ]
    before = await table_snapshot(api.deps)
    for seats, words in refusals:
        answer = await api.call("POST", "/api/shows", "seller", json=new_show(api, **seats))
        assert answer.status_code == 422, (seats, answer.text)
        assert answer.json()["error"]["code"] == "invalid_input"
        assert words in answer.json()["error"]["message"], (seats, answer.text)
    assert await table_snapshot(api.deps) == before
