"""The simulator's control API, pay page, keys, mounting and background notifier."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from dueflow.clock import FakeClock, SystemClock
from dueflow.payments.alipay import signing as alipay_signing
from dueflow.payments.rsa import load_private_key, load_public_key
from dueflow.payments.simulator import SimulatorConfig
from dueflow.payments.simulator import app as simulator_app
from dueflow.payments.simulator.state import Provider

from .test_simulator_alipay import (
    START,
    Receiver,
    alipay_call,
    control,
    precreate,
    sim,
    sim_client,
)
from .test_simulator_wechatpay import close, native_order, place, query, verify, wechat_call


@pytest.fixture
def sim_overrides() -> dict[str, Any]:
    """This module's simulator settings (see conftest.py)."""
    return {"hang_seconds": 0.0}


async def alipay_trade(
    client: httpx.AsyncClient, config: SimulatorConfig, out_trade_no: str = "P1"
) -> None:
    await precreate(client, config, out_trade_no)
    await control(client, "scan", provider="alipay", out_trade_no=out_trade_no)


# --- paying, with notification faults ----------------------------------------------------------


async def test_duplicate_sends_copies_of_one_notification(
    client: httpx.AsyncClient, config: SimulatorConfig, app: FastAPI, receiver: Receiver
) -> None:
    await alipay_trade(client, config)
    paid = await control(client, "pay", provider="alipay", out_trade_no="P1", duplicate=3)
    assert len(paid["notifications"]) == 3
    assert await sim(app).deliver_due() == 3
    forms = [d.form() for d in receiver.received]
    assert len(forms) == 3 and len({f["notify_id"] for f in forms}) == 1
    for form in forms:
        alipay_signing.verify(form, config.alipay_key.public_key)


async def test_delay_holds_the_first_attempt(
    client: httpx.AsyncClient, config: SimulatorConfig, app: FastAPI, clock: FakeClock
) -> None:
    await alipay_trade(client, config)
    await control(client, "pay", provider="alipay", out_trade_no="P1", delay=90)
    clock.advance(89)
    assert await sim(app).deliver_due() == 0
    clock.advance(1)
    assert await sim(app).deliver_due() == 1


async def test_drop_never_delivers(
    client: httpx.AsyncClient,
    config: SimulatorConfig,
    app: FastAPI,
    clock: FakeClock,
    receiver: Receiver,
) -> None:
    await alipay_trade(client, config)
    await control(client, "pay", provider="alipay", out_trade_no="P1", drop=True)
    clock.advance(timedelta(days=2))
    assert await sim(app).deliver_due() == 0
    assert receiver.received == []
    state = (await client.get("/control/state")).json()
    assert [(n["delivery"], n["attempts"]) for n in state["notifications"]] == [("dropped", [])]
    assert state["trades"][0]["status"] == "paid"  # the trade is paid all the same


async def test_pay_refuses_unknown_and_finished_trades(
    client: httpx.AsyncClient, config: SimulatorConfig
) -> None:
    unknown = await client.post("/control/pay", json={"provider": "alipay", "out_trade_no": "NOPE"})
    assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "not_found")
    await alipay_trade(client, config)
    await control(client, "pay", provider="alipay", out_trade_no="P1")
    again = await client.post("/control/pay", json={"provider": "alipay", "out_trade_no": "P1"})
    assert (again.status_code, again.json()["error"]["code"]) == (409, "wrong_state")
    bad = await client.post("/control/pay", json={"provider": "paypal", "out_trade_no": "P1"})
    assert bad.status_code == 422


# --- failing the next call ---------------------------------------------------------------------


