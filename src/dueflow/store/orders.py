"""Statements on orders. Every status change goes through :func:`move`: one conditional UPDATE
per (expected status, order type) group, whose row count decides; each order moves where its
flow's transition table sends it."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, NotRequired, TypedDict, Unpack, cast

from sqlalchemy import (
    Column,
    Row,
    String,
    Table,
    bindparam,
    case,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow import tracing
from dueflow.domain import lifecycle
from dueflow.domain.lifecycle import OrderEvent, OrderStatus
from dueflow.store import hot, snapshots, tally
from dueflow.store.schema import order_events, orders
from dueflow.store.types import CENT, UTCDateTime, fit

#: What a move sets besides the status: the same for every order, or per (flow, order type).
Values = Mapping[str, Any] | Callable[[str, str], Mapping[str, Any]]


#: Built once: the values of each call are its parameters.
_INSERT_ORDER = insert(orders)
_INSERT_EVENT = insert(order_events)


async def insert_order(conn: AsyncConnection, **values: Any) -> int:
    """Add an order; returns its id (run hot, with RETURNING, where the dialect has it: every
    placing transaction inserts one)."""
    if conn.dialect.insert_returning:
        statement = hot.inserting(orders, tuple(values), returning=(orders.c.id,))
        return int((await statement.all(conn, [values]))[0][0])
    result = await conn.execute(_INSERT_ORDER, values)
    return int(result.inserted_primary_key[0])  # type: ignore[index]


def as_read(table: Table, values: Mapping[str, Any]) -> dict[str, Any]:
    """The row of ``table`` just written with ``values`` (its id among them) as a read gives it
    back: every column in the table's order, None where nothing was written, datetimes in UTC,
    money to the cent. A new order's view is built from what its transaction wrote."""
    row = {}
    for column in table.c:
        value = values.get(column.name)
        if isinstance(value, datetime):
            value = value.astimezone(UTC)
        elif isinstance(value, Decimal):
            value = value.quantize(CENT)
        row[column.name] = value
    return row


_GET = select(orders).where(orders.c.id == bindparam("order_id"))
_GET_FOR_UPDATE = _GET.with_for_update()


async def get(conn: AsyncConnection, order_id: int, *, for_update: bool = False) -> Row[Any] | None:
    """The order with this id, locked for this transaction when ``for_update``."""
    query = _GET_FOR_UPDATE if for_update else _GET
    return (await conn.execute(query, {"order_id": order_id})).first()


async def many(conn: AsyncConnection, order_ids: Sequence[int]) -> list[Row[Any]]:
    """The orders with these ids."""
    if not order_ids:
        return []
    return list(
        (await conn.execute(select(orders).where(tally.among(conn, orders.c.id, order_ids)))).all()
    )


# What a move hands back: enough to act on the moved orders, nothing that costs conversions.
MOVED_COLUMNS = (
    orders.c.id,
    orders.c.flow,
    orders.c.order_type,
    orders.c.goods_id,
    orders.c.show_id,
    orders.c.buyer_id,
    orders.c.seller_id,
)


def _target(expected: OrderStatus, event: OrderEvent) -> tuple[Any, list[str]]:
    """The new status (a value, or a CASE on the flow when flows disagree) and the flows that
    allow the move."""
    goes = lifecycle.targets(expected, event)
    if len(set(goes.values())) == 1:
        return next(iter(goes.values())).value, list(goes)
    return case({flow: to.value for flow, to in goes.items()}, value=orders.c.flow), list(goes)


