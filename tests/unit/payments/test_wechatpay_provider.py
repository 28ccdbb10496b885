"""The WeChat Pay v3 provider against the real simulator, in memory, on a fake clock."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from dueflow.clock import FakeClock
from dueflow.exceptions import (
    BadSignature,
    MalformedNotification,
    ProviderUnavailable,
    StaleTimestamp,
    WrongMerchant,
)
from dueflow.payments.base import (
    Attempt,
    CloseOutcome,
    CloseResult,
    NotificationEvent,
    RefundRequest,
    RefundResult,
    VerifiedPayment,
)
from dueflow.payments.rsa import generate_keypair
from dueflow.payments.simulator import SimulatorConfig
from dueflow.payments.simulator.state import Provider, TradeStatus
from dueflow.payments.wechatpay.provider import WechatPayProvider

from .test_simulator_alipay import START, Receiver, control, sim

NOTIFY_URL = "http://merchant.test/notify/wechatpay"
REFUND_NOTIFY_URL = "http://merchant.test/notify/wechatpay/refund"
AMOUNT = Decimal("12.34")


def attempt(pay_no: str = "P1", amount: Decimal = AMOUNT) -> Attempt:
    return Attempt(
        pay_no=pay_no,
        order_id=1,
        provider="wechatpay",
        amount=amount,
        expires_at=START + timedelta(minutes=30),
    )


def refund_request(refund_no: str = "R1", pay_no: str = "P1") -> RefundRequest:
    return RefundRequest(
        refund_no=refund_no, pay_no=pay_no, amount=AMOUNT, total=AMOUNT, reason="buyer cancelled"
    )


def make_provider(
    config: SimulatorConfig, app: FastAPI, client: httpx.AsyncClient, **changes: Any
) -> WechatPayProvider:
    options: dict[str, Any] = {
        "base_url": "http://sim/wechatpay",
        "appid": config.wechat_appid,
        "mchid": config.wechat_mchid,
        "merchant_serial": config.wechat_merchant_serial,
        "merchant_private_key": config.wechat_merchant_key.private_pem(),
        "platform_keys": {config.wechat_public_key_id: config.wechat_platform_key.public_pem()},
        "api_v3_key": config.wechat_api_v3_key,
        "notify_url": NOTIFY_URL,
        "refund_notify_url": REFUND_NOTIFY_URL,
        "client": client,
        "clock": config.clock,
    }
    return WechatPayProvider(**{**options, **changes})


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture
def sim_overrides() -> dict[str, Any]:
    """This module's simulator settings (see conftest.py)."""
    return {"hang_seconds": 5.0}


