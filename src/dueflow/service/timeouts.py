"""What each timer kind does when it fires, for a whole batch at once.

Every handler finishes each timer (done, with its outcome) in the same transaction as the
order transition it causes. A timer whose order moved on is finished as skipped, with the reason
(``skipped: order is pending_shipment (paid before this timer)``); one whose order
is still waiting but not yet due (its deadline moved later) is re-armed, never acted on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain import timers as timer_rules
from dueflow.domain.lifecycle import OrderEvent, OrderStatus
from dueflow.domain.timers import TimerKind, quick_backoff
from dueflow.exceptions import PaymentMismatch
from dueflow.payments.base import CloseResult, VerifiedPayment
from dueflow.service import closing, lifecycle, refunds, reminders
from dueflow.service import payments as payment_service
from dueflow.service.deps import Deps
from dueflow.store import orders, timers
from dueflow.store.timers import Claimed

log = logging.getLogger(__name__)
S = OrderStatus
E = OrderEvent
Handler = Callable[[Deps, Sequence[Claimed]], Awaitable[None]]


async def _settle(
    conn: AsyncConnection,
    batch: Sequence[Claimed],
    moved: set[int],
    expected: OrderStatus,
    done: str,
    now: datetime,
) -> None:
    """Finish the batch's timers: moved -> ``done``; moved on -> skipped; not yet due (still in
    ``expected``, its stage's deadline later) -> re-armed."""
    deadline = lifecycle.stage_deadline(expected)
    rest = [t for t in batch if t.order_id not in moved]
    current = {r.id: r for r in await orders.many(conn, [t.order_id for t in rest])}
    outcomes = {t.id: done for t in batch if t.order_id in moved}
    later: list[tuple[Claimed, datetime]] = []
    for timer in rest:
        order = current.get(timer.order_id)
        if order is None:
            outcomes[timer.id] = timer_rules.SKIPPED_ORDER_MISSING
        elif order.status != expected.value:
            outcomes[timer.id] = timer_rules.skipped_moved_on(order.status)
        elif getattr(order, deadline.name) > now:
            later.append((timer, getattr(order, deadline.name)))
        else:
            outcomes[timer.id] = timer_rules.skipped_not_moved(order.status)
    await timers.finish_by_token(conn, batch, outcomes, now)
    for timer, due_at in later:
        await timers.rearm(conn, timer, due_at=due_at)


@dataclass(frozen=True)
class _Cancel:
    """Why unpaid orders are cancelled: the event, whether only orders past their pay deadline
    move, whether paid orders are cancelled too (and refunded), and the timers' outcome."""

    event: OrderEvent
    due_only: bool
    paid_too: bool
    done: str


PAY_TIMEOUT = _Cancel(E.PAY_TIMEOUT, due_only=True, paid_too=False, done="cancelled")
SHOW_CANCELLED = _Cancel(
    E.SHOW_CANCEL, due_only=False, paid_too=True, done="cancelled: the show was cancelled"
)


async def cancel_unpaid(deps: Deps, batch: Sequence[Claimed]) -> None:
    """Cancel unpaid orders at their pay deadline, after closing their trades at the provider.

    Orders without a trade are cancelled at once, alongside (never behind) the closes of the
    others, so a provider that hangs delays only its own orders. Paid trades are confirmed
    instead; unknown answers retry the timer with backoff.
    """
    await _cancel(deps, batch, PAY_TIMEOUT)


async def cancel_for_show(deps: Deps, batch: Sequence[Claimed]) -> None:
    """Cancel the orders of a cancelled show: unpaid ones as at their pay deadline (trades
    closed first), paid ones (also those found paid at the close) with a refund in review."""
    await _cancel(deps, batch, SHOW_CANCELLED)


async def _cancel(deps: Deps, batch: Sequence[Claimed], how: _Cancel) -> None:
    now = deps.clock.now()
    attempts = await payment_service.open_attempts(deps, [t.order_id for t in batch], now)
    trading = {row.order_id for row in attempts}
    plain = [t for t in batch if t.order_id not in trading]
    closing = [t for t in batch if t.order_id in trading]
    parts = [_cancel_or_retry(deps, how, plain, [], {}, set(), {}, now)] if plain else []
    if closing:
        parts.append(_close_then_cancel(deps, how, closing, attempts, now))
    # Both halves end before the handler does (a failing one must not leave the other running
    # after the worker hands the batch back); the first failure is raised then.
    for result in await asyncio.gather(*parts, return_exceptions=True):
        if isinstance(result, BaseException):
            raise result


async def _close_then_cancel(
    deps: Deps, how: _Cancel, batch: Sequence[Claimed], attempts: Sequence[Row[Any]], now: datetime
) -> None:
    """Close-or-query the batch's trades, confirm those found paid, cancel the rest."""
    closing = await payment_service.close_attempts(deps, attempts, now)
    unknown = {oid: o.reason for oid, o in closing.items() if o.result is CloseResult.UNKNOWN}
    paid: set[int] = set()
    mismatched: dict[int, tuple[VerifiedPayment, str]] = {}
    for order_id, outcome in closing.items():
        if outcome.result is CloseResult.PAID and outcome.payment is not None:
            try:
                await payment_service.confirm_payment(
                    deps, outcome.payment, actor="close_or_query", busy_goes_ahead=True
                )
                paid.add(order_id)
            except PaymentMismatch as exc:
                mismatched[order_id] = (outcome.payment, exc.message)
            except Exception as exc:
                log.exception(
                    "confirming payment found at close failed for order %s",
                    order_id,
                    extra={"order_id": order_id},
                )
                unknown[order_id] = f"confirming the paid trade failed: {exc}"
    # The provider may have taken seconds: the cancel records the time it happens.
    await _cancel_or_retry(deps, how, batch, attempts, unknown, paid, mismatched, deps.clock.now())


