"""Pooled connections that the database dropped (a restart, an administrator's kill, MySQL's
wait_timeout): a connection that sat unused is pinged and replaced before a request uses it; one
used a moment ago is not pinged (no round trip under load), so the request that finds it dead
fails once, and every connection opened before it is replaced, never failing request after
request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import timedelta

import pytest
from sqlalchemy import literal_column, select, text
from sqlalchemy.exc import DBAPIError

from dueflow.domain.timers import TimerKind
from dueflow.exceptions import BackendUnavailable
from dueflow.service import orders as order_service
from dueflow.service.timeouts import HANDLERS
from dueflow.store import db as db_module
from dueflow.store import hot
from dueflow.store.db import MESSAGES, POOL_SIZE, Database
from dueflow.store.schema import orders
from dueflow.store.schema import timers as t_timers
from dueflow.worker import runner
from tests.conftest import SERVICE_URLS, World, eventually, require_service, world_at

BACKENDS = {
    "postgres": (5432, "SELECT pg_backend_pid()", "SELECT pg_terminate_backend({})"),
    "mysql": (3306, "SELECT connection_id()", "KILL CONNECTION {}"),
}
#: Connections each test holds at once, so the pool has more than the one a request takes.
HELD = 3


@pytest.fixture(
    params=[
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mysql", marks=pytest.mark.mysql),
    ]
)
def backend(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    require_service(name, "127.0.0.1", BACKENDS[name][0])
    return name


@pytest.fixture
async def db(backend: str) -> AsyncIterator[Database]:
    url = SERVICE_URLS[backend]
    assert url is not None
    database = Database.from_url(url)
    yield database
    await database.dispose()


async def held_ids(db: Database, backend: str) -> set[int]:
    """The server-side ids of HELD connections taken from the pool at once."""
    async with AsyncExitStack() as stack:
        ids = set()
        for _ in range(HELD):
            conn = await stack.enter_async_context(db.read())
            ids.add(int((await conn.execute(text(BACKENDS[backend][1]))).scalar_one()))
    return ids


async def drop(backend: str, ids: set[int]) -> None:
    """End those connections from another one, as a restart or an administrator would."""
    url = SERVICE_URLS[backend]
    assert url is not None
    other = Database.from_url(url)
    try:
        async with other.write() as conn:
            for ident in ids:
                await conn.execute(text(BACKENDS[backend][2].format(ident)))
    finally:
        await other.dispose()


def count_pings(db: Database, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """A list that grows by one at each ping of ``db``'s pool."""
    pings: list[object] = []
    dialect = db.engine.dialect
    real = dialect.do_ping

    def counted(dbapi_connection: object) -> bool:
        pings.append(dbapi_connection)
        return real(dbapi_connection)

    monkeypatch.setattr(dialect, "do_ping", counted)
    return pings


def test_the_pool_keeps_what_it_opens() -> None:
    pool = Database.from_url("postgresql://nobody@127.0.0.1/none").engine.pool
    assert pool.size() == POOL_SIZE  # type: ignore[attr-defined]
    assert pool._max_overflow == 0  # type: ignore[attr-defined]


async def test_connections_idle_past_the_limit_are_pinged_and_replaced(db, backend, monkeypatch):
    first = await held_ids(db, backend)
    await drop(backend, first)
    monkeypatch.setattr(db_module, "PING_AFTER_IDLE", 0.0)
    pings = count_pings(db, monkeypatch)

    second = await held_ids(db, backend)

    assert len(second) == HELD and not second & first
    # The first ping found its connection dead and every older one was replaced unpinged.
    assert len(pings) == 1


async def test_connections_used_a_moment_ago_are_not_pinged(db, backend, monkeypatch):
    first = await held_ids(db, backend)
    monkeypatch.setattr(db_module, "PING_AFTER_IDLE", 3600.0)
    pings = count_pings(db, monkeypatch)

    assert await held_ids(db, backend) == first
    assert pings == []


