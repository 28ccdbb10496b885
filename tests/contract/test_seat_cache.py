"""The Redis seat cache and its reconciler against a real Redis (database 11, under a prefix of
this run's: its keys are deleted before each test, and deleting them stands in for FLUSHALL,
which would empty other runs' and suites' keys too).

The database decides every sale: these tests make the cache lie, vanish and go away, and check
that no seat is ever held twice, that the reconciler sets the cache right (counting what it
repaired) and that the pre-check refuses what the cache says is taken without a write.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis
from sqlalchemy import func, select

from dueflow import bootstrap, redis_url
from dueflow.config import load_settings
from dueflow.exceptions import ConfigError, SeatUnavailable
from dueflow.seatcache.base import NoSeatCache
from dueflow.seatcache.redis import LOADED, RedisSeatCache
from dueflow.service import orders, payments, tickets
from dueflow.store import shows
from dueflow.store.schema import seat_holds
from dueflow.store.shows import SeatMove
from dueflow.worker import reconciler
from tests import redis_cluster
from tests.conftest import World, eventually, require_service, world_on

SEAT_CACHE_SERVER = os.environ.get("DUEFLOW_TEST_SEAT_CACHE_URL", "redis://127.0.0.1:6379/11")
PREFIX = f"seats-{os.getpid()}"

redis_test = pytest.mark.redis


@pytest.fixture(params=["single", "cluster"])
def seat_server(request: pytest.FixtureRequest) -> str:
    """The Redis of the cache: the test database of one server, or the local Redis Cluster
    (skipped without either, failed in CI)."""
    if request.param == "cluster":
        cluster: redis_cluster.LocalCluster = request.getfixturevalue("local_cluster")
        return cluster.url
    where = urlsplit(SEAT_CACHE_SERVER)
    require_service("redis", where.hostname or "127.0.0.1", where.port or 6379)
    return SEAT_CACHE_SERVER


@pytest.fixture
async def r(seat_server: str) -> AsyncIterator[aioredis.Redis]:
    """A client on the cache's Redis, this run's keys flushed first."""
    client: aioredis.Redis = redis_url.connect(seat_server, decode_responses=True)  # type: ignore[assignment]
    await _lose_everything(client)
    try:
        yield client
    finally:
        await client.aclose()


async def _lose_everything(client: aioredis.Redis) -> None:
    """Every key of this run's cache gone, as in a FLUSHALL."""
    async for key in client.scan_iter(match=f"{PREFIX}:*"):
        await client.delete(key)  # one by one: a cluster refuses a DEL over several slots


async def _world(db_path: Path, seat_cache_url: str) -> AsyncIterator[World]:
    settings = load_settings(
        database_url=f"sqlite:///{db_path}", profile="prod", seat_cache_url=seat_cache_url
    )
    async for world in world_on(settings):
        yield world


@pytest.fixture
async def cached(db_path: Path, r: aioredis.Redis, seat_server: str) -> AsyncIterator[World]:
    """The ``world`` with the Redis seat cache bootstrap builds from DUEFLOW_SEAT_CACHE_URL."""
    async for world in _world(db_path, f"{seat_server}?prefix={PREFIX}"):
        yield world


@pytest.fixture
async def unreachable(db_path: Path) -> AsyncIterator[World]:
    """The ``world`` with its seat cache pointed at a port nobody listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async for world in _world(db_path, f"redis://127.0.0.1:{port}/11"):
        yield world


def _key(show_id: int) -> str:
    return f"{PREFIX}:seats:{show_id}"


async def _db_states(world: World, show_id: int) -> dict[str, str]:
    async with world.deps.db.read() as conn:
        return await shows.hold_states(conn, show_id)


async def _map_states(world: World, show_id: int) -> dict[str, str]:
    return {s["label"]: s["state"] for s in await tickets.seat_map(world.deps, show_id)}


def _repairs(world: World) -> float:
    value = world.deps.metrics.registry.get_sample_value("dueflow_seat_cache_repairs_total")
    return value or 0.0


def _count_writes(world: World, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every write transaction the database opens from now on adds one to the list."""
    opened: list[int] = []
    write = world.deps.db.write

    def counting() -> Any:
        opened.append(1)
        return write()

    monkeypatch.setattr(world.deps.db, "write", counting)
    return opened


# --- the scripts --------------------------------------------------------------------------


