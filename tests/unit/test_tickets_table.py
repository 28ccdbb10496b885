"""The tickets transition table, exhaustively: every (status, event) pair, and what the flows
share (the status a cancel moves to, the stage each status waits on)."""

from __future__ import annotations

import itertools

import pytest

from dueflow.domain.lifecycle import (
    LIFECYCLES,
    MARKETPLACE,
    TICKETS,
    OrderEvent,
    OrderStatus,
    lifecycle,
    targets,
)
from dueflow.domain.timers import TimerKind
from dueflow.exceptions import InvalidInput, InvalidTransition

S = OrderStatus
E = OrderEvent

# DESIGN ("Tickets"), written out independently of the code: paid is final for the buyer; only
# the organizer's cancel of the show moves a paid order, and it is refunded.
EXPECTED: dict[tuple[OrderStatus, OrderEvent], OrderStatus] = {
    (S.PENDING_PAYMENT, E.PAY): S.PAID,
    (S.PENDING_PAYMENT, E.BUYER_CANCEL): S.CANCELLED_UNPAID,
    (S.PENDING_PAYMENT, E.PAY_TIMEOUT): S.CANCELLED_UNPAID,
    (S.PENDING_PAYMENT, E.SHOW_CANCEL): S.CANCELLED_UNPAID,
    (S.PAID, E.SHOW_CANCEL): S.CANCELLED_PAID,
}


@pytest.mark.parametrize(
    ("status", "event"), list(itertools.product(OrderStatus, OrderEvent)), ids=lambda v: v.value
)
def test_every_pair(status, event):
    if (status, event) in EXPECTED:
        assert TICKETS.next_status(status, event) is EXPECTED[(status, event)]
        return
    with pytest.raises(InvalidTransition) as info:
        TICKETS.next_status(status, event)
    assert info.value.status == status.value
    assert status.value in info.value.message


def test_table_has_nothing_beyond_the_design():
    assert dict(TICKETS.moves) == EXPECTED
    assert TICKETS.statuses == {
        S.PENDING_PAYMENT,
        S.PAID,
        S.CANCELLED_UNPAID,
        S.CANCELLED_PAID,
    }


def test_no_shipping_receipt_or_reviews():
    for event in (E.SHIP, E.SHIP_TIMEOUT, E.CONFIRM_RECEIPT, E.RECEIVE_TIMEOUT, E.REVIEW_TIMEOUT):
        assert TICKETS.sources(event) == frozenset()
    for event in (E.SELLER_CANCEL, E.REVIEWS_COMPLETE):
        assert TICKETS.sources(event) == frozenset()


def test_cancelled_and_final():
    assert {s for s in TICKETS.statuses if s.is_cancelled} == {S.CANCELLED_UNPAID, S.CANCELLED_PAID}
    assert {s for s in TICKETS.statuses if s.is_final} == {S.CANCELLED_UNPAID, S.CANCELLED_PAID}
    # paid is final for the buyer, not for the table: the show's cancel still moves it
    assert not S.PAID.is_final


def test_stages():
    [(status, stage)] = TICKETS.stages.items()
    assert status is S.PENDING_PAYMENT
    assert (stage.deadline, stage.duration, stage.timer) == (
        "pay_deadline",
        "pay",
        TimerKind.CANCEL_UNPAID,
    )
    assert TICKETS.stages[S.PENDING_PAYMENT] == MARKETPLACE.stages[S.PENDING_PAYMENT]


def test_targets_per_flow():
    assert targets(S.PENDING_PAYMENT, E.PAY) == {
        "marketplace": S.PENDING_SHIPMENT,
        "tickets": S.PAID,
        "shop": S.PENDING_SHIPMENT,
    }
    assert targets(S.PENDING_PAYMENT, E.PAY_TIMEOUT) == {
        "marketplace": S.CANCELLED_UNPAID,
        "tickets": S.CANCELLED_UNPAID,
        "shop": S.CANCELLED_UNPAID,
    }
    assert targets(S.SHIPPED, E.CONFIRM_RECEIPT) == {
        "marketplace": S.RECEIVED,
        "shop": S.COMPLETED,
    }
    assert targets(S.PAID, E.SHOW_CANCEL) == {"tickets": S.CANCELLED_PAID}
    assert targets(S.SHIPPED, E.SHOW_CANCEL) == {}


def test_lookup():
    assert lifecycle("tickets") is TICKETS
    assert set(LIFECYCLES) == {"marketplace", "tickets", "shop"}
    with pytest.raises(InvalidInput, match="unknown flow"):
        lifecycle("shop!")
