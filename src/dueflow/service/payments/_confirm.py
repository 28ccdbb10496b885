"""Confirming a payment: one path for notifications, queries and operators (and the
discrepancies found on the way)."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from datetime import datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, NotRequired, TypedDict, Unpack

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain import lifecycle
from dueflow.domain.lifecycle import OrderEvent, OrderStatus
from dueflow.domain.money import parse_yuan
from dueflow.domain.timers import TimerKind
from dueflow.exceptions import (
    NotFound,
    PaymentMismatch,
)
from dueflow.locks import base as locks
from dueflow.payments.base import (
    VerifiedPayment,
)
from dueflow.service import discrepancies, given_back
from dueflow.service.deps import Deps
from dueflow.store import orders, payments, timers

log = logging.getLogger(__package__)


MANUAL = "manual"


class PaymentOutcome(StrEnum):
    """What confirming a payment did."""

    CONFIRMED = "confirmed"
    DUPLICATE = "duplicate"
    REFUND = "refund"
    #: The provider gave this payment back by itself before it was applied, the order still
    #: awaiting payment: a discrepancy, the order is not moved and nothing is refunded.
    GIVEN_BACK = "given_back"


def new_pay_no(now: datetime) -> str:
    """A fresh pay_no: date, then random hex; 24 characters, valid for Alipay and WeChat Pay."""
    return now.strftime("%Y%m%d") + secrets.token_hex(8)


#: Inside the confirm's write transaction, before any write: the caller's own checks of the
#: locked attempt (None when no attempt has the pay_no); raising refuses the payment unchanged.
AttemptCheck = Callable[[Row[Any] | None], None]


#: Inside the confirm's write transaction, after the payment is applied: the caller's own writes
#: that must commit with it (a notification's verdict).
AlsoWrite = Callable[[AsyncConnection, PaymentOutcome], Awaitable[None]]


class Confirming(TypedDict):
    """Who applies a payment (the timeline's actor) and the caller's own steps in its write
    transaction (:data:`AttemptCheck`, :data:`AlsoWrite`)."""

    actor: str
    check: NotRequired[AttemptCheck | None]
    also: NotRequired[AlsoWrite | None]


async def confirm_payment(
    deps: Deps,
    payment: VerifiedPayment,
    *,
    busy_goes_ahead: bool = False,
    **how: Unpack[Confirming],
) -> PaymentOutcome:
    """Apply a verified payment exactly once.

    The first conditional update wins: if the order is still pending payment it moves to pending
    shipment; if it was cancelled (or paid by another attempt) the money becomes a recorded
    discrepancy and a refund in review, never an ignored success.

    ``check`` and ``also`` run inside the same write transaction (see :data:`AttemptCheck` and
    :data:`AlsoWrite`).

    Raises:
        NotFound: no attempt has this pay_no.
        PaymentMismatch: the amount differs from the attempt's.
    """
    if not deps.locks.excludes:
        # The lock would keep nobody out: skip the read that only finds its key (the order id).
        return await confirm_payment_locked(deps, payment, **how)
    async with deps.db.read() as conn:
        known = await payments.by_pay_no(conn, payment.pay_no)
    if known is None:
        if (check := how.get("check")) is not None:
            check(None)
        raise NotFound(f"no payment attempt {payment.pay_no}")
    key = f"order:{known.order_id}"
    async with locks.held(deps.locks, key, deps.lock_ttl, busy_goes_ahead=busy_goes_ahead):
        return await confirm_payment_locked(deps, payment, **how)


async def confirm_payment_locked(
    deps: Deps, payment: VerifiedPayment, **how: Unpack[Confirming]
) -> PaymentOutcome:
    """:func:`confirm_payment` for a caller that already holds the order's lock (locks are not
    re-entrant)."""
    actor, check, also = how["actor"], how.get("check"), how.get("also")
    now = deps.clock.now()
    async with deps.db.write() as conn:
        # One statement: the attempt and its order (both locked), the order's type for the move.
        attempt = await payments.with_order_by_pay_no(conn, payment.pay_no, for_update=True)
        if check is not None:
            check(attempt)
        if attempt is None:
            raise NotFound(f"no payment attempt {payment.pay_no}")
        outcome, armed = await apply_payment(
            conn,
            deps,
            attempt,
            payment,
            now=now,
            actor=actor,
            order_type=attempt.order_type,
            flow_name=attempt.flow,
            order_status=attempt.order_status,
        )
        if also is not None:
            await also(conn, outcome)
    await deps.arm(armed)
    return outcome


async def apply_payment(
    conn: AsyncConnection,
    deps: Deps,
    attempt: Row[Any],
    payment: VerifiedPayment,
    *,
    now: datetime,
    actor: str,
    order_type: str | None = None,
    flow_name: str | None = None,
    order_status: str | None = None,
) -> tuple[PaymentOutcome, list[timers.Armed]]:
    """Inside a write transaction holding the attempt: the body of :func:`confirm_payment`.

    ``order_type``, ``flow_name``, ``order_status``: the order's when the caller already holds
    the order locked (read with the attempt); otherwise the order is read and locked here."""
    if payment.amount != attempt.amount:
        raise PaymentMismatch(
            f"paid {payment.amount} but attempt {attempt.pay_no} is for {attempt.amount}"
        )
    if attempt.state == payments.PAID:
        return PaymentOutcome.DUPLICATE, []
    if order_type is None or flow_name is None or order_status is None:
        order = await orders.get(conn, attempt.order_id, for_update=True)
        assert order is not None  # a foreign key
        order_type, flow_name = str(order.order_type), str(order.flow)
        order_status = str(order.status)
    if order_status == OrderStatus.PENDING_PAYMENT and given_back.covers(attempt):
        # The order holds none of this money: it is not moved.
        await given_back.record_late_payment(conn, attempt, payment, now=now, actor=actor)
        return PaymentOutcome.GIVEN_BACK, []
    await payments.mark_paid(conn, attempt.id, provider_trade_no=payment.provider_trade_no, now=now)
    # Where paying moves the order in its flow, and the deadline that status waits on, if any.
    flow = lifecycle.lifecycle(flow_name)
    to = flow.next_status(OrderStatus.PENDING_PAYMENT, OrderEvent.PAY)
    stage = flow.stages.get(to)
    values: dict[str, Any] = {"paid_at": now}
    if stage is not None:
        values[stage.deadline] = now + getattr(deps.policy.durations(order_type), stage.duration)
    # Plain values (not per type): one conditional UPDATE ... RETURNING where the dialect has it.
    moved = await orders.move(
        conn,
        [attempt.order_id],
        expected=OrderStatus.PENDING_PAYMENT,
        event=OrderEvent.PAY,
        now=now,
        values=values,
    )
    if moved:
        order = moved[0]
        for hold, held_ids in deps.holds.for_flows(moved):
            await hold.settle(conn, held_ids, now)
        await timers.cancel_for_orders(conn, [order.id], now)
        new = []
        if stage is not None:
            new.append(timers.NewTimer(order.id, stage.timer, values[stage.deadline]))
        if await payments.has_open(conn, order.id):
            # Another code the buyer was shown can still be paid: close it at its provider,
            # after this commit (never a provider call inside the transaction), retried until
            # the provider answers.
            new.append(timers.NewTimer(order.id, TimerKind.CLOSE_ATTEMPTS, now))
        armed = await timers.schedule(conn, new, now)
        await orders.record_events(
            conn,
            [order.id],
            event=OrderEvent.PAY.value,
            actor=actor,
            now=now,
            from_status=OrderStatus.PENDING_PAYMENT,
            to_status=to,
            detail=f"{attempt.provider} {attempt.pay_no} {attempt.amount}",
            data={
                "provider": attempt.provider,
                "pay_no": attempt.pay_no,
                "provider_trade_no": payment.provider_trade_no,
                "amount": attempt.amount,
            },
        )
        return PaymentOutcome.CONFIRMED, armed
    # The order is locked since its status was read, and the move found it no longer pending:
    # that status is still the order's.
    await _refund_late_payment(conn, attempt, OrderStatus(order_status), now=now, actor=actor)
    return PaymentOutcome.REFUND, []


async def _refund_late_payment(
    conn: AsyncConnection, attempt: Row[Any], status: OrderStatus, *, now: datetime, actor: str
) -> None:
    """The money of an order that is no longer pending payment (``status``): a discrepancy
    and a refund in review for the attempt (now paid), with their timeline entries; no refund
    when the provider gave the payment back by itself (recorded on the attempt by the close
    that made it do so: Alipay's cancel of a trade paid meanwhile)."""
    kind = "paid_after_cancel" if status.is_cancelled else "paid_twice"
    detail = (
        f"{attempt.provider} {attempt.pay_no} paid {attempt.amount} while the order is {status}"
    )
    owed = not given_back.covers(attempt)
    if not owed:
        returned = attempt.provider_refunded
        detail = f"{detail}; {attempt.provider} already gave back {returned}: no refund due"
    await discrepancies.record(
        conn,
        attempt,
        kind,
        detail,
        actor=actor,
        now=now,
        order_status=status.value,
        refund_due=owed,
    )
    where = {"order_id": attempt.order_id, "pay_no": attempt.pay_no}
    if not owed:
        log.warning("DISCREPANCY %s: %s", kind, detail, extra=where)
        return
    await payments.create_refunds(conn, [attempt], reason=kind, now=now, actor=actor)
    log.error("DISCREPANCY %s: %s; a refund awaits review", kind, detail, extra=where)


async def record_mismatch_at_close(
    conn: AsyncConnection, payment: VerifiedPayment, *, detail: str, now: datetime
) -> None:
    """Inside a write transaction (the cancel's, or the close of a paid order's leftover
    attempts): close-or-query found the trade paid, but for another amount than the attempt's.
    The attempt is marked paid (the provider holds the money) and a discrepancy
    ``amount_mismatch`` is recorded for an operator; no refund is created, since the two
    amounts disagree and neither can be trusted as the one to pay back."""
    attempt = await payments.by_pay_no(conn, payment.pay_no, for_update=True)
    if attempt is None:
        return
    await payments.mark_paid(conn, attempt.id, provider_trade_no=payment.provider_trade_no, now=now)
    text = f"{attempt.provider} {attempt.pay_no}: {detail}"
    await discrepancies.record(
        conn,
        attempt,
        "amount_mismatch",
        text,
        actor="close_or_query",
        now=now,
        paid_amount=payment.amount,
    )
    log.error(
        "DISCREPANCY amount_mismatch: %s; an operator settles the money",
        text,
        extra={"order_id": attempt.order_id, "pay_no": attempt.pay_no},
    )


async def record_manual_payment(
    deps: Deps, *, order_id: int, amount: str | Decimal, reference: str | None = None
) -> tuple[str, PaymentOutcome]:
    """An operator records money received off-line for an order; returns (pay_no, outcome).

    Raises:
        NotFound: no such order.
        InvalidInput: the amount is malformed.
        PaymentMismatch: the amount is not the order's amount (nothing is recorded).
    """
    value = parse_yuan(amount)
    async with locks.held(deps.locks, f"order:{order_id}", deps.lock_ttl):
        pay_no, outcome, armed = await _record_manual(deps, order_id, value, reference)
    await deps.arm(armed)
    return pay_no, outcome


async def _record_manual(
    deps: Deps, order_id: int, value: Decimal, reference: str | None
) -> tuple[str, PaymentOutcome, list[timers.Armed]]:
    now = deps.clock.now()
    async with deps.db.write() as conn:
        order = await orders.get(conn, order_id, for_update=True)
        if order is None:
            raise NotFound(f"no order {order_id}")
        if value != order.amount:
            raise PaymentMismatch(f"amount {value} differs from order {order_id}'s {order.amount}")
        pay_no = new_pay_no(now)
        await payments.insert_attempt(
            conn,
            pay_no=pay_no,
            order_id=order_id,
            provider=MANUAL,
            amount=value,
            expires_at=order.pay_deadline,
            now=now,
        )
        attempt = await payments.by_pay_no(conn, pay_no, for_update=True)
        assert attempt is not None
        payment = VerifiedPayment(pay_no=pay_no, amount=value, provider_trade_no=reference)
        outcome, armed = await apply_payment(
            conn,
            deps,
            attempt,
            payment,
            now=now,
            actor="operator",
            order_type=order.order_type,
            flow_name=order.flow,
            order_status=order.status,
        )
    return pay_no, outcome, armed
