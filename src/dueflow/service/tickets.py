"""Tickets: shows and their seats, orders that hold seats, and the organizer's cancel.

A tickets order holds 1..limit seats of one show, all or none, in one transaction; the unique
key on live seat holds is the last word on every sale (the seat cache only pre-checks). The
organizer's cancel marks the show cancelled and schedules a ``show_cancel`` timer for each of
its live orders in the same transaction: the worker cancels them (refunds the paid ones), and a
process that dies halfway leaves timers that the next one takes up.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import and_, select
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain import seating, times
from dueflow.domain.lifecycle import OrderStatus
from dueflow.domain.timers import TimerKind
from dueflow.exceptions import (
    InvalidInput,
    InvalidTransition,
    NotAllowed,
    NotFound,
    SalesClosed,
    SeatUnavailable,
)
from dueflow.service import actors
from dueflow.service import orders as order_service
from dueflow.service.deps import Deps
from dueflow.store import holds, idempotency, orders, shows, timers, users
from dueflow.store.schema import orders as t_orders
from dueflow.store.schema import seat_holds as t_seat_holds
from dueflow.store.schema import seats as t_seats
from dueflow.store.schema import users as t_users

log = logging.getLogger(__name__)
S = OrderStatus
TICKET_ORDER_TYPE = "ticket"
#: Statuses of a tickets order that still hold seats.
LIVE = (S.PENDING_PAYMENT.value, S.PAID.value)
#: Where a show's sales stand (:func:`sales`).
OPEN, CLOSED, STARTED, CANCELLED = "open", "closed", "started", "cancelled"
#: The buyers' seat-map state of a seat no order holds at a show that sells no more.
NOT_FOR_SALE = "not_for_sale"


async def create_show(
    deps: Deps,
    *,
    organizer_id: int,
    title: str,
    venue: str,
    starts_at: datetime,
    sales_close_at: datetime,
    seat_limit: int,
    seats: Sequence[seating.SeatSpec],
) -> int:
    """Put a show on sale with its seats; returns its id.

    Raises:
        InvalidInput: a bad title, venue, time or limit, or a bad seat map.
        NotFound: no such organizer.
    """
    title, venue = _text(title, "title"), _text(venue, "venue")
    starts_at = times.storable(starts_at, "starts_at")
    sales_close_at = times.storable(sales_close_at, "sales_close_at")
    if sales_close_at > starts_at:
        raise InvalidInput("sales close at or before the show starts", field="sales_close_at")
    now = deps.clock.now()
    if sales_close_at <= now:
        raise InvalidInput(
            "sales would close before they open: sales_close_at is in the past",
            field="sales_close_at",
        )
    if isinstance(seat_limit, bool) or not 1 <= seat_limit <= seating.MAX_SEAT_LIMIT:
        raise InvalidInput(
            f"a seat limit is 1 to {seating.MAX_SEAT_LIMIT} seats a buyer", field="seat_limit"
        )
    seating.check_seats(seats)
    async with deps.db.write() as conn:
        if await users.by_id(conn, organizer_id) is None:
            raise NotFound(f"no user {organizer_id}")
        show_id = await shows.insert_show(
            conn,
            organizer_id=organizer_id,
            title=title,
            venue=venue,
            starts_at=starts_at,
            sales_close_at=sales_close_at,
            seat_limit=seat_limit,
            created_at=now,
            updated_at=now,
        )
        await shows.insert_seats(
            conn,
            show_id,
            [
                {
                    "label": s.label,
                    "section": s.section,
                    "row": s.row,
                    "number": s.number,
                    "tier": s.tier,
                    "price": s.price,
                }
                for s in seats
            ],
        )
    return show_id


def _text(value: str, what: str) -> str:
    if not isinstance(value, str) or not 1 <= len(value.strip()) <= 200:
        raise InvalidInput(f"a show's {what} is 1-200 characters", field=what)
    return value.strip()


async def show_view(deps: Deps, show_id: int) -> dict[str, Any]:
    """The show, where its sales stand (:func:`sales`) and how many of its seats are free,
    held and sold."""
    async with deps.db.read() as conn:
        show = await shows.get(conn, show_id)
        if show is None:
            raise NotFound(f"no show {show_id}")
        view = dict(show._mapping)
        view["seats"] = await shows.counts(conn, show_id)
    view["sales"] = sales(show, deps.clock.now())
    return view


async def seat_map(deps: Deps, show_id: int) -> list[dict[str, Any]]:
    """Every seat of the show with its hold state (free, held, sold) and the order holding it.
    With a seat cache the states come from it; the database answers when the cache does not
    have the show, and the cache is loaded from that answer."""
    return (await _seat_map(deps, show_id))[1]


async def buyers_seat_map(deps: Deps, show_id: int) -> dict[str, Any]:
    """The seat map as anyone signed in reads it: where the show's sales stand (:func:`sales`)
    and every seat's state, where a seat no order holds is ``free`` only while sales are open
    (``not_for_sale`` once the show is cancelled, started or its sales closed). Which order
    holds a seat is the parties' business and is not said."""
    show, seats = await _seat_map(deps, show_id)
    now_selling = sales(show, deps.clock.now())
    for seat in seats:
        del seat["order_id"]
        if now_selling != OPEN and seat["state"] == shows.FREE:
            seat["state"] = NOT_FOR_SALE
    return {"show_id": show_id, "sales": now_selling, "seats": seats}