@redis_test
async def test_moves_go_only_from_the_expected_state(r: aioredis.Redis, seat_server: str) -> None:
    cache = RedisSeatCache.from_url(f"{seat_server}?prefix={PREFIX}")
    try:
        held = SeatMove(7, ("A-1", "A-2"), "free", "held")
        await cache.moved([held])  # not loaded: a hash of moves alone would lie about the rest
        assert await r.exists(_key(7)) == 0
        assert await cache.states(7) is None and await cache.taken(7, ["A-1"]) is None

        assert await cache.load(7, {}) == 0  # loading what was not there repairs nothing
        assert await cache.states(7) == {}
        assert 0 < await r.pttl(_key(7)) <= 86_400_000  # a day, renewed by every load
        await cache.moved([held])
        await cache.moved([held])  # a repeat changes nothing
        assert await cache.states(7) == {"A-1": "held", "A-2": "held"}

        await cache.moved([SeatMove(7, ("A-1",), "held", "sold")])
        await cache.moved([SeatMove(7, ("A-1",), "free", "held")])  # late: A-1 is sold
        await cache.moved([SeatMove(7, ("A-1",), "held", "free")])  # wrong: A-1 is not held
        assert await cache.states(7) == {"A-1": "sold", "A-2": "held"}

        # Out of order: the sale arrives before the hold it follows.
        await cache.moved([SeatMove(7, ("A-3",), "held", "sold")])
        assert "A-3" not in (await cache.states(7) or {})
        await cache.moved([SeatMove(7, ("A-3",), "free", "held")])
        assert await cache.taken(7, ["A-1", "A-3", "A-4"]) == {"A-1", "A-3"}

        await cache.moved([SeatMove(7, ("A-1",), "sold", "free"), SeatMove(7, ("A-2",), *_LET_GO)])
        await cache.moved([SeatMove(7, ("A-2",), *_LET_GO)])  # a repeated release
        assert await cache.states(7) == {"A-3": "held"}
        assert await r.hget(_key(7), LOADED) == "1"

        # A load makes the hash the database's and says how many seats differed.
        assert await cache.load(7, {"A-3": "sold", "B-1": "held"}) == 2
        assert await cache.states(7) == {"A-3": "sold", "B-1": "held"}
        assert await cache.load(7, {"A-3": "sold", "B-1": "held"}) == 0
        assert await cache.load(7, {}) == 2
        assert await cache.states(7) == {} and await cache.taken(7, ["A-3"]) == set()
        assert cache.errors == 0
    finally:
        await cache.close()


_LET_GO = ("held", "free")


async def test_settings_choose_the_cache_and_its_prefix() -> None:
    """No Redis is asked: clients are made on first use."""
    assert isinstance(bootstrap.build_seat_cache(load_settings()), NoSeatCache)
    on_trigger = bootstrap.build_seat_cache(
        load_settings(trigger_url="redis://127.0.0.1:6379/3?horizon=1h&prefix=shop")
    )
    assert isinstance(on_trigger, RedisSeatCache)
    assert on_trigger.url == "redis://127.0.0.1:6379/3" and on_trigger.key(9) == "shop:seats:9"
    on_locks = bootstrap.build_seat_cache(load_settings(locks_url="redis://127.0.0.1:6379/4"))
    assert isinstance(on_locks, RedisSeatCache) and on_locks.key(9) == "dueflow:seats:9"
    own = bootstrap.build_seat_cache(
        load_settings(locks_url="redis://h:1/4", seat_cache_url="redis://h:2/5")
    )
    assert isinstance(own, RedisSeatCache) and own.url == "redis://h:2/5"
    cluster = "redis+cluster://127.0.0.1:7000,127.0.0.1:7001/"
    on_cluster = bootstrap.build_seat_cache(load_settings(trigger_url=f"{cluster}?shards=4"))
    assert isinstance(on_cluster, RedisSeatCache) and on_cluster.url == cluster
    with pytest.raises(ConfigError, match="unknown option horizon"):
        bootstrap.build_seat_cache(load_settings(seat_cache_url="redis://h:2/5?horizon=1h"))
    assert load_settings().seat_reconcile_interval == timedelta(seconds=60)
    assert load_settings(seat_reconcile_interval="5s").seat_reconcile_interval.seconds == 5


# --- the sale, with the cache -------------------------------------------------------------


