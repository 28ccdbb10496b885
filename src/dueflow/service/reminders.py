"""Messages to buyers: payment reminders and order-closed notices. Each is a reminder row per
(order, kind), claimed, then sent through the notifier.

A payment reminder goes out while its order awaits payment before the deadline; an
``order_closed`` notice (written by every cancel as a timer in the cancel's transaction) once
its order is cancelled, with the reason. Each goes out once. Its row is claimed with a lease for the whole batch, and right before
each send one statement checks the claim is still this handler's, the order still awaits
payment before its deadline, and sends are left; the same statement counts the delivery and
extends the lease to cover the send. So a batch that sends for longer than the lease loses only
the rows it had not reached (another handler, the scanner's, sends those) and never sends a row
another handler took; a reminder for an order paid mid-batch is not sent.

A send that got no answer (a read timeout after the request left) may have delivered it: it is
not repeated at once, but sent again by a later attempt with the same delivery id, up to the
notifier's ``max_deliveries`` sends, and never once the order moved on; then it is recorded as
``unknown``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Column, Row
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain.lifecycle import CANCELLED_STATUSES, OrderStatus
from dueflow.domain.timers import TimerKind
from dueflow.exceptions import DeliveryUnknown
from dueflow.notifiers.base import Reminder
from dueflow.service.deps import Deps
from dueflow.store import aftersale, orders, timers
from dueflow.store.schema import orders as t_orders
from dueflow.store.timers import Claimed

S = OrderStatus
ELSEWHERE = "being sent by another worker"


@dataclass(frozen=True)
class Message:
    """One kind of message: its reminder kind, and the order statuses (and deadline ahead, if
    any) in which it may still go out."""

    kind: str
    statuses: tuple[str, ...]
    deadline: Column[Any] | None

    def waits(self, order: Row[Any] | None, now: datetime) -> bool:
        """The order is one this message still makes sense for."""
        if order is None or order.status not in self.statuses:
            return False
        return self.deadline is None or getattr(order, self.deadline.name) > now


PAY = Message(TimerKind.PAY_REMINDER.value, (S.PENDING_PAYMENT.value,), t_orders.c.pay_deadline)
CLOSED = Message(
    TimerKind.ORDER_CLOSED.value, tuple(sorted(s.value for s in CANCELLED_STATUSES)), None
)
KIND = PAY.kind


def _why_not(order: Row[Any] | None) -> str:
    # An order still pending here is past its pay deadline (its cancel is on the way).
    return f"skipped: order is {order.status if order else 'missing'}"


async def pay_reminder(deps: Deps, batch: Sequence[Claimed]) -> None:
    """Remind buyers of unpaid orders, once per order."""
    await _remind(deps, batch, PAY)


async def order_closed(deps: Deps, batch: Sequence[Claimed]) -> None:
    """Tell buyers their order was closed, and why, once per order."""
    await _remind(deps, batch, CLOSED)


async def _remind(deps: Deps, batch: Sequence[Claimed], message: Message) -> None:
    """A reminder row is claimed by one handler with a lease before it is sent, and recorded
    sent as soon as the send returns."""
    now = deps.clock.now()
    token = timers.new_token()
    kind = message.kind
    async with deps.db.write() as conn:
        current = {r.id: r for r in await orders.many(conn, [t.order_id for t in batch])}
        live = [oid for oid, r in current.items() if message.waits(r, now)]
        moved_on = [t.order_id for t in batch if t.order_id not in live]
        await aftersale.give_up_reminders(conn, moved_on, kind=kind, now=now)
        mine = {
            r.order_id: r
            for r in await aftersale.claim_reminders(
                conn, live, kind=kind, now=now, lease=deps.lease, token=token
            )
        }
        states = await aftersale.reminder_states(conn, live, kind=kind)
        finished: dict[int, str] = {}
        elsewhere: list[Claimed] = []
        for timer in batch:
            if timer.order_id in mine:
                continue
            state = states.get(timer.order_id)
            if timer.order_id not in live:
                finished[timer.id] = _why_not(current.get(timer.order_id))
            elif state == aftersale.REMINDER_SENT:
                finished[timer.id] = "already sent"
            elif state == aftersale.REMINDER_UNKNOWN:
                finished[timer.id] = "gave up: outcome unknown"
            else:
                elsewhere.append(timer)  # another handler is sending it right now
        await timers.finish_by_token(conn, batch, finished, now)
        if elsewhere:
            await timers.retry(conn, elsewhere, error=ELSEWHERE, now=now)
    await _send_all(deps, [t for t in batch if t.order_id in mine], mine, current, token, message)


async def _send_all(
    deps: Deps,
    batch: Sequence[Claimed],
    mine: Mapping[int, Row[Any]],
    current: Mapping[int, Row[Any]],
    token: str,
    message: Message,
) -> None:
    limit = asyncio.Semaphore(deps.provider_concurrency)

    async def one(timer: Claimed) -> None:
        async with limit:
            order = current[timer.order_id]
            await _deliver(deps, timer, mine[timer.order_id], order, token, message)

    await asyncio.gather(*(one(timer) for timer in batch))


async def _deliver(
    deps: Deps, timer: Claimed, reminder: Row[Any], order: Row[Any], token: str, message: Message
) -> None:
    """Send one claimed reminder if it may still go out, and record what came of it (2 write
    transactions: the check that counts the delivery, then the outcome)."""
    async with deps.db.write() as conn:
        now = deps.clock.now()
        go = await aftersale.renew_reminder(
            conn,
            reminder.id,
            token=token,
            now=now,
            lease=deps.lease,
            max_deliveries=deps.notifier.max_deliveries,
            order_statuses=message.statuses,
            deadline=message.deadline,
        )
        if not go:
            await _not_sent(conn, timer, reminder.id, token, now, message)
            return
    error = unknown = None
    try:
        await deps.notifier.send(_message(reminder, order))
    except DeliveryUnknown as exc:
        unknown = f"{type(exc).__name__}: {exc}"[:500]
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:500]
    async with deps.db.write() as conn:
        now = deps.clock.now()
        if unknown is not None:
            await _record_unknown(conn, deps, timer, reminder, token, unknown, now)
        else:
            await aftersale.settle_reminder(
                conn, reminder.id, token=token, sent=error is None, now=now
            )
            if error is None:
                await timers.finish(conn, {timer.id: "sent"}, token=timer.token, now=now)
            else:
                await timers.retry(conn, [timer], error=error, now=now)


def _message(reminder: Row[Any], order: Row[Any]) -> Reminder:
    return Reminder(
        reminder_id=reminder.id,
        kind=reminder.kind,
        order_id=order.id,
        buyer_id=order.buyer_id,
        amount=order.amount,
        pay_deadline=order.pay_deadline,
        reason=order.cancel_reason if reminder.kind == CLOSED.kind else None,
    )


async def _record_unknown(
    conn: AsyncConnection,
    deps: Deps,
    timer: Claimed,
    reminder: Row[Any],
    token: str,
    error: str,
    now: datetime,
) -> None:
    # The claim was ours for the whole send, so this send made it reminder.deliveries + 1.
    sends = reminder.deliveries + 1
    give_up = sends >= deps.notifier.max_deliveries
    await aftersale.record_unknown(conn, reminder.id, token=token, give_up=give_up)
    if give_up:
        outcome = f"gave up: outcome unknown after {sends} deliveries"
        await timers.finish(conn, {timer.id: outcome}, token=timer.token, now=now)
    else:
        await timers.retry(conn, [timer], error=error, now=now)


async def _not_sent(
    conn: AsyncConnection,
    timer: Claimed,
    reminder_id: int,
    token: str,
    now: datetime,
    message: Message,
) -> None:
    """The check before a send refused it: say why on the reminder and its timer."""
    row = await aftersale.reminder(conn, reminder_id)
    if row is None or row.claim_token != token or row.state != aftersale.REMINDER_SENDING:
        # Our lease ran out before we got to it and another handler took it.
        await timers.retry(conn, [timer], error=ELSEWHERE, now=now)
        return
    found = await orders.many(conn, [row.order_id])
    order = found[0] if found else None
    if message.waits(order, now):
        outcome = f"gave up: outcome unknown after {row.deliveries} deliveries"
    else:
        outcome = _why_not(order)
    if row.deliveries > 0:
        await aftersale.record_unknown(conn, reminder_id, token=token, give_up=True)
    else:
        await aftersale.settle_reminder(conn, reminder_id, token=token, sent=False, now=now)
    await timers.finish(conn, {timer.id: outcome}, token=timer.token, now=now)
