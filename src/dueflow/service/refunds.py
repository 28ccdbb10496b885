"""Refunds: one per paid attempt, with a fixed refund number reused on every retry.

pending_review -> (operator approves) processing -> succeeded | failed; failed -> (operator
retries) processing. While a refund is processing, a ``refund_check`` timer asks the provider
until it is final, and submits it again (same number) while the provider does not know it.

A refund the provider failed for good waits in ``failed`` for an operator: nothing submits it
again by itself. The operator retries it, rejects it (with a reason: no money goes back) or
records it settled off-line (with a reference, a bank transfer's number say); the last two are
open to a refund in review or processing too, and are final (:data:`CLOSABLE`), once the
provider says it neither paid this refund nor gave the trade back by itself.

A refund the provider refuses because the trade's money went back already by its own doing
(Alipay's cancel of a trade paid meanwhile) is ``already_refunded``: final, nothing went out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain import text
from dueflow.domain.timers import TimerKind
from dueflow.exceptions import InvalidInput, InvalidTransition, NotFound, ProviderUnavailable
from dueflow.payments.base import RefundOutcome, RefundRequest, RefundResult
from dueflow.service.deps import Deps
from dueflow.store import orders, payments, timers
from dueflow.store.payments import (
    REFUND_ALREADY_REFUNDED,
    REFUND_FAILED,
    REFUND_PENDING_REVIEW,
    REFUND_PROCESSING,
    REFUND_REJECTED,
    REFUND_SETTLED_OFFLINE,
    REFUND_SUCCEEDED,
)
from dueflow.store.timers import Claimed

log = logging.getLogger(__name__)
STATES = (
    REFUND_PENDING_REVIEW,
    REFUND_PROCESSING,
    REFUND_SUCCEEDED,
    REFUND_FAILED,
    REFUND_REJECTED,
    REFUND_SETTLED_OFFLINE,
    REFUND_ALREADY_REFUNDED,
)
#: The states an operator may close a refund from (reject, settle off-line), once the provider
#: has said no money went back (:func:`_not_paid_meanwhile`): a processing refund too, so
#: that none stays processing with nobody able to end it.
CLOSABLE = (REFUND_PENDING_REVIEW, REFUND_FAILED, REFUND_PROCESSING)
#: How long an operator's reason or reference may be (the API's limit too).
NOTE_LENGTH = 200
FINAL = {
    RefundResult.SUCCEEDED: REFUND_SUCCEEDED,
    RefundResult.FAILED: REFUND_FAILED,
    RefundResult.ALREADY_REFUNDED: REFUND_ALREADY_REFUNDED,
}
#: Status answers after which the refund is submitted again, with the same number.
RESUBMIT = frozenset({RefundResult.NOT_FOUND, RefundResult.UNKNOWN})
#: The first look after a refund was submitted (Alipay asks for at least 10 s).
FIRST_CHECK = timedelta(seconds=10)


async def list_refunds(
    deps: Deps, *, state: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    """The newest ``limit`` refunds, optionally in one state."""
    if state is not None and state not in STATES:
        raise InvalidInput(
            f"unknown refund state {state!r}; known: {', '.join(STATES)}", field="state"
        )
    async with deps.db.read() as conn:
        found = await payments.refunds_in(conn, state=state, limit=limit)
    return [dict(r._mapping) for r in found]


async def approve(deps: Deps, refund_id: int, *, actor: str = "operator") -> str:
    """An operator approves a refund in review: it is submitted to the provider. Returns the
    refund's state afterwards."""
    return await _submit(deps, refund_id, expected=REFUND_PENDING_REVIEW, actor=actor)


async def retry(deps: Deps, refund_id: int, *, actor: str = "operator") -> str:
    """An operator retries a failed refund with the same refund number."""
    return await _submit(deps, refund_id, expected=REFUND_FAILED, actor=actor)


async def _submit(deps: Deps, refund_id: int, *, expected: str, actor: str) -> str:
    now = deps.clock.now()
    async with deps.db.write() as conn:
        row = await payments.refund_by_id(conn, refund_id, for_update=True)
        if row is None:
            raise NotFound(f"no refund {refund_id}")
        if not await payments.move_refund(
            conn, refund_id, expected=expected, to=REFUND_PROCESSING, now=now
        ):
            raise InvalidTransition(
                f"refund {refund_id} is {row.state}, not {expected}", status=row.state
            )
        await orders.record_events(
            conn,
            [row.order_id],
            event="refund_submitted",
            actor=actor,
            now=now,
            detail=f"{row.refund_no} {row.amount}",
            data=refund_data(row),
        )
        # Followed from the moment it is processing: a crash before the provider answers
        # leaves a timer that asks (and resubmits) rather than a refund nobody watches.
        armed = await timers.schedule_again(
            conn, row.order_id, TimerKind.REFUND_CHECK, now + FIRST_CHECK, now
        )
    await deps.arm(armed)
    outcome = await _ask(deps, row, first=True)
    return await _apply(deps, row, outcome)


