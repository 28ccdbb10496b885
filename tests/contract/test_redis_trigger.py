"""The ``redis`` trigger against a real Redis (127.0.0.1:6379, database 15) and a real local
Redis Cluster (3 masters, 3 replicas: the trigger's default 8 shards), a fresh key prefix per
test, deleted afterwards.

Deadlines come from FakeClocks; the only real wait is the bounded sub-second one that shows
``wait`` blocks until the head is due.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot
from sqlalchemy import func, select

from dueflow import bootstrap
from dueflow.clock import FakeClock, SystemClock
from dueflow.domain.timers import TimerKind
from dueflow.exceptions import BackendUnavailable, ConfigError
from dueflow.service import orders as order_service
from dueflow.store import timers
from dueflow.store.schema import order_events
from dueflow.store.schema import orders as t_orders
from dueflow.store.timers import Armed
from dueflow.timers import registry
from dueflow.timers._redis_shards import CLUSTER_SHARDS
from dueflow.timers.redis import RedisTrigger, from_ms, to_ms
from dueflow.worker.runner import Worker, feed_between, run_feeder
from dueflow.worker.scanner import scan_once
from tests.conftest import START, eventually
from tests.contract.conftest import REDIS_URL, delete_matching, is_cluster

pytestmark = [pytest.mark.redis]

DOWN_URL = "redis://127.0.0.1:1/0"  # nothing listens there


@pytest.fixture
async def fake_clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
async def trigger(
    prefix: str, fake_clock: FakeClock, redis_base: str
) -> AsyncIterator[RedisTrigger]:
    t = RedisTrigger.from_url(f"{redis_base}?prefix={prefix}&batch=2&lease=60s", clock=fake_clock)
    try:
        yield t
    finally:
        await t.close()


def keys(r: aioredis.Redis, prefix: str, name: str) -> list[str]:
    """The key ``name`` of every shard: one on one server, the default count on a cluster."""
    if is_cluster(r):
        return [f"{{{prefix}:{k}}}:{name}" for k in range(CLUSTER_SHARDS)]
    return [f"{prefix}:{name}"]


async def due(r: aioredis.Redis, prefix: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for key in keys(r, prefix, "due"):
        found.update(await r.zrange(key, 0, -1, withscores=True))
    return found


async def processing(r: aioredis.Redis, prefix: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for key in keys(r, prefix, "processing"):
        found.update(await r.zrange(key, 0, -1, withscores=True))
    return found


async def wake_markers(r: aioredis.Redis, prefix: str) -> list[int]:
    """How many markers each shard's wake list holds."""
    return [await r.llen(key) for key in keys(r, prefix, "wake")]


# -- configuration -------------------------------------------------------------------------------


async def test_from_url_reads_options_and_the_registry_knows_redis(prefix: str) -> None:
    t = registry.from_url(f"{REDIS_URL}?horizon=30m&prefix={prefix}&lease=90s&batch=7")
    assert isinstance(t, RedisTrigger)
    assert (t.horizon, t.prefix, t.lease, t.batch) == (
        timedelta(minutes=30),
        prefix,
        timedelta(seconds=90),
        7,
    )
    assert t.url == REDIS_URL  # our options are not passed on to redis-py
    assert not t.polls_database
    defaults = RedisTrigger.from_url("redis://127.0.0.1:6379/0")
    assert (defaults.horizon, defaults.prefix, defaults.lease, defaults.batch) == (
        timedelta(hours=1),
        "dueflow",
        timedelta(seconds=60),
        1000,
    )
    for bad in ("horizon=3x", "lease=0s", "batch=none", "batch=0", "prefix="):
        with pytest.raises(ConfigError):
            RedisTrigger.from_url(f"redis://127.0.0.1:6379/0?{bad}")
    with pytest.raises(ConfigError):
        RedisTrigger.from_url("redis://127.0.0.1:port/0")
    await t.close()  # never connected: a no-op
    await defaults.close()


