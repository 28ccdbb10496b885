"""Order statuses and the transition table, as data.

Every (status, event) pair either moves to exactly one next status or raises
:class:`~dueflow.exceptions.InvalidTransition` naming the current status. The store turns each
move into one conditional UPDATE (``WHERE status = :expected``); nothing assigns a status directly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

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

    @property
    def is_final(self) -> bool:
        """No event moves an order out of this status."""
        return self in FINAL_STATUSES

    @property
    def is_cancelled(self) -> bool:
        """The order was cancelled and holds nothing."""
        return self in (OrderStatus.CANCELLED_UNPAID, OrderStatus.CANCELLED_UNSHIPPED)


FINAL_STATUSES = frozenset(
    {OrderStatus.COMPLETED, OrderStatus.CANCELLED_UNPAID, OrderStatus.CANCELLED_UNSHIPPED}
)


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


S = OrderStatus
E = OrderEvent


@dataclass(frozen=True)
class Lifecycle:
    """The order life of one profile: which event moves which status where."""

    name: str
    moves: Mapping[tuple[OrderStatus, OrderEvent], OrderStatus]

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


MARKETPLACE = Lifecycle(
    name="marketplace",
    moves={
        (S.PENDING_PAYMENT, E.PAY): S.PENDING_SHIPMENT,
        (S.PENDING_PAYMENT, E.BUYER_CANCEL): S.CANCELLED_UNPAID,
        (S.PENDING_PAYMENT, E.PAY_TIMEOUT): S.CANCELLED_UNPAID,
        (S.PENDING_SHIPMENT, E.SHIP): S.SHIPPED,
        (S.PENDING_SHIPMENT, E.SHIP_TIMEOUT): S.CANCELLED_UNSHIPPED,
        (S.PENDING_SHIPMENT, E.SELLER_CANCEL): S.CANCELLED_UNSHIPPED,
        (S.SHIPPED, E.CONFIRM_RECEIPT): S.RECEIVED,
        (S.SHIPPED, E.RECEIVE_TIMEOUT): S.RECEIVED,
        (S.RECEIVED, E.REVIEWS_COMPLETE): S.COMPLETED,
        (S.RECEIVED, E.REVIEW_TIMEOUT): S.COMPLETED,
    },
)

LIFECYCLES: Mapping[str, Lifecycle] = {MARKETPLACE.name: MARKETPLACE}


def lifecycle(name: str) -> Lifecycle:
    """The lifecycle called ``name``."""
    try:
        return LIFECYCLES[name]
    except KeyError:
        raise InvalidInput(f"unknown order profile {name!r}") from None