async def move(
    conn: AsyncConnection,
    order_ids: Sequence[int],
    *,
    expected: OrderStatus,
    event: OrderEvent,
    now: datetime,
    values: Values | None = None,
    due: Column[Any] | None = None,
) -> list[Row[Any]]:
    """Move the orders that are still ``expected`` (and, with ``due``, whose deadline has come)
    by ``event``, each where its flow sends it; orders of flows that refuse the event stay.

    Returns the moved orders (id, flow, order_type, goods_id, show_id, buyer_id, seller_id).
    Orders in any other status are left alone: the caller learns who won from what is returned.
    """
    if not order_ids:
        return []
    plain = {} if values is None else values
    one = len(order_ids) == 1 and due is None and conn.dialect.update_returning
    if one and not callable(plain):
        return await _move_one(conn, order_ids[0], expected, event, now, plain)
    to, flows = _target(expected, event)
    if not flows:
        return []
    guard = [
        tally.among(conn, orders.c.id, order_ids),
        orders.c.status == expected.value,
        orders.c.flow.in_(flows),
    ]
    if due is not None:
        guard.append(due <= now)
    if not callable(values) and conn.dialect.update_returning:
        # One statement: the conditional UPDATE itself says which rows it moved.
        result = await conn.execute(
            update(orders)
            .where(*guard)
            .values(status=to, updated_at=now, **(values or {}))
            .returning(*MOVED_COLUMNS)
        )
        moved: list[Any] = list(result.all())
        return moved
    rows: list[Any] = list(
        (await conn.execute(select(*MOVED_COLUMNS).where(*guard).with_for_update())).all()
    )
    by_type: dict[tuple[str, str], list[int]] = defaultdict(list)
    for row in rows:
        by_type[(row.flow, row.order_type)].append(row.id)
    for (flow, order_type), ids in by_type.items():
        extra = values(flow, order_type) if callable(values) else (values or {})
        result = await conn.execute(
            update(orders)
            .where(tally.among(conn, orders.c.id, ids), orders.c.status == expected.value)
            .values(status=to, updated_at=now, **extra)
        )
        if result.rowcount != len(ids):  # impossible while the rows are locked
            raise RuntimeError(f"orders {ids} changed under a lock")
    return rows


async def _move_one(
    conn: AsyncConnection,
    order_id: int,
    expected: OrderStatus,
    event: OrderEvent,
    now: datetime,
    values: Mapping[str, Any],
) -> list[Row[Any]]:
    """:func:`move` of one order (a payment's confirm, a buyer's cancel): the same
    ``UPDATE ... RETURNING``, compiled once and run hot."""
    statement = _one_move(expected, event, tuple(sorted(values)))
    if statement is None:
        return []
    params = {f"p_{name}": value for name, value in values.items()}
    moved = await statement.all(conn, p_id=order_id, p_now=now, **params)
    # Hot rows read as Rows do (columns as attributes).
    return cast(list[Row[Any]], moved)


_ONE_MOVES: dict[tuple[OrderStatus, OrderEvent, tuple[str, ...]], hot.Hot | None] = {}


def _one_move(expected: OrderStatus, event: OrderEvent, names: tuple[str, ...]) -> hot.Hot | None:
    """The hot statement of :func:`_move_one` (one per move and set of values, kept; None
    when no flow allows the move): its values are the parameters ``p_<column>``."""
    key = (expected, event, names)
    if key in _ONE_MOVES:
        return _ONE_MOVES[key]
    to, flows = _target(expected, event)
    found = None
    if flows:
        statement = (
            update(orders)
            .where(
                orders.c.id == bindparam("p_id"),
                orders.c.status == expected.value,
                # No IN list: a hot statement has one shape.
                or_(*(orders.c.flow == flow for flow in flows)),
            )
            .values(
                status=to,
                updated_at=bindparam("p_now", type_=orders.c.updated_at.type),
                **{name: bindparam(f"p_{name}", type_=orders.c[name].type) for name in names},
            )
            .returning(*MOVED_COLUMNS)
        )
        found = hot.Hot(statement)
    _ONE_MOVES[key] = found
    return found


def moved_to(
    rows: Sequence[Row[Any]], expected: OrderStatus, event: OrderEvent
) -> dict[OrderStatus, list[Row[Any]]]:
    """Moved rows grouped by the status each one's flow moved it to."""
    groups: dict[OrderStatus, list[Row[Any]]] = defaultdict(list)
    for row in rows:
        groups[lifecycle.lifecycle(row.flow).next_status(expected, event)].append(row)
    return groups


class EventFields(TypedDict):
    """What a timeline entry says: the event, who made it and when, the status move, a text
    for people (``detail``) and the envelope's ``data``."""

    event: str
    actor: str
    now: datetime
    from_status: NotRequired[OrderStatus | None]
    to_status: NotRequired[OrderStatus | None]
    detail: NotRequired[str | None]
    data: NotRequired[Mapping[str, Any] | None]


