"""Closing the payment attempts a paid order left open, so the buyer cannot pay twice.

A buyer may open several codes for one order (an Alipay QR code, then a WeChat one). When one is
paid, the others stay payable at their providers until their expiry. The payment's transaction
schedules a ``close_attempts`` timer, due at once, when the order has other open attempts; the
worker runs :func:`close_leftover_attempts` after the commit and closes them (close-or-query,
concurrently up to ``provider_concurrency``). An answer that is unknown keeps the attempt open
and puts the timer back with the usual backoff (stuck after 5 tries, still retried), so a failed
close is logged and tried again until the provider answers. A second payment that lands anyway,
found by the close or notified, goes through the one confirm path: a ``paid_twice`` discrepancy
and a refund in review.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row

from dueflow.exceptions import PaymentMismatch
from dueflow.payments.base import CloseResult, VerifiedPayment
from dueflow.service import payments as payment_service
from dueflow.service.deps import Deps
from dueflow.store import payments, timers
from dueflow.store.timers import Claimed

log = logging.getLogger(__name__)


async def close_leftover_attempts(deps: Deps, batch: Sequence[Claimed]) -> None:
    """The ``close_attempts`` timer: close the open attempts of the batch's orders at their
    providers; finish each order's timer once none is left open, otherwise retry it."""
    now = deps.clock.now()
    async with deps.db.read() as conn:
        rows = await payments.for_orders(conn, [t.order_id for t in batch], state=payments.OPEN)
    unknown: dict[int, str] = {}
    closed: list[int] = []
    for row, outcome in await payment_service.close_each(deps, rows, now):
        if outcome.result is CloseResult.CLOSED_UNPAID:
            closed.append(row.id)
        elif outcome.result is CloseResult.PAID and outcome.payment is not None:
            problem = await _paid_as_well(deps, row, outcome.payment)
            if problem:
                unknown[row.order_id] = problem
        else:
            log.warning("could not close %s yet: %s", row.pay_no, outcome.reason)
            unknown[row.order_id] = f"{row.pay_no}: {outcome.reason}"
    async with deps.db.write() as conn:
        await payments.close_attempts(conn, closed, now)
        await timers.finish_or_retry(
            conn, batch, unknown, done="leftover attempts closed", error="close unknown", now=now
        )


async def _paid_as_well(deps: Deps, row: Row[Any], payment: VerifiedPayment) -> str:
    """The close found the leftover trade paid: record it through the confirm path (a
    ``paid_twice`` refund) or, for another amount, as a mismatch; returns why it must be tried
    again, or "" when it is recorded."""
    try:
        await payment_service.confirm_payment(
            deps, payment, actor="close_or_query", busy_goes_ahead=True
        )
    except PaymentMismatch as exc:
        async with deps.db.write() as conn:
            await payment_service.record_mismatch_at_close(
                conn, payment, detail=exc.message, now=deps.clock.now()
            )
    except Exception as exc:
        log.exception("recording the second payment %s failed", row.pay_no)
        return f"{row.pay_no}: recording the payment failed: {type(exc).__name__}: {exc}"
    return ""
