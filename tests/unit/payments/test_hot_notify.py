"""The notify routes reached without FastAPI's router (api/hot_notify.py): every notification is
answered as the route answers it through the whole stack (status, body, headers), with the same
inbox verdicts, error JSON, metrics and access line. The real simulator's keys sign the
notifications; the routed answers come from the same app with the layer left out."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from dueflow import logs
from dueflow.api import hot_notify
from dueflow.api.app import create_app
from dueflow.exceptions import BackendError
from dueflow.service import notifications, payments
from tests.unit.payments import test_payment_flow
from tests.unit.payments.test_payment_flow import Market, alipay_notification, wechat_notification

# test_payment_flow's market (dueflow and the simulator calling each other) and its options.
market = test_payment_flow.market
sim_options = test_payment_flow.sim_options

FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture
async def routed(market: Market) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the same app, its stack built without the notify layer: the outer layer
    (request id, latency, access log) over what the layer hands on."""
    app = create_app(market.deps)
    outer: Any = app.build_middleware_stack()
    assert isinstance(outer.app, hot_notify.HotNotify)
    outer.app = outer.app.app
    app.middleware_stack = outer
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dueflow") as client:
        yield client


def same(hot: httpx.Response, routed: httpx.Response) -> None:
    assert (hot.status_code, hot.content) == (routed.status_code, routed.content), (
        hot.text,
        routed.text,
    )
    drop = {"x-request-id"}
    assert {k: v for k, v in hot.headers.items() if k not in drop} == {
        k: v for k, v in routed.headers.items() if k not in drop
    }
    assert "x-request-id" in hot.headers


async def alipay_attempt(market: Market) -> str:
    order_id = await market.order()
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider="alipay"
    )
    return pay_no


def wechat_paid(market: Market, pay_no: str, **changes: Any) -> tuple[bytes, dict[str, str]]:
    config = market.config
    transaction = {
        "appid": config.wechat_appid,
        "mchid": config.wechat_mchid,
        "out_trade_no": pay_no,
        "transaction_id": "4200001",
        "trade_state": "SUCCESS",
        "amount": {"total": 8800, "payer_total": 8800, "currency": "CNY"},
        **changes,
    }
    return wechat_notification(market, "TRANSACTION.SUCCESS", transaction)


async def test_paid_notifications_are_answered_and_applied_as_the_route_does(market, routed):
    for client in (market.app, routed):
        pay_no = await alipay_attempt(market)
        body = alipay_notification(market, pay_no)
        first = await client.post("/notify/alipay", content=body, headers=FORM)
        again = await client.post("/notify/alipay", content=body, headers=FORM)
        assert (first.status_code, first.text, again.text) == (200, "success", "success")
    hot = [(await market.app.post("/notify/alipay", content=b"x", headers=FORM))]
    hot.append(await routed.post("/notify/alipay", content=b"x", headers=FORM))
    same(*hot)
    for client in (market.app, routed):
        order_id = await market.order()
        pay_no, _ = await payments.start_payment(
            market.deps, order_id=order_id, user_id=market.buyer, provider="wechatpay"
        )
        body, headers = wechat_paid(market, pay_no)
        answer = await client.post("/notify/wechatpay", content=body, headers=headers)
        assert (answer.status_code, answer.content) == (204, b"")
        assert await market.status(order_id) == "pending_shipment"
    assert [outcome for _, outcome, _ in await market.inbox()] == [
        *("confirmed", "duplicate") * 2,
        *("rejected",) * 2,
        *("confirmed",) * 2,
    ]


