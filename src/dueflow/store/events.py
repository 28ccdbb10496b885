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

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any, NamedTuple

import orjson
from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Row,
    String,
    bindparam,
    case,
    exists,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow import tracing
from dueflow.store import snapshots
from dueflow.store.schema import event_deliveries, event_sequence, order_events, orders
from dueflow.store.types import UTCDateTime, fit

COUNTER_ID = 1
#: The name of the live delivery stream's cursor row.
LIVE = "live"
e = order_events.c
d = event_deliveries.c


class Entry(NamedTuple):
    """One timeline entry to append: the order, the event, the status move if any, the detail
    (words, for the timeline) and the data (structured, for the envelope)."""

    order_id: int
    event: str
    from_status: str | None = None
    to_status: str | None = None
    detail: str | None = None
    data: Mapping[str, Any] | None = None


#: The columns :func:`record` writes, in the order its SELECTs give them.
_COLUMNS = [
    "order_id",
    "at",
    "event",
    "actor",
    "from_status",
    "to_status",
    "detail",
    "data",
    "snapshot",
]
_NOW = bindparam("now", type_=UTCDateTime)
_ACTOR = bindparam("actor", type_=String)
#: PostgreSQL: the entries as one array per column, unnested in their order.
_ARRAYS = (
    func.unnest(
        bindparam("order_ids", type_=ARRAY(BigInteger)),
        bindparam("events", type_=ARRAY(String)),
        bindparam("from_statuses", type_=ARRAY(String)),
        bindparam("to_statuses", type_=ARRAY(String)),
        bindparam("details", type_=ARRAY(String)),
        bindparam("datas", type_=ARRAY(String)),
        bindparam("snapshots", type_=ARRAY(String)),
    )
    .table_valued(
        "order_id",
        "event",
        "from_status",
        "to_status",
        "detail",
        "data",
        "snapshot",
        with_ordinality="n",
    )
    .render_derived(name="entry")
)
_FROM_ARRAYS = insert(order_events).from_select(
    _COLUMNS,
    select(
        _ARRAYS.c.order_id,
        _NOW,
        _ARRAYS.c.event,
        _ACTOR,
        _ARRAYS.c.from_status,
        _ARRAYS.c.to_status,
        _ARRAYS.c.detail,
        _ARRAYS.c.data,
        _ARRAYS.c.snapshot,
    ).order_by(_ARRAYS.c.n),
)
#: SQLite: the entries as one JSON array of arrays, read by json_each in their order.
_JSON = func.json_each(bindparam("entries", type_=String)).table_valued("key", "value").alias()


def _field(n: int) -> Any:
    return func.json_extract(_JSON.c.value, f"$[{n}]")


_FROM_JSON = insert(order_events).from_select(
    _COLUMNS,
    select(_field(0), _NOW, _field(1), _ACTOR, *(_field(n) for n in range(2, 7))).order_by(
        _JSON.c.key
    ),
)


async def record(
    conn: AsyncConnection, entries: Sequence[Entry], *, actor: str, now: datetime
) -> None:
    """Append these timeline entries in one statement and in the order given: their ids follow
    it, so each order's timeline (by time, then id) and the feed (the sequencer numbers in id
    order) show them in that order. Texts longer than their columns are cut, as
    :func:`dueflow.store.orders.record_events` does.

    No parameters per row: on PostgreSQL one array per column (``unnest``), on SQLite one JSON
    array (``json_each``); a cancel of 2,000 orders writes 4,000 entries this way. MySQL gets
    the rows as one executemany. In a write transaction of the Database the INSERT is made last
    in it, with the orders' snapshots (:func:`dueflow.store.snapshots.defer`; while tracing is
    on, and elsewhere, at once, the snapshots filled last)."""
    if not entries:
        return
    order_ids, names, froms, tos, texts, datas = (list(c) for c in zip(*entries, strict=True))
    data = [None if d is None else snapshots.encode(d) for d in datas]
    cut = {name: fit(e.event, name) or "" for name in set(names)}
    names = [cut[name] for name in names]
    details = [fit(e.detail, text) for text in texts]
    columns = (order_ids, names, froms, tos, details, data)
    write = partial(_insert, conn, columns, actor=fit(e.actor, actor) or "", now=now)
    if tracing.current_traceparent() is None and snapshots.defer(conn, order_ids, write):
        return
    await write(None)
    await snapshots.fill_now(conn, order_ids)


