"""The lock port against a real Redis (127.0.0.1:6379, database 15, a fresh key prefix per test,
deleted afterwards). TTL expiry is forced with PEXPIREAT in the past, never slept for."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
import redis.asyncio as aioredis

from dueflow.exceptions import BackendUnavailable, Busy
from dueflow.locks import NoLocks, RedisLocks, held
from tests.contract.conftest import REDIS_URL

pytestmark = [pytest.mark.redis, pytest.mark.usefixtures("redis_available")]

TTL = timedelta(seconds=30)


@pytest.fixture
async def locks(prefix: str, r: aioredis.Redis) -> AsyncIterator[RedisLocks]:
    made = RedisLocks.from_url(REDIS_URL, prefix=prefix)
    try:
        yield made
    finally:
        await made.close()


async def expire_now(r: aioredis.Redis, key: str) -> None:
    """Let the TTL run out: an expiry in the past deletes the key at once."""
    assert await r.pexpireat(key, 1)


async def test_acquire_and_release(locks: RedisLocks, r: aioredis.Redis, prefix: str) -> None:
    token = await locks.acquire("goods:1", TTL)
    assert token is not None
    assert await r.get(f"{prefix}:goods:1") == token
    assert 0 < await r.pttl(f"{prefix}:goods:1") <= TTL.total_seconds() * 1000
    assert await locks.release("goods:1", token)
    assert await r.exists(f"{prefix}:goods:1") == 0
    assert not await locks.release("goods:1", token)  # already free

    again = await locks.acquire("goods:1", TTL)
    assert again is not None and again != token
    assert await locks.release("goods:1", again)


async def test_a_held_lock_is_busy_for_others(locks: RedisLocks, prefix: str) -> None:
    other = RedisLocks.from_url(REDIS_URL, prefix=prefix)  # another process
    try:
        token = await locks.acquire("order:7", TTL)
        assert token is not None
        assert await other.acquire("order:7", TTL) is None
        assert await locks.acquire("order:7", TTL) is None  # not re-entrant either
        assert await other.acquire("order:8", TTL) is not None  # other keys are independent
    finally:
        await other.close()


async def test_only_the_owner_releases(locks: RedisLocks, r: aioredis.Redis, prefix: str) -> None:
    token = await locks.acquire("order:7", TTL)
    assert token is not None
    assert not await locks.release("order:7", "not-the-owner")
    assert await r.get(f"{prefix}:order:7") == token
    assert await locks.release("order:7", token)


async def test_ttl_expiry_frees_the_lock_and_the_old_owner_cannot_free_the_new_one(
    locks: RedisLocks, r: aioredis.Redis, prefix: str
) -> None:
    old = await locks.acquire("order:7", TTL)
    assert old is not None
    await expire_now(r, f"{prefix}:order:7")  # the holder crashed; its TTL ran out
    new = await locks.acquire("order:7", TTL)
    assert new is not None and new != old
    assert not await locks.release("order:7", old)  # the slow old holder finally lets go
    assert await r.get(f"{prefix}:order:7") == new
    assert await locks.release("order:7", new)


async def test_held_raises_busy_and_releases_on_exit(
    locks: RedisLocks, r: aioredis.Redis, prefix: str
) -> None:
    async with held(locks, "goods:3", TTL) as token:
        assert await r.get(f"{prefix}:goods:3") == token
        with pytest.raises(Busy):
            async with held(locks, "goods:3", TTL):
                pytest.fail("entered a held lock")
    assert await r.exists(f"{prefix}:goods:3") == 0

    with pytest.raises(ValueError, match="boom"):
        async with held(locks, "goods:3", TTL):
            raise ValueError("boom")
    assert await r.exists(f"{prefix}:goods:3") == 0  # released on the way out of an error

    async with held(locks, "goods:3", TTL):
        await expire_now(r, f"{prefix}:goods:3")  # ran out mid-way: leaving is still fine
    assert await r.exists(f"{prefix}:goods:3") == 0


async def test_no_locks_always_acquires() -> None:
    locks = NoLocks()
    first = await locks.acquire("goods:1", TTL)
    second = await locks.acquire("goods:1", TTL)
    assert first is not None and second is not None
    async with held(locks, "goods:1", TTL), held(locks, "goods:1", TTL):
        pass
    assert await locks.release("goods:1", first)
    await locks.close()


async def test_redis_down_is_backend_unavailable() -> None:
    down = RedisLocks.from_url("redis://127.0.0.1:1/0")
    try:
        with pytest.raises(BackendUnavailable):
            await down.acquire("goods:1", TTL)
        with pytest.raises(BackendUnavailable):
            await down.release("goods:1", "token")
        with pytest.raises(BackendUnavailable):
            async with held(down, "goods:1", TTL):
                pytest.fail("entered a lock that was never taken")
    finally:
        await down.close()


async def test_services_take_the_goods_and_order_locks(world, locks, prefix):
    """With Redis locks wired in, a goods item locked by another process refuses a new order
    with Busy and changes nothing; a locked order refuses a payment the same way."""
    from sqlalchemy import func, select

    from dueflow.service import orders, payments
    from dueflow.store import schema

    world.deps.locks = locks
    goods_id = await world.goods()
    token = await locks.acquire(f"goods:{goods_id}", TTL)
    assert token is not None
    with pytest.raises(Busy):
        await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)
    async with world.deps.db.read() as conn:
        count = (await conn.execute(select(func.count()).select_from(schema.orders))).scalar_one()
    assert count == 0
    await locks.release(f"goods:{goods_id}", token)
    order_id = await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)

    held_order = await locks.acquire(f"order:{order_id}", TTL)
    assert held_order is not None
    with pytest.raises(Busy):
        await payments.record_manual_payment(world.deps, order_id=order_id, amount="12.50")
    await locks.release(f"order:{order_id}", held_order)
    async with world.deps.db.read() as conn:
        attempts = (await conn.execute(select(schema.payments))).all()
    assert attempts == []  # refused before anything was written
    await payments.record_manual_payment(world.deps, order_id=order_id, amount="12.50")
    assert (await orders.order_view(world.deps, order_id))["status"] == "pending_shipment"


def test_locks_follow_the_trigger_url(monkeypatch):
    from dueflow.bootstrap import build_locks
    from dueflow.config import load_settings

    assert isinstance(build_locks(load_settings()), NoLocks)
    redis_locks = build_locks(load_settings(trigger_url="redis://127.0.0.1:6379/15?horizon=30m"))
    assert isinstance(redis_locks, RedisLocks)
    separate = build_locks(load_settings(locks_url="redis://127.0.0.1:6379/14"))
    assert isinstance(separate, RedisLocks)
