"""Real races over one shop order on SQLite, PostgreSQL and MariaDB: its payment against the
buyer's cancel and the pay deadline, and one Idempotency-Key sent several times at once.

Contenders run as several "processes" (:func:`tests.contract.race_harness.race`), each its
own thread, event loop and Deps, on FakeClocks set to one instant. The assertions are on the
database: one winner, and the units, the flash sale, the coupon, the payment, refund,
discrepancy and notice that go with it.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from datetime import datetime
from decimal import Decimal
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from dueflow.api.app import create_app
from dueflow.domain.timers import TimerKind
from dueflow.exceptions import InvalidTransition
from dueflow.service import accounts, orders, payments, shop
from dueflow.service.deps import Deps
from dueflow.service.payments import PaymentOutcome
from dueflow.store.schema import discrepancies, refunds, timers
from dueflow.store.schema import orders as t_orders
from dueflow.store.schema import payments as t_payments
from dueflow.worker.runner import Worker
from tests.conftest import START
from tests.contract.race_harness import Body, Outcome, race, rows
from tests.contract.shop_kit import (
    PROCESSES,
    all_balanced,
    buyer_units,
    coupon_row,
    events_of,
    one,
    orders_of,
    sale_counts,
    sku_counts,
)

# --- a payment against the buyer's cancel (and the pay deadline) -------------------------------

NAMES = ("pay", "buyer_cancel", "pay_timeout")


async def contested_order(world: Any, kind: str) -> dict[str, Any]:
    """A shop order of two lines and a coupon (2 x 25.00 + 1 x 40.00 - 5.00 = 85.00), or a
    flash order of two units (2 x 9.90); what the race needs of it."""
    if kind == "shop":
        cups = await world.sku(stock=10, price="25.00", title="cup")
        plate = await world.sku(stock=10, price="40.00", title="plate")
        coupon_id = await world.coupon(off="5.00", minimum="20.00")
        view = await world.shop_order({cups: 2, plate: 1}, coupon=coupon_id)
        assert view["amount"] == Decimal("85.00"), view
        return {"id": view["id"], "skus": {cups: 2, plate: 1}, "sale": None, "coupon": coupon_id}
    sku_id = await world.sku(stock=10, price="25.00", title="lamp")
    sale_id = await world.flash_sale(sku_id, stock=5, price="9.90", limit=2)
    view = await shop.place_flash_order(
        world.deps, buyer_id=world.buyer, flash_sale_id=sale_id, quantity=2
    )
    return {"id": view["id"], "skus": {sku_id: 2}, "sale": (sale_id, 5), "coupon": None}


def contenders(world: Any, order: dict[str, Any], amount: Decimal, timer_id: int) -> list[Body]:
    async def pay(deps: Deps) -> PaymentOutcome:
        _, outcome = await payments.record_manual_payment(deps, order_id=order["id"], amount=amount)
        return outcome

    async def buyer_cancel(deps: Deps) -> str:
        await orders.cancel_by_buyer(deps, order_id=order["id"], user_id=world.buyer)
        return "cancelled"

    async def timeout(deps: Deps) -> int:
        return await Worker(deps).deliver([timer_id])

    return [pay, buyer_cancel, timeout]


async def settled(deps: Deps, order: dict[str, Any], results: dict[str, Outcome]) -> str:
    """Exactly one of payment, buyer cancel and pay timeout won; the units, the flash sale and
    the coupon agree with it; a payment that lost is a discrepancy with a refund in review."""
    order_id = order["id"]
    row = await one(deps, select(t_orders).where(t_orders.c.id == order_id))
    paid = await rows(deps, select(t_payments).where(t_payments.c.order_id == order_id))
    back = await rows(deps, select(refunds).where(refunds.c.order_id == order_id))
    odd = await rows(deps, select(discrepancies).where(discrepancies.c.order_id == order_id))
    closed = await rows(
        deps,
        select(timers).where(
            timers.c.order_id == order_id, timers.c.kind == TimerKind.ORDER_CLOSED
        ),
    )
    seen = await events_of(deps, order_id)
    pay, cancel, fired = (results[n] for n in NAMES)
    assert pay.error is None and fired.error is None, (pay, fired)
    assert [p.state for p in paid] == ["paid"], "the payment is recorded whoever won"
    coupon = None if order["coupon"] is None else await coupon_row(deps, order["coupon"])
    if row.status == "pending_shipment":
        assert pay.value is PaymentOutcome.CONFIRMED
        assert isinstance(cancel.error, InvalidTransition), cancel
        assert fired.value in (0, 1)
        for sku_id, units in order["skus"].items():
            assert await sku_counts(deps, sku_id) == (10 - units, 0, units, 10)
        if order["sale"] is not None:
            sale_id, stocked = order["sale"]
            assert await sale_counts(deps, sale_id) == (stocked - 2, 0, 2, stocked)
        if coupon is not None:
            assert (coupon.state, coupon.order_id, coupon.used_at) == (
                "used",
                order_id,
                row.paid_at,
            )
        assert back == [] and odd == [] and closed == []
        assert seen == Counter(place=1, pay=1)
        return "pay"
    assert row.status == "cancelled_unpaid", row.status
    assert pay.value is PaymentOutcome.REFUND
    for sku_id in order["skus"]:
        assert await sku_counts(deps, sku_id) == (10, 0, 0, 10)
    if order["sale"] is not None:
        sale_id, stocked = order["sale"]
        assert await sale_counts(deps, sale_id) == (stocked, 0, 0, stocked)
        assert await buyer_units(deps, sale_id) == {}
    if coupon is not None:
        assert (coupon.state, coupon.order_id, coupon.used_at) == ("available", None, None)
    assert [(d.kind, d.payment_id) for d in odd] == [("paid_after_cancel", paid[0].id)]
    assert [(r.state, r.payment_id, r.amount) for r in back] == [
        ("pending_review", paid[0].id, paid[0].amount)
    ]
    assert [t.state for t in closed] == ["scheduled"], "one notice, sent by the worker"
    reason = str(row.cancel_reason)
    if reason == "buyer_cancel":
        assert cancel.error is None
        assert fired.value in (0, 1)
    else:
        assert reason == "pay_timeout", reason
        assert isinstance(cancel.error, InvalidTransition), cancel
        assert fired.value == 1
    assert seen == Counter(
        {"place": 1, reason: 1, "released": 1, "discrepancy": 1, "refund_created": 1}
    )
    return reason


@pytest.mark.parametrize("kind", ["shop", "flash"])
async def test_payment_buyer_cancel_and_timeout_at_once_one_winner(
    backend_world, backend_url, kind
):
    world = backend_world
    rounds = 6
    placed = [await contested_order(world, kind) for _ in range(rounds)]
    winners: Counter[str] = Counter()
    for round_no, order in enumerate(placed):
        row = await one(world.deps, select(t_orders).where(t_orders.c.id == order["id"]))
        timer = await one(
            world.deps,
            select(timers).where(
                timers.c.order_id == order["id"], timers.c.kind == TimerKind.CANCEL_UNPAID
            ),
        )
        bodies = contenders(world, order, row.amount, timer.id)
        # Three rounds truly at once, then each contender with a head start in turn.
        outcomes = await asyncio.to_thread(
            race,
            backend_url,
            row.pay_deadline,
            bodies,
            processes=3,
            first=None if round_no < 3 else round_no - 3,
        )
        winners[await settled(world.deps, order, dict(zip(NAMES, outcomes, strict=True)))] += 1
    assert sum(winners.values()) == rounds
    # The notices: one per cancelled order, with its reason, sent by the worker.
    world.clock.set(max(await deadlines(world.deps, placed)))
    await world.worker.drain()
    cancelled = {
        o.id: o.cancel_reason
        for o in await orders_of(world.deps, [world.buyer])
        if o.status == "cancelled_unpaid"
    }
    assert sorted((r.order_id, r.reason) for r in world.notifier.sent) == sorted(cancelled.items())
    await all_balanced(world.deps)


async def deadlines(deps: Deps, placed: list[dict[str, Any]]) -> list[datetime]:
    query = select(t_orders.c.pay_deadline).where(t_orders.c.id.in_([o["id"] for o in placed]))
    return [r.pay_deadline for r in await rows(deps, query)]


# --- one Idempotency-Key sent several times at once -------------------------------------------


class Apps:
    """One HTTP app per process of a race, built and warmed one process at a time, then
    released together, so the requests still start at once. (FastAPI builds a route's
    parameters at its first request, inside ``warnings.catch_warnings``, which is not thread
    safe: two threads doing so at once can let a pydantic warning through, an error here.)"""

    def __init__(self, processes: int) -> None:
        self.lock = threading.Lock()
        self.built = threading.Barrier(processes)
        self.ready: dict[int, asyncio.Future[httpx.AsyncBaseTransport]] = {}

    async def of(self, deps: Deps, token: str) -> httpx.AsyncBaseTransport:
        """The app of ``deps``'s process, as a transport (warmed by a request of ``token``'s
        that places nothing)."""
        if id(deps) not in self.ready:  # the first contender of its process builds it
            ready = self.ready[id(deps)] = asyncio.get_running_loop().create_future()
            try:
                with self.lock:
                    transport = httpx.ASGITransport(app=create_app(deps))
                    async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
                        answer = await client.post("/api/orders", json={}, headers=auth(token))
                    assert answer.status_code == 422, answer.text
                await asyncio.to_thread(self.built.wait, 60)
            except BaseException as exc:
                self.built.abort()
                ready.set_exception(exc)
                raise
            ready.set_result(transport)
        return await self.ready[id(deps)]


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


BASE = "http://dueflow"


def posting(apps: Apps, token: str, key: str, body: dict[str, Any]) -> Body:
    """A contender posting ``body`` to ``POST /api/orders`` with ``key``, through the HTTP app
    of its own process; returns (status, answer)."""

    async def post(deps: Deps) -> tuple[int, Any]:
        transport = await apps.of(deps, token)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
            answer = await client.post(
                "/api/orders", json=body, headers={**auth(token), "Idempotency-Key": key}
            )
        return answer.status_code, answer.json()

    return post


async def test_one_idempotency_key_sent_five_times_at_once_places_one_order(
    backend_world, backend_url
):
    world = backend_world
    for round_no in range(3):
        buyer, token = await accounts.add_user(world.deps, f"retrier{round_no}")
        cups = await world.sku(stock=3, title=f"cup {round_no}")
        plate = await world.sku(stock=10, price="40.00", title=f"plate {round_no}")
        coupon_id = await world.coupon(to=buyer.id)
        body = {
            "lines": [{"sku_id": plate, "quantity": 1}, {"sku_id": cups, "quantity": 2}],
            "coupon_id": coupon_id,
        }
        apps = Apps(PROCESSES)
        bodies = [posting(apps, token, f"retry-{round_no}", body) for _ in range(5)]
        outcomes = await asyncio.to_thread(race, backend_url, START, bodies, processes=PROCESSES)
        assert [o.error for o in outcomes] == [None] * 5
        answers = [o.value for o in outcomes]
        assert {status for status, _ in answers} == {201}, answers
        (order_id,) = {view["id"] for _, view in answers}
        (placed,) = await orders_of(world.deps, [buyer.id])
        assert (placed.id, placed.amount) == (order_id, Decimal("85.00"))
        assert await sku_counts(world.deps, cups) == (1, 2, 0, 3)
        assert await sku_counts(world.deps, plate) == (9, 1, 0, 10)
        held = await coupon_row(world.deps, coupon_id)
        assert (held.state, held.order_id) == ("locked", order_id)
    await all_balanced(world.deps)
