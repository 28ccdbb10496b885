"""Payment reminders through a real webhook receiver: each delivered once, unless its outcome is
unknown (then resent a bounded number of times under the same delivery id), never for an order
that moved on, and counted by what reached the receiver.

The receiver is a real HTTP server on 127.0.0.1. A receiver that "answers after 4.5 s" moves the
FakeClock 4.5 s before answering (on the event loop, while the sender waits for the answer), so
leases run out for real without sleeping.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest
from sqlalchemy import select

from dueflow.domain.timers import TimerKind
from dueflow.notifiers import webhook
from dueflow.notifiers.webhook import WebhookNotifier
from dueflow.service import operations
from dueflow.service import orders as order_service
from dueflow.service.payments import record_manual_payment
from dueflow.service.reminders import pay_reminder
from dueflow.store import timers
from dueflow.store.schema import orders, reminders
from dueflow.store.schema import timers as t_timers
from dueflow.worker.runner import Worker
from dueflow.worker.scanner import scan_once
from tests.conftest import eventually, http_receiver

K = TimerKind
SECRET = "s3cret-key"
SEND_TAKES = timedelta(seconds=4.5)


@dataclass
class Receiver:
    """A webhook receiver. ``before_answer(n, body)`` runs in the server thread before the n-th
    request (from 1) is answered; ``delay`` is real time the answer takes (a slow receiver)."""

    url: str
    status: int = 204
    delay: float = 0.0
    before_answer: Callable[[int, bytes], None] | None = None
    deliveries: list[str] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, delivery: str, body: bytes) -> int:
        with self.lock:
            self.deliveries.append(delivery)
            self.bodies.append(body)
            return len(self.deliveries)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state: dict[str, Receiver] = {}

    def on_post(request: BaseHTTPRequestHandler) -> None:
        body = request.rfile.read(int(request.headers.get("Content-Length", "0")))
        current = state["receiver"]
        n = current.take(request.headers["X-Dueflow-Delivery"], body)
        if current.before_answer is not None:
            current.before_answer(n, body)
        if current.delay:
            time.sleep(current.delay)
        try:
            request.send_response(current.status)
            request.send_header("Content-Length", "0")
            request.end_headers()
        except OSError:
            pass  # the sender gave up waiting (a timeout) and closed the connection

    with http_receiver(on_post) as url:
        state["receiver"] = Receiver(url=url)
        yield state["receiver"]


@pytest.fixture
def world(backend_world):
    """Every test on SQLite, PostgreSQL and MariaDB: the checks before a send are SQL."""
    return backend_world


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(webhook, "RETRY_DELAYS", (0.01, 0.02))


def on_loop(loop: asyncio.AbstractEventLoop, work: Callable[[], Awaitable[Any]]) -> None:
    """Run ``work`` on the test's event loop from the receiver's thread and wait for it."""
    asyncio.run_coroutine_threadsafe(_call(work), loop).result(timeout=10)


async def _call(work: Callable[[], Awaitable[Any]]) -> None:
    await work()


def slow_answers(world, loop: asyncio.AbstractEventLoop) -> Callable[[int, bytes], None]:
    """Each answer comes ``SEND_TAKES`` later on the FakeClock."""

    async def advance() -> None:
        world.clock.advance(SEND_TAKES)

    return lambda n, body: on_loop(loop, advance)


def use_webhook(world, receiver: Receiver, **kwargs: Any) -> WebhookNotifier:
    notifier = WebhookNotifier(url=receiver.url, secret=SECRET, **kwargs)
    world.deps.notifier = notifier  # closed by the world fixture
    return notifier


def unused_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def place(world) -> int:
    goods_id = await world.goods()
    return await order_service.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)


async def rows(world, query) -> list[Any]:
    async with world.deps.db.read() as conn:
        return list((await conn.execute(query)).all())


async def reminder_of(world, order_id: int) -> Any:
    (row,) = await rows(world, select(reminders).where(reminders.c.order_id == order_id))
    return row


async def reminder_timer(world, order_id: int) -> Any:
    (row,) = await rows(
        world,
        select(t_timers).where(
            t_timers.c.order_id == order_id, t_timers.c.kind == K.PAY_REMINDER.value
        ),
    )
    return row


async def settle_retries(world) -> None:
    """Let every retried reminder timer run to its end."""
    for _ in range(6):
        world.clock.advance(timedelta(minutes=2))
        await world.worker.drain()


# (a) a batch that sends longer than the lease ---------------------------------------------


async def test_a_batch_sending_past_its_lease_delivers_each_reminder_once(world, receiver):
    """The issue's run: one sender at a time, answers after 4.5 s, the scanner reclaiming."""
    use_webhook(world, receiver)
    world.deps.provider_concurrency = 1
    world.deps.lease = timedelta(seconds=10)
    receiver.before_answer = slow_answers(world, asyncio.get_running_loop())
    order_ids = [await place(world) for _ in range(8)]
    world.clock.advance(timedelta(minutes=5))

    first = asyncio.create_task(world.worker.drain())
    assert await eventually(lambda: len(receiver.deliveries) >= 3)  # 13.5 s: past the lease
    await scan_once(Worker(world.deps))
    await first
    await settle_retries(world)

    rems = [await reminder_of(world, oid) for oid in order_ids]
    assert Counter(receiver.deliveries) == {str(r.id): 1 for r in rems}
    assert {r.state for r in rems} == {"sent"}
    assert [r.deliveries for r in rems] == [1] * len(rems)
    summary = await operations.summary(world.deps)
    assert summary["invariants"]["reminders_twice"] == []


