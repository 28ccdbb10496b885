"""``POST /api/orders`` with an ``Idempotency-Key`` (the real app, in process): a retry gets
the first answer and takes nothing twice, whether the first answer was kept or lost; another
body with the key is a 409; bad keys are refused; requests racing with one key make one order;
a key lives 24 hours."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from dueflow.service import shop
from dueflow.store.schema import idempotency_keys
from tests.conftest import table_snapshot
from tests.unit.api import Api, shop_world
from tests.unit.api.shop_world import (
    fails,
    new_coupon,
    new_flash_sale,
    new_sku,
    order_count,
    sku_counts,
)

KEY = {"Idempotency-Key": "7f1c2a9e-0d4b-4c5e-9a8f-3b2d1e0f6a7c"}


@pytest.fixture
async def api(world) -> AsyncIterator[Api]:
    async with shop_world.shop_api(world.deps) as api:
        yield api


async def _place(api: Api, body: dict[str, Any], key: dict[str, Any] = KEY, who: str = "buyer"):
    return await api.call("POST", "/api/orders", who, json=body, headers=key)


async def test_a_retry_after_a_lost_answer_gets_the_first_answer(api):
    sku_id = await new_sku(api, stock=5)
    coupon_id = await new_coupon(api)
    body = {"lines": [{"sku_id": sku_id, "quantity": 2}], "coupon_id": coupon_id}
    first = await _place(api, body)
    assert first.status_code == 201, first.text
    assert await sku_counts(api, sku_id) == (3, 2, 0)
    before = await table_snapshot(api.deps)
    # The client never saw the answer and sends the request again, twice.
    for _ in range(2):
        again = await _place(api, body)
        assert again.status_code == 201
        assert again.content == first.content
    # The same body with its fields in another order is the same request.
    swapped = {"coupon_id": coupon_id, "lines": [{"quantity": 2, "sku_id": sku_id}]}
    assert (await _place(api, swapped)).content == first.content
    assert await table_snapshot(api.deps) == before
    assert await sku_counts(api, sku_id) == (3, 2, 0)


async def test_a_retry_after_the_answer_was_never_recorded_gets_the_order(api):
    """The first request committed its order and died before recording its answer."""
    sku_id = await new_sku(api, stock=5)
    body = {"lines": [{"sku_id": sku_id, "quantity": 1}]}
    first = await _place(api, body)
    async with api.deps.db.write() as conn:
        await conn.execute(update(idempotency_keys).values(status_code=None, body=None))
    again = await _place(api, body)
    assert again.status_code == 201, again.text
    assert again.json()["id"] == first.json()["id"]
    assert (
        again.json() == (await api.call("GET", f"/api/orders/{first.json()['id']}", "buyer")).json()
    )
    assert await sku_counts(api, sku_id) == (4, 1, 0)
    assert await order_count(api) == 1


async def test_the_key_with_another_body_is_a_conflict_and_changes_nothing(api):
    sku_id = await new_sku(api, stock=5)
    assert (await _place(api, {"lines": [{"sku_id": sku_id, "quantity": 1}]})).status_code == 201
    before = await table_snapshot(api.deps)
    for other in (
        {"lines": [{"sku_id": sku_id, "quantity": 2}]},
        {"lines": [{"sku_id": sku_id, "quantity": 1}], "coupon_id": 1},
        {"goods_id": 1},
    ):
        fails(await _place(api, other), 409, "idempotency_key_reused")
    assert await table_snapshot(api.deps) == before
    # Another buyer's key of the same text is theirs alone.
    answer = await _place(api, {"lines": [{"sku_id": sku_id, "quantity": 1}]}, who="stranger")
    assert answer.status_code == 201, answer.text
    assert await sku_counts(api, sku_id) == (3, 2, 0)


@pytest.mark.parametrize("key", ["two words", "x" * 256, "", "tab\there", "caf\u00e9"])
async def test_a_bad_key_is_refused(api, key):
    sku_id = await new_sku(api)
    before = await table_snapshot(api.deps)
    headers = {"Idempotency-Key": key.encode()}  # bytes: httpx sends UTF-8 as it is
    answer = await _place(api, {"lines": [{"sku_id": sku_id, "quantity": 1}]}, key=headers)
    fails(answer, 422, "invalid_input", "Idempotency-Key")
    assert await table_snapshot(api.deps) == before


async def test_the_longest_key_is_taken(api):
    sku_id = await new_sku(api)
    key = {"Idempotency-Key": "k" * 255}
    answer = await _place(api, {"lines": [{"sku_id": sku_id, "quantity": 1}]}, key=key)
    assert answer.status_code == 201, answer.text


async def test_two_requests_at_once_with_one_key_make_one_order(api, monkeypatch):
    sku_id = await new_sku(api, stock=10)
    body = {"lines": [{"sku_id": sku_id, "quantity": 3}]}
    placing = shop.place_shop_order
    tries = []

    async def counted(*args: Any, **kwargs: Any) -> dict[str, Any]:
        tries.append(kwargs["key"])
        return await placing(*args, **kwargs)

    monkeypatch.setattr(shop, "place_shop_order", counted)  # the real one, counted
    answers = await asyncio.gather(*(_place(api, body) for _ in range(4)))
    # They raced: more than one got past the key's first look and tried to place.
    assert len(tries) > 1
    assert {a.status_code for a in answers} == {201}, [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    assert all(a.json() == answers[0].json() for a in answers)
    assert await order_count(api) == 1
    assert await sku_counts(api, sku_id) == (7, 3, 0)


async def test_a_key_older_than_a_day_places_a_new_order(api):
    sku_id = await new_sku(api, stock=10)
    body = {"lines": [{"sku_id": sku_id, "quantity": 1}]}
    first = (await _place(api, body)).json()
    api.deps.clock.advance(timedelta(hours=24) - timedelta(seconds=1))
    assert (await _place(api, body)).json()["id"] == first["id"]
    api.deps.clock.advance(timedelta(seconds=1))
    second = await _place(api, body)
    assert second.status_code == 201, second.text
    assert second.json()["id"] != first["id"]
    assert (await _place(api, body)).content == second.content
    async with api.deps.db.read() as conn:
        rows = (await conn.execute(select(idempotency_keys))).all()
    assert [r.order_id for r in rows] == [second.json()["id"]]
    assert await sku_counts(api, sku_id) == (8, 2, 0)


async def test_a_refused_request_keeps_no_key(api):
    """A request that took nothing (out of stock) may be tried again with its key."""
    sku_id = await new_sku(api, stock=1)
    body = {"lines": [{"sku_id": sku_id, "quantity": 2}]}
    fails(await _place(api, body), 409, "out_of_stock")
    await api.call("POST", f"/api/skus/{sku_id}/restock", "seller", json={"quantity": 1})
    answer = await _place(api, body)
    assert answer.status_code == 201, answer.text
    assert json.loads(answer.content)["amount"] == "50.00"
    assert await sku_counts(api, sku_id) == (0, 2, 0)


@pytest.mark.parametrize("what", ["last_units", "coupon", "flash_limit"])
async def test_a_duplicate_racing_for_the_last_units_gets_the_first_answer(api, what):
    """The repeat's own placing is refused (the first took the units, the coupon, the buyer's
    limit): it answers the first order, not the refusal."""
    sku_id = await new_sku(api, stock=3 if what == "last_units" else 10)
    if what == "flash_limit":
        sale_id = await new_flash_sale(api, sku_id, stock=5)
        body: dict[str, Any] = {"flash_sale_id": sale_id, "quantity": 1}
    elif what == "coupon":
        body = {"lines": [{"sku_id": sku_id, "quantity": 1}], "coupon_id": await new_coupon(api)}
    else:
        body = {"lines": [{"sku_id": sku_id, "quantity": 3}]}
    answers = await asyncio.gather(*(_place(api, body) for _ in range(2)))
    assert [a.status_code for a in answers] == [201, 201], [a.text for a in answers]
    assert answers[0].json()["id"] == answers[1].json()["id"]
    assert await order_count(api) == 1