async def record_answer(deps: Deps, refund_no: str, outcome: RefundOutcome) -> str:
    """A provider told us (in a notification) where a refund stands; returns its state."""
    async with deps.db.read() as conn:
        row = await payments.refund_by_no(conn, refund_no)
    if row is None:
        raise NotFound(f"no refund {refund_no}")
    if row.state != REFUND_PROCESSING or outcome.result not in FINAL:
        return str(row.state)
    return await _apply(deps, row, outcome)


def refund_data(row: Row[Any]) -> dict[str, Any]:
    """What a refund event's envelope says of its refund (``data``)."""
    return {
        "refund_no": row.refund_no,
        "payment_id": row.payment_id,
        "provider": row.provider,
        "amount": row.amount,
        "reason": row.reason,
    }


def request_of(row: Row[Any]) -> RefundRequest:
    """A stored refund as the provider port takes it."""
    return RefundRequest(
        refund_no=row.refund_no,
        pay_no=row.pay_no,
        amount=row.amount,
        total=row.total,
        reason=row.reason,
    )


async def _ask(deps: Deps, row: Row[Any], *, first: bool) -> RefundOutcome:
    try:
        provider = deps.providers.get(row.provider)
        request = request_of(row)
        return await (provider.refund(request) if first else provider.refund_status(request))
    except Exception as exc:  # the provider's trouble is never a final answer
        log.exception("refund %s: provider call failed", row.refund_no)
        return RefundOutcome(RefundResult.UNKNOWN, f"{type(exc).__name__}: {exc}")


async def _follow(deps: Deps, row: Row[Any]) -> RefundOutcome:
    """Ask where a refund stands. One the provider does not know (or could not say about) is
    submitted again: the refund number is fixed, so the provider refunds once, and a request
    that never reached it (a bare 5xx, a crash before the call) gets there now. One it knows
    and is processing is only asked about."""
    outcome = await _ask(deps, row, first=False)
    if outcome.result not in RESUBMIT:
        return outcome
    again = await _ask(deps, row, first=True)
    if again.result is RefundResult.UNKNOWN:
        return RefundOutcome(again.result, f"{outcome.reason}; submitted again: {again.reason}")
    return again


async def _apply(deps: Deps, row: Row[Any], outcome: RefundOutcome) -> str:
    """Record a provider's answer; while not final, make sure a refund_check timer follows."""
    now = deps.clock.now()
    final = FINAL
    armed: list[timers.Armed] = []
    async with deps.db.write() as conn:
        if outcome.result in final:
            to = final[outcome.result]
            if not await payments.move_refund(
                conn,
                row.id,
                expected=REFUND_PROCESSING,
                to=to,
                now=now,
                error=outcome.reason or None if to == REFUND_FAILED else None,
            ):
                # Someone recorded an answer first (a notification and a check at once, or an
                # operator closed it): theirs stands, and no second event goes out to hosts.
                current = await payments.refund_by_id(conn, row.id)
                return str(current.state) if current is not None else to
            if not await payments.refunds_in(
                conn, state=REFUND_PROCESSING, order_ids=[row.order_id]
            ):
                await timers.cancel_for_orders(
                    conn,
                    [row.order_id],
                    now,
                    kinds=[TimerKind.REFUND_CHECK],
                    reason="refunds final",
                )
            await _record_outcome(conn, row, to, outcome, now)
            state = to
        else:
            armed = await timers.schedule_again(
                conn, row.order_id, TimerKind.REFUND_CHECK, now + FIRST_CHECK, now
            )
            state = REFUND_PROCESSING
    await deps.arm(armed)
    return state


async def check_refunds(deps: Deps, batch: Sequence[Claimed]) -> None:
    """The refund_check timer: ask the provider about every processing refund of the batch's
    orders; finish the timer once none is left processing, otherwise retry with backoff."""
    async with deps.db.read() as conn:
        rows = await payments.refunds_in(
            conn, state=REFUND_PROCESSING, order_ids=[t.order_id for t in batch]
        )
    answers = await asyncio.gather(*(_follow(deps, row) for row in rows))
    pending: dict[int, str] = {}
    for row, outcome in zip(rows, answers, strict=True):
        if await _apply(deps, row, outcome) == REFUND_PROCESSING:
            pending[row.order_id] = outcome.reason or outcome.result.value
    now = deps.clock.now()
    async with deps.db.write() as conn:
        # Refunds approved while this check ran are followed too: re-read before finishing.
        for row in await payments.refunds_in(
            conn, state=REFUND_PROCESSING, order_ids=[t.order_id for t in batch]
        ):
            pending.setdefault(row.order_id, "approved meanwhile")
        await timers.finish_or_retry(
            conn, batch, pending, done="refunds final", error="refund still processing", now=now
        )


async def reject(deps: Deps, refund_id: int, *, reason: str, actor: str = "operator") -> str:
    """An operator rejects a refund in review, failed or processing: no money goes back. Final; the reason
    is the order event's detail. Returns the refund's state (``rejected``).

    Raises:
        InvalidInput: the reason is empty, over 200 characters or not one line of text.
        NotFound: no such refund.
        InvalidTransition: the refund is final, or the provider paid it back.
    """
    note = _note(reason, "reason")
    return await _close(deps, refund_id, to=REFUND_REJECTED, detail=note, actor=actor)


