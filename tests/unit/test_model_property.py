"""Random interleavings of everything people, providers and timers do, against a small model.

A hypothesis state machine places orders (random buyer, random goods of a small pool), cancels
as buyer or seller, records manual payments (in time or late), ships, confirms receipt, reviews,
moves a FakeClock by seconds to days, drains the worker, runs scanner passes and delivers random
timer ids again. After every step:

* the database equals the model: statuses, deadlines, holds, timers, refunds, discrepancies,
  reviews, reminders, order-closed notices and every order's timeline (so nothing happened
  twice or not at all);
* the structural promises hold as they stand (no goods held by a cancelled order, none held by two
  live orders, every paid-after-cancel payment refunded exactly once, ...);
* a copy of the database is drained by a worker at the same instant, and then
  ``check_invariants(tolerance_seconds=0)`` holds there, including "no order past its deadline",
  and the drained copy equals the drained model.

Each example gets a fresh copy of the migrated template database.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule
from sqlalchemy import Engine, func, select

from dueflow.exceptions import (
    GoodsUnavailable,
    InvalidInput,
    InvalidTransition,
    NotAllowed,
    PaymentMismatch,
)
from dueflow.service import accounts, orders, payments
from dueflow.store.schema import discrepancies, goods, order_events, refunds, reminders, reviews
from dueflow.store.schema import orders as t_orders
from dueflow.store.schema import payments as t_payments
from dueflow.store.schema import timers as t_timers
from tests.conftest import START
from tests.unit import model_harness
from tests.unit.model_harness import FITTING, PICK, promises, sent

REMINDER = timedelta(minutes=5)
PAY = timedelta(minutes=30)
SHIP = timedelta(days=3)
RECEIVE = timedelta(days=10)
REVIEW = timedelta(days=15)

USERS = 4
# (seller index, price) of the goods pool
GOODS = [(0, "12.50"), (0, "0.10"), (1, "99.99"), (2, "5.00"), (3, "1.00")]

# Moves of the clock: right at and around the stage lengths, the scanner's grace, and anything.
BOUNDARIES = [
    timedelta(seconds=s)
    for s in (1, 4, 5, 6, 59, 60, 299, 300, 600, 1500, 1800, 3 * 86400, 10 * 86400)
] + [REVIEW, REVIEW + timedelta(seconds=1), SHIP - timedelta(seconds=1)]
ADVANCE = st.one_of(
    st.sampled_from(BOUNDARIES),
    st.integers(1, 3600).map(lambda s: timedelta(seconds=s)),
    st.integers(3600, 20 * 86400).map(lambda s: timedelta(seconds=s)),
)
OTHER_USER = st.one_of(st.none(), st.integers(0, USERS - 1))  # None: the rightful party


# --- the model --------------------------------------------------------------------------------

STAGE_OF = {
    "pay_reminder": "pending_payment",
    "cancel_unpaid": "pending_payment",
    "cancel_unshipped": "pending_shipment",
    "confirm_receipt": "shipped",
    "auto_review": "received",
}
CANCELLED = ("cancelled_unpaid", "cancelled_unshipped")


@dataclass
class MOrder:
    id: int
    buyer: int
    seller: int
    goods: int
    amount: Decimal
    status: str
    pay_deadline: datetime
    ship_deadline: datetime | None = None
    receive_deadline: datetime | None = None
    review_deadline: datetime | None = None
    cancel_reason: str | None = None
    timers: dict[str, tuple[str, datetime]] = field(default_factory=dict)  # kind: (state, due)
    paid_attempts: int = 0
    refunds: int = 0
    discrepancies: list[str] = field(default_factory=list)
    reviews: dict[str, tuple[bool, int]] = field(default_factory=dict)  # role: (default, rating)
    reminder_sent: bool = False
    #: the buyer was told the order closed (the notice every cancel writes)
    closed_sent: bool = False
    events: list[str] = field(default_factory=list)


@dataclass
class MGoods:
    seller: int
    price: Decimal
    status: str = "on_sale"
    holder: int | None = None


@dataclass
class Model:
    now: datetime
    goods: dict[int, MGoods]
    orders: dict[int, MOrder] = field(default_factory=dict)

    # transitions, as the table of docs/design.md says

    def cancel_scheduled(self, order: MOrder) -> None:
        for kind, (state, due) in order.timers.items():
            if state == "scheduled":
                order.timers[kind] = ("cancelled", due)

    def schedule(self, order: MOrder, kind: str, due: datetime) -> None:
        assert kind not in order.timers
        order.timers[kind] = ("scheduled", due)

    def cancel_unpaid(self, order: MOrder, reason: str) -> None:
        order.status, order.cancel_reason = "cancelled_unpaid", reason
        item = self.goods[order.goods]
        assert (item.status, item.holder) == ("on_sale", order.id)
        item.holder = None
        self.cancel_scheduled(order)
        self.schedule(order, "order_closed", self.now)  # the buyer's notice, due at once
        order.events += [reason, "released"]

    def pay(self, order: MOrder) -> str:
        order.paid_attempts += 1
        if order.status == "pending_payment":
            order.status = "pending_shipment"
            order.ship_deadline = self.now + SHIP
            self.goods[order.goods].status = "sold"
            self.cancel_scheduled(order)
            self.schedule(order, "cancel_unshipped", order.ship_deadline)
            order.events.append("pay")
            return "confirmed"
        kind = "paid_after_cancel" if order.status in CANCELLED else "paid_twice"
        order.discrepancies.append(kind)
        order.refunds += 1
        order.events += ["discrepancy", "refund_created"]
        return "refund"

    def cancel_unshipped(self, order: MOrder, reason: str) -> None:
        order.status, order.cancel_reason = "cancelled_unshipped", reason
        item = self.goods[order.goods]
        item.status, item.holder = "off_sale", None
        created = order.paid_attempts - order.refunds
        order.refunds = order.paid_attempts  # every paid attempt is refunded, once
        self.cancel_scheduled(order)
        self.schedule(order, "order_closed", self.now)
        order.events += [reason, "released"] + ["refund_created"] * created

    def ship(self, order: MOrder) -> None:
        order.status = "shipped"
        order.receive_deadline = self.now + RECEIVE
        self.cancel_scheduled(order)
        self.schedule(order, "confirm_receipt", order.receive_deadline)
        order.events.append("ship")

    def receive(self, order: MOrder, event: str) -> None:
        order.status = "received"
        order.review_deadline = self.now + REVIEW
        self.cancel_scheduled(order)
        self.schedule(order, "auto_review", order.review_deadline)
        order.events.append(event)

    def complete(self, order: MOrder, event: str) -> None:
        order.status = "completed"
        for role in ("buyer", "seller"):
            order.reviews.setdefault(role, (True, 5))
        self.cancel_scheduled(order)
        order.events.append(event)

    def fire(self, order: MOrder, kind: str) -> None:
        """A scheduled, due timer runs its handler."""
        state, due = order.timers[kind]
        assert state == "scheduled" and due <= self.now
        if kind == "order_closed":
            # a cancelled order never moves again: its notice always goes out, once
            assert order.status in CANCELLED
            order.timers[kind] = ("done", due)
            order.closed_sent = True
            return
        assert order.status == STAGE_OF[kind]
        order.timers[kind] = ("done", due)
        if kind == "pay_reminder":
            if order.pay_deadline > self.now:
                order.reminder_sent = True
        elif kind == "cancel_unpaid":
            self.cancel_unpaid(order, "pay_timeout")
        elif kind == "cancel_unshipped":
            self.cancel_unshipped(order, "ship_timeout")
        elif kind == "confirm_receipt":
            self.receive(order, "receive_timeout")
        else:
            self.complete(order, "review_timeout")

    def due(self, cutoff: datetime) -> list[tuple[datetime, int, str]]:
        return sorted(
            (due, order.id, kind)
            for order in self.orders.values()
            for kind, (state, due) in order.timers.items()
            if state == "scheduled" and due <= cutoff
        )

    def run_due(self, cutoff: datetime) -> int:
        """Fire every scheduled timer due by ``cutoff``, earliest first (a drain or a scan)."""
        fired = 0
        while todo := self.due(cutoff):
            _, order_id, kind = todo[0]
            self.fire(self.orders[order_id], kind)
            fired += 1
        return fired

    def snapshot(self) -> dict[str, Any]:
        return {
            "orders": {
                o.id: (
                    o.status,
                    o.cancel_reason,
                    o.pay_deadline,
                    o.ship_deadline,
                    o.receive_deadline,
                    o.review_deadline,
                )
                for o in self.orders.values()
            },
            "goods": {gid: (g.status, g.holder) for gid, g in self.goods.items()},
            "timers": {
                (o.id, kind): (state, due, 1 if state == "done" else 0)
                for o in self.orders.values()
                for kind, (state, due) in o.timers.items()
            },
            "paid_attempts": {
                o.id: o.paid_attempts for o in self.orders.values() if o.paid_attempts
            },
            "refunds": {o.id: o.refunds for o in self.orders.values() if o.refunds},
            "discrepancies": sorted(
                (o.id, k) for o in self.orders.values() for k in o.discrepancies
            ),
            "reviews": {
                (o.id, role): r for o in self.orders.values() for role, r in o.reviews.items()
            },
            "reminders": {
                (o.id, kind): "sent"
                for o in self.orders.values()
                for kind, sent in (
                    ("pay_reminder", o.reminder_sent),
                    ("order_closed", o.closed_sent),
                )
                if sent
            },
            "events": {o.id: o.events for o in self.orders.values()},
        }


# --- reading the database (a plain synchronous engine: quick, and outside the code under test)


def db_snapshot(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:

        def all_rows(query: Any) -> list[Any]:
            return list(conn.execute(query).all())

        order_rows = all_rows(select(t_orders))
        goods_rows = all_rows(select(goods))
        timer_rows = all_rows(select(t_timers))
        paid = all_rows(
            select(t_payments.c.order_id, func.count())
            .where(t_payments.c.state == "paid")
            .group_by(t_payments.c.order_id)
        )
        refund_rows = all_rows(select(refunds))
        odd = all_rows(select(discrepancies))
        review_rows = all_rows(select(reviews))
        reminder_rows = all_rows(select(reminders))
        event_rows = all_rows(select(order_events).order_by(order_events.c.id))
    events: dict[int, list[str]] = {o.id: [] for o in order_rows}
    for e in event_rows:
        if e.event != "place":
            events[e.order_id].append(e.event)
        else:
            assert events[e.order_id] == [], "placed twice"
    assert {r.state for r in refund_rows} <= {"pending_review"}
    return {
        "orders": {
            o.id: (
                o.status,
                o.cancel_reason,
                o.pay_deadline,
                o.ship_deadline,
                o.receive_deadline,
                o.review_deadline,
            )
            for o in order_rows
        },
        "goods": {g.id: (g.status, g.reserved_order_id) for g in goods_rows},
        "timers": {(t.order_id, t.kind): (t.state, t.due_at, t.attempts) for t in timer_rows},
        "paid_attempts": {order_id: n for order_id, n in paid},
        "refunds": dict(Counter(r.order_id for r in refund_rows)),
        "discrepancies": sorted((d.order_id, d.kind) for d in odd),
        "reviews": {(r.order_id, r.role): (r.is_default, r.rating) for r in review_rows},
        "reminders": {(r.order_id, r.kind): r.state for r in reminder_rows},
        "events": events,
    }


def structural_invariants(engine: Engine) -> None:
    """The promises that hold at every instant, drained or not."""
    with engine.connect() as conn:
        order_rows = list(conn.execute(select(t_orders)).all())
        goods_rows = list(conn.execute(select(goods)).all())
        payment_rows = list(conn.execute(select(t_payments)).all())
        refund_rows = list(conn.execute(select(refunds)).all())
        odd = list(conn.execute(select(discrepancies)).all())
        review_rows = list(conn.execute(select(reviews)).all())
        reminder_rows = list(conn.execute(select(reminders)).all())
    by_id = {o.id: o for o in order_rows}
    live_on: dict[int, list[int]] = defaultdict(list)
    for o in order_rows:
        if o.status not in CANCELLED:
            live_on[o.goods_id].append(o.id)
    for g in goods_rows:
        # each goods item is held by at most one live order, and by exactly that one
        assert len(live_on[g.id]) <= 1, (g.id, live_on[g.id])
        assert g.reserved_order_id == (live_on[g.id][0] if live_on[g.id] else None), g
        if g.reserved_order_id is not None:
            holder = by_id[g.reserved_order_id]
            assert holder.status not in CANCELLED, "a cancelled order holds goods"
            assert g.status == ("on_sale" if holder.status == "pending_payment" else "sold")
    # no reminder, no review twice
    assert len({(r.order_id, r.kind) for r in reminder_rows}) == len(reminder_rows)
    assert len({(r.order_id, r.role) for r in review_rows}) == len(review_rows)
    # every paid-after-cancel payment has exactly one refund; no paid attempt has two
    refunds_of = Counter(r.payment_id for r in refund_rows)
    assert set(refunds_of.values()) <= {1}, "a paid attempt refunded twice"
    paid = {p.id: p for p in payment_rows if p.state == "paid"}
    assert set(refunds_of) <= set(paid), "a refund for an unpaid attempt"
    for d in odd:
        assert refunds_of[d.payment_id] == 1, f"discrepancy {d.id} without exactly one refund"
    # an order keeps the money of the one attempt that paid it, unless the seller let it down
    for o in order_rows:
        mine = [p for p in paid.values() if p.order_id == o.id]
        refunded = sum(refunds_of[p.id] for p in mine)
        kept = 1 if o.paid_at is not None and o.status != "cancelled_unshipped" else 0
        assert refunded == len(mine) - kept, (o.id, o.status, len(mine), refunded)


# --- the machine ------------------------------------------------------------------------------


class OrderLife(model_harness.ModelMachine):
    name = "model"
    clock_moves = ADVANCE
    others = OTHER_USER

    async def populate(self) -> None:
        self.users = [(await accounts.add_user(self.deps, f"user{i}"))[0].id for i in range(USERS)]
        model_goods = {}
        for seller, price in GOODS:
            gid = await accounts.add_goods(
                self.deps, seller_id=self.users[seller], title="thing", price=price
            )
            model_goods[gid] = MGoods(self.users[seller], Decimal(price))
        self.model = Model(now=START, goods=model_goods)

    def received(self, o: MOrder) -> None:
        self.model.receive(o, "confirm_receipt")

    # -- people (cancelling, shipping and confirming receipt move as model_harness.PARTY_MOVES
    # says)

    @initialize(places=st.lists(st.tuples(st.integers(0, USERS - 1), PICK), max_size=3))
    def some_orders(self, places: list[tuple[int, int]]) -> None:
        for buyer, item in places:
            self.place(buyer=buyer, item=item)

    @rule(buyer=st.integers(0, USERS - 1), item=PICK)
    def place(self, buyer: int, item: int) -> None:
        goods_ids = sorted(self.model.goods)
        goods_id = goods_ids[item % len(goods_ids)]
        g = self.model.goods[goods_id]
        buyer_id = self.users[buyer]
        if g.seller == buyer_id:
            expected: type[Exception] | None = NotAllowed
        elif g.status != "on_sale" or g.holder is not None:
            expected = GoodsUnavailable
        else:
            expected = None
        order_id = self.attempt(
            orders.place_order(self.deps, buyer_id=buyer_id, goods_id=goods_id), expected
        )
        if order_id is None:
            return
        assert order_id not in self.model.orders
        now = self.model.now
        o = MOrder(
            id=order_id,
            buyer=buyer_id,
            seller=g.seller,
            goods=goods_id,
            amount=g.price,
            status="pending_payment",
            pay_deadline=now + PAY,
        )
        o.timers = {
            "cancel_unpaid": ("scheduled", now + PAY),
            "pay_reminder": ("scheduled", now + REMINDER),
        }
        g.holder = order_id
        self.model.orders[order_id] = o

    @precondition(lambda self: self.model.orders)
    @rule(pick=PICK, fitting=FITTING, exact=st.sampled_from([True, True, True, True, False]))
    def manual_payment(self, pick: int, fitting: bool, exact: bool) -> None:
        o = self.order(pick, fitting, "pending_payment")
        amount = o.amount if exact else o.amount + Decimal("0.01")
        result = self.attempt(
            payments.record_manual_payment(self.deps, order_id=o.id, amount=amount),
            None if exact else PaymentMismatch,
        )
        if result is None:
            return
        _, outcome = result
        assert outcome.value == self.model.pay(o)

    @precondition(lambda self: self.model.orders)
    @rule(
        pick=PICK,
        fitting=FITTING,
        by=st.sampled_from(["buyer", "seller", "buyer", "seller", "other"]),
        rating=st.one_of(st.integers(1, 5), st.sampled_from([0, 6])),
    )
    def review(self, pick: int, fitting: bool, by: str, rating: int) -> None:
        o = self.order(pick, fitting, "received")
        if by == "other":
            user_id = next(u for u in self.users if u not in (o.buyer, o.seller))
        else:
            user_id = o.buyer if by == "buyer" else o.seller
        if not 1 <= rating <= 5:
            expected: type[Exception] | None = InvalidInput
        elif by == "other":
            expected = NotAllowed
        elif o.status != "received" or by in o.reviews:
            expected = InvalidTransition
        else:
            expected = None
        role = self.attempt(
            orders.review(self.deps, order_id=o.id, user_id=user_id, rating=rating), expected
        )
        if expected is None:
            assert role == by
            o.reviews[by] = (False, rating)
            o.events.append("review")
            if len(o.reviews) == 2:
                self.model.complete(o, "reviews_complete")

    @precondition(lambda self: self.model.orders)
    @rule(pick=PICK, rating=st.integers(1, 5))
    def next_step(self, pick: int, rating: int) -> None:
        """Someone takes an order one step further along its happy path (this keeps examples
        short while still reaching every stage)."""
        o = self.order(pick, True, "pending_payment", "pending_shipment", "shipped", "received")
        if o.status == "pending_payment":
            self.manual_payment(pick=pick, fitting=True, exact=True)
        elif o.status == "pending_shipment":
            self.ship(pick=pick, fitting=True, other=None)
        elif o.status == "shipped":
            self.confirm_receipt(pick=pick, fitting=True, other=None)
        elif o.status == "received":
            by = "seller" if "buyer" in o.reviews else "buyer"
            self.review(pick=pick, fitting=True, by=by, rating=rating)

    # -- after every step

    @invariant()
    def database_is_the_model(self) -> None:
        assert db_snapshot(self.engine) == self.model.snapshot()
        model = self.model.orders.values()
        assert sent(self.notifier) == Counter(
            [(o.id, "pay_reminder", None) for o in model if o.reminder_sent]
            + [(o.id, "order_closed", o.cancel_reason) for o in model if o.closed_sent]
        )
        structural_invariants(self.engine)

    @invariant()
    def drained_it_keeps_every_promise(self) -> None:
        """Every promise, "no order past its deadline" included, holds once the worker has
        drained: here when nothing is due, else on a drained copy of the database."""
        drained = self.drained_copy()
        if drained is None:
            self.run(promises(self.deps, drained=True))
            return
        structural_invariants(self.shadow_engine)
        assert db_snapshot(self.shadow_engine) == drained.snapshot()


@pytest.mark.slow
def test_random_interleavings_keep_every_promise(migrated_template: Path, tmp_path: Path) -> None:
    model_harness.check(OrderLife, migrated_template, tmp_path, examples=30, steps=40)
