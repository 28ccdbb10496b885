"""The Alipay client against the real simulator, in process, on a fake clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from fastapi import FastAPI

from dueflow.clock import FakeClock
from dueflow.exceptions import (
    BadSignature,
    MalformedNotification,
    ProviderUnavailable,
    WrongMerchant,
)
from dueflow.payments.alipay import signing
from dueflow.payments.alipay.provider import AlipayProvider
from dueflow.payments.base import (
    Attempt,
    CloseResult,
    NotificationEvent,
    RefundRequest,
    RefundResult,
    VerifiedPayment,
)
from dueflow.payments.rsa import generate_keypair
from dueflow.payments.simulator import SimulatorConfig
from dueflow.payments.simulator import app as simulator_app
from dueflow.payments.simulator.state import Provider

from .test_simulator_alipay import START, Receiver, control

NOTIFY_URL = "http://merchant.test/notify/alipay"
EXPIRES = START + timedelta(minutes=30)
SKEW = timedelta(minutes=2)


def attempt(pay_no: str = "P1", amount: str = "10.00") -> Attempt:
    return Attempt(
        pay_no=pay_no, order_id=1, provider="alipay", amount=Decimal(amount), expires_at=EXPIRES
    )


def refund_request(
    refund_no: str = "R1", pay_no: str = "P1", amount: str = "10.00"
) -> RefundRequest:
    return RefundRequest(
        refund_no=refund_no,
        pay_no=pay_no,
        amount=Decimal(amount),
        total=Decimal("10.00"),
        reason="buyer changed their mind",
    )


def make_provider(
    config: SimulatorConfig, client: httpx.AsyncClient | None, **changes: Any
) -> AlipayProvider:
    keys = config.client_config("http://sim")
    options: dict[str, Any] = {
        "gateway_url": keys.alipay_gateway_url,
        "app_id": keys.alipay_app_id,
        "seller_id": keys.alipay_seller_id,
        "app_private_key": keys.alipay_app_private_key,
        "alipay_public_key": keys.alipay_public_key,
        "notify_url": NOTIFY_URL,
        "client": client,
        "clock_skew": SKEW,
    }
    return AlipayProvider(**{**options, **changes})


@pytest.fixture
def sim_overrides() -> dict[str, Any]:
    """This module's simulator settings (see conftest.py)."""
    return {"hang_seconds": 0.01}


@pytest.fixture
async def provider(
    config: SimulatorConfig, client: httpx.AsyncClient
) -> AsyncIterator[AlipayProvider]:
    provider = make_provider(config, client)
    yield provider
    await provider.aclose()


def sim(app: FastAPI) -> simulator_app.Simulator:
    return simulator_app.simulator_of(app)


async def started_and_paid(provider: AlipayProvider, client: httpx.AsyncClient) -> None:
    await provider.start(attempt(), subject="camera")
    await control(client, "pay", provider="alipay", out_trade_no="P1")


async def fail_next(client: httpx.AsyncClient, method: str, mode: str = "SYSTEM_ERROR") -> None:
    await control(client, "fail-next", provider="alipay", method=method, mode=mode)


# --- start -------------------------------------------------------------------------------------


async def test_start_creates_the_trade_with_the_exact_amount_and_expiry(
    provider: AlipayProvider, app: FastAPI
) -> None:
    started = await provider.start(attempt(amount="12.5"), subject="相机")
    assert started.pay_url == "http://sim/pay/alipay/P1"
    trade = sim(app).state.trade(Provider.ALIPAY, "P1")
    assert trade is not None
    assert (trade.amount, trade.subject, trade.notify_url) == (Decimal("12.50"), "相机", NOTIFY_URL)
    assert trade.time_expire == EXPIRES


@pytest.mark.parametrize("mode", ["SYSTEM_ERROR", "5xx"])
async def test_start_raises_when_the_answer_is_not_success(
    provider: AlipayProvider, client: httpx.AsyncClient, mode: str
) -> None:
    await fail_next(client, "alipay.trade.precreate", mode)
    with pytest.raises(ProviderUnavailable):
        await provider.start(attempt(), subject="camera")


async def test_start_raises_on_a_business_failure(
    provider: AlipayProvider, client: httpx.AsyncClient
) -> None:
    await started_and_paid(provider, client)
    with pytest.raises(ProviderUnavailable, match=r"ACQ\.TRADE_HAS_SUCCESS"):
        await provider.start(attempt(), subject="camera")