async def _insert(
    conn: AsyncConnection,
    columns: tuple[list[Any], ...],
    snapshot_of: Mapping[int, str] | None,
    *,
    actor: str,
    now: datetime,
) -> None:
    """The INSERT of :func:`record`: the entries as columns (order ids, events, from and to
    statuses, details, data), each with its order's snapshot if given."""
    order_ids = columns[0]
    shots = (
        [None] * len(order_ids) if snapshot_of is None else [snapshot_of.get(o) for o in order_ids]
    )
    dialect = conn.dialect.name
    if dialect == "postgresql":
        names = ("order_ids", "events", "from_statuses", "to_statuses", "details", "datas")
        params = dict(zip(names, columns, strict=True))
        await conn.execute(_FROM_ARRAYS, {"now": now, "actor": actor, **params, "snapshots": shots})
    elif dialect == "sqlite":
        rows = orjson.dumps(list(zip(*columns, shots, strict=True)))
        await conn.execute(_FROM_JSON, {"now": now, "actor": actor, "entries": rows.decode()})
    else:
        await conn.execute(
            insert(order_events),
            [
                dict(zip(_COLUMNS, (oid, now, name, actor, f, t, d, j, s), strict=True))
                for oid, name, f, t, d, j, s in zip(*columns, shots, strict=True)
            ],
        )


async def record_each(
    conn: AsyncConnection,
    entries: Sequence[tuple[int, str | None] | tuple[int, str | None, Mapping[str, Any] | None]],
    *,
    event: str,
    actor: str,
    now: datetime,
) -> None:
    """Append one event per (order id, detail[, data]): the same event, each order's own
    detail and data, in one statement (:func:`record`)."""
    await record(
        conn,
        [Entry(x[0], event, detail=x[1], data=x[2] if len(x) > 2 else None) for x in entries],
        actor=actor,
        now=now,
    )


# --- the sequence ----------------------------------------------------------------------------


async def unnumbered(conn: AsyncConnection) -> bool:
    """Some committed event has no seq yet (one index seek; no lock taken)."""
    query = select(exists().where(e.seq.is_(None)))
    return bool((await conn.execute(query)).scalar())


async def number_committed(conn: AsyncConnection, *, limit: int) -> int:
    """Inside a short write transaction: give the next ``limit`` committed events without a seq
    (in id order) the numbers after the counter; returns how many. Four statements: lock the
    counter, find the events, number them (one UPDATE, :func:`_number`), move the counter."""
    last = await _lock_counter(conn)
    query = select(e.id).where(e.seq.is_(None)).order_by(e.id).limit(limit)
    found = list((await conn.execute(query)).scalars())
    if not found:
        return 0
    await _number(conn, found, last)
    await conn.execute(
        update(event_sequence)
        .where(event_sequence.c.id == COUNTER_ID)
        .values(last_seq=last + len(found))
    )
    return len(found)


_LAST = bindparam("last", type_=BigInteger)
#: MySQL: ids numbered per UPDATE through a CASE.
_CASE_CHUNK = 500
#: PostgreSQL: the ids as one array, each numbered by its place in it.
_PLACES = (
    func.unnest(bindparam("ids", type_=ARRAY(BigInteger)))
    .table_valued("id", with_ordinality="n")
    .render_derived(name="numbered")
)
_NUMBER_FROM_ARRAY = (
    update(order_events).where(e.id == _PLACES.c.id).values(seq=_LAST + _PLACES.c.n)
)
#: SQLite: the ids as one JSON array (its keys count from 0).
_LISTED = func.json_each(bindparam("ids", type_=String)).table_valued("key", "value").alias()
_NUMBER_FROM_JSON = (
    update(order_events).where(e.id == _LISTED.c.value).values(seq=_LAST + 1 + _LISTED.c.key)
)


async def _number(conn: AsyncConnection, found: Sequence[int], last: int) -> None:
    """Give ``found`` (in id order) the numbers ``last`` + 1, + 2, ... in one UPDATE: on
    PostgreSQL and SQLite by each id's place in one array parameter (no parameters per event),
    on MySQL through a CASE on the id."""
    dialect = conn.dialect.name
    if dialect == "postgresql":
        await conn.execute(_NUMBER_FROM_ARRAY, {"ids": list(found), "last": last})
    elif dialect == "sqlite":
        await conn.execute(
            _NUMBER_FROM_JSON, {"ids": orjson.dumps(list(found)).decode(), "last": last}
        )
    else:
        # A CASE costs its ids times the rows it updates: chunks keep it linear in the batch.
        for start in range(0, len(found), _CASE_CHUNK):
            chunk = found[start : start + _CASE_CHUNK]
            numbers = {event_id: last + start + n for n, event_id in enumerate(chunk, 1)}
            await conn.execute(
                update(order_events).where(e.id.in_(chunk)).values(seq=case(numbers, value=e.id))
            )


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
    types: Sequence[str] | None = None,
) -> list[Row[Any]]:
    """The numbered events after ``seq`` (up to ``until``), in seq order; with ``user_id``
    only those of orders where that user is the buyer or the seller, with ``types`` only those
    events."""
    query = select(order_events).where(e.seq > seq).order_by(e.seq).limit(limit)
    if until is not None:
        query = query.where(e.seq <= until)
    if types is not None:
        query = query.where(e.event.in_(types))
    if user_id is not None:
        mine = select(orders.c.id).where(
            or_(orders.c.buyer_id == user_id, orders.c.seller_id == user_id)
        )
        query = query.where(e.order_id.in_(mine))
    return list((await conn.execute(query)).all())


