"""The effects that go with each move, shared by people's actions and timers.

Each function runs inside the caller's write transaction, moves the orders that are still in
the expected status (one conditional UPDATE per group), and does in the same transaction
everything the move implies: holds, timers, refunds, timeline. It returns the orders it moved.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, Protocol, TypedDict, Unpack

from sqlalchemy import Column, Row
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain.lifecycle import LIFECYCLES, OrderEvent, OrderStatus
from dueflow.domain.lifecycle import lifecycle as flow_named
from dueflow.domain.timers import TimerKind
from dueflow.service.deps import Deps
from dueflow.store import aftersale, events, holds, orders, payments, timers
from dueflow.store.db import after_commit
from dueflow.store.holds import Hold
from dueflow.store.schema import orders as t_orders

S = OrderStatus
DEFAULT_RATING = 5
DEFAULT_COMMENT = "Default positive review."


async def cancel(
    conn: AsyncConnection,
    deps: Deps,
    order_ids: Sequence[int],
    *,
    how: Cancel,
    expected: OrderStatus,
    now: datetime,
    event: OrderEvent,
    actor: str,
    due_only: bool,
    holds_later: bool = False,
) -> list[Row[Any]]:
    """Cancel the orders still in ``expected`` (:data:`UNPAID`: their trades closed and what
    they hold released; :data:`PAID`: a refund in review, what they held forfeited), with
    their timeline, timers and the buyers' notices. One statement per step for the batch.

    ``holds_later``: the caller lets go of the holds itself with :func:`let_go` in the same
    transaction, as late as it can (the rows of SKUs, flash sales and buyers' counts are
    shared with other transactions, and are then locked only until the commit)."""
    values = {"cancelled_at": now, "cancel_reason": event.value}
    moved = await _move(conn, order_ids, expected, event, now, values, due_only)
    if not moved:
        return moved
    ids = [r.id for r in moved]
    await _record_cancels(conn, moved, expected, event, how.where, actor=actor, now=now)
    await how.settle_money(conn, ids, event, actor, now)
    await timers.cancel_for_orders(conn, ids, now)
    await _tell_buyers(conn, deps, ids, now)
    if not holds_later:
        await let_go(conn, deps, how, moved, now)
    return moved


async def let_go(
    conn: AsyncConnection, deps: Deps, how: Cancel, moved: Sequence[Row[Any]], now: datetime
) -> None:
    """Put back (or clear) what these cancelled orders hold: one statement per kind held, the
    kinds in the order every transaction takes them."""
    for hold, held_ids in deps.holds.for_flows(moved):
        await how.let_go(hold, conn, held_ids, now)


async def _close_trades(
    conn: AsyncConnection, ids: Sequence[int], event: OrderEvent, actor: str, now: datetime
) -> None:
    await payments.close_open(conn, ids, now)


async def _refund(
    conn: AsyncConnection, ids: Sequence[int], event: OrderEvent, actor: str, now: datetime
) -> None:
    paid = await payments.for_orders(conn, ids, state=payments.PAID)
    await payments.create_refunds(conn, paid, reason=event.value, now=now, actor=actor)


async def _release(hold: Hold, conn: AsyncConnection, ids: Sequence[int], now: datetime) -> int:
    return await hold.release(conn, ids, now)


async def _forfeit(hold: Hold, conn: AsyncConnection, ids: Sequence[int], now: datetime) -> int:
    return await hold.forfeit(conn, ids, now)


@dataclass(frozen=True)
class Cancel:
    """What a cancel does with an order's money and holds: the variants are data, the steps
    (:func:`cancel`, :func:`let_go`) one function for every flow."""

    #: Where each kind held goes (the detail of the ``released`` event).
    where: Mapping[str, str]
    #: The money step, in the cancel's transaction: close the open trades, or refund.
    settle_money: Callable[
        [AsyncConnection, Sequence[int], OrderEvent, str, datetime], Awaitable[None]
    ]
    #: What becomes of the holds: released, or forfeited.
    let_go: Callable[[Hold, AsyncConnection, Sequence[int], datetime], Awaitable[int]]


#: Where a released hold went, per kind (the detail of the ``released`` event).
RELEASED = {
    "goods": "back on sale",
    "seat": "back on sale",
    "sku": "back in stock",
    "flash": "back in the flash sale",
    "coupon": "back to the buyer",
}
#: Where a forfeited hold went, per kind.
FORFEITED = {
    "goods": "taken off sale",
    "seat": "let go, tickets void",
    "sku": "kept out of stock (an operator decides)",
    "flash": "kept sold",
    "coupon": "kept used",
}
#: An unpaid order is cancelled: its open trades closed, what it holds released.
UNPAID = Cancel(RELEASED, _close_trades, _release)
#: A paid order is cancelled (not shipped in time, the seller or the organizer cancels): a
#: refund in review, what it held forfeited (goods off sale, tickets void).
PAID = Cancel(FORFEITED, _refund, _forfeit)
#: pending_payment -> cancelled: close attempts, cancel timers, release what each order holds.
cancel_unpaid = partial(cancel, how=UNPAID, expected=S.PENDING_PAYMENT)


class Why(TypedDict):
    """What makes a move: when, the event, who (the timeline's actor), and whether only the
    orders past the deadline of their status move (a timer's) or every one (a person's)."""

    now: datetime
    event: OrderEvent
    actor: str
    due_only: bool


class Move(Protocol):
    """A move with its effects, as people's actions and deadline timers make it: in the
    caller's write transaction, the orders still in the status it expects move. Returns the
    orders moved and the timers armed for their next stage (for the trigger, after the
    commit)."""

    async def __call__(
        self, conn: AsyncConnection, deps: Deps, order_ids: Sequence[int], **why: Unpack[Why]
    ) -> tuple[list[Row[Any]], list[timers.Armed]]:
        """Make the move; see the class."""


async def cancel_unshipped(
    conn: AsyncConnection, deps: Deps, order_ids: Sequence[int], **why: Unpack[Why]
) -> tuple[list[Row[Any]], list[timers.Armed]]:
    """pending_shipment -> cancelled, as :func:`cancel` with :data:`PAID` (a refund in review,
    what the orders held forfeited); no timer is armed."""
    moved = await cancel(conn, deps, order_ids, how=PAID, expected=S.PENDING_SHIPMENT, **why)
    return moved, []


async def _tell_buyers(
    conn: AsyncConnection, deps: Deps, order_ids: Sequence[int], now: datetime
) -> None:
    """The outbox of the cancel: an ``order_closed`` notice timer per cancelled order, in the
    cancel's transaction (one INSERT ... SELECT for the batch), handed to the trigger after the
    commit (the notice is sent by the worker, so a failing notifier never holds up or rolls
    back a cancel)."""
    if not order_ids:
        return
    armed = await timers.schedule_for_orders(conn, order_ids, TimerKind.ORDER_CLOSED, now, now)
    after_commit(conn, lambda: deps.arm(armed))


def stage_deadline(status: OrderStatus) -> Column[Any]:
    """The deadline column an order in ``status`` waits on (the same in every flow that has a
    stage there)."""
    names = {f.stages[status].deadline for f in LIFECYCLES.values() if status in f.stages}
    (name,) = names
    return t_orders.c[name]


async def _move(
    conn: AsyncConnection,
    order_ids: Sequence[int],
    expected: OrderStatus,
    event: OrderEvent,
    now: datetime,
    values: orders.Values,
    due_only: bool,
) -> list[Row[Any]]:
    """The conditional UPDATE of a move (:func:`orders.move`); with ``due_only``, only of the
    orders past the deadline of ``expected``."""
    due = stage_deadline(expected) if due_only else None
    return await orders.move(
        conn, order_ids, expected=expected, event=event, now=now, values=values, due=due
    )


async def record_moves(
    conn: AsyncConnection,
    moved: Sequence[Row[Any]],
    expected: OrderStatus,
    event: OrderEvent,
    *,
    actor: str,
    now: datetime,
) -> None:
    """The timeline entry of each moved order, naming the status its flow moved it to."""
    for to, rows in orders.moved_to(moved, expected, event).items():
        await orders.record_events(
            conn, rows, event=event.value, actor=actor, now=now, from_status=expected, to_status=to
        )


async def _record_cancels(
    conn: AsyncConnection,
    moved: Sequence[Row[Any]],
    expected: OrderStatus,
    event: OrderEvent,
    where: Mapping[str, str],
    *,
    actor: str,
    now: datetime,
) -> None:
    """The timeline of a cancel, in one statement for the batch: each order's move (naming the
    status its flow moved it to), then each order's ``released`` event, in that order."""
    entries = [
        events.Entry(r.id, event.value, expected.value, to.value)
        for to, rows in orders.moved_to(moved, expected, event).items()
        for r in sorted(rows, key=lambda r: r.id)
    ]
    entries += await _released(conn, moved, where)
    await events.record(conn, entries, actor=actor, now=now)


