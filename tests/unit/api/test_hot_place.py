"""``POST /api/orders`` taken off FastAPI's stack (api/hot_place.py): the plain place of goods by
a personal token is answered as the route answers it (status, error JSON, headers, the order
view), on one transaction; every other request to the route still meets the route itself."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from sqlalchemy import event, func, select

from dueflow import logs
from dueflow.store.schema import orders
from tests.unit.api import Api
from tests.unit.api.shop_world import shop_api

#: A content type the hot layer leaves to the route (the same JSON body, FastAPI parses it).
ROUTED = {"Content-Type": "application/json; charset=utf-8"}


@pytest.fixture
async def api(world: Any) -> AsyncIterator[Api]:
    async with shop_api(world.deps) as api:
        yield api


async def place(api: Api, body: Any, who: str | None = "buyer", **headers: str) -> httpx.Response:
    return await api.call("POST", "/api/orders", who, json=body, headers=headers)


async def placed(api: Api) -> int:
    async with api.deps.db.read() as conn:
        return int(await conn.scalar(select(func.count()).select_from(orders)) or 0)


def same_answer(hot: httpx.Response, routed: httpx.Response) -> None:
    assert hot.status_code == routed.status_code, (hot.text, routed.text)
    assert hot.json() == routed.json()
    for name in ("content-type", "www-authenticate"):
        assert hot.headers.get(name) == routed.headers.get(name), name
    assert int(hot.headers["content-length"]) == len(hot.content)
    assert "x-request-id" in hot.headers


async def test_a_placed_order_is_answered_its_view_with_the_routes_headers(api):
    hot = await place(api, {"goods_id": await api.goods()})
    routed = await place(api, {"goods_id": await api.goods()}, **ROUTED)
    assert hot.status_code == routed.status_code == 201, (hot.text, routed.text)
    for answer in (hot, routed):
        view = await api.call("GET", f"/api/orders/{answer.json()['id']}", "buyer")
        assert answer.json() == view.json()
    assert sorted(hot.headers) == sorted(routed.headers)
    assert hot.headers["content-type"] == routed.headers["content-type"] == "application/json"


async def test_refusals_are_the_routes_own_answers(api):
    held = await api.goods()
    assert (await place(api, {"goods_id": held})).status_code == 201
    own = await api.goods()
    cases = [
        ({"goods_id": held}, "buyer"),  # held by another order: 409
        ({"goods_id": own}, "seller"),  # one's own goods: 403
        ({"goods_id": 2**62}, "buyer"),  # no such goods: 404
    ]
    for body, who in cases:
        same_answer(await place(api, body, who), await place(api, body, who, **ROUTED))
    assert await placed(api) == 1


async def test_a_bad_token_is_a_401_and_writes_nothing(api):
    goods_id = await api.goods()
    for headers in ({"Authorization": "Bearer not-a-token"}, {"Authorization": "Bearer  x "}):
        hot = await place(api, {"goods_id": goods_id}, None, **headers)
        assert hot.status_code == 401
        same_answer(hot, await place(api, {"goods_id": goods_id}, None, **headers, **ROUTED))
    assert await placed(api) == 0
    assert (await place(api, {"goods_id": goods_id})).status_code == 201


@pytest.mark.parametrize(
    "body",
    [
        {"goods_id": "1"},
        {"goods_id": True},
        {"goods_id": 0},
        {"goods_id": 2**63},
        {"goods_id": 1, "extra": 1},
        {"goods_id": 1.0},
        [1],
        {},
    ],
)
async def test_any_other_body_meets_the_routes_validation(api, body):
    answer = await place(api, body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "invalid_input"
    assert answer.json() == (await place(api, body, **ROUTED)).json()


async def test_malformed_and_oversized_bodies_are_refused_as_before(api):
    headers = {**api.auth("buyer"), "Content-Type": "application/json"}
    bad = await api.client.post("/api/orders", content=b'{"goods_id": 1', headers=headers)
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "malformed_json")
    big = await api.client.post("/api/orders", content=b" " * 70_000, headers=headers)
    assert (big.status_code, big.json()["error"]["code"]) == (413, "body_too_large")


async def test_one_transaction_reads_the_token_and_places(api):
    goods_id = await api.goods()
    engine = api.deps.db.engine.sync_engine
    begun: list[object] = []
    sent: list[str] = []

    def begin(conn: object) -> None:
        begun.append(conn)

    def statement(_conn: object, _cursor: object, sql: str, *_rest: object) -> None:
        sent.append(sql)

    event.listen(engine, "begin", begin)
    event.listen(engine, "before_cursor_execute", statement)
    try:
        assert (await place(api, {"goods_id": goods_id})).status_code == 201
    finally:
        event.remove(engine, "begin", begin)
        event.remove(engine, "before_cursor_execute", statement)
    assert len(begun) == 1
    assert "token_hash" in next(s for s in sent if not s.startswith("BEGIN"))


async def test_the_access_line_and_metrics_name_the_route_and_the_caller(api, caplog):
    caplog.handler.addFilter(logs.ContextFilter())
    caplog.set_level(logging.INFO)
    held = await api.goods()
    assert (await place(api, {"goods_id": held})).status_code == 201
    assert (await place(api, {"goods_id": held})).status_code == 409
    assert (await place(api, {"goods_id": held}, None)).status_code == 401
    lines = [r for r in caplog.records if r.name == logs.ACCESS and r.route == "/api/orders"]
    buyer = api.ids["buyer"]
    assert [(r.method, r.status, r.user_id, r.key_id) for r in lines] == [
        ("POST", 201, buyer, None),
        ("POST", 409, buyer, None),
        ("POST", 401, None, None),
    ]
    latency = api.deps.metrics.http_latency.labels("POST", "/api/orders", "201")
    assert latency._sum.get() > 0  # prometheus_client has no public read
