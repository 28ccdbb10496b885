"""Close-or-query: closing the open trades of orders about to be cancelled."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain.lifecycle import OrderStatus
from dueflow.payments.base import (
    Attempt,
    CloseOutcome,
    CloseResult,
    StartAnswer,
)
from dueflow.service import given_back
from dueflow.service.deps import Deps
from dueflow.store import orders, payments

log = logging.getLogger(__package__)


def attempt_of(row: Row[Any]) -> Attempt:
    """A stored attempt as the provider port takes it."""
    return Attempt(
        pay_no=row.pay_no,
        order_id=row.order_id,
        provider=row.provider,
        amount=row.amount,
        expires_at=row.expires_at,
        start=StartAnswer(row.start_answer or StartAnswer.UNKNOWN),
    )


async def close_each(
    deps: Deps, attempts: Sequence[Row[Any]], now: datetime
) -> list[tuple[Row[Any], CloseOutcome]]:
    """Close-or-query every attempt, concurrently with a bound; each with its outcome."""
    limit = asyncio.Semaphore(deps.provider_concurrency)

    async def one(row: Row[Any]) -> tuple[Row[Any], CloseOutcome]:
        async with limit:
            try:
                provider = deps.providers.get(row.provider)
                return row, await provider.close_or_query(attempt_of(row), now)
            except Exception as exc:  # a provider bug must not cancel on a guess
                log.exception("close-or-query failed for %s", row.pay_no)
                return row, CloseOutcome.unknown(f"{type(exc).__name__}: {exc}")

    outcomes = list(await asyncio.gather(*(one(row) for row in attempts)))
    returned = [(row, o.refunded) for row, o in outcomes if o.refunded is not None]
    if returned:
        await given_back.record(deps, returned, now)
    return outcomes


async def close_attempts(
    deps: Deps, attempts: Sequence[Row[Any]], now: datetime
) -> dict[int, CloseOutcome]:
    """Close-or-query every open attempt (:func:`close_each`); one outcome per order: paid if
    any attempt was paid, else unknown if any answer is unknown, else closed."""
    by_order: dict[int, CloseOutcome] = {}
    rank = {CloseResult.PAID: 2, CloseResult.UNKNOWN: 1, CloseResult.CLOSED_UNPAID: 0}
    for row, outcome in await close_each(deps, attempts, now):
        order_id = row.order_id
        best = by_order.get(order_id)
        if best is None or rank[outcome.result] > rank[best.result]:
            by_order[order_id] = outcome
    return by_order


async def opened_since(
    conn: AsyncConnection, order_ids: Sequence[int], closed: Sequence[Row[Any]]
) -> set[int]:
    """Inside the cancel's transaction: the unpaid orders with an open attempt that
    close-or-query did not see (started meanwhile). Cancelling them now would leave a payable
    trade behind. (A paid order's leftover trades are closed by its own ``close_attempts``
    timer, whatever becomes of the order.)"""
    seen = {row.pay_no for row in closed}
    unseen = {
        row.order_id
        for row in await payments.for_orders(conn, order_ids, state=payments.OPEN)
        if row.pay_no not in seen
    }
    if not unseen:
        return unseen
    pending = OrderStatus.PENDING_PAYMENT.value
    return {r.id for r in await orders.many(conn, list(unseen)) if r.status == pending}


async def open_attempts(deps: Deps, order_ids: Sequence[int], now: datetime) -> list[Row[Any]]:
    """The open attempts of those of ``order_ids`` that are still pending payment."""
    async with deps.db.read() as conn:
        rows = await payments.for_orders(conn, order_ids, state=payments.OPEN)
        if not rows:
            return []
        live = {
            r.id
            for r in await orders.many(conn, list({r.order_id for r in rows}))
            if r.status == OrderStatus.PENDING_PAYMENT.value
        }
    return [r for r in rows if r.order_id in live]
