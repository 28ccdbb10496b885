"""Faults against real services and real worker processes: every deadline is still met within
the scan interval, and nothing is done twice.

These run workers as subprocesses on the real clock, with a short lease and scan interval; the
test waits (bounded) for the processes, never for a deadline of its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from sqlalchemy import func, insert, select, text

from dueflow.store.db import Database
from dueflow.store.schema import goods, order_events, orders, reminders, timers, users
from tests.conftest import SERVICE_URLS, _reset_server_database, eventually, require_service

DUEFLOW = Path(sys.executable).parent / "dueflow"
PG = SERVICE_URLS["postgres"]

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.serial]


@pytest.fixture
async def pg() -> Database:
    require_service("postgres", "127.0.0.1", 5432)
    db = Database.from_url(PG)
    await _reset_server_database(db)
    yield db
    await db.dispose()


async def seed_due(db: Database, count: int, start: int = 1) -> list[int]:
    """``count`` unpaid orders, each holding its goods, whose pay deadline has just passed."""
    now = datetime.now(UTC)
    due = now - timedelta(milliseconds=1)
    ids = list(range(start, start + count))
    async with db.write() as conn:
        if start == 1:
            await conn.execute(
                insert(users),
                [
                    {"id": 1, "name": "s", "token_hash": "a", "is_admin": False, "created_at": now},
                    {"id": 2, "name": "b", "token_hash": "b", "is_admin": False, "created_at": now},
                ],
            )
        await conn.execute(
            insert(goods),
            [
                {
                    "id": i,
                    "seller_id": 1,
                    "title": "g",
                    "price": Decimal("1.00"),
                    "status": "on_sale",
                    "reserved_order_id": i,
                    "created_at": now,
                    "updated_at": now,
                }
                for i in ids
            ],
        )
        await conn.execute(
            insert(orders),
            [
                {
                    "id": i,
                    "flow": "marketplace",
                    "order_type": "normal",
                    "buyer_id": 2,
                    "seller_id": 1,
                    "goods_id": i,
                    "amount": Decimal("1.00"),
                    "status": "pending_payment",
                    "created_at": now,
                    "pay_deadline": due,
                    "updated_at": now,
                }
                for i in ids
            ],
        )
        await conn.execute(
            insert(timers),
            [
                {
                    "order_id": i,
                    "kind": "cancel_unpaid",
                    "deadline_at": due,
                    "due_at": due,
                    "state": "scheduled",
                    "attempts": 0,
                    "stuck": False,
                    "created_at": now,
                }
                for i in ids
            ],
        )
        for table in ("users", "goods", "orders"):
            await conn.execute(
                text(
                    f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"
                )
            )
    return ids


def start_worker(log: Path, extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
    env.update(
        {
            "DUEFLOW_DATABASE_URL": PG,
            "DUEFLOW_BATCH_SIZE": "50",
            "DUEFLOW_MAX_BATCH_SIZE": "50",
            "DUEFLOW_LEASE": "2s",
            "DUEFLOW_SCAN_INTERVAL": "1s",
            "DUEFLOW_SCAN_GRACE": "0s",
            **(extra or {}),
        }
    )
    with log.open("ab") as sink:
        return subprocess.Popen(
            [str(DUEFLOW), "worker", "-v"], env=env, stdout=sink, stderr=subprocess.STDOUT
        )


async def scalar(db: Database, query) -> int:
    async with db.read() as conn:
        return int((await conn.execute(query)).scalar_one())


#: Cancellations done (the timers the test seeds).
CANCELS_DONE = (
    select(func.count())
    .select_from(timers)
    .where(timers.c.kind == "cancel_unpaid", timers.c.state == "done")
)
#: Every timer done: the cancels, and the order_closed notice each cancel wrote.
ALL_DONE = select(func.count()).select_from(timers).where(timers.c.state == "done")


async def all_done(db: Database, count: int) -> bool:
    """``count`` seeded cancels and their ``count`` notices are all done."""
    return await scalar(db, ALL_DONE) == 2 * count


async def all_cancelled_once(db: Database, count: int) -> None:
    cancelled = (
        select(func.count()).select_from(orders).where(orders.c.status == "cancelled_unpaid")
    )
    assert await scalar(db, cancelled) == count
    events = (
        select(func.count()).select_from(order_events).where(order_events.c.event == "pay_timeout")
    )
    assert await scalar(db, events) == count
    per_order = select(func.count()).select_from(
        select(order_events.c.order_id)
        .where(order_events.c.event == "pay_timeout")
        .group_by(order_events.c.order_id)
        .having(func.count() > 1)
        .subquery()
    )
    assert await scalar(db, per_order) == 0
    held = select(func.count()).select_from(goods).where(goods.c.reserved_order_id.is_not(None))
    assert await scalar(db, held) == 0
    live = select(func.count()).select_from(timers).where(timers.c.state != "done")
    assert await scalar(db, live) == 0
    # each buyer told once: one notice timer and one sent notice per order
    notices = select(func.count()).select_from(timers).where(timers.c.kind == "order_closed")
    assert await scalar(db, notices) == count
    told = (
        select(func.count())
        .select_from(reminders)
        .where(reminders.c.kind == "order_closed", reminders.c.state == "sent")
    )
    assert await scalar(db, told) == count


async def test_sigkill_one_of_three_workers_mid_batch(pg, tmp_path):
    count = 3000
    await seed_due(pg, count)
    workers = [start_worker(tmp_path / f"worker{n}.log") for n in range(3)]
    try:
        claimed = select(func.count()).select_from(timers).where(timers.c.state == "claimed")

        async def midway() -> bool:
            return 0 < await scalar(pg, CANCELS_DONE) < count and await scalar(pg, claimed) > 0

        assert await eventually(midway, 30), "the workers never got going"
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait(timeout=10)

        async def finished() -> bool:
            return await all_done(pg, count)

        assert await eventually(finished, 60), "timers left undone after the kill"
    finally:
        for w in workers[1:]:
            w.terminate()
        for w in workers[1:]:
            assert w.wait(timeout=20) == 0
    await all_cancelled_once(pg, count)


async def test_dropped_database_connections_are_survived(pg, tmp_path):
    await seed_due(pg, 100)
    worker = start_worker(tmp_path / "worker.log")
    try:

        async def first_done() -> bool:
            return await all_done(pg, 100)

        assert await eventually(first_done, 30)
        async with pg.engine.connect() as conn:
            await conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND application_name NOT LIKE 'pgbench%'"
                )
            )
        await pg.engine.dispose()  # our own pooled connections were dropped too
        await seed_due(pg, 100, start=101)

        async def second_done() -> bool:
            return await all_done(pg, 200)

        assert await eventually(second_done, 30), (tmp_path / "worker.log").read_text()[-3000:]
    finally:
        worker.terminate()
        assert worker.wait(timeout=20) == 0
    await all_cancelled_once(pg, 200)


REDIS_URL = os.environ.get("DUEFLOW_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/"


async def lose_midway(pg: Database, count: int, lose) -> None:

    async def midway() -> bool:
        return 0 < await scalar(pg, CANCELS_DONE) < count

    assert await eventually(midway, 30), "the workers never got going"
    await lose()

    async def finished() -> bool:
        return await all_done(pg, count)

    # Each cancel also sends a notice (two write transactions of its own): give them time.
    assert await eventually(finished, 180), "timers left undone after the trigger lost them"


@pytest.mark.redis
async def test_redis_flushed_in_the_middle_of_a_herd(pg, tmp_path):
    import redis.asyncio as aioredis

    require_service("redis", "127.0.0.1", 6379)
    prefix = f"fault-{os.getpid()}"
    count = 2000
    await seed_due(pg, count)
    trigger = {"DUEFLOW_TRIGGER_URL": f"{REDIS_URL}?prefix={prefix}"}
    workers = [start_worker(tmp_path / f"w{n}.log", trigger) for n in range(2)]
    client = aioredis.Redis.from_url(REDIS_URL)

    async def flush() -> None:
        """FLUSHDB, as far as this trigger can tell (the database is shared with other runs)."""
        keys = [key async for key in client.scan_iter(match=f"{prefix}:*")]
        if keys:
            await client.delete(*keys)

    try:
        await lose_midway(pg, count, flush)
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            assert w.wait(timeout=20) == 0
        await flush()
        await client.aclose()
    await all_cancelled_once(pg, count)


@pytest.mark.rabbitmq
async def test_rabbitmq_queues_purged_in_the_middle_of_a_herd(pg, tmp_path):
    import aio_pika

    from dueflow.timers.rabbitmq import RabbitTrigger

    require_service("rabbitmq", "127.0.0.1", 5672)
    prefix = f"fault-{os.getpid()}"
    names = RabbitTrigger(prefix=prefix).queue_names
    count = 2000
    await seed_due(pg, count)
    trigger = {"DUEFLOW_TRIGGER_URL": f"{AMQP_URL}?prefix={prefix}"}
    workers = [start_worker(tmp_path / f"w{n}.log", trigger) for n in range(2)]
    connection = await aio_pika.connect(AMQP_URL)
    try:

        async def purge() -> None:
            for name in names:
                channel = await connection.channel()
                try:
                    queue = await channel.get_queue(name, ensure=True)
                    await queue.purge()
                    await channel.close()
                except aio_pika.exceptions.ChannelNotFoundEntity:
                    continue  # a level queue this run never declared

        await lose_midway(pg, count, purge)
    finally:
        for w in workers:
            w.terminate()
        for w in workers:
            assert w.wait(timeout=20) == 0
        channel = await connection.channel()
        for name in names:
            await channel.queue_delete(name)
        await connection.close()
    await all_cancelled_once(pg, count)
