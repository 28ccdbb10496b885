"""Provider notifications: kept raw in the inbox, verified before anything else, applied once.

The provider hears success only after the commit of what the notification caused; a rejected
notification changes nothing but its inbox row.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from dueflow.exceptions import (
    AmountMismatch,
    BackendError,
    DomainError,
    MalformedNotification,
    NotificationRejected,
    ProviderError,
    WrongMerchant,
)
from dueflow.payments.base import NotificationEvent, ProviderNotification, VerifiedPayment
from dueflow.service import payments as payment_service
from dueflow.service import refunds
from dueflow.service.deps import Deps
from dueflow.store import notifications, payments

log = logging.getLogger(__name__)

#: The largest notification body kept and judged; a larger one is refused.
MAX_BODY = 64 * 1024


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
    """Keep, verify and apply one raw notification."""
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
        note = deps.providers.get(provider_name).verify_notification(body, headers, now)
        outcome = await _apply(deps, provider_name, note)
    except (NotificationRejected, DomainError) as exc:
        log.warning("%s notification %s rejected: %s", provider_name, inbox_id, exc.message)
        return await _judged(
            deps, provider_name, inbox_id, note, accepted=False, outcome="rejected", error=exc
        )
    except (BackendError, ProviderError) as exc:
        log.error("%s notification %s not applied: %s", provider_name, inbox_id, exc.message)
        return await _judged(
            deps, provider_name, inbox_id, note, accepted=False, outcome="error", error=exc
        )
    return await _judged(deps, provider_name, inbox_id, note, accepted=True, outcome=outcome)


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
    deps.metrics.notifications.labels(provider, outcome).inc()
    message = getattr(error, "message", str(error)) if error is not None else ""
    code = getattr(error, "code", "error")
    async with deps.db.write() as conn:
        await notifications.judge(
            conn,
            inbox_id,
            verified=note is not None,
            outcome=outcome,
            error=f"{code}: {message}" if error is not None else None,
            pay_no=note.pay_no if note else None,
            event=note.event.value if note else None,
        )
    return Receipt(accepted, outcome, inbox_id, message)


async def _apply(deps: Deps, provider_name: str, note: ProviderNotification) -> str:
    if note.event is NotificationEvent.REFUND:
        if note.refund_no is None or note.refund is None:
            raise MalformedNotification("a refund notification without its refund")
        await refunds.record_answer(deps, note.refund_no, note.refund)
        return "refund_updated"
    async with deps.db.read() as conn:
        attempt = await payments.by_pay_no(conn, note.pay_no)
    if attempt is None:
        raise NotificationRejected(f"unknown out_trade_no {note.pay_no}")
    if attempt.provider != provider_name:
        raise WrongMerchant(f"{note.pay_no} is a {attempt.provider} attempt")
    if note.event is not NotificationEvent.PAID:
        return "recorded"
    if note.amount != attempt.amount:
        raise AmountMismatch(
            f"notified {note.amount}, attempt {note.pay_no} is for {attempt.amount}"
        )
    paid = VerifiedPayment(note.pay_no, attempt.amount, note.provider_trade_no)
    return (await payment_service.confirm_payment(deps, paid, actor=provider_name)).value
