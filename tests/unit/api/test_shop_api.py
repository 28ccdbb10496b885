"""The shop routes over HTTP (the real app, in process): SKUs, coupon templates and coupons,
flash sales, and shop and flash orders through ``POST /api/orders``; each route's success and
its failures (status and error code), a refusal changing nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest

from tests.conftest import table_snapshot
from tests.unit.api import Api, shop_world
from tests.unit.api.shop_world import (
    fails,
    new_coupon,
    new_flash_sale,
    new_sku,
    new_template,
    sku_counts,
    window,
)


@pytest.fixture
async def api(world) -> AsyncIterator[Api]:
    async with shop_world.shop_api(world.deps) as api:
        yield api


async def test_skus_are_created_read_and_restocked(api):
    answer = await api.call(
        "POST", "/api/skus", "seller", json={"title": "mug", "price": "25", "stock": 3}
    )
    assert answer.status_code == 201, answer.text
    sku = answer.json()
    assert (sku["price"], sku["stock"], sku["held"], sku["sold"], sku["stocked"]) == (
        "25.00",
        3,
        0,
        0,
        3,
    )
    assert sku["seller_id"] == api.ids["seller"]
    answer = await api.call("GET", f"/api/skus/{sku['id']}", "stranger")
    assert answer.status_code == 200 and answer.json()["title"] == "mug"
    answer = await api.call(
        "POST", f"/api/skus/{sku['id']}/restock", "seller", json={"quantity": 2}
    )
    assert answer.status_code == 200, answer.text
    assert (answer.json()["stock"], answer.json()["stocked"]) == (5, 5)

    before = await table_snapshot(api.deps)
    restock = f"/api/skus/{sku['id']}/restock"
    fails(await api.call("POST", restock, "stranger", json={"quantity": 2}), 403, "not_allowed")
    fails(await api.call("POST", restock, "seller", json={"quantity": 0}), 422, "invalid_input")
    fails(
        await api.call("POST", "/api/skus/999/restock", "seller", json={"quantity": 1}),
        404,
        "not_found",
        "no sku 999",
    )
    fails(await api.call("GET", "/api/skus/999", "seller"), 404, "not_found")
    fails(await api.call("GET", "/api/skus/0", "seller"), 422, "invalid_input")
    fails(await api.call("GET", f"/api/skus/{sku['id']}", None), 401, "unauthorized")
    for bad in (
        {"title": "mug", "price": "abc", "stock": 1},
        {"title": "mug", "price": "1.234", "stock": 1},
        {"title": "mug", "price": "0", "stock": 1},
        {"title": "mug", "price": 25, "stock": 1},
        {"title": "mug", "price": "2.00", "stock": -1},
        {"title": "mug", "price": "2.00", "stock": "1"},
        {"title": "", "price": "2.00", "stock": 1},
        {"title": "mug", "price": "2.00"},
        {"title": "mug", "price": "2.00", "stock": 1, "seller_id": 1},
    ):
        fails(await api.call("POST", "/api/skus", "seller", json=bad), 422, "invalid_input")
    assert await table_snapshot(api.deps) == before


async def test_coupon_templates_issued_and_listed(api):
    tpl = await new_template(api, total=1)
    assert (tpl["amount_off"], tpl["min_amount"], tpl["issued"]) == ("5.00", "20.00", 0)
    answer = await api.call("GET", f"/api/coupon-templates/{tpl['id']}", "stranger")
    assert answer.status_code == 200
    issue = f"/api/coupon-templates/{tpl['id']}/issue"
    answer = await api.call("POST", issue, "seller", json={"user_id": api.ids["buyer"]})
    assert answer.status_code == 201, answer.text
    coupon = answer.json()
    assert (coupon["state"], coupon["user_id"], coupon["order_id"]) == (
        "available",
        api.ids["buyer"],
        None,
    )
    answer = await api.call("GET", "/api/me/coupons", "buyer")
    assert answer.status_code == 200
    assert [(c["id"], c["amount_off"]) for c in answer.json()["coupons"]] == [
        (coupon["id"], "5.00")
    ]
    nothing = {"items": [], "next": None, "coupons": []}
    assert (await api.call("GET", "/api/me/coupons", "stranger")).json() == nothing
    # An admin may issue any template's coupons.
    other = await new_template(api)
    answer = await api.call(
        "POST",
        f"/api/coupon-templates/{other['id']}/issue",
        "admin",
        json={"user_id": api.ids["stranger"]},
    )
    assert answer.status_code == 201, answer.text

    before = await table_snapshot(api.deps)
    to_buyer = {"user_id": api.ids["buyer"]}
    fails(await api.call("POST", issue, "seller", json=to_buyer), 409, "coupon_unusable", "all 1")
    other_issue = f"/api/coupon-templates/{other['id']}/issue"
    fails(await api.call("POST", other_issue, "buyer", json=to_buyer), 403, "not_allowed")
    fails(
        await api.call("POST", other_issue, "seller", json={"user_id": 4242}),
        404,
        "not_found",
        "no user 4242",
    )
    fails(
        await api.call("POST", "/api/coupon-templates/999/issue", "seller", json=to_buyer),
        404,
        "not_found",
    )
    fails(await api.call("GET", "/api/coupon-templates/999", "seller"), 404, "not_found")
    valid_from, valid_until = window(api)
    good = {
        "title": "t",
        "amount_off": "1.00",
        "valid_from": valid_from,
        "valid_until": valid_until,
        "total": 1,
    }
    for change, words in (
        ({"valid_until": valid_from}, "valid_until must be after"),
        ({"valid_from": "yesterday"}, "not an ISO 8601 time"),
        ({"valid_from": "2026-03-01T12:00:00"}, "offset"),
        ({"amount_off": "1.5.0"}, "amount_off"),
        ({"total": 0}, "total"),
        ({"min_amount": "-1"}, "min_amount"),
    ):
        fails(
            await api.call("POST", "/api/coupon-templates", "seller", json={**good, **change}),
            422,
            "invalid_input",
            words,
        )
    assert await table_snapshot(api.deps) == before
    api.deps.clock.advance(timedelta(days=7))
    fails(await api.call("POST", other_issue, "seller", json=to_buyer), 409, "coupon_unusable")


async def test_flash_sales_created_and_read(api):
    sku_id = await new_sku(api, stock=10)
    starts_at, ends_at = window(api, lasts=timedelta(hours=1))
    body = {
        "sku_id": sku_id,
        "price": "9.90",
        "stock": 4,
        "starts_at": starts_at,
        "ends_at": ends_at,
        "per_buyer_limit": 2,
    }
    answer = await api.call("POST", "/api/flash-sales", "seller", json=body)
    assert answer.status_code == 201, answer.text
    sale = answer.json()
    assert (sale["price"], sale["stock"], sale["per_buyer_limit"]) == ("9.90", 4, 2)
    answer = await api.call("GET", f"/api/flash-sales/{sale['id']}", "buyer")
    assert answer.status_code == 200 and answer.json()["sku_id"] == sku_id

    before = await table_snapshot(api.deps)
    post = "/api/flash-sales"
    fails(await api.call("POST", post, "stranger", json=body), 403, "not_allowed")
    fails(await api.call("POST", post, "seller", json={**body, "sku_id": 999}), 404, "not_found")
    fails(
        await api.call("POST", post, "seller", json={**body, "stock": 11}),
        422,
        "invalid_input",
        "10 units on sale, not 11",
    )
    fails(
        await api.call("POST", post, "seller", json={**body, "ends_at": starts_at}),
        422,
        "invalid_input",
        "ends_at must be after",
    )
    for change in ({"price": "free"}, {"stock": 0}, {"per_buyer_limit": 0}, {"extra": 1}):
        fails(await api.call("POST", post, "seller", json={**body, **change}), 422, "invalid_input")
    fails(await api.call("GET", "/api/flash-sales/999", "buyer"), 404, "not_found")
    assert await table_snapshot(api.deps) == before


async def test_shop_and_flash_orders_over_http(api):
    sku_id = await new_sku(api, stock=5, price="25.00")
    coupon_id = await new_coupon(api)
    lines = {"lines": [{"sku_id": sku_id, "quantity": 2}], "coupon_id": coupon_id}
    answer = await api.call("POST", "/api/orders", "buyer", json=lines)
    assert answer.status_code == 201, answer.text
    placed = answer.json()
    assert (placed["order_type"], placed["amount"], placed["status"]) == (
        "shop",
        "45.00",
        "pending_payment",
    )
    assert [line["kind"] for line in placed["lines"]] == ["sku", "coupon"]
    answer = await api.call("GET", f"/api/orders/{placed['id']}", "seller")
    assert answer.status_code == 200 and answer.json()["lines"] == placed["lines"]

    sale_id = await new_flash_sale(api, sku_id, stock=2)
    flash = {"flash_sale_id": sale_id, "quantity": 1}
    answer = await api.call("POST", "/api/orders", "buyer", json=flash)
    assert answer.status_code == 201, answer.text
    assert (answer.json()["order_type"], answer.json()["amount"]) == ("flash", "1.00")

    answer = await api.call("POST", f"/api/orders/{placed['id']}/cancel", "buyer")
    assert answer.status_code == 200 and answer.json()["cancel_reason"] == "buyer_cancel"
    assert await sku_counts(api, sku_id) == (4, 1, 0)


async def test_shop_orders_refused_over_http(api):
    sku_id = await new_sku(api, stock=2)
    theirs = await new_sku(api, stock=2, who="stranger")
    someone_elses = await new_coupon(api, to="stranger")
    big = await new_coupon(api, min_amount="100.00")
    later = await new_flash_sale(api, sku_id, stock=1, starts=timedelta(hours=1))

    def units(q: int = 1, sku: int = sku_id) -> list[dict[str, int]]:
        return [{"sku_id": sku, "quantity": q}]

    cases: list[tuple[str, dict[str, Any], int, str, str]] = [
        ("buyer", {"lines": units(3)}, 409, "out_of_stock", f"sku {sku_id} (mug): 2 left"),
        ("buyer", {"lines": units(1, 999)}, 404, "not_found", "no sku 999"),
        ("buyer", {"lines": units() + units(1, theirs)}, 422, "invalid_input", "one seller"),
        ("seller", {"lines": units()}, 403, "not_allowed", "your own"),
        ("buyer", {"lines": units(), "coupon_id": someone_elses}, 403, "not_allowed", "not yours"),
        ("buyer", {"lines": units(), "coupon_id": big}, 409, "coupon_unusable", "at least"),
        ("buyer", {"flash_sale_id": later, "quantity": 1}, 409, "sales_closed", "starts at"),
        ("buyer", {"flash_sale_id": 999, "quantity": 1}, 404, "not_found", "no flash sale"),
        ("buyer", {"lines": units(), "order_type": "normal"}, 422, "invalid_input", "order_type"),
        ("buyer", {"lines": units(), "order_type": "flash"}, 422, "invalid_input", "order_type"),
        ("buyer", {"lines": units(0)}, 422, "invalid_input", "quantity"),
        ("buyer", {"lines": units(-1)}, 422, "invalid_input", "quantity"),
        ("buyer", {"lines": [{"sku_id": sku_id, "quantity": True}]}, 422, "invalid_input", ""),
        ("buyer", {"lines": [{"sku_id": sku_id, "quantity": "1"}]}, 422, "invalid_input", ""),
        ("buyer", {"lines": units() * 51}, 422, "invalid_input", "lines"),
        ("buyer", {"lines": []}, 422, "invalid_input", "lines"),
        ("buyer", {"coupon_id": big, "goods_id": 1}, 422, "invalid_input", "coupon_id"),
        ("buyer", {"lines": units(), "flash_sale_id": later}, 422, "invalid_input", "one of"),
        ("buyer", {"flash_sale_id": later}, 422, "invalid_input", "quantity"),
    ]
    before = await table_snapshot(api.deps)
    for who, body, status, code, words in cases:
        answer = await api.call("POST", "/api/orders", who, json=body)
        assert answer.status_code == status, (body, answer.text)
        assert answer.json()["error"]["code"] == code, (body, answer.text)
        assert words in answer.json()["error"]["message"], (body, answer.text)
    assert await table_snapshot(api.deps) == before


async def test_flash_limit_over_http(api):
    sku_id = await new_sku(api, stock=5)
    flash = {"flash_sale_id": await new_flash_sale(api, sku_id, stock=3), "quantity": 1}
    assert (await api.call("POST", "/api/orders", "buyer", json=flash)).status_code == 201
    before = await table_snapshot(api.deps)
    fails(
        await api.call("POST", "/api/orders", "buyer", json=flash),
        409,
        "purchase_limit_exceeded",
        "allows 1",
    )
    fails(
        await api.call("POST", "/api/orders", "stranger", json={**flash, "quantity": 4}),
        409,
        "out_of_stock",
        "2 left, 4 asked",
    )
    assert await table_snapshot(api.deps) == before
