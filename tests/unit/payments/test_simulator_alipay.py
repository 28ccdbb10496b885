"""The simulated Alipay gateway and its notifications, cross-checked with fzlee's python-alipay-sdk.

The helpers here (a merchant's notify endpoint, a signed gateway call, a real local server for
SDKs that insist on the network) are shared with the WeChat Pay and control tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl

import httpx
import pytest
import uvicorn
from alipay import AliPay  # type: ignore[import-untyped]
from fastapi import FastAPI, Request, Response

from dueflow.clock import FakeClock, SystemClock
from dueflow.payments.alipay import signing
from dueflow.payments.rsa import generate_keypair
from dueflow.payments.simulator import SimulatorConfig
from dueflow.payments.simulator import app as simulator_app
from dueflow.payments.simulator.state import Provider
from tests.conftest import eventually_sync

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)  # 20:00 in Beijing
EXPIRE = "2026-03-01 20:30:00"  # START + 30 minutes, Beijing time
NOTIFY_URL = "http://merchant.test/notify/alipay"


# --- shared helpers ----------------------------------------------------------------------------


@dataclasses.dataclass
class Delivered:
    """One request that reached the merchant's notify endpoint."""

    path: str
    headers: dict[str, str]
    body: bytes

    def form(self) -> dict[str, str]:
        return dict(parse_qsl(self.body.decode(), keep_blank_values=True))


class Receiver:
    """A merchant's notify endpoint: records what arrives, answers as it is told."""

    def __init__(self, answer: tuple[int, bytes] = (200, b"success")) -> None:
        self.received: list[Delivered] = []
        self.answers: list[tuple[int, bytes]] = []
        self.default = answer
        self.arrived = asyncio.Event()
        self.app = FastAPI()
        self.app.add_api_route("/{path:path}", self._notify, methods=["POST"])

    async def _notify(self, request: Request) -> Response:
        body = await request.body()
        self.received.append(Delivered(request.url.path, dict(request.headers), body))
        self.arrived.set()
        status, content = self.answers.pop(0) if self.answers else self.default
        return Response(content, status_code=status)


def sim_config(base: SimulatorConfig, receiver: Receiver, **changes: Any) -> SimulatorConfig:
    """``base`` with a fake clock at START and notifications sent to ``receiver``."""
    options: dict[str, Any] = {
        "clock": FakeClock(START),
        "transport": httpx.ASGITransport(app=receiver.app),
    }
    return dataclasses.replace(base, **{**options, **changes})


@contextlib.asynccontextmanager
async def sim_client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the simulator app, in memory."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
        yield client


def gateway_params(
    config: SimulatorConfig, method: str, biz: dict[str, Any], **extra: str
) -> dict[str, str]:
    """Common parameters and ``biz_content``, signed with the app key (``sign_type`` signed)."""
    params = {
        "app_id": config.alipay_app_id,
        "method": method,
        "format": "JSON",
        "charset": "utf-8",
        "sign_type": "RSA2",
        "timestamp": "2026-03-01 20:00:00",
        "version": "1.0",
        "biz_content": json.dumps(biz, ensure_ascii=False, separators=(",", ":")),
        **extra,
    }
    params["sign"] = signing.sign(params, config.alipay_app_key.private_key, request=True)
    return params


async def alipay_call(
    client: httpx.AsyncClient,
    config: SimulatorConfig,
    method: str,
    biz: dict[str, Any],
    **extra: str,
) -> dict[str, Any]:
    """Call the gateway like fzlee's SDK (a GET) and return the verified response object."""
    response = await client.get(
        "/alipay/gateway.do", params=gateway_params(config, method, biz, **extra)
    )
    assert response.status_code == 200
    return signing.verify_response(response.text, method, config.alipay_key.public_key)


async def precreate(
    client: httpx.AsyncClient, config: SimulatorConfig, out_trade_no: str = "P1", **biz: str
) -> dict[str, Any]:
    content = {"out_trade_no": out_trade_no, "total_amount": "10.00", "subject": "camera"}
    if "timeout_express" not in biz:
        content["time_expire"] = EXPIRE
    return await alipay_call(
        client, config, "alipay.trade.precreate", {**content, **biz}, notify_url=NOTIFY_URL
    )


async def control(client: httpx.AsyncClient, path: str, **payload: Any) -> dict[str, Any]:
    response = await client.post(f"/control/{path}", json=payload)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


