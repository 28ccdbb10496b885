"""A payment Alipay gave back by itself is never refunded again (issue 23 item 1).

The buyer cancels while paying an Alipay code nobody had scanned: close finds no trade, so the
code is voided with ``alipay.trade.cancel``, and the buyer's payment lands just before it:
Alipay refunds it (``action: refund``) and the order is cancelled. The payment's notification
then arrives. Reproduced with the real simulator (pay-on-close arms the payment at the cancel),
on SQLite and PostgreSQL: the attempt records what Alipay gave back, the late notification's
discrepancy says so and creates no refund; a refund of ours for such a trade (the cancel's
answer lost, say) ends ``already_refunded`` when approved, never processing for good, and is
never settled off-line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from datetime import timedelta
from decimal import Decimal
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import select

from dueflow import bootstrap
from dueflow.api.app import create_app
from dueflow.api.app import create_app as dueflow_app
from dueflow.clock import FakeClock
from dueflow.config import load_settings
from dueflow.exceptions import InvalidTransition, ProviderUnavailable
from dueflow.payments.base import RefundRequest, RefundResult, VerifiedPayment
from dueflow.payments.simulator import SimulatorConfig
from dueflow.payments.simulator.app import create_app as simulator_app
from dueflow.service import accounts, orders, payments, refunds
from dueflow.store import payments as pay_store
from dueflow.store import schema
from tests.conftest import START, _reset_server_database
from tests.unit.api.test_admin_pages import log_in
from tests.unit.payments.test_payment_flow import Forward, Market
from tests.unit.test_refund_actions import ROOT
from tests.unit.test_refunds import ScriptedProvider, unshipped_refund, use


@pytest.fixture
async def market(backend_url: str) -> AsyncIterator[Market]:
    """test_payment_flow's market (dueflow and the simulator calling each other), on each
    database in turn."""
    clock = FakeClock(START)
    forward = Forward()
    config = SimulatorConfig.generate(clock=clock, transport=forward, hang_seconds=0.01)
    sim = simulator_app(config)
    settings = load_settings(
        database_url=backend_url,
        public_url="http://dueflow",
        **dataclasses.asdict(config.client_config("http://sim")),
    )
    async with (
        httpx.AsyncClient(transport=httpx.ASGITransport(app=sim), base_url="http://sim") as http,
        bootstrap.running(settings, clock=clock, http=http, migrate_sqlite=False) as deps,
    ):
        if deps.db.dialect != "sqlite":
            await _reset_server_database(deps.db)
        app = dueflow_app(deps)
        forward.app = app
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://dueflow"
        ) as client:
            seller, _ = await accounts.add_user(deps, "seller")
            buyer, _ = await accounts.add_user(deps, "buyer")
            yield Market(deps, clock, http, client, config, seller.id, buyer.id)


async def sim_trade(market: Market, pay_no: str) -> dict[str, Any]:
    state = (await market.sim.get("/control/state")).json()
    (trade,) = [t for t in state["trades"] if t["out_trade_no"] == pay_no]
    return dict(trade)


async def rows(market: Market, table: Any) -> list[dict[str, Any]]:
    async with market.deps.db.read() as conn:
        found = await conn.execute(select(table).order_by(table.c.id))
        return [dict(r._mapping) for r in found.all()]


async def cancel_while_paid(market: Market) -> tuple[int, str]:
    """The race, in the order that loses money: the buyer opens an Alipay code, cancels, and
    pays just as the cancel's ``alipay.trade.cancel`` reaches the code."""
    order_id = await market.order()
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider="alipay"
    )
    armed = await market.sim.post(
        "/control/pay-on-close", json={"provider": "alipay", "out_trade_no": pay_no}
    )
    assert armed.status_code == 200, armed.text
    await orders.cancel_by_buyer(market.deps, order_id=order_id, user_id=market.buyer)
    return order_id, pay_no


async def late_payment_unknown_refund(market: Market, pay_no: str) -> None:
    """As if the cancel's answer had been lost: the attempt does not know what Alipay gave
    back when the payment is applied (through the notifications' confirm path), so a refund
    in review is made; the notifications (Alipay's own refund among them) come after."""
    async with market.deps.db.write() as conn:
        await conn.execute(schema.payments.update().values(provider_refunded=None))
    trade = await sim_trade(market, pay_no)
    paid = VerifiedPayment(pay_no, Decimal("88.00"), trade["trade_no"])
    assert await payments.confirm_payment(market.deps, paid, actor="alipay") == "refund"
    await market.sim.post("/control/deliver")


