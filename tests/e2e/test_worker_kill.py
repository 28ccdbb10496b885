"""A real ``dueflow worker`` process on a backlog of expired unpaid orders: killed with SIGKILL
in the middle of its batches, the scanner takes back the expired claims and nothing is lost or
done twice; stopped with SIGTERM, it finishes its batch and exits 0 with no claim left behind.

The worker runs on real time (its deadlines are already past); waiting for it is a bounded poll
of the database. The recovery after the kill runs in-process on a FakeClock set past the lease.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import bindparam, insert, select, update

from dueflow import bootstrap
from dueflow.clock import FakeClock, utcnow
from dueflow.config import Settings
from dueflow.domain.lifecycle import OrderStatus
from dueflow.domain.timers import TimerKind
from dueflow.service import accounts
from dueflow.service.report import check_invariants
from dueflow.store import orders as store_orders
from dueflow.store import timers as store_timers
from dueflow.store.schema import goods, orders
from dueflow.worker.runner import Worker
from dueflow.worker.scanner import scan_once
from tests.conftest import eventually_sync

pytestmark = pytest.mark.serial

DUEFLOW = Path(sys.executable).parent / "dueflow"
ORDERS = 3000
BATCH = 50
LEASE = timedelta(seconds=30)
PRICE = Decimal("9.90")


def seed_expired_orders(settings: Settings, count: int) -> datetime:
    """``count`` unpaid orders placed two hours ago (so their pay deadline has passed), each
    holding its own goods item, with their cancel_unpaid and pay_reminder timers: what
    ``place_order`` writes, in bulk. Returns when they were placed."""
    placed_at = utcnow() - timedelta(hours=2)

    async def go() -> None:
        clock = FakeClock(placed_at)
        async with bootstrap.running(settings, clock=clock, migrate_sqlite=False) as deps:
            seller, _ = await accounts.add_user(deps, "seller")
            buyer, _ = await accounts.add_user(deps, "buyer")
            pay_deadline = deps.policy.pay_deadline("normal", placed_at)
            remind_at = deps.policy.reminder_at("normal", placed_at)
            assert remind_at is not None
            async with deps.db.write() as conn:
                common = {"created_at": placed_at, "updated_at": placed_at}
                await conn.execute(
                    insert(goods),
                    [
                        {
                            "seller_id": seller.id,
                            "title": f"item {i}",
                            "price": PRICE,
                            "status": "on_sale",
                            **common,
                        }
                        for i in range(count)
                    ],
                )
                goods_ids = list((await conn.execute(select(goods.c.id))).scalars())
                await conn.execute(
                    insert(orders),
                    [
                        {
                            "flow": "marketplace",
                            "order_type": "normal",
                            "buyer_id": buyer.id,
                            "seller_id": seller.id,
                            "goods_id": goods_id,
                            "amount": PRICE,
                            "status": "pending_payment",
                            "pay_deadline": pay_deadline,
                            **common,
                        }
                        for goods_id in goods_ids
                    ],
                )
                placed = (await conn.execute(select(orders.c.id, orders.c.goods_id))).all()
                await conn.execute(
                    update(goods)
                    .where(goods.c.id == bindparam("g_id"))
                    .values(reserved_order_id=bindparam("o_id")),
                    [{"g_id": r.goods_id, "o_id": r.id} for r in placed],
                )
                order_ids = [r.id for r in placed]
                await store_timers.schedule(
                    conn,
                    [
                        store_timers.NewTimer(o, TimerKind.CANCEL_UNPAID, pay_deadline)
                        for o in order_ids
                    ]
                    + [
                        store_timers.NewTimer(o, TimerKind.PAY_REMINDER, remind_at)
                        for o in order_ids
                    ],
                    placed_at,
                )
                await store_orders.record_events(
                    conn,
                    order_ids,
                    event="place",
                    actor=f"user:{buyer.id}",
                    now=placed_at,
                    to_status=OrderStatus.PENDING_PAYMENT,
                )

    asyncio.run(go())
    return placed_at


@contextmanager
def reader(db_path: Path) -> Iterator[Callable[[str], Any]]:
    """A plain SQLite connection that only reads (each query its own snapshot), for polling
    while the worker writes."""
    with closing(sqlite3.connect(db_path, timeout=10)) as conn:

        def count(sql: str) -> Any:
            return conn.execute(sql).fetchone()[0]

        yield count


CANCELLED_DONE = "SELECT count(*) FROM timers WHERE kind = 'cancel_unpaid' AND state = 'done'"
CLAIMED = "SELECT count(*) FROM timers WHERE state = 'claimed'"


def timer_states(count: Callable[[str], Any]) -> dict[str, int]:
    """How many cancel_unpaid timers are in each state."""
    return {
        state: count(
            f"SELECT count(*) FROM timers WHERE kind = 'cancel_unpaid' AND state = '{state}'"
        )
        for state in ("scheduled", "claimed", "done", "cancelled")
    }


def start_worker(db_path: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
    env.update(
        DUEFLOW_DATABASE_URL=f"sqlite:///{db_path}",
        DUEFLOW_PROFILE="prod",
        DUEFLOW_BATCH_SIZE=str(BATCH),
        DUEFLOW_LEASE=f"{int(LEASE.total_seconds())}s",
    )
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(DUEFLOW), "worker", *extra], env=env, stdout=out, stderr=subprocess.STDOUT
        )


def wait_for(
    proc: subprocess.Popen[bytes], what: str, ready: Callable[[], bool], limit: float = 60.0
) -> None:
    """Poll (bounded) until ``ready()``; fail if the worker dies or time runs out."""

    def ready_or_dead() -> bool:
        assert proc.poll() is None, f"the worker exited ({proc.returncode}) before {what}"
        return ready()

    assert eventually_sync(ready_or_dead, limit, 0.003), f"gave up waiting for {what}"


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


@pytest.fixture
def backlog(settings: Settings, db_path: Path) -> Path:
    seed_expired_orders(settings, ORDERS)
    return db_path


def test_sigkill_mid_batch_loses_nothing_and_does_nothing_twice(
    backlog: Path, settings: Settings, tmp_path: Path
) -> None:
    # Kill the worker while it holds claims. Should a kill land between two batches (nothing
    # claimed at that instant), start another worker and try again.
    left_claimed = 0
    for attempt in range(5):
        proc = start_worker(backlog, tmp_path / f"worker{attempt}.log")
        try:
            with reader(backlog) as count:
                wait_for(
                    proc,
                    "some cancellations done and a batch claimed",
                    lambda count=count: bool(count(CANCELLED_DONE) and count(CLAIMED)),
                )
                os.kill(proc.pid, signal.SIGKILL)
                assert proc.wait(timeout=30) == -signal.SIGKILL
                left_claimed = count(CLAIMED)
                states = timer_states(count)
        finally:
            stop(proc)
        if left_claimed:
            break
    assert left_claimed > 0, "never caught the worker holding claims"
    assert 0 < states["done"] < ORDERS, states

    async def recover() -> None:
        clock = FakeClock(utcnow() + LEASE + timedelta(minutes=1))
        async with bootstrap.running(settings, clock=clock, migrate_sqlite=False) as deps:
            worker = Worker(deps)
            report = await scan_once(worker)
            assert report.claimed >= left_claimed
            assert report.errors == 0 and report.failed_batches == 0
            await worker.drain()
            assert (await scan_once(worker)).claimed == 0
            result = await check_invariants(deps, tolerance_seconds=0)
            assert result.ok, result

    asyncio.run(recover())

    with reader(backlog) as count:
        assert count("SELECT count(*) FROM orders") == ORDERS
        assert count("SELECT count(*) FROM orders WHERE status != 'cancelled_unpaid'") == 0
        assert count("SELECT count(*) FROM orders WHERE cancel_reason != 'pay_timeout'") == 0
        assert count("SELECT count(*) FROM goods WHERE reserved_order_id IS NOT NULL") == 0
        assert count("SELECT count(*) FROM goods WHERE status != 'on_sale'") == 0
        assert timer_states(count) == {"scheduled": 0, "claimed": 0, "done": ORDERS, "cancelled": 0}
        assert count("SELECT count(*) FROM timers WHERE state IN ('scheduled', 'claimed')") == 0
        assert count(f"{CANCELLED_DONE} AND outcome = 'cancelled'") == ORDERS
        # exactly one pay_timeout event per order: nothing lost, nothing done twice
        assert count("SELECT count(*) FROM order_events WHERE event = 'pay_timeout'") == ORDERS
        assert (
            count("SELECT count(DISTINCT order_id) FROM order_events WHERE event = 'pay_timeout'")
            == ORDERS
        )
        # the killed batch was claimed twice (by the killed worker, then the scanner), no more
        assert count("SELECT max(attempts) FROM timers") == 2
        assert count("SELECT count(*) FROM timers WHERE attempts = 2") >= left_claimed
        # every reminder was too late to send; every buyer was told the order closed, once
        assert count("SELECT count(*) FROM reminders WHERE kind = 'pay_reminder'") == 0
        told = "SELECT count(*) FROM reminders WHERE kind = 'order_closed' AND state = 'sent'"
        assert count(told) == ORDERS
        notices = "SELECT count(*) FROM timers WHERE kind = 'order_closed' AND state = 'done'"
        assert count(notices) == ORDERS


def test_sigterm_stops_after_the_batch_and_exits_zero(backlog: Path, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    proc = start_worker(backlog, log)
    try:
        with reader(backlog) as count:
            wait_for(proc, "some cancellations done", lambda: count(CANCELLED_DONE) > 0)
            proc.send_signal(signal.SIGTERM)
            started = time.monotonic()
            assert proc.wait(timeout=30) == 0, log.read_text()
            took = time.monotonic() - started
            after = timer_states(count)
            # it stopped after the batches in progress instead of running on through the backlog
            assert after["scheduled"] >= ORDERS // 2, after
            # every claim was finished or handed back: nothing waits for a lease to expire
            assert after["claimed"] == 0, after
            # whatever was done is complete; whatever was not is intact
            assert (
                count(
                    "SELECT count(*) FROM orders o JOIN timers t ON t.order_id = o.id "
                    "AND t.kind = 'cancel_unpaid' "
                    "WHERE (o.status = 'cancelled_unpaid') != (t.state = 'done')"
                )
                == 0
            )
            assert (
                count(
                    "SELECT count(*) FROM goods g JOIN orders o ON o.goods_id = g.id "
                    "WHERE (o.status = 'pending_payment') != (g.reserved_order_id IS NOT NULL)"
                )
                == 0
            )
    finally:
        stop(proc)
    assert took < 5.0, f"the worker took {took:.1f} s to stop"
    assert "worker stopped after" in log.read_text()


def test_sigterm_on_an_idle_worker_exits_zero_at_once(db_path: Path, tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    proc = start_worker(db_path, log)
    try:
        wait_for(proc, "the worker to start", lambda: "running" in log.read_text())
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert proc.wait(timeout=30) == 0, log.read_text()
        took = time.monotonic() - started
    finally:
        stop(proc)
    assert took < 5.0, f"the worker took {took:.1f} s to stop"
    assert "worker stopped after 0 timers" in log.read_text()
