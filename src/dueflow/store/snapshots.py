"""The order snapshots of order events: each event row carries the order as its view shows it
after the event's transaction (docs/events.md), written in that transaction.

An event written without its snapshot (every writer but placing, which knows its order whole)
marks its order; last in the write transaction, :func:`flush` reads every marked order at once
(the orders, their lines, tickets, payments and refunds: four or five statements for a batch of
any size) and fills the snapshot of the transaction's events in one UPDATE. So all events of one
order in one transaction carry the same snapshot, the order as the commit leaves it (no reader
can see it in between), and a cancel of thousands of orders adds five statements, not five per
order.

A batch writer (:func:`dueflow.store.events.record`) does better: it :func:`defer` s its INSERT
to that same moment, and writes its events with their snapshots, so no UPDATE rewrites them (an
UPDATE of a row just written is a second copy of it: on PostgreSQL the herd's costliest
statement, on SQLite its costliest too). A writer that adds an event itself first calls
:func:`write_deferred`, which writes what was deferred at once the old way (marked, filled
last): the events' ids keep the order of the calls either way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

import orjson
from sqlalchemy import BigInteger, String, Update, bindparam, case, func, select, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow import tracing
from dueflow.store import db, hot, tally
from dueflow.store.schema import (
    order_events,
    order_lines,
    orders,
    payments,
    refunds,
    seats,
    tickets,
)

e = order_events.c
_MARKED = "dueflow_snapshot_orders"
_DEFERRED = "dueflow_snapshot_deferred"
#: A deferred write: given the snapshots (JSON text by order id), or None (write without them,
#: the orders are marked then).
DeferredWrite = Callable[[Mapping[int, str] | None], Awaitable[None]]


def encode(value: Any) -> str:
    """JSON text as the API answers it (:func:`dueflow.api.common.encode`): Decimals as exact
    text, datetimes as ISO 8601."""
    return orjson.dumps(value, default=_unnative, option=orjson.OPT_NON_STR_KEYS).decode()


def _unnative(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


def line_view(line: Any) -> dict[str, Any]:
    """One line as the order view shows it."""
    return {
        "kind": line.kind,
        "item_id": line.item_id,
        "label": line.label,
        "quantity": line.quantity,
        "price": line.price,
    }


def ticket_view(ticket: Any) -> dict[str, Any]:
    """A ticket as an order's view and snapshot show it: its seat, code, state, and when and at
    which gate it was checked in (null until it is)."""
    return {
        "seat": ticket.label,
        "code": ticket.code,
        "state": ticket.state,
        "checked_in_at": ticket.checked_in_at,
        "gate": ticket.checked_in_gate,
    }


#: A snapshot's tickets: what each ticket shows, with its seat's label.
_TICKETS_WITH_SEATS = select(
    tickets.c.order_id,
    tickets.c.code,
    tickets.c.state,
    tickets.c.checked_in_at,
    tickets.c.checked_in_gate,
    seats.c.label,
).join(seats, seats.c.id == tickets.c.seat_id)


#: The batch build's statements, each over one id list compiled once (PostgreSQL, SQLite).
_MANY_ORDERS = tally.HotAmong(lambda among: select(orders).where(among(orders.c.id)))
_MANY_LINES = tally.HotAmong(
    lambda among: (
        select(order_lines).where(among(order_lines.c.order_id)).order_by(order_lines.c.id)
    )
)
_MANY_TICKETS = tally.HotAmong(
    lambda among: _TICKETS_WITH_SEATS.where(among(tickets.c.order_id)).order_by(
        tickets.c.order_id, tickets.c.seat_id
    )
)
_MANY_PAYMENTS = tally.HotAmong(
    lambda among: select(payments).where(among(payments.c.order_id)).order_by(payments.c.id)
)
_MANY_REFUNDS = tally.HotAmong(
    lambda among: select(refunds).where(among(refunds.c.order_id)).order_by(refunds.c.id)
)


async def _rows(conn: AsyncConnection, statement: tally.HotAmong, ids: Sequence[int]) -> Any:
    """The rows of one of the batch statements for ``ids``: built once (PostgreSQL, SQLite),
    or through SQLAlchemy's execution with an IN list (MySQL)."""
    found = await statement.all(conn, ids)
    if found is not None:
        return found
    return await conn.execute(statement.make(lambda column: tally.among(conn, column, ids)))