async def _cancel_or_retry(
    deps: Deps,
    how: _Cancel,
    batch: Sequence[Claimed],
    attempts: Sequence[Row[Any]],
    unknown: dict[int, str],
    paid: set[int],
    mismatched: Mapping[int, tuple[VerifiedPayment, str]],
    now: datetime,
) -> None:
    """In one transaction: cancel what may be cancelled, finish the timers, retry the unknown."""
    order_ids = [t.order_id for t in batch]
    cancellable = [oid for oid in order_ids if oid not in unknown and oid not in paid]
    async with deps.db.write() as conn:
        for order_id in await payment_service.opened_since(conn, cancellable, attempts):
            unknown[order_id] = "a payment was started meanwhile"
        cancellable = [oid for oid in cancellable if oid not in unknown]
        for order_id, (payment, detail) in mismatched.items():
            if order_id in cancellable:
                await payment_service.record_mismatch_at_close(
                    conn, payment, detail=detail, now=now
                )
        # Both cancels let go of the holds last (below).
        cancel = partial(
            lifecycle.cancel, conn, deps, now=now, event=how.event, actor="timer", holds_later=True
        )
        moved = await cancel(
            cancellable, how=lifecycle.UNPAID, expected=S.PENDING_PAYMENT, due_only=how.due_only
        )
        paid_moved: list[Row[Any]] = []
        if how.paid_too:
            known = [oid for oid in order_ids if oid not in unknown]
            paid_moved = await cancel(known, how=lifecycle.PAID, expected=S.PAID, due_only=False)
        settled = [t for t in batch if t.order_id not in unknown]
        await _settle(
            conn, settled, {r.id for r in [*moved, *paid_moved]}, S.PENDING_PAYMENT, how.done, now
        )
        retry = [t for t in batch if t.order_id in unknown]
        if retry:
            reason = "; ".join(sorted({unknown[t.order_id] for t in retry}))[:500]
            await timers.retry(
                conn, retry, error=f"payment state unknown: {reason}", now=now, delay=quick_backoff
            )
        # Last before the commit: the shared rows (stock, buyers' counts) stay locked briefly.
        await lifecycle.let_go(conn, deps, lifecycle.UNPAID, moved, now)
        await lifecycle.let_go(conn, deps, lifecycle.PAID, paid_moved, now)


@dataclass(frozen=True)
class _Deadline:
    """A deadline a timer enforces: the status its orders wait in, the event and the move it
    makes (only the orders past the deadline move), the timers' outcome."""

    expected: OrderStatus
    event: OrderEvent
    move: lifecycle.Move
    done: str


async def _at_deadline(deps: Deps, batch: Sequence[Claimed], how: _Deadline) -> None:
    """In one transaction: make the move for the batch's due orders, finish the timers; then
    tell the trigger about the timers of the next stage."""
    now = deps.clock.now()
    async with deps.db.write() as conn:
        ids = [t.order_id for t in batch]
        moved, armed = await how.move(
            conn, deps, ids, now=now, event=how.event, actor="timer", due_only=True
        )
        await _settle(conn, batch, {r.id for r in moved}, how.expected, how.done, now)
    await deps.arm(armed)


SHIP_DEADLINE = _Deadline(
    S.PENDING_SHIPMENT,
    E.SHIP_TIMEOUT,
    lifecycle.cancel_unshipped,
    "cancelled, refund pending review",
)
RECEIVE_DEADLINE = _Deadline(S.SHIPPED, E.RECEIVE_TIMEOUT, lifecycle.receive, "received")
REVIEW_DEADLINE = _Deadline(
    S.RECEIVED, E.REVIEW_TIMEOUT, lifecycle.complete, "completed with default reviews"
)


async def cancel_unshipped(deps: Deps, batch: Sequence[Claimed]) -> None:
    """Cancel paid orders the seller did not ship by the ship deadline; refunds await review."""
    await _at_deadline(deps, batch, SHIP_DEADLINE)


async def confirm_receipt(deps: Deps, batch: Sequence[Claimed]) -> None:
    """Confirm receipt of shipped orders at the receive deadline."""
    await _at_deadline(deps, batch, RECEIVE_DEADLINE)


async def auto_review(deps: Deps, batch: Sequence[Claimed]) -> None:
    """Complete received orders at the review deadline with default positive reviews."""
    await _at_deadline(deps, batch, REVIEW_DEADLINE)


HANDLERS: Mapping[TimerKind, Handler] = {
    TimerKind.PAY_REMINDER: reminders.pay_reminder,
    TimerKind.CANCEL_UNPAID: cancel_unpaid,
    TimerKind.CANCEL_UNSHIPPED: cancel_unshipped,
    TimerKind.CONFIRM_RECEIPT: confirm_receipt,
    TimerKind.AUTO_REVIEW: auto_review,
    TimerKind.REFUND_CHECK: refunds.check_refunds,
    TimerKind.CLOSE_ATTEMPTS: closing.close_leftover_attempts,
    TimerKind.SHOW_CANCEL: cancel_for_show,
    TimerKind.ORDER_CLOSED: reminders.order_closed,
}
