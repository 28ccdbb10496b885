"""Provider limits (issue 9 item 8): titles cut to what each provider takes, amounts a provider
cannot carry refused before anything is stored, out-of-range amounts on the wire refused cleanly.

The simulator enforces the real limits (WeChat Pay: ``description`` at most 127 bytes, totals an
int32 of fen; Alipay: ``subject`` at most 256 characters, amounts at most 100,000,000.00 yuan),
so a test passing here would pass against the providers.
"""

from __future__ import annotations

import secrets
from decimal import Decimal
from urllib.parse import urlencode

import httpx
import pytest

from dueflow.exceptions import AmountMismatch, InvalidInput, MalformedNotification
from dueflow.payments import money_wire
from dueflow.payments.alipay import signing as alipay_signing
from dueflow.payments.simulator import SimulatorConfig
from dueflow.service import accounts, orders, payments
from tests.conftest import table_snapshot
from tests.unit.payments import test_refund_resend
from tests.unit.payments.test_payment_flow import Market, wechat_notification
from tests.unit.payments.test_simulator_alipay import alipay_call, control, precreate
from tests.unit.payments.test_simulator_wechatpay import native_order, wechat_call

# The backend-parametrized market (dueflow and the simulator calling each other) and its options.
market = test_refund_resend.market
sim_options = test_refund_resend.sim_options

#: 200 characters (a title's most), 640 bytes of UTF-8: CJK (3 bytes) and an emoji (4 bytes).
LONG_TITLE = "露营帐篷🏕" * 40
INT32_MAX = 2**31 - 1


# --- the simulator enforces the real limits ----------------------------------------------------


async def test_the_wechat_simulator_takes_a_127_byte_description_and_no_more(
    client: httpx.AsyncClient, config: SimulatorConfig
) -> None:
    path = "/v3/pay/transactions/native"
    fits = {**native_order(config, "W1"), "description": "帐" * 42 + "a"}  # 127 bytes
    assert (await wechat_call(client, config, "POST", path, fits)).status_code == 200
    over = {**native_order(config, "W2"), "description": "帐" * 42 + "ab"}  # 128 bytes
    answer = await wechat_call(client, config, "POST", path, over)
    assert (answer.status_code, answer.json()["code"]) == (400, "PARAM_ERROR")


@pytest.mark.parametrize("total", [INT32_MAX + 1, 10**30])
async def test_the_wechat_simulator_refuses_a_total_beyond_an_int32_of_fen(
    client: httpx.AsyncClient, config: SimulatorConfig, total: int
) -> None:
    path = "/v3/pay/transactions/native"
    answer = await wechat_call(client, config, "POST", path, native_order(config, total=total))
    assert (answer.status_code, answer.json()["code"]) == (400, "PARAM_ERROR")
    largest = native_order(config, "W9", total=INT32_MAX)
    assert (await wechat_call(client, config, "POST", path, largest)).status_code == 200


async def test_the_alipay_simulator_takes_a_256_character_subject_and_no_more(
    client: httpx.AsyncClient, config: SimulatorConfig
) -> None:
    assert (await precreate(client, config, "P1", subject="帐" * 256))["code"] == "10000"
    over = await precreate(client, config, "P2", subject="帐" * 257)
    assert (over["code"], over["sub_code"]) == ("40004", "ACQ.INVALID_PARAMETER")


@pytest.mark.parametrize("amount", ["100000000.01", "999999999.99", "1" + "0" * 30])
async def test_the_alipay_simulator_refuses_an_amount_beyond_its_maximum(
    client: httpx.AsyncClient, config: SimulatorConfig, amount: str
) -> None:
    over = await precreate(client, config, "P1", total_amount=amount)
    assert (over["code"], over["sub_code"]) == ("40004", "ACQ.INVALID_PARAMETER")
    largest = await precreate(client, config, "P2", total_amount="100000000.00")
    assert largest["code"] == "10000"
    await control(client, "pay", provider="alipay", out_trade_no="P2")
    biz = {"out_trade_no": "P2", "out_request_no": "R1", "refund_amount": amount}
    refund = await alipay_call(client, config, "alipay.trade.refund", biz)
    assert refund["sub_code"] == "ACQ.INVALID_PARAMETER"


# --- titles are cut to fit ----------------------------------------------------------------------


async def started_subject(market: Market, provider: str, title: str) -> tuple[str, str]:
    """Start paying an order for goods called ``title``: (pay_no, the subject the provider
    recorded)."""
    goods_id = await accounts.add_goods(
        market.deps, seller_id=market.seller, title=title, price="88.00"
    )
    order_id = await orders.place_order(market.deps, buyer_id=market.buyer, goods_id=goods_id)
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider=provider
    )
    state = (await market.sim.get("/control/state")).json()
    [trade] = [t for t in state["trades"] if t["out_trade_no"] == pay_no]
    return pay_no, str(trade["subject"])


