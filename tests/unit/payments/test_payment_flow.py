"""Payments end to end in one process: dueflow's providers talk to the simulator, the simulator
notifies dueflow's notify routes, and a FakeClock shared by both moves time."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from sqlalchemy import func, select

from dueflow import bootstrap
from dueflow.api.app import create_app as dueflow_app
from dueflow.clock import FakeClock
from dueflow.config import load_settings
from dueflow.payments.alipay import signing as alipay_signing
from dueflow.payments.simulator import SimulatorConfig
from dueflow.payments.simulator.app import create_app as simulator_app
from dueflow.payments.wechatpay import signing as wechat_signing
from dueflow.service import accounts, orders, payments
from dueflow.service.deps import Deps
from dueflow.store import schema
from dueflow.worker.runner import Worker
from tests.conftest import START, table_snapshot


class Forward(httpx.AsyncBaseTransport):
    """A transport to an ASGI app that exists only later (the two apps call each other)."""

    def __init__(self) -> None:
        self.app = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert self.app is not None
        return await httpx.ASGITransport(app=self.app).handle_async_request(request)


@dataclass
class Market:
    deps: Deps
    clock: FakeClock
    sim: httpx.AsyncClient
    app: httpx.AsyncClient
    config: SimulatorConfig
    seller: int
    buyer: int

    async def order(self, price: str = "88.00") -> int:
        goods_id = await accounts.add_goods(
            self.deps, seller_id=self.seller, title="tent", price=price
        )
        return await orders.place_order(self.deps, buyer_id=self.buyer, goods_id=goods_id)

    async def pay(self, provider: str, pay_no: str, **options: object) -> None:
        answer = await self.sim.post(
            "/control/pay", json={"provider": provider, "out_trade_no": pay_no, **options}
        )
        assert answer.status_code == 200, answer.text
        await self.sim.post("/control/deliver")

    async def status(self, order_id: int) -> str:
        return str((await orders.order_view(self.deps, order_id))["status"])

    async def inbox(self) -> list[tuple[str, str, bool]]:
        async with self.deps.db.read() as conn:
            query = select(
                schema.notifications.c.provider,
                schema.notifications.c.outcome,
                schema.notifications.c.verified,
            ).order_by(schema.notifications.c.id)
            return [tuple(r) for r in (await conn.execute(query)).all()]


@pytest.fixture
def sim_options() -> dict[str, object]:
    """Simulator settings for the market; a module overrides this fixture to change them."""
    return {}


@pytest.fixture
async def market(db_path: Path, sim_options: dict[str, object]) -> AsyncIterator[Market]:
    clock = FakeClock(START)
    forward = Forward()
    config = SimulatorConfig.generate(clock=clock, transport=forward, **sim_options)
    sim = simulator_app(config)
    settings = load_settings(
        database_url=f"sqlite:///{db_path}",
        public_url="http://dueflow",
        **dataclasses.asdict(config.client_config("http://sim")),
    )
    async with (
        httpx.AsyncClient(transport=httpx.ASGITransport(app=sim), base_url="http://sim") as http,
        bootstrap.running(settings, clock=clock, http=http, migrate_sqlite=False) as deps,
    ):
        app = dueflow_app(deps)
        forward.app = app
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://dueflow"
        ) as client:
            seller, _ = await accounts.add_user(deps, "seller")
            buyer, _ = await accounts.add_user(deps, "buyer")
            yield Market(deps, clock, http, client, config, seller.id, buyer.id)


def wechat_notification(
    market: Market,
    event: str,
    resource: dict[str, Any],
    *,
    event_id: str = "EV-1",
    at: int | None = None,
) -> tuple[bytes, dict[str, str]]:
    """A WeChat notification signed and encrypted with the simulator's keys, as WeChat sends
    it (``at``: the signature's timestamp, default the market clock's now)."""
    config = market.config
    kind = "refund" if event.startswith("REFUND") else "transaction"
    nonce = wechat_signing.new_nonce(12)
    plaintext = json.dumps(resource).encode()
    body = json.dumps(
        {
            "id": event_id,
            "event_type": event,
            "resource_type": "encrypt-resource",
            "resource": {
                "original_type": kind,
                "algorithm": "AEAD_AES_256_GCM",
                "associated_data": kind,
                "nonce": nonce,
                "ciphertext": wechat_signing.encrypt_resource(
                    config.wechat_api_v3_key, nonce, kind, plaintext
                ),
            },
        }
    ).encode()
    headers = wechat_signing.signed_headers(
        body,
        serial=config.wechat_public_key_id,
        private_key=config.wechat_platform_key.private_key,
        timestamp=at if at is not None else int(market.clock.now().timestamp()),
        nonce=wechat_signing.new_nonce(),
    )
    return body, {**headers, "Content-Type": "application/json"}


@pytest.mark.parametrize("provider", ["alipay", "wechatpay"])
async def test_a_notified_payment_moves_the_order_once(market, provider):
    order_id = await market.order()
    pay_no, url = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider=provider
    )
    assert url.startswith(("http://sim/", "weixin://")), url
    await market.pay(provider, pay_no, duplicate=3)
    assert await market.status(order_id) == "pending_shipment"
    assert await market.inbox() == [
        (provider, "confirmed", True),
        (provider, "duplicate", True),
        (provider, "duplicate", True),
    ]
    view = await orders.order_view(market.deps, order_id)
    assert [e["event"] for e in view["timeline"]].count("pay") == 1


async def test_paying_is_refused_after_the_deadline_and_for_strangers(market):
    from dueflow.exceptions import InvalidInput, InvalidTransition, NotAllowed

    order_id = await market.order()
    with pytest.raises(NotAllowed):
        await payments.start_payment(
            market.deps, order_id=order_id, user_id=market.seller, provider="alipay"
        )
    with pytest.raises(InvalidInput, match="operator"):
        await payments.start_payment(
            market.deps, order_id=order_id, user_id=market.buyer, provider="manual"
        )
    market.clock.advance(timedelta(minutes=29, seconds=57, microseconds=1))
    with pytest.raises(InvalidTransition, match="less than 3 s away"):
        await payments.start_payment(
            market.deps, order_id=order_id, user_id=market.buyer, provider="wechatpay"
        )
    market.clock.advance(timedelta(seconds=3))
    with pytest.raises(InvalidTransition, match="deadline has passed"):
        await payments.start_payment(
            market.deps, order_id=order_id, user_id=market.buyer, provider="alipay"
        )


@pytest.mark.parametrize("provider", ["alipay", "wechatpay"])
async def test_an_unpaid_trade_is_closed_before_the_order_is_cancelled(market, provider):
    order_id = await market.order()
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider=provider
    )
    await market.sim.post("/control/scan", json={"provider": provider, "out_trade_no": pay_no})
    market.clock.advance(timedelta(minutes=30))
    await Worker(market.deps).drain()
    assert await market.status(order_id) == "cancelled_unpaid"
    state = (await market.sim.get("/control/state")).json()
    trades = {t["out_trade_no"]: t for t in state["trades"]}
    assert trades[pay_no]["status"] == "closed"


@pytest.mark.parametrize("provider", ["alipay", "wechatpay"])
async def test_a_payment_that_lands_as_the_close_arrives_is_confirmed_not_cancelled(
    market, provider
):
    """The buyer cancels; the trade is paid just as dueflow closes it: the order is paid."""
    from dueflow.exceptions import InvalidTransition

    order_id = await market.order()
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider=provider
    )
    await market.sim.post("/control/scan", json={"provider": provider, "out_trade_no": pay_no})
    await market.sim.post(
        "/control/pay-on-close", json={"provider": provider, "out_trade_no": pay_no}
    )
    with pytest.raises(InvalidTransition, match="paid meanwhile"):
        await orders.cancel_by_buyer(market.deps, order_id=order_id, user_id=market.buyer)
    assert await market.status(order_id) == "pending_shipment"
    await market.sim.post("/control/deliver")  # the notification arrives later: a duplicate
    assert await market.status(order_id) == "pending_shipment"
    assert [o for _, o, _ in await market.inbox()] == ["duplicate"]


async def snapshot(deps: Deps) -> dict[str, list[tuple]]:
    """Every table but the inbox, row by row."""
    return await table_snapshot(deps, skip=("notifications",))


def alipay_notification(market: Market, pay_no: str, **changes: str) -> bytes:
    params = {
        "notify_time": "2026-03-01 20:05:00",
        "notify_type": "trade_status_sync",
        "notify_id": "n1",
        "app_id": market.config.alipay_app_id,
        "seller_id": market.config.alipay_seller_id,
        "charset": "utf-8",
        "version": "1.0",
        "sign_type": "RSA2",
        "trade_no": "2026030122001",
        "out_trade_no": pay_no,
        "trade_status": "TRADE_SUCCESS",
        "total_amount": "88.00",
    }
    params.update(changes)
    params["sign"] = alipay_signing.sign(params, market.config.alipay_key.private_key)
    return urlencode(params).encode()


async def test_every_rejected_alipay_notification_changes_nothing_but_the_inbox(market):
    order_id = await market.order()
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider="alipay"
    )
    before = await snapshot(market.deps)
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    good = alipay_notification(market, pay_no)
    cases = {
        "tampered": good.replace(b"88.00", b"8.00"),
        "unsigned": urlencode({"out_trade_no": pay_no, "trade_status": "TRADE_SUCCESS"}).encode(),
        "other app": alipay_notification(market, pay_no, app_id="2021000000000000"),
        "other seller": alipay_notification(market, pay_no, seller_id="2088000000000000"),
        "wrong amount": alipay_notification(market, pay_no, total_amount="80.00"),
        "unknown trade": alipay_notification(market, "20260301ffffffffffffffff"),
        "oversized": good + b"&x=" + b"a" * 70_000,
        "garbage": b"\xff\xfe not a form",
    }
    for name, body in cases.items():
        answer = await market.app.post("/notify/alipay", content=body, headers=form)
        assert (answer.status_code, answer.text) == (400, "fail"), name
    assert await snapshot(market.deps) == before
    inbox = await market.inbox()
    assert len(inbox) == len(cases)
    assert {outcome for _, outcome, _ in inbox} == {"rejected"}
    answer = await market.app.post("/notify/alipay", content=good, headers=form)
    assert (answer.status_code, answer.text) == (200, "success")
    assert await market.status(order_id) == "pending_shipment"


async def test_rejected_wechat_notifications_change_nothing_but_the_inbox(market):
    order_id = await market.order()
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider="wechatpay"
    )
    before = await snapshot(market.deps)
    config = market.config
    transaction = {
        "appid": config.wechat_appid,
        "mchid": config.wechat_mchid,
        "out_trade_no": pay_no,
        "transaction_id": "4200001",
        "trade_state": "SUCCESS",
        "amount": {"total": 8800, "payer_total": 8800, "currency": "CNY"},
    }

    def notification(tx: dict, *, at: int | None = None, signature: str | None = None):
        body, headers = wechat_notification(market, "TRANSACTION.SUCCESS", tx, at=at)
        if signature is not None:
            headers["Wechatpay-Signature"] = signature
        return body, headers

    stale = int((market.clock.now() - timedelta(minutes=6)).timestamp())
    cases = {
        "stale": notification(transaction, at=stale),
        "probe": notification(transaction, signature="WECHATPAY/SIGNTEST/abc"),
        "other merchant": notification({**transaction, "mchid": "1900000000"}),
        "wrong amount": notification({**transaction, "amount": {"total": 8799}}),
    }
    for name, (body, headers) in cases.items():
        answer = await market.app.post("/notify/wechatpay", content=body, headers=headers)
        assert answer.status_code == 400, name
        assert answer.json()["code"] == "FAIL"
    assert await snapshot(market.deps) == before
    body, headers = notification(transaction)
    answer = await market.app.post("/notify/wechatpay", content=body, headers=headers)
    assert answer.status_code == 204
    assert await market.status(order_id) == "pending_shipment"


async def test_a_refund_is_made_once_however_often_it_is_retried(market):
    from dueflow.service import refunds

    order_id = await market.order()
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider="wechatpay"
    )
    await market.pay("wechatpay", pay_no)
    await orders.cancel_by_seller(market.deps, order_id=order_id, user_id=market.seller)
    [refund] = await refunds.list_refunds(market.deps, state="pending_review")
    assert await refunds.approve(market.deps, refund["id"]) == "processing"
    market.clock.advance(timedelta(seconds=10))
    await Worker(market.deps).drain()
    await market.sim.post("/control/deliver")
    await Worker(market.deps).drain()
    state = (await market.sim.get("/control/state")).json()
    assert len(state["refunds"]) == 1
    async with market.deps.db.read() as conn:
        count = (await conn.execute(select(func.count()).select_from(schema.refunds))).scalar_one()
    assert count == 1


async def test_ten_copies_of_one_notification_at_once_move_the_order_once(market):
    import asyncio

    order_id = await market.order()
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider="alipay"
    )
    body = alipay_notification(market, pay_no)
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    answers = await asyncio.gather(
        *(market.app.post("/notify/alipay", content=body, headers=form) for _ in range(10))
    )
    assert [a.text for a in answers] == ["success"] * 10
    outcomes = sorted(o for _, o, _ in await market.inbox())
    assert outcomes == ["confirmed"] + ["duplicate"] * 9
    view = await orders.order_view(market.deps, order_id)
    assert view["status"] == "pending_shipment"
    assert [e["event"] for e in view["timeline"]].count("pay") == 1


async def test_a_notification_after_the_deadline_cancel_becomes_a_refund(market):
    order_id = await market.order()
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider="alipay"
    )
    await market.sim.post("/control/scan", json={"provider": "alipay", "out_trade_no": pay_no})
    market.clock.advance(timedelta(minutes=30))
    await Worker(market.deps).drain()  # closes the trade, cancels the order
    assert await market.status(order_id) == "cancelled_unpaid"
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    late = alipay_notification(market, pay_no)  # the provider says it was paid after all
    answer = await market.app.post("/notify/alipay", content=late, headers=form)
    assert answer.text == "success"  # answered, so the provider stops retrying
    view = await orders.order_view(market.deps, order_id)
    assert view["status"] == "cancelled_unpaid"
    assert [r["reason"] for r in view["refunds"]] == ["paid_after_cancel"]
    assert [o for _, o, _ in await market.inbox()] == ["refund"]
    again = await market.app.post("/notify/alipay", content=late, headers=form)
    assert again.text == "success"
    view = await orders.order_view(market.deps, order_id)
    assert len(view["refunds"]) == 1


async def test_a_notification_before_the_deadline_timer_wins_and_the_timer_steps_aside(market):
    order_id = await market.order()
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider="wechatpay"
    )
    market.clock.advance(timedelta(minutes=30) - timedelta(seconds=1))
    paid = await market.sim.post(
        "/control/pay", json={"provider": "wechatpay", "out_trade_no": pay_no}
    )  # paid a second before the deadline; the notification is still on its way
    assert paid.status_code == 200
    market.clock.advance(timedelta(seconds=2))  # the deadline passes, the timer has not run
    await market.sim.post("/control/deliver")  # the notification lands first
    assert await market.status(order_id) == "pending_shipment"
    await Worker(market.deps).drain()
    view = await orders.order_view(market.deps, order_id)
    assert view["status"] == "pending_shipment"
    assert view["refunds"] == []
    kinds = {t["kind"]: t["state"] for t in view["timers"]}
    assert kinds["cancel_unpaid"] in ("cancelled", "done")
    assert kinds["cancel_unshipped"] == "scheduled"


async def test_the_verdict_commits_with_the_confirmation_or_neither_does(market, monkeypatch):
    """The confirmation and the inbox row with its verdict are one transaction: when the row
    cannot be written, the payment is not applied either and the provider hears an error (it
    retries); the row is then kept with the error on its own."""
    from dueflow.exceptions import BackendUnavailable
    from dueflow.store import notifications as inbox_store

    order_id = await market.order()
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider="alipay"
    )
    before = await snapshot(market.deps)
    keep = inbox_store.keep
    calls: list[str] = []

    async def failing_once(conn, received, **values):
        calls.append(values["outcome"])
        if len(calls) == 1:
            raise BackendUnavailable("disk full")
        return await keep(conn, received, **values)

    monkeypatch.setattr(inbox_store, "keep", failing_once)
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    body = alipay_notification(market, pay_no)
    answer = await market.app.post("/notify/alipay", content=body, headers=form)
    assert (answer.status_code, answer.text) == (500, "fail")
    assert calls == ["confirmed", "error"]
    assert await snapshot(market.deps) == before  # the confirmation was rolled back with it
    assert await market.inbox() == [("alipay", "error", True)]
    again = await market.app.post("/notify/alipay", content=body, headers=form)
    assert (again.status_code, again.text) == (200, "success")
    assert await market.status(order_id) == "pending_shipment"
    assert await market.inbox() == [("alipay", "error", True), ("alipay", "confirmed", True)]
