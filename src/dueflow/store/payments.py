"""Statements on payment attempts, refunds and discrepancies."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any, TypedDict, Unpack, cast

from sqlalchemy import Row, bindparam, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.store import _rows, events, hot, tally
from dueflow.store.schema import discrepancies, orders, payments, refunds
from dueflow.store.types import fit

OPEN = "open"
PAID = "paid"
CLOSED = "closed"

REFUND_PENDING_REVIEW = "pending_review"
REFUND_PROCESSING = "processing"
REFUND_SUCCEEDED = "succeeded"
REFUND_FAILED = "failed"
#: Closed by an operator: no money goes back (``rejected``), or it went back outside dueflow
#: (``settled_offline``, a bank transfer say). Both are final.
REFUND_REJECTED = "rejected"
REFUND_SETTLED_OFFLINE = "settled_offline"
#: Final: the provider had given the trade's money back by itself (Alipay's trade.cancel of a
#: trade paid meanwhile); nothing went out through this refund, nobody pays it again.
REFUND_ALREADY_REFUNDED = "already_refunded"


class NewAttempt(TypedDict):
    """A new payment attempt's columns: what is paid, to whom, until when."""

    pay_no: str
    order_id: int
    provider: str
    amount: Decimal
    expires_at: datetime


async def insert_attempt(
    conn: AsyncConnection, *, now: datetime, **attempt: Unpack[NewAttempt]
) -> int:
    """Record a payment attempt (open); returns its id."""
    return await _rows.add(conn, payments, attempt, state=OPEN, created_at=now)


async def by_pay_no(
    conn: AsyncConnection, pay_no: str, *, for_update: bool = False
) -> Row[Any] | None:
    """The attempt with this pay_no, locked when ``for_update``."""
    query = select(payments).where(payments.c.pay_no == pay_no)
    return await _rows.first(conn, query, for_update=for_update)


# The confirm path's statements, compiled once and run hot (store/hot.py): building and keying
# a statement per call costs more than executing it on SQLite.
_WITH_ORDER = (
    select(
        payments,
        orders.c.order_type.label("order_type"),
        orders.c.flow.label("flow"),
        orders.c.status.label("order_status"),
    )
    .join(orders, orders.c.id == payments.c.order_id)
    .where(payments.c.pay_no == bindparam("p_pay_no", type_=payments.c.pay_no.type))
)
_HOT_WITH_ORDER = {
    False: hot.Hot(_WITH_ORDER),
    True: hot.Hot(_WITH_ORDER.with_for_update()),
}
_MARK_PAID = hot.Hot(
    update(payments)
    .where(payments.c.id == bindparam("p_id", type_=payments.c.id.type), payments.c.state != PAID)
    .values(
        state=PAID,
        provider_trade_no=bindparam("p_trade_no", type_=payments.c.provider_trade_no.type),
        handled_at=bindparam("p_now", type_=payments.c.handled_at.type),
    )
)


async def with_order_by_pay_no(
    conn: AsyncConnection, pay_no: str, *, for_update: bool = False
) -> Row[Any] | None:
    """The attempt with this pay_no and its order's ``order_type``, ``flow`` and
    ``order_status``, in one statement; when ``for_update`` both rows are locked (the
    attempt's and the order's), so the status read stays the order's until the commit."""
    row = await _HOT_WITH_ORDER[for_update].first(conn, p_pay_no=pay_no)
    # A hot row reads as a Row does (its columns as attributes, ``_mapping``).
    return cast(Row[Any] | None, row)


async def for_orders(
    conn: AsyncConnection, order_ids: Sequence[int], *, state: str | None = None
) -> list[Row[Any]]:
    """The attempts of these orders (in ``state`` if given), oldest first."""
    if not order_ids:
        return []
    query = select(payments).where(tally.among(conn, payments.c.order_id, order_ids))
    if state is not None:
        query = query.where(payments.c.state == state)
    return list((await conn.execute(query.order_by(payments.c.id))).all())


