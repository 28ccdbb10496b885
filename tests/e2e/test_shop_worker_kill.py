"""A real ``dueflow worker`` process cancelling a backlog of expired shop and flash orders,
killed with SIGKILL while it holds a batch: whatever it had not committed is rolled back whole
(every order is either cancelled with all it held given back, or still holding all of it), and a
fresh worker and scanner finish the rest exactly once: units back in stock and in the flash
sales, coupons back to their owners, per-buyer counts back to zero, one ``released`` event and
one ``order_closed`` notice per order.

The orders are placed through the services on a FakeClock two hours back, so their pay
deadlines have passed in real time; the killed worker runs on real time; the recovery runs
in-process on a FakeClock past the killed worker's leases. Waiting for the worker is a bounded
poll of the database.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from collections import Counter, defaultdict
from contextlib import closing
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select, text

from dueflow.clock import utcnow
from dueflow.domain.timers import TimerKind
from dueflow.service import accounts, shop
from dueflow.service.deps import Deps
from dueflow.service.report import check_invariants
from dueflow.store.schema import (
    coupons,
    flash_buyers,
    flash_sales,
    order_events,
    order_lines,
    orders,
    reminders,
    skus,
    timers,
)
from dueflow.worker.scanner import scan_once
from tests.conftest import World, eventually

pytestmark = pytest.mark.serial

DUEFLOW = Path(sys.executable).parent / "dueflow"
SHOP_ORDERS = 400
FLASH_ORDERS = 200
ORDERS = SHOP_ORDERS + FLASH_ORDERS
BUYERS = 20
SHOP_SKUS = 10
SALES = 4
BATCH = 50
LEASE = timedelta(seconds=30)
CANCEL = TimerKind.CANCEL_UNPAID.value
CLOSED = TimerKind.ORDER_CLOSED.value


@dataclass
class Shop:
    """What was seeded: the SKUs of the shop orders, and every SKU's and flash sale's units
    before any order."""

    shelf: list[int] = field(default_factory=list)
    sku_stock: dict[int, int] = field(default_factory=dict)
    sale_stock: dict[int, int] = field(default_factory=dict)


async def seed(world: World) -> Shop:
    """Shop orders of two lines and a coupon each, and flash orders of one or two units, all
    placed two hours ago by the services (so everything they hold is held as in production)."""
    world.clock.set(utcnow() - timedelta(hours=2))
    deps, seeded = world.deps, Shop()
    people = [(await accounts.add_user(deps, f"shopper{i}"))[0].id for i in range(BUYERS)]
    shelf = [await world.sku(stock=1000, title=f"mug {i}") for i in range(SHOP_SKUS)]
    seeded.shelf = shelf
    tpl = await shop.create_template(
        deps,
        seller_id=world.seller,
        title="5 off",
        amount_off="5.00",
        min_amount="20.00",
        valid_from=world.clock.now(),
        valid_until=world.clock.now() + timedelta(days=30),
        total=SHOP_ORDERS,
    )
    for i in range(SHOP_ORDERS):
        buyer = people[i % BUYERS]
        issued = await shop.issue_coupon(
            deps, template_id=tpl["id"], issuer_id=world.seller, user_id=buyer
        )
        lines = {shelf[i % SHOP_SKUS]: 1 + i % 2, shelf[(i + 3) % SHOP_SKUS]: 1 + i % 3}
        await world.shop_order(lines, coupon=issued["id"], buyer=buyer)
    sales = []
    for s in range(SALES):
        sku_id = await world.sku(stock=500, title=f"phone {s}")
        sales.append(await world.flash_sale(sku_id, stock=200, limit=10))
    for i in range(FLASH_ORDERS):  # at most 4 orders of 2 units per buyer and sale: within 10
        await shop.place_flash_order(
            deps,
            buyer_id=people[(i // SALES) % BUYERS],
            flash_sale_id=sales[i % SALES],
            quantity=1 + i % 2,
        )
    async with deps.db.read() as conn:
        seeded.sku_stock = {r.id: r.stocked for r in (await conn.execute(select(skus))).all()}
        seeded.sale_stock = {
            r.id: r.stocked for r in (await conn.execute(select(flash_sales))).all()
        }
    return seeded


async def rows(deps: Deps, query: Any) -> list[Any]:
    async with deps.db.read() as conn:
        return list((await conn.execute(query)).all())


async def count(deps: Deps, query: Any) -> int:
    async with deps.db.read() as conn:
        return int((await conn.execute(query)).scalar_one())


def where(*conditions: Any) -> Any:
    """How many rows meet ``conditions`` (of one table)."""
    return select(func.count()).where(*conditions)


def timers_in(kind: str, state: str) -> Any:
    return where(timers.c.kind == kind, timers.c.state == state)


async def all_or_nothing(deps: Deps) -> dict[str, int]:
    """Every count agrees with the orders as they stand: the units, coupon and per-buyer
    counts of each order still pending payment are held, those of each cancelled order are
    back, every cancelled order has one ``released`` event and one notice timer. Returns the
    orders by status."""
    lines = await rows(
        deps,
        select(order_lines, orders.c.status, orders.c.buyer_id).join(
            orders, orders.c.id == order_lines.c.order_id
        ),
    )
    status = {r.id: r.status for r in await rows(deps, select(orders.c.id, orders.c.status))}
    held: dict[str, Counter[int]] = defaultdict(Counter)
    per_buyer: Counter[tuple[int, int]] = Counter()
    locked = {}
    for line in lines:
        if line.status == "pending_payment":
            held[line.kind][line.item_id] += line.quantity
            if line.kind == "flash":
                per_buyer[line.item_id, line.buyer_id] += line.quantity
            if line.kind == "coupon":
                locked[line.item_id] = line.order_id
        else:
            assert line.status == "cancelled_unpaid", line
    for table, kind in ((skus, "sku"), (flash_sales, "flash")):
        for item in await rows(deps, select(table)):
            assert (item.held, item.sold) == (held[kind][item.id], 0), (kind, item)
            assert item.stock == item.stocked - item.held, (kind, item)
    for coupon in await rows(deps, select(coupons)):
        if coupon.id in locked:
            assert (coupon.state, coupon.order_id) == ("locked", locked[coupon.id]), coupon
        else:
            assert (coupon.state, coupon.order_id) == ("available", None), coupon
    counted = {
        (r.flash_sale_id, r.buyer_id): r.units for r in await rows(deps, select(flash_buyers))
    }
    assert {k: v for k, v in counted.items() if v} == dict(per_buyer)
    cancelled = sorted(oid for oid, s in status.items() if s == "cancelled_unpaid")
    for event in ("pay_timeout", "released"):
        query = select(order_events.c.order_id).where(order_events.c.event == event)
        assert sorted(r.order_id for r in await rows(deps, query)) == cancelled, event
    notices = select(timers.c.order_id).where(timers.c.kind == CLOSED)
    assert sorted(r.order_id for r in await rows(deps, notices)) == cancelled
    return dict(Counter(status.values()))


def start_worker(url: str, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
    env.update(
        DUEFLOW_DATABASE_URL=url,
        DUEFLOW_PROFILE="prod",
        DUEFLOW_BATCH_SIZE=str(BATCH),
        DUEFLOW_MAX_BATCH_SIZE=str(2 * BATCH),
        DUEFLOW_LEASE=f"{int(LEASE.total_seconds())}s",
    )
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(DUEFLOW), "worker"], env=env, stdout=out, stderr=subprocess.STDOUT
        )


@dataclass
class Killed:
    """The states right after the kill: cancels claimed and done, notices being sent, and the
    orders whose notice was sent."""

    claimed: int
    done: int
    sending: int
    notified: set[int]


async def killed_state(deps: Deps) -> Killed:
    notices = await rows(deps, select(reminders).where(reminders.c.kind == CLOSED))
    return Killed(
        claimed=await count(deps, timers_in(CANCEL, "claimed")),
        done=await count(deps, timers_in(CANCEL, "done")),
        sending=sum(r.state == "sending" for r in notices),
        notified={r.order_id for r in notices if r.state == "sent"},
    )


def sigkill(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def writer_busy(db_file: str) -> bool:
    """Another connection holds SQLite's write lock right now (a write transaction is open);
    the probe takes no lock it keeps."""
    with closing(sqlite3.connect(db_file, timeout=0, isolation_level=None)) as probe:
        try:
            probe.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return True
        probe.execute("ROLLBACK")
        return False


async def kill_while_writing_sqlite(deps: Deps, url: str, tmp_path: Path) -> Killed:
    """SQLite has one writer: kill the worker while it holds claims on cancels (some already
    done) and a write transaction is open. Should the kill land between batches (nothing
    claimed then), start another worker and try again."""
    db_file = url.removeprefix("sqlite:///")
    for attempt in range(5):
        log = tmp_path / f"worker{attempt}.log"
        proc = start_worker(url, log)
        try:

            async def writing(proc: subprocess.Popen[bytes] = proc) -> bool:
                assert proc.poll() is None, f"the worker exited ({proc.returncode})"
                if not await count(deps, timers_in(CANCEL, "done")):
                    return False
                return bool(await count(deps, timers_in(CANCEL, "claimed"))) and writer_busy(
                    db_file
                )

            assert await eventually(writing, 120, 0.001), log.read_text()
            sigkill(proc)
        finally:
            stop(proc)
        at_kill = await killed_state(deps)
        if at_kill.claimed:
            return at_kill
    pytest.fail("never caught the worker holding claims")


async def kill_blocked_postgres(
    deps: Deps, url: str, tmp_path: Path, *, blocker: int, done: int
) -> Killed:
    """Lock the row of SKU ``blocker`` (the last one every batch of shop orders gives units
    back to), start the worker, and kill it once a cancel transaction waits on that lock
    (orders already moved, events written, other SKUs given back, nothing committed) and
    ``done`` cancels have committed. Then let the lock go: the killed worker's server sessions
    find their client gone and roll back."""
    async with deps.db.engine.connect() as conn:
        await conn.begin()
        locker = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        await conn.execute(select(skus.c.id).where(skus.c.id == blocker).with_for_update())
        log = tmp_path / "worker.log"
        proc = start_worker(url, log)
        waiting: list[int] = []
        try:

            async def blocked() -> bool:
                assert proc.poll() is None, f"the worker exited ({proc.returncode})"
                query = text(
                    "SELECT pid FROM pg_stat_activity WHERE :locker = ANY(pg_blocking_pids(pid))"
                )
                waiting[:] = [r.pid for r in await rows(deps, query.bindparams(locker=locker))]
                # ... and every flash batch (claimed before the shop ones) has committed.
                return bool(waiting) and await count(deps, timers_in(CANCEL, "done")) >= done

            assert await eventually(blocked, 120, 0.01), log.read_text()
            sigkill(proc)
        finally:
            stop(proc)
        await conn.rollback()

    async def gone() -> bool:
        query = text("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(:pids)")
        return await count(deps, query.bindparams(pids=waiting)) == 0

    assert await eventually(gone, 30, 0.01), "the killed worker's sessions lived on"
    return await killed_state(deps)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
async def test_sigkill_mid_cancel_batch_gives_everything_back_exactly_once(
    backend_world: World, backend_url: str, tmp_path: Path
) -> None:
    world, deps = backend_world, backend_world.deps
    seeded = await seed(world)
    assert await all_or_nothing(deps) == {"pending_payment": ORDERS}

    if deps.db.dialect == "postgresql":
        # A batch of shop orders blocks on the last mug's row in its cancel transaction (the
        # worker's other lanes may or may not have committed flash batches by then: a batch
        # waiting behind the blocked one holds them up too, so none is waited for).
        at_kill = await kill_blocked_postgres(
            deps, backend_url, tmp_path, blocker=max(seeded.shelf), done=0
        )
    else:
        at_kill = await kill_while_writing_sqlite(deps, backend_url, tmp_path)
        assert at_kill.done > 0, at_kill
    assert at_kill.done < ORDERS and at_kill.claimed > 0, at_kill
    # What the killed batch had not committed is not there at all; what it had is whole.
    by_status = await all_or_nothing(deps)
    assert by_status["cancelled_unpaid"] == at_kill.done, (by_status, at_kill)
    assert by_status["pending_payment"] >= at_kill.claimed, (by_status, at_kill)

    world.clock.set(utcnow() + LEASE + timedelta(minutes=1))
    report = await scan_once(world.worker)
    assert report.claimed >= at_kill.claimed, report
    assert report.errors == 0 and report.failed_batches == 0, report
    await world.worker.drain()
    assert (await scan_once(world.worker)).claimed == 0

    assert await all_or_nothing(deps) == {"cancelled_unpaid": ORDERS}
    back = {r.id: r.stock for r in await rows(deps, select(skus))}
    assert back == seeded.sku_stock
    assert {r.id: r.stock for r in await rows(deps, select(flash_sales))} == seeded.sale_stock
    assert await count(deps, where(orders.c.cancel_reason != "pay_timeout")) == 0
    assert await count(deps, where(timers.c.state.in_(("scheduled", "claimed")))) == 0
    cancels = await rows(deps, select(timers).where(timers.c.kind == CANCEL))
    assert Counter((t.state, t.outcome) for t in cancels) == {("done", "cancelled"): ORDERS}
    # The killed batches were claimed twice (by the killed worker, then the scanner), the
    # others once.
    assert Counter(t.attempts for t in cancels) == {
        1: ORDERS - at_kill.claimed,
        2: at_kill.claimed,
    }
    # One notice per order, with its reason. The recovery sent exactly those the killed worker
    # had not; one being sent at the kill may have gone out twice (receivers drop the repeat by
    # its reminder_id).
    notices = await rows(deps, select(reminders).where(reminders.c.kind == CLOSED))
    assert len(notices) == ORDERS == len({r.order_id for r in notices})
    assert {r.state for r in notices} == {"sent"}
    assert sum(r.deliveries > 1 for r in notices) <= at_kill.sending
    sent = [r.order_id for r in world.notifier.sent]
    assert len(sent) == len(set(sent))
    assert set(sent) == {r.order_id for r in notices} - at_kill.notified
    assert {r.reason for r in world.notifier.sent} == {"pay_timeout"}
    result = await check_invariants(deps, tolerance_seconds=0)
    assert result.ok, result