@contextlib.contextmanager
def served(app: FastAPI) -> Iterator[str]:
    """Run ``app`` with uvicorn on a free local port in a thread; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        assert eventually_sync(lambda: server.started or not thread.is_alive(), 10)
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
        assert not thread.is_alive()


# --- fixtures ----------------------------------------------------------------------------------


def sim(app: FastAPI) -> simulator_app.Simulator:
    return simulator_app.simulator_of(app)


# --- the gateway -------------------------------------------------------------------------------


async def test_precreate_answers_the_pay_page_signed_over_the_raw_text(
    client: httpx.AsyncClient, config: SimulatorConfig
) -> None:
    response = await client.get(
        "/alipay/gateway.do",
        params=gateway_params(
            config,
            "alipay.trade.precreate",
            {
                "out_trade_no": "P1",
                "total_amount": "10.00",
                "subject": "相机",
                "time_expire": EXPIRE,
            },
        ),
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json;charset=utf-8"
    assert response.text.startswith('{"alipay_trade_precreate_response":{"code":"10000"')
    content = signing.verify_response(
        response.text, "alipay.trade.precreate", config.alipay_key.public_key
    )
    assert content == {
        "code": "10000",
        "msg": "Success",
        "out_trade_no": "P1",
        "qr_code": "http://sim/pay/alipay/P1",
    }
    with pytest.raises(Exception, match="signature"):
        signing.verify_response(
            response.text, "alipay.trade.precreate", generate_keypair().public_key
        )


async def test_a_qr_trade_exists_only_once_the_buyer_scans(
    client: httpx.AsyncClient, config: SimulatorConfig
) -> None:
    await precreate(client, config)
    for method in ("alipay.trade.query", "alipay.trade.close"):
        content = await alipay_call(client, config, method, {"out_trade_no": "P1"})
        assert (content["code"], content["sub_code"]) == ("40004", "ACQ.TRADE_NOT_EXIST")
    page = await client.get("/pay/alipay/P1")  # the buyer opens the code
    assert page.status_code == 200 and "10.00" in page.text and ">Pay</button>" in page.text
    content = await alipay_call(client, config, "alipay.trade.query", {"out_trade_no": "P1"})
    assert content["trade_status"] == "WAIT_BUYER_PAY"
    assert content["total_amount"] == "10.00"
    assert content["buyer_user_id"].startswith("2088")


async def test_trades_are_visible_at_once_when_not_modelling_the_scan(
    base_config: SimulatorConfig, receiver: Receiver
) -> None:
    config = sim_config(base_config, receiver, alipay_trade_on_scan=False)
    async with sim_client(simulator_app.create_app(config)) as client:
        await precreate(client, config)
        content = await alipay_call(client, config, "alipay.trade.query", {"out_trade_no": "P1"})
    assert content["trade_status"] == "WAIT_BUYER_PAY"


async def test_post_with_common_params_in_the_query_and_biz_content_in_the_form(
    client: httpx.AsyncClient, config: SimulatorConfig, app: FastAPI
) -> None:
    """The official SDK's layout: the gateway merges query and form parameters."""
    params = gateway_params(
        config,
        "alipay.trade.precreate",
        {"out_trade_no": "P2", "total_amount": "0.01", "subject": "pen", "timeout_express": "90m"},
    )
    form = {"biz_content": params.pop("biz_content")}
    response = await client.post("/alipay/gateway.do", params=params, data=form)
    content = signing.verify_response(
        response.text, "alipay.trade.precreate", config.alipay_key.public_key
    )
    assert content["code"] == "10000"
    trade = sim(app).state.trade(Provider.ALIPAY, "P2")
    assert trade is not None and trade.time_expire == START + timedelta(minutes=90)