# --- delivery cursors ------------------------------------------------------------------------


def live_name(endpoint_id: int | None = None) -> str:
    """The name of an endpoint's live stream: ``live`` for the settings' endpoint (None),
    ``endpoint-<id>`` for one made over the API."""
    return LIVE if endpoint_id is None else f"endpoint-{endpoint_id}"


def _of_endpoint(endpoint_id: int | None) -> ColumnElement[bool]:
    return d.endpoint_id.is_(None) if endpoint_id is None else d.endpoint_id == endpoint_id


async def cursor_rows(conn: AsyncConnection, endpoint_id: int | None = None) -> list[Row[Any]]:
    """One endpoint's live stream's cursor (first) and its replays not yet done, oldest
    first."""
    query = (
        select(event_deliveries)
        .where(d.done_at.is_(None), _of_endpoint(endpoint_id))
        .order_by((d.until_seq.is_not(None)), d.id)  # the live stream first
    )
    return list((await conn.execute(query)).all())


async def live_cursor(conn: AsyncConnection, endpoint_id: int | None = None) -> Row[Any] | None:
    """An endpoint's live stream's cursor; None until a process has delivered to it."""
    query = select(event_deliveries).where(d.name == live_name(endpoint_id))
    return (await conn.execute(query)).first()


async def ensure_live(
    conn: AsyncConnection, now: datetime, endpoint_id: int | None = None, *, start: int = 0
) -> None:
    """Create an endpoint's live stream's cursor after event ``start`` if it is missing (the
    first process that delivers to it); another process creating it at the same time is
    fine."""
    if await live_cursor(conn, endpoint_id) is not None:
        return
    try:
        async with conn.begin_nested():
            await conn.execute(
                insert(event_deliveries).values(
                    name=live_name(endpoint_id),
                    endpoint_id=endpoint_id,
                    delivered_seq=start,
                    failures=0,
                    created_at=now,
                    updated_at=now,
                )
            )
    except IntegrityError:
        return


async def take_lease(
    conn: AsyncConnection,
    owner: str,
    *,
    now: datetime,
    lease: timedelta,
    endpoint_id: int | None = None,
) -> bool:
    """Take (or keep) the right to deliver to one endpoint, for ``lease``: one process
    delivers to it at a time, so its events go out one by one in seq order. False while
    another process holds it."""
    result = await conn.execute(
        update(event_deliveries)
        .where(
            d.name == live_name(endpoint_id),
            or_(d.owner.is_(None), d.owner == owner, d.lease_until < now),
        )
        .values(owner=owner, lease_until=now + lease)
    )
    return result.rowcount == 1


async def give_up_lease(conn: AsyncConnection, owner: str) -> None:
    """Let another process deliver at once to every endpoint ``owner`` held (it is
    stopping)."""
    await conn.execute(
        update(event_deliveries).where(d.owner == owner).values(owner=None, lease_until=None)
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


async def backlog(
    conn: AsyncConnection, endpoint_id: int | None = None, types: Sequence[str] | None = None
) -> int:
    """Events an endpoint's live stream has not delivered yet, numbered or not (with
    ``types``, only those); 0 while nothing has delivered to it."""
    live = await live_cursor(conn, endpoint_id)
    if live is None:
        return 0
    if types is None:
        waiting = max(0, await last_seq(conn) - int(live.delivered_seq))
        return waiting + await count_unnumbered(conn)
    query = (
        select(func.count())
        .select_from(order_events)
        .where(
            or_(e.seq > int(live.delivered_seq), e.seq.is_(None)),
            e.event.in_(types),
        )
    )
    return int((await conn.execute(query)).scalar_one())


async def add_replay(
    conn: AsyncConnection,
    name: str,
    first: int,
    last: int,
    *,
    by: str,
    now: datetime,
    endpoint_id: int | None = None,
) -> None:
    """A replay of the events ``first`` to ``last`` (by seq) to one endpoint, delivered again
    from the start."""
    await conn.execute(
        insert(event_deliveries).values(
            name=name,
            endpoint_id=endpoint_id,
            delivered_seq=first - 1,
            until_seq=last,
            failures=0,
            requested_by=by,
            created_at=now,
            updated_at=now,
        )
    )