async def test_a_cluster_url_spreads_timers_over_hash_tagged_shards() -> None:
    """No node is asked: the client is made on first use."""
    url = "redis+cluster://127.0.0.1:7000,127.0.0.1:7001/?shards=4&prefix=p&socket_timeout=9"
    t = registry.from_url(url)
    assert isinstance(t, RedisTrigger) and t.cluster
    assert t.url == "redis+cluster://127.0.0.1:7000,127.0.0.1:7001/?socket_timeout=9"
    assert [s.due for s in t.shards] == [f"{{p:{k}}}:due" for k in range(4)]
    for shard in t.shards:  # every key one script touches shares the shard's slot
        named = (shard.due, shard.processing, shard.wake, shard.fed, shard.poke)
        assert len({key_slot(key.encode()) for key in named}) == 1
    assert t.shard_of(6) == t.shards[2] and t.per_shard == 250
    assert len(RedisTrigger.from_url("redis+cluster://127.0.0.1:7000/").shards) == 8
    assert (
        RedisTrigger.from_url("redis://127.0.0.1:6379/0?shards=2").shards[1].due
        == "{dueflow:1}:due"
    )
    for bad in ("shards=0", "shards=257", "shards=x"):
        with pytest.raises(ConfigError):
            RedisTrigger.from_url(f"redis+cluster://127.0.0.1:7000/?{bad}")
    for bad_url in (
        "redis+cluster://127.0.0.1:7000/3",
        "redis+cluster:///",
        "redis+cluster://h:x/",
    ):
        with pytest.raises(ConfigError):
            RedisTrigger.from_url(bad_url)
    await t.close()


def test_milliseconds_round_so_redis_never_calls_a_timer_due_early() -> None:
    when = START + timedelta(microseconds=500)
    assert to_ms(when) == to_ms(START)
    assert to_ms(when, up=True) == to_ms(START) + 1
    assert from_ms(to_ms(when, up=True)) >= when
    assert to_ms(START, up=True) == to_ms(START)


# -- arming --------------------------------------------------------------------------------------


async def test_armed_puts_only_timers_within_the_horizon(
    trigger: RedisTrigger, r: aioredis.Redis, prefix: str
) -> None:
    await trigger.armed(
        [
            Armed(1, START + timedelta(minutes=10)),
            Armed(2, START + timedelta(hours=2)),  # beyond the 1 h horizon
            Armed(3, START - timedelta(seconds=5)),  # already overdue
            Armed(4, START + timedelta(hours=1)),  # exactly at the horizon
        ]
    )
    assert await due(r, prefix) == {
        "1": to_ms(START + timedelta(minutes=10)),
        "3": to_ms(START - timedelta(seconds=5)),
        "4": to_ms(START + timedelta(hours=1)),
    }
    # a blocked worker looks again: one marker on each shard armed
    assert sum(await wake_markers(r, prefix)) == len({t % len(trigger.shards) for t in (1, 3, 4)})

    # Arming again moves the timer (a re-armed deadline) and keeps the wake list short.
    for _ in range(10):
        await trigger.armed([Armed(1, START + timedelta(minutes=20))])
    assert (await due(r, prefix))["1"] == to_ms(START + timedelta(minutes=20))
    assert max(await wake_markers(r, prefix)) <= 4

    # Nothing within the horizon: nothing written, no wake-up.
    for key in keys(r, prefix, "wake"):
        await r.delete(key)
    await trigger.armed([Armed(9, START + timedelta(days=3))])
    await trigger.armed([])
    assert "9" not in await due(r, prefix)
    assert sum(await wake_markers(r, prefix)) == 0


# -- claiming ------------------------------------------------------------------------------------


async def test_claim_hands_out_due_ids_once_in_batches_with_a_lease(
    trigger: RedisTrigger, fake_clock: FakeClock, r: aioredis.Redis, prefix: str
) -> None:
    now = fake_clock.now()
    await trigger.armed(
        [
            Armed(11, now - timedelta(seconds=3)),
            Armed(12, now - timedelta(seconds=2)),
            Armed(13, now),
            Armed(14, now + timedelta(minutes=5)),
        ]
    )
    lease_until = to_ms(now + timedelta(seconds=60))

    rounds = [await trigger.wait(fake_clock, now) for _ in range(3)]
    if len(trigger.shards) == 1:
        assert rounds == [[11, 12], [13], []]  # earliest first, batch=2
    else:  # at most ceil(batch / shards) from each shard, every shard at once
        assert sorted(i for ids in rounds for i in ids or []) == [11, 12, 13]
        assert all(len(ids or []) <= len(trigger.shards) for ids in rounds)
    assert await processing(r, prefix) == {str(i): lease_until for i in (11, 12, 13)}
    assert await trigger.wait(fake_clock, now) == []  # nothing due is handed out twice
    assert set(await due(r, prefix)) == {"14"}
    assert set(await processing(r, prefix)) == {"11", "12", "13"}

    await trigger.ack([11, 12, 13])
    assert await processing(r, prefix) == {}
    await trigger.ack([])

    fake_clock.advance(timedelta(minutes=5))
    assert await trigger.wait(fake_clock, fake_clock.now()) == [14]