async def test_a_payment_alipay_refunded_at_the_cancel_is_not_refunded_again(market):
    order_id, pay_no = await cancel_while_paid(market)
    assert await market.status(order_id) == "cancelled_unpaid"
    trade = await sim_trade(market, pay_no)
    assert (trade["paid_at"] is not None, trade["refunded"]) == (True, "88.00")
    (attempt,) = await rows(market, schema.payments)
    assert attempt["provider_refunded"] == Decimal("88.00")

    await market.sim.post("/control/deliver")  # the payment's notification arrives late
    # Alipay's notification of its own refund is taken (not refused), then the payment's.
    assert sorted(await market.inbox()) == [
        ("alipay", "provider_refund", True),
        ("alipay", "refund", True),
    ]
    (attempt,) = await rows(market, schema.payments)
    assert attempt["state"] == pay_store.PAID
    (found,) = await rows(market, schema.discrepancies)
    assert found["kind"] == "paid_after_cancel"
    assert "alipay already gave back 88.00: no refund due" in found["detail"]
    assert await rows(market, schema.refunds) == []  # nothing for an operator to pay back
    events = [e["event"] for e in (await orders.order_view(market.deps, order_id))["timeline"]]
    assert "provider_refund" in events and "refund_created" not in events
    trade = await sim_trade(market, pay_no)
    assert trade["refunded"] == "88.00"


async def test_a_refund_of_a_trade_alipay_gave_back_ends_already_refunded(market):
    """The cancel's answer was not recorded (an older dueflow, a crash before the write): the
    late notification makes a refund in review. Approving it asks the trade, finds Alipay gave
    it back, and ends it already_refunded; settling it off-line is refused."""
    _, pay_no = await cancel_while_paid(market)
    await late_payment_unknown_refund(market, pay_no)
    (refund,) = await rows(market, schema.refunds)
    assert refund["state"] == "pending_review"

    with pytest.raises(InvalidTransition, match="already_refunded"):
        await refunds.settle_offline(market.deps, refund["id"], reference="bank 1")
    (refund,) = await rows(market, schema.refunds)
    assert refund["state"] == "already_refunded"
    trade = await sim_trade(market, pay_no)
    assert trade["refunded"] == "88.00"


async def test_approving_such_a_refund_ends_it_at_once(market):
    _, pay_no = await cancel_while_paid(market)
    await late_payment_unknown_refund(market, pay_no)
    (refund,) = await rows(market, schema.refunds)
    assert await refunds.approve(market.deps, refund["id"]) == "already_refunded"
    (refund,) = await rows(market, schema.refunds)
    assert refund["state"] == "already_refunded"
    timers = await rows(market, schema.timers)
    live = ("scheduled", "claimed")
    assert not [t for t in timers if t["kind"] == "refund_check" and t["state"] in live]
    assert (await sim_trade(market, pay_no))["refunded"] == "88.00"


async def test_a_long_processing_refund_is_seen_and_can_be_closed(world):
    """A refund the provider keeps answering unknown stays processing: the dashboard lists it,
    the metric says how long, an alert rule watches it, and an operator closes it once the
    provider says it neither paid it nor gave the trade back."""
    use(world, ScriptedProvider([RefundResult.UNKNOWN, RefundResult.NOT_FOUND]))
    _, refund_id = await unshipped_refund(world, "scripted")
    assert await refunds.approve(world.deps, refund_id) == "processing"
    world.clock.advance(timedelta(hours=2))
    _, token = await accounts.add_user(world.deps, "root", admin=True)
    app = create_app(world.deps, session_secret="s" * 32)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://dueflow"
    ) as client:
        metrics = (await client.get("/metrics")).text
        assert "dueflow_refund_processing_oldest_seconds 7200.0" in metrics
        await log_in(client, token)
        page = (await client.get("/admin")).text
        assert 'class="card alarm" id="processing-refunds"' in page
        assert f'<a href="/admin/refunds?state=processing">{refund_id}</a>' in page
        queue = (await client.get("/admin/refunds?state=processing")).text
        assert f'action="/admin/refunds/{refund_id}/reject"' in queue
        assert f'action="/admin/refunds/{refund_id}/settle-offline"' in queue
        assert await refunds.reject(world.deps, refund_id, reason="never reached alipay") == (
            "rejected"
        )
        metrics = (await client.get("/metrics")).text
        assert "dueflow_refund_processing_oldest_seconds 0.0" in metrics
    rules = yaml.safe_load((ROOT / "docs" / "alerts.yml").read_text())["groups"][0]["rules"]
    [rule] = [r for r in rules if "dueflow_refund_processing_oldest_seconds" in r["expr"]]
    assert rule["expr"].replace(" ", "") == "max(dueflow_refund_processing_oldest_seconds)>3600"


