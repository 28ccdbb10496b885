"""The shows routes over HTTP: a show's seat map says whether its seats are for sale, and a
show of 5,000 seats is put on sale in one body."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from tests.unit.api import Api, running_api


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
    await refused_for_sales_closed(api, show_id, "A-2")
    world.clock.advance(timedelta(days=1))
    await world.worker.drain()  # the unpaid order's deadline passed long ago
    started = await seat_map(api, show_id)
    assert set(states(started).values()) == {"not_for_sale"}
    assert started["sales"] == "started"
