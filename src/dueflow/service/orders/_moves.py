"""What buyers and sellers do to orders."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain.deadlines import DEFAULT_ORDER_TYPE
from dueflow.domain.lifecycle import OrderEvent, OrderStatus
from dueflow.domain.lifecycle import lifecycle as flow_named
from dueflow.domain.timers import TimerKind
from dueflow.exceptions import (
    Busy,
    GoodsUnavailable,
    InvalidInput,
    InvalidTransition,
    NotAllowed,
    NotFound,
    NotYourRole,
    ProviderUnavailable,
)
from dueflow.locks import base as locks
from dueflow.payments.base import CloseResult
from dueflow.service import lifecycle
from dueflow.service import payments as payment_service
from dueflow.service.deps import Deps
from dueflow.store import (
    aftersale,
    goods,
    holds,
    hot,
    idempotency,
    orders,
    payments,
    shows,
    timers,
    users,
)
from dueflow.store.goods import ON_SALE
from dueflow.store.schema import order_lines as line_rows
from dueflow.store.schema import orders as order_rows
from dueflow.store.schema import timers as timer_rows
from dueflow.store.types import CENT, fit

log = logging.getLogger(__name__)
S = OrderStatus
E = OrderEvent


async def place_order(
    deps: Deps,
    *,
    buyer_id: int,
    goods_id: int,
    key: idempotency.Key | None = None,
    buyer_known: bool = False,
) -> int:
    """Hold the goods for a new ``normal`` order awaiting payment; returns the order id. The
    server picks the order type (the buyer never does: it sets the buyer's own deadlines).
    ``buyer_known``: the caller has just read the buyer (authenticated them), so placing does
    not read it again.

    Raises:
        NotFound: no such goods or buyer.
        NotAllowed: the buyer sells these goods.
        GoodsUnavailable: another order holds them, or they are sold or off sale.
        Busy: the database is locked by others right now; try again.
    """
    placed = await place_order_view(
        deps, buyer_id=buyer_id, goods_id=goods_id, key=key, buyer_known=buyer_known
    )
    return int(placed["id"])


async def place_order_view(
    deps: Deps,
    *,
    buyer_id: int,
    goods_id: int,
    key: idempotency.Key | None = None,
    buyer_known: bool = False,
) -> dict[str, Any]:
    """:func:`place_order`, answering the new order's view (as :func:`order_view` shows it),
    built from what the placing transaction wrote: a new order has no payments, refunds,
    reviews or tickets yet, only its lines, its timers and its one event.

    Raises:
        As :func:`place_order`.
    """
    async with locks.held(deps.locks, f"goods:{goods_id}", deps.lock_ttl):
        placed, armed = await _place(deps, buyer_id, goods_id, key, buyer_known)
    await deps.arm(armed)
    return placed


async def _place(
    deps: Deps, buyer_id: int, goods_id: int, key: idempotency.Key | None, buyer_known: bool
) -> tuple[dict[str, Any], list[timers.Armed]]:
    now = deps.clock.now()
    async with deps.db.write() as conn:
        item = await goods.get(conn, goods_id)
        if item is None:
            raise NotFound(f"no goods {goods_id}")
        if not buyer_known:
            await known_buyer(conn, buyer_id)
        if item.seller_id == buyer_id:
            raise NotAllowed("you cannot buy your own goods")
        if item.status != ON_SALE or item.reserved_order_id is not None:
            raise GoodsUnavailable(f"goods {goods_id} are {_goods_state(item)}")
        line = holds.Line(kind="goods", item_id=goods_id, label=item.title, price=item.price)
        order = await insert_placed(
            conn,
            deps,
            flow="marketplace",
            order_type=DEFAULT_ORDER_TYPE,
            buyer_id=buyer_id,
            seller_id=item.seller_id,
            amount=item.price,
            lines=[line],
            now=now,
            goods_id=goods_id,
        )
        await deps.holds.of(line.kind).hold(conn, holds.Holder(order["id"], buyer_id), [line], now)
        return await finish_placing(
            conn, deps, order, [line], key, now=now, detail=f"goods {goods_id} for {item.price}"
        )


async def known_buyer(conn: AsyncConnection, buyer_id: int) -> None:
    """The buyer exists (for callers that have not read it already).

    Raises:
        NotFound: no such user.
    """
    if await users.by_id(conn, buyer_id) is None:
        raise NotFound(f"no user {buyer_id}")


async def insert_placed(
    conn: AsyncConnection,
    deps: Deps,
    *,
    flow: str,
    order_type: str,
    buyer_id: int,
    seller_id: int,
    amount: Decimal,
    lines: Sequence[holds.Line],
    now: datetime,
    goods_id: int | None = None,
    show_id: int | None = None,
) -> dict[str, Any]:
    """In the placing transaction of every flow: the new order awaiting payment and its lines
    (what it holds is taken next, by the caller); returns the order row as written.

    Raises:
        InvalidInput: ``amount`` is above what any configured provider takes in one payment
            (refused before anything is written: such an order could never be paid).
    """
    deps.providers.check_payable(amount)
    values: dict[str, Any] = {
        "flow": flow,
        "order_type": order_type,
        "buyer_id": buyer_id,
        "seller_id": seller_id,
        "amount": amount,
        "status": S.PENDING_PAYMENT.value,
        "created_at": now,
        "updated_at": now,
        "pay_deadline": deps.policy.pay_deadline(order_type, now),
    }
    if goods_id is not None:
        values["goods_id"] = goods_id
    if show_id is not None:
        values["show_id"] = show_id
    values["id"] = await orders.insert_order(conn, **values)
    await holds.insert_lines(conn, values["id"], lines)
    return orders.as_read(order_rows, values)


async def finish_placing(
    conn: AsyncConnection,
    deps: Deps,
    order: dict[str, Any],
    lines: Sequence[holds.Line],
    key: idempotency.Key | None,
    *,
    now: datetime,
    detail: str,
) -> tuple[dict[str, Any], list[timers.Armed]]:
    """Last in the placing transaction of every flow, once what the order holds is taken:
    the pay deadline's ``cancel_unpaid`` timer, the reminder's (unless it would come too late),
    the ``place`` event, and the request's Idempotency-Key with its answer. Returns the new
    order's view (as :func:`view_in` reads it, built from what was written) and the timers for
    the trigger (after commit)."""
    order_id, order_type = order["id"], order["order_type"]
    new = [timers.NewTimer(order_id, TimerKind.CANCEL_UNPAID, order["pay_deadline"])]
    remind_at = deps.policy.reminder_at(order_type, now)
    if remind_at is not None:
        new.append(timers.NewTimer(order_id, TimerKind.PAY_REMINDER, remind_at))
    scheduled = await timers.schedule_rows(conn, new, now)
    event = await orders.add_event(
        conn,
        order_id,
        event="place",
        actor=f"user:{order['buyer_id']}",
        now=now,
        to_status=S.PENDING_PAYMENT,
        detail=detail,
    )
    view = new_view(order, lines, [orders.as_read(timer_rows, t) for t in scheduled], event)
    await idempotency.tie(conn, key, view, now)
    return view, [timers.Armed(t["id"], t["due_at"]) for t in scheduled]


def new_view(
    order: dict[str, Any],
    lines: Sequence[holds.Line],
    scheduled: list[dict[str, Any]],
    event: dict[str, Any],
) -> dict[str, Any]:
    """The view :func:`view_in` reads of an order just placed, from what was written."""
    view = dict(order)
    view["lines"] = [
        {
            "kind": line.kind,
            "item_id": line.item_id,
            "label": fit(line_rows.c.label, line.label),
            "quantity": line.quantity,
            "price": line.price.quantize(CENT),
        }
        for line in lines
    ]
    view["tickets"], view["payments"], view["refunds"], view["reviews"] = [], [], [], []
    view["timers"] = scheduled
    view["notices"] = []
    view["timeline"] = [event]
    return view


def _goods_state(item: Row[Any] | hot.HotRow) -> str:
    if item.status != ON_SALE:
        return str(item.status).replace("_", " ")
    return "held by another order"


async def _own_order(
    conn: AsyncConnection, order_id: int, user_id: int, role: str, *, lock: bool = True
) -> Row[Any]:
    order = await orders.get(conn, order_id, for_update=lock)
    if order is None:
        raise NotFound(f"no order {order_id}")
    parties = {"buyer": order.buyer_id, "seller": order.seller_id}
    if parties[role] == user_id:
        return order
    other = "seller" if role == "buyer" else "buyer"
    if parties[other] == user_id:  # the other party knows the order: say whose action this is
        raise NotYourRole(f"only the {role} of order {order_id} may do this; you are its {other}")
    raise NotAllowed(f"order {order_id} is not yours as {role}")


def _refuse(order: Row[Any], event: OrderEvent) -> InvalidTransition:
    return InvalidTransition(
        f"cannot {event.value.replace('_', ' ')}: order {order.id} is {order.status}",
        status=order.status,
    )


async def cancel_by_buyer(deps: Deps, *, order_id: int, user_id: int) -> None:
    """The buyer cancels an unpaid order: trades are closed at the provider first.

    Raises:
        NotFound, NotAllowed, InvalidTransition: as the names say (NotYourRole, a NotAllowed,
            when the caller is the order's seller); InvalidTransition also when
            the trade turns out to be paid (the order is then pending shipment).
        ProviderUnavailable: the provider's answer is unknown; try again.
    """
    async with deps.db.read() as conn:
        order = await _own_order(conn, order_id, user_id, "buyer", lock=False)
    flow_named(order.flow).next_status(OrderStatus(order.status), E.BUYER_CANCEL)
    async with locks.held(deps.locks, f"order:{order_id}", deps.lock_ttl):
        await _cancel_unpaid_by_buyer(deps, order_id, user_id)


async def _cancel_unpaid_by_buyer(deps: Deps, order_id: int, user_id: int) -> None:
    now = deps.clock.now()
    attempts = await payment_service.open_attempts(deps, [order_id], now)
    outcome = (await payment_service.close_attempts(deps, attempts, now)).get(order_id)
    if outcome is not None and outcome.result is CloseResult.PAID:
        assert outcome.payment is not None
        await payment_service.confirm_payment_locked(deps, outcome.payment, actor="close_or_query")
        raise InvalidTransition(
            f"cannot cancel: order {order_id} was paid meanwhile", status=S.PENDING_SHIPMENT.value
        )
    if outcome is not None and outcome.result is CloseResult.UNKNOWN:
        raise ProviderUnavailable(f"cannot cancel yet: payment state unknown ({outcome.reason})")
    async with deps.db.write() as conn:
        order = await _own_order(conn, order_id, user_id, "buyer")
        if await payment_service.opened_since(conn, [order_id], attempts):
            raise Busy("a payment was started meanwhile; try again")
        moved = await lifecycle.cancel_unpaid(
            conn,
            deps,
            [order_id],
            now=now,
            event=E.BUYER_CANCEL,
            actor=f"user:{user_id}",
            due_only=False,
        )
        if not moved:
            raise _refuse(order, E.BUYER_CANCEL)


async def ship(deps: Deps, *, order_id: int, user_id: int, carrier: str, tracking_no: str) -> None:
    """The seller ships: the receive deadline starts.

    Raises:
        InvalidInput: empty or overlong carrier or tracking number.
        NotFound, NotAllowed, InvalidTransition: as the names say (NotYourRole, a NotAllowed,
            when the caller is the order's buyer).
    """
    carrier, tracking_no = _label(carrier, "carrier"), _label(tracking_no, "tracking number")
    now = deps.clock.now()
    async with deps.db.write() as conn:
        order = await _own_order(conn, order_id, user_id, "seller")
        flow_named(order.flow).next_status(OrderStatus(order.status), E.SHIP)
        moved = await orders.move(
            conn,
            [order_id],
            expected=S.PENDING_SHIPMENT,
            event=E.SHIP,
            now=now,
            values=lambda _flow, order_type: {
                "shipped_at": now,
                "carrier": carrier,
                "tracking_no": tracking_no,
                "receive_deadline": deps.policy.receive_deadline(order_type, now),
            },
        )
        if not moved:
            raise _refuse(order, E.SHIP)
        await timers.cancel_for_orders(conn, [order_id], now)
        armed = await timers.schedule(
            conn,
            [
                timers.NewTimer(
                    order_id,
                    TimerKind.CONFIRM_RECEIPT,
                    deps.policy.receive_deadline(order.order_type, now),
                )
            ],
            now,
        )
        await orders.record_events(
            conn,
            [order_id],
            event=E.SHIP.value,
            actor=f"user:{user_id}",
            now=now,
            from_status=S.PENDING_SHIPMENT,
            to_status=S.SHIPPED,
            detail=f"{carrier} {tracking_no}",
        )
    await deps.arm(armed)


def _label(value: str, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"a {what} is text")
    value = value.strip()
    if not 1 <= len(value) <= 64 or not value.isprintable():
        raise InvalidInput(f"a {what} is 1-64 printable characters")
    return value


async def cancel_by_seller(deps: Deps, *, order_id: int, user_id: int) -> None:
    """The seller cancels a paid order before shipping: a refund awaits review.

    Raises:
        NotFound, NotAllowed, InvalidTransition: as the names say.
    """
    now = deps.clock.now()
    async with deps.db.write() as conn:
        order = await _own_order(conn, order_id, user_id, "seller")
        flow_named(order.flow).next_status(OrderStatus(order.status), E.SELLER_CANCEL)
        moved = await lifecycle.cancel(
            conn,
            deps,
            [order_id],
            how=lifecycle.PAID,
            expected=S.PENDING_SHIPMENT,
            now=now,
            event=E.SELLER_CANCEL,
            actor=f"user:{user_id}",
            due_only=False,
        )
        if not moved:
            raise _refuse(order, E.SELLER_CANCEL)


async def confirm_receipt(deps: Deps, *, order_id: int, user_id: int) -> None:
    """The buyer confirms receipt: the review deadline starts.

    Raises:
        NotFound, NotAllowed, InvalidTransition: as the names say (NotYourRole, a NotAllowed,
            when the caller is the order's seller).
    """
    now = deps.clock.now()
    async with deps.db.write() as conn:
        order = await _own_order(conn, order_id, user_id, "buyer")
        flow_named(order.flow).next_status(OrderStatus(order.status), E.CONFIRM_RECEIPT)
        moved, armed = await lifecycle.receive(
            conn,
            deps,
            [order_id],
            now=now,
            event=E.CONFIRM_RECEIPT,
            actor=f"user:{user_id}",
            due_only=False,
        )
        if not moved:
            raise _refuse(order, E.CONFIRM_RECEIPT)
    await deps.arm(armed)


async def review(deps: Deps, *, order_id: int, user_id: int, rating: int, comment: str = "") -> str:
    """The buyer or the seller reviews a received order; with both reviews it completes.
    Returns the reviewer's role.

    Raises:
        InvalidInput: rating not 1-5, comment over 500 characters.
        NotFound, NotAllowed: no such order, or the user is neither its buyer nor its seller.
        InvalidTransition: the order is not received, or this role already reviewed.
    """
    if isinstance(rating, bool) or not isinstance(rating, int) or not 1 <= rating <= 5:
        raise InvalidInput("a rating is a whole number from 1 to 5")
    if comment is not None and not isinstance(comment, str):
        raise InvalidInput("a comment is text")
    comment = (comment or "").strip()
    if len(comment) > 500:
        raise InvalidInput("a comment is at most 500 characters")
    now = deps.clock.now()
    async with deps.db.write() as conn:
        order = await orders.get(conn, order_id, for_update=True)
        if order is None:
            raise NotFound(f"no order {order_id}")
        if user_id == order.buyer_id:
            role = "buyer"
        elif user_id == order.seller_id:
            role = "seller"
        else:
            raise NotAllowed(f"order {order_id} is not yours")
        if order.status != S.RECEIVED.value:
            raise InvalidTransition(
                f"cannot review: order {order_id} is {order.status}", status=order.status
            )
        reviewed = (await aftersale.reviewed_roles(conn, [order_id]))[order_id]
        if role in reviewed:
            raise InvalidTransition(
                f"the {role} already reviewed order {order_id}", status=order.status
            )
        await aftersale.insert_reviews(
            conn,
            [
                {
                    "order_id": order_id,
                    "role": role,
                    "author_id": user_id,
                    "rating": rating,
                    "comment": comment,
                    "is_default": False,
                    "created_at": now,
                }
            ],
        )
        await orders.record_events(
            conn,
            [order_id],
            event="review",
            actor=f"user:{user_id}",
            now=now,
            detail=f"{role} rated {rating}",
        )
        if reviewed | {role} >= {"buyer", "seller"}:
            await lifecycle.complete(
                conn,
                deps,
                [order_id],
                now=now,
                event=E.REVIEWS_COMPLETE,
                actor=f"user:{user_id}",
                due_only=False,
            )
    return role


async def order_view(deps: Deps, order_id: int) -> dict[str, Any]:
    """The order with its payments, refunds, reviews, timers and timeline."""
    async with deps.db.read() as conn:
        return await view_in(conn, order_id)


async def view_in(conn: AsyncConnection, order_id: int) -> dict[str, Any]:
    """The order's view (nine statements; ten for a show's order)."""
    order = await orders.get(conn, order_id)
    if order is None:
        raise NotFound(f"no order {order_id}")
    view = dict(order._mapping)
    view["lines"] = [
        {
            "kind": r.kind,
            "item_id": r.item_id,
            "label": r.label,
            "quantity": r.quantity,
            "price": r.price,
        }
        for r in (await holds.lines_of(conn, [order_id]))[order_id]
    ]
    view["tickets"] = [
        {"seat": t.label, "code": t.code, "state": t.state}
        # Only a show's orders have tickets: the others skip the statement.
        for t in (await shows.tickets_for(conn, order_id) if order.show_id is not None else [])
    ]
    view["payments"] = [dict(r._mapping) for r in await payments.for_orders(conn, [order_id])]
    view["refunds"] = [dict(r._mapping) for r in await payments.refunds_for_order(conn, order_id)]
    view["reviews"] = [dict(r._mapping) for r in await aftersale.for_order(conn, order_id)]
    view["timers"] = [dict(r._mapping) for r in await timers.for_order(conn, order_id)]
    view["notices"] = [dict(r._mapping) for r in await aftersale.reminders_for(conn, order_id)]
    view["timeline"] = [dict(r._mapping) for r in await orders.timeline(conn, order_id)]
    return view