async def mark_paid(
    conn: AsyncConnection, payment_id: int, *, provider_trade_no: str | None, now: datetime
) -> bool:
    """Mark the attempt paid and handled; False if it already was."""
    count = await _MARK_PAID.rowcount(
        conn, p_id=payment_id, p_trade_no=provider_trade_no, p_now=now
    )
    return count == 1


async def close_open(conn: AsyncConnection, order_ids: Sequence[int], now: datetime) -> int:
    """Mark the open attempts of these cancelled orders closed."""
    return await _close_where(conn, payments.c.order_id, order_ids, now)


async def close_attempts(conn: AsyncConnection, attempt_ids: Sequence[int], now: datetime) -> int:
    """Mark these attempts closed (their trades were closed at the provider) where still open."""
    return await _close_where(conn, payments.c.id, attempt_ids, now)


async def _close_where(
    conn: AsyncConnection, column: Any, values: Sequence[int], now: datetime
) -> int:
    if not values:
        return 0
    result = await conn.execute(
        update(payments)
        .where(tally.among(conn, column, values), payments.c.state == OPEN)
        .values(state=CLOSED, handled_at=now)
    )
    return int(result.rowcount)


_ANY_OPEN = hot.Hot(
    select(payments.c.id)
    .where(
        payments.c.order_id == bindparam("p_order_id", type_=payments.c.order_id.type),
        payments.c.state == OPEN,
    )
    .limit(1)
)


async def has_open(conn: AsyncConnection, order_id: int) -> bool:
    """Whether the order has an open attempt (one statement, built once: the confirm path)."""
    return await _ANY_OPEN.first(conn, p_order_id=order_id) is not None


async def record_provider_refund(conn: AsyncConnection, attempt_id: int, amount: Decimal) -> bool:
    """Record what the provider gave back of the attempt on its own, once; False if it was
    recorded already."""
    result = await conn.execute(
        update(payments)
        .where(payments.c.id == attempt_id, payments.c.provider_refunded.is_(None))
        .values(provider_refunded=amount)
    )
    return result.rowcount == 1


async def record_start(conn: AsyncConnection, attempt_id: int, answer: str) -> bool:
    """Record what became of the attempt's start request, once; False if it was recorded."""
    result = await conn.execute(
        update(payments)
        .where(payments.c.id == attempt_id, payments.c.start_answer.is_(None))
        .values(start_answer=answer)
    )
    return result.rowcount == 1


def refund_no_for(pay_no: str) -> str:
    """The fixed refund number of a payment, reused on every retry."""
    return f"R{pay_no}"


async def create_refunds(
    conn: AsyncConnection,
    paid: Sequence[Row[Any]],
    *,
    reason: str,
    now: datetime,
    actor: str = "system",
) -> int:
    """A refund in pending_review for each paid attempt that has none yet, each with its
    ``refund_created`` event."""
    if not paid:
        return 0
    existing = set(
        (
            await conn.execute(
                select(refunds.c.payment_id).where(refunds.c.payment_id.in_([p.id for p in paid]))
            )
        ).scalars()
    )
    rows = [
        {
            "refund_no": refund_no_for(p.pay_no),
            "order_id": p.order_id,
            "payment_id": p.id,
            "provider": p.provider,
            "amount": p.amount,
            "reason": reason,
            "state": REFUND_PENDING_REVIEW,
            "created_at": now,
            "updated_at": now,
        }
        for p in paid
        if p.id not in existing
    ]
    if rows:
        await conn.execute(insert(refunds), rows)
        entries = [
            (
                r["order_id"],
                f"{r['refund_no']} {r['amount']} {reason}",
                {
                    "refund_no": r["refund_no"],
                    "payment_id": r["payment_id"],
                    "provider": r["provider"],
                    "amount": r["amount"],
                    "reason": reason,
                },
            )
            for r in rows
        ]
        await events.record_each(conn, entries, event="refund_created", actor=actor, now=now)
    return len(rows)


async def refunds_for_order(conn: AsyncConnection, order_id: int) -> list[Row[Any]]:
    """The order's refunds."""
    query = select(refunds).where(refunds.c.order_id == order_id).order_by(refunds.c.id)
    return list((await conn.execute(query)).all())