async def test_a_long_title_is_cut_to_127_bytes_on_a_character_boundary_for_wechat(market):
    pay_no, subject = await started_subject(market, "wechatpay", LONG_TITLE)
    assert LONG_TITLE.startswith(subject)
    assert len(subject.encode("utf-8")) <= 127
    assert len(LONG_TITLE[: len(subject) + 1].encode("utf-8")) > 127  # the longest that fits
    await market.pay("wechatpay", pay_no)  # and it can be paid
    assert [o for _, o, _ in await market.inbox()] == ["confirmed"]


async def test_a_title_that_fits_reaches_each_provider_whole(market):
    for provider in ("alipay", "wechatpay"):
        _, subject = await started_subject(market, provider, "帐" * 42)  # 126 bytes
        assert subject == "帐" * 42
    _, subject = await started_subject(market, "alipay", LONG_TITLE)  # 200 characters
    assert subject == LONG_TITLE


async def test_a_subject_longer_than_alipays_is_cut_to_256_characters(market):
    from dueflow.payments.base import Attempt

    provider = market.deps.providers.get("alipay")
    attempt = Attempt(
        pay_no="20260301aaaaaaaaaaaaaaaa",
        order_id=1,
        provider="alipay",
        amount=Decimal("1.00"),
        expires_at=market.clock.now().replace(year=2027),
    )
    await provider.start(attempt, subject="🏕" * 300)
    state = (await market.sim.get("/control/state")).json()
    [trade] = state["trades"]
    assert trade["subject"] == "🏕" * 256


# --- amounts a provider cannot carry -------------------------------------------------------------


async def api_start(market: Market, price: str, provider: str) -> tuple[httpx.Response, int]:
    """A buyer of their own (with a token) starts paying goods at ``price`` through the API."""
    buyer, token = await accounts.add_user(market.deps, f"buyer-{secrets.token_hex(4)}")
    goods_id = await accounts.add_goods(
        market.deps, seller_id=market.seller, title="yacht", price=price
    )
    order_id = await orders.place_order(market.deps, buyer_id=buyer.id, goods_id=goods_id)
    answer = await market.app.post(
        f"/api/orders/{order_id}/payments",
        json={"provider": provider},
        headers={"Authorization": f"Bearer {token}"},
    )
    return answer, order_id


async def test_an_amount_above_wechats_int32_of_fen_is_refused_before_anything_is_stored(market):
    answer, order_id = await api_start(market, "21474836.47", "wechatpay")  # the most it takes
    assert answer.status_code == 201, answer.text
    before = await table_snapshot(market.deps)
    answer, order_id = await api_start(market, "21474836.48", "wechatpay")
    middle = await table_snapshot(market.deps)
    again = await market.app.post(
        f"/api/orders/{order_id}/payments",
        json={"provider": "wechatpay"},
        headers={"Authorization": answer.request.headers["Authorization"]},
    )
    assert (answer.status_code, again.status_code) == (422, 422)
    error = answer.json()["error"]
    assert error["code"] == "invalid_input"
    assert "21474836.47" in error["message"] and "wechatpay" in error["message"]
    assert await table_snapshot(market.deps) == middle  # the refusal wrote nothing
    assert len(middle["payments"]) == len(before["payments"])
    state = (await market.sim.get("/control/state")).json()
    assert len(state["trades"]) == 1  # nothing reached the provider either
    alipay, _ = await api_start(market, "21474836.48", "alipay")  # another provider can
    assert alipay.status_code == 201, alipay.text


async def test_alipays_maximum_is_the_largest_price_and_it_is_taken(market):
    answer, _ = await api_start(market, "100000000.00", "alipay")
    assert answer.status_code == 201, answer.text
    with pytest.raises(InvalidInput):
        await accounts.add_goods(
            market.deps, seller_id=market.seller, title="more", price="100000000.01"
        )


# --- out-of-range amounts on the wire -----------------------------------------------------------


@pytest.mark.parametrize("total", [0, -1, INT32_MAX + 1, 10**30, 10**400])
def test_a_wechat_total_outside_an_int32_of_fen_is_malformed(total: int) -> None:
    with pytest.raises(MalformedNotification):
        money_wire.parse_wechat_total(total)
    with pytest.raises(MalformedNotification):
        money_wire.check_wechat_total(total, Decimal("1.00"))


