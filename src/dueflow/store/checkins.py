"""Statements of the door: a ticket checked in once, the ticket as the door sees it, a show's
tickets in seat order.

A check-in is one conditional UPDATE of the ticket (:func:`check_in`): it matches only a valid
ticket not checked in yet, of a show still on sale organized by the caller, of a paid order.
Its row count decides a race between scans of one code: one matches, the others find the
ticket checked in when they wait on its row (PostgreSQL and MariaDB re-read a row a
concurrent UPDATE changed; SQLite runs one writer at a time).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store.schema import orders, seats, shows, tickets, users

VALID = "valid"
ON_SALE = "on_sale"
#: The one status of a tickets order whose tickets let someone in.
PAID = "paid"


async def check_in(
    conn: AsyncConnection,
    code: str,
    *,
    organizer_id: int | None,
    now: datetime,
    gate: str | None,
    by: str,
) -> bool:
    """Check the ticket ``code`` in at ``gate``, by the actor ``by``; True when this statement
    did it. It does nothing (False) for an unknown code, a ticket checked in or void, a show
    cancelled or not ``organizer_id``'s (None: any show's, an admin's), an order not paid."""
    # Correlated: each looks up the one show and the one order of the ticket by their keys.
    show_open = select(shows.c.id).where(shows.c.id == tickets.c.show_id, shows.c.status == ON_SALE)
    if organizer_id is not None:
        show_open = show_open.where(shows.c.organizer_id == organizer_id)
    order_paid = select(orders.c.id).where(
        orders.c.id == tickets.c.order_id, orders.c.status == PAID
    )
    result = await conn.execute(
        update(tickets)
        .where(
            tickets.c.code == code,
            tickets.c.state == VALID,
            tickets.c.checked_in_at.is_(None),
            show_open.exists(),
            order_paid.exists(),
        )
        .values(checked_in_at=now, checked_in_gate=gate, checked_in_by=by)
    )
    return result.rowcount == 1


#: A ticket with what the door decides by: its seat, its show's organizer and status, its
#: order's status, its buyer's name.
_AT_DOOR = (
    select(
        tickets.c.code,
        tickets.c.state,
        tickets.c.show_id,
        tickets.c.order_id,
        tickets.c.checked_in_at,
        tickets.c.checked_in_gate,
        tickets.c.checked_in_by,
        seats.c.label.label("seat"),
        shows.c.organizer_id,
        shows.c.status.label("show_status"),
        orders.c.status.label("order_status"),
        users.c.name.label("buyer"),
    )
    .join(seats, seats.c.id == tickets.c.seat_id)
    .join(shows, shows.c.id == tickets.c.show_id)
    .join(orders, orders.c.id == tickets.c.order_id)
    .join(users, users.c.id == orders.c.buyer_id)
)


async def at_door(conn: AsyncConnection, code: str) -> Any:
    """The ticket ``code`` as the door sees it (:data:`_AT_DOOR`), a row; None when there is
    none."""
    return (await conn.execute(_AT_DOOR.where(tickets.c.code == code))).first()


async def of_show(conn: AsyncConnection, show_id: int) -> list[Any]:
    """Every ticket of the show, in seat order, as the door sees it."""
    query = _AT_DOOR.where(tickets.c.show_id == show_id).order_by(tickets.c.seat_id)
    return list((await conn.execute(query)).all())


async def door_counts(conn: AsyncConnection, show_id: int) -> dict[str, int]:
    """How many of the show's tickets are valid, of them checked in, and void."""
    query = (
        select(tickets.c.state, func.count(), func.count(tickets.c.checked_in_at))
        .where(tickets.c.show_id == show_id)
        .group_by(tickets.c.state)
    )
    found = {"valid": 0, "checked_in": 0, "void": 0}
    for state, count, checked_in in await conn.execute(query):
        found[str(state)] = int(count)
        if state == VALID:
            found["checked_in"] = int(checked_in)
    return found