async def test_reminders_a_handler_still_holds_are_not_taken_and_lost_ones_not_sent(
    world, receiver
):
    """A first handler whose timers were reclaimed by the scanner (its lease ran out while it
    sent) sends only what its reminder claims still cover; the scanner's handler the rest."""
    use_webhook(world, receiver)
    world.deps.provider_concurrency = 1
    world.deps.lease = timedelta(seconds=10)
    advance = slow_answers(world, asyncio.get_running_loop())
    # The first handler's third answer waits until the scanner has looked (13.5 s of the clock
    # later, past the 10 s lease): however fast the handler runs, it still holds timers then.
    scanned = threading.Event()

    def answer(n: int, body: bytes) -> None:
        advance(n, body)
        if n == 3:
            scanned.wait(10)

    receiver.before_answer = answer
    order_ids = [await place(world) for _ in range(6)]
    world.clock.advance(timedelta(minutes=5))
    async with world.deps.db.write() as conn:
        batch = await timers.claim_due(
            conn, now=world.clock.now(), limit=10, lease=world.deps.lease
        )
    assert len(batch) == 6
    claimed_at = world.clock.now()

    first = asyncio.create_task(pay_reminder(world.deps, batch))  # no heartbeat: a plain handler
    try:
        # The third delivery is recorded before its answer moves the clock: wait for both.
        assert await eventually(
            lambda: (
                len(receiver.deliveries) >= 3 and world.clock.now() >= claimed_at + 3 * SEND_TAKES
            )
        )
        report = await scan_once(Worker(world.deps))
    finally:
        scanned.set()
    # The scanner did take the first handler's timers back: those it had not finished yet.
    assert report.claimed >= 1
    await first
    await settle_retries(world)

    rems = [await reminder_of(world, oid) for oid in order_ids]
    assert Counter(receiver.deliveries) == {str(r.id): 1 for r in rems}
    assert [(r.state, r.deliveries) for r in rems] == [("sent", 1)] * 6
    for oid in order_ids:
        assert (await reminder_timer(world, oid)).state == "done"


# (b) a receiver slower than the notifier timeout -------------------------------------------


async def test_a_slow_receiver_gets_a_bounded_number_of_deliveries_with_one_id(world, receiver):
    use_webhook(world, receiver, timeout=0.05)
    receiver.delay = 0.3
    order_id = await place(world)
    world.clock.advance(timedelta(minutes=5))
    assert await world.worker.drain() == 1
    assert len(receiver.deliveries) == 1  # a read timeout is not resent within the attempt
    rem = await reminder_of(world, order_id)
    assert (rem.state, rem.deliveries) == ("pending", 1)
    t = await reminder_timer(world, order_id)
    assert t.state == "scheduled" and "outcome unknown" in t.last_error

    for _ in range(8):  # every retry the backoff allows, and more
        world.clock.advance(timedelta(minutes=2))
        await world.worker.drain()
    assert receiver.deliveries == [str(rem.id)] * 3
    rem = await reminder_of(world, order_id)
    assert (rem.state, rem.deliveries, rem.sent_at) == ("unknown", 3, None)
    t = await reminder_timer(world, order_id)
    assert t.state == "done" and t.outcome.startswith("gave up")
    assert (await rows(world, select(orders.c.status).where(orders.c.id == order_id))) == [
        ("pending_payment",)
    ]


