"""Statements on shows, their seats, seat holds, per-buyer counts and tickets.

A seat is held or sold by a row of ``seat_holds``; the unique key (show, seat) is what keeps a
seat from being held by two live orders. Letting a seat go deletes its row.
"""

from __future__ import annotations

import secrets
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict, Unpack

from sqlalchemy import Row, Table, and_, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.exceptions import SeatLimitExceeded, SeatUnavailable
from dueflow.store import _rows, tally
from dueflow.store.schema import seat_holds, seats, show_buyers, shows, tickets

ON_SALE = "on_sale"
CANCELLED = "cancelled"
HELD = "held"
SOLD = "sold"
FREE = "free"
VALID = "valid"
VOID = "void"


@dataclass(frozen=True)
class SeatMove:
    """Seats of one show (by label) that moved from one state to another (for the seat
    cache)."""

    show_id: int
    labels: tuple[str, ...]
    before: str
    after: str


class NewShow(TypedDict):
    """A new show's columns as its organizer gives them."""

    organizer_id: int
    title: str
    venue: str
    starts_at: datetime
    sales_close_at: datetime
    seat_limit: int
    created_at: datetime
    updated_at: datetime


async def insert_show(conn: AsyncConnection, **show: Unpack[NewShow]) -> int:
    """Add a show (on sale); returns its id."""
    return await _rows.add(conn, shows, show, status=ON_SALE)


async def insert_seats(
    conn: AsyncConnection, show_id: int, rows: Sequence[Mapping[str, Any]]
) -> None:
    """Add the show's seats (label, section, row, number, tier, price each)."""
    await conn.execute(insert(seats), [{"show_id": show_id, **row} for row in rows])


async def get(conn: AsyncConnection, show_id: int, *, lock: str | None = None) -> Row[Any] | None:
    """The show; ``lock``: ``"share"`` (placing: the show cannot be cancelled meanwhile) or
    ``"update"`` (cancelling: no order is placed meanwhile)."""
    query = select(shows).where(shows.c.id == show_id)
    if lock is not None:
        query = query.with_for_update(read=lock == "share")
    return (await conn.execute(query)).first()


async def seats_by_label(conn: AsyncConnection, show_id: int, labels: Sequence[str]) -> list[Any]:
    """The show's seats with these labels."""
    query = select(seats).where(seats.c.show_id == show_id, seats.c.label.in_(labels))
    return list((await conn.execute(query)).all())


async def seat_map(conn: AsyncConnection, show_id: int) -> list[Any]:
    """Every seat of the show with its hold (state, order_id; both NULL when free), in seat
    order."""
    query = (
        select(
            seats.c.id,
            seats.c.label,
            seats.c.section,
            seats.c.row,
            seats.c.number,
            seats.c.tier,
            seats.c.price,
            seat_holds.c.state,
            seat_holds.c.order_id,
        )
        .select_from(seats.outerjoin(seat_holds, seat_holds.c.seat_id == seats.c.id))
        .where(seats.c.show_id == show_id)
        .order_by(seats.c.id)
    )
    return list((await conn.execute(query)).all())


async def hold_states(conn: AsyncConnection, show_id: int) -> dict[str, str]:
    """Seat label -> held | sold for every seat of the show that is not free (the reconciler's
    truth)."""
    query = (
        select(seats.c.label, seat_holds.c.state)
        .join(seats, seats.c.id == seat_holds.c.seat_id)
        .where(seat_holds.c.show_id == show_id)
    )
    return {str(label): str(state) for label, state in (await conn.execute(query)).all()}


async def taken_among(conn: AsyncConnection, seat_ids: Sequence[int]) -> list[int]:
    """The seats among these that are held or sold (committed: a hold in flight is found by
    the unique key at the insert)."""
    query = select(seat_holds.c.seat_id).where(seat_holds.c.seat_id.in_(seat_ids))
    return [int(r[0]) for r in (await conn.execute(query)).all()]


async def count_seats(
    conn: AsyncConnection, *, show_id: int, buyer_id: int, seats_wanted: int, limit: int
) -> None:
    """Count ``seats_wanted`` more seats against the buyer's limit for the show: one guarded
    update of the buyer's row (:func:`dueflow.store.tally.count_against`), which locks it until
    the placing transaction ends, so two parallel orders of one buyer are counted one after the
    other.

    Raises:
        SeatLimitExceeded: the buyer would hold or own more than ``limit`` seats of the show.
    """
    key = {"show_id": show_id, "buyer_id": buyer_id}
    counted = await tally.count_against(conn, show_buyers, key, "seats", seats_wanted, limit)
    if counted is None:
        return
    raise SeatLimitExceeded(
        f"show {show_id} allows {limit} seats a buyer; you hold or bought {counted}"
        f" and asked for {seats_wanted} more"
    )


async def hold_seats(
    conn: AsyncConnection,
    *,
    show_id: int,
    order_id: int,
    buyer_id: int,
    seat_rows: Sequence[Any],
    now: datetime,
) -> None:
    """Hold every seat for the order, in seat-id order (two overlapping orders wait on each
    other in one order, never in a cycle), or none.

    Raises:
        SeatUnavailable: a seat is held or sold (the unique key decides a race).
    """
    ordered = sorted(seat_rows, key=lambda s: s.id)
    try:
        await conn.execute(
            insert(seat_holds),
            [
                {
                    "show_id": show_id,
                    "seat_id": s.id,
                    "order_id": order_id,
                    "buyer_id": buyer_id,
                    "state": HELD,
                    "created_at": now,
                    "updated_at": now,
                }
                for s in ordered
            ],
        )
    except IntegrityError:
        # Another order took one of them between the check and the insert.
        names = ", ".join(s.label for s in ordered)
        raise SeatUnavailable(f"one of the seats {names} was just taken by another order") from None


