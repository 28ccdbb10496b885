"""Values at the edges over HTTP: an order total no payment provider takes, times near the
calendar's edges, a flash sale whose window is over. Each is a 4xx naming the problem that
changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from dueflow.domain.money import MAX_AMOUNT
from tests.conftest import table_snapshot
from tests.unit.api import Api, shop_world
from tests.unit.api.shop_world import fails, new_flash_sale, new_sku, window

TOP = str(MAX_AMOUNT)  # 100000000.00: Alipay's largest trade, and the manual provider's


@pytest.fixture
async def api(world) -> AsyncIterator[Api]:
    async with shop_world.shop_api(world.deps) as api:
        yield api


async def _show(api: Api, price: str) -> int:
    now = api.deps.clock.now()
    body = {
        "title": "Gala",
        "venue": "Hall 1",
        "starts_at": (now + timedelta(days=30)).isoformat(),
        "sales_close_at": (now + timedelta(days=29)).isoformat(),
        "seat_limit": 4,
        "seats": [{"label": label, "price": price} for label in ("A-1", "A-2")],
    }
    answer = await api.call("POST", "/api/shows", "seller", json=body)
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


async def test_orders_no_provider_can_take_are_refused_holding_nothing(api):
    sku_id = await new_sku(api, stock=200, price=TOP)
    sale_id = await new_flash_sale(api, sku_id, stock=5, limit=5, price=TOP)
    show_id = await _show(api, TOP)
    before = await table_snapshot(api.deps)
    for body in (
        {"lines": [{"sku_id": sku_id, "quantity": 2}]},
        {"lines": [{"sku_id": sku_id, "quantity": 101}]},  # past NUMERIC(12,2) as well
        {"flash_sale_id": sale_id, "quantity": 2},
        {"show_id": show_id, "seats": ["A-1", "A-2"]},
    ):
        fails(
            await api.call("POST", "/api/orders", "buyer", json=body),
            422,
            "invalid_input",
            f"above {TOP} yuan",
        )
    assert await table_snapshot(api.deps) == before
    # The largest total one payment carries is still taken.
    answer = await api.call(
        "POST", "/api/orders", "buyer", json={"lines": [{"sku_id": sku_id, "quantity": 1}]}
    )
    assert answer.status_code == 201, answer.text
    assert answer.json()["amount"] == TOP


def _bodies(api: Api, sku_id: int) -> dict[str, tuple[str, dict[str, Any]]]:
    """Per route, a good body whose time fields the test replaces."""
    now = api.deps.clock.now()
    soon, later = (now + timedelta(days=1)).isoformat(), (now + timedelta(days=2)).isoformat()
    seats = [{"label": "A-1", "price": "10.00"}]
    return {
        "show": (
            "/api/shows",
            {
                "title": "t",
                "venue": "v",
                "starts_at": later,
                "sales_close_at": soon,
                "seats": seats,
            },
        ),
        "template": (
            "/api/coupon-templates",
            {
                "title": "t",
                "amount_off": "1.00",
                "valid_from": soon,
                "valid_until": later,
                "total": 1,
            },
        ),
        "flash": (
            "/api/flash-sales",
            {"sku_id": sku_id, "price": "1.00", "stock": 1, "starts_at": soon, "ends_at": later},
        ),
    }


FIELDS = [
    ("show", "starts_at"),
    ("show", "sales_close_at"),
    ("template", "valid_from"),
    ("template", "valid_until"),
    ("flash", "starts_at"),
    ("flash", "ends_at"),
]
EDGES = [
    ("9999-12-31T23:59:59-12:00", "outside the times"),  # past 9999 in UTC
    ("0001-01-01T00:00:00+14:00", "outside the times"),  # before year 1 in UTC
    ("0999-12-31T23:59:59+00:00", "outside the times"),  # before what MariaDB stores
    ("9999-12-31T23:59:59", "offset"),
    ("2026-13-01T00:00:00+00:00", "not an ISO 8601 time"),
]


async def test_every_time_field_refuses_what_it_cannot_store(api):
    sku_id = await new_sku(api, stock=10)
    bodies = _bodies(api, sku_id)
    before = await table_snapshot(api.deps)
    for route, field in FIELDS:
        url, body = bodies[route]
        for value, words in EDGES:
            answer = await api.call("POST", url, "seller", json={**body, field: value})
            fails(answer, 422, "invalid_input", field)
            fails(answer, 422, "invalid_input", words)
        fails(await api.call("POST", url, "seller", json={**body, field: 12}), 422, "invalid_input")
    assert await table_snapshot(api.deps) == before


async def test_times_at_the_edges_that_fit_are_stored(api):
    sku_id = await new_sku(api, stock=10)
    bodies = _bodies(api, sku_id)
    url, body = bodies["template"]
    edges = {"valid_from": "1000-01-01T08:00:00+08:00", "valid_until": "9999-12-31T23:59:59Z"}
    answer = await api.call("POST", url, "seller", json={**body, **edges})
    assert answer.status_code == 201, answer.text
    stored = answer.json()
    assert (stored["valid_from"], stored["valid_until"]) == (
        "1000-01-01T00:00:00+00:00",
        "9999-12-31T23:59:59+00:00",
    )
    url, body = bodies["flash"]
    answer = await api.call(
        "POST", url, "seller", json={**body, "ends_at": "9999-12-31T11:59:59-12:00"}
    )
    assert answer.status_code == 201, answer.text
    assert answer.json()["ends_at"] == "9999-12-31T23:59:59+00:00"


async def test_a_flash_sale_already_over_is_refused(api):
    sku_id = await new_sku(api, stock=10)
    before = await table_snapshot(api.deps)
    for starts, lasts, words in (
        (timedelta(hours=-2), timedelta(hours=1), "has passed"),
        (timedelta(hours=-1), timedelta(hours=1), "has passed"),  # ends right now
        (timedelta(hours=1), timedelta(0), "ends_at must be after starts_at"),
    ):
        starts_at, ends_at = window(api, starts=starts, lasts=lasts)
        body = {
            "sku_id": sku_id,
            "price": "1.00",
            "stock": 1,
            "starts_at": starts_at,
            "ends_at": ends_at,
        }
        fails(
            await api.call("POST", "/api/flash-sales", "seller", json=body),
            422,
            "invalid_input",
            words,
        )
    assert await table_snapshot(api.deps) == before
    # A sale that began an hour ago and is still on is taken.
    starts_at, ends_at = window(api, starts=timedelta(hours=-1), lasts=timedelta(hours=2))
    body = {
        "sku_id": sku_id,
        "price": "1.00",
        "stock": 1,
        "starts_at": starts_at,
        "ends_at": ends_at,
    }
    answer = await api.call("POST", "/api/flash-sales", "seller", json=body)
    assert answer.status_code == 201, answer.text
