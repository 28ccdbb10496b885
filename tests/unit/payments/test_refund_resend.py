"""Refunds the provider does not know are submitted again, and a provider's long last word is
stored cut, never a failed write (issue 9 item 1).

dueflow's real providers talk to the real simulator (in process, one FakeClock), on every
database backend: SQLite does not enforce VARCHAR lengths, PostgreSQL and MariaDB do.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from dueflow import bootstrap
from dueflow.api.app import create_app as dueflow_app
from dueflow.clock import FakeClock
from dueflow.config import load_settings
from dueflow.payments.base import (
    PaymentProvider,
    Providers,
    RefundOutcome,
    RefundRequest,
    RefundResult,
)
from dueflow.payments.manual import ManualProvider
from dueflow.payments.simulator import SimulatorConfig
from dueflow.payments.simulator.app import create_app as simulator_app
from dueflow.service import accounts, orders, payments, refunds
from dueflow.store import orders as order_store
from dueflow.store import payments as payment_store
from dueflow.store import schema
from dueflow.worker.runner import Worker
from tests.conftest import START, _reset_server_database
from tests.unit.payments.test_payment_flow import Forward, Market

PROVIDERS = ["alipay", "wechatpay"]


@pytest.fixture
def sim_options() -> dict[str, Any]:
    """The simulator's settings; a test parametrizes this to change them."""
    return {}


@pytest.fixture
async def market(backend_url: str, sim_options: dict[str, Any]) -> AsyncIterator[Market]:
    """test_payment_flow's market (dueflow and the simulator calling each other), on each
    database backend in turn."""
    clock = FakeClock(START)
    forward = Forward()
    config = SimulatorConfig.generate(clock=clock, transport=forward, **sim_options)
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


async def refund_in_review(market: Market, provider: str) -> tuple[int, int]:
    """An order paid through ``provider``, then cancelled by its seller: (order, refund id)."""
    order_id = await market.order()
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider=provider
    )
    await market.pay(provider, pay_no)
    assert await market.status(order_id) == "pending_shipment"
    await orders.cancel_by_seller(market.deps, order_id=order_id, user_id=market.seller)
    [refund] = await refunds.list_refunds(market.deps, state="pending_review")
    return order_id, refund["id"]


async def sim_refunds(market: Market) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = (await market.sim.get("/control/state")).json()["refunds"]
    return found


async def refund_state(market: Market, refund_id: int) -> str:
    async with market.deps.db.read() as conn:
        row = await payment_store.refund_by_id(conn, refund_id)
    assert row is not None
    return str(row.state)


async def follow_until_final(market: Market, refund_id: int) -> list[str]:
    """Let the refund_check timer (and the provider's notifications) run, a minute of clock at a
    time, until the refund is final; returns the states seen after each round."""
    seen = []
    for _ in range(12):
        market.clock.advance(timedelta(minutes=1))
        await Worker(market.deps).drain()
        await market.sim.post("/control/deliver")
        seen.append(await refund_state(market, refund_id))
        if seen[-1] != "processing":
            break
    return seen


async def refund_events(market: Market, order_id: int) -> list[str]:
    view = await orders.order_view(market.deps, order_id)
    return [e["event"] for e in view["timeline"] if e["event"].startswith("refund_")]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_refund_lost_to_a_bare_502_is_submitted_again_and_paid(market, provider):
    order_id, refund_id = await refund_in_review(market, provider)
    await market.sim.post(
        "/control/fail-next", json={"provider": provider, "method": "refund", "mode": "5xx"}
    )
    assert await refunds.approve(market.deps, refund_id) == "processing"
    assert await sim_refunds(market) == []  # it never reached the provider

    assert (await follow_until_final(market, refund_id))[-1] == "succeeded"
    [made] = await sim_refunds(market)  # submitted again with the same number: once
    async with market.deps.db.read() as conn:
        row = await payment_store.refund_by_id(conn, refund_id)
    assert row is not None and made["out_refund_no"] == row.refund_no
    assert "refund_failed" not in await refund_events(market, order_id)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_refund_cut_off_by_a_crash_before_the_call_is_submitted_by_its_check(
    market, provider, monkeypatch
):
    """The process stops between the ``processing`` commit and the provider call."""
    order_id, refund_id = await refund_in_review(market, provider)
    real = market.deps.providers.get(provider)
    calls: list[RefundRequest] = []
    submit = real.refund

    async def crash_first(request: RefundRequest) -> RefundOutcome:
        calls.append(request)
        if len(calls) == 1:
            raise asyncio.CancelledError  # before anything is sent
        return await submit(request)

    monkeypatch.setattr(real, "refund", crash_first)
    with pytest.raises(asyncio.CancelledError):
        await refunds.approve(market.deps, refund_id)
    assert await refund_state(market, refund_id) == "processing"

    assert (await follow_until_final(market, refund_id))[-1] == "succeeded"
    assert len(calls) >= 2 and len({c.refund_no for c in calls}) == 1
    assert len(await sim_refunds(market)) == 1
    assert "refund_failed" not in await refund_events(market, order_id)