@pytest.mark.parametrize("method", ["alipay.trade.close", "close"])
async def test_alipay_system_error_is_signed_and_changes_nothing(
    client: httpx.AsyncClient, config: SimulatorConfig, method: str
) -> None:
    await alipay_trade(client, config)
    await control(client, "fail-next", provider="alipay", method=method, mode="SYSTEM_ERROR")
    failed = await alipay_call(client, config, "alipay.trade.close", {"out_trade_no": "P1"})
    assert (failed["code"], failed["sub_code"]) == ("40004", "ACQ.SYSTEM_ERROR")
    assert (await alipay_call(client, config, "alipay.trade.query", {"out_trade_no": "P1"}))[
        "trade_status"
    ] == "WAIT_BUYER_PAY"
    closed = await alipay_call(client, config, "alipay.trade.close", {"out_trade_no": "P1"})
    assert closed["code"] == "10000"  # only the next call fails


async def test_a_5xx_is_a_bare_bad_gateway_for_both_providers(
    client: httpx.AsyncClient, config: SimulatorConfig
) -> None:
    await alipay_trade(client, config)
    await control(client, "fail-next", provider="alipay", method="query", mode="5xx")
    params = {
        "app_id": config.alipay_app_id,
        "method": "alipay.trade.query",
        "sign_type": "RSA2",
        "biz_content": '{"out_trade_no":"P1"}',
    }
    params["sign"] = alipay_signing.sign(params, config.alipay_app_key.private_key, request=True)
    response = await client.get("/alipay/gateway.do", params=params)
    assert (response.status_code, response.headers["content-type"]) == (
        502,
        "text/html; charset=utf-8",
    )
    await place(client, config)
    await control(client, "fail-next", provider="wechatpay", method="close", mode="5xx")
    response = await close(client, config)
    assert response.status_code == 502 and "wechatpay-signature" not in response.headers
    assert (await query(client, config)).json()["trade_state"] == "NOTPAY"


async def test_a_timeout_takes_effect_and_loses_the_answer(
    client: httpx.AsyncClient, config: SimulatorConfig
) -> None:
    await place(client, config)
    await control(client, "fail-next", provider="wechatpay", method="close", mode="timeout")
    response = await close(client, config)
    assert (response.status_code, response.content) == (504, b"")
    assert (await query(client, config)).json()["trade_state"] == "CLOSED"
    await alipay_trade(client, config)
    await control(
        client, "fail-next", provider="alipay", method="alipay.trade.close", mode="timeout"
    )
    params = {
        "app_id": config.alipay_app_id,
        "method": "alipay.trade.close",
        "sign_type": "RSA2",
        "biz_content": '{"out_trade_no":"P1"}',
    }
    params["sign"] = alipay_signing.sign(params, config.alipay_app_key.private_key, request=True)
    assert (await client.get("/alipay/gateway.do", params=params)).status_code == 504
    assert (await alipay_call(client, config, "alipay.trade.query", {"out_trade_no": "P1"}))[
        "trade_status"
    ] == "TRADE_CLOSED"


async def test_wechat_system_error_is_a_signed_500(
    client: httpx.AsyncClient, config: SimulatorConfig
) -> None:
    await place(client, config)
    await control(client, "fail-next", provider="wechatpay", method="query", mode="SYSTEM_ERROR")
    response = await query(client, config)
    verify(config, response)
    assert (response.status_code, response.json()["code"]) == (500, "SYSTEM_ERROR")
    assert (await query(client, config)).status_code == 200


@pytest.mark.parametrize(
    ("provider", "method", "mode", "status"),
    [
        ("alipay", "alipay.trade.pay", "5xx", 400),
        ("wechatpay", "alipay.trade.close", "5xx", 400),
        ("alipay", "close", "slow", 422),
    ],
)
async def test_fail_next_refuses_unknown_methods_and_modes(
    client: httpx.AsyncClient, provider: str, method: str, mode: str, status: int
) -> None:
    response = await client.post(
        "/control/fail-next", json={"provider": provider, "method": method, "mode": mode}
    )
    assert response.status_code == status


# --- paying just as a close arrives ------------------------------------------------------------