# --- close or query ----------------------------------------------------------------------------


async def test_a_paid_trade_is_found_paid_with_the_exact_amount(
    provider: AlipayProvider, client: httpx.AsyncClient, app: FastAPI
) -> None:
    await started_and_paid(provider, client)
    outcome = await provider.close_or_query(attempt(), START)
    trade = sim(app).state.trade(Provider.ALIPAY, "P1")
    assert trade is not None
    assert outcome.result is CloseResult.PAID
    assert outcome.payment == VerifiedPayment("P1", Decimal("10.00"), trade.trade_no)


async def test_a_payment_that_beats_the_close_is_found_paid(
    provider: AlipayProvider, client: httpx.AsyncClient
) -> None:
    await provider.start(attempt(), subject="camera")
    await control(client, "scan", provider="alipay", out_trade_no="P1")
    await control(client, "pay-on-close", provider="alipay", out_trade_no="P1")
    outcome = await provider.close_or_query(attempt(), START)
    assert outcome.result is CloseResult.PAID
    assert outcome.payment is not None and outcome.payment.amount == Decimal("10.00")


async def test_an_unpaid_scanned_trade_is_closed_and_stays_closed(
    provider: AlipayProvider, client: httpx.AsyncClient, app: FastAPI
) -> None:
    await provider.start(attempt(), subject="camera")
    await control(client, "scan", provider="alipay", out_trade_no="P1")
    first = await provider.close_or_query(attempt(), START)
    assert first.result is CloseResult.CLOSED_UNPAID
    trade = sim(app).state.trade(Provider.ALIPAY, "P1")
    assert trade is not None and trade.status == "closed"
    again = await provider.close_or_query(attempt(), START)  # TRADE_STATUS_ERROR, query CLOSED
    assert again.result is CloseResult.CLOSED_UNPAID


async def test_a_trade_never_scanned_is_closed_only_after_expiry_plus_skew(
    provider: AlipayProvider, clock: FakeClock
) -> None:
    await provider.start(attempt(), subject="camera")
    before = await provider.close_or_query(attempt(), START + timedelta(minutes=1))
    assert before.result is CloseResult.UNKNOWN and "TRADE_NOT_EXIST" in before.reason
    just_before = EXPIRES + SKEW - timedelta(seconds=1)
    clock.advance(just_before - START)
    assert (await provider.close_or_query(attempt(), just_before)).result is CloseResult.UNKNOWN
    clock.advance(timedelta(seconds=1))
    after = await provider.close_or_query(attempt(), EXPIRES + SKEW)
    assert after.result is CloseResult.CLOSED_UNPAID


@pytest.mark.parametrize(
    ("method", "mode"),
    [
        ("alipay.trade.close", "SYSTEM_ERROR"),
        ("alipay.trade.close", "5xx"),
        ("alipay.trade.close", "timeout"),
        ("alipay.trade.query", "SYSTEM_ERROR"),
    ],
)
async def test_provider_trouble_is_unknown(
    provider: AlipayProvider, client: httpx.AsyncClient, method: str, mode: str
) -> None:
    await started_and_paid(provider, client)
    await fail_next(client, method, mode)
    outcome = await provider.close_or_query(attempt(), START)
    assert outcome.result is CloseResult.UNKNOWN
    assert (await provider.close_or_query(attempt(), START)).result is CloseResult.PAID


async def test_an_answer_signed_with_another_key_is_unknown(
    config: SimulatorConfig, client: httpx.AsyncClient
) -> None:
    await make_provider(config, client).start(attempt(), subject="camera")
    await control(client, "scan", provider="alipay", out_trade_no="P1")
    stranger = make_provider(config, client, alipay_public_key=generate_keypair().public_pem())
    outcome = await stranger.close_or_query(attempt(), EXPIRES + SKEW)
    assert outcome.result is CloseResult.UNKNOWN and "BadSignature" in outcome.reason
    with pytest.raises(ProviderUnavailable):
        await stranger.start(attempt("P2"), subject="camera")
    assert (await stranger.refund(refund_request())).result is RefundResult.UNKNOWN