async def test_expired_leases_come_back_and_acked_ones_do_not(
    trigger: RedisTrigger, fake_clock: FakeClock, r: aioredis.Redis, prefix: str
) -> None:
    now = fake_clock.now()
    await trigger.armed([Armed(21, now), Armed(22, now)])
    assert sorted(await trigger.wait(fake_clock, now) or []) == [21, 22]
    await trigger.ack([22])  # 21's worker "dies" without acknowledging

    fake_clock.advance(timedelta(seconds=59))
    assert await trigger.wait(fake_clock, fake_clock.now()) == []  # lease still running
    fake_clock.advance(timedelta(seconds=1))
    assert await trigger.wait(fake_clock, fake_clock.now()) == [21]  # back, leased anew
    assert await processing(r, prefix) == {"21": to_ms(fake_clock.now() + timedelta(seconds=60))}
    assert await due(r, prefix) == {}


async def test_concurrent_claims_never_hand_out_an_id_twice(
    prefix: str, fake_clock: FakeClock, r: aioredis.Redis, redis_base: str
) -> None:
    url = f"{redis_base}?prefix={prefix}&batch=3"
    triggers = [RedisTrigger.from_url(url, clock=fake_clock) for _ in range(4)]
    try:
        now = fake_clock.now()
        await triggers[0].armed([Armed(i, now - timedelta(seconds=i)) for i in range(1, 11)])
        got: list[int] = []
        for _ in range(3):
            rounds = await asyncio.gather(*(t.wait(fake_clock, now) for t in triggers))
            got += [i for ids in rounds for i in ids or []]
        assert sorted(got) == list(range(1, 11))  # each exactly once
    finally:
        for t in triggers:
            await t.close()


async def test_workers_owning_shards_claim_only_theirs_and_together_all(
    prefix: str, fake_clock: FakeClock, r: aioredis.Redis, redis_base: str
) -> None:
    url = f"{redis_base}?prefix={prefix}&shards=6&batch=24"
    triggers = [RedisTrigger.from_url(f"{url}&own={i}/3", clock=fake_clock) for i in range(3)]
    try:
        assert [[s.index for s in t.owned] for t in triggers] == [
            [0, 1, 3, 4],
            [1, 2, 4, 5],
            [0, 2, 3, 5],  # every shard claimed by two of the three workers
        ]
        now = fake_clock.now()
        await triggers[0].armed([Armed(i, now) for i in range(1, 25)])  # arming: every shard
        first = await triggers[0].wait(fake_clock, now)
        assert sorted(first or []) == [i for i in range(1, 25) if i % 6 in (0, 1, 3, 4)]
        rest = await asyncio.gather(*(t.wait(fake_clock, now) for t in triggers[1:]))
        got = sorted(i for ids in [first, *rest] for i in ids or [])
        assert got == list(range(1, 25))  # each exactly once
    finally:
        for t in triggers:
            await t.close()
    for bad in ("own=3/3", "own=1", "own=a/2"):
        with pytest.raises(ConfigError):
            RedisTrigger.from_url(f"{redis_base}?{bad}")


# -- waiting -------------------------------------------------------------------------------------


async def test_wait_blocks_until_the_head_is_due(
    prefix: str, r: aioredis.Redis, redis_base: str
) -> None:
    clock = SystemClock()
    t = RedisTrigger.from_url(f"{redis_base}?prefix={prefix}", clock=clock)
    try:
        await t.wait(clock, clock.now())  # connect and clear stale markers
        await t.armed([Armed(31, clock.now() + timedelta(seconds=0.3))])
        started = time.monotonic()
        # The arm's own wake marker is stale by the time this wait claims (it sees timer 31), so
        # the wait blocks until 31 is due, not until the marker or `until`.
        ids = await t.wait(clock, clock.now() + timedelta(seconds=5))
        elapsed = time.monotonic() - started
        assert ids == [31]
        assert 0.28 <= elapsed < 1.0, elapsed  # at the head's due time, long before `until`
    finally:
        await t.close()