async def _seat_map(deps: Deps, show_id: int) -> tuple[Any, list[dict[str, Any]]]:
    cached = await deps.seat_cache.states(show_id)
    async with deps.db.read() as conn:
        show = await shows.get(conn, show_id)
        if show is None:
            raise NotFound(f"no show {show_id}")
        rows = await shows.seat_map(conn, show_id)
    if cached is None:
        # The rows are read anyway: loading them costs one script and warms the cache at once
        # after a restart or FLUSHALL (the pre-check and the next seat maps use it) instead of
        # at the reconciler's next pass. A move committed meanwhile may be overwritten; that
        # pass sets it right. Without a cache, or with Redis away, this does nothing.
        await deps.seat_cache.load(show_id, {r.label: r.state for r in rows if r.state})
    return show, [
        {
            "label": r.label,
            "section": r.section,
            "row": r.row,
            "number": r.number,
            "tier": r.tier,
            "price": r.price,
            "state": cached.get(r.label, shows.FREE)
            if cached is not None
            else r.state or shows.FREE,
            # Which order holds the seat is the database's to say (the cache has states only).
            "order_id": r.order_id,
        }
        for r in rows
    ]


async def show_orders(deps: Deps, show_id: int, limit: int = 500) -> list[dict[str, Any]]:
    """The show's newest ``limit`` orders, newest first: id, buyer (id and name), status,
    amount, created_at and the labels of the seats each holds or held (two statements)."""
    query = (
        select(
            t_orders.c.id,
            t_orders.c.buyer_id,
            t_users.c.name.label("buyer"),
            t_orders.c.status,
            t_orders.c.amount,
            t_orders.c.created_at,
        )
        .join(t_users, t_users.c.id == t_orders.c.buyer_id)
        .where(t_orders.c.show_id == show_id)
        .order_by(t_orders.c.id.desc())
        .limit(limit)
    )
    async with deps.db.read() as conn:
        found = [dict(r._mapping) for r in await conn.execute(query)]
        lines = await holds.lines_of(conn, [order["id"] for order in found])
    for order in found:
        order["seats"] = [line.label for line in lines[order["id"]] if line.kind == "seat"]
    return found


#: The seats asked for, each with its hold if it has one (held or sold), in one read.
_SEATS_AND_HOLDS = select(
    t_seats.c.id, t_seats.c.label, t_seats.c.price, t_seat_holds.c.seat_id.label("held")
).outerjoin(
    t_seat_holds,
    and_(t_seat_holds.c.show_id == t_seats.c.show_id, t_seat_holds.c.seat_id == t_seats.c.id),
)


async def place_ticket_order(
    deps: Deps,
    *,
    buyer_id: int,
    show_id: int,
    labels: Sequence[str],
    view: bool = True,
    key: idempotency.Key | None = None,
    buyer_known: bool = False,
) -> dict[str, Any]:
    """Hold every seat named for a new ``ticket`` order, or none; answers the new order's view
    (only its id without ``view``). ``buyer_known``: the caller has just read the buyer
    (authenticated them), so placing does not read it again.

    Raises:
        InvalidInput: no seats, a repeat, a label that is not one.
        InvalidInput: (also) a seat the show does not have.
        NotFound: no such show or buyer.
        NotAllowed: the organizer buys at their own show.
        SalesClosed: sales closed, the show started or was cancelled.
        SeatUnavailable: a seat is held or sold (named).
        SeatLimitExceeded: past the show's per-buyer limit (counting what the buyer holds).
    """
    if not isinstance(labels, list | tuple) or not all(isinstance(x, str) for x in labels):
        raise InvalidInput("seats: a list of seat labels", field="seats")
    wanted = seating.check_request(labels, seating.MAX_SEAT_LIMIT)
    deps.policy.durations(TICKET_ORDER_TYPE)
    taken = await deps.seat_cache.taken(show_id, wanted)
    if taken:
        # The cache is sure enough to refuse (a wrong "taken" is repaired by the reconciler
        # within its interval); it never says yes: the database decides every hold.
        raise SeatUnavailable(f"seats taken: {', '.join(sorted(taken))}")
    placed, armed = await _place(deps, buyer_id, show_id, wanted, key, buyer_known)
    await deps.arm(armed)
    return placed if view else {"id": placed["id"]}