async def _released(
    conn: AsyncConnection, moved: Sequence[Row[Any]], where: Mapping[str, str]
) -> list[events.Entry]:
    """The ``released`` event of each cancelled order: what it held, and where each kind
    went."""
    lines = await holds.held_lines(conn, [r.id for r in moved])
    entries = []
    for r in sorted(moved, key=lambda r: r.id):
        by_kind: dict[str, list[Row[Any]]] = defaultdict(list)
        for line in lines[r.id]:
            by_kind[line.kind].append(line)
        parts = [f"{holds.describe(group)} {where[kind]}" for kind, group in by_kind.items()]
        data = {
            "how": "released" if where is RELEASED else "forfeited",
            "lines": [
                {
                    "kind": line.kind,
                    "item_id": line.item_id,
                    "label": line.label,
                    "quantity": line.quantity,
                    "went": where[line.kind],
                }
                for line in lines[r.id]
            ],
        }
        entries.append(
            events.Entry(r.id, "released", detail="; ".join(parts) or "nothing held", data=data)
        )
    return entries


async def receive(
    conn: AsyncConnection, deps: Deps, order_ids: Sequence[int], **why: Unpack[Why]
) -> tuple[list[Row[Any]], list[timers.Armed]]:
    """shipped -> where each flow goes at receipt: received (the review deadline and its
    auto_review timer) or completed."""
    now, event, actor, due_only = why["now"], why["event"], why["actor"], why["due_only"]

    def values(flow_name: str, order_type: str) -> dict[str, Any]:
        to = flow_named(flow_name).moves[(S.SHIPPED, event)]
        stage = flow_named(flow_name).stages.get(to)
        changes: dict[str, Any] = {"received_at": now}
        if stage is not None:
            duration = getattr(deps.policy.durations(order_type), stage.duration)
            changes[stage.deadline] = now + duration
        if to is S.COMPLETED:
            changes["completed_at"] = now
        return changes

    moved = await _move(conn, order_ids, S.SHIPPED, event, now, values, due_only)
    ids = [r.id for r in moved]
    await timers.cancel_for_orders(conn, ids, now)
    new = []
    for r in moved:
        to = flow_named(r.flow).moves[(S.SHIPPED, event)]
        stage = flow_named(r.flow).stages.get(to)
        if stage is not None:
            new.append(
                timers.NewTimer(r.id, stage.timer, values(r.flow, r.order_type)[stage.deadline])
            )
    armed = await timers.schedule(conn, new, now)
    await record_moves(conn, moved, S.SHIPPED, event, actor=actor, now=now)
    return moved, armed


async def complete(
    conn: AsyncConnection, deps: Deps, order_ids: Sequence[int], **why: Unpack[Why]
) -> tuple[list[Row[Any]], list[timers.Armed]]:
    """received -> completed; a default positive review for whoever has none. No timer is
    armed: completed is final."""
    now, event, actor, due_only = why["now"], why["event"], why["actor"], why["due_only"]
    moved = await _move(conn, order_ids, S.RECEIVED, event, now, {"completed_at": now}, due_only)
    ids = [r.id for r in moved]
    reviewed = await aftersale.reviewed_roles(conn, ids)
    defaults = [
        {
            "order_id": r.id,
            "role": role,
            "author_id": r.buyer_id if role == "buyer" else r.seller_id,
            "rating": DEFAULT_RATING,
            "comment": DEFAULT_COMMENT,
            "is_default": True,
            "created_at": now,
        }
        for r in moved
        for role in ("buyer", "seller")
        if role not in reviewed[r.id]
    ]
    await aftersale.insert_reviews(conn, defaults)
    await timers.cancel_for_orders(conn, ids, now)
    await record_moves(conn, moved, S.RECEIVED, event, actor=actor, now=now)
    return moved, []