async def test_wake_releases_a_pending_wait_promptly(
    prefix: str, r: aioredis.Redis, redis_base: str
) -> None:
    clock = SystemClock()
    t = RedisTrigger.from_url(f"{redis_base}?prefix={prefix}", clock=clock)
    try:
        blocked_before = await blocked_clients(r)
        task = asyncio.create_task(t.wait(clock, clock.now() + timedelta(seconds=30)))
        await eventually(lambda: blocked(r, blocked_before), 2)  # until it blocks in BLPOP
        assert not task.done()
        started = time.monotonic()
        t.wake()
        assert await asyncio.wait_for(task, timeout=2) == []
        assert time.monotonic() - started < 0.5

        # A wake before the wait starts makes the next wait return at once (shutdown between
        # two waits is not missed), and only that one.
        t.wake()
        assert await asyncio.wait_for(t.wait(clock, clock.now() + timedelta(seconds=30)), 2) == []
        # The wait was ended by the instance's own marker, which BLPOP consumed: nothing leaks,
        # and the client goes on working.
        assert await r.exists(t.poke_key) == 0
        for shard in t.shards:
            assert await r.exists(shard.poke) == 0
        await t.armed([Armed(41, clock.now())])
        assert await t.wait(clock, clock.now()) == [41]
    finally:
        await t.close()


async def test_arming_wakes_a_blocked_wait_for_a_sooner_timer(
    prefix: str, r: aioredis.Redis, redis_base: str
) -> None:
    clock = SystemClock()
    waiter = RedisTrigger.from_url(f"{redis_base}?prefix={prefix}", clock=clock)
    armer = RedisTrigger.from_url(f"{redis_base}?prefix={prefix}", clock=clock)  # another process
    try:
        blocked_before = await blocked_clients(r)
        task = asyncio.create_task(waiter.wait(clock, clock.now() + timedelta(seconds=30)))
        await eventually(lambda: blocked(r, blocked_before), 2)
        started = time.monotonic()
        await armer.armed([Armed(51, clock.now())])
        assert await asyncio.wait_for(task, timeout=2) == [51]
        assert time.monotonic() - started < 0.5
    finally:
        await waiter.close()
        await armer.close()


# -- Redis down ----------------------------------------------------------------------------------


async def test_redis_down_raises_backend_unavailable_and_wait_does_not_crash(
    fake_clock: FakeClock,
) -> None:
    t = RedisTrigger.from_url(DOWN_URL, clock=fake_clock)
    try:
        with pytest.raises(BackendUnavailable) as info:
            await t.armed([Armed(1, fake_clock.now())])
        assert isinstance(info.value.__cause__, redis.RedisError | OSError)
        with pytest.raises(BackendUnavailable):
            await t.feed([Armed(1, fake_clock.now())])
        with pytest.raises(BackendUnavailable):
            await t.ack([1])
        assert await t.wait(fake_clock, fake_clock.now()) == []
        assert t.errors == 1
    finally:
        await t.close()


# -- with the database ---------------------------------------------------------------------------


async def place(world) -> int:
    goods_id = await world.goods()
    return await order_service.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)


async def timer_ids(world, order_id: int) -> dict[TimerKind, int]:
    async with world.deps.db.read() as conn:
        return {TimerKind(t.kind): t.id for t in await timers.for_order(conn, order_id)}


async def status(world, order_id: int) -> str:
    async with world.deps.db.read() as conn:
        query = select(t_orders.c.status).where(t_orders.c.id == order_id)
        return str((await conn.execute(query)).scalar_one())


async def pay_deadline(world, order_id: int):
    async with world.deps.db.read() as conn:
        query = select(t_orders.c.pay_deadline).where(t_orders.c.id == order_id)
        return (await conn.execute(query)).scalar_one()


@pytest.fixture
async def redis_world(world, prefix: str, r: aioredis.Redis, redis_base: str):
    """The world fixture with the Redis trigger (closed by the world's own teardown too)."""
    world.deps.trigger = RedisTrigger.from_url(f"{redis_base}?prefix={prefix}", clock=world.clock)
    try:
        yield world
    finally:
        await world.deps.trigger.close()