async def test_a_dropped_connection_used_a_moment_ago_fails_one_request_only(
    db, backend, monkeypatch
):
    first = await held_ids(db, backend)
    await drop(backend, first)
    monkeypatch.setattr(db_module, "PING_AFTER_IDLE", 3600.0)

    with pytest.raises(BackendUnavailable) as raised:
        async with db.read() as conn:
            await conn.execute(text("SELECT 1"))
    assert raised.value.message == MESSAGES[BackendUnavailable]

    # The pool was invalidated at that failure: the other dropped connections are replaced too.
    second = await held_ids(db, backend)
    assert len(second) == HELD and not second & first


async def test_a_ping_that_fails_otherwise_fails_the_checkout(db, backend, monkeypatch):
    await held_ids(db, backend)
    monkeypatch.setattr(db_module, "PING_AFTER_IDLE", 0.0)
    dialect = db.engine.dialect

    def broken(_dbapi_connection: object) -> bool:
        raise dialect.loaded_dbapi.Error("not a disconnect")

    monkeypatch.setattr(dialect, "do_ping", broken)
    monkeypatch.setattr(dialect, "is_disconnect", lambda *_args: False)

    with pytest.raises(BackendUnavailable):
        async with db.read() as conn:
            await conn.execute(text("SELECT 1"))


ONE = hot.Hot(select(literal_column("1").label("one")))


async def test_a_dropped_connection_a_hot_statement_finds_fails_one_request_only(
    db, backend, monkeypatch
):
    # A hot statement runs on the driver connection, past SQLAlchemy's own error handling: the
    # rollback that follows its failure is what invalidates the pool.
    first = await held_ids(db, backend)
    await drop(backend, first)
    monkeypatch.setattr(db_module, "PING_AFTER_IDLE", 3600.0)

    with pytest.raises(BackendUnavailable):
        async with db.read() as conn:
            await ONE.first(conn)

    second = await held_ids(db, backend)
    assert len(second) == HELD and not second & first
    async with db.read() as conn:
        assert (await ONE.first(conn)) == (1,)


async def test_an_error_on_a_live_connection_replaces_nothing(db, backend, monkeypatch):
    first = await held_ids(db, backend)
    monkeypatch.setattr(db_module, "PING_AFTER_IDLE", 3600.0)
    pings = count_pings(db, monkeypatch)

    with pytest.raises(BackendUnavailable):
        async with db.read() as conn:
            await conn.execute(text("SELECT no_such_column"))

    assert await held_ids(db, backend) == first
    assert pings == []


async def test_a_write_whose_connection_is_dropped_mid_transaction_is_unavailable(db, backend):
    """The server ends the connection in the middle of a write transaction (the chaos soak's
    pg_terminate_backend): the caller sees BackendUnavailable, which the worker retries within
    seconds, not the PendingRollbackError the connection raises afterwards."""
    with pytest.raises(BackendUnavailable):
        async with db.write() as conn:
            me = int((await conn.execute(text(BACKENDS[backend][1]))).scalar_one())
            await drop(backend, {me})
            await conn.execute(select(literal_column("1")))
    async with db.read() as conn:  # and the next one works
        assert (await conn.execute(select(literal_column("1")))).scalar_one() == 1


@pytest.mark.postgres
async def test_a_protocol_left_mid_operation_is_a_lost_connection():
    """About one connection in ten that PostgreSQL terminates mid-transaction fails with
    asyncpg's InternalClientError ("another operation is in progress") rather than "connection
    is closed" (the chaos soak's pg_terminate_backend). It is a lost connection all the same:
    replaced with every one opened before it, never handed to the next request. Terminations
    are repeated until one fails so (a few dozen are enough; 400 bound the test)."""
    require_service("postgres", "127.0.0.1", 5432)
    url = SERVICE_URLS["postgres"]
    assert url is not None
    db = Database.from_url(url)
    try:
        seen = 0
        for _ in range(400):
            with pytest.raises(BackendUnavailable) as raised:
                async with db.write() as conn:
                    me = int((await conn.execute(text(BACKENDS["postgres"][1]))).scalar_one())
                    await drop("postgres", {me})
                    await conn.execute(select(literal_column("1")))
            cause = raised.value.__cause__
            assert isinstance(cause, DBAPIError)
            if type(cause.orig).__name__ != "InternalClientError":
                continue
            seen += 1
            assert cause.connection_invalidated  # replaced, with every older one
            async with db.write() as conn:  # and the next request is served
                assert (await conn.execute(select(literal_column("1")))).scalar_one() == 1
            if seen == 3:
                break
        assert seen, "no termination failed with InternalClientError in 400 tries"
    finally:
        await db.dispose()