@pytest.mark.parametrize(
    ("tamper", "code", "sub_code"),
    [
        ("other_key", "40002", "isv.invalid-signature"),
        ("changed_after_signing", "40002", "isv.invalid-signature"),
        ("sign_type_not_signed", "40002", "isv.invalid-signature"),
        ("no_sign", "40001", "isv.missing-signature"),
        ("sign_type_rsa", "40002", "isv.invalid-signature-type"),
        ("other_app", "40002", "isv.invalid-app-id"),
        ("unknown_method", "40002", "isv.invalid-method"),
    ],
)
async def test_a_request_the_gateway_refuses_gets_a_signed_error_response(
    client: httpx.AsyncClient,
    config: SimulatorConfig,
    app: FastAPI,
    tamper: str,
    code: str,
    sub_code: str,
) -> None:
    biz = {
        "out_trade_no": "P9",
        "total_amount": "10.00",
        "subject": "camera",
        "time_expire": EXPIRE,
    }
    params = gateway_params(config, "alipay.trade.precreate", biz)
    unsigned = {k: v for k, v in params.items() if k != "sign"}
    other = generate_keypair().private_key
    params = {
        "other_key": {**unsigned, "sign": signing.sign(unsigned, other, request=True)},
        "changed_after_signing": {
            **params,
            "biz_content": params["biz_content"].replace("10.00", "0.01"),
        },
        "sign_type_not_signed": {
            **unsigned,
            "sign": signing.sign(unsigned, config.alipay_app_key.private_key),
        },
        "no_sign": unsigned,
        "sign_type_rsa": {**params, "sign_type": "RSA"},
        "other_app": gateway_params(
            dataclasses.replace(config, alipay_app_id="2021000000000009"),
            "alipay.trade.precreate",
            biz,
        ),
        "unknown_method": gateway_params(config, "alipay.trade.pay", biz),
    }[tamper]
    response = await client.get("/alipay/gateway.do", params=params)
    assert response.status_code == 200
    assert response.text.startswith('{"error_response":')
    content = signing.verify_response(
        response.text, "alipay.trade.precreate", config.alipay_key.public_key
    )
    assert (content["code"], content["sub_code"]) == (code, sub_code)
    assert sim(app).state.trades == {}


@pytest.mark.parametrize(
    ("method", "biz"),
    [
        ("alipay.trade.query", {"out_trade_no": "NOPE"}),
        ("alipay.trade.query", {"trade_no": "2026030122001000000000000000"}),
        ("alipay.trade.close", {"out_trade_no": "NOPE"}),
        ("alipay.trade.refund", {"out_trade_no": "NOPE", "refund_amount": "1.00"}),
        ("alipay.trade.fastpay.refund.query", {"out_trade_no": "NOPE", "out_request_no": "R1"}),
    ],
)
async def test_an_unknown_trade_does_not_exist(
    client: httpx.AsyncClient, config: SimulatorConfig, method: str, biz: dict[str, str]
) -> None:
    content = await alipay_call(client, config, method, biz)
    assert content == {
        "code": "40004",
        "msg": "Business Failed",
        "sub_code": "ACQ.TRADE_NOT_EXIST",
        "sub_msg": "交易不存在",
    }


@pytest.mark.parametrize(
    "biz",
    [
        {"total_amount": "10.001"},
        {"total_amount": "0"},
        {"time_expire": "2026-03-01 19:59:59"},
        {"time_expire": "tomorrow"},
        {"timeout_express": "1.5h"},
        {"subject": ""},
    ],
)
async def test_bad_precreate_parameters(
    client: httpx.AsyncClient, config: SimulatorConfig, biz: dict[str, str]
) -> None:
    content = await precreate(client, config, **biz)
    assert content["sub_code"] == "ACQ.INVALID_PARAMETER"


async def test_precreate_again_answers_the_same_code_until_the_trade_is_over(
    client: httpx.AsyncClient, config: SimulatorConfig, app: FastAPI
) -> None:
    first = await precreate(client, config)
    assert (await precreate(client, config))["qr_code"] == first["qr_code"]
    assert (await precreate(client, config, total_amount="11.00"))[
        "sub_code"
    ] == "ACQ.INVALID_PARAMETER"
    await control(client, "pay", provider="alipay", out_trade_no="P1")
    assert (await precreate(client, config))["sub_code"] == "ACQ.TRADE_HAS_SUCCESS"
    await precreate(client, config, "P2")
    await control(client, "scan", provider="alipay", out_trade_no="P2")
    await alipay_call(client, config, "alipay.trade.close", {"out_trade_no": "P2"})
    assert (await precreate(client, config, "P2"))["sub_code"] == "ACQ.TRADE_HAS_CLOSE"


# --- paying and notifications ------------------------------------------------------------------


