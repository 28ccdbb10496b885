"""Provider notifications: kept raw in the inbox, verified before anything else, applied once.

The provider hears success only after the commit of what the notification caused; a rejected
notification changes nothing but its inbox row.
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
    """Keep, verify and apply one raw notification.

    Two write transactions when it is applied: the inbox row alone (committed before anything
    else, so a crash after receipt loses nothing), then the payment's effects together with the
    inbox row's verdict. A refused notification's transaction is rolled back and its verdict
    written on its own.
    """
    now = deps.clock.now()
    truncated = len(body) > MAX_BODY
    async with deps.db.write() as conn:
        inbox_id = await notifications.store(
            conn,
            provider=provider_name,
            body=body[:MAX_BODY],
            truncated=truncated,
            headers=headers,
            now=now,
        )
    note: ProviderNotification | None = None
    try:
        if truncated:
            raise MalformedNotification(f"body over {MAX_BODY} bytes")
        # Verified on the loop: an RSA-2048 verify takes about 17 µs and the AES-GCM decrypt
        # about 2 µs here, about 1 % of a notification's CPU; a hand-off to a thread costs more.
        note = deps.providers.get(provider_name).verify_notification(body, headers, now)
        outcome = await _apply(deps, provider_name, note, inbox_id)
    except _REFUSED as exc:
        refusal = next(r for r in _REFUSALS if isinstance(exc, r.error))
        log.log(
            refusal.level,
            "%s notification %s %s: %s",
            provider_name,
            inbox_id,
            refusal.said,
            exc.message,
        )
        return await _judged(
            deps, provider_name, inbox_id, note, accepted=False, outcome=refusal.outcome, error=exc
        )
    except Exception as exc:
        # A bug (or input nothing above foresaw) still gets its verdict: the row never stays
        # "received", the provider hears "fail" and retries, and no exception text leaks.
        log.exception("%s notification %s failed unexpectedly", provider_name, inbox_id)
        unexpected = DueflowError(f"unexpected {type(exc).__name__}")
        return await _judged(
            deps, provider_name, inbox_id, note, accepted=False, outcome="error", error=unexpected
        )
    deps.metrics.notifications.labels(provider_name, outcome).inc()
    return Receipt(True, outcome, inbox_id)


async def _verdict(
    conn: AsyncConnection,
    inbox_id: int,
    note: ProviderNotification | None,
    *,
    outcome: str,
    error: Exception | None = None,
) -> None:
    message = getattr(error, "message", str(error)) if error is not None else ""
    code = getattr(error, "code", "error")
    await notifications.judge(
        conn,
        inbox_id,
        verified=note is not None,
        outcome=outcome,
        error=f"{code}: {message}" if error is not None else None,
        pay_no=note.pay_no if note else None,
        event=note.event.value if note else None,
    )


async def _judged(
    deps: Deps,
    provider: str,
    inbox_id: int,
    note: ProviderNotification | None,
    *,
    accepted: bool,
    outcome: str,
    error: Exception | None = None,
) -> Receipt:
    """The verdict in a transaction of its own (refused, failed, or a refund's answer)."""
    deps.metrics.notifications.labels(provider, outcome).inc()
    message = getattr(error, "message", str(error)) if error is not None else ""
    async with deps.db.write() as conn:
        await _verdict(conn, inbox_id, note, outcome=outcome, error=error)
    return Receipt(accepted, outcome, inbox_id, message)


async def _provider_refund(
    deps: Deps, provider_name: str, note: ProviderNotification, inbox_id: int
) -> str:
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
        await _verdict(conn, inbox_id, note, outcome="provider_refund")
    return "provider_refund"


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


async def _apply(deps: Deps, provider_name: str, note: ProviderNotification, inbox_id: int) -> str:
    """Apply a verified notification and write its verdict; returns the outcome."""
    if note.event is NotificationEvent.REFUND:
        if note.refund_no is None or note.refund is None:
            raise MalformedNotification("a refund notification without its refund")
        if note.refund_no == note.pay_no:
            # Numbered by the trade itself: a refund the provider made on its own (Alipay's
            # cancel of a trade paid meanwhile), never one of ours.
            return await _provider_refund(deps, provider_name, note, inbox_id)
        await refunds.record_answer(deps, note.refund_no, note.refund)
        outcome = "refund_updated"
        async with deps.db.write() as conn:
            await _verdict(conn, inbox_id, note, outcome=outcome)
        return outcome
    check = _checker(provider_name, note)
    if note.event is not NotificationEvent.PAID or note.amount is None:
        async with deps.db.write() as conn:
            # Paid without an amount: the check refuses it (no amount equals the attempt's).
            check(await payments.by_pay_no(conn, note.pay_no))
            await _verdict(conn, inbox_id, note, outcome="recorded")
        return "recorded"

    async def verdict(conn: AsyncConnection, result: payment_service.PaymentOutcome) -> None:
        await _verdict(conn, inbox_id, note, outcome=result.value)

    # The check, the confirmation and the verdict: one transaction, committed before the answer.
    paid = VerifiedPayment(note.pay_no, note.amount, note.provider_trade_no)
    outcome = await payment_service.confirm_payment(
        deps, paid, actor=provider_name, check=check, also=verdict
    )
    return outcome.value