async def test_refusals_are_the_routes_own_answers(market, routed):
    pay_no = await alipay_attempt(market)
    cases: list[tuple[str, bytes, dict[str, str]]] = [
        ("/notify/alipay", alipay_notification(market, pay_no, total_amount="80.00"), FORM),
        ("/notify/alipay", b"a" * 70_000, FORM),
        ("/notify/wechatpay", *wechat_paid(market, pay_no, mchid="1900000000")),
        ("/notify/wechatpay/refund", b"{}", {"Content-Type": "application/json"}),
        ("/notify/wechatpay", b"", {}),
    ]
    for path, body, headers in cases:
        hot = await market.app.post(path, content=body, headers=headers)
        assert hot.status_code == 400, (path, hot.text)
        same(hot, await routed.post(path, content=body, headers=headers))
    # Not a POST, or not a notify path: FastAPI's own answers, through the layer unchanged.
    for method, path in [
        ("GET", "/notify/alipay"),
        ("POST", "/notify/alipay/"),
        ("POST", "/notify"),
    ]:
        hot = await market.app.request(method, path)
        assert hot.status_code in (404, 405, 307), (method, path, hot.status_code)
        same(hot, await routed.request(method, path))
    assert len(await market.inbox()) == 2 * len(cases)


@pytest.mark.parametrize("error", [BackendError("database down"), RuntimeError("a bug")])
async def test_an_error_out_of_the_route_is_the_same_error_json(market, routed, monkeypatch, error):
    async def failing(*args: object, **kwargs: object) -> notifications.Receipt:
        raise error

    monkeypatch.setattr(notifications, "receive", failing)
    answers = []
    for client in (market.app, routed):
        if isinstance(error, RuntimeError):
            # As through the whole stack: the 500 is answered, then the error raised on.
            with pytest.raises(RuntimeError):
                await client.post("/notify/alipay", content=b"x", headers=FORM)
            transport = httpx.ASGITransport(app=client._transport.app, raise_app_exceptions=False)  # type: ignore[attr-defined]
            async with httpx.AsyncClient(transport=transport, base_url="http://dueflow") as quiet:
                answers.append(await quiet.post("/notify/alipay", content=b"x", headers=FORM))
        else:
            answers.append(await client.post("/notify/alipay", content=b"x", headers=FORM))
    same(*answers)
    assert answers[0].status_code == (503 if isinstance(error, BackendError) else 500)
    code = "backend_error" if isinstance(error, BackendError) else "internal_error"
    assert answers[0].json()["error"]["code"] == code


async def test_the_access_line_and_the_latency_name_the_route(market, caplog):
    caplog.handler.addFilter(logs.ContextFilter())
    caplog.set_level(logging.INFO)
    answer = await market.app.post("/notify/alipay", content=b"x", headers=FORM)
    assert answer.status_code == 400
    [line] = [r for r in caplog.records if r.name == logs.ACCESS]
    assert (line.method, line.route, line.status) == ("POST", "/notify/alipay", 400)
    latency = market.deps.metrics.http_latency.labels("POST", "/notify/alipay", "400")
    assert latency._sum.get() > 0  # prometheus_client has no public read


async def test_the_layer_itself_answers_a_notification(market):
    """Every comparison above would pass with both clients routed (tracing on, say): here what
    the layer hands on refuses notify POSTs, so an answer proves the layer served it."""
    app = create_app(market.deps)
    outer: Any = app.build_middleware_stack()
    layer = outer.app
    assert isinstance(layer, hot_notify.HotNotify)
    handed_on: list[str] = []
    routed = layer.app

    async def refusing(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/notify/"):
            handed_on.append(scope["path"])
            raise AssertionError(f"{scope['path']} reached the router")
        await routed(scope, receive, send)

    layer.app = refusing
    app.middleware_stack = outer
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://dueflow") as client:
        pay_no = await alipay_attempt(market)
        paid = await client.post(
            "/notify/alipay", content=alipay_notification(market, pay_no), headers=FORM
        )
        refused = await client.post("/notify/wechatpay", content=b"", headers={})
        other = await client.get("/healthz")
    assert (paid.status_code, paid.text) == (200, "success")
    assert refused.status_code == 400
    assert other.status_code == 200
    assert handed_on == []
    assert [outcome for _, outcome, _ in await market.inbox()] == ["confirmed", "rejected"]