async def test_a_paid_trade_is_queried_and_notified_and_fzlee_verifies_the_notification(
    client: httpx.AsyncClient, config: SimulatorConfig, app: FastAPI, receiver: Receiver
) -> None:
    await precreate(client, config)
    await control(client, "pay", provider="alipay", out_trade_no="P1")
    content = await alipay_call(client, config, "alipay.trade.query", {"out_trade_no": "P1"})
    assert content["trade_status"] == "TRADE_SUCCESS"
    assert content["buyer_pay_amount"] == content["receipt_amount"] == "10.00"
    assert content["send_pay_date"] == "2026-03-01 20:00:00"
    assert content["fund_bill_list"] == [{"amount": "10.00", "fund_channel": "ALIPAYACCOUNT"}]

    assert await sim(app).deliver_due() == 1
    (delivered,) = receiver.received
    assert delivered.path == "/notify/alipay"
    assert delivered.headers["content-type"] == "application/x-www-form-urlencoded; charset=utf-8"
    params = delivered.form()
    assert all(params.values()), "no empty values are sent"
    signing.verify(params, config.alipay_key.public_key)
    assert params["trade_status"] == "TRADE_SUCCESS"
    assert params["app_id"] == config.alipay_app_id
    assert params["seller_id"] == config.alipay_seller_id
    assert (params["out_trade_no"], params["total_amount"]) == ("P1", "10.00")
    assert params["notify_time"] == params["gmt_payment"] == "2026-03-01 20:00:00"
    assert json.loads(params["fund_bill_list"]) == [
        {"amount": "10.00", "fundChannel": "ALIPAYACCOUNT"}
    ]

    fzlee = AliPay(
        appid=config.alipay_app_id,
        app_private_key_string=config.alipay_app_key.private_pem(),
        alipay_public_key_string=config.alipay_key.public_pem(),
    )
    data = dict(params)
    assert fzlee.verify(data, data.pop("sign")) is True
    tampered = {**params, "total_amount": "0.01"}
    assert fzlee.verify(tampered, tampered.pop("sign")) is False

    assert sim(app).state.outbox[0].delivery == "acknowledged"
    assert await sim(app).deliver_due() == 0


async def test_trades_expire_at_their_time_expire(
    client: httpx.AsyncClient,
    config: SimulatorConfig,
    app: FastAPI,
    clock: FakeClock,
    receiver: Receiver,
) -> None:
    await precreate(client, config)
    await control(client, "scan", provider="alipay", out_trade_no="P1")
    clock.advance(timedelta(minutes=30) - timedelta(seconds=1))
    content = await alipay_call(client, config, "alipay.trade.query", {"out_trade_no": "P1"})
    assert content["trade_status"] == "WAIT_BUYER_PAY"
    clock.advance(1)
    content = await alipay_call(client, config, "alipay.trade.query", {"out_trade_no": "P1"})
    assert content["trade_status"] == "TRADE_CLOSED"
    paid = await client.post("/control/pay", json={"provider": "alipay", "out_trade_no": "P1"})
    assert paid.status_code == 409
    await sim(app).deliver_due()
    (closed,) = [d.form() for d in receiver.received]
    signing.verify(closed, config.alipay_key.public_key)
    assert (closed["trade_status"], closed["gmt_close"]) == ("TRADE_CLOSED", EXPIRE)


async def test_an_unscanned_trade_that_expires_leaves_no_trace(
    client: httpx.AsyncClient, config: SimulatorConfig, app: FastAPI, clock: FakeClock
) -> None:
    await precreate(client, config)
    clock.advance(timedelta(hours=1))
    assert await sim(app).deliver_due() == 0
    content = await alipay_call(client, config, "alipay.trade.query", {"out_trade_no": "P1"})
    assert content["sub_code"] == "ACQ.TRADE_NOT_EXIST"
    assert sim(app).state.outbox == []


async def test_close_closes_once_and_notifies_trade_closed(
    client: httpx.AsyncClient, config: SimulatorConfig, app: FastAPI, receiver: Receiver
) -> None:
    await precreate(client, config)
    await control(client, "scan", provider="alipay", out_trade_no="P1")
    content = await alipay_call(client, config, "alipay.trade.close", {"out_trade_no": "P1"})
    trade = sim(app).state.trade(Provider.ALIPAY, "P1")
    assert trade is not None
    assert content == {
        "code": "10000",
        "msg": "Success",
        "trade_no": trade.trade_no,
        "out_trade_no": "P1",
    }
    again = await alipay_call(client, config, "alipay.trade.close", {"trade_no": trade.trade_no})
    assert again["sub_code"] == "ACQ.TRADE_STATUS_ERROR"
    await sim(app).deliver_due()
    assert [d.form()["trade_status"] for d in receiver.received] == ["TRADE_CLOSED"]


