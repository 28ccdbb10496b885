"""The ``redis`` trigger across a restart of a real Redis of the test's own (a ``redis-server``
on a free port, shut down with ``SHUTDOWN NOSAVE`` and started again on the same port, empty):
timers due after it is back fire at their deadline, not a scan interval later.

Deadlines come from a FakeClock; the real waits are bounded ones for the processes and the
loops to get somewhere.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import select

from dueflow.clock import FakeClock
from dueflow.domain.timers import TimerKind
from dueflow.exceptions import BackendUnavailable
from dueflow.service import orders as order_service
from dueflow.store import timers
from dueflow.store.schema import orders as t_orders
from dueflow.store.timers import Armed
from dueflow.timers.redis import RedisTrigger
from dueflow.worker.runner import run_feeder
from tests.conftest import START, eventually, eventually_sync, in_ci
from tests.e2e.live import free_port

pytestmark = [pytest.mark.redis]

#: Orders of the herd, their pay deadlines a second apart.
HERD = 12
#: How many of them are due (and fired) before Redis restarts.
BEFORE = 4


class OwnRedis:
    """A ``redis-server`` of the test's own that keeps nothing on disk."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                *("redis-server", "--port", str(self.port), "--bind", "127.0.0.1"),
                *("--save", "", "--appendonly", "no", "--dir", str(self.workdir)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        assert eventually_sync(self.answers, 10), "redis-server did not start"

    def answers(self) -> bool:
        client = redis.Redis.from_url(self.url, socket_connect_timeout=0.2)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def ask(self, *command: str) -> Any:
        """A command's answer, on a fresh connection (a restart drops the old ones)."""
        client = redis.Redis.from_url(self.url)
        try:
            return client.execute_command(*command)
        finally:
            client.close()

    def shut_down(self, *, save: bool = False) -> None:
        """``SHUTDOWN NOSAVE``: every key is gone, as after a crash without persistence (or
        ``SHUTDOWN SAVE``: the next start loads them again)."""
        client = redis.Redis.from_url(self.url)
        try:
            client.shutdown(nosave=not save, save=save)
        except redis.ConnectionError:
            pass  # the server closed the connection: that is the answer
        finally:
            client.close()
        assert self.process is not None
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    if shutil.which("redis-server") is None:
        message = "no redis-server on PATH (Debian's redis-server package)"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    server = OwnRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def restart_world(world, own_redis: OwnRedis) -> AsyncIterator:
    world.deps.trigger = RedisTrigger.from_url(own_redis.url, clock=world.clock)
    try:
        yield world
    finally:
        await world.deps.trigger.close()


async def pending(world, deadlines: dict[int, datetime]) -> set[int]:
    """The orders of ``deadlines`` still waiting for payment."""
    async with world.deps.db.read() as conn:
        query = select(t_orders.c.id, t_orders.c.status).where(t_orders.c.id.in_(deadlines))
        return {i for i, status in (await conn.execute(query)).all() if status == "pending_payment"}


async def fired_up_to_now(world, deadlines: dict[int, datetime]) -> bool:
    """Every order whose deadline has come is cancelled, and no other."""
    now = world.clock.now()
    return await pending(world, deadlines) == {i for i, d in deadlines.items() if d > now}


async def test_timers_due_after_a_redis_restart_fire_at_their_deadline(
    restart_world, own_redis: OwnRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the feeder noticed the lost keys only at its next pass, a scan interval later, so
    every timer due in between waited for the scanner. Now the first claim after the restart
    finds the ``fed`` marker gone (and the trigger has seen Redis fail), the feeder is told at
    once and feeds them all again: each timer fires in the clock step that reaches it."""
    world = restart_world
    deadlines: dict[int, datetime] = {}
    for _ in range(HERD):
        goods_id = await world.goods()
        order_id = await order_service.place_order(
            world.deps, buyer_id=world.buyer, goods_id=goods_id
        )
        async with world.deps.db.read() as conn:
            query = select(t_orders.c.pay_deadline).where(t_orders.c.id == order_id)
            deadlines[order_id] = (await conn.execute(query)).scalar_one()
        world.clock.advance(timedelta(seconds=1))
    first = min(deadlines.values())

    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(world.worker.run(stop)),
        asyncio.create_task(run_feeder(world.worker, stop)),
    ]
    try:
        assert await eventually(lambda: own_redis.ask("EXISTS", "dueflow:fed"))  # fed once
        # Mid-herd: the first few fire through Redis, one clock step each.
        world.clock.set(first - timedelta(milliseconds=500))
        for _ in range(BEFORE):
            world.clock.advance(timedelta(seconds=1))
            assert await eventually(lambda: fired_up_to_now(world, deadlines), 5)
        assert len(await pending(world, deadlines)) == HERD - BEFORE

        own_redis.shut_down()
        own_redis.start()
        assert own_redis.ask("DBSIZE") == 0  # everything it was fed is gone

        # The rest come due after Redis is back, well within one scan interval of the feeder's
        # last pass: each fires in the one-second step that reaches its deadline.
        assert world.clock.now() + timedelta(seconds=HERD) < first + world.deps.scan_interval
        while await pending(world, deadlines):
            world.clock.advance(timedelta(seconds=1))
            assert await eventually(lambda: fired_up_to_now(world, deadlines), 5), (
                f"at {world.clock.now() - first} after the first deadline, "
                f"{len(await pending(world, deadlines))} orders still pending"
            )
        assert any("lost its timers" in r.getMessage() for r in caplog.records)
    finally:
        stop.set()
        world.deps.trigger.wake()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)


async def test_a_timer_armed_while_redis_was_down_is_fed_once_it_is_back(
    restart_world, own_redis: OwnRedis
) -> None:
    """Redis kept its keys (the ``fed`` marker too) but was down when an order was placed, so
    arming its cancel failed. The feeder's next passes feed only timers newly within the
    horizon, so before, the cancel waited for a full pass or the scanner; now the first claim
    after Redis is back tells the feeder, which feeds them all again."""
    world = restart_world
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(world.worker.run(stop)),
        asyncio.create_task(run_feeder(world.worker, stop)),
    ]
    try:
        assert await eventually(lambda: own_redis.ask("EXISTS", "dueflow:fed"))  # fed once
        own_redis.shut_down(save=True)
        goods_id = await world.goods()
        order_id = await order_service.place_order(
            world.deps, buyer_id=world.buyer, goods_id=goods_id
        )
        assert world.deps.trigger_errors == 1  # its cancel was not armed
        own_redis.start()
        assert own_redis.ask("EXISTS", "dueflow:fed")  # nothing was lost

        async with world.deps.db.read() as conn:
            cancel = next(
                t
                for t in await timers.for_order(conn, order_id)
                if t.kind == TimerKind.CANCEL_UNPAID
            )
            query = select(t_orders.c.pay_deadline).where(t_orders.c.id == order_id)
            deadline = (await conn.execute(query)).scalar_one()
        world.clock.advance(timedelta(seconds=1))  # the worker's pause after the error ends
        fed = await eventually(lambda: own_redis.ask("ZSCORE", "dueflow:due", str(cancel.id)), 5)
        assert fed  # by the first claim after Redis is back, not a feeder pass
        world.clock.set(deadline + timedelta(milliseconds=500))
        assert await eventually(lambda: fired_up_to_now(world, {order_id: deadline}), 5)
    finally:
        stop.set()
        world.deps.trigger.wake()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)


async def test_an_api_process_whose_arm_failed_has_the_workers_feed_again(
    own_redis: OwnRedis,
) -> None:
    """An API process (``serve --no-worker``) has no feeder of its own: an arm of its that
    failed while Redis was down would wait for a full pass or the scanner, however soon it
    fell due. Its next arm that goes through drops the ``fed`` marker, so the first claim of
    any worker tells that worker's feeder to feed every timer again."""
    clock = FakeClock(START)
    api = RedisTrigger.from_url(own_redis.url, clock=clock)
    worker = RedisTrigger.from_url(own_redis.url, clock=clock)
    told: list[bool] = []
    worker.watch_lost(lambda: told.append(True))
    try:
        assert await worker.lost()  # the first ask: fed from here on
        own_redis.shut_down(save=True)
        with pytest.raises(BackendUnavailable):
            await api.armed([Armed(1, START + timedelta(seconds=5))])
        own_redis.start()
        await worker.claim(START)
        assert told == []  # the marker survived: the worker itself saw nothing wrong
        await api.armed([Armed(2, START + timedelta(seconds=6))])
        assert not own_redis.ask("EXISTS", "dueflow:fed")
        await worker.claim(START)
        assert told == [True]
        await api.armed([Armed(3, START + timedelta(seconds=7))])  # once: the flag is spent
        assert await worker.lost() and not await worker.lost()
        await api.armed([Armed(4, START + timedelta(seconds=8))])
        assert own_redis.ask("EXISTS", "dueflow:fed")
    finally:
        await api.close()
        await worker.close()
