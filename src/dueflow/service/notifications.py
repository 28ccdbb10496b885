"""Provider notifications: verified before anything else, applied once, kept raw in the inbox
with their verdict.

The provider hears success only after the commit of what the notification caused (its inbox
row among it); a rejected notification changes nothing but its inbox row.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain.money import parse_yuan
from dueflow.exceptions import (
    AmountMismatch,
    BackendError,
    Busy,
    Conflict,
    DomainError,
    DueflowError,
    InvalidInput,
    MalformedNotification,
    NotificationRejected,
    ProviderError,
    UnstorableValue,
    WrongMerchant,
)
from dueflow.payments.base import NotificationEvent, ProviderNotification, VerifiedPayment
from dueflow.service import given_back, refunds
from dueflow.service import payments as payment_service
from dueflow.service.deps import Deps
from dueflow.store import notifications, payments

log = logging.getLogger(__name__)

#: The largest notification body kept and judged; a larger one is refused.
MAX_BODY = 64 * 1024


class _Refusal(NamedTuple):
    """How a notification that raised ``error`` is judged: the level and the words of its log
    line, the verdict's outcome (the provider hears "fail" and retries)."""

    error: type[DueflowError]
    level: int
    said: str
    outcome: str


#: The refusals, the first one whose error a notification raised deciding.
_REFUSALS = (
    # The database refused what applying it wrote: our trouble, not a forged notification.
    _Refusal(Conflict, logging.ERROR, "not applied", "error"),
    _Refusal(UnstorableValue, logging.ERROR, "not applied", "error"),
    _Refusal(NotificationRejected, logging.WARNING, "rejected", "rejected"),
    _Refusal(DomainError, logging.WARNING, "rejected", "rejected"),
    # The order stayed locked for the whole wait (a slow close at the provider): nothing is
    # wrong here, the provider's retry is applied.
    _Refusal(Busy, logging.WARNING, "not applied yet", "busy"),
    _Refusal(BackendError, logging.ERROR, "not applied", "error"),
    _Refusal(ProviderError, logging.ERROR, "not applied", "error"),
)
_REFUSED = tuple(refusal.error for refusal in _REFUSALS)


@dataclass(frozen=True)
class Receipt:
    """How to answer the provider: accepted (it stops retrying) or not (it retries)."""

    accepted: bool
    outcome: str
    inbox_id: int
    message: str = ""


async def receive(
    deps: Deps, provider_name: str, body: bytes, headers: Mapping[str, str]
) -> Receipt:
    """Verify, apply and keep one raw notification.

    One write transaction: the inbox row, with its verdict, is written in the transaction of
    the payment's effects when it is applied, or on its own when it is refused, fails or
    causes nothing (the refused notification's transaction rolled back first). Nothing is
    answered before that commit, and the provider retries every notification it has no answer
    to, so a crash before the commit loses no payment: the retry is kept and applied
    (docs/design.md, "Notifications").
    """
    received = notifications.Received(
        provider_name, body[:MAX_BODY], len(body) > MAX_BODY, headers, deps.clock.now()
    )
    note: ProviderNotification | None = None
    try:
        if received.truncated:
            raise MalformedNotification(f"body over {MAX_BODY} bytes")
        # Verified on the loop: an RSA-2048 verify takes about 17 µs and the AES-GCM decrypt
        # about 2 µs here, about 1 % of a notification's CPU; a hand-off to a thread costs more.
        note = deps.providers.get(provider_name).verify_notification(body, headers, received.at)
        outcome, inbox_id = await _apply(deps, provider_name, note, received)
    except _REFUSED as exc:
        refusal = next(r for r in _REFUSALS if isinstance(exc, r.error))
        receipt = await _judged(
            deps, received, note, accepted=False, outcome=refusal.outcome, error=exc
        )
        log.log(
            refusal.level,
            "%s notification %s %s: %s",
            provider_name,
            receipt.inbox_id,
            refusal.said,
            exc.message,
        )
        return receipt
    except Exception as exc:
        # A bug (or input nothing above foresaw) still gets its row and verdict, the provider
        # hears "fail" and retries, and no exception text leaks.
        unexpected = DueflowError(f"unexpected {type(exc).__name__}")
        receipt = await _judged(
            deps, received, note, accepted=False, outcome="error", error=unexpected
        )
        log.error(
            "%s notification %s failed unexpectedly",
            provider_name,
            receipt.inbox_id,
            exc_info=exc,
        )
        return receipt
    deps.metrics.notifications.labels(provider_name, outcome).inc()
    return Receipt(True, outcome, inbox_id)


