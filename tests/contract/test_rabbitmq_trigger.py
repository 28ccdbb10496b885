"""The ``rabbitmq`` trigger against a real RabbitMQ: delay levels, hops, order, horizon, wake-up,
redelivery of un-acked messages, and the database staying the truth when the queues are lost;
every test that talks to the broker runs on classic and on quorum queues.

Each test declares its own queues under a fresh prefix and deletes them afterwards. Locally an
unreachable RabbitMQ skips the tests that need it; in CI (CI=true) it fails them.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from sqlalchemy import select

from dueflow import bootstrap
from dueflow.clock import SystemClock
from dueflow.config import load_settings
from dueflow.domain.timers import TimerKind
from dueflow.exceptions import BackendUnavailable, ConfigError
from dueflow.service import accounts
from dueflow.service.orders import place_order
from dueflow.store import timers
from dueflow.store.schema import orders
from dueflow.store.timers import Armed
from dueflow.timers import registry
from dueflow.timers.rabbitmq import LEVELS_MS, RabbitTrigger, _Tags, choose_level
from dueflow.worker.runner import Worker
from dueflow.worker.scanner import scan_once
from tests.conftest import eventually
from tests.contract import rabbit_kit
from tests.contract.rabbit_kit import CLOCK, UNREACHABLE, URL, collect, depths, purge, spy_publishes

MS = timedelta(milliseconds=1)
US = timedelta(microseconds=1)

rabbitmq = pytest.mark.rabbitmq

# The kit's fixtures, taken by name: a RabbitMQ channel, a fresh prefix, triggers on it, and the
# kind of queue (each broker test runs on both).
admin = rabbit_kit.admin
prefix = rabbit_kit.prefix
make_trigger = rabbit_kit.make_trigger
queues = rabbit_kit.queues


# --- the level choice (pure) ------------------------------------------------------------------


def test_the_levels_are_the_documented_ones():
    assert LEVELS_MS == (
        100,
        250,
        500,
        1_000,
        2_000,
        5_000,
        10_000,
        30_000,
        60_000,
        120_000,
        300_000,
        600_000,
        1_800_000,
        3_600_000,
        7_200_000,
    )


@pytest.mark.parametrize("index", range(len(LEVELS_MS)))
def test_choose_level_at_each_boundary(index):
    level = LEVELS_MS[index]
    below = LEVELS_MS[index - 1] if index else None
    above_limit = LEVELS_MS[index + 1] if index + 1 < len(LEVELS_MS) else None
    exact = level * MS
    assert choose_level(exact) == level
    assert choose_level(exact - US) == below
    assert choose_level(exact + US) == level
    if above_limit is not None:
        assert choose_level(above_limit * MS - US) == level
        assert choose_level((exact + above_limit * MS) / 2) == level


@pytest.mark.parametrize(
    ("remaining", "level"),
    [
        (timedelta(days=-1), None),
        (-US, None),
        (timedelta(0), None),
        (US, None),
        (99 * MS, None),
        (100 * MS - US, None),
        (100 * MS, 100),
        (timedelta(seconds=1.2), 1_000),
        (timedelta(minutes=45), 1_800_000),
        (timedelta(hours=2), 7_200_000),
        (timedelta(days=7), 7_200_000),
    ],
)
def test_choose_level_elsewhere(remaining, level):
    assert choose_level(remaining) == level


def test_choose_level_is_largest_not_above_for_every_millisecond_up_to_three_seconds():
    for ms in range(3_001):
        fitting = [lv for lv in LEVELS_MS if lv <= ms]
        assert choose_level(ms * MS) == (max(fitting) if fitting else None), ms


def test_from_url_takes_its_options_and_passes_the_rest_on():
    trigger = RabbitTrigger.from_url(
        "amqp://u:p@h:5673/vh?prefix=shop&horizon=30m&connect_timeout=2s&heartbeat=30&batch=7"
        "&redeliver_after=5m&queues=quorum"
    )
    assert trigger.queues == "quorum"
    assert trigger.redeliver_after == 300
    assert trigger.prefix == "shop"
    assert trigger.horizon == timedelta(minutes=30)
    assert trigger.connect_timeout == 2.0
    assert trigger.batch == 7
    assert trigger.url == "amqp://u:p@h:5673/vh?heartbeat=30"
    assert trigger.polls_database is False
    assert trigger.queue_names[:2] == ["shop.due", "shop.delay.100"]
    assert trigger.queue_names[-1] == "shop.delay.7200000"
    default = RabbitTrigger.from_url("amqp://localhost")
    assert (default.prefix, default.horizon) == ("dueflow", timedelta(hours=2))
    assert default.queues == "classic"


def test_registry_knows_amqp_and_amqps():
    assert isinstance(registry.from_url("amqp://localhost/?prefix=x"), RabbitTrigger)
    assert isinstance(registry.from_url("amqps://localhost/"), RabbitTrigger)


@pytest.mark.parametrize(
    "url",
    [
        "amqp://localhost/?prefix=has%20space",
        "amqp://localhost/?horizon=3x",
        "amqp://localhost/?horizon=0s",
        "amqp://localhost/?batch=0",
        "amqp://localhost/?queues=lazy",
        "amqp://localhost/?queues=",
        "redis://localhost/",
    ],
)
def test_from_url_refuses_bad_options(url):
    with pytest.raises(ConfigError):
        RabbitTrigger.from_url(url)


# --- settling deliveries in few frames (pure) --------------------------------------------------


def tags_delivered(*tags: int) -> _Tags:
    state = _Tags()
    for tag in tags:
        state.delivered(tag)
    return state


def test_a_whole_prefix_of_deliveries_is_acked_in_one_multiple_ack():
    state = tags_delivered(1, 2, 3, 4)
    assert state.ack_frames({1, 2, 3, 4}) == [(4, True)]
    assert state.unsettled == set()


def test_a_multiple_ack_never_reaches_a_delivery_still_unsettled():
    state = tags_delivered(1, 2, 3, 4, 5, 6)
    # 3 is held (or being re-armed, or handed to another loop): 4 and 6 go one by one.
    assert state.ack_frames({1, 2, 4, 6}) == [(2, True), (4, False), (6, False)]
    assert state.unsettled == {3, 5}
    assert state.ack_frames({3}) == [(3, True)]  # everything below 3 is settled
    assert state.ack_frames({5}) == [(5, True)]


def test_a_multiple_ack_never_reaches_a_delivery_not_seen_yet():
    state = tags_delivered(1, 3, 4)  # 2 is delivered but its task has not run yet
    assert state.seen == 1
    assert state.ack_frames({1, 3, 4}) == [(1, True), (3, False), (4, False)]
    state.delivered(2)
    assert state.seen == 4
    assert state.ack_frames({2}) == [(2, True)]


def test_a_tag_is_never_settled_twice():
    state = tags_delivered(1, 2, 3)
    assert state.ack_frames({2}) == [(2, False)]
    assert state.ack_frames({2}) == []
    assert state.ack_frames({1, 2, 3}) == [(3, True)]
    assert state.ack_frames({1, 2, 3}) == []


# --- timing through the real broker -----------------------------------------------------------


@rabbitmq
async def test_a_timer_comes_out_at_its_due_time_not_before(make_trigger):
    trigger = make_trigger()
    await trigger._channel()  # connect and declare first: the timing below is the broker's
    due = CLOCK.now() + timedelta(seconds=0.3)
    await trigger.armed([Armed(1, due)])
    got = await collect(trigger, {1}, within=3)
    assert 1 in got
    assert due <= got[1] < due + timedelta(milliseconds=150)


@rabbitmq
async def test_a_timer_hops_from_the_1s_level_down_and_arrives_on_time(make_trigger, admin):
    trigger = make_trigger()
    await trigger._channel()
    queues = spy_publishes(trigger)
    due = CLOCK.now() + timedelta(seconds=1.2)
    await trigger.armed([Armed(7, due)])
    assert queues == [trigger.level_queue(1_000)]
    assert await depths(admin, trigger) == {trigger.level_queue(1_000): 1}
    got = await collect(trigger, {7}, within=4)
    assert 7 in got
    assert due <= got[7] < due + timedelta(milliseconds=150)
    # Re-armed by explicit re-publish through smaller levels, never the 1 s one again.
    assert len(queues) >= 2
    assert all(q in {trigger.level_queue(ms) for ms in (100, 250)} for q in queues[1:]), queues
    assert await depths(admin, trigger) == {}


@rabbitmq
async def test_a_short_timer_never_waits_behind_a_longer_one(make_trigger):
    trigger = make_trigger()
    await trigger._channel()
    now = CLOCK.now()
    late, early = Armed(1, now + timedelta(seconds=2)), Armed(2, now + timedelta(seconds=0.2))
    await trigger.armed([late])
    await trigger.armed([early])
    got = await collect(trigger, {1, 2}, within=5)
    assert got.keys() == {1, 2}
    assert got[2] < got[1]
    for timer in (late, early):
        assert timer.due_at <= got[timer.id] < timer.due_at + timedelta(milliseconds=150)


@rabbitmq
async def test_only_timers_within_the_horizon_are_published(make_trigger, admin):
    trigger = make_trigger()
    now = CLOCK.now()
    await trigger.armed([Armed(1, now + timedelta(hours=3))])
    await trigger.armed([Armed(2, now + timedelta(hours=2, seconds=30))])
    await trigger._channel()
    assert await depths(admin, trigger) == {}
    await trigger.feed(
        [Armed(3, now + timedelta(hours=1, minutes=30)), Armed(4, now + timedelta(days=2))]
    )
    assert await depths(admin, trigger) == {trigger.level_queue(3_600_000): 1}
    short = make_trigger(horizon=timedelta(seconds=5))
    await short.armed([Armed(5, now + timedelta(seconds=20)), Armed(6, now + timedelta(seconds=3))])
    assert await depths(admin, trigger) == {
        trigger.level_queue(3_600_000): 1,
        trigger.level_queue(2_000): 1,
    }


@rabbitmq
async def test_due_and_overdue_timers_go_straight_to_the_due_queue(make_trigger, admin):
    trigger = make_trigger()
    now = CLOCK.now()
    await trigger.armed([Armed(1, now - timedelta(hours=1)), Armed(2, now)])
    assert await depths(admin, trigger) == {trigger.due_queue: 2}
    got = await collect(trigger, {1, 2}, within=2)
    assert got.keys() == {1, 2}


@rabbitmq
async def test_wake_releases_a_waiting_wait_promptly(make_trigger):
    trigger = make_trigger()
    await trigger._ensure_consumer()
    started = time.monotonic()
    waiting = asyncio.create_task(trigger.wait(CLOCK, CLOCK.now() + timedelta(seconds=10)))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    trigger.wake()
    assert await asyncio.wait_for(waiting, timeout=1) == []
    assert time.monotonic() - started < 0.5


@rabbitmq
async def test_wake_releases_every_concurrent_wait_and_a_wake_with_none_waiting_is_kept(
    make_trigger,
):
    trigger = make_trigger()
    await trigger._ensure_consumer()
    until = CLOCK.now() + timedelta(seconds=10)
    waits = [asyncio.create_task(trigger.wait(CLOCK, until)) for _ in range(3)]
    await asyncio.sleep(0.1)
    trigger.wake()
    assert await asyncio.wait_for(asyncio.gather(*waits), timeout=1) == [[], [], []]
    trigger.wake()  # nobody waiting: the next wait returns at once, the one after waits
    assert await asyncio.wait_for(trigger.wait(CLOCK, until), timeout=1) == []
    started = time.monotonic()
    assert await trigger.wait(CLOCK, CLOCK.now() + timedelta(seconds=0.2)) == []
    assert time.monotonic() - started >= 0.15


@rabbitmq
async def test_repeats_of_a_timer_are_handed_over_once_and_acked_together(make_trigger, admin):
    trigger = make_trigger()
    now = CLOCK.now()
    await trigger.armed([Armed(1, now)])
    await trigger.feed([Armed(1, now)])  # armed, then fed again by the feeder
    await asyncio.sleep(0.1)
    ids = await trigger.wait(CLOCK, CLOCK.now() + timedelta(seconds=1))
    assert ids == [1]
    assert await trigger.wait(CLOCK, CLOCK.now() + timedelta(seconds=0.2)) == []
    await trigger.ack(ids)
    await trigger.close()
    assert await depths(admin, trigger) == {}  # both copies were acked


@rabbitmq
async def test_wait_hands_over_at_most_a_batch(make_trigger):
    trigger = make_trigger(batch=3)
    now = CLOCK.now()
    await trigger.armed([Armed(i, now) for i in range(1, 8)])
    seen: list[Sequence[int]] = []
    deadline = time.monotonic() + 3
    while sum(len(b) for b in seen) < 7 and time.monotonic() < deadline:
        ids = await trigger.wait(CLOCK, CLOCK.now() + timedelta(seconds=0.2))
        assert ids is not None
        if ids:
            seen.append(ids)
            await trigger.ack(ids)
    assert sorted(i for b in seen for i in b) == list(range(1, 8))
    assert max(len(b) for b in seen) <= 3


@rabbitmq
async def test_unacked_timers_are_redelivered_after_a_worker_dies(make_trigger, admin):
    first = make_trigger()
    await first.armed([Armed(11, CLOCK.now()), Armed(12, CLOCK.now())])
    got = await collect(first, {11, 12}, within=2, ack=False)
    assert got.keys() == {11, 12}
    await first.ack([11])
    await first.close()  # killed before acking 12
    second = make_trigger()
    again = await collect(second, {12}, within=2, ack=False)
    assert again.keys() == {12}
    await second.ack([12])
    await second.close()
    assert await depths(admin, second) == {}


@rabbitmq
async def test_acking_some_of_a_batch_settles_exactly_those(make_trigger, admin):
    # Acks go out as multiple acks where they can: they must never take along a delivery that
    # was not acked (it comes back when the worker is gone), nor fail for one acked before.
    first = make_trigger()
    now = CLOCK.now()
    await first.armed([Armed(i, now) for i in range(1, 41)])
    got = await collect(first, set(range(1, 41)), within=3, ack=False)
    assert got.keys() == set(range(1, 41))
    await first.ack([i for i in range(1, 41) if i % 10 == 3])  # one by one, first
    await first.ack([i for i in range(1, 41) if i % 10 not in (3, 7)])
    await first.close()  # killed before acking 7, 17, 27, 37
    second = make_trigger()
    again = await collect(second, {7, 17, 27, 37}, within=3, ack=False)
    assert again.keys() == {7, 17, 27, 37}
    await asyncio.sleep(0.2)
    assert await second.wait(CLOCK, CLOCK.now() + timedelta(seconds=0.2)) == []
    await second.ack(list(again))
    await second.close()
    assert await depths(admin, second) == {}


@rabbitmq
async def test_ids_handed_over_and_never_acked_are_given_back(make_trigger, admin):
    # A worker loop that failed between wait and ack must not leak the prefetch for good.
    trigger = make_trigger(redeliver_after=timedelta(seconds=0.3))
    await trigger.armed([Armed(21, CLOCK.now())])
    assert (await collect(trigger, {21}, within=2, ack=False)).keys() == {21}
    started = time.monotonic()
    again = await collect(trigger, {21}, within=2, ack=False)
    assert again.keys() == {21}
    assert time.monotonic() - started >= 0.25
    await trigger.ack([21])
    await trigger.close()
    assert await depths(admin, trigger) == {}


@rabbitmq
async def test_a_dropped_connection_recovers(make_trigger, admin):
    trigger = make_trigger(url=f"{URL}?reconnect_interval=0.1")
    await trigger.armed([Armed(31, CLOCK.now())])
    got = await collect(trigger, {31}, within=2, ack=False)
    assert got.keys() == {31}
    connection = trigger._connection
    assert connection is not None and connection.transport is not None
    await connection.transport.connection.close(ConnectionError("dropped"))

    async def publishes() -> bool:  # publishing fails while reconnecting, then works again
        try:
            await trigger.armed([Armed(32, CLOCK.now())])
        except BackendUnavailable:
            return False
        return True

    assert await eventually(publishes, 3, 0.05)
    await trigger.ack([31])  # its channel is gone: no error, RabbitMQ gave it back
    again = await collect(trigger, {31, 32}, within=3)
    assert again.keys() == {31, 32}
    await trigger.close()
    assert await depths(admin, trigger) == {}


@rabbitmq
async def test_a_returned_message_is_a_failure(make_trigger, admin):
    trigger = make_trigger()
    await trigger._channel()
    await admin.queue_delete(trigger.level_queue(5_000))  # unroutable from now on
    with pytest.raises(BackendUnavailable):
        await trigger.armed([Armed(1, CLOCK.now() + timedelta(seconds=6))])


@rabbitmq
async def test_a_message_that_is_not_a_timer_is_dropped(make_trigger, admin):
    trigger = make_trigger()
    await trigger._channel()
    await admin.default_exchange.publish(
        aio_pika.Message(b"not json"), routing_key=trigger.due_queue
    )
    await trigger.armed([Armed(3, CLOCK.now())])
    assert (await collect(trigger, {3}, within=2)).keys() == {3}
    await trigger.close()
    assert await depths(admin, trigger) == {}


# --- the database stays the truth -------------------------------------------------------------


async def order_status(deps: Any, order_id: int) -> str:
    async with deps.db.read() as conn:
        row = (await conn.execute(select(orders.c.status).where(orders.c.id == order_id))).one()
    return str(row.status)


@rabbitmq
async def test_purged_queues_lose_nothing_in_the_database(world, make_trigger, admin):
    trigger = make_trigger(clock=world.clock)
    world.deps.trigger = trigger
    goods_id = await world.goods()
    order_id = await place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)
    assert world.deps.trigger_errors == 0
    # The reminder (5 min) and the pay deadline (30 min), each at its level.
    assert await depths(admin, trigger) == {
        trigger.level_queue(300_000): 1,
        trigger.level_queue(1_800_000): 1,
    }
    await purge(admin, trigger.queue_names)
    assert await depths(admin, trigger) == {}
    world.clock.advance(timedelta(minutes=30) + world.deps.scan_grace + timedelta(seconds=1))
    report = await scan_once(world.worker)
    assert report.claimed == 2
    assert await order_status(world.deps, order_id) == "cancelled_unpaid"


@pytest.fixture
def real_time_db(tmp_path: Path, migrated_template: Path) -> Path:
    path = tmp_path / "real.db"
    shutil.copyfile(migrated_template, path)
    return path


@rabbitmq
async def test_a_short_pay_deadline_fires_through_rabbitmq(real_time_db, prefix, queues, admin):
    settings = load_settings(
        database_url=f"sqlite:///{real_time_db}",
        pay_timeout="1s",
        trigger_url=f"{URL}?prefix={prefix}&queues={queues}",
    )
    async with bootstrap.running(settings, clock=SystemClock(), migrate_sqlite=False) as deps:
        trigger = deps.trigger
        assert isinstance(trigger, RabbitTrigger)
        assert trigger.queues == queues
        seller, _ = await accounts.add_user(deps, "seller")
        buyer, _ = await accounts.add_user(deps, "buyer")
        goods_id = await accounts.add_goods(deps, seller_id=seller.id, title="lamp", price="3.00")
        order_id = await place_order(deps, buyer_id=buyer.id, goods_id=goods_id)
        assert deps.trigger_errors == 0
        async with deps.db.read() as conn:
            (timer,) = await timers.for_order(conn, order_id)
        assert timer.kind == TimerKind.CANCEL_UNPAID.value

        worker = Worker(deps)
        deadline = time.monotonic() + 3
        ids: Sequence[int] = []
        while timer.id not in ids and time.monotonic() < deadline:
            ids = await trigger.wait(deps.clock, deps.clock.now() + deps.max_idle) or []
        assert timer.id in ids
        came = deps.clock.now()
        assert timer.due_at <= came < timer.due_at + timedelta(milliseconds=200)
        assert await worker.deliver(ids) == 1
        await trigger.ack(ids)
        assert await order_status(deps, order_id) == "cancelled_unpaid"
        # the cancel armed the notice it wrote, due at once: it comes through RabbitMQ too
        async with deps.db.read() as conn:
            [notice] = [
                t
                for t in await timers.for_order(conn, order_id)
                if t.kind == TimerKind.ORDER_CLOSED.value
            ]
        deadline = time.monotonic() + 3
        ids = []
        while notice.id not in ids and time.monotonic() < deadline:
            ids = await trigger.wait(deps.clock, deps.clock.now() + deps.max_idle) or []
        assert notice.id in ids
        assert await worker.deliver(ids) == 1
        await trigger.ack(ids)
    assert await depths(admin, trigger) == {}


# --- RabbitMQ unreachable ---------------------------------------------------------------------


async def test_an_unreachable_rabbitmq_fails_promptly_and_orders_still_commit(world):
    trigger = RabbitTrigger(url=UNREACHABLE, connect_timeout=1.0, clock=world.clock)
    world.deps.trigger = trigger
    try:
        started = time.monotonic()
        with pytest.raises(BackendUnavailable):
            await trigger.armed([Armed(1, world.clock.now())])
        assert time.monotonic() - started < 2
        with pytest.raises(BackendUnavailable):  # again at once, without a new attempt
            await trigger.feed([Armed(1, world.clock.now())])
        # wait never raises: it pauses briefly and hands over nothing.
        assert await trigger.wait(CLOCK, CLOCK.now() + timedelta(seconds=0.2)) == []
        goods_id = await world.goods()
        order_id = await place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)
        assert world.deps.trigger_errors == 1
        assert await order_status(world.deps, order_id) == "pending_payment"
    finally:
        await trigger.close()


async def test_nothing_to_publish_needs_no_connection():
    trigger = RabbitTrigger.from_url(UNREACHABLE)
    try:
        await trigger.armed([])
        await trigger.armed([Armed(1, CLOCK.now() + timedelta(days=1))])  # beyond the horizon
        await trigger.ack([1, 2])  # nothing handed over
    finally:
        await trigger.close()