async def build(conn: AsyncConnection, order_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """The snapshot of each of these orders as it stands in this transaction: the order's own
    fields, ``lines``, ``tickets``, ``payments`` and ``refunds``, each as
    :func:`dueflow.service.orders.view_in` reads them. Four statements (five when a show's
    order is among them), each compiled once; a missing order is left out."""
    ids = sorted(set(order_ids))
    if not ids:
        return {}
    if len(ids) == 1:
        return await _build_one(conn, ids[0])
    found = {
        r.id: {**r._mapping, "lines": [], "tickets": [], "payments": [], "refunds": []}
        for r in await _rows(conn, _MANY_ORDERS, ids)
    }
    ids = sorted(found)
    if not ids:
        return {}
    for line in await _rows(conn, _MANY_LINES, ids):
        found[line.order_id]["lines"].append(line_view(line))
    shown = [oid for oid in ids if found[oid]["show_id"] is not None]
    if shown:
        for t in await _rows(conn, _MANY_TICKETS, shown):
            found[t.order_id]["tickets"].append(ticket_view(t))
    for p in await _rows(conn, _MANY_PAYMENTS, ids):
        found[p.order_id]["payments"].append(dict(p._mapping))
    for r in await _rows(conn, _MANY_REFUNDS, ids):
        found[r.order_id]["refunds"].append(dict(r._mapping))
    return found


#: One order's snapshot (a payment's confirm, a buyer's cancel: one order a transaction) read by
#: hot statements: building the batch statements' IN lists cost more CPU than running them.
_ONE_ORDER = hot.Hot(select(orders).where(orders.c.id == bindparam("order_id")))
_ONE_LINES = hot.Hot(
    select(order_lines)
    .where(order_lines.c.order_id == bindparam("order_id"))
    .order_by(order_lines.c.id)
)
_ONE_TICKETS = hot.Hot(
    _TICKETS_WITH_SEATS.where(tickets.c.order_id == bindparam("order_id")).order_by(
        tickets.c.seat_id
    )
)
_ONE_PAYMENTS = hot.Hot(
    select(payments).where(payments.c.order_id == bindparam("order_id")).order_by(payments.c.id)
)
_ONE_REFUNDS = hot.Hot(
    select(refunds).where(refunds.c.order_id == bindparam("order_id")).order_by(refunds.c.id)
)


async def _build_one(conn: AsyncConnection, order_id: int) -> dict[int, dict[str, Any]]:
    """:func:`build` for one order, the same statements by key instead of IN lists."""
    order = await _ONE_ORDER.first(conn, order_id=order_id)
    if order is None:
        return {}
    snap: dict[str, Any] = {**order._mapping, "lines": [], "tickets": [], "payments": []}
    snap["lines"] = [line_view(line) for line in await _ONE_LINES.all(conn, order_id=order_id)]
    if order.show_id is not None:
        snap["tickets"] = [ticket_view(t) for t in await _ONE_TICKETS.all(conn, order_id=order_id)]
    snap["payments"] = [p._mapping for p in await _ONE_PAYMENTS.all(conn, order_id=order_id)]
    snap["refunds"] = [r._mapping for r in await _ONE_REFUNDS.all(conn, order_id=order_id)]
    return {order_id: snap}


def mark(conn: AsyncConnection, order_ids: Sequence[int]) -> bool:
    """Have the snapshots of these orders' new events filled last in this transaction; False
    when ``conn`` is no write transaction of :class:`~dueflow.store.db.Database` (the caller
    then calls :func:`flush` itself)."""
    state = db.transaction_state(conn)
    if state is None or not db.before_commit(conn, _MARKED, lambda: flush(conn)):
        return False
    state.setdefault(_MARKED, set()).update(order_ids)
    return True


async def fill_now(conn: AsyncConnection, order_ids: Sequence[int]) -> None:
    """:func:`mark`, or at once outside a write transaction of the Database (tests' own
    connections)."""
    if not mark(conn, order_ids):
        await _fill(conn, order_ids)


def defer(conn: AsyncConnection, order_ids: Sequence[int], write: DeferredWrite) -> bool:
    """Have ``write`` run last in this transaction with the snapshots of ``order_ids`` (the
    events it writes carry them from the start); False when ``conn`` is no write transaction
    of :class:`~dueflow.store.db.Database` (the caller writes at once)."""
    state = db.transaction_state(conn)
    if state is None or not db.before_commit(conn, _MARKED, lambda: flush(conn)):
        return False
    state.setdefault(_DEFERRED, []).append((order_ids, write))
    return True


async def write_deferred(conn: AsyncConnection) -> None:
    """Run the writes deferred in this transaction now, without their snapshots (their
    orders marked, filled last): called before an event is written any other way, so ids keep
    the order in which events were recorded. Nothing to do on most connections."""
    state = db.transaction_state(conn)
    if state is None:
        return
    for order_ids, write in state.pop(_DEFERRED, ()):
        await write(None)
        mark(conn, order_ids)


async def flush(conn: AsyncConnection) -> None:
    """Write the deferred events with their snapshots, and fill the snapshot of every event
    this transaction wrote without one: one read of the orders for both."""
    state = db.transaction_state(conn) or {}
    deferred: list[tuple[Sequence[int], DeferredWrite]] = state.pop(_DEFERRED, [])
    marked: set[int] = state.pop(_MARKED, set())
    wanted = set(marked)
    for order_ids, _ in deferred:
        wanted.update(order_ids)
    if not wanted:
        return
    texts = {oid: encode(snap) for oid, snap in (await build(conn, sorted(wanted))).items()}
    for _, write in deferred:
        await write(texts)
    if marked:
        await _write_fill(conn, {oid: texts[oid] for oid in sorted(marked) if oid in texts})


#: PostgreSQL: one array of order ids and one of their snapshots.
_PAIRS = (
    func.unnest(
        bindparam("order_ids", type_=ARRAY(BigInteger)),
        bindparam("snapshots", type_=ARRAY(String)),
    )
    .table_valued("order_id", "snapshot")
    .render_derived(name="snap")
)
#: An event of this transaction: not numbered yet, no snapshot yet (events committed before
#: have theirs, or are numbered).
_NEW = (e.snapshot.is_(None), e.seq.is_(None))
_FILL_FROM_ARRAYS = (
    update(order_events)
    .where(e.order_id == _PAIRS.c.order_id, *_NEW)
    .values(snapshot=_PAIRS.c.snapshot)
)
#: One order's new events (its order_id index first: ``seq + 0`` as below).
_FILL_ONE = hot.Hot(
    update(order_events)
    .where(
        e.order_id == bindparam("order_id"),
        e.snapshot.is_(None),
        (e.seq + 0).is_(None),
    )
    .values(snapshot=bindparam("p_snapshot"))
)
_JSON = func.json_each(bindparam("pairs", type_=String)).table_valued("key", "value").alias()
#: SQLite: ``seq + 0`` keeps its planner off the seq index for ``seq IS NULL``. On that index
#: it read every event not numbered yet, each against every pair (a herd's cancels write
#: thousands before the sequencer numbers them: 9 s a batch of 200 with 20,000 waiting, the
#: SQLite herd 20 times slower); so it goes by the order's index, a few rows an order.
_FILL_FROM_JSON = (
    update(order_events)
    .where(
        e.order_id == func.json_extract(_JSON.c.value, "$[0]"),
        e.snapshot.is_(None),
        (e.seq + 0).is_(None),
    )
    .values(snapshot=func.json_extract(_JSON.c.value, "$[1]"))
)


async def _fill(conn: AsyncConnection, order_ids: Sequence[int]) -> None:
    """Build these orders' snapshots and write them on their new events: one UPDATE (by each
    order's place in one array parameter on PostgreSQL and SQLite, a CASE on MySQL)."""
    built = await build(conn, order_ids)
    await _write_fill(conn, {oid: encode(snap) for oid, snap in built.items()})


async def _write_fill(conn: AsyncConnection, texts: Mapping[int, str]) -> None:
    """The UPDATE of :func:`_fill`, given the snapshots' texts by order id."""
    if not texts:
        return
    # The events' traceparent goes in the same UPDATE (while tracing is off, nothing: the
    # statements are the ones built once).
    traceparent = tracing.current_traceparent()
    if len(texts) == 1 and traceparent is None:
        [(order_id, text)] = texts.items()
        await _FILL_ONE.rowcount(conn, order_id=order_id, p_snapshot=text)
        return
    dialect = conn.dialect.name
    if dialect == "postgresql":
        params = {"order_ids": list(texts), "snapshots": list(texts.values())}
        await conn.execute(_traced(_FILL_FROM_ARRAYS, traceparent), params)
    elif dialect == "sqlite":
        pairs = orjson.dumps([[oid, text] for oid, text in texts.items()]).decode()
        await conn.execute(_traced(_FILL_FROM_JSON, traceparent), {"pairs": pairs})
    else:
        fill = (
            update(order_events)
            .where(e.order_id.in_(list(texts)), *_NEW)
            .values(snapshot=case(texts, value=e.order_id))
        )
        await conn.execute(_traced(fill, traceparent))


def _traced(statement: Update, traceparent: str | None) -> Update:
    """``statement`` writing ``traceparent`` on the events too (as it is for None)."""
    return statement if traceparent is None else statement.values(trace_parent=traceparent)
