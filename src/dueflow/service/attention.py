"""What needs a person, in one list: timers parked after their last attempt, refunds the
provider failed or has not settled for too long, discrepancies whose money waits on a review;
each with the action that resolves it (the dashboard's "Needs attention", and the gauge
``dueflow_needs_attention`` by kind).

Every read is one range of an index (parked timers, refunds by state), so the list and its
counts cost the same with a thousand orders or a million.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, literal, select, union_all
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.service.deps import Deps
from dueflow.store import payments, timers
from dueflow.store.schema import discrepancies, refunds
from dueflow.store.schema import timers as t_timers

#: A refund processing (submitted, not settled by its provider) longer than this needs a person:
#: the alert DueflowRefundProcessingLong's hour (docs/alerts.yml).
REFUND_STUCK_AFTER = timedelta(hours=1)

PARKED_TIMER = "parked_timer"
REFUND_FAILED = "refund_failed"
REFUND_STUCK = "refund_stuck"
DISCREPANCY = "discrepancy"
#: Every kind, in the order the list shows them.
KINDS = (PARKED_TIMER, REFUND_FAILED, REFUND_STUCK, DISCREPANCY)


@dataclass(frozen=True)
class Action:
    """What resolves an item: a POST of the admin pages (a button) or a page to act on."""

    label: str
    url: str
    post: bool


@dataclass(frozen=True)
class Item:
    """One thing that needs a person."""

    kind: str
    #: The timer's, the refund's or the discrepancy's id.
    id: int
    order_id: int
    what: str
    #: Since when it waits (parked: its due time; a refund: its last move; a discrepancy: when
    #: it was recorded).
    since: datetime
    actions: tuple[Action, ...]


#: Timers parked after their last attempt (a literal state: the partial index serves).
_PARKED = t_timers.c.state == timers.PARKED
_FAILED = refunds.c.state == payments.REFUND_FAILED


def _stuck(now: datetime) -> Any:
    return (refunds.c.state == payments.REFUND_PROCESSING) & (
        refunds.c.updated_at < now - REFUND_STUCK_AFTER
    )


def _in_review() -> Any:
    """Discrepancies whose refund waits on a review (approve or reject)."""
    return (
        select(discrepancies, refunds.c.id.label("refund_id"))
        .join(refunds, refunds.c.payment_id == discrepancies.c.payment_id)
        .where(refunds.c.state == payments.REFUND_PENDING_REVIEW)
    )


async def counts(conn: AsyncConnection, now: datetime) -> dict[str, int]:
    """How many items of each kind need a person: one statement."""
    review = _in_review().subquery()
    parts = [
        select(literal(PARKED_TIMER).label("kind"), func.count().label("n"))
        .select_from(t_timers)
        .where(_PARKED),
        select(literal(REFUND_FAILED), func.count()).select_from(refunds).where(_FAILED),
        select(literal(REFUND_STUCK), func.count()).select_from(refunds).where(_stuck(now)),
        select(literal(DISCREPANCY), func.count()).select_from(review),
    ]
    found = {str(kind): int(n) for kind, n in (await conn.execute(union_all(*parts))).all()}
    return {kind: found.get(kind, 0) for kind in KINDS}


async def needs_attention(deps: Deps, limit: int = 50) -> list[Item]:
    """Up to ``limit`` items of each kind, each kind's oldest first."""
    now = deps.clock.now()
    t, r = t_timers.c, refunds.c
    async with deps.db.report() as conn:
        parked = select(t_timers).where(_PARKED).order_by(t.due_at, t.id).limit(limit)
        failed = select(refunds).where(_FAILED).order_by(r.updated_at, r.id).limit(limit)
        stuck = select(refunds).where(_stuck(now)).order_by(r.updated_at, r.id).limit(limit)
        review = _in_review().order_by(discrepancies.c.id).limit(limit)
        items = [_timer(row) for row in await conn.execute(parked)]
        items += [_refund(REFUND_FAILED, row) for row in await conn.execute(failed)]
        items += [_refund(REFUND_STUCK, row) for row in await conn.execute(stuck)]
        items += [_discrepancy(row) for row in await conn.execute(review)]
    return items


def _timer(row: Any) -> Item:
    error = row.last_error or "no error recorded"
    return Item(
        PARKED_TIMER,
        row.id,
        row.order_id,
        f"timer {row.kind} parked after {row.attempts} attempts: {error}",
        row.due_at,
        (Action("Run again", f"/admin/timers/{row.id}/run-now", post=True),),
    )


def _refund(kind: str, row: Any) -> Item:
    page = f"/admin/refunds?state={row.state}"
    actions: tuple[Action, ...]
    if kind == REFUND_FAILED:
        what = f"refund {row.refund_no} of {row.amount} failed: {row.last_error or 'no error'}"
        actions = (
            Action("Retry", f"/admin/refunds/{row.id}/retry", post=True),
            Action("Reject or settle off-line", page, post=False),
        )
    else:
        what = f"refund {row.refund_no} of {row.amount} processing, not settled by the provider"
        actions = (Action("Reject or settle off-line", page, post=False),)
    return Item(kind, row.id, row.order_id, what, row.updated_at, actions)


def _discrepancy(row: Any) -> Item:
    return Item(
        DISCREPANCY,
        row.id,
        row.order_id,
        f"{row.kind}: {row.detail}; its refund {row.refund_id} awaits review",
        row.created_at,
        (
            Action("Approve the refund", f"/admin/refunds/{row.refund_id}/approve", post=True),
            Action("Reject it", "/admin/refunds?state=pending_review", post=False),
        ),
    )