async def _kept(
    conn: AsyncConnection,
    received: notifications.Received,
    note: ProviderNotification | None,
    *,
    outcome: str,
    error: Exception | None = None,
) -> int:
    """The inbox row of ``received`` with its verdict, in ``conn``'s transaction."""
    message = getattr(error, "message", str(error)) if error is not None else ""
    code = getattr(error, "code", "error")
    return await notifications.keep(
        conn,
        received,
        verified=note is not None,
        outcome=outcome,
        error=f"{code}: {message}" if error is not None else None,
        pay_no=note.pay_no if note else None,
        event=note.event.value if note else None,
    )


async def _judged(
    deps: Deps,
    received: notifications.Received,
    note: ProviderNotification | None,
    *,
    accepted: bool,
    outcome: str,
    error: Exception | None = None,
) -> Receipt:
    """The inbox row and its verdict in a transaction of their own (refused, failed, or a
    refund's answer)."""
    deps.metrics.notifications.labels(received.provider, outcome).inc()
    message = getattr(error, "message", str(error)) if error is not None else ""
    async with deps.db.write() as conn:
        inbox_id = await _kept(conn, received, note, outcome=outcome, error=error)
    return Receipt(accepted, outcome, inbox_id, message)


async def _provider_refund(
    deps: Deps, provider_name: str, note: ProviderNotification, received: notifications.Received
) -> tuple[str, int]:
    """A refund the provider made by itself: recorded on the attempt (the amount it names,
    else the attempt's), as the close that caused it records it."""
    assert note.refund is not None
    async with deps.db.read() as conn:
        attempt = await payments.by_pay_no(conn, note.pay_no)
    _checker(provider_name, note)(attempt)
    assert attempt is not None
    try:
        amount = parse_yuan(note.refund.reason)
    except InvalidInput:
        amount = attempt.amount
    await given_back.record(deps, [(attempt, amount)], deps.clock.now())
    async with deps.db.write() as conn:
        inbox_id = await _kept(conn, received, note, outcome="provider_refund")
    return "provider_refund", inbox_id


def _checker(provider_name: str, note: ProviderNotification) -> Callable[[Row[Any] | None], None]:
    """The notification's own checks of its attempt, before any effect: known, this provider's,
    and (when paid) the exact amount."""

    def check(attempt: Row[Any] | None) -> None:
        if attempt is None:
            raise NotificationRejected(f"unknown out_trade_no {note.pay_no}")
        if attempt.provider != provider_name:
            raise WrongMerchant(f"{note.pay_no} is a {attempt.provider} attempt")
        if note.event is NotificationEvent.PAID and note.amount != attempt.amount:
            raise AmountMismatch(
                f"notified {note.amount}, attempt {note.pay_no} is for {attempt.amount}"
            )

    return check


async def _apply(
    deps: Deps, provider_name: str, note: ProviderNotification, received: notifications.Received
) -> tuple[str, int]:
    """Apply a verified notification and keep it with its verdict; returns the outcome and the
    inbox id."""
    if note.event is NotificationEvent.REFUND:
        if note.refund_no is None or note.refund is None:
            raise MalformedNotification("a refund notification without its refund")
        if note.refund_no == note.pay_no:
            # Numbered by the trade itself: a refund the provider made on its own (Alipay's
            # cancel of a trade paid meanwhile), never one of ours.
            return await _provider_refund(deps, provider_name, note, received)
        await refunds.record_answer(deps, note.refund_no, note.refund)
        outcome = "refund_updated"
        async with deps.db.write() as conn:
            return outcome, await _kept(conn, received, note, outcome=outcome)
    check = _checker(provider_name, note)
    if note.event is not NotificationEvent.PAID or note.amount is None:
        async with deps.db.write() as conn:
            # Paid without an amount: the check refuses it (no amount equals the attempt's).
            check(await payments.by_pay_no(conn, note.pay_no))
            return "recorded", await _kept(conn, received, note, outcome="recorded")

    kept: list[int] = []

    async def verdict(conn: AsyncConnection, result: payment_service.PaymentOutcome) -> None:
        kept.append(await _kept(conn, received, note, outcome=result.value))

    # The check, the confirmation and the inbox row: one transaction, committed before the
    # answer.
    paid = VerifiedPayment(note.pay_no, note.amount, note.provider_trade_no)
    outcome = await payment_service.confirm_payment(
        deps, paid, actor=provider_name, check=check, also=verdict
    )
    return outcome.value, kept[-1]
