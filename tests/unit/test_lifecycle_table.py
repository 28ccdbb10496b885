"""The marketplace and shop transition tables, exhaustively: every (status, event) pair."""

from __future__ import annotations

import itertools

import pytest

from dueflow.domain.lifecycle import (
    FINAL_STATUSES,
    LIFECYCLES,
    MARKETPLACE,
    SHOP,
    OrderEvent,
    OrderStatus,
    lifecycle,
)
from dueflow.exceptions import InvalidInput, InvalidTransition

S = OrderStatus
E = OrderEvent

# The table of docs/design.md ("The order life"), written out independently of the code.
EXPECTED: dict[tuple[OrderStatus, OrderEvent], OrderStatus] = {
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
}

ALL_PAIRS = list(itertools.product(OrderStatus, OrderEvent))


def test_enums_are_the_designed_ones():
    assert {s.value for s in OrderStatus} == {
        "pending_payment",
        "pending_shipment",
        "shipped",
        "received",
        "completed",
        "cancelled_unpaid",
        "cancelled_unshipped",
        # the tickets flow's own (tests/unit/test_tickets_table.py)
        "paid",
        "cancelled_paid",
    }
    assert len(OrderEvent) == 11  # show_cancel is the tickets flow's own
    assert len(ALL_PAIRS) == 99


@pytest.mark.parametrize(("status", "event"), ALL_PAIRS, ids=lambda v: v.value)
def test_every_pair(status, event):
    if (status, event) in EXPECTED:
        assert MARKETPLACE.next_status(status, event) is EXPECTED[(status, event)]
        return
    with pytest.raises(InvalidTransition) as info:
        MARKETPLACE.next_status(status, event)
    assert info.value.status == status.value
    assert status.value in str(info.value)
    assert status.value in info.value.message
    assert info.value.code == "invalid_transition"


def test_table_has_nothing_beyond_the_design():
    assert dict(MARKETPLACE.moves) == EXPECTED


@pytest.mark.parametrize("status", sorted(FINAL_STATUSES), ids=lambda v: v.value)
def test_final_statuses_accept_no_event(status):
    assert status.is_final
    for event in OrderEvent:
        with pytest.raises(InvalidTransition) as info:
            MARKETPLACE.next_status(status, event)
        assert info.value.status == status.value


def test_final_and_cancelled_flags():
    marketplace = MARKETPLACE.statuses
    assert {s for s in marketplace if s.is_final} == {
        S.COMPLETED,
        S.CANCELLED_UNPAID,
        S.CANCELLED_UNSHIPPED,
    }
    assert {s for s in marketplace if s.is_cancelled} == {S.CANCELLED_UNPAID, S.CANCELLED_UNSHIPPED}
    # Every non-final status has a way out; no final status is a source.
    sources = {src for (src, _ev) in MARKETPLACE.moves}
    assert sources == marketplace - FINAL_STATUSES


@pytest.mark.parametrize(
    "event", [e for e in OrderEvent if e is not E.SHOW_CANCEL], ids=lambda v: v.value
)
def test_sources(event):
    assert MARKETPLACE.sources(event) == frozenset(src for (src, ev) in EXPECTED if ev is event)
    # Each event has exactly one source status in the marketplace profile.
    assert len(MARKETPLACE.sources(event)) == 1


def test_lifecycle_lookup():
    assert lifecycle("marketplace") is MARKETPLACE
    assert LIFECYCLES["marketplace"] is MARKETPLACE


def test_unknown_lifecycle_is_invalid_input():
    with pytest.raises(InvalidInput) as info:
        lifecycle("nope")
    assert "nope" in str(info.value)
    assert info.value.code == "invalid_input"


# The shop flow (issue 11), written out independently of the code: shipped and received as in
# the marketplace, completed at receipt (no reviews, no received stage).
SHOP_EXPECTED: dict[tuple[OrderStatus, OrderEvent], OrderStatus] = {
    (S.PENDING_PAYMENT, E.PAY): S.PENDING_SHIPMENT,
    (S.PENDING_PAYMENT, E.BUYER_CANCEL): S.CANCELLED_UNPAID,
    (S.PENDING_PAYMENT, E.PAY_TIMEOUT): S.CANCELLED_UNPAID,
    (S.PENDING_SHIPMENT, E.SHIP): S.SHIPPED,
    (S.PENDING_SHIPMENT, E.SHIP_TIMEOUT): S.CANCELLED_UNSHIPPED,
    (S.PENDING_SHIPMENT, E.SELLER_CANCEL): S.CANCELLED_UNSHIPPED,
    (S.SHIPPED, E.CONFIRM_RECEIPT): S.COMPLETED,
    (S.SHIPPED, E.RECEIVE_TIMEOUT): S.COMPLETED,
}


@pytest.mark.parametrize(("status", "event"), ALL_PAIRS, ids=lambda v: v.value)
def test_every_shop_pair(status, event):
    if (status, event) in SHOP_EXPECTED:
        assert SHOP.next_status(status, event) is SHOP_EXPECTED[(status, event)]
        return
    with pytest.raises(InvalidTransition) as info:
        SHOP.next_status(status, event)
    assert info.value.status == status.value
    assert status.value in info.value.message
    assert info.value.code == "invalid_transition"


def test_shop_table_has_nothing_beyond_the_design():
    assert dict(SHOP.moves) == SHOP_EXPECTED
    assert SHOP.statuses == {
        S.PENDING_PAYMENT,
        S.PENDING_SHIPMENT,
        S.SHIPPED,
        S.COMPLETED,
        S.CANCELLED_UNPAID,
        S.CANCELLED_UNSHIPPED,
    }
    assert {s for s in SHOP.statuses if s.is_final} == {
        S.COMPLETED,
        S.CANCELLED_UNPAID,
        S.CANCELLED_UNSHIPPED,
    }
    assert {src for (src, _ev) in SHOP.moves} == SHOP.statuses - FINAL_STATUSES


def test_shop_has_no_reviews_and_no_show():
    for event in (E.REVIEWS_COMPLETE, E.REVIEW_TIMEOUT, E.SHOW_CANCEL):
        assert SHOP.sources(event) == frozenset()
    assert S.RECEIVED not in SHOP.statuses


def test_shop_stages_are_the_marketplace_ones_up_to_receipt():
    assert set(SHOP.stages) == {S.PENDING_PAYMENT, S.PENDING_SHIPMENT, S.SHIPPED}
    for status, stage in SHOP.stages.items():
        assert stage == MARKETPLACE.stages[status]
    assert lifecycle("shop") is SHOP
