"""What goes out about orders: the type of every order event and buyer notice, the envelope's
version, and who did it (the actor string of ``order_events.actor`` parsed).

The envelope itself (docs/events.md) is built by :mod:`dueflow.service.envelopes`.
"""

from __future__ import annotations

import re
from decimal import Decimal
from enum import StrEnum
from typing import Any, Protocol

from dueflow.domain.lifecycle import OrderEvent

#: The envelope's version: a change a consumer must know about gets a new one.
ENVELOPE_VERSION = 1


class EventType(StrEnum):
    """Every type an envelope can have: the order events the code writes (its moves, named as
    :class:`~dueflow.domain.lifecycle.OrderEvent`, and the others) and the buyer notices."""

    PLACE = "place"
    PAYMENT_STARTED = "payment_started"
    PAY = OrderEvent.PAY.value
    BUYER_CANCEL = OrderEvent.BUYER_CANCEL.value
    PAY_TIMEOUT = OrderEvent.PAY_TIMEOUT.value
    SHIP = OrderEvent.SHIP.value
    SHIP_TIMEOUT = OrderEvent.SHIP_TIMEOUT.value
    SELLER_CANCEL = OrderEvent.SELLER_CANCEL.value
    CONFIRM_RECEIPT = OrderEvent.CONFIRM_RECEIPT.value
    RECEIVE_TIMEOUT = OrderEvent.RECEIVE_TIMEOUT.value
    REVIEW = "review"
    REVIEWS_COMPLETE = OrderEvent.REVIEWS_COMPLETE.value
    REVIEW_TIMEOUT = OrderEvent.REVIEW_TIMEOUT.value
    SHOW_CANCELLED = "show_cancelled"
    SHOW_CANCEL = OrderEvent.SHOW_CANCEL.value
    TICKET_CHECKED_IN = "ticket_checked_in"
    RELEASED = "released"
    REFUND_CREATED = "refund_created"
    REFUND_SUBMITTED = "refund_submitted"
    REFUND_SUCCEEDED = "refund_succeeded"
    REFUND_FAILED = "refund_failed"
    REFUND_REJECTED = "refund_rejected"
    REFUND_SETTLED_OFFLINE = "refund_settled_offline"
    PROVIDER_REFUND = "provider_refund"
    DISCREPANCY = "discrepancy"
    EVENT_SKIPPED = "event_skipped"
    #: Buyer notices (no order event: sent by the notifier).
    PAY_REMINDER = "pay_reminder"
    ORDER_CLOSED = "order_closed"


#: The notices' types (the rest are order events).
NOTICE_TYPES = frozenset({EventType.PAY_REMINDER, EventType.ORDER_CLOSED})
#: The events that cancel an order: their ``data.reason`` is the type itself.
CANCEL_TYPES = frozenset(
    {
        EventType.BUYER_CANCEL,
        EventType.PAY_TIMEOUT,
        EventType.SELLER_CANCEL,
        EventType.SHIP_TIMEOUT,
        EventType.SHOW_CANCEL,
    }
)
#: Actors that are the system: a timer, a payment provider's notification, the close-or-query
#: of a trade, the command line, a process of dueflow's.
SYSTEM_ACTORS = frozenset(
    {"timer", "alipay", "wechatpay", "manual", "simulator", "close_or_query", "cli", "system"}
)


class PaymentAttempt(Protocol):
    """A payment attempt as its writers hold it (a row of ``payments``, the port's Attempt)."""

    @property
    def provider(self) -> str: ...
    @property
    def pay_no(self) -> str: ...
    @property
    def amount(self) -> Decimal: ...


def attempt_data(attempt: PaymentAttempt) -> dict[str, Any]:
    """What the ``data`` of an event about a payment attempt (``payment_started``, a
    ``discrepancy``) says of it: its provider, pay_no and amount."""
    return {"provider": attempt.provider, "pay_no": attempt.pay_no, "amount": attempt.amount}


_USER = re.compile(r"user:([0-9]{1,19})(?:@key:([0-9]{1,19}))?")
_KEY = re.compile(r"key:([0-9]{1,19})")


def actor_of(actor: str) -> dict[str, Any]:
    """The actor string of an event parsed into the envelope's ``actor``:

    - ``user:<id>`` -> ``{"type": "user", "user_id": id, "key_id": None}``;
      ``user:<id>@key:<key id>`` (a service key acting for the user) gives ``key_id`` too;
    - ``key:<key id>`` (a service key acting for nobody, on an admin route)
      -> ``{"type": "key", "key_id": key id}``;
    - ``operator`` (and ``operator:<name>``) -> ``{"type": "operator", "name": ...}``;
    - anything else (``timer``, a provider's name, ``close_or_query``, ``cli``, a notifier)
      -> ``{"type": "system", "name": actor}``.
    """
    found = _USER.fullmatch(actor)
    if found is not None:
        key = found.group(2)
        return {
            "type": "user",
            "user_id": int(found.group(1)),
            "key_id": int(key) if key is not None else None,
        }
    found = _KEY.fullmatch(actor)
    if found is not None:
        return {"type": "key", "key_id": int(found.group(1))}
    if actor == "operator" or actor.startswith("operator:"):
        return {"type": "operator", "name": actor}
    return {"type": "system", "name": actor}
