"""The Redis trigger on a real local Redis Cluster whose master is killed (SIGKILL) mid-herd
and its replica promoted: every timer fires, none twice, late by at most a scan interval, and
the trigger delivers on the promoted node afterwards.

The cluster is this module's own (a killed node would change the session's cluster for the
other tests). Deadlines come from the world's FakeClock; the failover itself is real.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from datetime import datetime

import pytest
import redis
from sqlalchemy import func, select

from dueflow.exceptions import BackendUnavailable
from dueflow.service import orders as order_service
from dueflow.store.schema import order_events
from dueflow.store.schema import orders as t_orders
from dueflow.store.schema import timers as t_timers
from dueflow.timers.redis import RedisTrigger
from dueflow.worker.scanner import scan_once
from tests import redis_cluster
from tests.conftest import World, eventually, in_ci

pytestmark = [pytest.mark.redis]

#: A small herd: enough to spread over every shard, cheap to run.
HERD = 24


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[redis_cluster.LocalCluster]:
    if not redis_cluster.available():
        if in_ci():
            pytest.fail("redis-server and redis-cli are required in CI for the cluster tests")
        pytest.skip("no redis-server here: the Redis Cluster tests need it")
    with redis_cluster.running() as cluster:
        yield cluster


@pytest.fixture
async def on_cluster(
    world: World, own_cluster: redis_cluster.LocalCluster, prefix: str
) -> AsyncIterator[World]:
    """The world with the trigger on the cluster: 6 shards, small batches."""
    world.deps.trigger = RedisTrigger.from_url(
        f"{own_cluster.url}?prefix={prefix}&shards=6&batch=6", clock=world.clock
    )
    try:
        yield world
    finally:
        await world.deps.trigger.close()


async def place_herd(world: World, count: int) -> tuple[list[int], datetime]:
    """``count`` unpaid orders placed at the same (fake) moment, and their pay deadline."""
    placed = [
        await order_service.place_order(
            world.deps, buyer_id=world.buyer, goods_id=await world.goods()
        )
        for _ in range(count)
    ]
    async with world.deps.db.read() as conn:
        query = select(func.max(t_orders.c.pay_deadline)).where(t_orders.c.id.in_(placed))
        deadline = (await conn.execute(query)).scalar_one()
    return placed, deadline


async def open_timers(world: World, order_ids: list[int]) -> int:
    async with world.deps.db.read() as conn:
        query = select(func.count()).where(
            t_timers.c.order_id.in_(order_ids), t_timers.c.done_at.is_(None)
        )
        return int((await conn.execute(query)).scalar_one())


async def check_fired_once(world: World, order_ids: list[int], herd_at: datetime) -> None:
    """Every order cancelled by its deadline once, every timer done, none later than a scan
    interval past its deadline (or past ``herd_at``, when the clock jumped to the herd: the
    reminders fell due before it); one order-closed notice each."""
    async with world.deps.db.read() as conn:
        statuses = await conn.execute(select(t_orders.c.status).where(t_orders.c.id.in_(order_ids)))
        assert set(statuses.scalars()) == {"cancelled_unpaid"}
        cancels = await conn.execute(
            select(order_events.c.order_id, func.count())
            .where(
                order_events.c.order_id.in_(order_ids),
                order_events.c.to_status == "cancelled_unpaid",
            )
            .group_by(order_events.c.order_id)
        )
        assert {row[0]: row[1] for row in cancels} == dict.fromkeys(order_ids, 1)
        rows = (
            await conn.execute(
                select(t_timers.c.deadline_at, t_timers.c.done_at).where(
                    t_timers.c.order_id.in_(order_ids)
                )
            )
        ).all()
    assert rows and all(row.done_at is not None for row in rows)
    late = max(row.done_at - max(row.deadline_at, herd_at) for row in rows)
    assert late <= world.deps.scan_interval, late
    closed = [
        n.order_id
        for n in world.notifier.sent
        if n.kind == "order_closed" and n.order_id in order_ids
    ]
    assert sorted(closed) == sorted(order_ids)


async def test_a_master_killed_mid_herd_loses_no_timer_and_fires_none_twice(
    on_cluster: World, own_cluster: redis_cluster.LocalCluster
) -> None:
    world = on_cluster
    trigger = world.deps.trigger
    assert isinstance(trigger, RedisTrigger)
    herd, deadline = await place_herd(world, HERD)
    world.clock.set(deadline)

    # Mid-herd: one claim delivered and acknowledged, the next claimed and still in flight.
    done = await trigger.wait(world.clock, world.clock.now())
    assert done
    await world.worker.deliver(done)
    await world.deps.ack(done)
    in_flight = list(await trigger.wait(world.clock, world.clock.now()) or [])
    assert in_flight
    victim = own_cluster.master_of(trigger.shard_of(in_flight[0]).due)
    replica = own_cluster.replica_of(victim)
    own_cluster.kill(victim)

    # The batch in flight is handled; its acknowledgement may not reach the dead master (its
    # lease keeps it, the database claim drops it later). The worker carries on meanwhile.
    await world.worker.deliver(in_flight)
    with contextlib.suppress(BackendUnavailable):
        await world.deps.ack(in_flight)
    stop = asyncio.Event()
    running = asyncio.create_task(world.worker.run(stop))
    try:
        with own_cluster.client(replica) as node, contextlib.suppress(redis.RedisError):
            node.execute_command("CLUSTER", "FAILOVER", "TAKEOVER")
        assert await eventually(lambda: own_cluster.role(replica) == "master", 20)
        assert await eventually(own_cluster_ok(own_cluster), 20)

        # A scan interval after the deadline the scanner fires whatever the trigger still
        # holds on a lease or lost with the master; the notices its cancels arm go through
        # the trigger, on the promoted node too.
        world.clock.set(deadline + world.deps.scan_interval)
        await scan_once(world.worker)
        assert await eventually(lambda: _all_done(world, herd), 20)
        await check_fired_once(world, herd, deadline)

        # The trigger delivers on the promoted master without the scanner's help.
        wave, next_deadline = await place_herd(world, HERD // 2)
        assert {trigger.shard_of(i) for i in await _timer_ids(world, wave)} == set(trigger.shards)
        world.clock.set(next_deadline)
        assert await eventually(lambda: _all_done(world, wave), 20)
        await check_fired_once(world, wave, next_deadline)
    finally:
        stop.set()
        trigger.wake()
        await asyncio.wait_for(running, 10)


def own_cluster_ok(cluster: redis_cluster.LocalCluster):  # type: ignore[no-untyped-def]
    """Every live node says the cluster is ok (the killed one stays down)."""

    def ok() -> bool:
        for port in cluster.ports:
            if cluster.role(port) == "down":
                continue
            with cluster.client(port) as node:
                if node.cluster("info")["cluster_state"] != "ok":
                    return False
        return True

    return ok


async def _all_done(world: World, order_ids: list[int]) -> bool:
    return await open_timers(world, order_ids) == 0


async def _timer_ids(world: World, order_ids: list[int]) -> list[int]:
    async with world.deps.db.read() as conn:
        query = select(t_timers.c.id).where(t_timers.c.order_id.in_(order_ids))
        return list((await conn.execute(query)).scalars())
