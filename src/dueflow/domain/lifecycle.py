"""Order statuses and one transition table per flow, as data.

A flow is the life of one kind of order, chosen by what it holds: ``marketplace`` (one
second-hand goods item), ``tickets`` (seats of a show), ``shop`` (units of SKUs, a coupon, a
flash sale). In each flow every (status, event) pair
either moves to exactly one next status or raises
:class:`~dueflow.exceptions.InvalidTransition` naming the current status. The store turns each
move into one conditional UPDATE (``WHERE status = :expected``); nothing assigns a status directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from dueflow.domain.timers import TimerKind
from dueflow.exceptions import InvalidInput, InvalidTransition


class OrderStatus(StrEnum):
    """Where an order is in its life."""

    PENDING_PAYMENT = "pending_payment"
    PENDING_SHIPMENT = "pending_shipment"
    SHIPPED = "shipped"
    RECEIVED = "received"
    COMPLETED = "completed"
    CANCELLED_UNPAID = "cancelled_unpaid"
    CANCELLED_UNSHIPPED = "cancelled_unshipped"
    #: Tickets: paid is final for the buyer (seats sold, tickets issued); only the organizer
    #: cancelling the show moves it on.
    PAID = "paid"
    #: Tickets: paid, then the show was cancelled; a refund awaits review.
    CANCELLED_PAID = "cancelled_paid"

    @property
    def is_final(self) -> bool:
        """No event moves an order out of this status."""
        return self in FINAL_STATUSES

    @property
    def is_cancelled(self) -> bool:
        """The order was cancelled and holds nothing."""
        return self in CANCELLED_STATUSES


CANCELLED_STATUSES = frozenset(
    {OrderStatus.CANCELLED_UNPAID, OrderStatus.CANCELLED_UNSHIPPED, OrderStatus.CANCELLED_PAID}
)
FINAL_STATUSES = CANCELLED_STATUSES | {OrderStatus.COMPLETED}


class OrderEvent(StrEnum):
    """Something that happens to an order: a person acts, a provider reports, a deadline passes."""

    PAY = "pay"
    BUYER_CANCEL = "buyer_cancel"
    PAY_TIMEOUT = "pay_timeout"
    SHIP = "ship"
    SHIP_TIMEOUT = "ship_timeout"
    SELLER_CANCEL = "seller_cancel"
    CONFIRM_RECEIPT = "confirm_receipt"
    RECEIVE_TIMEOUT = "receive_timeout"
    REVIEWS_COMPLETE = "reviews_complete"
    REVIEW_TIMEOUT = "review_timeout"
    #: The organizer cancels the show: every live order of it.
    SHOW_CANCEL = "show_cancel"


S = OrderStatus
E = OrderEvent


@dataclass(frozen=True)
class Stage:
    """What an order in one status waits for: the deadline (an order column), the stage
    duration that sets it (a :class:`~dueflow.domain.deadlines.StageDurations` field) and the
    timer kind that acts on it."""

    deadline: str
    duration: str
    timer: TimerKind


@dataclass(frozen=True)
class Lifecycle:
    """The order life of one flow: which event moves which status where, and the deadline each
    status waits on (a status without a stage waits for nobody)."""

    name: str
    moves: Mapping[tuple[OrderStatus, OrderEvent], OrderStatus]
    stages: Mapping[OrderStatus, Stage]

    def next_status(self, status: OrderStatus, event: OrderEvent) -> OrderStatus:
        """The status ``event`` moves an order in ``status`` to.

        Raises:
            InvalidTransition: the event is not allowed in this status.
        """
        try:
            return self.moves[(status, event)]
        except KeyError:
            raise InvalidTransition(
                f"cannot {event.value.replace('_', ' ')}: the order is {status.value}",
                status=status.value,
            ) from None

    def sources(self, event: OrderEvent) -> frozenset[OrderStatus]:
        """The statuses from which ``event`` moves an order."""
        return frozenset(src for (src, ev) in self.moves if ev is event)

    @property
    def statuses(self) -> frozenset[OrderStatus]:
        """Every status an order of this flow can be in."""
        return frozenset(s for pair, to in self.moves.items() for s in (pair[0], to))


#: Every flow's pay stage: an order awaits payment until its pay deadline.
_PAY_STAGE = Stage("pay_deadline", "pay", TimerKind.CANCEL_UNPAID)

#: Goods that are shipped (the marketplace's and the shop's), up to receipt: paid, or cancelled
#: by the buyer or the pay deadline; then shipped, or cancelled by the seller or the ship
#: deadline.
_UP_TO_RECEIPT = {
    (S.PENDING_PAYMENT, E.PAY): S.PENDING_SHIPMENT,
    (S.PENDING_PAYMENT, E.BUYER_CANCEL): S.CANCELLED_UNPAID,
    (S.PENDING_PAYMENT, E.PAY_TIMEOUT): S.CANCELLED_UNPAID,
    (S.PENDING_SHIPMENT, E.SHIP): S.SHIPPED,
    (S.PENDING_SHIPMENT, E.SHIP_TIMEOUT): S.CANCELLED_UNSHIPPED,
    (S.PENDING_SHIPMENT, E.SELLER_CANCEL): S.CANCELLED_UNSHIPPED,
}
#: The deadlines of goods that are shipped, up to receipt.
_UP_TO_RECEIPT_STAGES = {
    S.PENDING_PAYMENT: _PAY_STAGE,
    S.PENDING_SHIPMENT: Stage("ship_deadline", "ship", TimerKind.CANCEL_UNSHIPPED),
    S.SHIPPED: Stage("receive_deadline", "receive", TimerKind.CONFIRM_RECEIPT),
}

MARKETPLACE = Lifecycle(
    name="marketplace",
    moves={
        **_UP_TO_RECEIPT,
        (S.SHIPPED, E.CONFIRM_RECEIPT): S.RECEIVED,
        (S.SHIPPED, E.RECEIVE_TIMEOUT): S.RECEIVED,
        (S.RECEIVED, E.REVIEWS_COMPLETE): S.COMPLETED,
        (S.RECEIVED, E.REVIEW_TIMEOUT): S.COMPLETED,
    },
    stages={
        **_UP_TO_RECEIPT_STAGES,
        S.RECEIVED: Stage("review_deadline", "review", TimerKind.AUTO_REVIEW),
    },
)

#: Seats of one show: paid is final (a ticket per seat); no shipping, receipt or reviews.
TICKETS = Lifecycle(
    name="tickets",
    moves={
        (S.PENDING_PAYMENT, E.PAY): S.PAID,
        (S.PENDING_PAYMENT, E.BUYER_CANCEL): S.CANCELLED_UNPAID,
        (S.PENDING_PAYMENT, E.PAY_TIMEOUT): S.CANCELLED_UNPAID,
        (S.PENDING_PAYMENT, E.SHOW_CANCEL): S.CANCELLED_UNPAID,
        (S.PAID, E.SHOW_CANCEL): S.CANCELLED_PAID,
    },
    stages={S.PENDING_PAYMENT: _PAY_STAGE},
)

#: Units of SKUs (and a coupon), or of a flash sale: shipped and received as in the marketplace,
#: completed at receipt (no reviews).
SHOP = Lifecycle(
    name="shop",
    moves={
        **_UP_TO_RECEIPT,
        (S.SHIPPED, E.CONFIRM_RECEIPT): S.COMPLETED,
        (S.SHIPPED, E.RECEIVE_TIMEOUT): S.COMPLETED,
    },
    stages=_UP_TO_RECEIPT_STAGES,
)

LIFECYCLES: Mapping[str, Lifecycle] = {flow.name: flow for flow in (MARKETPLACE, TICKETS, SHOP)}


def lifecycle(name: str) -> Lifecycle:
    """The flow called ``name``."""
    try:
        return LIFECYCLES[name]
    except KeyError:
        raise InvalidInput(f"unknown flow {name!r}") from None


def targets(expected: OrderStatus, event: OrderEvent) -> dict[str, OrderStatus]:
    """Where ``event`` moves an order in ``expected``, per flow (flows that refuse it absent)."""
    return {
        name: flow.moves[(expected, event)]
        for name, flow in LIFECYCLES.items()
        if (expected, event) in flow.moves
    }