@pytest.mark.parametrize("sim_options", [{"refund_settle_after": timedelta(minutes=2)}])
async def test_a_refund_the_provider_knows_is_not_submitted_again_while_it_processes(market):
    """A WeChat refund stays PROCESSING for a while: each check asks, and only asks."""
    _, refund_id = await refund_in_review(market, "wechatpay")
    real = market.deps.providers.get("wechatpay")
    submits: list[RefundRequest] = []
    submit = real.refund

    async def counted(request: RefundRequest) -> RefundOutcome:
        submits.append(request)
        return await submit(request)

    real.refund = counted  # type: ignore[method-assign]
    assert await refunds.approve(market.deps, refund_id) == "processing"
    market.clock.advance(refunds.FIRST_CHECK)
    await Worker(market.deps).drain()
    assert await refund_state(market, refund_id) == "processing"
    assert (await follow_until_final(market, refund_id))[-1] == "succeeded"
    assert len(submits) == 1


# --- a final word longer than its column ----------------------------------------------------


class FinalWord(PaymentProvider):
    """A provider (a fake of the port: the store is under test) whose refunds fail for good
    with a very long message, as a real provider's may."""

    name = "wordy"

    def __init__(self, reason: str) -> None:
        self.reason = reason

    async def close_or_query(self, attempt, now):  # pragma: no cover - not used here
        raise AssertionError("not used")

    async def refund(self, request: RefundRequest) -> RefundOutcome:
        return RefundOutcome(RefundResult.FAILED, self.reason)


async def wordy_refund(world) -> tuple[int, int]:
    goods_id = await world.goods()
    order_id = await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)
    pay_no, _ = await payments.record_manual_payment(world.deps, order_id=order_id, amount="12.50")
    async with world.deps.db.write() as conn:
        await conn.execute(
            schema.payments.update()
            .where(schema.payments.c.pay_no == pay_no)
            .values(provider="wordy")
        )
    await orders.cancel_by_seller(world.deps, order_id=order_id, user_id=world.seller)
    [refund] = await refunds.list_refunds(world.deps, state="pending_review")
    async with world.deps.db.write() as conn:
        await conn.execute(
            schema.refunds.update()
            .where(schema.refunds.c.id == refund["id"])
            .values(provider="wordy")
        )
    return order_id, refund["id"]


async def test_a_final_message_longer_than_its_columns_is_stored_cut(backend_world):
    world = backend_world
    reason = "余额不足 " + "x" * 3000  # longer than the timeline's detail column (500)
    world.deps.providers = Providers([ManualProvider(), FinalWord(reason)])
    order_id, refund_id = await wordy_refund(world)
    assert await refunds.approve(world.deps, refund_id) == "failed"
    async with world.deps.db.read() as conn:
        row = await payment_store.refund_by_id(conn, refund_id)
        timeline = await order_store.timeline(conn, order_id)
    assert row is not None and row.state == "failed"
    assert row.last_error == reason  # a text column: kept whole
    [failed] = [e for e in timeline if e.event == "refund_failed"]
    assert failed.detail == f"{row.refund_no} {reason}"[:500]
    # Nothing left to follow: no refund stuck in processing, no timer asking forever.
    view = await orders.order_view(world.deps, order_id)
    assert {t["kind"]: t["state"] for t in view["timers"]}["refund_check"] == "cancelled"


async def test_timeline_texts_are_cut_to_their_columns_for_one_order_and_a_batch(backend_world):
    world = backend_world
    ids = [
        await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=await world.goods())
        for _ in range(3)
    ]
    long_detail, long_actor, long_event = "д" * 900, "a" * 100, "e" * 60
    async with world.deps.db.write() as conn:
        for batch in (ids[:1], ids[1:]):  # one row, then the INSERT ... SELECT of a batch
            await order_store.record_events(
                conn,
                batch,
                event=long_event,
                actor=long_actor,
                now=world.clock.now(),
                detail=long_detail,
            )
    async with world.deps.db.read() as conn:
        query = select(schema.order_events).where(schema.order_events.c.event.like("eee%"))
        rows = (await conn.execute(query)).all()
    assert len(rows) == 3
    for row in rows:
        assert (row.event, row.actor, row.detail) == (
            long_event[:32],
            long_actor[:64],
            long_detail[:500],
        )