async def test_alipay_pay_on_close_makes_the_close_lose(
    client: httpx.AsyncClient, config: SimulatorConfig, app: FastAPI, receiver: Receiver
) -> None:
    await alipay_trade(client, config)
    await control(client, "pay-on-close", provider="alipay", out_trade_no="P1")
    assert (await alipay_call(client, config, "alipay.trade.query", {"out_trade_no": "P1"}))[
        "trade_status"
    ] == "WAIT_BUYER_PAY"
    closed = await alipay_call(client, config, "alipay.trade.close", {"out_trade_no": "P1"})
    assert closed["sub_code"] == "ACQ.TRADE_STATUS_ERROR"
    assert (await alipay_call(client, config, "alipay.trade.query", {"out_trade_no": "P1"}))[
        "trade_status"
    ] == "TRADE_SUCCESS"
    await sim(app).deliver_due()
    assert [d.form()["trade_status"] for d in receiver.received] == ["TRADE_SUCCESS"]


async def test_wechat_pay_on_close_makes_the_close_fail(
    client: httpx.AsyncClient, config: SimulatorConfig
) -> None:
    await place(client, config)
    await control(client, "pay-on-close", provider="wechatpay", out_trade_no="W1")
    response = await close(client, config)
    assert (response.status_code, response.json()["code"]) == (403, "ORDERPAID")
    assert (await query(client, config)).json()["trade_state"] == "SUCCESS"


# --- state, keys, mounting ---------------------------------------------------------------------


async def test_state_lists_trades_refunds_and_notification_attempts(
    client: httpx.AsyncClient, config: SimulatorConfig, receiver: Receiver
) -> None:
    receiver.answers = [(500, b"")]
    await alipay_trade(client, config)
    await control(client, "pay", provider="alipay", out_trade_no="P1")
    await alipay_call(
        client,
        config,
        "alipay.trade.refund",
        {"out_trade_no": "P1", "refund_amount": "2.50", "out_request_no": "R1"},
    )
    assert (await client.post("/control/deliver")).json() == {"sent": 2}
    state = (await client.get("/control/state")).json()
    assert state["now"] == START.isoformat()
    (trade,) = state["trades"]
    assert (trade["out_trade_no"], trade["status"], trade["amount"], trade["refunded"]) == (
        "P1",
        "paid",
        "10.00",
        "2.50",
    )
    (refund,) = state["refunds"]
    assert (refund["out_refund_no"], refund["amount"], refund["status"]) == (
        "R1",
        "2.50",
        "success",
    )
    first, second = state["notifications"]
    assert (first["event"], first["delivery"], first["attempts"][0]["status_code"]) == (
        "TRADE_SUCCESS",
        "pending",
        500,
    )
    assert first["next_attempt_at"] == (START + timedelta(minutes=4)).isoformat()
    assert (second["event"], second["delivery"], second["out_refund_no"]) == (
        "TRADE_SUCCESS",
        "acknowledged",
        "R1",
    )


async def test_keys_are_what_a_client_needs(
    client: httpx.AsyncClient, config: SimulatorConfig
) -> None:
    keys = (await client.get("/control/keys")).json()
    assert keys == dataclasses.asdict(config.client_config("http://sim"))
    assert keys["alipay_gateway_url"] == "http://sim/alipay/gateway.do"
    assert keys["wechatpay_base_url"] == "http://sim/wechatpay"
    assert keys["wechatpay_public_key_id"].startswith("PUB_KEY_ID_")
    assert len(keys["wechatpay_api_v3_key"].encode()) == 32
    app_key = load_private_key(keys["alipay_app_private_key"])
    assert (
        app_key.public_key().public_numbers() == config.alipay_app_key.public_key.public_numbers()
    )
    platform = load_public_key(keys["wechatpay_public_key"])
    assert platform.public_numbers() == config.wechat_platform_key.public_key.public_numbers()


