"""Messages to buyers: payment reminders and order-closed notices. Each is a reminder row per
(order, kind), claimed, then sent through the notifier.

A payment reminder goes out while its order awaits payment before the deadline; an
``order_closed`` notice (written by every cancel as a timer in the cancel's transaction) once
its order is cancelled, with the reason. Each goes out once. Its row is claimed with a lease for
the whole batch, and right before the sends one statement checks, for the reminders about to be
sent, that the claim is still this handler's, the order still awaits payment before its
deadline, and sends are left; the same statement counts the delivery and extends the lease to
cover the send. Sends run up to ``provider_concurrency`` at once; the check is made for as many
as there are free slots, in the transaction that records what the finished sends came to (so a
fast notifier costs one transaction per ``provider_concurrency`` notices, not two per notice).
So a batch that sends for longer than the lease loses only the rows it had not reached (another
handler, the scanner's, sends those) and never sends a row another handler took; a reminder for
an order paid mid-batch is not sent.

A send that got no answer (a read timeout after the request left) may have delivered it: it is
not repeated at once, but sent again by a later attempt with the same delivery id, up to the
notifier's ``max_deliveries`` sends, and never once the order moved on; then it is recorded as
``unknown``.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Column, Row
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain import timers as timer_rules
from dueflow.domain.lifecycle import CANCELLED_STATUSES, OrderStatus
from dueflow.domain.timers import TimerKind
from dueflow.exceptions import DeliveryUnknown
from dueflow.notifiers.base import Reminder
from dueflow.service import envelopes
from dueflow.service.deps import Deps
from dueflow.store import aftersale, orders, snapshots, timers
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

    def waits(self, order: Any, now: datetime) -> bool:
        """The order (its row or its snapshot's :class:`_Order`, or None) is one this message
        still makes sense for."""
        if order is None or order.status not in self.statuses:
            return False
        return self.deadline is None or getattr(order, self.deadline.name) > now


PAY = Message(TimerKind.PAY_REMINDER.value, (S.PENDING_PAYMENT.value,), t_orders.c.pay_deadline)
CLOSED = Message(
    TimerKind.ORDER_CLOSED.value, tuple(sorted(s.value for s in CANCELLED_STATUSES)), None
)
KIND = PAY.kind


def _why_not(order: Any, message: Message) -> str:
    """Why ``message`` is not sent for ``order``: gone, moved on, or (still in a status it waits
    in) past the deadline it reminds of."""
    if order is None:
        return timer_rules.SKIPPED_ORDER_MISSING
    if order.status in message.statuses:
        return timer_rules.SKIPPED_PAY_DEADLINE_PASSED
    return timer_rules.skipped_moved_on(order.status)


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
        # The orders as the notices tell them (their envelopes' ``order``), read once for the
        # batch: the checks below read their fields from the same snapshots (nothing this
        # transaction writes before the sends is part of an order's view).
        shots = await snapshots.build(conn, [t.order_id for t in batch])
        current = {oid: _Order(shot) for oid, shot in shots.items()}
        live = [oid for oid, r in current.items() if message.waits(r, now)]
        waiting = set(live)
        moved_on = [t.order_id for t in batch if t.order_id not in waiting]
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
            if timer.order_id not in waiting:
                finished[timer.id] = _why_not(current.get(timer.order_id), message)
            elif state == aftersale.REMINDER_SENT:
                finished[timer.id] = "already sent"
            elif state == aftersale.REMINDER_UNKNOWN:
                finished[timer.id] = "gave up: outcome unknown"
            else:
                elsewhere.append(timer)  # another handler is sending it right now
        await timers.finish_by_token(conn, batch, finished, now)
        if elsewhere:
            await timers.retry(conn, elsewhere, error=ELSEWHERE, now=now)
    await _send_all(
        deps, [t for t in batch if t.order_id in mine], mine, current, shots, token, message
    )


class _Order:
    """An order's snapshot read as its row (``order.status``, ``order.buyer_id``): the checks
    and the message of a notice read the fields its envelope shows."""

    __slots__ = ("_fields",)

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self._fields = fields

    def __getattr__(self, name: str) -> Any:
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(name) from None


@dataclass(frozen=True)
class _Sent:
    """What came of one send: nothing went wrong, an error (provably not delivered), or an
    unknown outcome (it may have been delivered); ``wave`` is the token it was sent under."""

    timer: Claimed
    reminder: Row[Any]
    wave: str
    error: str | None = None
    unknown: str | None = None


async def _send_all(
    deps: Deps,
    batch: Sequence[Claimed],
    mine: Mapping[int, Row[Any]],
    current: Mapping[int, _Order],
    shots: Mapping[int, Mapping[str, Any]],
    token: str,
    message: Message,
) -> None:
    """Send the claimed reminders, up to ``provider_concurrency`` at once (or the notifier's
    ``sends_at_once``), each started as a slot frees. Whenever slots are free, one write transaction records what the finished sends
    came to and renews the next reminders, as many as there are free slots (the check before
    their sends, :func:`dueflow.store.aftersale.renew_reminders`); their sends start as it
    commits. A fast notifier so costs a transaction per ``provider_concurrency`` sends; a slow
    one, as before, a transaction per send, never a send started on a stale check."""
    waiting = deque(batch)
    running: set[asyncio.Task[_Sent]] = set()
    finished: list[_Sent] = []
    at_once = deps.notifier.sends_at_once or deps.provider_concurrency
    try:
        while waiting or running or finished:
            free = at_once - len(running)
            group = [waiting.popleft() for _ in range(min(free, len(waiting)))]
            if group or finished:
                wave = timers.new_token()
                go = await _record_and_renew(deps, finished, group, mine, token, wave, message)
                finished = []
                for timer in group:
                    reminder = mine[timer.order_id]
                    if reminder.id in go:
                        order = current[timer.order_id]
                        shot = shots[timer.order_id]
                        running.add(
                            asyncio.create_task(_send(deps, timer, reminder, order, shot, wave))
                        )
            if running:
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                finished = [task.result() for task in done]
    finally:
        # A failing transaction ends the batch: the sends under way end first (their reminders
        # stay claimed and counted until their lease runs out; their timers go back).
        if running:
            await asyncio.gather(*running, return_exceptions=True)


async def _send(
    deps: Deps,
    timer: Claimed,
    reminder: Row[Any],
    order: _Order,
    shot: Mapping[str, Any],
    wave: str,
) -> _Sent:
    """One notifier call; what came of it (the notifier's trouble is an outcome, not an
    exception)."""
    try:
        await deps.notifier.send(_message(reminder, order, shot))
    except DeliveryUnknown as exc:
        return _Sent(timer, reminder, wave, unknown=f"{type(exc).__name__}: {exc}"[:500])
    except Exception as exc:
        return _Sent(timer, reminder, wave, error=f"{type(exc).__name__}: {exc}"[:500])
    return _Sent(timer, reminder, wave)


async def _record_and_renew(
    deps: Deps,
    finished: Sequence[_Sent],
    group: Sequence[Claimed],
    mine: Mapping[int, Row[Any]],
    token: str,
    wave: str,
    message: Message,
) -> set[int]:
    """One write transaction: record the finished sends, then renew ``group`` under ``wave``
    (those refused are settled with the reason); returns the reminder ids to send."""
    async with deps.db.write() as conn:
        now = deps.clock.now()
        await _record(conn, deps, finished, now)
        if not group:
            return set()
        go = await aftersale.renew_reminders(
            conn,
            [mine[t.order_id].id for t in group],
            token=token,
            wave=wave,
            now=now,
            lease=deps.lease,
            max_deliveries=deps.notifier.max_deliveries,
            order_statuses=message.statuses,
            deadline=message.deadline,
        )
        refused = [t for t in group if mine[t.order_id].id not in go]
        await _not_sent(conn, refused, mine, token, now, message)
    return go


def _by_wave(sends: Sequence[_Sent]) -> dict[str, list[int]]:
    waves: dict[str, list[int]] = defaultdict(list)
    for sent in sends:
        waves[sent.wave].append(sent.reminder.id)
    return waves


def _by_error(sends: Sequence[_Sent], error: Callable[[_Sent], str]) -> dict[str, list[Claimed]]:
    errors: dict[str, list[Claimed]] = defaultdict(list)
    for sent in sends:
        errors[error(sent)].append(sent.timer)
    return errors


async def _record(
    conn: AsyncConnection, deps: Deps, finished: Sequence[_Sent], now: datetime
) -> None:
    """What the finished sends came to, set-based: the sent ones' reminders and timers done;
    the failed ones given back (not counted) and retried; the unknown ones kept counted, and
    retried or given up once out of sends."""
    if not finished:
        return
    sent = [s for s in finished if s.error is None and s.unknown is None]
    for wave, ids in _by_wave(sent).items():
        await aftersale.settle_reminders(conn, ids, token=wave, sent=True, now=now)
    await timers.finish_by_token(
        conn, [s.timer for s in sent], {s.timer.id: "sent" for s in sent}, now
    )
    failed = [s for s in finished if s.error is not None]
    for wave, ids in _by_wave(failed).items():
        await aftersale.settle_reminders(conn, ids, token=wave, sent=False, now=now)
    for error, again in _by_error(failed, lambda s: s.error or "").items():
        await timers.retry(conn, again, error=error, now=now)
    unknown = [s for s in finished if s.unknown is not None]
    # The claim was ours for the whole send, so this send made it reminder.deliveries + 1.
    max_deliveries = deps.notifier.max_deliveries
    out = [s for s in unknown if s.reminder.deliveries + 1 >= max_deliveries]
    left = [s for s in unknown if s.reminder.deliveries + 1 < max_deliveries]
    for wave, ids in _by_wave(out).items():
        await aftersale.record_unknowns(conn, ids, token=wave, give_up=True)
    outcomes = {
        s.timer.id: f"gave up: outcome unknown after {s.reminder.deliveries + 1} deliveries"
        for s in out
    }
    await timers.finish_by_token(conn, [s.timer for s in out], outcomes, now)
    for wave, ids in _by_wave(left).items():
        await aftersale.record_unknowns(conn, ids, token=wave, give_up=False)
    for error, again in _by_error(left, lambda s: s.unknown or "").items():
        await timers.retry(conn, again, error=error, now=now)


def _message(reminder: Row[Any], order: _Order, shot: Mapping[str, Any]) -> Reminder:
    reason = order.cancel_reason if reminder.kind == CLOSED.kind else None
    data: dict[str, Any] = {"buyer_id": order.buyer_id}
    if reminder.kind == CLOSED.kind:
        data["reason"] = reason
    else:
        data.update(amount=order.amount, pay_deadline=order.pay_deadline)
    return Reminder(
        reminder_id=reminder.id,
        kind=reminder.kind,
        order_id=order.id,
        buyer_id=order.buyer_id,
        amount=order.amount,
        pay_deadline=order.pay_deadline,
        reason=reason,
        envelope=envelopes.notice(
            reminder_id=reminder.id,
            kind=reminder.kind,
            created_at=reminder.created_at,
            order=shot,
            data=data,
        ),
    )


async def _not_sent(
    conn: AsyncConnection,
    refused: Sequence[Claimed],
    mine: Mapping[int, Row[Any]],
    token: str,
    now: datetime,
    message: Message,
) -> None:
    """The check before the sends refused these: say why on their reminders and timers."""
    if not refused:
        return
    rows = {
        r.id: r
        for r in await aftersale.reminders_by_id(conn, [mine[t.order_id].id for t in refused])
    }
    ours: list[tuple[Claimed, Row[Any]]] = []
    elsewhere: list[Claimed] = []
    for timer in refused:
        row = rows.get(mine[timer.order_id].id)
        if row is None or row.claim_token != token or row.state != aftersale.REMINDER_SENDING:
            elsewhere.append(timer)  # our lease ran out before we got to it; another took it
        else:
            ours.append((timer, row))
    if elsewhere:
        await timers.retry(conn, elsewhere, error=ELSEWHERE, now=now)
    if not ours:
        return
    found = {r.id: r for r in await orders.many(conn, [row.order_id for _, row in ours])}
    outcomes: dict[int, str] = {}
    for timer, row in ours:
        order = found.get(row.order_id)
        if message.waits(order, now):
            outcomes[timer.id] = f"gave up: outcome unknown after {row.deliveries} deliveries"
        else:
            outcomes[timer.id] = _why_not(order, message)
    counted = [row.id for _, row in ours if row.deliveries > 0]
    await aftersale.record_unknowns(conn, counted, token=token, give_up=True)
    never = [row.id for _, row in ours if row.deliveries == 0]
    await aftersale.settle_reminders(conn, never, token=token, sent=False, now=now)
    await timers.finish_by_token(conn, [t for t, _ in ours], outcomes, now)
