"""The buyer cancels an order whose payment attempt can provably never be paid (issue 9 item 10).

An Alipay QR code that was opened but never scanned does not exist as a trade at Alipay (close
answers ``ACQ.TRADE_NOT_EXIST``), so dueflow voids it with ``alipay.trade.cancel``; a WeChat
native order whose start was answered with an error was never created, and no request of ours is
still on its way to create it. Both cancel at once, with the real simulator on a FakeClock. The
unsafe cases still refuse: a start that timed out may still be in flight, and a scanned Alipay
trade whose close fails may be being paid right now.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from dueflow.exceptions import ProviderUnavailable
from dueflow.service import accounts, orders, payments
from dueflow.worker.runner import Worker
from tests.unit.payments import test_payment_flow
from tests.unit.payments.test_payment_flow import Market

# test_payment_flow's market (dueflow and the simulator calling each other).
market = test_payment_flow.market


@pytest.fixture
def sim_options() -> dict[str, object]:
    # A simulated timeout answers a bare 504 after this long (real seconds), not 30 s.
    return {"hang_seconds": 0.01}


async def fail_next(market: Market, provider: str, method: str, mode: str) -> None:
    armed = await market.sim.post(
        "/control/fail-next", json={"provider": provider, "method": method, "mode": mode}
    )
    assert armed.status_code == 200, armed.text


async def start(market: Market, order_id: int, provider: str, *, fails: str | None) -> str:
    """Start paying through ``provider``; with ``fails``, its start call fails that way."""
    if fails is None:
        pay_no, _ = await payments.start_payment(
            market.deps, order_id=order_id, user_id=market.buyer, provider=provider
        )
        return pay_no
    await fail_next(market, provider, "precreate" if provider == "alipay" else "native", fails)
    with pytest.raises(ProviderUnavailable):
        await payments.start_payment(
            market.deps, order_id=order_id, user_id=market.buyer, provider=provider
        )
    view = await orders.order_view(market.deps, order_id)
    return str(view["payments"][-1]["pay_no"])


async def goods_of(market: Market, order_id: int) -> dict[str, object]:
    view = await orders.order_view(market.deps, order_id)
    return await accounts.get_goods(market.deps, view["goods_id"])


async def payable(market: Market, provider: str, pay_no: str) -> int:
    """What the simulator answers when the buyer tries to pay the attempt now."""
    answer = await market.sim.post(
        "/control/pay", json={"provider": provider, "out_trade_no": pay_no}
    )
    return answer.status_code


CLOSABLE = [
    pytest.param("alipay", None, id="alipay-qr-opened-never-scanned"),
    pytest.param("wechatpay", "5xx", id="wechatpay-start-answered-5xx"),
    pytest.param("wechatpay", "SYSTEM_ERROR", id="wechatpay-start-answered-system-error"),
    pytest.param("alipay", "SYSTEM_ERROR", id="alipay-start-answered-system-error"),
]


@pytest.mark.parametrize(("provider", "fails"), CLOSABLE)
async def test_the_buyer_cancels_an_attempt_that_can_never_be_paid(market, provider, fails):
    order_id = await market.order()
    pay_no = await start(market, order_id, provider, fails=fails)
    market.clock.advance(timedelta(minutes=1))
    await orders.cancel_by_buyer(market.deps, order_id=order_id, user_id=market.buyer)
    view = await orders.order_view(market.deps, order_id)
    assert view["status"] == "cancelled_unpaid"
    assert [p["state"] for p in view["payments"]] == ["closed"]
    goods = await goods_of(market, order_id)
    assert (goods["status"], goods["reserved_order_id"]) == ("on_sale", None)
    # Nobody can pay it any more: the voided QR trade is closed, the WeChat order never existed.
    assert await payable(market, provider, pay_no) in (404, 409)


@pytest.mark.parametrize(("provider", "fails"), CLOSABLE[:2])
async def test_the_cancel_route_answers_200_and_releases_the_goods(market, provider, fails):
    buyer, token = await accounts.add_user(market.deps, "carol")
    goods_id = await accounts.add_goods(
        market.deps, seller_id=market.seller, title="lamp", price="88.00"
    )
    order_id = await orders.place_order(market.deps, buyer_id=buyer.id, goods_id=goods_id)
    market.buyer = buyer.id
    pay_no = await start(market, order_id, provider, fails=fails)
    answer = await market.app.post(
        f"/api/orders/{order_id}/cancel", headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "cancelled_unpaid"
    goods = await accounts.get_goods(market.deps, goods_id)
    assert (goods["status"], goods["reserved_order_id"]) == ("on_sale", None)
    assert await payable(market, provider, pay_no) in (404, 409)


@pytest.mark.parametrize("provider", ["alipay", "wechatpay"])
async def test_a_start_that_timed_out_still_waits_for_expiry(market, provider):
    """The start's answer never came (the request may still be on its way): "not found" proves
    nothing until the expiry plus the clock-skew margin has passed."""
    order_id = await market.order()
    await start(market, order_id, provider, fails="lost")
    with pytest.raises(ProviderUnavailable, match="unknown"):
        await orders.cancel_by_buyer(market.deps, order_id=order_id, user_id=market.buyer)
    assert await market.status(order_id) == "pending_payment"
    goods = await goods_of(market, order_id)
    assert goods["reserved_order_id"] == order_id
    market.clock.advance(timedelta(minutes=30))  # the deadline: still not provably closed
    await Worker(market.deps).drain()
    assert await market.status(order_id) == "pending_payment"
    market.clock.advance(timedelta(minutes=2))  # expiry plus the skew margin
    market.clock.advance(timedelta(minutes=1))  # the timer's backoff
    await Worker(market.deps).drain()
    assert await market.status(order_id) == "cancelled_unpaid"


@pytest.mark.parametrize("provider", ["alipay", "wechatpay"])
async def test_a_start_whose_answer_was_lost_after_it_took_effect_is_closed(market, provider):
    """A timeout after the provider created the trade: the trade exists, so it is closed."""
    order_id = await market.order()
    pay_no = await start(market, order_id, provider, fails="timeout")
    await market.sim.post("/control/scan", json={"provider": provider, "out_trade_no": pay_no})
    await orders.cancel_by_buyer(market.deps, order_id=order_id, user_id=market.buyer)
    assert await market.status(order_id) == "cancelled_unpaid"
    assert await payable(market, provider, pay_no) == 409


async def test_a_scanned_alipay_trade_whose_close_fails_is_not_voided(market):
    """The buyer has scanned and may be paying: a failed close refuses the cancel, and no
    ``alipay.trade.cancel`` (which would refund a payment) is sent; the payment then wins."""
    order_id = await market.order()
    pay_no = await start(market, order_id, "alipay", fails=None)
    await market.sim.post("/control/scan", json={"provider": "alipay", "out_trade_no": pay_no})
    await fail_next(market, "alipay", "close", "SYSTEM_ERROR")
    with pytest.raises(ProviderUnavailable, match="unknown"):
        await orders.cancel_by_buyer(market.deps, order_id=order_id, user_id=market.buyer)
    assert await market.status(order_id) == "pending_payment"
    state = (await market.sim.get("/control/state")).json()
    (trade,) = [t for t in state["trades"] if t["out_trade_no"] == pay_no]
    assert (trade["status"], trade["refunded"]) == ("waiting", "0.00")
    await market.pay("alipay", pay_no)
    assert await market.status(order_id) == "pending_shipment"


async def test_an_unscanned_alipay_code_whose_void_keeps_failing_is_closed_at_its_expiry(market):
    """Found in review: a void (alipay.trade.cancel) that never succeeds must not hold the order
    past the code's expiry plus the skew margin, when an unscanned code is dead anyway."""
    order_id = await market.order()
    await start(market, order_id, "alipay", fails=None)
    await fail_next(market, "alipay", "cancel", "SYSTEM_ERROR")
    with pytest.raises(ProviderUnavailable, match="unknown"):
        await orders.cancel_by_buyer(market.deps, order_id=order_id, user_id=market.buyer)
    assert await market.status(order_id) == "pending_payment"
    market.clock.advance(timedelta(minutes=30))  # the deadline: the void fails again
    await fail_next(market, "alipay", "cancel", "SYSTEM_ERROR")
    await Worker(market.deps).drain()
    assert await market.status(order_id) == "pending_payment"
    market.clock.advance(timedelta(minutes=3))  # expiry plus the skew margin, and the backoff
    await fail_next(market, "alipay", "cancel", "SYSTEM_ERROR")
    await Worker(market.deps).drain()
    assert await market.status(order_id) == "cancelled_unpaid"
    goods = await goods_of(market, order_id)
    assert (goods["status"], goods["reserved_order_id"]) == ("on_sale", None)