@redis_test
async def test_bootstrap_wires_the_cache_into_the_seat_holds(cached: World) -> None:
    cache = cached.deps.seat_cache
    assert isinstance(cache, RedisSeatCache)
    assert cached.deps.holds.of("seat").cache is cache  # type: ignore[attr-defined]
    show_id = await cached.show()
    assert await reconciler.reconcile_once(cached.deps) == 0  # loads the new show
    view = await cached.seats(show_id, ["A-1", "A-2"])
    assert await cache.states(show_id) == {"A-1": "held", "A-2": "held"}
    await payments.record_manual_payment(cached.deps, order_id=view["id"], amount="760.00")
    assert await cache.states(show_id) == {"A-1": "sold", "A-2": "sold"}
    assert await _map_states(cached, show_id) == {
        **{f"{s}-{n}": "free" for s in "AB" for n in range(1, 11)},
        "A-1": "sold",
        "A-2": "sold",
    }


@redis_test
async def test_flush_mid_sale_never_holds_a_seat_twice(cached: World, r: aioredis.Redis) -> None:
    deps = cached.deps
    show_id = await cached.show()
    await reconciler.reconcile_once(deps)
    first = await cached.seats(show_id, ["A-1", "A-2"])
    assert await deps.seat_cache.states(show_id) == {"A-1": "held", "A-2": "held"}

    await _lose_everything(r)  # Redis lost everything mid-sale
    assert await deps.seat_cache.taken(show_id, ["A-1"]) is None  # it cannot say: the DB decides
    with pytest.raises(SeatUnavailable, match="A-2"):
        await cached.seats(show_id, ["A-2", "A-3"], buyer=cached.other)
    second = await cached.seats(show_id, ["A-3"], buyer=cached.other)
    third = await cached.seats(show_id, ["B-1"], buyer=cached.other)
    await payments.record_manual_payment(deps, order_id=first["id"], amount="760.00")
    await orders.cancel_by_buyer(deps, order_id=second["id"], user_id=cached.other)
    assert await r.exists(_key(show_id)) == 0  # moves left the unloaded show alone

    truth = {"A-1": "sold", "A-2": "sold", "B-1": "held"}
    assert await _db_states(cached, show_id) == truth
    async with deps.db.read() as conn:
        per_seat = select(seat_holds.c.seat_id, func.count()).group_by(seat_holds.c.seat_id)
        assert all(n == 1 for _, n in (await conn.execute(per_seat)).all())
    assert await reconciler.reconcile_once(deps) == 0  # a load, not a repair: nothing lied
    assert await deps.seat_cache.states(show_id) == truth
    seat_map = await _map_states(cached, show_id)
    assert {label: state for label, state in seat_map.items() if state != "free"} == truth
    assert (await orders.order_view(deps, third["id"]))["status"] == "pending_payment"


@redis_test
async def test_the_seat_map_warms_a_flushed_cache(cached: World, r: aioredis.Redis) -> None:
    show_id = await cached.show()
    await cached.seats(show_id, ["B-3"])  # the show was never loaded: nothing cached
    assert await cached.deps.seat_cache.states(show_id) is None
    assert (await _map_states(cached, show_id))["B-3"] == "held"  # from the database ...
    assert await cached.deps.seat_cache.states(show_id) == {"B-3": "held"}  # ... and loaded
    with pytest.raises(SeatUnavailable, match="B-3"):
        await cached.seats(show_id, ["B-3"], buyer=cached.other)