async def _place(
    deps: Deps,
    buyer_id: int,
    show_id: int,
    wanted: list[str],
    key: idempotency.Key | None,
    buyer_known: bool,
) -> tuple[dict[str, Any], list[timers.Armed]]:
    now = deps.clock.now()
    async with deps.db.write() as conn:
        # Shared: orders of one show are placed side by side, never beside its cancel.
        show = await shows.get(conn, show_id, lock="share")
        if show is None:
            raise NotFound(f"no show {show_id}")
        _check_open(show, now)
        seating.check_request(wanted, show.seat_limit)
        if show.organizer_id == buyer_id:
            raise NotAllowed("you cannot buy seats at your own show")
        if not buyer_known:
            await order_service.known_buyer(conn, buyer_id)
        query = _SEATS_AND_HOLDS.where(t_seats.c.show_id == show_id, t_seats.c.label.in_(wanted))
        found = {s.label: s for s in await conn.execute(query)}
        missing = [label for label in wanted if label not in found]
        if missing:
            raise InvalidInput(f"show {show_id} has no seat {', '.join(missing)}", field="seats")
        # Refused before anything is written: a rush is mostly refusals, so they stay reads.
        # (A hold committed since is found by the unique key at the insert.)
        taken = [label for label in wanted if found[label].held is not None]
        if taken:
            raise SeatUnavailable(f"seats taken: {', '.join(taken)}")
        await shows.count_seats(
            conn,
            show_id=show_id,
            buyer_id=buyer_id,
            seats_wanted=len(wanted),
            limit=show.seat_limit,
        )
        lines = [
            holds.Line(kind="seat", item_id=found[label].id, label=label, price=found[label].price)
            for label in wanted
        ]
        amount = sum((line.price for line in lines), start=Decimal(0))
        order = await order_service.insert_placed(
            conn,
            deps,
            flow="tickets",
            order_type=TICKET_ORDER_TYPE,
            buyer_id=buyer_id,
            seller_id=show.organizer_id,
            amount=amount,
            lines=lines,
            now=now,
            show_id=show_id,
        )
        holder = holds.Holder(order["id"], buyer_id, show_id)
        await deps.holds.of("seat").hold(conn, holder, lines, now)
        return await order_service.finish_placing(
            conn,
            deps,
            order,
            lines,
            key,
            now=now,
            detail=f"show {show_id} seats {', '.join(wanted)} for {amount}",
        )


def sales(show: Any, now: datetime) -> str:
    """Where the show's sales stand at ``now``: ``open``, or why they are not: ``cancelled`` (by
    its organizer), ``started`` (past ``starts_at``), ``closed`` (past ``sales_close_at``).
    Placing refuses every state but ``open``; the seat map says it."""
    if show.status != shows.ON_SALE:
        return CANCELLED
    if now >= show.starts_at:
        return STARTED
    if now >= show.sales_close_at:
        return CLOSED
    return OPEN


def _check_open(show: Any, now: datetime) -> None:
    state = sales(show, now)
    if state == CANCELLED:
        raise SalesClosed(f"show {show.id} was cancelled")
    if state == STARTED:
        raise SalesClosed(f"show {show.id} has started")
    if state == CLOSED:
        raise SalesClosed(f"sales for show {show.id} closed at {show.sales_close_at.isoformat()}")


async def cancel_show(deps: Deps, *, show_id: int, user_id: int) -> int:
    """The organizer cancels the show: no order is taken from now on, and each live order gets
    a ``show_cancel`` timer, in this one transaction; the worker cancels the orders (closing
    open trades first, refunding paid ones). Returns how many orders will be cancelled.

    Raises:
        NotFound: no such show.
        NotAllowed: the caller is not its organizer.
        InvalidTransition: (a 409) the show is already cancelled.
    """
    now = deps.clock.now()
    async with deps.db.write() as conn:
        show = await shows.get(conn, show_id, lock="update")
        if show is None:
            raise NotFound(f"no show {show_id}")
        if show.organizer_id != user_id:
            raise NotAllowed(f"only the organizer of show {show_id} may cancel it")
        if not await shows.mark_cancelled(conn, show_id, now):
            raise InvalidTransition(f"show {show_id} is already cancelled", status=show.status)
        live = await _live_orders(conn, show_id)
        armed = await timers.schedule(
            conn, [timers.NewTimer(oid, TimerKind.SHOW_CANCEL, now) for oid in live], now
        )
        await orders.record_events(
            conn,
            live,
            event="show_cancelled",
            actor=actors.user(user_id),
            now=now,
            detail=f"show {show_id} cancelled by its organizer",
            data={"show_id": show_id},
        )
    await deps.arm(armed)
    return len(live)


async def _live_orders(conn: AsyncConnection, show_id: int) -> list[int]:
    query = (
        select(t_orders.c.id)
        .where(t_orders.c.show_id == show_id, t_orders.c.status.in_(LIVE))
        .order_by(t_orders.c.id)
    )
    return [int(r[0]) for r in (await conn.execute(query)).all()]