async def _holds_of(conn: AsyncConnection, order_ids: Sequence[int], state: str) -> list[Any]:
    query = (
        select(
            seat_holds.c.show_id,
            seat_holds.c.seat_id,
            seat_holds.c.buyer_id,
            seat_holds.c.order_id,
            seats.c.label,
        )
        .join(seats, seats.c.id == seat_holds.c.seat_id)
        .where(seat_holds.c.order_id.in_(order_ids), seat_holds.c.state == state)
    )
    return list((await conn.execute(query)).all())


async def _let_go(conn: AsyncConnection, rows: Sequence[Any], state: str) -> list[SeatMove]:
    """Give each buyer's count back, then delete these hold rows. Counts first: a placement
    counts its buyer's seats before it inserts its holds, so both take the buyer's row before
    the seats and never wait on each other in a cycle; the counts are set-based, locked in key
    order (:func:`dueflow.store.tally.uncount`)."""
    if not rows:
        return []
    per_buyer: dict[tally.Key, int] = defaultdict(int)
    per_show: dict[int, list[str]] = defaultdict(list)
    for r in rows:
        per_buyer[(r.show_id, r.buyer_id)] += 1
        per_show[r.show_id].append(r.label)
    await tally.uncount(conn, show_buyers, ("show_id", "buyer_id"), "seats", per_buyer)
    await conn.execute(
        delete(seat_holds).where(
            seat_holds.c.seat_id.in_([r.seat_id for r in rows]), seat_holds.c.state == state
        )
    )
    return [SeatMove(s, tuple(sorted(labels)), state, FREE) for s, labels in per_show.items()]


async def release_seats(conn: AsyncConnection, order_ids: Sequence[int]) -> list[SeatMove]:
    """Let go of the seats these cancelled unpaid orders held."""
    if not order_ids:
        return []
    return await _let_go(conn, await _holds_of(conn, order_ids, HELD), HELD)


async def sell_seats(
    conn: AsyncConnection, order_ids: Sequence[int], now: datetime
) -> list[SeatMove]:
    """Mark sold the seats these paid orders held and issue a ticket per seat."""
    if not order_ids:
        return []
    rows = await _holds_of(conn, order_ids, HELD)
    if not rows:
        return []
    await _move_rows(conn, seat_holds, order_ids, HELD, state=SOLD, updated_at=now)
    await conn.execute(
        insert(tickets),
        [
            {
                "code": new_code(),
                "order_id": r.order_id,
                "show_id": r.show_id,
                "seat_id": r.seat_id,
                "state": VALID,
                "created_at": now,
            }
            for r in sorted(rows, key=lambda r: r.seat_id)
        ],
    )
    per_show: dict[int, list[str]] = defaultdict(list)
    for r in rows:
        per_show[r.show_id].append(r.label)
    return [SeatMove(s, tuple(sorted(labels)), HELD, SOLD) for s, labels in per_show.items()]


async def void_seats(
    conn: AsyncConnection, order_ids: Sequence[int], now: datetime
) -> list[SeatMove]:
    """The show of these paid orders is off: their tickets are void, their seats let go."""
    if not order_ids:
        return []
    await _move_rows(conn, tickets, order_ids, VALID, state=VOID, voided_at=now)
    return await _let_go(conn, await _holds_of(conn, order_ids, SOLD), SOLD)


async def _move_rows(
    conn: AsyncConnection, table: Table, order_ids: Sequence[int], expected: str, **values: Any
) -> None:
    """One guarded update of these orders' rows of ``table`` (seat holds or tickets) that are
    still ``expected``."""
    await conn.execute(
        update(table)
        .where(table.c.order_id.in_(order_ids), table.c.state == expected)
        .values(**values)
    )


def new_code() -> str:
    """An unguessable ticket code: 128 random bits, 22 URL-safe characters."""
    return secrets.token_urlsafe(16)


async def tickets_for(conn: AsyncConnection, order_id: int) -> list[Any]:
    """The order's tickets with their seat labels, in seat order."""
    query = (
        select(
            tickets.c.code,
            tickets.c.state,
            tickets.c.seat_id,
            tickets.c.checked_in_at,
            tickets.c.checked_in_gate,
            seats.c.label,
        )
        .join(seats, seats.c.id == tickets.c.seat_id)
        .where(tickets.c.order_id == order_id)
        .order_by(tickets.c.seat_id)
    )
    return list((await conn.execute(query)).all())


async def counts(conn: AsyncConnection, show_id: int) -> dict[str, int]:
    """How many seats of the show are free, held and sold."""
    total = await conn.scalar(select(func.count()).where(seats.c.show_id == show_id)) or 0
    query = (
        select(seat_holds.c.state, func.count())
        .where(seat_holds.c.show_id == show_id)
        .group_by(seat_holds.c.state)
    )
    by_state = {str(state): int(n) for state, n in (await conn.execute(query)).all()}
    held, sold = by_state.get(HELD, 0), by_state.get(SOLD, 0)
    return {FREE: int(total) - held - sold, HELD: held, SOLD: sold}


async def mark_cancelled(conn: AsyncConnection, show_id: int, now: datetime) -> bool:
    """on_sale -> cancelled; False when the show was already cancelled."""
    result = await conn.execute(
        update(shows)
        .where(and_(shows.c.id == show_id, shows.c.status == ON_SALE))
        .values(status=CANCELLED, cancelled_at=now, updated_at=now)
    )
    return result.rowcount == 1
