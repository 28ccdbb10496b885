"""One trigger contract, run on db, redis (one server and a local Redis Cluster) and rabbitmq
(classic and quorum queues): a deadline is met within about a second
by a running worker, a repeated delivery has one effect, and a trigger that lost everything costs
lateness, never a deadline. Uses the real clock for the one-second deadlines (bounded waits for
the worker task), the real Redis and RabbitMQ."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from sqlalchemy import select

from dueflow import bootstrap, redis_url
from dueflow.clock import FakeClock, SystemClock
from dueflow.config import load_settings
from dueflow.service import accounts, orders
from dueflow.service.deps import Deps
from dueflow.store import schema
from dueflow.worker.runner import Worker
from dueflow.worker.scanner import scan_once
from tests import redis_cluster
from tests.conftest import START, eventually, require_service
from tests.contract.conftest import delete_matching

REDIS = os.environ.get("DUEFLOW_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
AMQP = os.environ.get("DUEFLOW_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")


@pytest.fixture(
    params=[
        pytest.param("db"),
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("redis-cluster", marks=pytest.mark.redis),
        pytest.param("rabbitmq", marks=pytest.mark.rabbitmq),
        pytest.param("rabbitmq-quorum", marks=pytest.mark.rabbitmq),
    ]
)
def trigger_url(request: pytest.FixtureRequest) -> str:
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    if request.param == "redis":
        require_service("redis", "127.0.0.1", 6379)
        return f"{REDIS}?prefix={prefix}"
    if request.param == "redis-cluster":
        cluster: redis_cluster.LocalCluster = request.getfixturevalue("local_cluster")
        return f"{cluster.url}?prefix={prefix}"
    if request.param.startswith("rabbitmq"):
        require_service("rabbitmq", "127.0.0.1", 5672)
        queues = "quorum" if request.param == "rabbitmq-quorum" else "classic"
        return f"{AMQP}?prefix={prefix}&queues={queues}"
    return "db"


@pytest.fixture
async def live(db_path, trigger_url) -> AsyncIterator[tuple[Deps, int, int]]:
    """Wired deps on the real clock with a 1 s pay timeout, a seller and a buyer."""
    async for wired in _wired(db_path, trigger_url, SystemClock()):
        yield wired


@pytest.fixture
async def faked(db_path, trigger_url) -> AsyncIterator[tuple[Deps, int, int]]:
    """The same on a FakeClock that the test moves."""
    async for wired in _wired(db_path, trigger_url, FakeClock(START)):
        yield wired


async def _wired(db_path, trigger_url, clock) -> AsyncIterator[tuple[Deps, int, int]]:
    settings = load_settings(
        database_url=f"sqlite:///{db_path}",
        trigger_url=trigger_url,
        pay_timeout="1s",
        reminder_after="0s",
        scan_grace="0s",
    )
    async with bootstrap.running(settings, clock=clock, migrate_sqlite=False) as deps:
        seller, _ = await accounts.add_user(deps, "seller")
        buyer, _ = await accounts.add_user(deps, "buyer")
        yield deps, seller.id, buyer.id
        trigger = deps.trigger
    await _remove(trigger)


async def _lose(deps: Deps) -> None:
    """Everything the trigger keeps outside the database is lost (Redis flushed, queues purged)."""
    trigger = deps.trigger
    if trigger.scheme == "redis":
        await delete_matching(trigger._redis(), trigger.prefix)  # type: ignore[attr-defined]
    elif trigger.scheme == "amqp":
        channel = await trigger._channel()  # type: ignore[attr-defined]
        for name in trigger.queue_names:  # type: ignore[attr-defined]
            queue = await channel.get_queue(name, ensure=True)
            await queue.purge()


async def _remove(trigger) -> None:
    """After the trigger is closed: delete its keys or queues."""
    if trigger.scheme == "redis":
        client = redis_url.connect(trigger.url)
        await delete_matching(client, trigger.prefix)
        await client.aclose()
    elif trigger.scheme == "amqp":
        import aio_pika

        connection = await aio_pika.connect(AMQP)
        async with connection:
            channel = await connection.channel()
            for name in trigger.queue_names:
                await channel.queue_delete(name)


async def order_row(deps: Deps, order_id: int):
    async with deps.db.read() as conn:
        return (
            await conn.execute(select(schema.orders).where(schema.orders.c.id == order_id))
        ).one()


async def has_status(deps: Deps, order_id: int, wanted: str) -> bool:
    return (await order_row(deps, order_id)).status == wanted


async def timer_row(deps: Deps, order_id: int):
    async with deps.db.read() as conn:
        query = select(schema.timers).where(
            schema.timers.c.order_id == order_id, schema.timers.c.kind == "cancel_unpaid"
        )
        return (await conn.execute(query)).one()


async def test_a_deadline_is_met_within_about_a_second(live):
    deps, seller, buyer = live
    stop = asyncio.Event()
    worker = Worker(deps)
    task = asyncio.create_task(worker.run(stop))
    try:
        assert await eventually(lambda: worker.stats.waits > 0)  # idle when the order arrives
        goods_id = await accounts.add_goods(deps, seller_id=seller, title="lamp", price="3")
        order_id = await orders.place_order(deps, buyer_id=buyer, goods_id=goods_id)
        assert await eventually(lambda: has_status(deps, order_id, "cancelled_unpaid"), 10, 0.05), (
            "the deadline was not met"
        )
    finally:
        stop.set()
        deps.trigger.wake()
        await asyncio.wait_for(task, 10)
    timer = await timer_row(deps, order_id)
    late = (timer.done_at - timer.deadline_at).total_seconds()
    assert 0 <= late < 1.0, f"{deps.trigger.scheme}: {late:.3f} s late"


async def test_a_repeated_delivery_has_one_effect(faked):
    deps, seller, buyer = faked
    goods_id = await accounts.add_goods(deps, seller_id=seller, title="lamp", price="3")
    order_id = await orders.place_order(deps, buyer_id=buyer, goods_id=goods_id)
    timer = await timer_row(deps, order_id)
    deps.clock.advance(timedelta(seconds=1))  # the 1 s pay deadline passes
    worker = Worker(deps)
    claimed = await asyncio.gather(*(worker.deliver([timer.id]) for _ in range(5)))
    assert sorted(claimed) == [0, 0, 0, 0, 1]
    async with deps.db.read() as conn:
        events = (
            await conn.execute(
                select(schema.order_events.c.event).where(
                    schema.order_events.c.order_id == order_id
                )
            )
        ).scalars()
        assert list(events).count("pay_timeout") == 1


async def test_a_trigger_that_lost_everything_costs_lateness_not_the_deadline(faked):
    deps, seller, buyer = faked
    goods_id = await accounts.add_goods(deps, seller_id=seller, title="lamp", price="3")
    order_id = await orders.place_order(deps, buyer_id=buyer, goods_id=goods_id)
    await _lose(deps)  # nothing to lose for db
    deps.clock.advance(timedelta(seconds=1))
    report = await scan_once(Worker(deps))
    assert report.claimed >= 1
    assert (await order_row(deps, order_id)).status == "cancelled_unpaid"
