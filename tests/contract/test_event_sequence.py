"""The events feed on every database: a transaction that took a lower id but commits later is fed
after the one that committed first, and the feed gives every event once.

On PostgreSQL and MariaDB the late transaction is really held open while another commits and the
sequencer runs. On SQLite it cannot be: a write transaction holds the one write lock, so the
second writer and the sequencer wait for it, and ids are commit order there.
"""

from __future__ import annotations

import asyncio
import contextlib

from dueflow.exceptions import Busy
from dueflow.service import events, orders
from dueflow.store import orders as order_store
from tests.envelopes import seq_of


async def record(conn, order_id: int, name: str, now) -> None:
    await order_store.record_events(conn, [order_id], event=name, actor="test", now=now)


async def event_ids(w, order_ids: list[int]) -> dict[str, int]:
    async with w.deps.db.read() as conn:
        rows = [r for o in order_ids for r in await order_store.timeline(conn, o)]
    return {r.event: r.id for r in rows}


async def fed_from(w, after: int) -> list[dict]:
    return await events.feed(w.deps, after=after, limit=100)


async def test_a_late_commit_is_fed_after_the_one_that_committed_first(backend_world):
    w = backend_world
    now = w.clock.now()
    a = await orders.place_order(w.deps, buyer_id=w.buyer, goods_id=await w.goods())
    b = await orders.place_order(w.deps, buyer_id=w.other, goods_id=await w.goods())
    assert await events.sequence(w.deps) == 2
    start = seq_of((await fed_from(w, 0))[-1])

    if w.deps.db.dialect == "sqlite":
        async with w.deps.db.write() as slow:
            await record(slow, a, "slow", now)
            fast = asyncio.create_task(_commit(w, b, "fast", now))
            numbering = asyncio.create_task(events.sequence(w.deps))
            assert await numbering == 0  # it reads alongside, and sees nothing committed
            await asyncio.sleep(0.2)
            assert not fast.done()  # the second writer waits for the write lock
        await fast
        assert await events.sequence(w.deps) == 2
        fed = await fed_from(w, start)
        assert [e["type"] for e in fed] == ["slow", "fast"]
        return

    async with w.deps.db.write() as slow:
        await record(slow, a, "slow", now)  # takes the lower id, commits last
        await _commit(w, b, "fast", now)
        assert await events.sequence(w.deps) == 1  # only what committed
        first = await fed_from(w, start)
        assert [e["type"] for e in first] == ["fast"]
    ids = await event_ids(w, [a, b])
    assert ids["slow"] < ids["fast"]
    assert await fed_from(w, seq_of(first[-1])) == []  # committed, not yet numbered
    assert await events.sequence(w.deps) == 1
    late = await fed_from(w, seq_of(first[-1]))
    assert [e["type"] for e in late] == ["slow"]  # a reader past "fast" still gets it
    everything = await fed_from(w, 0)
    assert [e["type"] for e in everything][-2:] == ["fast", "slow"]
    assert [seq_of(e) for e in everything] == list(range(1, len(everything) + 1))


async def _commit(w, order_id: int, name: str, now) -> None:
    async with w.deps.db.write() as conn:
        await record(conn, order_id, name, now)


async def test_sequencers_in_many_processes_number_every_event_once(backend_world):
    """Writers and four sequencers at once (as four worker processes would): every event gets
    exactly one seq, the numbers have no gap, and each follows the counter."""
    w = backend_world
    goods = [await w.goods() for _ in range(12)]
    numbering = True

    async def sequencer() -> int:
        total = 0
        while numbering:
            # A deadlock MariaDB broke is Busy: the loop tries again, as here.
            with contextlib.suppress(Busy):
                total += await events.sequence(w.deps, limit=3)
            await asyncio.sleep(0)
        return total

    sequencers = [asyncio.create_task(sequencer()) for _ in range(4)]
    placed = await asyncio.gather(
        *(orders.place_order(w.deps, buyer_id=w.buyer, goods_id=g) for g in goods)
    )
    numbering = False
    counts = await asyncio.gather(*sequencers)
    while await events.sequence(w.deps):
        pass
    fed = await fed_from(w, 0)
    assert sorted(e["order"]["id"] for e in fed) == sorted(placed)
    assert [seq_of(e) for e in fed] == list(range(1, len(placed) + 1))
    assert sum(counts) <= len(placed)


async def test_a_batch_numbered_in_chunks_gets_one_gapless_run_in_id_order(
    backend_world, monkeypatch
):
    """MySQL numbers a sequencer batch through CASE UPDATEs of ``_CASE_CHUNK`` ids each (the
    other databases in one UPDATE by an array): a batch of several chunks still gives the
    events the next numbers, each once, in id order. The chunk is made small so a few events
    span three of them."""
    from dueflow.store import events as event_store

    monkeypatch.setattr(event_store, "_CASE_CHUNK", 2)
    w = backend_world
    now = w.clock.now()
    order_id = await orders.place_order(w.deps, buyer_id=w.buyer, goods_id=await w.goods())
    assert await events.sequence(w.deps) == 1
    start = seq_of((await fed_from(w, 0))[-1])
    async with w.deps.db.write() as conn:
        for name in ("one", "two", "three", "four", "five"):
            await record(conn, order_id, name, now)
    assert await events.sequence(w.deps) == 5
    fed = await fed_from(w, start)
    assert [e["type"] for e in fed] == ["one", "two", "three", "four", "five"]
    assert [seq_of(e) for e in fed] == list(range(start + 1, start + 6))
    assert await events.sequence(w.deps) == 0
