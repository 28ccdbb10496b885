"""The tickets flow under random interleavings, against a small model.

A hypothesis state machine runs two shows of eight seats (sections A and B, a limit of three
seats a buyer) and four buyers: places orders for 1-4 random seats (unknown labels, repeats,
the organizer buying, a show that does not exist), cancels as the buyer or someone else, records
manual payments in time, late, twice or for a wrong amount, moves a FakeClock around the
15-minute pay deadline and past the sales close, drains the worker, runs scanner passes, delivers
timer ids again and lets the organizer cancel a show. The model predicts each outcome (the error
class or success), and after every step:

* the database equals the model: seat holds (seat -> order, held or sold), per-buyer counts,
  orders (status, reason, deadline, paid time), lines, tickets (valid, then void), timers,
  paid attempts, refunds, discrepancies, reminders, order-closed notices and every order's
  timeline;
* the structural promises hold as they stand: no seat held by two live orders nor by a dead one,
  nothing sold twice, every count the live seats of its buyer and within the limit, one refund
  per paid attempt that was not kept, no live timer for a final order but a due ``show_cancel``
  or ``order_closed`` (the notice every cancel writes);
* a copy drained at the same instant keeps ``check_invariants(tolerance_seconds=0)`` and equals
  the drained model, with no live timer left for a final order.

When a pay deadline and the show's cancel are due in one batch, the worker may run either first:
the model accepts either reason (and a reminder sent or not beside the show's cancel) and then
holds the database to the one it chose. ``DUEFLOW_TEST_MODEL_EXAMPLES`` and ``DUEFLOW_TEST_MODEL_STEPS``
make a longer run.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule
from sqlalchemy import Engine, func, select

from dueflow.domain import seating
from dueflow.exceptions import (
    InvalidInput,
    InvalidTransition,
    NotAllowed,
    NotFound,
    PaymentMismatch,
    SalesClosed,
    SeatLimitExceeded,
    SeatUnavailable,
)
from dueflow.service import accounts, orders, payments, tickets
from dueflow.store.schema import (
    discrepancies,
    order_events,
    order_lines,
    refunds,
    reminders,
    seat_holds,
    seats,
    show_buyers,
)
from dueflow.store.schema import orders as t_orders
from dueflow.store.schema import payments as t_payments
from dueflow.store.schema import shows as t_shows
from dueflow.store.schema import tickets as t_tickets
from dueflow.store.schema import timers as t_timers
from tests.conftest import START
from tests.unit import model_harness
from tests.unit.model_harness import PICK, InOrderWorker, refusal, sent

REMINDER = timedelta(minutes=5)
PAY = timedelta(minutes=15)
LIMIT = 3
BUYERS = 4
PRICES = {"A": Decimal("380.00"), "B": Decimal("180.00")}
SEATS = [f"{section}-{n}" for section in "AB" for n in range(1, 5)]
# (sales close, start) after START of each show: the first closes after a day, the second after two.
SHOWS = [(timedelta(days=1), timedelta(days=1, hours=2)), (timedelta(days=2), timedelta(days=3))]
NO_SHOW = 10**6
LIVE = ("pending_payment", "paid")
FINAL = ("cancelled_unpaid", "cancelled_paid")

# Mostly 1-3 distinct real seats; else up to four labels with repeats, a seat no show has,
# another section and a label that is not one.
SEAT_LIST = st.lists(st.sampled_from(SEATS), min_size=1, max_size=LIMIT, unique=True)
LABELS = st.one_of(
    SEAT_LIST,
    SEAT_LIST,
    st.lists(st.sampled_from([*SEATS, "A-9", "C-1", "A1"]), min_size=1, max_size=4),
)
BUYER = st.sampled_from([0, 1, 2, 3] * 3 + [BUYERS])  # BUYERS: the organizer
SHOW = st.sampled_from([0] * 6 + [1] * 6 + [2])  # 2: a show that does not exist
# Moves of the clock: around the reminder, the pay deadline and the scanner's grace, any few
# minutes, and now and then hours or past a sales close.
BOUNDARIES = [timedelta(seconds=s) for s in (1, 4, 5, 6, 59, 60, 299, 300, 301, 899, 900, 901)]
LONG = [timedelta(hours=1), timedelta(hours=20), timedelta(days=1)]
ADVANCE = st.one_of(
    st.sampled_from(BOUNDARIES),
    st.integers(1, 1200).map(lambda s: timedelta(seconds=s)),
    st.sampled_from(BOUNDARIES + LONG),
)
WHICH = st.sampled_from(["pending_payment"] * 3 + ["paid", "cancelled_unpaid", "any"])
OTHER = st.one_of(st.none(), st.integers(0, BUYERS))  # None: the rightful party


# --- the model --------------------------------------------------------------------------------


@dataclass
class MShow:
    id: int
    close_at: datetime
    starts_at: datetime
    status: str = "on_sale"


@dataclass
class MOrder:
    id: int
    buyer: int
    seller: int
    show: int
    labels: tuple[str, ...]
    amount: Decimal
    pay_deadline: datetime
    status: str = "pending_payment"
    paid_at: datetime | None = None
    cancel_reason: str | None = None
    #: While the worker's pick between two due cancels is unread: the reasons it may have given.
    reason_options: tuple[str, ...] = ()
    reminder: str | None = None  # the reminder row's state
    reminder_unsure: bool = False
    closed_sent: bool = False  # the buyer was told the order closed
    timers: dict[str, tuple[str, datetime]] = field(default_factory=dict)  # kind: (state, due)
    paid_attempts: int = 0
    refunds: int = 0
    discrepancies: list[str] = field(default_factory=list)
    tickets: dict[str, str] = field(default_factory=dict)  # label: valid | void
    events: list[str] = field(default_factory=list)


@dataclass
class Model:
    now: datetime
    organizer: int
    shows: dict[int, MShow]
    orders: dict[int, MOrder] = field(default_factory=dict)
    counted: set[tuple[int, int]] = field(default_factory=set)  # (show, buyer) rows

    def holds(self) -> dict[tuple[int, str], tuple[int, str, int]]:
        """(show, seat) -> (order, held | sold, buyer): every seat of a live order."""
        return {
            (o.show, label): (o.id, "held" if o.status == "pending_payment" else "sold", o.buyer)
            for o in self.orders.values()
            if o.status in LIVE
            for label in o.labels
        }

    def counts(self) -> dict[tuple[int, int], int]:
        live: Counter[tuple[int, int]] = Counter()
        for (show, _), (_, _, buyer) in self.holds().items():
            live[(show, buyer)] += 1
        return {key: live[key] for key in self.counted}

    def refusal(self, buyer: int, show_id: int, labels: list[str]) -> type[Exception] | None:
        """What placing an order says, in the order the service checks."""
        if not all(seating.LABEL.match(x) for x in labels) or len(set(labels)) < len(labels):
            return InvalidInput
        show = self.shows.get(show_id)
        if show is None:
            return NotFound
        if show.status != "on_sale" or self.now >= show.close_at:
            return SalesClosed
        if len(labels) > LIMIT:
            return SeatLimitExceeded
        if buyer == self.organizer:
            return NotAllowed
        if not set(labels) <= set(SEATS):
            return InvalidInput
        if any((show_id, x) in self.holds() for x in labels):
            return SeatUnavailable
        if self.counts().get((show_id, buyer), 0) + len(labels) > LIMIT:
            return SeatLimitExceeded
        return None

    def cancel_timers(self, o: MOrder) -> None:
        """A move cancels the order's scheduled timers; the show's cancel outlives every move."""
        for kind, (state, due) in o.timers.items():
            if state == "scheduled" and kind != "show_cancel":
                o.timers[kind] = ("cancelled", due)

    def cancel_unpaid(self, o: MOrder, *reasons: str) -> None:
        o.status = "cancelled_unpaid"
        o.reason_options = reasons
        o.cancel_reason = reasons[0] if len(reasons) == 1 else None
        self.cancel_timers(o)
        o.timers["order_closed"] = ("scheduled", self.now)
        o.events += [o.cancel_reason or "?", "released"]

    def pay(self, o: MOrder) -> str:
        o.paid_attempts += 1
        if o.status == "pending_payment":
            o.status, o.paid_at = "paid", self.now
            o.tickets = dict.fromkeys(o.labels, "valid")
            self.cancel_timers(o)
            o.events.append("pay")
            return "confirmed"
        o.discrepancies.append("paid_twice" if o.status == "paid" else "paid_after_cancel")
        o.refunds += 1
        o.events += ["discrepancy", "refund_created"]
        return "refund"

    def cancel_paid(self, o: MOrder) -> None:
        o.status, o.cancel_reason = "cancelled_paid", "show_cancel"
        o.tickets = dict.fromkeys(o.labels, "void")
        created, o.refunds = o.paid_attempts - o.refunds, o.paid_attempts
        self.cancel_timers(o)
        o.timers["order_closed"] = ("scheduled", self.now)
        o.events += ["show_cancel", "released"] + ["refund_created"] * created

    def cancel_show(self, show: MShow) -> int:
        show.status = "cancelled"
        live = [o for o in self.orders.values() if o.show == show.id and o.status in LIVE]
        for o in live:
            o.timers["show_cancel"] = ("scheduled", self.now)
            o.events.append("show_cancelled")
        return len(live)

    def due(self, cutoff: datetime) -> list[tuple[int, str]]:
        return sorted(
            (o.id, kind)
            for o in self.orders.values()
            for kind, (state, due) in o.timers.items()
            if state == "scheduled" and due <= cutoff
        )

    def run_due(self, cutoff: datetime) -> int:
        """A drain or a scan: batches until nothing is due by ``cutoff`` (a cancel's notice is
        due at once, so a drain takes it up in its next batch)."""
        fired = 0
        while batch := self.due(cutoff):
            fired += self.fire(batch)
        return fired

    def fire(self, batch: list[tuple[int, str]]) -> int:
        """One batch of the worker: each kind's handler runs beside the others, so when two
        cancels of one order are due together either may win."""
        kinds_of: dict[int, set[str]] = defaultdict(set)
        for order_id, kind in batch:
            o = self.orders[order_id]
            o.timers[kind] = ("done", o.timers[kind][1])
            kinds_of[order_id].add(kind)
        for order_id, kinds in kinds_of.items():
            o = self.orders[order_id]
            if "order_closed" in kinds:  # a cancelled order never moves again: it is told
                assert o.status in FINAL
                o.closed_sent = True
            waits = o.status == "pending_payment" and o.pay_deadline > self.now
            if o.status == "pending_payment" and "cancel_unpaid" in kinds:
                reasons = ("pay_timeout", "show_cancel") if "show_cancel" in kinds else ()
                self.cancel_unpaid(o, *(reasons or ("pay_timeout",)))
            elif o.status == "pending_payment" and "show_cancel" in kinds:
                o.reminder_unsure = "pay_reminder" in kinds and waits
                self.cancel_unpaid(o, "show_cancel")
            elif o.status == "pending_payment" and "pay_reminder" in kinds and waits:
                o.reminder = "sent"
            elif o.status == "paid" and "show_cancel" in kinds:
                self.cancel_paid(o)
        return len(batch)

    def unsure(self) -> list[MOrder]:
        return [o for o in self.orders.values() if o.reason_options[1:] or o.reminder_unsure]

    def settle(self, engine: Engine) -> None:
        """Take the worker's picks from the database, each one of those the model allows."""
        todo = {o.id: o for o in self.unsure()}
        if not todo:
            return
        with engine.connect() as conn:
            reasons = dict(
                conn.execute(
                    select(t_orders.c.id, t_orders.c.cancel_reason).where(t_orders.c.id.in_(todo))
                ).all()
            )
            sent = dict(
                conn.execute(
                    select(reminders.c.order_id, reminders.c.state).where(
                        reminders.c.order_id.in_(todo), reminders.c.kind == "pay_reminder"
                    )
                ).all()
            )
        for o in todo.values():
            if o.reason_options[1:]:
                event(f"the worker picked {reasons[o.id]} of two due cancels")
                assert reasons[o.id] in o.reason_options, (o.id, reasons[o.id])
                o.cancel_reason, o.reason_options = reasons[o.id], (reasons[o.id],)
                o.events[o.events.index("?")] = o.cancel_reason
            if o.reminder_unsure:
                event(f"reminder beside the show's cancel: {sent.get(o.id)}")
                o.reminder, o.reminder_unsure = sent.get(o.id), False

    def snapshot(self) -> dict[str, Any]:
        mine = self.orders.values()
        return {
            "orders": {
                o.id: (o.status, o.cancel_reason, o.pay_deadline, o.paid_at, o.buyer, o.amount)
                for o in mine
            },
            "lines": {o.id: list(o.labels) for o in mine},
            "holds": self.holds(),
            "counts": self.counts(),
            "tickets": {(o.id, label): s for o in mine for label, s in o.tickets.items()},
            "timers": {
                (o.id, kind): (state, due, 1 if state == "done" else 0)
                for o in mine
                for kind, (state, due) in o.timers.items()
            },
            "paid_attempts": {o.id: o.paid_attempts for o in mine if o.paid_attempts},
            "refunds": {o.id: o.refunds for o in mine if o.refunds},
            "discrepancies": sorted((o.id, k) for o in mine for k in o.discrepancies),
            "reminders": {
                **{(o.id, "pay_reminder"): o.reminder for o in mine if o.reminder is not None},
                **{(o.id, "order_closed"): "sent" for o in mine if o.closed_sent},
            },
            "events": {o.id: o.events for o in mine},
            "shows": {s.id: s.status for s in self.shows.values()},
        }