async def drop_every_other(backend: str) -> int:
    """End every other session of the test database at once (the chaos soak's
    pg_terminate_backend), waiting until they are gone; returns how many there were."""
    url = SERVICE_URLS[backend]
    assert url is not None
    other = Database.from_url(url)
    sessions = {
        "postgres": "SELECT pid FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()",
        "mysql": "SELECT id FROM information_schema.processlist"
        " WHERE db = DATABASE() AND id <> CONNECTION_ID()",
    }[backend]
    try:
        async with other.write() as conn:
            ids = {int(i) for i in (await conn.execute(text(sessions))).scalars()}
        await drop(backend, ids)

        async def gone() -> bool:
            async with other.read() as conn:
                left = {int(i) for i in (await conn.execute(text(sessions))).scalars()}
            return not left & ids

        assert await eventually(gone)
    finally:
        await other.dispose()
    return len(ids)


async def overdue_order(backend: str) -> AsyncIterator[tuple[World, int]]:
    """A world on ``backend`` and an order of it past its pay deadline (its reminder and its
    cancel due)."""
    url = SERVICE_URLS[backend]
    assert url is not None
    async for world in world_at(url):
        goods_id = await world.goods()
        placed = await order_service.place_order(
            world.deps, buyer_id=world.buyer, goods_id=goods_id
        )
        world.clock.advance(timedelta(minutes=30))
        yield world, placed


async def test_a_cancel_whose_connections_are_cut_is_done_under_its_first_claim(
    backend, monkeypatch, no_pauses
):
    """Every connection of the worker's pool is ended right as its cancel handler starts (used
    a moment before by the claim, so not pinged): the handler's first read fails, the worker
    runs it again in place on fresh connections, and the order is cancelled at the first
    attempt: no hand-back, no backoff (the chaos soak found unpaid cancels 19-22 s late)."""
    monkeypatch.setattr(db_module, "PING_AFTER_IDLE", 3600.0)
    cuts: list[int] = []

    async def cut_then_cancel(deps, batch):
        if not cuts:
            cuts.append(await drop_every_other(backend))
        await HANDLERS[TimerKind.CANCEL_UNPAID](deps, batch)

    async for world, placed in overdue_order(backend):
        worker = runner.Worker(
            world.deps, handlers={**HANDLERS, TimerKind.CANCEL_UNPAID: cut_then_cancel}
        )
        assert await worker.run_once() == 2  # the cancel and the reminder due with it
        assert cuts and cuts[0] >= 1
        assert worker.stats.reruns >= 1
        async with world.deps.db.read() as conn:
            status = (
                await conn.execute(select(orders.c.status).where(orders.c.id == placed))
            ).scalar_one()
            timer = (
                await conn.execute(
                    select(t_timers).where(
                        t_timers.c.order_id == placed,
                        t_timers.c.kind == TimerKind.CANCEL_UNPAID.value,
                    )
                )
            ).one()
        assert status == "cancelled_unpaid"
        assert (timer.state, timer.outcome, timer.attempts) == ("done", "cancelled", 1)


async def test_timers_delivered_as_the_connections_are_cut_are_claimed_all_the_same(
    backend, monkeypatch, no_pauses
):
    """A trigger hands the worker due ids just as every connection of its pool is ended: the
    claim's first try fails and is made again at once, rather than leaving the ids with the
    trigger until its lease (60 s) or the scanner's next pass."""
    monkeypatch.setattr(db_module, "PING_AFTER_IDLE", 3600.0)
    async for world, placed in overdue_order(backend):
        async with world.deps.db.read() as conn:
            due = list(
                (
                    await conn.execute(select(t_timers.c.id).where(t_timers.c.order_id == placed))
                ).scalars()
            )
        assert len(due) == 2  # the reminder and the cancel
        assert await drop_every_other(backend) >= 1
        assert await world.worker.deliver(due) == 2
        async with world.deps.db.read() as conn:
            states = set(
                (
                    await conn.execute(select(t_timers.c.state).where(t_timers.c.id.in_(due)))
                ).scalars()
            )
        assert states == {"done"}
