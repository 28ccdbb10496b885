"""A provider that hangs holds up only its own orders: the claim loop leaves a batch waiting on
a provider running in its lane, keeps its leases, and goes on with other deadlines (issue 9,
item 4). The provider is a stand-in here: what is under test is the worker above it."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from decimal import Decimal
from unittest import mock

from sqlalchemy import select

from dueflow.exceptions import BackendUnavailable
from dueflow.payments.base import CloseOutcome, PaymentProvider, Providers
from dueflow.payments.manual import ManualProvider
from dueflow.service import orders
from dueflow.store import payments as payment_store
from dueflow.store import schema
from dueflow.timers.base import Trigger
from dueflow.worker.scanner import Scanner, ScanReport, run_scanner, scan_once
from tests.conftest import World, eventually


class Hanging(PaymentProvider):
    """Closes a trade only once the test lets it answer."""

    name = "hanging"

    def __init__(self) -> None:
        self.answer = asyncio.Event()
        self.calls = 0

    async def close_or_query(self, attempt, now):  # type: ignore[no-untyped-def]
        self.calls += 1
        await self.answer.wait()
        return CloseOutcome.closed("closed at last")


async def place(world: World) -> int:
    goods_id = await world.goods()
    return await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)


async def place_trading(world: World, pay_no: str) -> int:
    """An order with an open attempt at the hanging provider."""
    order_id = await place(world)
    async with world.deps.db.write() as conn:
        await payment_store.insert_attempt(
            conn,
            pay_no=pay_no,
            order_id=order_id,
            provider="hanging",
            amount=Decimal("12.50"),
            expires_at=world.clock.now() + timedelta(minutes=30),
            now=world.clock.now(),
        )
    return order_id


async def status(world: World, order_id: int) -> str:
    async with world.deps.db.read() as conn:
        query = select(schema.orders.c.status).where(schema.orders.c.id == order_id)
        return str((await conn.execute(query)).scalar_one())


async def test_a_hanging_close_delays_no_other_deadline(world: World) -> None:
    hanging = Hanging()
    world.deps.providers = Providers([ManualProvider(), hanging])
    trading, plain = await place_trading(world, "P-hang"), await place(world)
    stop = asyncio.Event()
    loop = asyncio.create_task(world.worker.run(stop))
    try:
        world.clock.advance(timedelta(minutes=31))
        # The order without a trade is cancelled while its batch-mate's close hangs.
        assert await eventually(lambda: _is(world, plain, "cancelled_unpaid"))
        assert hanging.calls == 1 and await status(world, trading) == "pending_payment"

        # A deadline that comes later runs too: the hanging batch waits in its own lane.
        later = await place(world)
        world.clock.advance(timedelta(minutes=31))
        assert await eventually(lambda: _is(world, later, "cancelled_unpaid"))
        assert await status(world, trading) == "pending_payment"

        # The hanging batch's lease is renewed as the clock passes it: the scanner leaves it.
        # (Its keeper starts after a second of real time; the idle loop is the other sleeper.)
        assert await eventually(lambda: world.clock.sleepers >= 2)
        world.clock.advance(world.deps.lease)
        assert await eventually(lambda: world.worker.stats.renewals >= 1)
        assert (await scan_once(world.worker)).claimed == 0
        assert hanging.calls == 1

        hanging.answer.set()
        assert await eventually(lambda: _is(world, trading, "cancelled_unpaid"))
    finally:
        hanging.answer.set()
        stop.set()
        world.deps.trigger.wake()
        await asyncio.wait_for(loop, timeout=10)
    assert world.worker.stats.failed_batches == 0


async def test_stopping_waits_for_the_batches_in_their_lanes(world: World) -> None:
    hanging = Hanging()
    world.deps.providers = Providers([ManualProvider(), hanging])
    trading = await place_trading(world, "P-stop")
    stop = asyncio.Event()
    loop = asyncio.create_task(world.worker.run(stop))
    world.clock.advance(timedelta(minutes=31))
    assert await eventually(lambda: hanging.calls == 1)
    stop.set()
    world.deps.trigger.wake()
    await asyncio.sleep(0.05)
    assert not loop.done()  # the batch in progress finishes before run returns
    hanging.answer.set()
    await asyncio.wait_for(loop, timeout=10)
    assert await status(world, trading) == "cancelled_unpaid"


async def test_a_scanner_pass_goes_on_past_a_batch_that_hangs(world: World) -> None:
    """The soak found unpaid cancels 16-21 s late after a FLUSHALL: the scanner ran each batch
    of missed timers to its end before claiming the next, and slept a whole interval after a
    long pass. A batch waiting on a provider now goes on in its lane while the pass claims on,
    and the pass's end waits for nothing."""
    hanging = Hanging()
    world.deps.providers = Providers([ManualProvider(), hanging])
    world.deps.batch_size = 1  # one timer a batch: the hanging one is claimed first
    trading = await place_trading(world, "P-scan")
    plain = await place(world)
    world.clock.advance(timedelta(minutes=31))  # both cancels (and reminders) missed
    scanner = Scanner(world.worker)
    report = await scanner.scan()
    assert hanging.calls == 1
    assert report.claimed == 4 and report.batches == 4  # every batch claimed, one hanging
    assert await status(world, plain) == "cancelled_unpaid"
    assert await status(world, trading) == "pending_payment"

    hanging.answer.set()
    await scanner.settle()
    assert await status(world, trading) == "cancelled_unpaid"
    assert world.worker.stats.failed_batches == 0


