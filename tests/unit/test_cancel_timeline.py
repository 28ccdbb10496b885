"""A batch's timeline goes in one statement (store/events.record) on SQLite, PostgreSQL and
MariaDB: a cancelled order's move and its ``released`` event, in that order, by id and by seq;
texts cut to their columns and sent whole otherwise; the sequencer numbers in id order across
the gaps a rolled-back write leaves."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import delete, select

from dueflow.domain.timers import TimerKind
from dueflow.service import events as event_service
from dueflow.service import orders as order_service
from dueflow.service import timeouts
from dueflow.store import events, timers
from dueflow.store import orders as order_store
from dueflow.store.schema import order_events
from tests.conftest import World
from tests.unit.test_herd_batches import counting


@pytest.fixture
def world(backend_world: World) -> World:
    return backend_world


async def an_order(world: World) -> int:
    goods_id = await world.goods()
    return await order_service.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)


async def test_a_cancel_batch_writes_each_move_then_each_release_in_one_insert(world):
    order_ids, goods_of = [], {}
    for _ in range(5):
        goods_id = await world.goods()
        order_id = await order_service.place_order(
            world.deps, buyer_id=world.buyer, goods_id=goods_id
        )
        order_ids.append(order_id)
        goods_of[order_id] = goods_id
    world.clock.advance(timedelta(hours=1))
    async with world.deps.db.write() as conn:
        claimed = await timers.claim_due(
            conn, now=world.clock.now(), limit=100, lease=world.deps.lease
        )
    batch = [t for t in claimed if t.kind is TimerKind.CANCEL_UNPAID]
    assert len(batch) == 5
    with counting(world) as sent:
        await timeouts.cancel_unpaid(world.deps, batch)
    inserts = [s for s in sent if s.lstrip().upper().startswith("INSERT INTO ORDER_EVENTS")]
    assert len(inserts) == 1
    await event_service.sequence(world.deps)

    async with world.deps.db.read() as conn:
        rows = (
            await conn.execute(
                select(order_events)
                .where(order_events.c.order_id.in_(order_ids))
                .order_by(order_events.c.id)
            )
        ).all()
    cancels = [r for r in rows if r.event != "place"]
    assert [r.event for r in cancels] == ["pay_timeout"] * 5 + ["released"] * 5
    for r in cancels[:5]:
        assert (r.from_status, r.to_status, r.actor) == (
            "pending_payment",
            "cancelled_unpaid",
            "timer",
        )
        assert r.detail is None
    assert [r.order_id for r in cancels[5:]] == sorted(order_ids)
    for r in cancels[5:]:
        assert r.detail == f"goods {goods_of[r.order_id]} back on sale"
        assert (r.from_status, r.to_status) == (None, None)
    assert [r.seq for r in rows] == sorted(r.seq for r in rows)  # seq follows the ids
    for order_id in order_ids:
        async with world.deps.db.read() as conn:
            timeline = await order_store.timeline(conn, order_id)
        assert [r.event for r in timeline] == ["place", "pay_timeout", "released"]


async def test_entries_keep_their_order_and_texts_are_cut_or_kept_whole(world):
    order_id = await an_order(world)
    tricky = "quote \" backslash \\ newline \n unicode 订单 ✓ and 'apostrophe'"
    entries = [
        events.Entry(order_id, "e" * 40, "pending_payment", "cancelled_unpaid", None),
        events.Entry(order_id, "second", detail="x" * 600),
        events.Entry(order_id, "third", detail=tricky),
        events.Entry(order_id, "second", detail=""),
    ]
    async with world.deps.db.write() as conn:
        await events.record(conn, entries, actor="a" * 80, now=world.clock.now())
        await events.record(conn, [], actor="nobody", now=world.clock.now())
    async with world.deps.db.read() as conn:
        rows = (await order_store.timeline(conn, order_id))[-4:]
    assert [r.event for r in rows] == ["e" * 32, "second", "third", "second"]
    assert [r.id for r in rows] == sorted(r.id for r in rows)
    assert (rows[0].from_status, rows[0].to_status, rows[0].detail) == (
        "pending_payment",
        "cancelled_unpaid",
        None,
    )
    assert rows[1].detail == "x" * 500
    assert rows[2].detail == tricky
    assert rows[3].detail == ""
    assert {r.actor for r in rows} == {"a" * 64}
    assert {r.at for r in rows} == {world.clock.now()}


async def test_the_sequencer_numbers_in_id_order_across_gaps(world):
    order_id = await an_order(world)
    async with world.deps.db.write() as conn:
        await events.record_each(
            conn,
            [(order_id, str(n)) for n in range(12)],
            event="x",
            actor="test",
            now=world.clock.now(),
        )
    async with world.deps.db.write() as conn:  # holes in the ids, as rolled-back writes leave
        found = (
            await conn.execute(
                select(order_events.c.id)
                .where(order_events.c.event == "x")
                .order_by(order_events.c.id)
            )
        ).scalars()
        holes = list(found)[1::3]
        await conn.execute(delete(order_events).where(order_events.c.id.in_(holes)))
    async with world.deps.db.write() as conn:
        before = await events.last_seq(conn)
        assert await events.number_committed(conn, limit=5) == 5
        assert await events.number_committed(conn, limit=500) >= 3
        assert await events.number_committed(conn, limit=500) == 0
        after = await events.last_seq(conn)
    async with world.deps.db.read() as conn:
        rows = (
            await conn.execute(
                select(order_events.c.id, order_events.c.seq)
                .where(order_events.c.seq > before)
                .order_by(order_events.c.id)
            )
        ).all()
    assert [r.seq for r in rows] == list(range(before + 1, after + 1))


class _BatchFailed(Exception):
    """Something later in a batch's transaction fails (a lock timeout on a held row, say)."""


async def test_a_rolled_back_batchs_deferred_events_reach_no_later_transaction(world):
    """A transaction that defers its events to its end and then rolls back leaves nothing on
    the pooled connection: every later transaction there writes its own event and no other."""
    order_id = await an_order(world)
    with pytest.raises(_BatchFailed):
        async with world.deps.db.write() as conn:
            entry = events.Entry(order_id, "cancelled", "pending_payment", "cancelled")
            await events.record(conn, [entry], actor="system", now=world.clock.now())
            raise _BatchFailed
    for _ in range(20):  # more transactions than the pool has connections
        async with world.deps.db.write() as conn:
            await order_store.add_event(
                conn, order_id, event="note", actor="system", now=world.clock.now()
            )
    async with world.deps.db.read() as conn:
        written = (
            (
                await conn.execute(
                    select(order_events.c.event).where(order_events.c.order_id == order_id)
                )
            )
            .scalars()
            .all()
        )
    assert "cancelled" not in written
    assert written.count("note") == 20