async def test_full_path_place_wait_deliver_ack(
    redis_world, r: aioredis.Redis, prefix: str
) -> None:
    world = redis_world
    trigger = world.deps.trigger
    order_id = await place(world)
    cancel_id = (await timer_ids(world, order_id))[TimerKind.CANCEL_UNPAID]
    deadline = await pay_deadline(world, order_id)
    assert (await due(r, prefix))[str(cancel_id)] == to_ms(deadline, up=True)

    assert await trigger.wait(world.clock, world.clock.now()) == []  # not due yet
    world.clock.set(deadline + timedelta(seconds=1))
    ids = await trigger.wait(world.clock, world.clock.now())
    assert cancel_id in ids
    await world.worker.deliver(ids)
    await trigger.ack(ids)

    assert await status(world, order_id) == "cancelled_unpaid"
    assert await processing(r, prefix) == {}
    # the cancel armed the notice it wrote, due at once; it goes the same way
    notice_id = (await timer_ids(world, order_id))[TimerKind.ORDER_CLOSED]
    assert await due(r, prefix) == {str(notice_id): to_ms(world.clock.now(), up=True)}
    assert await trigger.wait(world.clock, world.clock.now()) == [notice_id]
    await world.worker.deliver([notice_id])
    await trigger.ack([notice_id])
    assert [(n.kind, n.reason) for n in world.notifier.sent] == [("order_closed", "pay_timeout")]
    assert await processing(r, prefix) == {}
    assert await due(r, prefix) == {}


async def test_losing_every_redis_key_loses_no_deadline(
    redis_world, r: aioredis.Redis, prefix: str
) -> None:
    world = redis_world
    order_id = await place(world)
    cancel_id = (await timer_ids(world, order_id))[TimerKind.CANCEL_UNPAID]
    assert str(cancel_id) in await due(r, prefix)

    await delete_matching(r, prefix)  # FLUSHALL, as far as this trigger can tell

    world.clock.set(
        await pay_deadline(world, order_id) + world.deps.scan_grace + timedelta(milliseconds=1)
    )
    assert await world.deps.trigger.wait(world.clock, world.clock.now()) == []
    report = await scan_once(world.worker)
    assert report.claimed >= 1
    assert await status(world, order_id) == "cancelled_unpaid"


async def test_lost_tells_once_that_the_keys_are_gone(
    trigger: RedisTrigger, r: aioredis.Redis, prefix: str, redis_base: str
) -> None:
    assert await trigger.lost()  # the first ask: nothing was fed yet
    assert not await trigger.lost()
    other = RedisTrigger.from_url(f"{redis_base}?prefix={prefix}")
    try:
        assert not await other.lost()  # another process sees the same marker
        await delete_matching(r, prefix)  # FLUSHALL, as far as this trigger can tell
        assert await other.lost()
        assert not await trigger.lost()  # told once, to whichever feeder asked first
    finally:
        await other.close()
    down = RedisTrigger.from_url(DOWN_URL)
    try:
        assert not await down.lost()  # cannot tell: no full feed on a guess
        assert down.errors == 1
    finally:
        await down.close()


async def test_a_flushed_redis_is_fed_again_at_the_next_feeder_pass(
    redis_world, r: aioredis.Redis, prefix: str
) -> None:
    """Without the marker the feeder's next pass hands over only timers that came within the
    horizon since the last one, and a cancel armed before the flush waits for the scanner."""
    world = redis_world
    order_id = await place(world)
    cancel_id = (await timer_ids(world, order_id))[TimerKind.CANCEL_UNPAID]
    stop = asyncio.Event()
    feeder = asyncio.create_task(run_feeder(world.worker, stop))
    try:
        await eventually(lambda: world.clock.sleepers == 1)  # the first pass (a full one) ran
        await delete_matching(r, prefix)
        assert str(cancel_id) not in await due(r, prefix)

        world.clock.advance(world.deps.scan_interval)
        assert await eventually(lambda: _has(r, prefix, cancel_id))
        deadline = await pay_deadline(world, order_id)
        assert (await due(r, prefix))[str(cancel_id)] == to_ms(deadline, up=True)
    finally:
        stop.set()
        await asyncio.wait_for(feeder, timeout=5)


async def _has(r: aioredis.Redis, prefix: str, timer_id: int) -> bool:
    return str(timer_id) in await due(r, prefix)