async def settle_offline(
    deps: Deps, refund_id: int, *, reference: str, actor: str = "operator"
) -> str:
    """An operator records a refund in review, failed or processing as paid back outside dueflow (a bank
    transfer, say). Final; the reference is the order event's detail. Returns the refund's
    state (``settled_offline``).

    Raises:
        As :func:`reject` (InvalidInput: of the reference).
    """
    note = _note(reference, "reference")
    return await _close(deps, refund_id, to=REFUND_SETTLED_OFFLINE, detail=note, actor=actor)


def _note(value: str, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"a {what} is text", field=what)
    value = value.strip()
    if not 1 <= len(value) <= NOTE_LENGTH:
        raise InvalidInput(f"a {what} is 1-{NOTE_LENGTH} characters", field=what)
    problem = text.refused_character(value)
    if problem is not None:
        raise InvalidInput(f"the {what} {problem}", field=what)
    return value


async def _close(deps: Deps, refund_id: int, *, to: str, detail: str, actor: str) -> str:
    async with deps.db.read() as conn:
        found = await payments.refund_by_id(conn, refund_id)
    if found is not None and found.state in CLOSABLE:
        await _not_paid_meanwhile(deps, found)
    now = deps.clock.now()
    async with deps.db.write() as conn:
        row = await payments.refund_by_id(conn, refund_id, for_update=True)
        if row is None:
            raise NotFound(f"no refund {refund_id}")
        if row.state not in CLOSABLE or not await payments.close_refund(
            conn, refund_id, expected=row.state, to=to, now=now
        ):
            raise InvalidTransition(
                f"refund {refund_id} is {row.state}, not {' or '.join(CLOSABLE)}",
                status=row.state,
            )
        await orders.record_events(
            conn,
            [row.order_id],
            event=f"refund_{to}",
            actor=actor,
            now=now,
            detail=f"{row.refund_no} {row.amount}: {detail}",
            data={**refund_data(row), "note": detail},
        )
    return to


async def _not_paid_meanwhile(deps: Deps, row: Row[Any]) -> None:
    """Before a refund is closed by hand, ask the provider; money it paid back is never
    recorded rejected or settled. A refund submitted (failed or processing) may have been paid
    by its number (an operator's retry whose answer is still on its way, a late answer); any
    refund's trade may have been given back by the provider itself (Alipay's cancel of a trade
    paid meanwhile): settling that off-line would pay the buyer twice.

    Raises:
        InvalidTransition: the provider paid it or gave the trade back (now recorded
            succeeded or already_refunded) or is processing it.
        ProviderUnavailable: the provider did not say where it stands.
    """
    asks = [] if row.state == REFUND_PENDING_REVIEW else [_ask(deps, row, first=False)]
    asks.append(_on_its_own(deps, row))
    for outcome in await asyncio.gather(*asks):
        if outcome.result in (RefundResult.FAILED, RefundResult.NOT_FOUND):
            continue
        if outcome.result is RefundResult.UNKNOWN:
            raise ProviderUnavailable(
                f"cannot tell where refund {row.id} stands at {row.provider}; try again"
            )
        if outcome.result is RefundResult.PROCESSING:
            raise InvalidTransition(
                f"{row.provider} is still processing refund {row.id}", status=row.state
            )
        to = FINAL[outcome.result]
        await _record_final(deps, row, to, outcome)
        raise InvalidTransition(
            f"{row.provider} has paid refund {row.id} back ({outcome.reason}): it is {to} now",
            status=to,
        )


async def _on_its_own(deps: Deps, row: Row[Any]) -> RefundOutcome:
    try:
        return await deps.providers.get(row.provider).refunded_on_its_own(request_of(row))
    except Exception as exc:  # the provider's trouble is never a final answer
        log.exception("refund %s: provider call failed", row.refund_no)
        return RefundOutcome(RefundResult.UNKNOWN, f"{type(exc).__name__}: {exc}")


async def _record_final(deps: Deps, row: Row[Any], to: str, outcome: RefundOutcome) -> None:
    """A refund the provider paid (or whose trade it gave back) while an operator was closing
    it: recorded final from the state it was read in, with its order event."""
    now = deps.clock.now()
    async with deps.db.write() as conn:
        if await payments.move_refund(conn, row.id, expected=row.state, to=to, now=now):
            await _record_outcome(conn, row, to, outcome, now)


async def _record_outcome(
    conn: AsyncConnection, row: Row[Any], to: str, outcome: RefundOutcome, now: datetime
) -> None:
    """The order event of the provider's final answer about a refund (now ``to``)."""
    await orders.record_events(
        conn,
        [row.order_id],
        event=f"refund_{to}",
        actor=row.provider,
        now=now,
        detail=f"{row.refund_no} {outcome.reason}".strip(),
        data={**refund_data(row), "provider_message": outcome.reason or None},
    )
