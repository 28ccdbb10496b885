"""The lock port against a real Redis (127.0.0.1:6379, database 15, a fresh key prefix per test,
deleted afterwards). TTL expiry is forced with PEXPIREAT in the past, never slept for."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from sqlalchemy import select

from dueflow import bootstrap, redis_url
from dueflow.api.app import create_app as dueflow_app
from dueflow.clock import FakeClock
from dueflow.config import load_settings
from dueflow.exceptions import BackendUnavailable, Busy, InvalidTransition
from dueflow.locks.base import Bypasses, NoLocks, held
from dueflow.locks.redis import RedisLocks
from dueflow.payments.simulator import SimulatorConfig
from dueflow.payments.simulator.app import create_app as simulator_app
from dueflow.service import accounts, orders, payments
from dueflow.store.schema import timers as t_timers
from dueflow.worker.runner import Worker
from tests.conftest import START, eventually
from tests.contract.conftest import delete_matching
from tests.unit.payments.test_payment_flow import Forward, Market, wechat_notification

pytestmark = [pytest.mark.redis]

TTL = timedelta(seconds=30)


@pytest.fixture
async def locks(redis_base: str, prefix: str, r: aioredis.Redis) -> AsyncIterator[RedisLocks]:
    made = RedisLocks.from_url(redis_base, prefix=prefix, wait=timedelta(milliseconds=50))
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


async def test_a_held_lock_is_busy_for_others(
    redis_base: str, locks: RedisLocks, prefix: str
) -> None:
    other = RedisLocks.from_url(redis_base, prefix=prefix)  # another process
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


async def test_redis_down_is_backend_unavailable_and_held_goes_ahead_unlocked() -> None:
    """The port says the store is down; ``held`` runs the block without the lock (the
    database decides), counts it, and skips Redis for a moment instead of asking per call."""
    from prometheus_client import CollectorRegistry, Counter

    registry = CollectorRegistry()
    counter = Counter("bypassed", "test", registry=registry)
    down = RedisLocks.from_url("redis://127.0.0.1:1/0", bypasses=Bypasses(counter))
    try:
        with pytest.raises(BackendUnavailable):
            await down.acquire("goods:1", TTL)
        with pytest.raises(BackendUnavailable):
            await down.release("goods:1", "token")
        entered = []
        async with held(down, "goods:1", TTL) as token:
            entered.append(token)
        assert entered == [None]
        assert down.bypasses.count == 1
        assert registry.get_sample_value("bypassed_total") == 1
        with pytest.raises(BackendUnavailable, match="a moment ago"):
            await down.acquire("goods:1", TTL)
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
    assert separate.wait == timedelta(seconds=2)


def test_bootstrap_gives_the_locks_their_wait_and_the_bypass_counter():
    from dueflow.bootstrap import build_locks
    from dueflow.config import load_settings
    from dueflow.metrics.prometheus import Metrics

    metrics = Metrics()
    settings = load_settings(locks_url="redis://127.0.0.1:6379/14", lock_wait="300ms")
    locks = build_locks(settings, metrics=metrics)
    assert isinstance(locks, RedisLocks)
    assert locks.wait == timedelta(milliseconds=300)
    assert locks.bypasses.counter is metrics.lock_bypassed
    assert b"dueflow_lock_bypassed_total 0.0" in metrics.render()


# --- waiting for a lock, end to end (issue 9, item 5) ------------------------------------------


async def test_held_waits_briefly_for_a_lock_freed_meanwhile(
    redis_base: str, prefix: str, r: aioredis.Redis
):
    """A lock let go within the wait is taken, not answered with Busy."""
    other = RedisLocks.from_url(redis_base, prefix=prefix)
    locks = RedisLocks.from_url(redis_base, prefix=prefix, wait=timedelta(seconds=2))
    try:
        token = await other.acquire("order:7", TTL)
        assert token is not None

        async def let_go_soon() -> None:
            await asyncio.sleep(0.05)  # a holder doing its short database work
            assert await other.release("order:7", token)

        freeing = asyncio.create_task(let_go_soon())
        async with held(locks, "order:7", TTL) as mine:
            assert mine is not None and mine != token
        await freeing
    finally:
        await other.close()
        await locks.close()


async def test_held_is_busy_once_the_wait_is_over(
    redis_base: str, prefix: str, r: aioredis.Redis
) -> None:
    """The wait is bounded: a lock held throughout answers Busy after ``wait``, not later."""
    other = RedisLocks.from_url(redis_base, prefix=prefix)
    waiting = RedisLocks.from_url(redis_base, prefix=prefix, wait=timedelta(milliseconds=200))
    try:
        assert await other.acquire("order:7", TTL) is not None
        started = time.monotonic()
        with pytest.raises(Busy, match="order:7 is busy"):
            async with held(waiting, "order:7", TTL):
                pytest.fail("entered a held lock")
        assert 0.2 <= time.monotonic() - started < 1.0
    finally:
        await other.close()
        await waiting.close()


class Gate(httpx.AsyncBaseTransport):
    """The transport to the simulator, holding a request whose path ends with ``suffix`` until
    the test opens the gate (a provider call in progress while something else happens)."""

    def __init__(self, suffix: str) -> None:
        self.inner: httpx.AsyncBaseTransport | None = None
        self.suffix = suffix
        self.reached = asyncio.Event()
        self.opened = asyncio.Event()
        self.opened.set()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        assert self.inner is not None
        if request.url.path.endswith(self.suffix):
            self.reached.set()
            await self.opened.wait()
        return await self.inner.handle_async_request(request)


async def lock_keys_cleared(url: str) -> None:
    """Delete dueflow's lock keys in the test database or cluster (bootstrap uses the default
    prefix)."""
    client = redis_url.connect(url)
    try:
        await delete_matching(client, "dueflow:lock:")
    finally:
        await client.aclose()


@asynccontextmanager
async def locked_market(
    db_path: Path, locks_url: str, gate: Gate | None = None, **settings: object
) -> AsyncIterator[Market]:
    """The payment flow's market (dueflow and the simulator calling each other in one process),
    with the Redis locks bootstrap builds from ``locks_url``."""
    await lock_keys_cleared(locks_url)
    clock = FakeClock(START)
    forward = Forward()
    config = SimulatorConfig.generate(clock=clock, transport=forward)
    gate = gate or Gate("/never")
    gate.inner = httpx.ASGITransport(app=simulator_app(config))
    wired = load_settings(
        database_url=f"sqlite:///{db_path}",
        public_url="http://dueflow",
        locks_url=locks_url,
        **dataclasses.asdict(config.client_config("http://sim")),
        **settings,
    )
    async with (
        httpx.AsyncClient(transport=gate, base_url="http://sim") as http,
        bootstrap.running(wired, clock=clock, http=http, migrate_sqlite=False) as deps,
    ):
        assert isinstance(deps.locks, RedisLocks)
        app = dueflow_app(deps)
        forward.app = app
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://dueflow"
        ) as client:
            seller, _ = await accounts.add_user(deps, "seller")
            buyer, _ = await accounts.add_user(deps, "buyer")
            yield Market(deps, clock, http, client, config, seller.id, buyer.id)
    await lock_keys_cleared(locks_url)


@asynccontextmanager
async def locked_elsewhere(url: str, key: str) -> AsyncIterator[Callable[[], Awaitable[bool]]]:
    """``key`` held by another process (same prefix as dueflow's) for the block; yields its
    release, true while the key was still that process's."""
    other = RedisLocks.from_url(url)
    try:
        token = await other.acquire(key, TTL)
        assert token is not None
        yield lambda: other.release(key, token)
    finally:
        await other.close()


def wechat_paid(market: Market, pay_no: str, fen: int = 8800) -> tuple[bytes, dict[str, str]]:
    """A signed WeChat Pay TRANSACTION.SUCCESS notification for ``pay_no``, as WeChat sends it."""
    config = market.config
    transaction = {
        "appid": config.wechat_appid,
        "mchid": config.wechat_mchid,
        "out_trade_no": pay_no,
        "transaction_id": "4200000001",
        "trade_state": "SUCCESS",
        "amount": {"total": fen, "payer_total": fen, "currency": "CNY"},
    }
    return wechat_notification(market, "TRANSACTION.SUCCESS", transaction, event_id=f"EV-{pay_no}")


async def pay_count(market: Market, order_id: int) -> int:
    view = await orders.order_view(market.deps, order_id)
    return [e["event"] for e in view["timeline"]].count("pay")


async def test_three_copies_of_one_wechat_notification_at_once_all_succeed(
    redis_base: str, db_path: Path
):
    """Under Redis locks the copies that find the order locked wait for it, then find the
    payment applied: every copy is answered with success, the payment is applied once."""
    async with locked_market(db_path, redis_base) as market:
        order_id = await market.order()
        pay_no, _ = await payments.start_payment(
            market.deps, order_id=order_id, user_id=market.buyer, provider="wechatpay"
        )
        body, headers = wechat_paid(market, pay_no)
        answers = await asyncio.gather(
            *(market.app.post("/notify/wechatpay", content=body, headers=headers) for _ in range(3))
        )
        assert [a.status_code for a in answers] == [204, 204, 204], [a.text for a in answers]
        assert sorted(o for _, o, _ in await market.inbox()) == [
            "confirmed",
            "duplicate",
            "duplicate",
        ]
        assert await market.status(order_id) == "pending_shipment"
        assert await pay_count(market, order_id) == 1


async def test_a_notification_meeting_the_buyers_cancel_waits_and_succeeds(
    redis_base: str, db_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The buyer cancels a paid order while its notification arrives: the cancel holds the
    order's lock while it closes the trade at WeChat (which says it is paid), the notification
    waits for the lock, finds the payment applied and is answered with success."""
    gate = Gate("/close")
    async with locked_market(db_path, redis_base, gate) as market:
        order_id = await market.order()
        pay_no, _ = await payments.start_payment(
            market.deps, order_id=order_id, user_id=market.buyer, provider="wechatpay"
        )
        paid = await market.sim.post(
            "/control/pay", json={"provider": "wechatpay", "out_trade_no": pay_no}
        )
        assert paid.status_code == 200, paid.text
        busy_answers = 0
        acquire = market.deps.locks.acquire

        async def counting(key: str, ttl: timedelta) -> str | None:
            nonlocal busy_answers
            token = await acquire(key, ttl)
            busy_answers += token is None
            return token

        monkeypatch.setattr(market.deps.locks, "acquire", counting)
        gate.opened.clear()
        cancel = asyncio.create_task(
            orders.cancel_by_buyer(market.deps, order_id=order_id, user_id=market.buyer)
        )
        await asyncio.wait_for(gate.reached.wait(), 5)  # the cancel holds the lock, closing
        body, headers = wechat_paid(market, pay_no)
        notify = asyncio.create_task(
            market.app.post("/notify/wechatpay", content=body, headers=headers)
        )
        assert await eventually(lambda: busy_answers >= 1 or notify.done())
        gate.opened.set()
        with pytest.raises(InvalidTransition, match="paid meanwhile"):
            await cancel
        answer = await notify
        assert answer.status_code == 204, answer.text
        assert [o for _, o, _ in await market.inbox()] == ["duplicate"]
        assert await market.status(order_id) == "pending_shipment"
        assert await pay_count(market, order_id) == 1


async def test_a_notification_still_busy_after_the_wait_is_a_fail_the_provider_retries(
    redis_base: str, db_path: Path, prefix: str
):
    """When the order stays locked past the wait, WeChat hears its FAIL form with 409 (busy,
    not a crash) and nothing is applied; its retry is then applied."""
    async with locked_market(db_path, redis_base, lock_wait="100ms") as market:
        order_id = await market.order()
        pay_no, _ = await payments.start_payment(
            market.deps, order_id=order_id, user_id=market.buyer, provider="wechatpay"
        )
        async with locked_elsewhere(redis_base, f"order:{order_id}") as release:
            body, headers = wechat_paid(market, pay_no)
            answer = await market.app.post("/notify/wechatpay", content=body, headers=headers)
            assert answer.status_code == 409
            assert answer.json() == {
                "code": "FAIL",
                "message": f"order:{order_id} is busy; try again",
            }
            assert await market.status(order_id) == "pending_payment"
            assert await release()
        again = await market.app.post("/notify/wechatpay", content=body, headers=headers)
        assert again.status_code == 204
        assert [o for _, o, _ in await market.inbox()] == ["busy", "confirmed"]
        assert await pay_count(market, order_id) == 1


async def test_a_cancel_finding_its_trade_paid_goes_past_a_lock_left_by_a_dead_holder(
    redis_base: str,
    db_path: Path,
):
    """A process killed holding an order's lock (an API process mid-request) leaves it until its
    TTL. The cancel at the pay deadline finds the trade paid and, after the wait, confirms it
    without the lock rather than retrying until the TTL is out (the chaos soak: cancels 10-15 s
    late after an API process was killed; 2 + 4 + 8 s of retries would pass the limit). The
    database's guarded updates apply the payment once; the lock stays its holder's."""
    async with locked_market(db_path, redis_base, lock_wait="100ms") as market:
        order_id = await market.order()
        pay_no, _ = await payments.start_payment(
            market.deps, order_id=order_id, user_id=market.buyer, provider="wechatpay"
        )
        async with locked_elsewhere(redis_base, f"order:{order_id}") as release:  # a dead holder's
            paid = await market.sim.post(
                "/control/pay", json={"provider": "wechatpay", "out_trade_no": pay_no}
            )
            assert paid.status_code == 200, paid.text
            assert await market.status(order_id) == "pending_payment"  # its notice was busy
            market.clock.advance(timedelta(hours=1))  # past the pay deadline
            await Worker(market.deps).drain()
            assert await market.status(order_id) == "pending_shipment"
            assert await pay_count(market, order_id) == 1
            async with market.deps.db.read() as conn:
                cancel = (
                    await conn.execute(
                        select(t_timers).where(
                            t_timers.c.order_id == order_id, t_timers.c.kind == "cancel_unpaid"
                        )
                    )
                ).one()
            assert (cancel.state, cancel.attempts) == ("done", 1), cancel.last_error
            assert await release()  # still the dead holder's


async def test_held_goes_ahead_past_a_busy_key_only_when_asked(
    redis_base: str, prefix: str
) -> None:
    other = RedisLocks.from_url(redis_base, prefix=prefix)
    waiting = RedisLocks.from_url(redis_base, prefix=prefix, wait=timedelta(milliseconds=50))
    try:
        token = await other.acquire("order:8", TTL)
        assert token is not None
        with pytest.raises(Busy):
            async with held(waiting, "order:8", TTL):
                pytest.fail("entered a held lock")
        ran = False
        async with held(waiting, "order:8", TTL, busy_goes_ahead=True) as mine:
            ran = True
            assert mine is None
        assert ran
        assert await other.release("order:8", token)  # never taken from its holder
    finally:
        await other.close()
        await waiting.close()


async def test_the_plain_place_reads_the_token_before_it_takes_the_goods_lock(
    redis_base: str, db_path: Path
):
    """``POST /api/orders`` served off FastAPI's stack (api/hot_place.py) with Redis locks: a
    bad token is 401 while the goods' lock is held elsewhere (as the route answers; it never
    waits for or takes the lock), a good one waits for the lock and is busy, then placed once
    the lock is free."""
    async with locked_market(db_path, redis_base, lock_wait="50ms") as market:
        _, token = await accounts.add_user(market.deps, "hot-buyer")
        goods_id = await accounts.add_goods(
            market.deps, seller_id=market.seller, title="lamp", price="12.00"
        )

        async def place(bearer: str) -> httpx.Response:
            return await market.app.post(
                "/api/orders",
                content=b'{"goods_id": %d}' % goods_id,
                headers={"Authorization": f"Bearer {bearer}", "Content-Type": "application/json"},
            )

        async with locked_elsewhere(redis_base, f"goods:{goods_id}") as release:
            stranger = await place("not-a-token")
            assert stranger.status_code == 401, stranger.text
            assert stranger.json()["error"]["code"] == "unauthorized"
            busy = await place(token)
            assert busy.status_code == 409, busy.text
            assert busy.json()["error"]["code"] == "busy"
            assert await release()  # nobody else took or freed it meanwhile
        placed = await place(token)
        assert placed.status_code == 201, placed.text
        assert placed.json()["status"] == "pending_payment"