@pytest.mark.parametrize(
    "answer",
    [
        httpx.ReadTimeout("timed out"),
        httpx.ConnectError("refused"),
        httpx.Response(200, text="<html>not json</html>"),
        httpx.Response(200, content=b'{"x":"\xff"}'),
    ],
    ids=["timeout", "connect", "not-json", "not-utf8"],
)
async def test_transport_trouble_is_unknown_and_never_raises(
    config: SimulatorConfig, answer: Exception | httpx.Response
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(answer, Exception):
            raise answer
        return answer

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        provider = make_provider(config, client)
        outcome = await provider.close_or_query(attempt(), EXPIRES + timedelta(days=1))
        assert outcome.result is CloseResult.UNKNOWN
        assert (await provider.refund(refund_request())).result is RefundResult.UNKNOWN
        assert (await provider.refund_status(refund_request())).result is RefundResult.UNKNOWN


# --- notifications -----------------------------------------------------------------------------


async def delivered_forms(app: FastAPI, receiver: Receiver) -> list[dict[str, str]]:
    await sim(app).deliver_due()
    return [d.form() for d in receiver.received]


def resigned(config: SimulatorConfig, form: dict[str, str], **changes: str) -> bytes:
    params = {k: v for k, v in {**form, **changes}.items() if k != "sign"}
    params["sign"] = signing.sign(params, config.alipay_key.private_key)
    return urlencode(params).encode()


async def test_a_payment_notification_from_the_simulator_verifies(
    provider: AlipayProvider, client: httpx.AsyncClient, app: FastAPI, receiver: Receiver
) -> None:
    await started_and_paid(provider, client)
    await sim(app).deliver_due()
    (delivered,) = receiver.received
    notification = provider.verify_notification(delivered.body, delivered.headers, START)
    trade = sim(app).state.trade(Provider.ALIPAY, "P1")
    assert trade is not None
    assert notification.event is NotificationEvent.PAID
    assert (notification.pay_no, notification.amount) == ("P1", Decimal("10.00"))
    assert notification.provider_trade_no == trade.trade_no
    assert notification.state == "TRADE_SUCCESS"


async def test_close_and_refund_notifications_verify(
    provider: AlipayProvider, client: httpx.AsyncClient, app: FastAPI, receiver: Receiver
) -> None:
    await provider.start(attempt("P2"), subject="pen")
    await control(client, "scan", provider="alipay", out_trade_no="P2")
    await provider.close_or_query(attempt("P2"), START)
    await started_and_paid(provider, client)
    await provider.refund(refund_request(amount="4.00"))
    await provider.refund(refund_request("R2", amount="6.00"))
    await sim(app).deliver_due()
    notifications = [
        provider.verify_notification(d.body, d.headers, START) for d in receiver.received
    ]
    by_event = [(n.event, n.pay_no, n.refund_no, n.state) for n in notifications]
    assert by_event == [
        (NotificationEvent.CLOSED, "P2", None, "TRADE_CLOSED"),
        (NotificationEvent.PAID, "P1", None, "TRADE_SUCCESS"),
        (NotificationEvent.REFUND, "P1", "R1", "TRADE_SUCCESS"),
        (NotificationEvent.REFUND, "P1", "R2", "TRADE_CLOSED"),
    ]
    refunds = [n.refund for n in notifications[2:]]
    assert all(r is not None and r.result is RefundResult.SUCCEEDED for r in refunds)


async def test_rejected_notifications(
    provider: AlipayProvider,
    client: httpx.AsyncClient,
    app: FastAPI,
    receiver: Receiver,
    config: SimulatorConfig,
) -> None:
    await started_and_paid(provider, client)
    (form,) = await delivered_forms(app, receiver)
    body = urlencode(form).encode()
    assert provider.verify_notification(body, {}, START).event is NotificationEvent.PAID

    def rejects(payload: bytes) -> pytest.ExceptionInfo[Exception]:
        with pytest.raises(Exception) as caught:
            provider.verify_notification(payload, {}, START)
        return caught

    tampered = urlencode({**form, "total_amount": "0.01"}).encode()
    assert rejects(tampered).type is BadSignature
    foreign = {**form, "sign": signing.sign(form, generate_keypair().private_key)}
    assert rejects(urlencode(foreign).encode()).type is BadSignature
    assert rejects(resigned(config, form, app_id="2021000000000009")).type is WrongMerchant
    assert rejects(resigned(config, form, seller_id="2088000000000009")).type is WrongMerchant
    no_trade = {k: v for k, v in form.items() if k != "out_trade_no"}
    assert rejects(resigned(config, no_trade)).type is MalformedNotification
    assert rejects(resigned(config, form, total_amount="10.001")).type is MalformedNotification
    assert rejects(body + b"&pad=" + b"x" * (64 * 1024)).type is MalformedNotification
    assert rejects(b"\xff\xfe").type is MalformedNotification
    assert rejects(body + b"&trade_status=TRADE_CLOSED").type is MalformedNotification
    unsigned = {k: v for k, v in form.items() if k != "sign"}
    assert rejects(urlencode(unsigned).encode()).type is MalformedNotification


async def test_an_unknown_trade_status_is_other(
    provider: AlipayProvider,
    client: httpx.AsyncClient,
    app: FastAPI,
    receiver: Receiver,
    config: SimulatorConfig,
) -> None:
    await started_and_paid(provider, client)
    (form,) = await delivered_forms(app, receiver)
    body = resigned(config, form, trade_status="WAIT_BUYER_PAY")
    assert provider.verify_notification(body, {}, START).event is NotificationEvent.OTHER
    body = resigned(config, form, trade_status="TRADE_FINISHED")
    assert provider.verify_notification(body, {}, START).event is NotificationEvent.PAID


# --- refunds -----------------------------------------------------------------------------------


async def test_a_repeated_refund_is_processing_and_refunds_once(
    provider: AlipayProvider, client: httpx.AsyncClient, app: FastAPI
) -> None:
    await started_and_paid(provider, client)
    first = await provider.refund(refund_request())
    assert first.result is RefundResult.SUCCEEDED
    again = await provider.refund(refund_request())
    assert again.result is RefundResult.PROCESSING
    assert len(sim(app).state.refunds) == 1
    (refund,) = sim(app).state.refunds.values()
    assert (refund.out_refund_no, refund.amount) == ("R1", Decimal("10.00"))
    status = await provider.refund_status(refund_request())
    assert status.result is RefundResult.SUCCEEDED


async def test_refund_failures_and_trouble(
    provider: AlipayProvider, client: httpx.AsyncClient
) -> None:
    missing = await provider.refund(refund_request(pay_no="NOPE"))
    assert (missing.result, missing.reason) == (RefundResult.FAILED, "ACQ.TRADE_NOT_EXIST")
    await started_and_paid(provider, client)
    too_much = await provider.refund(refund_request(amount="10.01"))
    assert (too_much.result, too_much.reason) == (
        RefundResult.FAILED,
        "ACQ.REFUND_AMT_NOT_EQUAL_TOTAL",
    )
    await fail_next(client, "alipay.trade.refund")
    assert (await provider.refund(refund_request())).result is RefundResult.UNKNOWN
    await fail_next(client, "alipay.trade.fastpay.refund.query")
    assert (await provider.refund_status(refund_request())).result is RefundResult.UNKNOWN
    not_yet = await provider.refund_status(refund_request("R9"))
    assert not_yet.result is RefundResult.NOT_FOUND  # submitted again, never failed
    assert (await provider.refund(refund_request())).result is RefundResult.SUCCEEDED


async def test_a_refund_lost_to_a_bare_502_is_not_found_then_made_by_the_same_number(
    provider: AlipayProvider, client: httpx.AsyncClient, app: FastAPI
) -> None:
    await started_and_paid(provider, client)
    await fail_next(client, "alipay.trade.refund", "5xx")
    assert (await provider.refund(refund_request())).result is RefundResult.UNKNOWN
    assert (await provider.refund_status(refund_request())).result is RefundResult.NOT_FOUND
    assert (await provider.refund(refund_request())).result is RefundResult.SUCCEEDED
    assert (await provider.refund_status(refund_request())).result is RefundResult.SUCCEEDED
    assert len(sim(app).state.refunds) == 1


async def test_aclose_leaves_a_given_client_open_and_closes_its_own(
    config: SimulatorConfig, client: httpx.AsyncClient
) -> None:
    await make_provider(config, client).aclose()
    assert not client.is_closed
    own = make_provider(config, None)
    await own.aclose()
    assert own._client.is_closed
