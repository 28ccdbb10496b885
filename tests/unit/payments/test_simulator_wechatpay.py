"""The simulated WeChat Pay v3 API and its notifications, cross-checked with wechatpayv3."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from wechatpayv3 import WeChatPay, WeChatPayType  # type: ignore[import-untyped]

from dueflow.clock import FakeClock, SystemClock
from dueflow.payments.rsa import generate_keypair
from dueflow.payments.simulator import SimulatorConfig
from dueflow.payments.simulator import app as simulator_app
from dueflow.payments.simulator.state import Provider
from dueflow.payments.wechatpay import signing

from .test_simulator_alipay import START, Receiver, control, served, sim

EXPIRE = "2026-03-01T20:30:00+08:00"  # START + 30 minutes
NOTIFY_URL = "http://merchant.test/notify/wechatpay"
REFUND_NOTIFY_URL = "http://merchant.test/notify/wechatpay/refund"
QUERY = "/v3/pay/transactions/out-trade-no/{}?mchid={}"


# --- shared helpers ----------------------------------------------------------------------------


def authorization(
    config: SimulatorConfig,
    method: str,
    url: str,
    body: str,
    *,
    at: datetime = START,
    key: Any = None,
    mchid: str | None = None,
    serial: str | None = None,
) -> str:
    """A merchant ``Authorization`` header, as a client signs it."""
    return signing.authorization(
        method=method,
        url=url,
        body=body,
        mchid=mchid or config.wechat_mchid,
        serial_no=serial or config.wechat_merchant_serial,
        private_key=key or config.wechat_merchant_key.private_key,
        timestamp=int(at.timestamp()),
        nonce=signing.new_nonce(),
    )


async def wechat_call(
    client: httpx.AsyncClient,
    config: SimulatorConfig,
    method: str,
    url: str,
    payload: dict[str, Any] | None = None,
    *,
    prefix: str = "/wechatpay",
    **auth: Any,
) -> httpx.Response:
    """A signed v3 call; ``url`` is the path from ``/v3/`` with its query, as signed."""
    body = "" if payload is None else json.dumps(payload, ensure_ascii=False)
    headers = {"Authorization": authorization(config, method, url, body, **auth)}
    if payload is not None:
        headers["Content-Type"] = "application/json"
    return await client.request(method, prefix + url, content=body.encode(), headers=headers)


def verify(config: SimulatorConfig, response: httpx.Response, now: datetime = START) -> None:
    """Check the platform's signature on a response, as a client must (204 included)."""
    keys = {config.wechat_public_key_id: config.wechat_platform_key.public_key}
    signing.verify_headers(response.headers, response.content, keys=keys, now=now)


def native_order(
    config: SimulatorConfig, out_trade_no: str = "W1", total: int = 1000
) -> dict[str, Any]:
    return {
        "appid": config.wechat_appid,
        "mchid": config.wechat_mchid,
        "description": "相机",
        "out_trade_no": out_trade_no,
        "time_expire": EXPIRE,
        "notify_url": NOTIFY_URL,
        "amount": {"total": total, "currency": "CNY"},
    }


async def place(
    client: httpx.AsyncClient, config: SimulatorConfig, out_trade_no: str = "W1"
) -> httpx.Response:
    return await wechat_call(
        client, config, "POST", "/v3/pay/transactions/native", native_order(config, out_trade_no)
    )


async def query(
    client: httpx.AsyncClient, config: SimulatorConfig, out_trade_no: str = "W1"
) -> httpx.Response:
    return await wechat_call(client, config, "GET", QUERY.format(out_trade_no, config.wechat_mchid))


async def close(
    client: httpx.AsyncClient, config: SimulatorConfig, out_trade_no: str = "W1"
) -> httpx.Response:
    url = f"/v3/pay/transactions/out-trade-no/{out_trade_no}/close"
    return await wechat_call(client, config, "POST", url, {"mchid": config.wechat_mchid})