# --- reading the database (a plain synchronous engine, outside the code under test) -----------


def db_snapshot(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:

        def rows(query: Any) -> list[Any]:
            return list(conn.execute(query).all())

        order_rows = rows(select(t_orders))
        line_rows = rows(select(order_lines).order_by(order_lines.c.id))
        hold_rows = rows(select(seat_holds, seats.c.label).join(seats))
        ticket_rows = rows(select(t_tickets, seats.c.label).join(seats))
        timer_rows = rows(select(t_timers))
        paid = rows(
            select(t_payments.c.order_id, func.count())
            .where(t_payments.c.state == "paid")
            .group_by(t_payments.c.order_id)
        )
        refund_rows = rows(select(refunds))
        odd = rows(select(discrepancies))
        reminder_rows = rows(select(reminders))
        event_rows = rows(select(order_events).order_by(order_events.c.id))
        buyer_rows = rows(select(show_buyers))
        show_rows = rows(select(t_shows))
    events: dict[int, list[str]] = {o.id: [] for o in order_rows}
    for e in event_rows:
        if e.event != "place":
            events[e.order_id].append(e.event)
        else:
            assert events[e.order_id] == [], "placed twice"
    lines: dict[int, list[str]] = defaultdict(list)
    for line in line_rows:
        assert line.kind == "seat" and line.quantity == 1
        lines[line.order_id].append(line.label)
    assert {r.state for r in refund_rows} <= {"pending_review"}
    assert {(o.flow, o.order_type, o.ship_deadline) for o in order_rows} <= {
        ("tickets", "ticket", None)
    }
    return {
        "orders": {
            o.id: (o.status, o.cancel_reason, o.pay_deadline, o.paid_at, o.buyer_id, o.amount)
            for o in order_rows
        },
        "lines": dict(lines),
        "holds": {(h.show_id, h.label): (h.order_id, h.state, h.buyer_id) for h in hold_rows},
        "counts": {(b.show_id, b.buyer_id): b.seats for b in buyer_rows},
        "tickets": {(t.order_id, t.label): t.state for t in ticket_rows},
        "timers": {(t.order_id, t.kind): (t.state, t.due_at, t.attempts) for t in timer_rows},
        "paid_attempts": dict(paid),
        "refunds": dict(Counter(r.order_id for r in refund_rows)),
        "discrepancies": sorted((d.order_id, d.kind) for d in odd),
        "reminders": {(r.order_id, r.kind): r.state for r in reminder_rows},
        "events": events,
        "shows": {s.id: s.status for s in show_rows},
    }


def structural_invariants(engine: Engine, now: datetime, *, drained: bool) -> None:
    """The promises that hold at every instant, read from the database alone."""
    with engine.connect() as conn:
        order_rows = {o.id: o for o in conn.execute(select(t_orders)).all()}
        line_rows = list(conn.execute(select(order_lines)).all())
        hold_rows = list(conn.execute(select(seat_holds)).all())
        ticket_rows = list(conn.execute(select(t_tickets)).all())
        buyer_rows = list(conn.execute(select(show_buyers)).all())
        payment_rows = list(conn.execute(select(t_payments)).all())
        refund_rows = list(conn.execute(select(refunds)).all())
        timer_rows = list(conn.execute(select(t_timers)).all())
    held = {(h.show_id, h.seat_id): h for h in hold_rows}
    assert len(held) == len(hold_rows), "a seat held twice"
    for h in hold_rows:
        holder = order_rows[h.order_id]
        assert holder.status in LIVE, f"seat {h.seat_id} held by {holder.status} order {holder.id}"
        assert h.state == ("held" if holder.status == "pending_payment" else "sold"), h
    wanted = [(order_rows[x.order_id], x.item_id) for x in line_rows]
    live_seats = [(o.show_id, seat) for o, seat in wanted if o.status in LIVE]
    assert len(set(live_seats)) == len(live_seats), "a seat in two live orders"
    assert set(live_seats) == set(held), "live orders and seat holds differ"
    valid = Counter((t.show_id, t.seat_id) for t in ticket_rows if t.state == "valid")
    assert set(valid.values()) <= {1}, "a seat sold twice"
    sold = {key for key, h in held.items() if h.state == "sold"}
    assert set(valid) == sold, "valid tickets and sold seats differ"
    assert len({t.code for t in ticket_rows}) == len(ticket_rows) and all(
        len(t.code) >= 22 for t in ticket_rows
    )
    per_buyer = Counter((h.show_id, h.buyer_id) for h in hold_rows)
    for b in buyer_rows:
        assert b.seats == per_buyer[(b.show_id, b.buyer_id)] <= LIMIT, b
    # one refund per paid attempt, but the one that pays a live paid order
    refunds_of = Counter(r.payment_id for r in refund_rows)
    assert set(refunds_of.values()) <= {1}, "a paid attempt refunded twice"
    for o in order_rows.values():
        mine = [p for p in payment_rows if p.order_id == o.id and p.state == "paid"]
        kept = 1 if o.status == "paid" else 0
        assert sum(refunds_of[p.id] for p in mine) == len(mine) - kept, (o.id, o.status)
    for t in timer_rows:
        if t.state == "scheduled" and order_rows[t.order_id].status in FINAL:
            assert not drained and t.kind in ("show_cancel", "order_closed"), t
            assert t.due_at <= now, t
        if t.state == "scheduled" and order_rows[t.order_id].status == "paid":
            assert t.kind == "show_cancel", t


# --- the machine ------------------------------------------------------------------------------


class TicketSale(model_harness.ModelMachine):
    name = "tickets"
    worker_class = InOrderWorker
    clock_moves = ADVANCE

    async def populate(self) -> None:
        users = [(await accounts.add_user(self.deps, f"u{i}"))[0].id for i in range(BUYERS + 1)]
        self.users, organizer = users, users[BUYERS]
        shows = {}
        for close, start in SHOWS:
            show_id = await tickets.create_show(
                self.deps,
                organizer_id=organizer,
                title="Winter concert",
                venue="Hall 1",
                starts_at=START + start,
                sales_close_at=START + close,
                seat_limit=LIMIT,
                seats=seating.parse_ranges("A:1-4,B:1-4", PRICES),
            )
            shows[show_id] = MShow(show_id, START + close, START + start)
        self.show_ids = [*shows, NO_SHOW]
        self.model = Model(now=START, organizer=organizer, shows=shows)

    def fire(self, timer: Any) -> None:
        self.model.fire([(timer.order_id, timer.kind)])

    def settle(self, model: Any, engine: Engine) -> None:
        model.settle(engine)

    # -- people

    @initialize(
        buys=st.lists(
            st.tuples(st.integers(0, BUYERS - 1), st.integers(0, 1), PICK, st.integers(1, 2)),
            min_size=2,
            max_size=5,
        )
    )
    def a_sale_is_on(self, buys: list[tuple[int, int, int, int]]) -> None:
        for buyer, show, pick, n in buys:
            self.buy_free_seats(buyer=buyer, show=show, pick=pick, n=n)

    @rule(buyer=BUYER, show=SHOW, labels=LABELS)
    def place(self, buyer: int, show: int, labels: list[str]) -> None:
        self.place_order(self.users[buyer], self.show_ids[show], labels)

    @rule(buyer=st.integers(0, BUYERS - 1), show=st.integers(0, 1), pick=PICK, n=st.integers(1, 2))
    def buy_free_seats(self, buyer: int, show: int, pick: int, n: int) -> None:
        """A buyer picks seats the map shows free (any seats once none is): most often a sale."""
        show_id = self.show_ids[show]
        free = [x for x in SEATS if (show_id, x) not in self.model.holds()] or SEATS
        start = pick % len(free)
        self.place_order(self.users[buyer], show_id, (free[start:] + free[:start])[:n])

    def place_order(self, buyer_id: int, show_id: int, labels: list[str]) -> None:
        expected = self.model.refusal(buyer_id, show_id, labels)
        event(f"place: {expected.__name__ if expected else 'placed'}")
        view = self.attempt(
            tickets.place_ticket_order(
                self.deps, buyer_id=buyer_id, show_id=show_id, labels=labels, view=False
            ),
            expected,
        )
        if view is None:
            return
        now = self.model.now
        o = MOrder(
            id=view["id"],
            buyer=buyer_id,
            seller=self.model.organizer,
            show=show_id,
            labels=tuple(labels),
            amount=sum((PRICES[x[0]] for x in labels), start=Decimal(0)),
            pay_deadline=now + PAY,
        )
        o.timers = {"cancel_unpaid": ("scheduled", now + PAY)}
        o.timers["pay_reminder"] = ("scheduled", now + REMINDER)
        assert o.id not in self.model.orders
        self.model.orders[o.id] = o
        self.model.counted.add((show_id, buyer_id))

    @precondition(lambda self: self.model.orders)
    @rule(pick=PICK, which=WHICH, other=OTHER)
    def buyer_cancels(self, pick: int, which: str, other: int | None) -> None:
        o = self.order(pick, True, which)
        user_id = self.party(o.buyer, other)
        expected = refusal(o, user_id, o.buyer, "pending_payment")
        self.attempt(orders.cancel_by_buyer(self.deps, order_id=o.id, user_id=user_id), expected)
        if expected is None:
            self.model.cancel_unpaid(o, "buyer_cancel")

    @precondition(lambda self: self.model.orders)
    @rule(pick=PICK, which=WHICH, exact=st.sampled_from([True] * 5 + [False]))
    def manual_payment(self, pick: int, which: str, exact: bool) -> None:
        """Money arrives off-line: in time, after the deadline (before or after the cancel),
        a second time, or for another amount (refused, nothing recorded)."""
        o = self.order(pick, True, which)
        amount = o.amount if exact else o.amount - Decimal("0.01")
        result = self.attempt(
            payments.record_manual_payment(self.deps, order_id=o.id, amount=amount),
            None if exact else PaymentMismatch,
        )
        if result is not None:
            outcome = self.model.pay(o)
            event(f"pay: {outcome} ({o.discrepancies[-1] if o.discrepancies else o.status})")
            assert result[1].value == outcome

    @precondition(lambda self: self.model.orders)
    @rule(pick=PICK)
    def buyer_pays(self, pick: int) -> None:
        """The usual payment: exact, for an order awaiting it if there is one."""
        self.manual_payment(pick=pick, which="pending_payment", exact=True)

    # A show with a sale going on: some seats paid for, more orders placed.
    @precondition(lambda self: len(self.model.orders) >= 3 and self.model.holds())
    @rule(busiest=st.booleans(), other=OTHER, drain=st.booleans())
    def organizer_cancels_show(self, busiest: bool, other: int | None, drain: bool) -> None:
        """The organizer (or someone else) cancels the show with the most sold seats, or the
        other one."""
        sold = Counter(
            show for (show, _), (_, state, _) in self.model.holds().items() if state == "sold"
        )
        ranked = sorted(self.model.shows, key=lambda show: -sold[show])
        s = self.model.shows[ranked[0 if busiest else 1]]
        user_id = self.model.organizer if other is None else self.users[other]
        if user_id != self.model.organizer:
            expected: type[Exception] | None = NotAllowed
        elif s.status != "on_sale":
            expected = InvalidTransition
        else:
            expected = None
        live = self.attempt(tickets.cancel_show(self.deps, show_id=s.id, user_id=user_id), expected)
        event(f"cancel show: {expected.__name__ if expected else 'cancelled'}")
        if expected is None:
            assert live == self.model.cancel_show(s)
        if drain:
            self.drain()

    # -- time and the machinery

    @precondition(lambda self: len(self.model.orders) >= 3)
    @rule(offset=st.sampled_from([-1, 0, 1]))
    def to_the_first_sales_close(self, offset: int) -> None:
        """The clock goes to a second before, at or after the first show's sales close (if
        ahead); the second show sells on."""
        at = self.model.shows[self.show_ids[0]].close_at + timedelta(seconds=offset)
        if at > self.model.now:
            self.advance(at - self.model.now)

    # -- after every step

    @invariant()
    def database_is_the_model(self) -> None:
        assert db_snapshot(self.engine) == self.model.snapshot()
        model = self.model.orders.values()
        assert sent(self.notifier) == Counter(
            [(o.id, "pay_reminder", None) for o in model if o.reminder == "sent"]
            + [(o.id, "order_closed", o.cancel_reason) for o in model if o.closed_sent]
        )
        structural_invariants(self.engine, self.model.now, drained=False)

    @invariant()
    def drained_it_keeps_every_promise(self) -> None:
        """Every promise, "no order past its deadline" included, holds once the worker has
        drained: on a drained copy of the database whenever something is due (when nothing is,
        the model and the structural checks above already cover the drained state; dueflow's
        own check_invariants each step would double the run's time)."""
        drained = self.drained_copy()
        if drained is None:
            return
        structural_invariants(self.shadow_engine, drained.now, drained=True)
        assert db_snapshot(self.shadow_engine) == drained.snapshot()


@pytest.mark.slow
def test_random_ticket_sales_keep_every_promise(migrated_template: Path, tmp_path: Path) -> None:
    model_harness.check(
        TicketSale, migrated_template, tmp_path, **model_harness.from_env(examples=30, steps=30)
    )