async def record_discrepancy(
    conn: AsyncConnection, *, kind: str, order_id: int, payment_id: int, detail: str, now: datetime
) -> bool:
    """Record a discrepancy once per (payment, kind); False if it was already recorded."""
    try:
        async with conn.begin_nested():
            await conn.execute(
                insert(discrepancies).values(
                    kind=kind,
                    order_id=order_id,
                    payment_id=payment_id,
                    detail=detail,
                    created_at=now,
                )
            )
    except IntegrityError:
        return False
    return True


async def count_discrepancies(conn: AsyncConnection) -> int:
    """How many discrepancies are recorded."""
    return int((await conn.execute(select(func.count()).select_from(discrepancies))).scalar_one())


async def count_refunds_by_state(conn: AsyncConnection) -> dict[str, int]:
    """How many refunds are in each state."""
    query = select(refunds.c.state, func.count()).group_by(refunds.c.state)
    return {state: count for state, count in (await conn.execute(query)).all()}


async def refund_by_id(
    conn: AsyncConnection, refund_id: int, *, for_update: bool = False
) -> Row[Any] | None:
    """The refund with this id, with its attempt's pay_no and total."""
    query = (
        select(refunds, payments.c.pay_no, payments.c.amount.label("total"))
        .join(payments, payments.c.id == refunds.c.payment_id)
        .where(refunds.c.id == refund_id)
    )
    return await _rows.first(conn, query, for_update=for_update)


async def refund_by_no(conn: AsyncConnection, refund_no: str) -> Row[Any] | None:
    """The refund with this refund number, with its attempt's pay_no and total."""
    query = (
        select(refunds, payments.c.pay_no, payments.c.amount.label("total"))
        .join(payments, payments.c.id == refunds.c.payment_id)
        .where(refunds.c.refund_no == refund_no)
    )
    return (await conn.execute(query)).first()


async def refunds_in(
    conn: AsyncConnection,
    *,
    state: str | None = None,
    order_ids: Sequence[int] | None = None,
    limit: int | None = None,
    after: int | None = None,
) -> list[Row[Any]]:
    """Refunds (with pay_no and total), newest first, filtered by state and orders, below id
    ``after`` when given, at most ``limit``."""
    query = select(refunds, payments.c.pay_no, payments.c.amount.label("total")).join(
        payments, payments.c.id == refunds.c.payment_id
    )
    if state is not None:
        query = query.where(refunds.c.state == state)
    if after is not None:
        query = query.where(refunds.c.id < after)
    if order_ids is not None:
        query = query.where(refunds.c.order_id.in_(order_ids))
    query = query.order_by(refunds.c.id.desc())
    if limit is not None:
        query = query.limit(limit)
    return list((await conn.execute(query)).all())


async def processing_since(conn: AsyncConnection) -> datetime | None:
    """When the longest-processing refund became processing (its last move); None if none is."""
    query = select(func.min(refunds.c.updated_at)).where(refunds.c.state == REFUND_PROCESSING)
    since: datetime | None = (await conn.execute(query)).scalar_one_or_none()
    return since


async def move_refund(
    conn: AsyncConnection,
    refund_id: int,
    *,
    expected: str,
    to: str,
    now: datetime,
    error: str | None = None,
) -> bool:
    """One conditional update of a refund's state; False when it was not ``expected``.

    ``error`` (a provider's words) is cut to its column: it must not fail the move."""
    result = await conn.execute(
        update(refunds)
        .where(refunds.c.id == refund_id, refunds.c.state == expected)
        .values(state=to, updated_at=now, last_error=fit(refunds.c.last_error, error))
    )
    return result.rowcount == 1


async def close_refund(
    conn: AsyncConnection, refund_id: int, *, expected: str, to: str, now: datetime
) -> bool:
    """An operator's final move of a refund that is still ``expected`` (one conditional
    update); its last provider error is kept. False when it was not ``expected``."""
    result = await conn.execute(
        update(refunds)
        .where(refunds.c.id == refund_id, refunds.c.state == expected)
        .values(state=to, updated_at=now)
    )
    return result.rowcount == 1
