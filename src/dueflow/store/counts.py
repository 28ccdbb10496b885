"""Orders by status without counting every order on each look.

A live order (awaiting payment, shipment, receipt, a review; a paid ticket) is counted where it
is, one range of ``ix_orders_status`` per status: there are as many as the business has in
flight, not a million. An order in a final status (completed, cancelled) never leaves it, so
those are kept in ``order_counts`` up to a watermark (``upto``), and a look adds the orders that
reached a final status after it (a range of ``ix_orders_updated_at``: every move sets
``updated_at``). :func:`catch_up` moves the watermark, adding the orders of the window between
the old and the new one: each order in a final status is added once, in the window of its last
move. The watermark stays :data:`MARGIN` behind the clock, so a move that committed late (its
``updated_at`` is its transaction's clock, read before the commit) is still ahead of it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnClause, func, insert, literal_column, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain.lifecycle import FINAL_STATUSES, OrderStatus
from dueflow.domain.timers import TimerState
from dueflow.store.schema import order_counts, orders, timers

FINAL = sorted(status.value for status in FINAL_STATUSES)
LIVE = sorted(status.value for status in OrderStatus if status not in FINAL_STATUSES)
#: How far the watermark stays behind the clock: longer than any write transaction, and than
#: the clocks of two processes differ.
MARGIN = timedelta(minutes=5)
_TIMERS_LIVE = (TimerState.SCHEDULED, TimerState.CLAIMED)
_TIMERS_PARKED = (TimerState.PARKED,)
#: How often the watermark moves (each move adds one window of final orders).
EVERY = timedelta(minutes=1)


async def _grouped(conn: AsyncConnection, *where: Any) -> dict[str, int]:
    query = select(orders.c.status, func.count()).where(*where).group_by(orders.c.status)
    return {str(status): int(n) for status, n in (await conn.execute(query)).all()}


async def count_by_status(conn: AsyncConnection) -> dict[str, int]:
    """How many orders are in each status (those with any): the live ones counted, the final
    ones kept up to the watermark plus those that moved after it."""
    found = await _grouped(conn, orders.c.status.in_(LIVE))
    kept, upto = _kept(list(await conn.execute(select(order_counts))))
    since = [] if upto is None else [orders.c.updated_at > upto]
    fresh = await _grouped(conn, orders.c.status.in_(FINAL), *since)
    for status in FINAL:
        n = fresh.get(status, 0) + kept.get(status, 0)
        if n:
            found[status] = n
    return found


def _kept(rows: list[Any]) -> tuple[dict[str, int], datetime | None]:
    """The kept counts and their watermark; none (count from the start) unless every final
    status has its row (a status new to the code is counted from the start, once)."""
    if {row.status for row in rows} != set(FINAL):
        return {}, None
    return {row.status: int(row.orders) for row in rows}, min(row.upto for row in rows)


async def count_all(conn: AsyncConnection) -> dict[str, int]:
    """How many orders are in each status, every order counted (``dueflow status --full``)."""
    return await _grouped(conn)


async def due(conn: AsyncConnection, now: datetime) -> bool:
    """Whether the watermark is :data:`EVERY` behind where :func:`catch_up` would move it."""
    _, upto = _kept(list(await conn.execute(select(order_counts))))
    return upto is None or now - MARGIN - upto >= EVERY


async def catch_up(conn: AsyncConnection, now: datetime) -> bool:
    """In a write transaction: move the watermark to ``now`` - :data:`MARGIN` when it is
    :data:`EVERY` behind that, adding the orders that reached a final status in between; the
    rows are locked first, so two processes catching up at once add each window once. False:
    not due yet."""
    to = now - MARGIN
    rows = list(await conn.execute(select(order_counts).with_for_update()))
    kept, upto = _kept(rows)
    if upto is not None and to - upto < EVERY:
        return False
    window = [orders.c.status.in_(FINAL), orders.c.updated_at <= to]
    if upto is not None:
        window.append(orders.c.updated_at > upto)
    added = await _grouped(conn, *window)
    present = {row.status for row in rows}
    for status in FINAL:
        n = kept.get(status, 0) + added.get(status, 0)
        if status in present:
            await conn.execute(
                update(order_counts)
                .where(order_counts.c.status == status)
                .values(orders=n, upto=to)
            )
        else:
            await conn.execute(insert(order_counts).values(status=status, orders=n, upto=to))
    return True


async def live_timers_by_state(conn: AsyncConnection) -> dict[str, int]:
    """How many timers wait (scheduled), run (claimed) or are parked (those with any): one
    statement per partial index (live timers, parked timers; literal states, so the planner
    proves they serve), however many timers are done."""
    found: dict[str, int] = {}
    for states in (_TIMERS_LIVE, _TIMERS_PARKED):
        literals: list[ColumnClause[str]] = [literal_column(f"'{state.value}'") for state in states]
        query = (
            select(timers.c.state, func.count())
            .where(timers.c.state.in_(literals))
            .group_by(timers.c.state)
        )
        found |= {str(state): int(n) for state, n in (await conn.execute(query)).all()}
    return found