async def refund(
    client: httpx.AsyncClient,
    config: SimulatorConfig,
    out_refund_no: str = "RF1",
    amount: int = 1000,
    total: int = 1000,
) -> httpx.Response:
    payload = {
        "out_trade_no": "W1",
        "out_refund_no": out_refund_no,
        "reason": "buyer cancelled",
        "notify_url": REFUND_NOTIFY_URL,
        "amount": {"refund": amount, "total": total, "currency": "CNY"},
    }
    return await wechat_call(client, config, "POST", "/v3/refund/domestic/refunds", payload)


def sdk(config: SimulatorConfig) -> Any:
    """wechatpayv3 in public-key mode: no network at init."""
    return WeChatPay(
        wechatpay_type=WeChatPayType.NATIVE,
        mchid=config.wechat_mchid,
        private_key=config.wechat_merchant_key.private_pem(),
        cert_serial_no=config.wechat_merchant_serial,
        appid=config.wechat_appid,
        apiv3_key=config.wechat_api_v3_key,
        notify_url=NOTIFY_URL,
        public_key=config.wechat_platform_key.public_pem(),
        public_key_id=config.wechat_public_key_id,
    )


# --- fixtures ----------------------------------------------------------------------------------


# --- orders, queries, closes -------------------------------------------------------------------


async def test_a_native_order_answers_a_signed_code_url(
    client: httpx.AsyncClient, config: SimulatorConfig
) -> None:
    response = await place(client, config)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json; charset=utf-8"
    assert response.json() == {"code_url": "http://sim/pay/wechatpay/W1"}
    verify(config, response)
    assert response.headers["wechatpay-serial"] == config.wechat_public_key_id
    assert response.headers["wechatpay-signature-type"] == "WECHATPAY2-SHA256-RSA2048"
    assert response.headers["request-id"]
    with pytest.raises(Exception, match="signature"):
        signing.verify_headers(
            response.headers,
            response.content + b" ",
            keys={config.wechat_public_key_id: config.wechat_platform_key.public_key},
            now=START,
        )


async def test_query_answers_the_transaction_and_404_for_an_unknown_order(
    client: httpx.AsyncClient, config: SimulatorConfig
) -> None:
    await place(client, config)
    response = await query(client, config)
    verify(config, response)
    assert response.status_code == 200
    body = response.json()
    assert (body["trade_state"], body["out_trade_no"], body["amount"]["total"]) == (
        "NOTPAY",
        "W1",
        1000,
    )
    assert (body["appid"], body["mchid"]) == (config.wechat_appid, config.wechat_mchid)
    unknown = await query(client, config, "NOPE")
    verify(config, unknown)
    assert unknown.status_code == 404
    assert unknown.json() == {"code": "ORDER_NOT_EXIST", "message": "订单不存在"}


async def test_close_answers_a_signed_empty_204_then_order_closed(
    client: httpx.AsyncClient, config: SimulatorConfig
) -> None:
    await place(client, config)
    closed = await close(client, config)
    assert (closed.status_code, closed.content) == (204, b"")
    verify(config, closed)  # signed over "timestamp\nnonce\n\n"
    again = await close(client, config)
    verify(config, again)
    assert (again.status_code, again.json()["code"]) == (400, "ORDER_CLOSED")
    assert (await query(client, config)).json()["trade_state"] == "CLOSED"
    assert (await close(client, config, "NOPE")).status_code == 404


async def test_closing_a_paid_order_is_an_error_so_the_client_queries(
    client: httpx.AsyncClient, config: SimulatorConfig
) -> None:
    await place(client, config)
    await control(client, "pay", provider="wechatpay", out_trade_no="W1")
    response = await close(client, config)
    verify(config, response)
    assert (response.status_code, response.json()["code"]) == (403, "ORDERPAID")
    assert (await query(client, config)).json()["trade_state"] == "SUCCESS"


async def test_orders_expire_at_their_time_expire(
    client: httpx.AsyncClient, config: SimulatorConfig, clock: FakeClock
) -> None:
    await place(client, config)
    clock.advance(timedelta(minutes=30))
    response = await wechat_call(
        client, config, "GET", QUERY.format("W1", config.wechat_mchid), at=clock.now()
    )
    verify(config, response, clock.now())
    assert response.json()["trade_state"] == "CLOSED"


