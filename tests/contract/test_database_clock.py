"""Deadlines are decided by one clock, the database's: a worker whose own clock runs a minute
fast neither acts early nor records its own time (issue 9, item 3)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from dueflow import bootstrap
from dueflow.clock import Clock, DatabaseClock, FakeClock, SystemClock, utcnow
from dueflow.config import load_settings
from dueflow.service import orders
from dueflow.store import schema, servertime
from dueflow.store.db import Database
from dueflow.worker.runner import Worker
from dueflow.worker.scanner import scan_once
from tests.conftest import SERVICE_URLS, World, require_service

FAST = timedelta(seconds=60)


class FastClock(SystemClock):
    """This machine's clock, a minute ahead of the truth."""

    def now(self) -> datetime:
        return utcnow() + FAST


def fast_worker(world: World) -> tuple[Worker, FakeClock]:
    """A worker whose own clock is a minute ahead of the database's (``world.clock``)."""
    wall = FakeClock(world.clock.now() + FAST)

    async def database_time() -> datetime:
        return world.clock.now()

    clock = DatabaseClock(database_time, wall=wall)
    return Worker(dataclasses.replace(world.deps, clock=clock)), wall


async def order_row(world: World, order_id: int) -> object:
    async with world.deps.db.read() as conn:
        query = select(schema.orders).where(schema.orders.c.id == order_id)
        return (await conn.execute(query)).one()


def advance(world: World, wall: FakeClock, delta: timedelta) -> None:
    world.clock.advance(delta)
    wall.advance(delta)


async def test_a_fast_worker_cancels_at_the_databases_deadline(backend_world: World) -> None:
    world = backend_world
    worker, wall = fast_worker(world)
    await worker.deps.clock.sync()  # type: ignore[attr-defined]
    assert abs(worker.deps.clock.now() - world.clock.now()) < timedelta(milliseconds=1)
    goods_id = await world.goods()
    order_id = await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)
    deadline = (await order_row(world, order_id)).pay_deadline  # type: ignore[attr-defined]

    # 20 s before the deadline the worker's own clock says 40 s past it: nothing happens.
    advance(world, wall, deadline - world.clock.now() - timedelta(seconds=20))
    assert wall.now() > deadline
    await worker.drain()  # the payment reminder, due long ago
    await scan_once(worker)
    assert (await order_row(world, order_id)).status == "pending_payment"  # type: ignore[attr-defined]

    advance(world, wall, timedelta(seconds=20))
    assert await worker.drain() == 2  # cancel_unpaid, then the notice it wrote
    row = await order_row(world, order_id)
    assert row.status == "cancelled_unpaid"  # type: ignore[attr-defined]
    # The recorded time is the database's, not the worker's minute-fast one: the cancel's, and
    # the notice it wrote, due at once by the same clock.
    assert row.cancelled_at == world.clock.now()  # type: ignore[attr-defined]
    [notice] = [
        t
        for t in (await orders.order_view(world.deps, order_id))["timers"]
        if t["kind"] == "order_closed"
    ]
    assert (notice["state"], notice["due_at"]) == ("done", world.clock.now())


async def test_the_offset_is_measured_against_the_real_server(backend_url: str) -> None:
    settings = load_settings(database_url=backend_url, profile="prod")
    async with bootstrap.running(settings, migrate_sqlite=False) as deps:
        if not servertime.has_clock(deps.db):
            # Embedded SQLite runs in this process: its clock is this machine's.
            assert type(deps.clock) is SystemClock
            return
        assert isinstance(deps.clock, DatabaseClock) and deps.clock.synced
        truth = await servertime.server_now(deps.db)
        assert truth.tzinfo is not None
        assert abs(truth - utcnow()) < timedelta(seconds=2)
        fast = DatabaseClock(lambda: servertime.server_now(deps.db), wall=FastClock())
        assert abs(fast.now() - utcnow() - FAST) < timedelta(seconds=1)
        offset = await fast.sync()
        assert abs(offset + FAST) < timedelta(seconds=1)
        assert abs(fast.now() - utcnow()) < timedelta(seconds=1)


async def test_a_database_clock_sleeps_until_the_databases_time() -> None:
    truth = FakeClock(datetime(2026, 3, 1, tzinfo=UTC))
    wall = FakeClock(truth.now() + FAST)

    async def database_time() -> datetime:
        return truth.now()

    clock: Clock = DatabaseClock(database_time, wall=wall)
    await clock.sync()  # type: ignore[attr-defined]
    when = truth.now() + timedelta(seconds=5)
    wall.advance(timedelta(seconds=5))
    truth.advance(timedelta(seconds=5))
    await clock.sleep_until(when)  # returns: the database's time has come
    assert clock.now() == when


@pytest.mark.mysql
async def test_a_mariadb_driver_url_reads_the_servers_clock_too() -> None:
    """Found in review: ``mariadb+asyncmy://`` keeps the dialect name ``mariadb``."""
    url = SERVICE_URLS["mysql"]
    assert url is not None
    require_service("mysql", "127.0.0.1", 3306)
    db = Database.from_url(url.replace("mysql://", "mariadb+asyncmy://", 1))
    try:
        assert db.dialect == "mariadb" and servertime.has_clock(db)
        assert abs(await servertime.server_now(db) - utcnow()) < timedelta(seconds=2)
    finally:
        await db.dispose()