@pytest.fixture
async def http(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """The provider's HTTP client."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as http:
        yield http


@pytest.fixture
def provider(config: SimulatorConfig, app: FastAPI, http: httpx.AsyncClient) -> WechatPayProvider:
    return make_provider(config, app, http, timeout=0.2)  # the simulator hangs for 5 s


async def fail_next(client: httpx.AsyncClient, method: str, mode: str) -> None:
    await control(client, "fail-next", provider="wechatpay", method=method, mode=mode)


async def pay(client: httpx.AsyncClient, pay_no: str = "P1") -> None:
    await control(client, "pay", provider="wechatpay", out_trade_no=pay_no)


# --- start and close-or-query ------------------------------------------------------------------


async def test_start_places_a_native_order_and_answers_its_code_url(
    provider: WechatPayProvider, app: FastAPI
) -> None:
    started = await provider.start(attempt(), subject="相机")
    assert started.pay_url == "http://sim/pay/wechatpay/P1"
    trade = sim(app).state.trade(Provider.WECHATPAY, "P1")
    assert trade is not None
    assert (trade.amount, trade.subject, trade.notify_url) == (AMOUNT, "相机", NOTIFY_URL)
    assert trade.time_expire == START + timedelta(minutes=30)


async def test_start_without_a_verified_code_url_is_unavailable(
    provider: WechatPayProvider, client: httpx.AsyncClient
) -> None:
    await fail_next(client, "native", "SYSTEM_ERROR")
    with pytest.raises(ProviderUnavailable):
        await provider.start(attempt(), subject="相机")
    await fail_next(client, "native", "5xx")
    with pytest.raises(ProviderUnavailable):
        await provider.start(attempt(), subject="相机")


async def test_a_paid_trade_is_paid_with_its_exact_amount(
    provider: WechatPayProvider, client: httpx.AsyncClient, app: FastAPI
) -> None:
    await provider.start(attempt(), subject="相机")
    await pay(client)
    outcome = await provider.close_or_query(attempt(), START)
    trade = sim(app).state.trade(Provider.WECHATPAY, "P1")
    assert trade is not None and trade.status is TradeStatus.PAID
    assert outcome == CloseOutcome.paid(VerifiedPayment("P1", Decimal("12.34"), trade.trade_no))


async def test_a_payment_as_the_close_arrives_is_paid(
    provider: WechatPayProvider, client: httpx.AsyncClient
) -> None:
    await provider.start(attempt(), subject="相机")
    await control(client, "pay-on-close", provider="wechatpay", out_trade_no="P1")
    outcome = await provider.close_or_query(attempt(), START)
    assert outcome.result is CloseResult.PAID
    assert outcome.payment is not None and outcome.payment.amount == AMOUNT


async def test_an_unpaid_trade_closes_and_closing_it_again_is_still_closed(
    provider: WechatPayProvider, app: FastAPI
) -> None:
    await provider.start(attempt(), subject="相机")
    first = await provider.close_or_query(attempt(), START)
    assert (first.result, first.reason) == (CloseResult.CLOSED_UNPAID, "closed")
    trade = sim(app).state.trade(Provider.WECHATPAY, "P1")
    assert trade is not None and trade.status is TradeStatus.CLOSED
    again = await provider.close_or_query(attempt(), START)
    assert (again.result, again.reason) == (CloseResult.CLOSED_UNPAID, "ORDER_CLOSED")


async def test_a_trade_never_placed_is_closed_only_after_its_expiry(
    provider: WechatPayProvider,
) -> None:
    never = attempt("NEVER")
    early = await provider.close_or_query(never, START)
    assert early.result is CloseResult.UNKNOWN  # it may still be placed and paid until expiry
    from dueflow.payments.wechatpay.provider import CLOCK_SKEW

    late = await provider.close_or_query(never, never.expires_at + CLOCK_SKEW)
    assert (late.result, late.reason) == (CloseResult.CLOSED_UNPAID, "ORDER_NOT_EXIST")


async def test_a_closed_trade_found_by_query_is_closed(
    provider: WechatPayProvider, client: httpx.AsyncClient
) -> None:
    await provider.start(attempt(), subject="相机")
    await fail_next(client, "close", "timeout")  # closes, then the answer never comes
    outcome = await provider.close_or_query(attempt(), START)
    assert (outcome.result, outcome.reason) == (CloseResult.CLOSED_UNPAID, "CLOSED")


@pytest.mark.parametrize("mode", ["5xx", "SYSTEM_ERROR", "timeout"])
async def test_no_clear_answer_is_unknown(
    provider: WechatPayProvider, client: httpx.AsyncClient, mode: str
) -> None:
    await provider.start(attempt(), subject="相机")
    await fail_next(client, "close", "5xx")
    await fail_next(client, "query", mode)
    outcome = await provider.close_or_query(attempt(), START)
    assert outcome.result is CloseResult.UNKNOWN
    assert outcome.payment is None


async def test_an_unpaid_trade_whose_close_failed_is_unknown(
    provider: WechatPayProvider, client: httpx.AsyncClient
) -> None:
    await provider.start(attempt(), subject="相机")
    await fail_next(client, "close", "SYSTEM_ERROR")
    outcome = await provider.close_or_query(attempt(), START)
    assert (outcome.result, outcome.reason) == (CloseResult.UNKNOWN, "trade_state 'NOTPAY'")


async def test_answers_signed_by_another_platform_key_are_never_believed(
    config: SimulatorConfig,
    app: FastAPI,
    http: httpx.AsyncClient,
    provider: WechatPayProvider,
    client: httpx.AsyncClient,
) -> None:
    await provider.start(attempt(), subject="相机")
    await pay(client)
    impostor_key = generate_keypair().public_key
    trusting = make_provider(
        config, app, http, platform_keys={config.wechat_public_key_id: impostor_key}
    )
    outcome = await trusting.close_or_query(attempt(), START)
    assert outcome.result is CloseResult.UNKNOWN
    with pytest.raises(ProviderUnavailable, match="failed verification"):
        await trusting.start(attempt("P2"), subject="相机")
    refunded = await trusting.refund(refund_request())
    assert refunded.result is RefundResult.UNKNOWN


async def test_requests_carry_the_public_key_id(
    config: SimulatorConfig, app: FastAPI, provider: WechatPayProvider
) -> None:
    seen: list[httpx.Request] = []

    async def record(request: httpx.Request) -> None:
        seen.append(request)

    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), event_hooks={"request": [record]}
    ) as http:
        spied = make_provider(config, app, http)
        await spied.start(attempt(), subject="相机")
    (request,) = seen
    assert request.headers["wechatpay-serial"] == config.wechat_public_key_id
    assert request.headers["authorization"].startswith("WECHATPAY2-SHA256-RSA2048 ")
    sent = json.loads(request.content)
    assert sent["amount"] == {"total": 1234, "currency": "CNY"}
    assert sent["time_expire"] == "2026-03-01T20:30:00+08:00"


# --- notifications -----------------------------------------------------------------------------


async def delivered_payment(
    provider: WechatPayProvider, client: httpx.AsyncClient, app: FastAPI, receiver: Receiver
) -> tuple[bytes, dict[str, str]]:
    await provider.start(attempt(), subject="相机")
    await pay(client)
    assert await sim(app).deliver_due() == 1
    (delivered,) = receiver.received
    return delivered.body, delivered.headers


async def test_a_payment_notification_verifies_and_decrypts(
    provider: WechatPayProvider, client: httpx.AsyncClient, app: FastAPI, receiver: Receiver
) -> None:
    body, headers = await delivered_payment(provider, client, app, receiver)
    notification = provider.verify_notification(body, headers, START)
    trade = sim(app).state.trade(Provider.WECHATPAY, "P1")
    assert trade is not None
    assert notification.event is NotificationEvent.PAID
    assert (notification.pay_no, notification.amount, notification.provider_trade_no) == (
        "P1",
        Decimal("12.34"),
        trade.trade_no,
    )
    assert notification.state == "SUCCESS"


async def test_forged_and_stale_notifications_are_rejected(
    provider: WechatPayProvider,
    client: httpx.AsyncClient,
    app: FastAPI,
    receiver: Receiver,
    clock: FakeClock,
) -> None:
    body, headers = await delivered_payment(provider, client, app, receiver)
    with pytest.raises(BadSignature):
        provider.verify_notification(body.replace(b'"id"', b'"Id"'), headers, START)
    probe = {
        **headers,
        "wechatpay-signature": "WECHATPAY/SIGNTEST/" + headers["wechatpay-signature"],
    }
    with pytest.raises(BadSignature):
        provider.verify_notification(body, probe, START)
    with pytest.raises(MalformedNotification):
        provider.verify_notification(body + b" " * 70_000, headers, START)
    unsigned = {k: v for k, v in headers.items() if k != "wechatpay-signature"}
    with pytest.raises(MalformedNotification):
        provider.verify_notification(body, unsigned, START)
    clock.advance(timedelta(minutes=6))
    with pytest.raises(StaleTimestamp):
        provider.verify_notification(body, headers, clock.now())


async def test_a_notification_for_another_merchant_is_rejected(
    config: SimulatorConfig,
    app: FastAPI,
    http: httpx.AsyncClient,
    provider: WechatPayProvider,
    client: httpx.AsyncClient,
    receiver: Receiver,
) -> None:
    body, headers = await delivered_payment(provider, client, app, receiver)
    for other in ({"mchid": "1900000009"}, {"appid": "wx0000000000000000"}):
        stranger = make_provider(config, app, http, **other)
        with pytest.raises(WrongMerchant):
            stranger.verify_notification(body, headers, START)


async def test_a_notification_decrypted_with_another_api_v3_key_is_rejected(
    config: SimulatorConfig,
    app: FastAPI,
    http: httpx.AsyncClient,
    provider: WechatPayProvider,
    client: httpx.AsyncClient,
    receiver: Receiver,
) -> None:
    body, headers = await delivered_payment(provider, client, app, receiver)
    other = make_provider(config, app, http, api_v3_key="0" * 32)
    with pytest.raises(BadSignature):
        other.verify_notification(body, headers, START)


# --- refunds -----------------------------------------------------------------------------------


async def test_a_refund_is_idempotent_and_settles(
    provider: WechatPayProvider,
    client: httpx.AsyncClient,
    app: FastAPI,
    clock: FakeClock,
    config: SimulatorConfig,
    receiver: Receiver,
) -> None:
    await provider.start(attempt(), subject="相机")
    await pay(client)
    first = await provider.refund(refund_request())
    second = await provider.refund(refund_request())
    assert first.result is second.result is RefundResult.PROCESSING
    assert len(sim(app).state.refunds) == 1
    assert (await provider.refund_status(refund_request())).result is RefundResult.PROCESSING

    clock.advance(config.refund_settle_after + timedelta(seconds=1))
    assert (await provider.refund_status(refund_request())).result is RefundResult.SUCCEEDED
    assert (await provider.refund(refund_request())).result is RefundResult.SUCCEEDED
    assert len(sim(app).state.refunds) == 1

    await sim(app).deliver_due()
    (refunded,) = [d for d in receiver.received if d.path == "/notify/wechatpay/refund"]
    notification = provider.verify_notification(refunded.body, refunded.headers, clock.now())
    assert notification.event is NotificationEvent.REFUND
    assert (notification.pay_no, notification.refund_no, notification.amount) == (
        "P1",
        "R1",
        AMOUNT,
    )
    assert notification.refund is not None
    assert notification.refund.result is RefundResult.SUCCEEDED


async def test_refund_failures(
    provider: WechatPayProvider, client: httpx.AsyncClient, app: FastAPI
) -> None:
    missing = await provider.refund(refund_request(pay_no="NEVER"))
    assert missing.result is RefundResult.FAILED
    assert "RESOURCE_NOT_EXISTS" in missing.reason
    await provider.start(attempt(), subject="相机")
    unpaid = await provider.refund(refund_request())
    assert (unpaid.result, "INVALID_REQUEST" in unpaid.reason) == (RefundResult.FAILED, True)
    unknown = await provider.refund_status(refund_request("NOPE"))
    assert unknown.result is RefundResult.NOT_FOUND  # submitted again, never failed

    await pay(client)
    for mode in ("5xx", "SYSTEM_ERROR"):
        await fail_next(client, "refund", mode)
        assert (await provider.refund(refund_request())).result is RefundResult.UNKNOWN
    assert sim(app).state.refunds == {}
    await fail_next(client, "refund_query", "5xx")
    assert (await provider.refund_status(refund_request())).result is RefundResult.UNKNOWN


async def test_a_refund_lost_to_a_bare_502_is_not_found_then_made_by_the_same_number(
    provider: WechatPayProvider, client: httpx.AsyncClient, app: FastAPI
) -> None:
    await provider.start(attempt(), subject="相机")
    await pay(client)
    await fail_next(client, "refund", "5xx")
    assert (await provider.refund(refund_request())).result is RefundResult.UNKNOWN
    lost = await provider.refund_status(refund_request())
    assert (lost.result, "RESOURCE_NOT_EXISTS" in lost.reason) == (RefundResult.NOT_FOUND, True)
    assert (await provider.refund(refund_request())).result is RefundResult.PROCESSING
    assert (await provider.refund_status(refund_request())).result is RefundResult.PROCESSING
    assert len(sim(app).state.refunds) == 1


async def test_a_refund_query_error_other_than_not_found_is_unknown(
    provider: WechatPayProvider,
    client: httpx.AsyncClient,
    config: SimulatorConfig,
    app: FastAPI,
    http: httpx.AsyncClient,
) -> None:
    """A query's error says nothing about the refund: only a status or a 404 is an answer."""
    await fail_next(client, "refund_query", "SYSTEM_ERROR")
    assert (await provider.refund_status(refund_request())).result is RefundResult.UNKNOWN
    unverifiable = make_provider(
        config, app, http, merchant_private_key=generate_keypair().private_key
    )
    refused = await unverifiable.refund_status(refund_request())  # 401 SIGN_ERROR
    assert (refused.result, "SIGN_ERROR" in refused.reason) == (RefundResult.UNKNOWN, True)


async def test_a_provider_it_made_its_own_client_for_closes_it(config: SimulatorConfig) -> None:
    own = WechatPayProvider(
        base_url="http://sim/wechatpay",
        appid=config.wechat_appid,
        mchid=config.wechat_mchid,
        merchant_serial=config.wechat_merchant_serial,
        merchant_private_key=config.wechat_merchant_key.private_pem(),
        platform_keys={config.wechat_public_key_id: config.wechat_platform_key.public_key},
        api_v3_key=config.wechat_api_v3_key,
        notify_url=NOTIFY_URL,
    )
    await own.aclose()
    assert own._client.is_closed


async def test_a_signed_answer_nested_too_deep_is_unavailable_not_a_crash(
    config: SimulatorConfig, app: FastAPI
) -> None:
    """A platform (or someone holding its key) answering JSON nested past the parser's depth:
    the call is unavailable like any answer that is not a JSON object (found by fuzzing)."""
    from dueflow.payments.wechatpay import signing

    body = b'{"a":' * 100_000 + b"1" + b"}" * 100_000

    def answer(request: httpx.Request) -> httpx.Response:
        headers = signing.signed_headers(
            body,
            serial=config.wechat_public_key_id,
            private_key=config.wechat_platform_key.private_key,
            timestamp=int(START.timestamp()),
            nonce="n" * 32,
        )
        return httpx.Response(200, content=body, headers=headers)

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as hostile:
        provider = make_provider(config, app, hostile)
        with pytest.raises(ProviderUnavailable, match="not JSON"):
            await provider.start(attempt(), subject="相机")