async def test_closing_a_paid_trade_is_a_status_error(
    client: httpx.AsyncClient, config: SimulatorConfig
) -> None:
    await precreate(client, config)
    await control(client, "pay", provider="alipay", out_trade_no="P1")
    content = await alipay_call(client, config, "alipay.trade.close", {"out_trade_no": "P1"})
    assert content["sub_code"] == "ACQ.TRADE_STATUS_ERROR"


# --- refunds -----------------------------------------------------------------------------------


async def test_the_same_out_request_no_refunds_once(
    client: httpx.AsyncClient, config: SimulatorConfig, app: FastAPI, receiver: Receiver
) -> None:
    await precreate(client, config)
    await control(client, "pay", provider="alipay", out_trade_no="P1")
    refund = {"out_trade_no": "P1", "refund_amount": "10.00", "out_request_no": "R1"}
    first = await alipay_call(client, config, "alipay.trade.refund", refund)
    second = await alipay_call(client, config, "alipay.trade.refund", refund)
    assert (first["code"], first["fund_change"], first["refund_fee"]) == ("10000", "Y", "10.00")
    assert (second["code"], second["fund_change"], second["refund_fee"]) == ("10000", "N", "10.00")
    assert len(sim(app).state.refunds) == 1
    found = await alipay_call(
        client,
        config,
        "alipay.trade.fastpay.refund.query",
        {"out_trade_no": "P1", "out_request_no": "R1"},
    )
    assert (found["refund_status"], found["refund_amount"]) == ("REFUND_SUCCESS", "10.00")
    query = await alipay_call(client, config, "alipay.trade.query", {"out_trade_no": "P1"})
    assert query["trade_status"] == "TRADE_CLOSED"  # a full refund closes the trade
    await sim(app).deliver_due()
    events = [d.form() for d in receiver.received]
    assert [(e["trade_status"], e.get("out_biz_no")) for e in events] == [
        ("TRADE_SUCCESS", None),
        ("TRADE_CLOSED", "R1"),
    ]
    assert events[1]["refund_fee"] == "10.00"
    signing.verify(events[1], config.alipay_key.public_key)


async def test_partial_refunds_add_up_to_at_most_the_total(
    client: httpx.AsyncClient, config: SimulatorConfig
) -> None:
    await precreate(client, config)
    await control(client, "pay", provider="alipay", out_trade_no="P1")

    async def refund(number: str, amount: str) -> dict[str, Any]:
        biz = {"out_trade_no": "P1", "refund_amount": amount, "out_request_no": number}
        return await alipay_call(client, config, "alipay.trade.refund", biz)

    assert (await refund("R1", "4.00"))["refund_fee"] == "4.00"
    assert (await refund("R2", "6.01"))["sub_code"] == "ACQ.REFUND_AMT_NOT_EQUAL_TOTAL"
    assert (await refund("R1", "5.00"))["sub_code"] == "ACQ.INVALID_PARAMETER"
    assert (await refund("R2", "6.00"))["refund_fee"] == "10.00"
    assert (await refund("R3", "0.01"))["sub_code"] == "ACQ.TRADE_STATUS_ERROR"


async def test_an_unpaid_trade_cannot_be_refunded_and_an_unknown_refund_has_no_status(
    client: httpx.AsyncClient, config: SimulatorConfig
) -> None:
    await precreate(client, config)
    await control(client, "scan", provider="alipay", out_trade_no="P1")
    biz = {"out_trade_no": "P1", "refund_amount": "1.00", "out_request_no": "R1"}
    content = await alipay_call(client, config, "alipay.trade.refund", biz)
    assert content["sub_code"] == "ACQ.TRADE_STATUS_ERROR"
    found = await alipay_call(
        client,
        config,
        "alipay.trade.fastpay.refund.query",
        {"out_trade_no": "P1", "out_request_no": "R1"},
    )
    assert found["code"] == "10000" and "refund_status" not in found


# --- retries -----------------------------------------------------------------------------------