def test_the_largest_wechat_total_reads_exactly() -> None:
    assert money_wire.parse_wechat_total(INT32_MAX) == Decimal("21474836.47")
    assert money_wire.wechat_total(Decimal("21474836.47")) == INT32_MAX
    with pytest.raises(InvalidInput, match=r"21474836\.47"):
        money_wire.wechat_total(Decimal("21474836.48"))
    with pytest.raises(AmountMismatch):
        money_wire.check_wechat_total(INT32_MAX, Decimal("1.00"))


@pytest.mark.parametrize("text", ["100000000.01", "999999999.99", "1" + "0" * 30, "1e30"])
def test_an_alipay_amount_beyond_its_maximum_is_malformed(text: str) -> None:
    with pytest.raises(MalformedNotification):
        money_wire.parse_alipay_amount(text)
    assert money_wire.parse_alipay_amount("100000000.00") == Decimal("100000000.00")


async def test_signed_wechat_notifications_with_huge_amounts_are_rejected_cleanly(market):
    order_id = await market.order()
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider="wechatpay"
    )
    config = market.config
    paid = {
        "appid": config.wechat_appid,
        "mchid": config.wechat_mchid,
        "out_trade_no": pay_no,
        "transaction_id": "4200001",
        "trade_state": "SUCCESS",
    }
    refunded = {
        "mchid": config.wechat_mchid,
        "out_trade_no": pay_no,
        "out_refund_no": f"R{pay_no}",
        "refund_status": "SUCCESS",
    }
    cases = [
        ("TRANSACTION.SUCCESS", {**paid, "amount": {"total": 10**30, "currency": "CNY"}}),
        ("TRANSACTION.SUCCESS", {**paid, "amount": {"total": INT32_MAX + 1}}),
        ("REFUND.SUCCESS", {**refunded, "amount": {"total": 8800, "refund": 10**30}}),
    ]
    before = await table_snapshot(market.deps, skip=("notifications",))
    for event, resource in cases:
        body, headers = wechat_notification(market, event, resource, event_id="EV-huge")
        answer = await market.app.post("/notify/wechatpay", content=body, headers=headers)
        assert answer.status_code == 400, answer.text
        assert answer.json()["code"] == "FAIL"
    assert await table_snapshot(market.deps, skip=("notifications",)) == before
    assert [o for _, o, _ in await market.inbox()] == ["rejected"] * len(cases)
    assert await market.status(order_id) == "pending_payment"


async def test_a_signed_alipay_notification_with_a_huge_amount_is_rejected_cleanly(market):
    order_id = await market.order()
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider="alipay"
    )
    config = market.config
    params = {
        "notify_type": "trade_status_sync",
        "notify_id": "n-huge",
        "app_id": config.alipay_app_id,
        "seller_id": config.alipay_seller_id,
        "charset": "utf-8",
        "version": "1.0",
        "sign_type": "RSA2",
        "trade_no": "2026030122001",
        "out_trade_no": pay_no,
        "trade_status": "TRADE_SUCCESS",
        "total_amount": "1" + "0" * 30,
    }
    params["sign"] = alipay_signing.sign(params, config.alipay_key.private_key)
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    answer = await market.app.post("/notify/alipay", content=urlencode(params), headers=form)
    assert (answer.status_code, answer.text) == (400, "fail")
    assert [o for _, o, _ in await market.inbox()] == ["rejected"]


async def test_a_notification_that_fails_unexpectedly_still_gets_its_verdict(market, monkeypatch):
    """The safety net under the parsers: any bug while reading a notification (here the old
    decimal overflow, put back) answers "fail" and writes the inbox row's verdict."""
    import decimal

    from dueflow.payments.wechatpay import provider as wechat_provider

    def overflow(total: object) -> Decimal:
        raise decimal.InvalidOperation([decimal.InvalidOperation])

    monkeypatch.setattr(wechat_provider, "parse_wechat_total", overflow)
    order_id = await market.order()
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider="wechatpay"
    )
    config = market.config
    resource = {
        "appid": config.wechat_appid,
        "mchid": config.wechat_mchid,
        "out_trade_no": pay_no,
        "transaction_id": "4200001",
        "trade_state": "SUCCESS",
        "amount": {"total": 8800, "currency": "CNY"},
    }
    body, headers = wechat_notification(market, "TRANSACTION.SUCCESS", resource, event_id="EV-huge")
    answer = await market.app.post("/notify/wechatpay", content=body, headers=headers)
    assert answer.status_code == 500
    assert answer.json() == {"code": "FAIL", "message": "unexpected InvalidOperation"}
    assert [o for _, o, _ in await market.inbox()] == ["error"]
    assert await market.status(order_id) == "pending_payment"
