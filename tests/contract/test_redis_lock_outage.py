"""Redis locks through a real outage (issue 9, item 6): dueflow reaches the real Redis through a
small TCP proxy that the test cuts (every connection closed, the port no longer listening) and
brings back on the same port. Locks are an optimisation: while Redis is away orders and
notifications go ahead on the database's guarded updates alone, counted and logged; once it is
back the locks are used again. The shared Redis server itself is never stopped."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from dueflow.exceptions import Busy
from dueflow.locks.redis import RedisLocks
from dueflow.service import accounts, orders, payments
from tests.conftest import eventually
from tests.contract.conftest import REDIS_URL
from tests.contract.test_redis_locks import TTL, Market, locked_market, wechat_paid
from tests.proxy import Proxy

pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("redis_available")]


@pytest.fixture
async def proxy() -> AsyncIterator[Proxy]:
    parts = urlsplit(REDIS_URL)
    made = Proxy(parts.hostname or "127.0.0.1", parts.port or 6379)
    await made.start()
    try:
        yield made
    finally:
        if made.listening:
            await made.cut()


def through(proxy: Proxy) -> str:
    """The test database's URL, by way of the proxy."""
    return f"redis://127.0.0.1:{proxy.port}{urlsplit(REDIS_URL).path}"


def bypassed(market: Market) -> float:
    """dueflow_lock_bypassed_total, as Prometheus reads it."""
    value = market.deps.metrics.registry.get_sample_value("dueflow_lock_bypassed_total")
    assert value is not None
    return value


async def pay_by_notification(market: Market) -> int:
    """Place an order, start a WeChat payment and have its notification applied."""
    order_id = await market.order()
    pay_no, _ = await payments.start_payment(
        market.deps, order_id=order_id, user_id=market.buyer, provider="wechatpay"
    )
    body, headers = wechat_paid(market, pay_no)
    answer = await market.app.post("/notify/wechatpay", content=body, headers=headers)
    assert answer.status_code == 204, answer.text
    assert await market.status(order_id) == "pending_shipment"
    return order_id


async def test_orders_and_notifications_go_ahead_while_redis_is_away(
    db_path: Path, proxy: Proxy, caplog: pytest.LogCaptureFixture
) -> None:
    """Placing, starting a payment and its notification all succeed with Redis away; each
    skipped lock is counted, the outage is logged once; afterwards the counter stops growing."""
    async with locked_market(db_path, through(proxy), lock_wait="200ms") as market:
        await pay_by_notification(market)  # locks in use: nothing bypassed
        assert bypassed(market) == 0

        await proxy.cut()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="dueflow.locks"):
            for _ in range(3):
                await pay_by_notification(market)  # placing, starting, the notification
        assert bypassed(market) >= 3
        # One warning for the outage, not one per request (three orders, nine locks skipped).
        unreachable = [r for r in caplog.records if "without their lock" in r.getMessage()]
        assert len(unreachable) == 1, [r.getMessage() for r in caplog.records]

        await proxy.start()
        assert await eventually(lambda: locks_used(market), seconds=5, interval=0.1)
        after = bypassed(market)
        await pay_by_notification(market)
        assert bypassed(market) == after  # the counter stopped growing


async def test_a_redis_restart_costs_no_request(db_path: Path, proxy: Proxy) -> None:
    """Redis restarted between two requests: the pooled connection is dead; the next request
    reconnects and takes its lock (nothing bypassed, nothing refused)."""
    async with locked_market(db_path, through(proxy)) as market:
        await pay_by_notification(market)
        await proxy.cut()
        await proxy.start()
        await pay_by_notification(market)
        assert bypassed(market) == 0


async def test_locks_are_in_force_again_after_the_outage(db_path: Path, proxy: Proxy) -> None:
    """Once Redis is back, goods locked by another process are busy again for a new order."""
    async with locked_market(db_path, through(proxy), lock_wait="100ms") as market:
        await proxy.cut()
        await market.order()
        await proxy.start()
        assert await eventually(lambda: locks_used(market), seconds=5, interval=0.1)
        goods_id = await goods(market)
        other = RedisLocks.from_url(REDIS_URL)  # another process, dueflow's prefix
        try:
            token = await other.acquire(f"goods:{goods_id}", TTL)
            assert token is not None
            with pytest.raises(Busy):
                await place(market, goods_id)
            assert await other.release(f"goods:{goods_id}", token)
        finally:
            await other.close()
        await place(market, goods_id)


async def goods(market: Market) -> int:
    return await accounts.add_goods(market.deps, seller_id=market.seller, title="tent", price="88")


async def place(market: Market, goods_id: int) -> int:
    return await orders.place_order(market.deps, buyer_id=market.buyer, goods_id=goods_id)


async def locks_used(market: Market) -> bool:
    """Place an order; True when it took its lock (nothing bypassed meanwhile)."""
    before = bypassed(market)
    await place(market, await goods(market))
    return bypassed(market) == before


async def test_a_lock_whose_reply_was_lost_is_still_its_takers(proxy: Proxy) -> None:
    """Found in review: the lock was taken but the reply lost with the connection; the client
    retries on a fresh connection and must find the key its own, not busy for the whole TTL."""
    locks = RedisLocks.from_url(through(proxy))
    try:
        warm = await locks.acquire("warm", TTL)
        assert warm is not None and await locks.release("warm", warm)
        proxy.lose_next_reply = True
        token = await locks.acquire("order:lost-reply", TTL)
        assert token is not None
        assert not proxy.lose_next_reply  # the reply really was lost once
        assert await locks.release("order:lost-reply", token)
    finally:
        await locks.close()
