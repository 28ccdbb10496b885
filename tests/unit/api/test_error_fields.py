"""A 422 names the field it is about: FastAPI's validation errors by their location, a use
case's InvalidInput by the field it names, located where the route takes it (``body.``,
``query.``, ``path.``, ``header.``). Every refusal changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from tests.conftest import table_snapshot
from tests.unit.api import Api, shop_world
from tests.unit.api.shop_world import new_sku, window


@pytest.fixture
async def api(world) -> AsyncIterator[Api]:
    async with shop_world.shop_api(world.deps) as api:
        yield api


@dataclass
class Bad:
    """A bad request and the field its 422 names."""

    what: str
    method: str
    path: str
    field: str | None
    call: dict[str, Any] = field(default_factory=dict)
    who: str | None = "buyer"
    status: int = 422
    code: str = "invalid_input"


def show_body(api: Api, **given: Any) -> dict[str, Any]:
    now = api.deps.clock.now()
    return {
        "title": "Gala",
        "venue": "Hall 1",
        "starts_at": (now + timedelta(days=30)).isoformat(),
        "sales_close_at": (now + timedelta(days=29)).isoformat(),
        "seats": [{"label": "A-1", "price": "10.00"}],
        **given,
    }


async def bad_requests(api: Api) -> list[Bad]:
    sku_id = await new_sku(api, stock=5)
    order_id = await api.paid_order()
    valid_from, valid_until = window(api)
    now = api.deps.clock.now()
    after_the_show = (now + timedelta(days=31)).isoformat()
    key = await api.as_key("orders", None)
    return [
        # FastAPI's validation, by location
        Bad("a quantity of 0", "POST", "/api/orders", "body.lines[0].quantity",
            {"json": {"lines": [{"sku_id": sku_id, "quantity": 0}]}}),
        Bad("an id as text", "POST", "/api/orders", "body.goods_id", {"json": {"goods_id": "1"}}),
        Bad("an unknown field", "POST", "/api/goods", "body.colour",
            {"json": {"title": "mug", "price": "1.00", "colour": "red"}}, who="seller"),
        Bad("two kinds at once", "POST", "/api/orders", "body",
            {"json": {"goods_id": 1, "flash_sale_id": 1, "quantity": 1}}),
        Bad("a limit of 0", "GET", "/api/orders", "query.limit", {"params": {"limit": 0}}),
        Bad("an id of 0", "GET", "/api/orders/0", "path.order_id"),
        Bad("a rating of 6", "POST", f"/api/orders/{order_id}/reviews", "body.rating",
            {"json": {"rating": 6}}),
        Bad("a time without its offset", "POST", "/api/shows", "body.starts_at",
            {"json": show_body(api, starts_at="2026-03-01T12:00:00")}, who="seller"),
        # a use case's InvalidInput, located
        Bad("a price of three decimals", "POST", "/api/goods", "body.price",
            {"json": {"title": "mug", "price": "1.234"}}, who="seller"),
        Bad("one SKU past its limit over two lines", "POST", "/api/orders",
            "body.lines[1].quantity",
            {"json": {"lines": [{"sku_id": sku_id, "quantity": 6000},
                                {"sku_id": sku_id, "quantity": 6000}]}}),
        Bad("a bad Idempotency-Key", "POST", "/api/orders", "header.Idempotency-Key",
            {"json": {"goods_id": 1}, "headers": {"Idempotency-Key": "has space"}}),
        Bad("a cursor the feed never gave", "GET", "/api/events", "query.after",
            {"params": {"after": "nonsense"}}),
        Bad("a cursor the list never gave", "GET", "/api/orders", "query.after",
            {"params": {"after": "nonsense"}}),
        Bad("sales closing after the show", "POST", "/api/shows", "body.sales_close_at",
            {"json": show_body(api, sales_close_at=after_the_show)}, who="seller"),
        Bad("a seat's price", "POST", "/api/shows", "body.seats[0].price",
            {"json": show_body(api, seats=[{"label": "A-1", "price": "0.00"}])}, who="seller"),
        Bad("a template ending before it starts", "POST", "/api/coupon-templates",
            "body.valid_until",
            {"json": {"title": "5 off", "amount_off": "5.00", "min_amount": "0",
                      "valid_from": valid_until, "valid_until": valid_from, "total": 1}},
            who="seller"),
        Bad("a flash sale of more units than on sale", "POST", "/api/flash-sales", "body.stock",
            {"json": {"sku_id": sku_id, "price": "9.00", "stock": 6, "per_buyer_limit": 1,
                      "starts_at": valid_from, "ends_at": valid_until}}, who="seller"),
        Bad("a name taken", "POST", "/api/admin/users", "body.name",
            {"json": {"name": "api-buyer"}}, who="admin"),
        Bad("a manual payment started by the buyer", "POST",
            f"/api/orders/{await api.order()}/payments", "body.provider",
            {"json": {"provider": "manual"}}),
        Bad("a blank tracking number", "POST", f"/api/orders/{order_id}/ship",
            "body.tracking_no", {"json": {"carrier": "SF", "tracking_no": " "}}, who="seller"),
        Bad("an unknown scope", "POST", "/api/admin/keys", "body.scopes",
            {"json": {"name": "shop", "scopes": ["shipping"]}}, who="admin"),
        Bad("a key expiring in the past", "POST", "/api/admin/keys", "body.expires_at",
            {"json": {"name": "shop", "scopes": ["orders"],
                      "expires_at": (now - timedelta(days=1)).isoformat()}}, who="admin"),
        Bad("a bad Idempotency-Key on a keyed route", "POST", "/api/goods",
            "header.Idempotency-Key",
            {"json": {"title": "mug", "price": "1.00"}, "headers": {"Idempotency-Key": "a b"}},
            who="seller"),
        Bad("a webhook URL that is not http(s)", "POST", "/api/admin/webhooks", "body.url",
            {"json": {"url": "ftp://host.example/hooks"}}, who="admin",
            code="unsafe_webhook_url"),
        Bad("a webhook filter naming no event type", "POST", "/api/admin/webhooks",
            "body.event_types[1]",
            {"json": {"url": "https://host.example/hooks", "event_types": ["place", "teleport"]}},
            who="admin"),
        Bad("a webhook filter naming a buyer notice", "POST", "/api/admin/webhooks",
            "body.event_types[1]",
            {"json": {"url": "https://host.example/hooks",
                      "event_types": ["place", "pay_reminder"]}}, who="admin"),
        Bad("a refund state that is none", "GET", "/api/admin/refunds", "query.state",
            {"params": {"state": "lost"}}, who="admin"),
        # the guard's headers, located though the route itself does not take them
        Bad("a Dueflow-Act-As with a tab", "POST", "/api/orders", "header.Dueflow-Act-As",
            {"json": {"goods_id": 1}, "headers": {**key, "Dueflow-Act-As": "a\tb"}}, who=None),
        Bad("a Dueflow-Act-As-Name alone", "GET", "/api/me", "header.Dueflow-Act-As-Name",
            {"headers": {**key, "Dueflow-Act-As-Name": "Wei"}}, who=None),
        # no one field
        Bad("a body that is not JSON", "POST", "/api/goods", None,
            {"content": b"{", "headers": {"Content-Type": "application/json"}}, who="seller",
            status=400, code="malformed_json"),
    ]  # fmt: skip


async def test_each_422_names_its_field_and_changes_nothing(api):
    table = await bad_requests(api)
    before = await table_snapshot(api.deps)
    for bad in table:
        answer = await api.call(bad.method, bad.path, bad.who, **bad.call)
        assert answer.status_code == bad.status, (bad.what, answer.text)
        error = answer.json()["error"]
        assert (error["code"], error["field"]) == (bad.code, bad.field), (bad.what, error)
    assert await table_snapshot(api.deps) == before


async def test_an_error_without_a_field_says_null(api):
    answer = await api.call("GET", "/api/orders/999999", "buyer")
    assert answer.json() == {
        "error": {"code": "not_found", "message": "no order 999999", "field": None}
    }