async def test_an_unknown_outcome_is_not_resent_past_the_pay_deadline(world, receiver):
    use_webhook(world, receiver, timeout=0.05)
    receiver.delay = 0.3
    order_id = await place(world)
    world.clock.advance(timedelta(minutes=5))
    await world.worker.drain()
    assert len(receiver.deliveries) == 1
    t = await reminder_timer(world, order_id)
    (deadline,) = await rows(world, select(orders.c.pay_deadline).where(orders.c.id == order_id))
    world.clock.set(deadline[0])
    # Only the reminder's retry runs (the cancel has not yet: its provider is slow, say).
    assert await world.worker.deliver([t.id]) == 1
    assert len(receiver.deliveries) == 1
    rem = await reminder_of(world, order_id)
    assert (rem.state, rem.deliveries) == ("unknown", 1)
    t = await reminder_timer(world, order_id)
    assert (t.state, t.outcome) == ("done", "skipped: pay deadline passed")


async def test_connection_refused_is_retried_and_not_counted(world, receiver):
    notifier = use_webhook(world, receiver)
    notifier.url = f"http://127.0.0.1:{unused_port()}/hook"  # nothing listens: refused
    order_id = await place(world)
    world.clock.advance(timedelta(minutes=5))
    await world.worker.drain()
    rem = await reminder_of(world, order_id)
    assert (rem.state, rem.deliveries) == ("pending", 0)
    notifier.url = receiver.url
    await settle_retries(world)
    rem = await reminder_of(world, order_id)
    assert (rem.state, rem.deliveries) == ("sent", 1)
    assert receiver.deliveries == [str(rem.id)]


# (c) an order that moved on while its batch was being sent ---------------------------------


@pytest.mark.parametrize("meanwhile", ["paid", "past the pay deadline"])
async def test_a_reminder_is_not_sent_for_an_order_that_moved_on_during_the_batch(
    world, receiver, meanwhile
):
    use_webhook(world, receiver)
    world.deps.provider_concurrency = 1
    loop = asyncio.get_running_loop()
    order_ids = [await place(world) for _ in range(2)]
    rem_ids: dict[str, int] = {}

    async def move_the_other_order() -> None:
        # The first reminder is being delivered: the other order moves on now.
        for oid in order_ids:
            rem_ids[str((await reminder_of(world, oid)).id)] = oid
        other = next(oid for d, oid in rem_ids.items() if d != receiver.deliveries[0])
        if meanwhile == "paid":
            await record_manual_payment(world.deps, order_id=other, amount="12.50")
        else:
            world.clock.advance(timedelta(minutes=30))

    receiver.before_answer = lambda n, body: on_loop(loop, move_the_other_order) if n == 1 else None
    world.clock.advance(timedelta(minutes=5))
    async with world.deps.db.write() as conn:
        batch = await timers.claim_due(
            conn, now=world.clock.now(), limit=10, lease=world.deps.lease
        )
    assert {t.order_id for t in batch} == set(order_ids)
    await world.worker.run_batch(batch)
    assert len(receiver.deliveries) == 1
    other = next(oid for d, oid in rem_ids.items() if d != receiver.deliveries[0])
    rem = await reminder_of(world, other)
    assert (rem.state, rem.sent_at, rem.deliveries) == ("pending", None, 0)


# the summary counts deliveries, not rows ---------------------------------------------------


async def test_the_summary_reports_a_reminder_delivered_twice(world, receiver):
    """An unknown outcome (the receiver got it, the answer was too slow) then a resend: the
    receiver holds two deliveries of one reminder, and the summary says so. The sender waits
    0.25 s, long enough that on a busy machine the request still reaches the receiver first (at
    0.05 s a send could time out before it arrived: one delivery, not two)."""
    use_webhook(world, receiver, timeout=0.25)
    receiver.before_answer = lambda n, body: time.sleep(1.0) if n == 1 else None
    order_ids = [await place(world) for _ in range(2)]
    world.clock.advance(timedelta(minutes=5))
    await world.worker.drain()
    await settle_retries(world)

    by_id = Counter(receiver.deliveries)
    rems = {oid: await reminder_of(world, oid) for oid in order_ids}
    twice = next(oid for oid, r in rems.items() if str(r.id) == receiver.deliveries[0])
    assert [by_id[str(r.id)] for oid, r in rems.items()] == [
        2 if oid == twice else 1 for oid in order_ids
    ]
    summary = await operations.summary(world.deps)
    assert summary["invariants"]["reminders_twice"] == [twice]
    assert summary["invariants"]["ok"] is False
    assert [(r.state, r.deliveries) for r in rems.values()] == [
        ("sent", by_id[str(r.id)]) for r in rems.values()
    ]
