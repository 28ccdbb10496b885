"""What a provider gives back of a payment by itself, not through a refund of ours.

Alipay's ``trade.cancel`` of a code paid in the instant before it refunds the payment
(``action=refund``). The close that caused it, or the provider's notification of that refund,
records the amount on the attempt (``payments.provider_refunded``); the payment, applied later,
then makes no refund of ours (:mod:`dueflow.service.payments`), and one applied before it is a
``refunded_by_provider`` discrepancy for an operator.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.payments.base import VerifiedPayment
from dueflow.service import discrepancies
from dueflow.service.deps import Deps
from dueflow.store import orders, payments

log = logging.getLogger(__name__)


def covers(attempt: Row[Any]) -> bool:
    """Whether the provider gave the attempt's whole amount back by itself."""
    returned = attempt.provider_refunded
    return returned is not None and returned >= attempt.amount


async def record(deps: Deps, given_back: Sequence[tuple[Row[Any], Decimal]], now: datetime) -> None:
    """A provider gave payments back by itself (a close, Alipay's cancel of a trade paid
    meanwhile; or its notification of that refund): the fact is written at once, once per
    attempt, whatever the caller then does, so the payment's notification finds it
    and needs no refund of ours. An attempt already recorded paid (its notification came
    first) is a discrepancy for an operator: the order holds money the provider gave back."""
    async with deps.db.write() as conn:
        for row, amount in given_back:
            if not await payments.record_provider_refund(conn, row.id, amount):
                continue
            detail = f"{row.provider} {row.pay_no} gave back {amount} by itself (trade cancel)"
            await orders.record_events(
                conn,
                [row.order_id],
                event="provider_refund",
                actor=row.provider,
                now=now,
                detail=detail,
                data={"provider": row.provider, "pay_no": row.pay_no, "amount": amount},
            )
            attempt = await payments.by_pay_no(conn, row.pay_no)
            if attempt is not None and attempt.state == payments.PAID:
                await payments.record_discrepancy(
                    conn,
                    kind="refunded_by_provider",
                    order_id=row.order_id,
                    payment_id=row.id,
                    detail=f"{detail} after dueflow recorded it paid",
                    now=now,
                )
                log.error("DISCREPANCY refunded_by_provider: %s after it was recorded paid", detail)


async def record_late_payment(
    conn: AsyncConnection, attempt: Row[Any], payment: VerifiedPayment, *, now: datetime, actor: str
) -> None:
    """A payment the provider gave back by itself before it was applied (its refund notice came
    first): the attempt is paid and a ``refunded_by_provider`` discrepancy says so; the order
    holds none of that money, so it is not moved, and nothing is refunded."""
    await payments.mark_paid(conn, attempt.id, provider_trade_no=payment.provider_trade_no, now=now)
    detail = (
        f"{attempt.provider} {attempt.pay_no} paid {attempt.amount}, already given back "
        f"{attempt.provider_refunded} by {attempt.provider} itself: the order is not moved"
    )
    await discrepancies.record(
        conn,
        attempt,
        "refunded_by_provider",
        detail,
        actor=actor,
        now=now,
        provider_refunded=attempt.provider_refunded,
    )
    log.warning("DISCREPANCY refunded_by_provider: %s", detail)
