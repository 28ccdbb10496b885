"""Statements on the order events outbox: per-order entries, numbering in commit order, the
feed, and the cursors of the webhook's delivery streams.

Every order event is written (``order_events``) in the transaction that caused it. Ids are not
the order in which events become visible: a slower transaction with a lower id can commit after
a faster one. So events get a second number, ``seq``, once committed: :func:`number_committed`
locks the one counter row, takes the events still without one in id order and numbers them
after the counter. A transaction that commits late is numbered in a later run, after everything
numbered before it. Readers go by ``seq`` only and never see a number skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Row, case, exists, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store.schema import event_deliveries, event_sequence, order_events, orders
from dueflow.store.types import fit

COUNTER_ID = 1
#: The name of the live delivery stream's cursor row.
LIVE = "live"
e = order_events.c
d = event_deliveries.c


async def record_each(
    conn: AsyncConnection,
    entries: Sequence[tuple[int, str | None]],
    *,
    event: str,
    actor: str,
    now: datetime,
) -> None:
    """Append one event per (order id, detail): the same event, each order's own detail (texts
    longer than their columns are cut, as :func:`dueflow.store.orders.record_events` does)."""
    if not entries:
        return
    rows = [
        {
            "order_id": order_id,
            "at": now,
            "event": fit(e.event, event) or "",
            "actor": fit(e.actor, actor) or "",
            "from_status": None,
            "to_status": None,
            "detail": fit(e.detail, detail),
        }
        for order_id, detail in entries
    ]
    await conn.execute(insert(order_events), rows)


# --- the sequence ----------------------------------------------------------------------------


async def unnumbered(conn: AsyncConnection) -> bool:
    """Some committed event has no seq yet (one index seek; no lock taken)."""
    query = select(exists().where(e.seq.is_(None)))
    return bool((await conn.execute(query)).scalar())


async def number_committed(conn: AsyncConnection, *, limit: int) -> int:
    """Inside a short write transaction: give the next ``limit`` committed events without a seq
    (in id order) the numbers after the counter; returns how many. Four statements: lock the
    counter, find the events, number them (one UPDATE), move the counter."""
    last = await _lock_counter(conn)
    query = select(e.id).where(e.seq.is_(None)).order_by(e.id).limit(limit)
    found = list((await conn.execute(query)).scalars())
    if not found:
        return 0
    numbers = {event_id: last + n for n, event_id in enumerate(found, 1)}
    await conn.execute(
        update(order_events).where(e.id.in_(found)).values(seq=case(numbers, value=e.id))
    )
    await conn.execute(
        update(event_sequence)
        .where(event_sequence.c.id == COUNTER_ID)
        .values(last_seq=last + len(found))
    )
    return len(found)


async def _lock_counter(conn: AsyncConnection) -> int:
    """The counter, locked until this transaction ends (SELECT ... FOR UPDATE; on SQLite the
    write transaction's lock already serialises). A missing row (a database emptied by hand) is
    put back after the highest seq given."""
    query = (
        select(event_sequence.c.last_seq).where(event_sequence.c.id == COUNTER_ID).with_for_update()
    )
    last = (await conn.execute(query)).scalar()
    if last is not None:
        return int(last)
    highest = int((await conn.execute(select(func.coalesce(func.max(e.seq), 0)))).scalar_one())
    try:
        async with conn.begin_nested():
            await conn.execute(insert(event_sequence).values(id=COUNTER_ID, last_seq=highest))
    except IntegrityError:  # another sequencer put it back first: wait for it, read it
        return int((await conn.execute(query)).scalar_one())
    return highest


async def last_seq(conn: AsyncConnection) -> int:
    """The last seq given (0 before any)."""
    query = select(event_sequence.c.last_seq).where(event_sequence.c.id == COUNTER_ID)
    return int((await conn.execute(query)).scalar() or 0)


async def count_unnumbered(conn: AsyncConnection) -> int:
    """How many committed events wait for their seq (normally none, or a second's worth)."""
    query = select(func.count()).select_from(order_events).where(e.seq.is_(None))
    return int((await conn.execute(query)).scalar_one())


# --- reading ---------------------------------------------------------------------------------


async def after(
    conn: AsyncConnection,
    seq: int,
    *,
    limit: int,
    until: int | None = None,
    user_id: int | None = None,
) -> list[Row[Any]]:
    """The numbered events after ``seq`` (up to ``until``), in seq order; with ``user_id``
    only those of orders where that user is the buyer or the seller."""
    query = select(order_events).where(e.seq > seq).order_by(e.seq).limit(limit)
    if until is not None:
        query = query.where(e.seq <= until)
    if user_id is not None:
        mine = select(orders.c.id).where(
            or_(orders.c.buyer_id == user_id, orders.c.seller_id == user_id)
        )
        query = query.where(e.order_id.in_(mine))
    return list((await conn.execute(query)).all())


# --- delivery cursors ------------------------------------------------------------------------


async def cursor_rows(conn: AsyncConnection) -> list[Row[Any]]:
    """The live stream's cursor (first) and the replays not yet done, oldest first."""
    query = (
        select(event_deliveries)
        .where(d.done_at.is_(None))
        .order_by((d.name != LIVE), d.id)  # the live stream first
    )
    return list((await conn.execute(query)).all())


async def live_cursor(conn: AsyncConnection) -> Row[Any] | None:
    """The live stream's cursor; None until a process with a webhook URL has run."""
    return (await conn.execute(select(event_deliveries).where(d.name == LIVE))).first()


async def ensure_live(conn: AsyncConnection, now: datetime) -> None:
    """Create the live stream's cursor at the start of the feed if it is missing (the first
    process with a webhook URL); another process creating it at the same time is fine."""
    if await live_cursor(conn) is not None:
        return
    try:
        async with conn.begin_nested():
            await conn.execute(
                insert(event_deliveries).values(
                    name=LIVE, delivered_seq=0, failures=0, created_at=now, updated_at=now
                )
            )
    except IntegrityError:
        return


async def take_lease(conn: AsyncConnection, owner: str, *, now: datetime, lease: timedelta) -> bool:
    """Take (or keep) the right to deliver, for ``lease``: one process delivers at a time, so
    events go out one by one in seq order. False while another process holds it."""
    result = await conn.execute(
        update(event_deliveries)
        .where(
            d.name == LIVE,
            or_(d.owner.is_(None), d.owner == owner, d.lease_until < now),
        )
        .values(owner=owner, lease_until=now + lease)
    )
    return result.rowcount == 1


async def give_up_lease(conn: AsyncConnection, owner: str) -> None:
    """Let another process deliver at once (this one is stopping)."""
    await conn.execute(
        update(event_deliveries)
        .where(d.name == LIVE, d.owner == owner)
        .values(owner=None, lease_until=None)
    )


async def advance(
    conn: AsyncConnection,
    cursor_id: int,
    *,
    from_seq: int,
    to_seq: int,
    until_seq: int | None,
    now: datetime,
) -> bool:
    """Record that a stream delivered everything up to ``to_seq``, if it still stands at
    ``from_seq`` (the caller renewed its lease in this transaction); a replay that reached its
    last event is done."""
    done = now if until_seq is not None and to_seq >= until_seq else None
    result = await conn.execute(
        update(event_deliveries)
        .where(d.id == cursor_id, d.delivered_seq == from_seq)
        .values(delivered_seq=to_seq, failures=0, retry_at=None, updated_at=now, done_at=done)
    )
    return result.rowcount == 1


async def failed(
    conn: AsyncConnection,
    cursor_id: int,
    *,
    at_seq: int,
    error: str,
    retry_at: datetime,
    now: datetime,
) -> None:
    """Record a failed delivery of the event after ``at_seq`` and when to try it again."""
    await conn.execute(
        update(event_deliveries)
        .where(d.id == cursor_id, d.delivered_seq == at_seq)
        .values(
            failures=d.failures + 1,
            last_error=fit(d.last_error, error),
            last_error_at=now,
            retry_at=retry_at,
            updated_at=now,
        )
    )


async def backlog(conn: AsyncConnection) -> int:
    """Events the live stream has not delivered yet, numbered or not; 0 while no process has
    had a webhook URL (nothing is waiting to be delivered anywhere)."""
    live = await live_cursor(conn)
    if live is None:
        return 0
    waiting = max(0, await last_seq(conn) - int(live.delivered_seq))
    return waiting + await count_unnumbered(conn)


async def add_replay(
    conn: AsyncConnection, name: str, first: int, last: int, *, by: str, now: datetime
) -> None:
    """A replay of the events ``first`` to ``last`` (by seq), delivered again from the start."""
    await conn.execute(
        insert(event_deliveries).values(
            name=name,
            delivered_seq=first - 1,
            until_seq=last,
            failures=0,
            requested_by=by,
            created_at=now,
            updated_at=now,
        )
    )
