"""The ``order_closed`` notice: every cancel of every flow tells the buyer once, with the reason;
repeated deliveries of its timer send it once; a failing or hanging notifier neither blocks nor
rolls back the cancel, and the notice goes out later with backoff; a real webhook receiver gets
it signed, with the reason."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from http.server import BaseHTTPRequestHandler

import pytest
from sqlalchemy import select

from dueflow.domain.timers import TimerKind
from dueflow.exceptions import BackendUnavailable
from dueflow.notifiers import webhook
from dueflow.notifiers.base import Reminder
from dueflow.notifiers.webhook import WebhookNotifier
from dueflow.service import orders, payments, reminders, shop, tickets
from dueflow.store import timers
from dueflow.store.schema import reminders as t_reminders
from dueflow.store.schema import timers as t_timers
from dueflow.worker.runner import Worker
from tests.conftest import RecordingNotifier, eventually, http_receiver
from tests.envelopes import invalid
from tests.unit.test_webhook import SECRET, Received, check_signature

CLOSED = TimerKind.ORDER_CLOSED.value
FIRST_BACKOFF = timedelta(seconds=30)


def closed(notifier: RecordingNotifier) -> list[Reminder]:
    """The order_closed notices sent (payment reminders aside)."""
    return [r for r in notifier.sent if r.kind == CLOSED]


async def pay(world, view) -> None:
    await payments.record_manual_payment(world.deps, order_id=view["id"], amount=view["amount"])


async def notice_timer(world, order_id: int):
    async with world.deps.db.read() as conn:
        return (
            await conn.execute(
                select(t_timers).where(t_timers.c.order_id == order_id, t_timers.c.kind == CLOSED)
            )
        ).one()


async def notice_row(world, order_id: int):
    async with world.deps.db.read() as conn:
        return (
            await conn.execute(
                select(t_reminders).where(
                    t_reminders.c.order_id == order_id, t_reminders.c.kind == CLOSED
                )
            )
        ).one_or_none()


async def _pay_timeout_shop(world) -> int:
    view = await world.shop_order({await world.sku(): 1})
    world.clock.advance(timedelta(minutes=15))
    await world.worker.drain()
    return view["id"]


async def _pay_timeout_flash(world) -> int:
    sale_id = await world.flash_sale(await world.sku())
    view = await shop.place_flash_order(
        world.deps, buyer_id=world.buyer, flash_sale_id=sale_id, quantity=1
    )
    world.clock.advance(timedelta(minutes=5))
    await world.worker.drain()
    return view["id"]


async def _pay_timeout_goods(world) -> int:
    order_id = await orders.place_order(
        world.deps, buyer_id=world.buyer, goods_id=await world.goods()
    )
    world.clock.advance(timedelta(minutes=30))
    await world.worker.drain()
    return order_id


async def _buyer_cancel(world) -> int:
    view = await world.shop_order({await world.sku(): 1}, coupon=await world.coupon(off="1.00"))
    await orders.cancel_by_buyer(world.deps, order_id=view["id"], user_id=world.buyer)
    await world.worker.drain()
    return view["id"]


async def _seller_cancel(world) -> int:
    view = await world.shop_order({await world.sku(): 2})
    await pay(world, view)
    await orders.cancel_by_seller(world.deps, order_id=view["id"], user_id=world.seller)
    await world.worker.drain()
    return view["id"]


async def _ship_timeout(world) -> int:
    view = await world.shop_order({await world.sku(): 1})
    await pay(world, view)
    world.clock.advance(timedelta(days=3))
    await world.worker.drain()
    return view["id"]


async def _show_cancel(world) -> int:
    show_id = await world.show()
    view = await world.seats(show_id, ["A-1"])
    await tickets.cancel_show(world.deps, show_id=show_id, user_id=world.seller)
    await world.worker.drain()
    return view["id"]


@pytest.mark.parametrize(
    ("cancel", "reason", "status"),
    [
        (_pay_timeout_shop, "pay_timeout", "cancelled_unpaid"),
        (_pay_timeout_flash, "pay_timeout", "cancelled_unpaid"),
        (_pay_timeout_goods, "pay_timeout", "cancelled_unpaid"),
        (_buyer_cancel, "buyer_cancel", "cancelled_unpaid"),
        (_seller_cancel, "seller_cancel", "cancelled_unshipped"),
        (_ship_timeout, "ship_timeout", "cancelled_unshipped"),
        (_show_cancel, "show_cancel", "cancelled_unpaid"),
    ],
    ids=lambda v: v.__name__.strip("_") if callable(v) else None,
)
async def test_every_cancel_tells_the_buyer_once_with_the_reason(world, cancel, reason, status):
    order_id = await cancel(world)
    view = await orders.order_view(world.deps, order_id)
    assert (view["status"], view["cancel_reason"]) == (status, reason)
    [notice] = closed(world.notifier)
    assert (notice.order_id, notice.buyer_id, notice.reason) == (order_id, world.buyer, reason)
    assert notice.amount == view["amount"]
    [row] = [n for n in view["notices"] if n["kind"] == CLOSED]
    assert (row["state"], row["deliveries"], row["sent_at"]) == ("sent", 1, world.clock.now())
    assert notice.reminder_id == (await notice_row(world, order_id)).id
    timer = await notice_timer(world, order_id)
    assert (timer.state, timer.outcome) == ("done", "sent")
    # Nothing later sends it again: not the scanner's deadlines, not another drain.
    world.clock.advance(timedelta(days=30))
    await world.worker.drain()
    assert len(closed(world.notifier)) == 1


async def test_a_redelivered_timer_sends_nothing_more(world):
    order_id = await _buyer_cancel(world)
    timer = await notice_timer(world, order_id)
    assert await world.worker.deliver([timer.id]) == 0
    assert await Worker(world.deps).deliver([timer.id, timer.id]) == 0
    assert len(closed(world.notifier)) == 1


async def _claim(world, timer_id: int) -> timers.Claimed:
    async with world.deps.db.write() as conn:
        [claimed] = await timers.claim_ids(
            conn, [timer_id], now=world.clock.now(), lease=world.deps.lease
        )
    return claimed


async def _cancelled_unnotified(world) -> int:
    """A cancelled order whose notice timer is due and not yet run."""
    view = await world.shop_order({await world.sku(): 1})
    await orders.cancel_by_buyer(world.deps, order_id=view["id"], user_id=world.buyer)
    return view["id"]


async def test_the_handler_run_twice_for_one_claim_sends_once(world):
    order_id = await _cancelled_unnotified(world)
    claimed = await _claim(world, (await notice_timer(world, order_id)).id)
    await reminders.order_closed(world.deps, [claimed])
    await reminders.order_closed(world.deps, [claimed])
    assert len(closed(world.notifier)) == 1
    assert (await notice_timer(world, order_id)).outcome == "sent"


async def test_two_handlers_at_once_for_one_claim_send_once(world):
    order_id = await _cancelled_unnotified(world)
    claimed = await _claim(world, (await notice_timer(world, order_id)).id)
    await asyncio.gather(
        reminders.order_closed(world.deps, [claimed]),
        reminders.order_closed(world.deps, [claimed]),
    )
    world.clock.advance(timedelta(minutes=10))  # past any backoff the loser put the timer in
    await world.worker.drain()
    assert len(closed(world.notifier)) == 1
    assert (await notice_row(world, order_id)).state == "sent"
    assert (await notice_timer(world, order_id)).state == "done"


async def test_a_claim_taken_again_after_its_lease_ran_out_sends_once(world):
    """A slow worker's claim expires and the scanner claims the timer again: both handlers
    run, the notice goes out once."""
    order_id = await _cancelled_unnotified(world)
    timer_id = (await notice_timer(world, order_id)).id
    slow = await _claim(world, timer_id)
    world.clock.advance(world.deps.lease + timedelta(seconds=1))
    async with world.deps.db.write() as conn:
        [again], _ = await timers.claim_overdue(
            conn,
            now=world.clock.now(),
            cutoff=world.clock.now(),
            after=None,
            limit=10,
            lease=world.deps.lease,
        )
    assert again.id == timer_id and again.token != slow.token
    await asyncio.gather(
        reminders.order_closed(world.deps, [slow]),
        reminders.order_closed(world.deps, [again]),
    )
    world.clock.advance(timedelta(minutes=10))
    await world.worker.drain()
    assert len(closed(world.notifier)) == 1


async def test_two_workers_draining_together_notify_each_order_once(world):
    sku_id = await world.sku(stock=40)
    placed = [await world.shop_order({sku_id: 1}) for _ in range(20)]
    world.clock.advance(timedelta(minutes=15))
    await asyncio.gather(world.worker.drain(), Worker(world.deps).drain())
    assert sorted(n.order_id for n in closed(world.notifier)) == [v["id"] for v in placed]
    assert {n.reason for n in closed(world.notifier)} == {"pay_timeout"}
    sku = await shop.sku_view(world.deps, sku_id)
    assert (sku["stock"], sku["held"], sku["sold"]) == (40, 0, 0)


@pytest.mark.parametrize("failure", [BackendUnavailable("receiver down"), RuntimeError("boom")])
async def test_a_failing_notifier_never_rolls_back_the_cancel(world, failure):
    sku_id = await world.sku(stock=3)
    coupon_id = await world.coupon(off="1.00")
    view = await world.shop_order({sku_id: 2}, coupon=coupon_id)
    world.notifier.fail_with = failure
    await orders.cancel_by_buyer(world.deps, order_id=view["id"], user_id=world.buyer)
    world.clock.advance(timedelta(minutes=15))  # the pay deadline passes as well
    await world.worker.drain()
    gone = await orders.order_view(world.deps, view["id"])
    assert (gone["status"], gone["cancel_reason"]) == ("cancelled_unpaid", "buyer_cancel")
    assert (await shop.sku_view(world.deps, sku_id))["stock"] == 3
    assert [c["state"] for c in await shop.coupons_of(world.deps, world.buyer)] == ["available"]
    timer = await notice_timer(world, view["id"])
    assert (timer.state, timer.attempts) == ("scheduled", 1)
    assert timer.due_at == world.clock.now() + FIRST_BACKOFF
    assert str(failure) in timer.last_error
    row = await notice_row(world, view["id"])
    assert (row.state, row.deliveries) == ("pending", 0)
    # Still failing at the first retry: the next wait doubles.
    world.clock.advance(FIRST_BACKOFF)
    assert await world.worker.drain() == 1
    timer = await notice_timer(world, view["id"])
    assert (timer.attempts, timer.due_at) == (2, world.clock.now() + 2 * FIRST_BACKOFF)
    # The notifier recovers: the notice goes out once, with the reason.
    world.notifier.fail_with = None
    world.clock.advance(2 * FIRST_BACKOFF)
    assert await world.worker.drain() == 1
    [notice] = closed(world.notifier)
    assert (notice.order_id, notice.reason) == (view["id"], "buyer_cancel")
    assert ((await notice_row(world, view["id"])).state, timer.id) == (
        "sent",
        (await notice_timer(world, view["id"])).id,
    )
    assert (await notice_timer(world, view["id"])).state == "done"
    assert (await shop.sku_view(world.deps, sku_id))["stock"] == 3


class Hanging(RecordingNotifier):
    """A notifier whose sends wait until ``answer`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = asyncio.Event()
        self.waiting = 0

    async def send(self, reminder: Reminder) -> None:
        self.waiting += 1
        await self.answer.wait()
        await super().send(reminder)


async def test_a_hanging_notifier_does_not_hold_up_the_cancel(world):
    notifier = world.deps.notifier = Hanging()
    sku_id = await world.sku(stock=2)
    view = await world.shop_order({sku_id: 2})
    world.clock.advance(timedelta(minutes=15))
    draining = asyncio.create_task(world.worker.drain())
    try:
        assert await eventually(lambda: notifier.waiting == 1)
        # The cancel committed before the send began: stock is back while the send hangs.
        assert (await orders.order_view(world.deps, view["id"]))["status"] == "cancelled_unpaid"
        assert (await shop.sku_view(world.deps, sku_id))["stock"] == 2
        other = await world.shop_order({sku_id: 1})
        await orders.cancel_by_buyer(world.deps, order_id=other["id"], user_id=world.buyer)
        assert (await shop.sku_view(world.deps, sku_id))["stock"] == 2
    finally:
        notifier.answer.set()
        await draining
    await world.worker.drain()
    assert sorted(n.order_id for n in closed(notifier)) == [view["id"], other["id"]]


@dataclass
class Receiver:
    """A webhook receiver answering ``statuses`` in turn (the last one repeats)."""

    url: str = ""
    statuses: list[int] = field(default_factory=lambda: [204])
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, request: Received) -> int:
        with self.lock:
            self.received.append(request)
            return self.statuses[min(len(self.received), len(self.statuses)) - 1]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    current = Receiver()

    def on_post(request: BaseHTTPRequestHandler) -> None:
        body = request.rfile.read(int(request.headers.get("Content-Length", "0")))
        headers = {k.lower(): v for k, v in request.headers.items()}
        request.send_response(current.take(Received(request.path, headers, body)))
        request.send_header("Content-Length", "0")
        request.end_headers()

    with http_receiver(on_post) as url:
        current.url = url
        yield current


@pytest.fixture(autouse=True)
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(webhook, "RETRY_DELAYS", (0.01, 0.02))


async def test_a_webhook_receiver_gets_the_signed_notice_with_its_reason(world, receiver):
    world.deps.notifier = WebhookNotifier(url=receiver.url, secret=SECRET)  # closed by the world
    order_id = await _seller_cancel(world)
    [request] = receiver.received
    check_signature(request)
    row = await notice_row(world, order_id)
    assert request.headers["x-dueflow-delivery"] == str(row.id)
    body = json.loads(request.body)
    view = await orders.order_view(world.deps, order_id)
    assert invalid(body) == []
    assert (body["id"], body["type"], body["version"]) == (f"ntc_{row.id}", "order_closed", 1)
    assert body["data"] == {"buyer_id": world.buyer, "reason": "seller_cancel"}
    assert body["actor"] == {"type": "system", "name": "notifier"}
    assert (body["order"]["id"], body["order"]["status"]) == (order_id, view["status"])
    assert body["order"]["amount"] == str(view["amount"])
    assert row.state == "sent"


async def test_a_failing_webhook_is_retried_later_under_the_same_delivery_id(world, receiver):
    world.deps.notifier = WebhookNotifier(url=receiver.url, secret=SECRET)
    receiver.statuses = [503, 503, 503, 204]
    sku_id = await world.sku(stock=1)
    view = await world.shop_order({sku_id: 1})
    await orders.cancel_by_buyer(world.deps, order_id=view["id"], user_id=world.buyer)
    await world.worker.drain()
    assert len(receiver.received) == 3  # the notifier's own retries, all refused
    assert (await orders.order_view(world.deps, view["id"]))["status"] == "cancelled_unpaid"
    assert (await shop.sku_view(world.deps, sku_id))["stock"] == 1
    timer = await notice_timer(world, view["id"])
    assert timer.state == "scheduled" and "HTTP 503" in timer.last_error
    world.clock.advance(FIRST_BACKOFF)
    assert await world.worker.drain() == 1
    assert len(receiver.received) == 4
    assert len({r.headers["x-dueflow-delivery"] for r in receiver.received}) == 1
    assert json.loads(receiver.received[-1].body)["data"]["reason"] == "buyer_cancel"
    check_signature(receiver.received[-1])
    assert (await notice_row(world, view["id"])).state == "sent"
