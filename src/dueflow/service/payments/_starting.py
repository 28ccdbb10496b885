"""Starting a payment: a new attempt at the order's provider."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain.events import attempt_data
from dueflow.domain.lifecycle import OrderStatus
from dueflow.exceptions import (
    BackendError,
    DomainError,
    InvalidInput,
    InvalidTransition,
    NotAllowed,
    NotFound,
    NotYourRole,
    ProviderUnavailable,
    SalesClosed,
)
from dueflow.locks import base as locks
from dueflow.payments.base import (
    Attempt,
    StartAnswer,
)
from dueflow.service import actors
from dueflow.service.deps import Deps
from dueflow.service.payments._closing import attempt_of
from dueflow.service.payments._confirm import MANUAL, new_pay_no
from dueflow.store import holds, idempotency, orders, payments, shows

log = logging.getLogger(__package__)


#: A payment is not started this close to the pay deadline.
MIN_PAY_WINDOW = timedelta(seconds=3)


async def start_payment(
    deps: Deps, *, order_id: int, user_id: int, provider: str, key: idempotency.Claim | None = None
) -> tuple[str, str]:
    """The buyer starts paying an order through ``provider``: a new attempt whose expiry is the
    pay deadline (sent to the provider too). Returns (pay_no, the URL where the buyer pays).

    With the request's Idempotency-Key ``key``, the new attempt is noted with the key in the
    attempt's transaction; a re-run of the same request after its first run died unanswered
    (``key.effect_id``) starts that same attempt again, while it is open: the provider knows
    it by its pay number and answers the same trade, so one request opens one trade.

    Raises:
        InvalidInput: unknown provider, the manual provider (operators record those), or an
            amount above the provider's most (nothing is stored).
        NotFound, NotAllowed: no such order, or not the buyer's (NotYourRole: the seller's).
        InvalidTransition: the order no longer awaits payment, or its pay deadline has passed.
        ProviderUnavailable: the provider did not answer clearly (the attempt stays open and
            is closed or queried like any other).
    """
    payer = deps.providers.get(provider)
    if provider == MANUAL:
        raise InvalidInput("manual payments are recorded by an operator", field="provider")
    async with locks.held(deps.locks, f"order:{order_id}", deps.lock_ttl):
        attempt_id, attempt, subject = await _new_attempt(deps, order_id, user_id, provider, key)
    try:
        start = await payer.start(attempt, subject=subject)
    except ProviderUnavailable as exc:
        if exc.answered:
            await _record_start(deps, attempt_id, attempt.pay_no, StartAnswer.REFUSED)
        raise
    except DomainError:  # refused before any request was sent (an amount it cannot take)
        await _record_start(deps, attempt_id, attempt.pay_no, StartAnswer.REFUSED)
        raise
    # Anything else (a timeout, a cancelled request, a bug) leaves the start unknown: the
    # request may still be on its way, so "no such trade" proves nothing before the expiry.
    await _record_start(deps, attempt_id, attempt.pay_no, StartAnswer.CREATED)
    return attempt.pay_no, start.pay_url


async def _record_start(deps: Deps, attempt_id: int, pay_no: str, answer: StartAnswer) -> None:
    """Keep what the start's answer proves, for close-or-query; losing it only makes a later
    cancel wait for the expiry, so a database failure here does not fail the start."""
    try:
        async with deps.db.write() as conn:
            await payments.record_start(conn, attempt_id, answer.value)
    except BackendError as exc:
        log.warning("could not record the start of %s as %s: %s", pay_no, answer, exc)


async def _new_attempt(
    deps: Deps, order_id: int, user_id: int, provider: str, key: idempotency.Claim | None
) -> tuple[int, Attempt, str]:
    """The new attempt's id and the attempt as the provider takes it (built from what was
    written, not read back), and the subject; committed before the provider hears of it. The
    attempt ``key`` noted, when still open, instead of a new one."""
    now = deps.clock.now()
    async with deps.db.write() as conn:
        order = await orders.get(conn, order_id, for_update=True)
        if order is None:
            raise NotFound(f"no order {order_id}")
        if order.seller_id == user_id:
            raise NotYourRole(f"only the buyer of order {order_id} may pay it; you are its seller")
        if order.buyer_id != user_id:
            raise NotAllowed(f"order {order_id} is not yours as buyer")
        if order.status != OrderStatus.PENDING_PAYMENT.value:
            raise InvalidTransition(
                f"cannot pay: order {order_id} is {order.status}", status=order.status
            )
        if order.pay_deadline <= now:
            raise InvalidTransition(
                f"cannot pay: order {order_id}'s pay deadline has passed", status=order.status
            )
        if order.pay_deadline - now < MIN_PAY_WINDOW:
            # Providers take the expiry in whole seconds: a trade started this late may be
            # expired on arrival, and its close would stay unknown for the clock-skew margin.
            raise InvalidTransition(
                f"cannot pay: order {order_id}'s pay deadline is less than "
                f"{MIN_PAY_WINDOW.total_seconds():g} s away",
                status=order.status,
            )
        show = None if order.show_id is None else await shows.get(conn, order.show_id)
        if show is not None and show.status == shows.CANCELLED:
            # Its order is being cancelled by the worker: a trade now would only be closed.
            raise SalesClosed(f"cannot pay: show {order.show_id} was cancelled")
        deps.providers.get(provider).check_amount(order.amount)  # before anything is stored
        resumed = await _noted_attempt(conn, order_id, key)
        if resumed is not None:
            return resumed.id, attempt_of(resumed), await _subject(conn, order, show)
        attempt = Attempt(
            pay_no=new_pay_no(now),
            order_id=order_id,
            provider=provider,
            amount=order.amount,
            expires_at=order.pay_deadline,
        )
        attempt_id = await payments.insert_attempt(
            conn,
            pay_no=attempt.pay_no,
            order_id=order_id,
            provider=provider,
            amount=attempt.amount,
            expires_at=attempt.expires_at,
            now=now,
        )
        await orders.record_events(
            conn,
            [order_id],
            event="payment_started",
            actor=actors.user(user_id),
            now=now,
            detail=f"{provider} {attempt.pay_no}",
            data={**attempt_data(attempt), "expires_at": attempt.expires_at},
        )
        if key is not None:
            await idempotency.note(conn, key.id, attempt_id)
        subject = await _subject(conn, order, show)
    return attempt_id, attempt, subject


async def _noted_attempt(
    conn: AsyncConnection, order_id: int, key: idempotency.Claim | None
) -> Row[Any] | None:
    """The open attempt an earlier run of the key's request made, if any, unless its provider
    refused it (that answer is what close-or-query trusts: a trade started now under its pay
    number would go unseen)."""
    if key is None or key.effect_id is None:
        return None
    found = await payments.for_orders(conn, [order_id], state=payments.OPEN)
    return next(
        (
            row
            for row in found
            if row.id == key.effect_id and row.start_answer != StartAnswer.REFUSED.value
        ),
        None,
    )


async def _subject(conn: AsyncConnection, order: Row[Any], show: Row[Any] | None) -> str:
    """What the buyer pays for, as the provider shows it: the goods' title, the SKUs' titles
    (with their quantities), or the show's title and the seats (``show``: the order's, already
    read)."""
    bought = (await holds.lines_of(conn, [order.id]))[order.id]
    labels = ", ".join(
        line.label if line.quantity == 1 else f"{line.label} x{line.quantity}"
        for line in bought
        if line.kind not in ("coupon", "flash")  # the price already says what they did
    )
    return labels if show is None else f"{show.title} {labels}"