async def test_a_trade_refunded_by_another_number_fails_the_refund_for_good(market):
    """ACQ.TRADE_STATUS_ERROR on a trade Alipay did not give back by itself (refunded in full
    under another number): a definite failure for an operator, never resubmitted forever."""
    order_id = await market.order()
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider="alipay"
    )
    await market.pay("alipay", pay_no)
    alipay = market.deps.providers.get("alipay")
    amount = Decimal("88.00")
    first = RefundRequest("X1", pay_no, amount, amount, "elsewhere")
    assert (await alipay.refund(first)).result is RefundResult.SUCCEEDED
    again = await alipay.refund(RefundRequest("X2", pay_no, amount, amount, "again"))
    assert again.result is RefundResult.FAILED
    assert "ACQ.TRADE_STATUS_ERROR" in again.reason


async def test_wechat_pays_no_refund_at_a_cancel(market):
    """WeChat Pay's close never refunds: a payment landing as the cancel's close arrives is
    found paid and confirmed (the cancel is refused), nothing is given back."""
    order_id = await market.order()
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider="wechatpay"
    )
    await market.sim.post(
        "/control/pay-on-close", json={"provider": "wechatpay", "out_trade_no": pay_no}
    )
    with pytest.raises(InvalidTransition, match="paid meanwhile"):
        await orders.cancel_by_buyer(market.deps, order_id=order_id, user_id=market.buyer)
    await market.sim.post("/control/deliver")
    assert await market.status(order_id) == "pending_shipment"
    (attempt,) = await rows(market, schema.payments)
    assert (attempt["state"], attempt["provider_refunded"]) == ("paid", None)
    assert await rows(market, schema.refunds) == []
    assert (await sim_trade(market, pay_no))["refunded"] == "0.00"


async def test_a_cancel_whose_refund_answer_was_lost_leaves_no_paid_order_unflagged(market):
    """The cancel's alipay.trade.cancel refunds the payment made meanwhile, but its answer is
    lost (a 504): the cancel is refused, the order still awaits payment. Whichever of the two
    notifications (the payment, Alipay's refund) comes first, the money Alipay gave back is
    recorded, a refunded_by_provider discrepancy says so, and nothing is refunded by us."""
    order_id = await market.order()
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider="alipay"
    )
    await market.sim.post(
        "/control/pay-on-close", json={"provider": "alipay", "out_trade_no": pay_no}
    )
    await market.sim.post(
        "/control/fail-next", json={"provider": "alipay", "method": "cancel", "mode": "timeout"}
    )
    with pytest.raises(ProviderUnavailable):
        await orders.cancel_by_buyer(market.deps, order_id=order_id, user_id=market.buyer)
    await market.sim.post("/control/deliver")
    (attempt,) = await rows(market, schema.payments)
    assert (attempt["state"], attempt["provider_refunded"]) == ("paid", Decimal("88.00"))
    kinds = [d["kind"] for d in await rows(market, schema.discrepancies)]
    assert kinds == ["refunded_by_provider"]
    assert await rows(market, schema.refunds) == []
    assert (await sim_trade(market, pay_no))["refunded"] == "88.00"


async def test_a_payment_given_back_before_it_is_applied_does_not_pay_the_order(market):
    """Alipay's refund notice applied first: the payment's notification then moves nothing."""
    order_id = await market.order()
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider="alipay"
    )
    async with market.deps.db.write() as conn:
        await conn.execute(schema.payments.update().values(provider_refunded=Decimal("88.00")))
    paid = VerifiedPayment(pay_no, Decimal("88.00"), "T1")
    outcome = await payments.confirm_payment(market.deps, paid, actor="alipay")
    assert outcome == "given_back"
    assert await market.status(order_id) == "pending_payment"
    (found,) = await rows(market, schema.discrepancies)
    assert found["kind"] == "refunded_by_provider"
    assert await rows(market, schema.refunds) == []
