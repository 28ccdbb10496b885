"""Paid twice is avoidable (issue 9 item 9): once an order is paid, its other open attempts are
closed at their providers, after the commit, by the ``close_attempts`` timer; a second payment
that lands anyway is a ``paid_twice`` discrepancy with a refund in review. The real simulator on a
FakeClock plays both providers."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from dueflow.domain.timers import backoff
from dueflow.service import orders, payments
from dueflow.store import schema
from dueflow.worker.runner import Worker
from tests.unit.payments import test_payment_flow
from tests.unit.payments.test_payment_flow import Market

# test_payment_flow's market (dueflow and the simulator calling each other) and its options.
market = test_payment_flow.market
sim_options = test_payment_flow.sim_options

OTHER = {"alipay": "wechatpay", "wechatpay": "alipay"}


async def two_attempts(market: Market) -> tuple[int, dict[str, str]]:
    """An order with an open Alipay and an open WeChat Pay attempt: pay_no by provider."""
    order_id = await market.order()
    pay_nos = {}
    for provider in ("alipay", "wechatpay"):
        pay_nos[provider], _ = await payments.start_payment(
            market.deps, order_id=order_id, user_id=market.buyer, provider=provider
        )
    return order_id, pay_nos


async def sim_pay(market: Market, provider: str, pay_no: str, **options: object) -> int:
    answer = await market.sim.post(
        "/control/pay", json={"provider": provider, "out_trade_no": pay_no, **options}
    )
    return answer.status_code


async def discrepancies(market: Market) -> list[tuple[str, int]]:
    query = select(schema.discrepancies.c.kind, schema.discrepancies.c.payment_id)
    async with market.deps.db.read() as conn:
        return [tuple(r) for r in (await conn.execute(query)).all()]


def attempt(view: dict, pay_no: str) -> dict:
    return next(p for p in view["payments"] if p["pay_no"] == pay_no)


@pytest.mark.parametrize("scanned", [False, True], ids=["unscanned", "scanned"])
@pytest.mark.parametrize("paid_by", ["alipay", "wechatpay"])
async def test_paying_one_attempt_closes_the_other_at_its_provider(market, paid_by, scanned):
    order_id, pay_nos = await two_attempts(market)
    other = OTHER[paid_by]
    if scanned:
        await market.sim.post(
            "/control/scan", json={"provider": other, "out_trade_no": pay_nos[other]}
        )
    await market.pay(paid_by, pay_nos[paid_by])
    assert await market.status(order_id) == "pending_shipment"
    await Worker(market.deps).drain()
    # The buyer can no longer pay the other code: the simulator refuses it.
    assert await sim_pay(market, other, pay_nos[other]) == 409
    view = await orders.order_view(market.deps, order_id)
    assert attempt(view, pay_nos[other])["state"] == "closed"
    assert view["refunds"] == [] and await discrepancies(market) == []
    (closing,) = [t for t in view["timers"] if t["kind"] == "close_attempts"]
    assert closing["state"] == "done"


async def test_a_manual_payment_closes_the_open_provider_attempts(market):
    order_id, pay_nos = await two_attempts(market)
    await payments.record_manual_payment(market.deps, order_id=order_id, amount="88.00")
    await Worker(market.deps).drain()
    for provider, pay_no in pay_nos.items():
        assert await sim_pay(market, provider, pay_no) == 409, provider


@pytest.mark.parametrize("paid_by", ["alipay", "wechatpay"])
async def test_a_second_payment_notified_anyway_is_a_discrepancy_and_a_refund(market, paid_by):
    """Both codes paid before the close ran: the second notification is refunded."""
    order_id, pay_nos = await two_attempts(market)
    other = OTHER[paid_by]
    await market.pay(paid_by, pay_nos[paid_by])
    await market.pay(other, pay_nos[other])  # lands before the worker closes it
    await Worker(market.deps).drain()
    view = await orders.order_view(market.deps, order_id)
    assert view["status"] == "pending_shipment"
    second = attempt(view, pay_nos[other])
    assert second["state"] == "paid"
    assert await discrepancies(market) == [("paid_twice", second["id"])]
    (refund,) = view["refunds"]
    assert (refund["payment_id"], refund["reason"], refund["state"]) == (
        second["id"],
        "paid_twice",
        "pending_review",
    )


@pytest.mark.parametrize("paid_by", ["alipay", "wechatpay"])
async def test_a_second_payment_found_by_the_close_is_a_discrepancy_and_a_refund(market, paid_by):
    """The second payment's notification never arrives: the close finds the trade paid."""
    order_id, pay_nos = await two_attempts(market)
    other = OTHER[paid_by]
    await market.pay(paid_by, pay_nos[paid_by])
    assert await sim_pay(market, other, pay_nos[other], drop=True) == 200
    await Worker(market.deps).drain()
    view = await orders.order_view(market.deps, order_id)
    assert view["status"] == "pending_shipment"
    second = attempt(view, pay_nos[other])
    assert second["state"] == "paid"
    assert await discrepancies(market) == [("paid_twice", second["id"])]
    assert [(r["payment_id"], r["reason"]) for r in view["refunds"]] == [
        (second["id"], "paid_twice")
    ]


async def test_a_close_that_fails_is_retried_with_backoff(market):
    order_id, pay_nos = await two_attempts(market)
    await market.pay("alipay", pay_nos["alipay"])
    fail = {"provider": "wechatpay", "method": "close", "mode": "5xx"}
    assert (await market.sim.post("/control/fail-next", json=fail)).status_code == 200
    await Worker(market.deps).drain()
    view = await orders.order_view(market.deps, order_id)
    assert attempt(view, pay_nos["wechatpay"])["state"] == "open"  # NOTPAY: not closed yet
    (closing,) = [t for t in view["timers"] if t["kind"] == "close_attempts"]
    assert closing["state"] == "scheduled" and "NOTPAY" in closing["last_error"]
    market.clock.advance(backoff(1))
    await Worker(market.deps).drain()
    assert await sim_pay(market, "wechatpay", pay_nos["wechatpay"]) == 409
    view = await orders.order_view(market.deps, order_id)
    assert attempt(view, pay_nos["wechatpay"])["state"] == "closed"
    assert [t["state"] for t in view["timers"] if t["kind"] == "close_attempts"] == ["done"]


async def test_shipping_does_not_cancel_the_close(market):
    """The close outlives the order's moves: a seller shipping at once does not stop it."""
    order_id, pay_nos = await two_attempts(market)
    await market.pay("wechatpay", pay_nos["wechatpay"])
    await orders.ship(
        market.deps, order_id=order_id, user_id=market.seller, carrier="SF", tracking_no="1"
    )
    market.clock.advance(timedelta(seconds=1))
    await Worker(market.deps).drain()
    assert await sim_pay(market, "alipay", pay_nos["alipay"]) == 409