async def record_events(
    conn: AsyncConnection, rows: Sequence[Row[Any]] | Sequence[int], **fields: Unpack[EventFields]
) -> None:
    """Append one timeline entry per order, each with ``data`` (the envelope's, structured);
    texts longer than their columns are cut (a provider's message in ``detail`` must not fail
    the write it is part of). The orders' snapshots are filled last in the transaction."""
    if not rows:
        return
    await snapshots.write_deferred(conn)  # events recorded before come first
    ids = [r if isinstance(r, int) else r.id for r in rows]
    if len(ids) == 1:
        await add_event(conn, ids[0], **fields)
        return
    event = fit(order_events.c.event, fields["event"]) or ""
    actor = fit(order_events.c.actor, fields["actor"]) or ""
    detail = fit(order_events.c.detail, fields.get("detail"))
    now, data = fields["now"], fields.get("data")
    from_status, to_status = fields.get("from_status"), fields.get("to_status")
    text = None if data is None else snapshots.encode(data)
    # One INSERT ... SELECT for a batch: no per-row parameters to build.
    entries = select(
        orders.c.id,
        literal(now, UTCDateTime),
        literal(event, String),
        literal(actor, String),
        literal(from_status.value if from_status else None, String),
        literal(to_status.value if to_status else None, String),
        literal(detail, String),
        literal(text, String),
    ).where(tally.among(conn, orders.c.id, ids))
    await conn.execute(
        insert(order_events).from_select(
            ["order_id", "at", "event", "actor", "from_status", "to_status", "detail", "data"],
            entries,
        )
    )
    await snapshots.fill_now(conn, ids)


async def add_event(
    conn: AsyncConnection,
    order_id: int,
    *,
    snapshot: Mapping[str, Any] | None = None,
    **fields: Unpack[EventFields],
) -> dict[str, Any]:
    """Append one timeline entry (texts cut to their columns, as :func:`record_events`) with
    its ``data`` and the order's ``snapshot`` (given: placing knows its order whole; else
    filled last in the transaction); returns it as :func:`timeline` reads it (not yet
    numbered: ``seq`` is None)."""
    await snapshots.write_deferred(conn)  # events recorded before come first
    from_status, to_status = fields.get("from_status"), fields.get("to_status")
    data = fields.get("data")
    values = {
        "order_id": order_id,
        "at": fields["now"],
        "event": fit(order_events.c.event, fields["event"]) or "",
        "actor": fit(order_events.c.actor, fields["actor"]) or "",
        "from_status": from_status.value if from_status else None,
        "to_status": to_status.value if to_status else None,
        "detail": fit(order_events.c.detail, fields.get("detail")),
        "data": None if data is None else snapshots.encode(data),
        "snapshot": None if snapshot is None else snapshots.encode(snapshot),
    }
    traceparent = tracing.current_traceparent()
    if traceparent is not None:  # without it the INSERT is the same as before tracing
        values["trace_parent"] = traceparent
    if conn.dialect.insert_returning:
        # Run hot: every placing and paying transaction writes one event.
        statement = hot.inserting(order_events, tuple(values), returning=(order_events.c.id,))
        event_id = (await statement.all(conn, [values]))[0][0]
    else:
        result = await conn.execute(_INSERT_EVENT, values)
        event_id = result.inserted_primary_key[0]  # type: ignore[index]
    if snapshot is None:
        await snapshots.fill_now(conn, [order_id])
    values["id"] = int(event_id)
    read = as_read(order_events, values)
    return {name: read[name] for name in TIMELINE_COLUMNS}


#: What a timeline shows of each event: all but its envelope's data, order snapshot and
#: traceparent.
TIMELINE_COLUMNS = tuple(
    c.name for c in order_events.c if c.name not in ("data", "snapshot", "trace_parent")
)
_TIMELINE = (
    select(*(order_events.c[name] for name in TIMELINE_COLUMNS))
    .where(order_events.c.order_id == bindparam("order_id"))
    .order_by(order_events.c.at, order_events.c.id)
)


async def timeline(conn: AsyncConnection, order_id: int) -> list[Row[Any]]:
    """The order's events, oldest first (those recorded for the end of this transaction
    written first)."""
    await snapshots.write_deferred(conn)
    return list((await conn.execute(_TIMELINE, {"order_id": order_id})).all())


async def count_by_status(conn: AsyncConnection) -> dict[str, int]:
    """How many orders are in each status."""
    query = select(orders.c.status, func.count()).group_by(orders.c.status)
    return {status: count for status, count in (await conn.execute(query)).all()}
