"""Hot statements (store/hot.py) answer exactly as Core does on every backend: the same rows and
types, the same guarded-update verdict, the same transaction, the same translated errors."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, bindparam, insert, select, update

from dueflow.exceptions import Busy, Conflict, UnstorableValue
from dueflow.store import hot, sqlite_inline
from dueflow.store.db import MESSAGES, Database
from dueflow.store.schema import goods, orders, timers, users
from tests.conftest import World, table_snapshot

GOODS_BY_ID = hot.Hot(select(goods).where(goods.c.id == bindparam("goods_id")))
LOCK_GOODS = hot.Hot(
    select(goods.c.id).where(goods.c.id == bindparam("goods_id")).with_for_update(nowait=True)
)
HOLD = hot.Hot(
    update(goods)
    .where(
        goods.c.id == bindparam("goods_id"),
        goods.c.status == "on_sale",
        goods.c.reserved_order_id.is_(None),
    )
    .values(reserved_order_id=bindparam("order_id"), updated_at=bindparam("now"))
)
NEW_ORDER = hot.Hot(
    insert(orders)
    .values(
        flow="marketplace",
        order_type="normal",
        buyer_id=bindparam("buyer_id"),
        seller_id=bindparam("seller_id"),
        goods_id=bindparam("goods_id"),
        amount=bindparam("amount"),
        status="pending_payment",
        created_at=bindparam("now"),
        pay_deadline=bindparam("deadline"),
        updated_at=bindparam("now"),
    )
    .returning(orders.c.id, orders.c.amount, orders.c.created_at)
)
#: is_admin comes from its column default (False), bound at compile time.
NEW_USER = hot.Hot(
    insert(users).values(
        name=bindparam("name"), token_hash=bindparam("token_hash"), created_at=bindparam("now")
    )
)
NEW_GOODS = hot.Hot(
    insert(goods).values(
        seller_id=bindparam("seller_id"),
        title=bindparam("title"),
        price=bindparam("price"),
        status="on_sale",
        created_at=bindparam("now"),
        updated_at=bindparam("now"),
    )
)


def db_of(world: World) -> Database:
    return world.deps.db


def order_params(world: World, goods_id: int) -> dict[str, Any]:
    now = world.clock.now()
    return {
        "buyer_id": world.buyer,
        "seller_id": world.seller,
        "goods_id": goods_id,
        "amount": Decimal("12.50"),
        "now": now,
        "deadline": now + timedelta(minutes=15),
    }


async def test_a_hot_select_answers_what_core_answers(backend_world: World) -> None:
    goods_id = await backend_world.goods(price="7.05")
    async with db_of(backend_world).read() as conn:
        row = await GOODS_BY_ID.first(conn, goods_id=goods_id)
        core = (await conn.execute(select(goods).where(goods.c.id == goods_id))).one()
        missing = await GOODS_BY_ID.first(conn, goods_id=goods_id + 1000)
    assert row is not None and missing is None
    assert tuple(row) == tuple(core)
    assert [type(v) for v in row] == [type(v) for v in core]
    assert row._mapping == dict(core._mapping)
    assert row.price == Decimal("7.05") and row.created_at == backend_world.clock.now()
    assert row.created_at.tzinfo is not None


async def test_a_guarded_hot_update_holds_once(backend_world: World) -> None:
    goods_id = await backend_world.goods()
    now = backend_world.clock.now()
    async with db_of(backend_world).write() as conn:
        order_id = await NEW_ORDER.scalar(conn, **order_params(backend_world, goods_id))
        first = await HOLD.rowcount(conn, goods_id=goods_id, order_id=order_id, now=now)
        second = await HOLD.rowcount(conn, goods_id=goods_id, order_id=order_id, now=now)
    assert (first, second) == (1, 0)
    async with db_of(backend_world).read() as conn:
        held = (await conn.execute(select(goods).where(goods.c.id == goods_id))).one()
    assert held.reserved_order_id == order_id


async def test_a_hot_insert_returns_typed_values(backend_world: World) -> None:
    goods_id = await backend_world.goods()
    async with db_of(backend_world).write() as conn:
        row = await NEW_ORDER.first(conn, **order_params(backend_world, goods_id))
        user_count = await NEW_USER.rowcount(
            conn, name="carol", token_hash="c" * 64, now=backend_world.clock.now()
        )
    assert row is not None and user_count == 1
    async with db_of(backend_world).read() as conn:
        stored = (
            await conn.execute(
                select(orders.c.id, orders.c.amount, orders.c.created_at).where(
                    orders.c.id == row.id
                )
            )
        ).one()
        carol = (await conn.execute(select(users).where(users.c.name == "carol"))).one()
    assert tuple(row) == tuple(stored)
    assert [type(v) for v in row] == [type(v) for v in stored]
    assert type(row.id) is int and row.amount == Decimal("12.50")
    assert carol.is_admin is False


async def test_a_hot_multi_row_insert_writes_what_core_reads(backend_world: World) -> None:
    """Two timers in one hot INSERT ... RETURNING (placing's shape): ids back, and the stored
    rows as written, though one datetime object is bound to several columns and the next
    statement binds another (the remembered datetime bind must not answer the old one)."""
    goods_id = await backend_world.goods()
    now = backend_world.clock.now()
    soon, later = now + timedelta(minutes=5), now + timedelta(minutes=15)
    rows = [
        {
            "order_id": 0,
            "kind": kind,
            "deadline_at": due,
            "due_at": due,
            "state": "scheduled",
            "attempts": 0,
            "failures": 0,
            "stuck": False,
            "created_at": now,
        }
        for kind, due in (("cancel_unpaid", later), ("pay_reminder", soon))
    ]
    columns = tuple(rows[0])
    statement = hot.inserting(timers, columns, 2, (timers.c.id, timers.c.kind))
    async with db_of(backend_world).write() as conn:
        order_id = await NEW_ORDER.scalar(conn, **order_params(backend_world, goods_id))
        for row in rows:
            row["order_id"] = order_id
        written = await statement.all(conn, rows)
        with pytest.raises(TypeError):
            await statement.all(conn, rows[:1])
    assert sorted(kind for _, kind in written) == ["cancel_unpaid", "pay_reminder"]
    assert all(type(timer_id) is int for timer_id, _ in written)
    assert hot.inserting(timers, columns, 2, (timers.c.id, timers.c.kind)) is statement
    async with db_of(backend_world).read() as conn:
        stored = {
            r.kind: r
            for r in (await conn.execute(select(timers).where(timers.c.order_id == order_id))).all()
        }
    assert {kind: r.id for kind, r in stored.items()} == {kind: i for i, kind in written}
    for row in rows:
        got = stored[row["kind"]]
        assert {name: getattr(got, name) for name in columns} == row


async def test_a_transaction_that_rolls_back_keeps_nothing_hot(backend_world: World) -> None:
    goods_id = await backend_world.goods()
    before = await table_snapshot(backend_world.deps)
    with pytest.raises(RuntimeError, match="changed my mind"):
        async with db_of(backend_world).write() as conn:
            # The first statement of the transaction is hot: it must not run outside it.
            order_id = await NEW_ORDER.scalar(conn, **order_params(backend_world, goods_id))
            now = backend_world.clock.now()
            assert await HOLD.rowcount(conn, goods_id=goods_id, order_id=order_id, now=now) == 1
            raise RuntimeError("changed my mind")
    assert await table_snapshot(backend_world.deps) == before


async def test_a_constraint_violation_is_a_conflict(backend_world: World, caplog) -> None:
    before = await table_snapshot(backend_world.deps)
    with pytest.raises(Conflict) as info:
        async with db_of(backend_world).write() as conn:
            now = backend_world.clock.now()
            await NEW_USER.rowcount(conn, name="dora", token_hash="d" * 64, now=now)
            await NEW_USER.rowcount(conn, name="dora", token_hash="e" * 64, now=now)
    assert info.value.message == MESSAGES[Conflict]
    assert "dora" not in info.value.message and "unique" not in info.value.message.lower()
    assert await table_snapshot(backend_world.deps) == before


@pytest.mark.postgres
@pytest.mark.parametrize("backend_url", ["postgres"], indirect=True)
async def test_a_value_postgresql_refuses_is_unstorable(backend_world: World) -> None:
    with pytest.raises(UnstorableValue) as info:
        async with db_of(backend_world).write() as conn:
            await NEW_GOODS.rowcount(
                conn,
                seller_id=backend_world.seller,
                title="a\x00b",
                price=Decimal("1.00"),
                now=backend_world.clock.now(),
            )
    assert info.value.message == MESSAGES[UnstorableValue]


async def test_a_lock_held_elsewhere_is_busy(
    backend_world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    goods_id = await backend_world.goods()
    db = db_of(backend_world)
    if db.dialect == "sqlite":
        await _busy_on_sqlite(backend_world, goods_id, monkeypatch)
        return
    async with db.write() as holder:
        assert await LOCK_GOODS.first(holder, goods_id=goods_id) is not None
        with pytest.raises(Busy) as info:
            async with db.write() as conn:
                await LOCK_GOODS.first(conn, goods_id=goods_id)
    assert info.value.message == MESSAGES[Busy]


async def _busy_on_sqlite(world: World, goods_id: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process's writer holds SQLite's write lock; a hot write in a read transaction
    waits for no budget at all and is refused as Busy."""
    monkeypatch.setattr(sqlite_inline, "BUSY_BUDGET", 0.0)
    path = db_of(world).engine.url.database
    assert path is not None
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(Busy):
            async with db_of(world).read() as conn:
                await HOLD.rowcount(conn, goods_id=goods_id, order_id=1, now=world.clock.now())
    finally:
        other.execute("ROLLBACK")
        other.close()


async def test_a_hot_statement_is_used_as_declared(world: World) -> None:
    async with world.deps.db.read() as conn:
        with pytest.raises(TypeError, match="goods_id"):
            await GOODS_BY_ID.first(conn, id=1)
        with pytest.raises(TypeError, match="rowcount"):
            await HOLD.all(conn, goods_id=1, order_id=1, now=world.clock.now())
        in_list = hot.Hot(select(goods).where(goods.c.id.in_([1, 2])))
        with pytest.raises(ValueError, match="IN lists"):
            await in_list.all(conn)
        table = Table(
            "counted", MetaData(), Column("n", Integer, default=lambda: 1), Column("m", Integer)
        )
        with pytest.raises(ValueError, match="scalar defaults"):
            await hot.Hot(insert(table).values(m=bindparam("m"))).rowcount(conn, m=1)
