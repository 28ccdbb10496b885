"""What buyers and sellers do to their orders: cancel, ship, confirm receipt, review."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row
from sqlalchemy.ext.asyncio import AsyncConnection

from dueflow.domain.lifecycle import OrderEvent, OrderStatus
from dueflow.domain.lifecycle import lifecycle as flow_named
from dueflow.domain.timers import TimerKind
from dueflow.exceptions import (
    Busy,
    InvalidInput,
    InvalidTransition,
    NotAllowed,
    NotFound,
    NotYourRole,
    ProviderUnavailable,
)
from dueflow.locks import base as locks
from dueflow.payments.base import CloseResult
from dueflow.service import actors, lifecycle
from dueflow.service import payments as payment_service
from dueflow.service.deps import Deps
from dueflow.store import (
    aftersale,
    orders,
    timers,
)

S = OrderStatus
E = OrderEvent


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
            actor=actors.user(user_id),
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
    carrier = _label(carrier, "carrier", "carrier")
    tracking_no = _label(tracking_no, "tracking number", "tracking_no")
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
            actor=actors.user(user_id),
            now=now,
            from_status=S.PENDING_SHIPMENT,
            to_status=S.SHIPPED,
            detail=f"{carrier} {tracking_no}",
            data={"carrier": carrier, "tracking_no": tracking_no},
        )
    await deps.arm(armed)


def _label(value: str, what: str, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"a {what} is text", field=field)
    value = value.strip()
    if not 1 <= len(value) <= 64 or not value.isprintable():
        raise InvalidInput(f"a {what} is 1-64 printable characters", field=field)
    return value


async def cancel_by_seller(deps: Deps, *, order_id: int, user_id: int) -> None:
    """The seller cancels a paid order before shipping: a refund awaits review.

    Raises:
        NotFound, NotAllowed, InvalidTransition: as the names say.
    """
    await _act(deps, order_id, user_id, "seller", E.SELLER_CANCEL, lifecycle.cancel_unshipped)


async def confirm_receipt(deps: Deps, *, order_id: int, user_id: int) -> None:
    """The buyer confirms receipt: the review deadline starts.

    Raises:
        NotFound, NotAllowed, InvalidTransition: as the names say (NotYourRole, a NotAllowed,
            when the caller is the order's seller).
    """
    await _act(deps, order_id, user_id, "buyer", E.CONFIRM_RECEIPT, lifecycle.receive)


async def _act(
    deps: Deps, order_id: int, user_id: int, role: str, event: OrderEvent, move: lifecycle.Move
) -> None:
    """The order's ``role`` makes the move of ``event`` in one transaction (``move`` does what
    it implies); the timers it armed go to the trigger after the commit.

    Raises:
        NotFound, NotAllowed, InvalidTransition: as the names say.
    """
    now = deps.clock.now()
    async with deps.db.write() as conn:
        order = await _own_order(conn, order_id, user_id, role)
        flow_named(order.flow).next_status(OrderStatus(order.status), event)
        moved, armed = await move(
            conn, deps, [order_id], now=now, event=event, actor=actors.user(user_id), due_only=False
        )
        if not moved:
            raise _refuse(order, event)
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
        raise InvalidInput("a rating is a whole number from 1 to 5", field="rating")
    if comment is not None and not isinstance(comment, str):
        raise InvalidInput("a comment is text", field="comment")
    comment = (comment or "").strip()
    if len(comment) > 500:
        raise InvalidInput("a comment is at most 500 characters", field="comment")
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
        actor = actors.user(user_id)
        await orders.record_events(
            conn,
            [order_id],
            event="review",
            actor=actor,
            now=now,
            detail=f"{role} rated {rating}",
            data={"role": role, "rating": rating, "comment": comment},
        )
        if reviewed | {role} >= {"buyer", "seller"}:
            await lifecycle.complete(
                conn,
                deps,
                [order_id],
                now=now,
                event=E.REVIEWS_COMPLETE,
                actor=actor,
                due_only=False,
            )
    return role
