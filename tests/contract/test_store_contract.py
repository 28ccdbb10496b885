"""One store contract, run on SQLite, PostgreSQL and MariaDB (the ``backend_world`` fixture).

In CI every backend runs against the real service and fails if it is unreachable; locally an
unreachable service is skipped.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from decimal import Decimal

from sqlalchemy import func, select

from dueflow import bootstrap
from dueflow.config import load_settings
from dueflow.exceptions import Busy, GoodsUnavailable
from dueflow.service import orders, payments
from dueflow.service.orders import order_view
from dueflow.store import schema, timers
from dueflow.worker.scanner import scan_once


async def count(world, query) -> int:
    async with world.deps.db.read() as conn:
        return int((await conn.execute(query)).scalar_one())


async def test_the_whole_order_life(backend_world):
    w = backend_world
    goods_id = await w.goods("8800.00")
    order_id = await orders.place_order(w.deps, buyer_id=w.buyer, goods_id=goods_id)
    await payments.record_manual_payment(w.deps, order_id=order_id, amount="8800")
    await orders.ship(w.deps, order_id=order_id, user_id=w.seller, carrier="SF", tracking_no="1")
    w.clock.advance(timedelta(days=10))
    assert await w.worker.drain() == 1
    await orders.review(w.deps, order_id=order_id, user_id=w.buyer, rating=4, comment="fine")
    w.clock.advance(timedelta(days=15))
    assert await w.worker.drain() == 1
    view = await order_view(w.deps, order_id)
    assert view["status"] == "completed"
    assert sorted((r["role"], r["is_default"]) for r in view["reviews"]) == [
        ("buyer", False),
        ("seller", True),
    ]
    assert view["amount"] == Decimal("8800.00")
    assert [e["event"] for e in view["timeline"]] == [
        "place",
        "pay",
        "ship",
        "receive_timeout",
        "review",
        "review_timeout",
    ]


async def test_times_and_money_round_trip_exactly(backend_world):
    w = backend_world
    goods_id = await w.goods("0.10")
    w.clock.advance(timedelta(microseconds=123457))
    order_id = await orders.place_order(w.deps, buyer_id=w.buyer, goods_id=goods_id)
    view = await order_view(w.deps, order_id)
    assert view["amount"] == Decimal("0.10")
    assert isinstance(view["amount"], Decimal)
    assert view["created_at"] == w.clock.now()
    assert view["created_at"].tzinfo is not None
    assert view["pay_deadline"] == w.clock.now() + timedelta(minutes=30)


async def test_unpaid_order_cancelled_at_the_deadline_releases_the_goods(backend_world):
    w = backend_world
    goods_id = await w.goods()
    order_id = await orders.place_order(w.deps, buyer_id=w.buyer, goods_id=goods_id)
    w.clock.advance(timedelta(minutes=30) - timedelta(microseconds=1))
    await w.worker.drain()
    assert (await order_view(w.deps, order_id))["status"] == "pending_payment"
    w.clock.advance(timedelta(microseconds=1))
    await w.worker.drain()
    assert (await order_view(w.deps, order_id))["status"] == "cancelled_unpaid"
    again = await orders.place_order(w.deps, buyer_id=w.other, goods_id=goods_id)
    assert (await order_view(w.deps, again))["status"] == "pending_payment"


async def test_many_buyers_at_once_get_one_order(backend_world, backend_url):
    """Ten buyers, each on its own engine and connections, race for one goods item."""
    w = backend_world
    goods_id = await w.goods()
    buyers = [w.buyer, w.other]
    from dueflow.service import accounts

    for n in range(8):
        user, _ = await accounts.add_user(w.deps, f"racer{n}")
        buyers.append(user.id)
    settings = load_settings(database_url=backend_url, profile="prod")

    async def buy(buyer_id: int) -> object:
        async with bootstrap.running(settings, clock=w.clock, migrate_sqlite=False) as deps:
            try:
                return await orders.place_order(deps, buyer_id=buyer_id, goods_id=goods_id)
            except (GoodsUnavailable, Busy) as exc:
                return exc

    results = await asyncio.gather(*(buy(b) for b in buyers))
    won = [r for r in results if isinstance(r, int)]
    assert len(won) == 1
    assert all(isinstance(r, GoodsUnavailable | Busy) for r in results if not isinstance(r, int))
    assert await count(w, select(func.count()).select_from(schema.orders)) == 1
    assert await count(w, select(func.count()).select_from(schema.timers)) == 2


async def test_payment_and_deadline_race_has_one_winner(backend_world, backend_url):
    w = backend_world
    settings = load_settings(database_url=backend_url, profile="prod")
    placed = []
    for n in range(6):
        placed.append(
            await orders.place_order(
                w.deps, buyer_id=w.buyer, goods_id=await w.goods(title=f"g{n}")
            )
        )
    w.clock.advance(timedelta(minutes=30))

    async def again_while_busy(action) -> None:
        """What a client does with "busy, try again" (a lock wait or a deadlock victim)."""
        for _ in range(20):
            try:
                return await action()
            except Busy:
                await asyncio.sleep(0.01)
        raise AssertionError("still busy after 20 tries")

    async def pay(order_id: int) -> None:
        async with bootstrap.running(settings, clock=w.clock, migrate_sqlite=False) as deps:
            await again_while_busy(
                lambda: payments.record_manual_payment(deps, order_id=order_id, amount="12.50")
            )

    async def expire() -> None:
        async with bootstrap.running(settings, clock=w.clock, migrate_sqlite=False) as deps:
            from dueflow.worker.runner import Worker

            await again_while_busy(Worker(deps).drain)

    await asyncio.gather(expire(), *(pay(o) for o in placed))
    for order_id in placed:
        view = await order_view(w.deps, order_id)
        if view["status"] == "pending_shipment":
            assert view["refunds"] == []
            assert {t["kind"]: t["state"] for t in view["timers"]}["cancel_unshipped"] == (
                "scheduled"
            )
        else:
            assert view["status"] == "cancelled_unpaid"
            assert [r["reason"] for r in view["refunds"]] == ["paid_after_cancel"]
    held = await count(
        w,
        select(func.count())
        .select_from(schema.goods)
        .join(schema.orders, schema.orders.c.id == schema.goods.c.reserved_order_id)
        .where(schema.orders.c.status == "cancelled_unpaid"),
    )
    assert held == 0


async def test_concurrent_claims_are_disjoint(backend_world):
    w = backend_world
    for n in range(12):
        await orders.place_order(w.deps, buyer_id=w.buyer, goods_id=await w.goods(title=f"g{n}"))
    w.clock.advance(timedelta(minutes=30))
    now = w.clock.now()

    async def claim() -> list[int]:
        async with w.deps.db.write() as conn:
            got = await timers.claim_due(conn, now=now, limit=5, lease=timedelta(minutes=1))
            await asyncio.sleep(0.05)  # hold the transaction open while the others claim
            return [t.id for t in got]

    results = await asyncio.gather(claim(), claim(), claim(), claim(), claim())
    claimed = [i for r in results for i in r]
    assert len(claimed) == len(set(claimed)) == 24  # 12 orders x (reminder + cancel)


async def test_expired_leases_are_taken_back_by_the_scanner(backend_world):
    w = backend_world
    order_id = await orders.place_order(w.deps, buyer_id=w.buyer, goods_id=await w.goods())
    w.clock.advance(timedelta(minutes=31))
    async with w.deps.db.write() as conn:
        lost = await timers.claim_due(conn, now=w.clock.now(), limit=10, lease=timedelta(minutes=1))
    assert len(lost) == 2  # a worker claimed them and died
    w.clock.advance(timedelta(minutes=2))
    report = await scan_once(w.worker)
    assert report.claimed == 2
    view = await order_view(w.deps, order_id)
    assert view["status"] == "cancelled_unpaid"
    events = [e["event"] for e in view["timeline"]]
    assert events.count("pay_timeout") == 1