async def test_scanner_passes_start_a_scan_interval_apart(world: World) -> None:
    """A pass that took 3 s of a 4 s interval is followed by the next 1 s after it ends."""
    world.deps.scan_interval = timedelta(seconds=4)
    started: list[object] = []
    scan = Scanner.scan

    async def slow(self: Scanner, stop: asyncio.Event | None = None) -> ScanReport:
        started.append(world.clock.now())
        world.clock.advance(3)
        return await scan(self, stop)

    stop = asyncio.Event()
    with mock.patch.object(Scanner, "scan", slow):
        task = asyncio.create_task(run_scanner(world.worker, stop))
        try:
            assert await eventually(lambda: world.clock.sleepers == 1)
            world.clock.advance(timedelta(seconds=1))
            assert await eventually(lambda: len(started) == 2)
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=5)
    assert started[1] == started[0] + timedelta(seconds=4)  # type: ignore[operator]


async def _is(world: World, order_id: int, wanted: str) -> bool:
    return await status(world, order_id) == wanted


class FlakyTrigger(Trigger):
    """Hands over ids of timers that are not due (the scanner ran them) and fails every ack."""

    def __init__(self) -> None:
        self.acks = 0

    @classmethod
    def from_url(cls, url, *, clock=None):  # type: ignore[no-untyped-def]
        return cls()

    async def armed(self, timers):  # type: ignore[no-untyped-def]
        return None

    async def wait(self, clock, until):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        return [987654]

    def wake(self) -> None:
        return None

    async def ack(self, timer_ids):  # type: ignore[no-untyped-def]
        self.acks += 1
        raise BackendUnavailable("the trigger is away")


async def test_a_failure_after_a_lane_was_given_back_does_not_give_it_back_twice(world: World):
    """Found in review: an error after the loop gave its lane back (a failed ack) released the
    lane again, and each time the worker gained one more lane than DUEFLOW_WORKER_BATCHES."""
    trigger = FlakyTrigger()
    world.deps.trigger = trigger
    world.deps.max_idle = timedelta(0)
    stop = asyncio.Event()
    loop = asyncio.create_task(world.worker.run(stop))
    try:
        assert await eventually(lambda: trigger.acks >= 5 or loop.done())
        assert not loop.done()  # a double release of the bounded lanes would have ended it
    finally:
        stop.set()
        await asyncio.wait_for(loop, timeout=10)
    lanes = world.worker._lanes
    assert lanes is not None
    # Every lane is free again and none was added: exactly worker_batches acquisitions fit.
    for _ in range(world.deps.worker_batches):
        assert not lanes.locked()
        await lanes.acquire()
    assert lanes.locked()