async def test_placing_an_order_again(client: httpx.AsyncClient, config: SimulatorConfig) -> None:
    first = await place(client, config)
    assert (await place(client, config)).json() == first.json()
    changed = native_order(config, total=999)
    response = await wechat_call(client, config, "POST", "/v3/pay/transactions/native", changed)
    assert (response.status_code, response.json()["code"]) == (403, "OUT_TRADE_NO_USED")
    await control(client, "pay", provider="wechatpay", out_trade_no="W1")
    assert (await place(client, config)).json()["code"] == "ORDERPAID"
    await place(client, config, "W2")
    await close(client, config, "W2")
    assert (await place(client, config, "W2")).json()["code"] == "ORDER_CLOSED"


@pytest.mark.parametrize(
    "change",
    [
        {"appid": "wx0000000000000000"},
        {"amount": {"total": 10.5, "currency": "CNY"}},
        {"amount": {"total": 1000, "currency": "USD"}},
        {"time_expire": "2026-03-01T19:00:00+08:00"},
        {"time_expire": "2026-03-01T20:30:00"},
        {"notify_url": ""},
    ],
)
async def test_a_bad_native_order_is_a_400(
    client: httpx.AsyncClient, config: SimulatorConfig, change: dict[str, Any]
) -> None:
    payload = {**native_order(config), **change}
    response = await wechat_call(client, config, "POST", "/v3/pay/transactions/native", payload)
    verify(config, response)
    assert response.status_code == 400


# --- request authentication --------------------------------------------------------------------


@pytest.mark.parametrize(
    "forgery",
    [
        "stale",
        "future",
        "other_key",
        "other_mchid",
        "other_serial",
        "tampered_body",
        "other_path",
        "missing",
    ],
)
async def test_a_request_not_signed_by_the_merchant_just_now_is_401_sign_error(
    client: httpx.AsyncClient, config: SimulatorConfig, app: FastAPI, forgery: str
) -> None:
    payload = native_order(config)
    body = json.dumps(payload)
    url = "/v3/pay/transactions/native"
    forgeries: dict[str, dict[str, Any]] = {
        "stale": {"at": START - timedelta(seconds=300)},
        "future": {"at": START + timedelta(seconds=300)},
        "other_key": {"key": generate_keypair().private_key},
        "other_mchid": {"mchid": "1900000009"},
        "other_serial": {"serial": "0" * 40},
    }
    auth = forgeries.get(forgery, {})
    header = authorization(config, "POST", url, body, **auth)
    if forgery == "tampered_body":
        body = body.replace("1000", "1")
    if forgery == "other_path":
        header = authorization(config, "POST", "/v3/pay/transactions/jsapi", body)
    headers = {} if forgery == "missing" else {"Authorization": header}
    response = await client.post("/wechatpay" + url, content=body.encode(), headers=headers)
    verify(config, response)
    assert response.status_code == 401
    assert response.json()["code"] == "SIGN_ERROR"
    assert sim(app).state.trades == {}


@pytest.mark.parametrize("skew", [-299, 299])
async def test_a_request_signed_within_five_minutes_passes(
    client: httpx.AsyncClient, config: SimulatorConfig, skew: int
) -> None:
    response = await wechat_call(
        client,
        config,
        "POST",
        "/v3/pay/transactions/native",
        native_order(config),
        at=START + timedelta(seconds=skew),
    )
    assert response.status_code == 200


# --- notifications -----------------------------------------------------------------------------