async def test_a_notification_is_retried_on_alipays_schedule_until_exactly_success(
    client: httpx.AsyncClient,
    config: SimulatorConfig,
    app: FastAPI,
    clock: FakeClock,
    receiver: Receiver,
) -> None:
    receiver.answers = [(200, b"fail"), (500, b"success"), (200, b"success\n")]
    await precreate(client, config)
    await control(client, "pay", provider="alipay", out_trade_no="P1")
    assert await sim(app).deliver_due() == 1
    for wait in (timedelta(minutes=4), timedelta(minutes=10), timedelta(minutes=10)):
        clock.advance(wait - timedelta(seconds=1))
        assert await sim(app).deliver_due() == 0
        clock.advance(1)
        assert await sim(app).deliver_due() == 1
    notification = sim(app).state.outbox[0]
    assert notification.delivery == "acknowledged"
    assert [a.at - START for a in notification.attempts] == [
        timedelta(0),
        timedelta(minutes=4),
        timedelta(minutes=14),
        timedelta(minutes=24),
    ]
    forms = [d.form() for d in receiver.received]
    assert len({f["notify_id"] for f in forms}) == 1
    assert forms[3]["notify_time"] == "2026-03-01 20:24:00"
    for form in forms:
        signing.verify(form, config.alipay_key.public_key)
    clock.advance(timedelta(days=2))
    assert await sim(app).deliver_due() == 0


async def test_retries_are_time_scaled_and_end_after_eight_attempts(
    base_config: SimulatorConfig, receiver: Receiver
) -> None:
    receiver.default = (500, b"")
    config = sim_config(base_config, receiver, time_scale=60)
    app = simulator_app.create_app(config)
    clock = config.clock
    assert isinstance(clock, FakeClock)
    async with sim_client(app) as client:
        await precreate(client, config)
        await control(client, "pay", provider="alipay", out_trade_no="P1")
    await sim(app).deliver_due()
    for minutes in (4, 10, 10, 60, 120, 360, 900):
        clock.advance(minutes)  # a minute of Alipay's schedule is a second at time_scale 60
        assert await sim(app).deliver_due() == 1
    clock.advance(timedelta(days=3))
    assert await sim(app).deliver_due() == 0
    notification = sim(app).state.outbox[0]
    assert (len(notification.attempts), notification.delivery) == (8, "gave_up")


async def test_notifications_survive_an_unreachable_notify_url(
    base_config: SimulatorConfig, receiver: Receiver
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    config = sim_config(base_config, receiver, transport=httpx.MockTransport(refuse))
    app = simulator_app.create_app(config)
    async with sim_client(app) as client:
        await precreate(client, config)
        await control(client, "pay", provider="alipay", out_trade_no="P1")
    assert await sim(app).deliver_due() == 1
    (attempt,) = sim(app).state.outbox[0].attempts
    assert attempt.status_code is None and "ConnectError" in attempt.detail
    assert sim(app).state.outbox[0].next_attempt_at == START + timedelta(minutes=4)


# --- fzlee's client against a real local server ------------------------------------------------


def test_fzlee_client_gets_verified_answers_from_the_simulator(
    base_config: SimulatorConfig,
) -> None:
    config = dataclasses.replace(base_config, clock=SystemClock(), transport=None)
    app = simulator_app.create_app(config)
    fzlee = AliPay(
        appid=config.alipay_app_id,
        app_private_key_string=config.alipay_app_key.private_pem(),
        alipay_public_key_string=config.alipay_key.public_pem(),
    )
    with served(app) as base_url:
        fzlee._gateway = f"{base_url}/alipay/gateway.do"
        created = fzlee.api_alipay_trade_precreate("camera", "F1", "10.00", timeout_express="30m")
        assert created["code"] == "10000"
        assert created["qr_code"] == f"{base_url}/pay/alipay/F1"
        assert fzlee.api_alipay_trade_query(out_trade_no="F1")["sub_code"] == "ACQ.TRADE_NOT_EXIST"
        paid = httpx.post(
            f"{base_url}/control/pay", json={"provider": "alipay", "out_trade_no": "F1"}
        )
        assert paid.status_code == 200
        query = fzlee.api_alipay_trade_query(out_trade_no="F1")
        assert (query["code"], query["trade_status"], query["total_amount"]) == (
            "10000",
            "TRADE_SUCCESS",
            "10.00",
        )
        assert (
            fzlee.api_alipay_trade_close(out_trade_no="F1")["sub_code"] == "ACQ.TRADE_STATUS_ERROR"
        )
        refund = fzlee.api_alipay_trade_refund("10.00", out_trade_no="F1", out_request_no="R1")
        assert refund["fund_change"] == "Y"
        assert (
            fzlee.api_alipay_trade_refund("10.00", out_trade_no="F1", out_request_no="R1")[
                "fund_change"
            ]
            == "N"
        )
        found = fzlee.api_alipay_trade_fastpay_refund_query("R1", out_trade_no="F1")
        assert found["refund_status"] == "REFUND_SUCCESS"