@redis_test
async def test_a_lying_cache_is_repaired_and_never_sells_a_sold_seat(
    cached: World, r: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    deps = cached.deps
    show_id = await cached.show()
    await reconciler.reconcile_once(deps)
    sold = await cached.seats(show_id, ["A-1"])
    await payments.record_manual_payment(deps, order_id=sold["id"], amount="380.00")
    await r.hdel(_key(show_id), "A-1")  # a sold seat marked free
    await r.hset(_key(show_id), "B-1", "held")  # a free seat marked held
    writes = _count_writes(cached, monkeypatch)

    with pytest.raises(SeatUnavailable, match="B-1"):
        await cached.seats(show_id, ["B-1", "B-2"], buyer=cached.other)
    assert writes == []  # refused by the pre-check: no write transaction was opened
    with pytest.raises(SeatUnavailable, match="A-1"):
        await cached.seats(show_id, ["A-1"], buyer=cached.other)
    assert writes == [1]  # the cache said free: the database was asked, and refused
    assert await _db_states(cached, show_id) == {"A-1": "sold"}

    assert await reconciler.reconcile_once(deps) == 2
    assert _repairs(cached) == 2
    assert await deps.seat_cache.states(show_id) == {"A-1": "sold"}
    assert await reconciler.reconcile_once(deps) == 0 and _repairs(cached) == 2
    placed = await cached.seats(show_id, ["B-1"], buyer=cached.other)
    assert [line["label"] for line in placed["lines"]] == ["B-1"]
    async with deps.db.read() as conn:
        assert await shows.tickets_for(conn, placed["id"]) == []
        assert [t.label for t in await shows.tickets_for(conn, sold["id"])] == ["A-1"]


@redis_test
async def test_a_cancelled_show_ends_free_and_is_then_left_alone(
    cached: World, r: aioredis.Redis
) -> None:
    deps = cached.deps
    show_id = await cached.show()
    await reconciler.reconcile_once(deps)
    paid = await cached.seats(show_id, ["A-1", "A-2"])
    await payments.record_manual_payment(deps, order_id=paid["id"], amount="760.00")
    await cached.seats(show_id, ["B-1"], buyer=cached.other)
    await tickets.cancel_show(deps, show_id=show_id, user_id=cached.seller)
    settled: set[int] = set()
    await r.hset(_key(show_id), "B-9", "held")  # wrong while the cancel is under way
    assert await reconciler.reconcile_once(deps, settled=settled) == 1
    assert settled == set()  # seats are still held or sold in the database

    await cached.worker.drain()  # the show_cancel timers let every seat go
    assert await _db_states(cached, show_id) == {}
    assert await deps.seat_cache.states(show_id) == {}
    await r.hset(_key(show_id), "A-1", "sold")  # a lost release
    assert await reconciler.reconcile_once(deps, settled=settled) == 1
    assert settled == {show_id} and await deps.seat_cache.states(show_id) == {}
    await r.hset(_key(show_id), "A-1", "sold")
    assert await reconciler.reconcile_once(deps, settled=settled) == 0  # settled: skipped
    assert await reconciler.reconcile_once(deps) == 1  # a new process reconciles it once more


@redis_test
async def test_run_reconciler_repairs_every_interval(cached: World, r: aioredis.Redis) -> None:
    deps = cached.deps
    show_id = await cached.show()
    stop = asyncio.Event()
    task = asyncio.create_task(reconciler.run_reconciler(deps, stop))
    try:
        assert await eventually(lambda: cached.clock.sleepers == 1)
        assert await deps.seat_cache.states(show_id) == {}  # the first pass loaded the show
        await r.hset(_key(show_id), "A-5", "sold")
        cached.clock.advance(deps.seat_reconcile_interval)
        assert await eventually(lambda: _repairs(cached) == 1)
        assert await deps.seat_cache.states(show_id) == {}
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=5)


async def test_no_reconciler_without_a_cache(world: World) -> None:
    assert isinstance(world.deps.seat_cache, NoSeatCache)
    assert reconciler.start(world.deps, asyncio.Event()) == []
    assert await reconciler.reconcile_once(world.deps) == 0


# --- Redis away ---------------------------------------------------------------------------


async def test_without_redis_buyers_are_served_by_the_database(unreachable: World) -> None:
    deps = unreachable.deps
    cache = deps.seat_cache
    assert isinstance(cache, RedisSeatCache)
    show_id = await unreachable.show()
    assert await reconciler.reconcile_once(deps) == 0
    view = await unreachable.seats(show_id, ["A-1", "A-2"])
    with pytest.raises(SeatUnavailable, match="A-2"):
        await unreachable.seats(show_id, ["A-2"], buyer=unreachable.other)
    states = await _map_states(unreachable, show_id)
    assert states["A-1"] == states["A-2"] == "held" and states["A-3"] == "free"
    await payments.record_manual_payment(deps, order_id=view["id"], amount="760.00")
    assert (await _map_states(unreachable, show_id))["A-1"] == "sold"
    assert await _db_states(unreachable, show_id) == {"A-1": "sold", "A-2": "sold"}
    assert cache.errors > 0
    registry = deps.metrics.registry
    failed = sum(
        registry.get_sample_value("dueflow_seat_cache_errors_total", {"operation": op}) or 0
        for op in ("moved", "states", "taken", "load")
    )
    assert failed == cache.errors