def test_every_instance_has_its_own_keys(base_config: SimulatorConfig) -> None:
    other = SimulatorConfig.generate(time_scale=10)
    assert other.time_scale == 10
    assert other.alipay_app_id != base_config.alipay_app_id
    assert other.alipay_key.public_pem() != base_config.alipay_key.public_pem()
    assert other.wechat_public_key_id != base_config.wechat_public_key_id
    assert isinstance(other.clock, SystemClock)


async def test_mounted_at_sim_everything_is_relative_to_the_mount(config: SimulatorConfig) -> None:
    host = FastAPI()
    host.mount("/sim", simulator_app.create_app(config))
    async with sim_client(host) as client:
        keys = (await client.get("/sim/control/keys")).json()
        assert keys["alipay_gateway_url"] == "http://sim/sim/alipay/gateway.do"
        assert keys["wechatpay_base_url"] == "http://sim/sim/wechatpay"
        params = {
            "app_id": config.alipay_app_id,
            "method": "alipay.trade.precreate",
            "sign_type": "RSA2",
            "biz_content": '{"out_trade_no":"P1","total_amount":"1.00","subject":"pen"}',
        }
        params["sign"] = alipay_signing.sign(
            params, config.alipay_app_key.private_key, request=True
        )
        response = await client.post("/sim/alipay/gateway.do", data=params)
        content = alipay_signing.verify_response(
            response.text, "alipay.trade.precreate", config.alipay_key.public_key
        )
        assert content["qr_code"] == "http://sim/sim/pay/alipay/P1"
        assert (await client.get("/sim/pay/alipay/P1")).status_code == 200
        placed = await wechat_call(
            client,
            config,
            "POST",
            "/v3/pay/transactions/native",
            native_order(config),
            prefix="/sim/wechatpay",
        )
        verify(config, placed)
        assert placed.json() == {"code_url": "http://sim/sim/pay/wechatpay/W1"}


# --- the pay page ------------------------------------------------------------------------------


async def test_the_pay_page_shows_the_amount_and_its_button_pays(
    client: httpx.AsyncClient, config: SimulatorConfig, app: FastAPI
) -> None:
    await place(client, config)
    page = await client.get("/pay/wechatpay/W1")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert (
        "¥10.00" in page.text
        and '<form method="post"><button type="submit">Pay</button>' in page.text
    )
    paid = await client.post("/pay/wechatpay/W1")
    assert paid.status_code == 200 and "<h1>Paid</h1>" in paid.text and "<button" not in paid.text
    assert (await query(client, config)).json()["trade_state"] == "SUCCESS"
    assert (await client.post("/pay/wechatpay/W1")).status_code == 409
    assert (await client.get("/pay/wechatpay/NOPE")).status_code == 404
    assert (await client.get("/pay/paypal/W1")).status_code == 404
    trade = sim(app).state.trade(Provider.WECHATPAY, "W1")
    assert trade is not None and trade.paid_at == START


async def test_the_pay_page_escapes_the_subject(
    client: httpx.AsyncClient, config: SimulatorConfig
) -> None:
    await precreate(client, config, subject="<script>x</script>")
    page = await client.get("/pay/alipay/P1")
    assert "<script>" not in page.text and "&lt;script&gt;" in page.text


# --- the background notifier -------------------------------------------------------------------


async def test_the_running_simulator_delivers_in_the_background(
    client: httpx.AsyncClient, config: SimulatorConfig, app: FastAPI, receiver: Receiver
) -> None:
    await alipay_trade(client, config)
    async with sim(app).running():
        await control(client, "pay", provider="alipay", out_trade_no="P1")
        await asyncio.wait_for(receiver.arrived.wait(), timeout=5)
    (delivered,) = receiver.received
    alipay_signing.verify(delivered.form(), config.alipay_key.public_key)
    assert sim(app).state.outbox[0].delivery == "acknowledged"