async def test_a_payment_notification_verifies_decrypts_and_wechatpayv3_accepts_it(
    client: httpx.AsyncClient, config: SimulatorConfig, app: FastAPI, receiver: Receiver
) -> None:
    await place(client, config)
    await control(client, "pay", provider="wechatpay", out_trade_no="W1")
    assert await sim(app).deliver_due() == 1
    (delivered,) = receiver.received
    assert delivered.path == "/notify/wechatpay"
    keys = {config.wechat_public_key_id: config.wechat_platform_key.public_key}
    signing.verify_headers(delivered.headers, delivered.body, keys=keys, now=START)
    transaction = signing.decrypt_notification(delivered.body, config.wechat_api_v3_key)
    assert transaction["trade_state"] == "SUCCESS"
    assert (transaction["appid"], transaction["mchid"]) == (
        config.wechat_appid,
        config.wechat_mchid,
    )
    assert (transaction["out_trade_no"], transaction["amount"]["total"]) == ("W1", 1000)
    assert transaction["success_time"] == "2026-03-01T20:00:00+08:00"
    envelope = json.loads(delivered.body)
    assert (envelope["event_type"], envelope["resource"]["original_type"]) == (
        "TRANSACTION.SUCCESS",
        "transaction",
    )

    accepted = sdk(config).callback(delivered.headers, delivered.body)
    assert accepted is not None
    assert accepted["resource"] == transaction
    forged = {
        **delivered.headers,
        "wechatpay-signature": "WECHATPAY/SIGNTEST/" + delivered.headers["wechatpay-signature"],
    }
    assert sdk(config).callback(forged, delivered.body) is None
    assert sim(app).state.outbox[0].delivery == "acknowledged"


async def test_a_notification_is_retried_on_wechats_schedule_until_200_or_204(
    client: httpx.AsyncClient,
    config: SimulatorConfig,
    app: FastAPI,
    clock: FakeClock,
    receiver: Receiver,
) -> None:
    receiver.answers = [
        (500, b'{"code":"FAIL","message":"busy"}'),
        (400, b""),
        (202, b""),
        (200, b'{"code":"FAIL"}'),
    ]
    await place(client, config)
    await control(client, "pay", provider="wechatpay", out_trade_no="W1")
    assert await sim(app).deliver_due() == 1
    for wait in (15, 15, 30):
        clock.advance(wait - 1)
        assert await sim(app).deliver_due() == 0
        clock.advance(1)
        assert await sim(app).deliver_due() == 1
    notification = sim(app).state.outbox[0]
    assert notification.delivery == "acknowledged"  # a 200 is success whatever its body says
    assert [int((a.at - START).total_seconds()) for a in notification.attempts] == [0, 15, 30, 60]
    bodies = {d.body for d in receiver.received}
    assert len(bodies) == 1, "the same body, re-signed for each attempt"
    keys = {config.wechat_public_key_id: config.wechat_platform_key.public_key}
    for delivered, attempt in zip(receiver.received, notification.attempts, strict=True):
        assert delivered.headers["wechatpay-timestamp"] == str(int(attempt.at.timestamp()))
        signing.verify_headers(delivered.headers, delivered.body, keys=keys, now=attempt.at)


async def test_wechat_retries_end_after_sixteen_attempts(
    client: httpx.AsyncClient,
    config: SimulatorConfig,
    app: FastAPI,
    clock: FakeClock,
    receiver: Receiver,
) -> None:
    receiver.default = (500, b"")
    await place(client, config)
    await control(client, "pay", provider="wechatpay", out_trade_no="W1")
    await sim(app).deliver_due()
    for seconds in (
        15,
        15,
        30,
        180,
        600,
        1200,
        1800,
        1800,
        1800,
        3600,
        10800,
        10800,
        10800,
        21600,
        21600,
    ):
        clock.advance(seconds)
        assert await sim(app).deliver_due() == 1
    clock.advance(timedelta(days=2))
    assert await sim(app).deliver_due() == 0
    notification = sim(app).state.outbox[0]
    assert (len(notification.attempts), notification.delivery) == (16, "gave_up")


# --- refunds -----------------------------------------------------------------------------------