async def test_feeder_hands_over_a_timer_once_it_comes_within_the_horizon(
    world, prefix: str, r: aioredis.Redis, redis_base: str
) -> None:
    world.deps.trigger = RedisTrigger.from_url(
        f"{redis_base}?prefix={prefix}&horizon=5m", clock=world.clock
    )
    try:
        order_id = await place(world)
        cancel_id = (await timer_ids(world, order_id))[TimerKind.CANCEL_UNPAID]
        deadline = await pay_deadline(world, order_id)
        assert deadline > world.clock.now() + timedelta(minutes=5)  # beyond the horizon
        assert str(cancel_id) not in await due(r, prefix)

        horizon = world.deps.trigger.horizon
        await feed_between(world.worker, None, world.clock.now() + horizon)
        assert str(cancel_id) not in await due(r, prefix)  # still beyond it

        world.clock.set(deadline - timedelta(minutes=4))
        fed = await feed_between(world.worker, None, world.clock.now() + horizon)
        assert fed >= 1
        assert (await due(r, prefix))[str(cancel_id)] == to_ms(deadline, up=True)
    finally:
        await world.deps.trigger.close()


async def test_worker_loop_runs_timers_through_redis(
    redis_world, r: aioredis.Redis, prefix: str
) -> None:
    world = redis_world
    order_id = await place(world)
    stop = asyncio.Event()
    task = asyncio.create_task(world.worker.run(stop))
    try:
        world.clock.set(await pay_deadline(world, order_id) + timedelta(seconds=1))
        await eventually(lambda: is_status(world, order_id, "cancelled_unpaid"), 3)
        assert await status(world, order_id) == "cancelled_unpaid"
    finally:
        stop.set()
        world.deps.trigger.wake()
        await asyncio.wait_for(task, timeout=2)
    assert await processing(r, prefix) == {}


async def test_one_timer_delivered_to_two_workers_has_one_effect(
    redis_world, settings, r: aioredis.Redis, prefix: str, redis_base: str
) -> None:
    world = redis_world
    order_id = await place(world)
    cancel_id = (await timer_ids(world, order_id))[TimerKind.CANCEL_UNPAID]
    world.clock.set(await pay_deadline(world, order_id) + timedelta(seconds=1))

    # A second worker process: its own engine, its own trigger on the same keys.
    async with bootstrap.running(settings, clock=world.clock, migrate_sqlite=False) as other:
        other.trigger = RedisTrigger.from_url(f"{redis_base}?prefix={prefix}", clock=world.clock)
        try:
            now = world.clock.now()
            got = await asyncio.gather(
                world.deps.trigger.wait(world.clock, now), other.trigger.wait(world.clock, now)
            )
            assert sorted(i for ids in got for i in ids or []).count(cancel_id) == 1

            # A lease ran out and the timer was handed out again: both deliver it at once.
            workers = [world.worker, Worker(other)]
            claimed = await asyncio.gather(*(w.deliver([cancel_id]) for w in workers))
            assert sorted(claimed) == [0, 1]
        finally:
            await other.trigger.close()

    assert await status(world, order_id) == "cancelled_unpaid"
    async with world.deps.db.read() as conn:
        query = select(func.count()).where(
            order_events.c.order_id == order_id, order_events.c.to_status == "cancelled_unpaid"
        )
        assert (await conn.execute(query)).scalar_one() == 1


async def test_place_order_commits_when_redis_is_down(world) -> None:
    world.deps.trigger = RedisTrigger.from_url(DOWN_URL, clock=world.clock)
    try:
        with pytest.raises(BackendUnavailable):
            await world.deps.trigger.armed([Armed(1, world.clock.now())])
        order_id = await place(world)  # Deps.arm swallows the trigger's failure
        assert world.deps.trigger_errors == 1
        assert await status(world, order_id) == "pending_payment"
        assert TimerKind.CANCEL_UNPAID in await timer_ids(world, order_id)
    finally:
        await world.deps.trigger.close()


async def blocked_clients(r: aioredis.Redis) -> int:
    """Clients blocked (in BLPOP) on the server, or on every master of the cluster."""
    if is_cluster(r):
        by_node = await r.info("clients", target_nodes=RedisCluster.PRIMARIES)  # type: ignore[call-arg]
        return sum(int(info["blocked_clients"]) for info in by_node.values())
    return int((await r.info("clients"))["blocked_clients"])


async def blocked(r: aioredis.Redis, before: int) -> bool:
    """More clients are blocked (in BLPOP) than ``before``."""
    return await blocked_clients(r) > before


async def is_status(world, order_id: int, wanted: str) -> bool:
    return await status(world, order_id) == wanted