async def test_a_refund_is_processing_then_success_and_its_number_refunds_once(
    client: httpx.AsyncClient,
    config: SimulatorConfig,
    app: FastAPI,
    clock: FakeClock,
    receiver: Receiver,
) -> None:
    await place(client, config)
    await control(client, "pay", provider="wechatpay", out_trade_no="W1")
    first = await refund(client, config)
    verify(config, first)
    assert (first.status_code, first.json()["status"]) == (200, "PROCESSING")
    second = await refund(client, config)
    assert second.json()["refund_id"] == first.json()["refund_id"]
    assert len(sim(app).state.refunds) == 1
    assert (await query(client, config)).json()["trade_state"] == "REFUND"

    clock.advance(5)
    found = await wechat_call(
        client, config, "GET", "/v3/refund/domestic/refunds/RF1", at=clock.now()
    )
    verify(config, found, clock.now())
    assert (found.json()["status"], found.json()["amount"]["refund"]) == ("SUCCESS", 1000)
    assert found.json()["success_time"] == "2026-03-01T20:00:05+08:00"

    await sim(app).deliver_due()
    (refunded,) = [d for d in receiver.received if d.path == "/notify/wechatpay/refund"]
    resource = signing.decrypt_notification(refunded.body, config.wechat_api_v3_key)
    assert (resource["out_refund_no"], resource["refund_status"], resource["amount"]["refund"]) == (
        "RF1",
        "SUCCESS",
        1000,
    )
    assert json.loads(refunded.body)["event_type"] == "REFUND.SUCCESS"
    accepted = sdk(config).callback(refunded.headers, refunded.body)
    assert accepted is not None and accepted["resource"] == resource


async def test_refund_rejections(
    client: httpx.AsyncClient, config: SimulatorConfig, app: FastAPI
) -> None:
    assert (await refund(client, config)).status_code == 404  # no such order
    await place(client, config)
    unpaid = await refund(client, config)
    assert (unpaid.status_code, unpaid.json()["code"]) == (400, "INVALID_REQUEST")
    await control(client, "pay", provider="wechatpay", out_trade_no="W1")
    assert (await refund(client, config, amount=1001)).json()["code"] == "INVALID_REQUEST"
    assert (await refund(client, config, total=999)).json()["code"] == "PARAM_ERROR"
    assert (await refund(client, config, "RF1", amount=400)).status_code == 200
    assert (await refund(client, config, "RF1", amount=500)).json()["code"] == "INVALID_REQUEST"
    assert (await refund(client, config, "RF2", amount=601)).json()["code"] == "INVALID_REQUEST"
    assert (await refund(client, config, "RF2", amount=600)).status_code == 200
    unknown = await wechat_call(client, config, "GET", "/v3/refund/domestic/refunds/NOPE")
    verify(config, unknown)
    assert (unknown.status_code, unknown.json()["code"]) == (404, "RESOURCE_NOT_EXISTS")
    assert len(sim(app).state.refunds) == 2


# --- wechatpayv3's client against a real local server ------------------------------------------


def test_wechatpayv3_client_gets_verified_answers_from_the_simulator(
    base_config: SimulatorConfig,
) -> None:
    config = dataclasses.replace(base_config, clock=SystemClock(), transport=None)
    app = simulator_app.create_app(config)
    wxpay = sdk(config)
    with served(app) as base_url:
        wxpay._core._gate_way = f"{base_url}/wechatpay"
        expire = (datetime.now(tz=START.tzinfo) + timedelta(minutes=30)).isoformat(
            timespec="seconds"
        )
        code, message = wxpay.pay(
            description="camera", out_trade_no="S1", amount={"total": 100}, time_expire=expire
        )
        assert (code, json.loads(message)) == (200, {"code_url": f"{base_url}/pay/wechatpay/S1"})
        code, message = wxpay.query(out_trade_no="S1")
        assert (code, json.loads(message)["trade_state"]) == (200, "NOTPAY")
        assert wxpay.close(out_trade_no="S1") == (204, b"")
        code, message = wxpay.query(out_trade_no="S1")
        assert (code, json.loads(message)["trade_state"]) == (200, "CLOSED")
        code, message = wxpay.query(out_trade_no="NOPE")
        assert (code, json.loads(message)["code"]) == (404, "ORDER_NOT_EXIST")
        wxpay._core._public_key = generate_keypair().public_key  # a client that trusts another key
        with pytest.raises(Exception, match="failed to verify the signature"):
            wxpay.query(out_trade_no="S1")
    assert sim(app).state.trade(Provider.WECHATPAY, "S1") is not None
