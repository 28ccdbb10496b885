"""The seed's four decision cases for a ticket order's pay deadline, through the real handler
with the FakeClock (expired -> cancelled, seats free; paid -> ignored; not yet due -> re-armed
for the rest; delivered twice -> no second effect), and the organizer's cancel when the worker
dies halfway, meets a second open trade, or meets a payment that lands before the worker ran."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from decimal import Decimal
from typing import Any

from sqlalchemy import select, update

from dueflow.domain.timers import TimerKind
from dueflow.payments.base import CloseOutcome, PaymentProvider, Providers, VerifiedPayment
from dueflow.payments.manual import ManualProvider
from dueflow.service import orders, payments, tickets
from dueflow.service.payments import PaymentOutcome
from dueflow.store import payments as payment_store
from dueflow.store import timers
from dueflow.store.schema import (
    discrepancies,
    order_events,
    refunds,
    seat_holds,
    seats,
    show_buyers,
)
from dueflow.store.schema import orders as t_orders
from dueflow.store.schema import payments as t_payments
from dueflow.store.schema import tickets as t_tickets
from dueflow.store.schema import timers as t_timers
from dueflow.store.timers import Claimed
from dueflow.worker.scanner import scan_once

PAY = timedelta(minutes=15)  # the prod profile's pay window for a ticket order


# --- reading the database ---------------------------------------------------------------------


async def _all(world: Any, query: Any) -> list[Any]:
    async with world.deps.db.read() as conn:
        return list((await conn.execute(query)).all())


async def held(world: Any, order_id: int) -> dict[str, str]:
    """Seat label -> held | sold, for every live hold row of the order."""
    query = (
        select(seats.c.label, seat_holds.c.state)
        .join(seats, seats.c.id == seat_holds.c.seat_id)
        .where(seat_holds.c.order_id == order_id)
    )
    return {label: state for label, state in await _all(world, query)}


async def counted(world: Any, show_id: int, buyer: int) -> int | None:
    query = select(show_buyers.c.seats).where(
        show_buyers.c.show_id == show_id, show_buyers.c.buyer_id == buyer
    )
    found = await _all(world, query)
    return found[0].seats if found else None


async def timer_of(world: Any, order_id: int, kind: TimerKind) -> Any:
    (row,) = await _all(
        world, select(t_timers).where(t_timers.c.order_id == order_id, t_timers.c.kind == kind)
    )
    return row


async def order_of(world: Any, order_id: int) -> Any:
    (row,) = await _all(world, select(t_orders).where(t_orders.c.id == order_id))
    return row


async def events_of(world: Any, order_id: int) -> Counter[str]:
    query = select(order_events.c.event).where(order_events.c.order_id == order_id)
    return Counter(r.event for r in await _all(world, query))


async def tickets_of(world: Any, order_id: int) -> list[str]:
    query = select(t_tickets.c.state).where(t_tickets.c.order_id == order_id)
    return sorted(r.state for r in await _all(world, query))


async def refunds_of(world: Any, order_id: int) -> list[tuple[str, str, Decimal]]:
    query = select(refunds).where(refunds.c.order_id == order_id).order_by(refunds.c.id)
    return [(r.state, r.reason, r.amount) for r in await _all(world, query)]


async def claim(world: Any, timer_ids: list[int]) -> list[Claimed]:
    """Claim these timers as a worker does, without running them."""
    async with world.deps.db.write() as conn:
        return await timers.claim_ids(
            conn, timer_ids, now=world.clock.now(), lease=world.deps.lease
        )


async def seat_states(world: Any, show_id: int) -> dict[str, str]:
    return {s["label"]: s["state"] for s in await tickets.seat_map(world.deps, show_id)}


# --- the four decision cases ------------------------------------------------------------------


async def test_expired_is_cancelled_and_every_seat_is_free(world):
    show_id = await world.show()
    order = await world.seats(show_id, ["A-1", "A-2", "B-3"])
    unpaid = await timer_of(world, order["id"], TimerKind.CANCEL_UNPAID)
    assert unpaid.due_at == world.clock.now() + PAY
    world.clock.advance(PAY)
    assert await world.worker.deliver([unpaid.id]) == 1
    row = await order_of(world, order["id"])
    assert (row.status, row.cancel_reason, row.cancelled_at) == (
        "cancelled_unpaid",
        "pay_timeout",
        world.clock.now(),
    )
    timer = await timer_of(world, order["id"], TimerKind.CANCEL_UNPAID)
    assert (timer.state, timer.outcome, timer.attempts) == ("done", "cancelled", 1)
    assert await held(world, order["id"]) == {}
    assert await counted(world, show_id, world.buyer) == 0
    assert set((await seat_states(world, show_id)).values()) == {"free"}
    assert (await events_of(world, order["id"])) == Counter(place=1, pay_timeout=1, released=1)
    # The seats are for sale again, to anyone.
    again = await world.seats(show_id, ["A-1", "A-2"], buyer=world.other)
    assert await held(world, again["id"]) == {"A-1": "held", "A-2": "held"}


async def test_paid_is_ignored_and_the_seats_stay_sold(world):
    show_id = await world.show()
    order = await world.seats(show_id, ["A-1", "A-2"])
    unpaid = await timer_of(world, order["id"], TimerKind.CANCEL_UNPAID)
    world.clock.advance(PAY)
    # The worker claimed the timer; the payment commits before its handler runs.
    claimed = await claim(world, [unpaid.id])
    _, outcome = await payments.record_manual_payment(
        world.deps, order_id=order["id"], amount="760.00"
    )
    assert outcome is PaymentOutcome.CONFIRMED
    await world.worker.run_batch(claimed)
    row = await order_of(world, order["id"])
    assert (row.status, row.cancelled_at) == ("paid", None)
    timer = await timer_of(world, order["id"], TimerKind.CANCEL_UNPAID)
    assert (timer.state, timer.outcome) == (
        "done",
        "skipped: order is paid (paid before this timer)",
    )
    assert await held(world, order["id"]) == {"A-1": "sold", "A-2": "sold"}
    assert await tickets_of(world, order["id"]) == ["valid", "valid"]
    assert await counted(world, show_id, world.buyer) == 2
    assert await refunds_of(world, order["id"]) == []
    assert (await events_of(world, order["id"])) == Counter(place=1, pay=1)


async def test_not_yet_due_is_rearmed_for_the_rest(world):
    show_id = await world.show()
    order = await world.seats(show_id, ["B-1", "B-2"])
    unpaid = await timer_of(world, order["id"], TimerKind.CANCEL_UNPAID)
    assert unpaid.due_at == world.clock.now() + PAY
    pushed = unpaid.due_at + timedelta(minutes=5)
    async with world.deps.db.write() as conn:  # the pay deadline moved later (say, support)
        await conn.execute(
            update(t_orders).where(t_orders.c.id == order["id"]).values(pay_deadline=pushed)
        )
    world.clock.advance(PAY)
    assert await world.worker.drain() == 2  # the cancel and the (late) reminder
    timer = await timer_of(world, order["id"], TimerKind.CANCEL_UNPAID)
    assert (timer.state, timer.due_at, timer.claim_token) == ("scheduled", pushed, None)
    assert timer.attempts == 0 and timer.last_error is None  # a re-arm is no failed try
    row = await order_of(world, order["id"])
    assert row.status == "pending_payment"
    assert await held(world, order["id"]) == {"B-1": "held", "B-2": "held"}
    assert await counted(world, show_id, world.buyer) == 2
    assert await world.worker.drain() == 0  # nothing is due before the new deadline
    world.clock.advance(timedelta(minutes=5))
    assert await world.worker.drain() == 2  # the cancel, then its notice
    row = await order_of(world, order["id"])
    assert (row.status, row.cancel_reason) == ("cancelled_unpaid", "pay_timeout")
    assert await held(world, order["id"]) == {}
    assert await counted(world, show_id, world.buyer) == 0


async def test_delivered_twice_has_no_second_effect(world):
    show_id = await world.show()
    order = await world.seats(show_id, ["A-5", "A-6"])
    unpaid = await timer_of(world, order["id"], TimerKind.CANCEL_UNPAID)
    world.clock.advance(PAY)
    claimed = await claim(world, [unpaid.id])
    await world.worker.run_batch(claimed)
    # Meanwhile another buyer takes the same seats: a repeat must not let them go.
    other = await world.seats(show_id, ["A-5", "A-6"], buyer=world.other)
    await world.worker.run_batch(claimed)  # the same batch handled again
    assert await world.worker.deliver([unpaid.id]) == 0  # and the same timer delivered again
    timer = await timer_of(world, order["id"], TimerKind.CANCEL_UNPAID)
    assert (timer.state, timer.outcome, timer.attempts) == ("done", "cancelled", 1)
    assert (await order_of(world, order["id"])).status == "cancelled_unpaid"
    assert (await events_of(world, order["id"])) == Counter(place=1, pay_timeout=1, released=1)
    assert await held(world, other["id"]) == {"A-5": "held", "A-6": "held"}
    assert await counted(world, show_id, world.buyer) == 0
    assert await counted(world, show_id, world.other) == 2


# --- the organizer's cancel -------------------------------------------------------------------


async def test_show_cancel_resumes_after_the_worker_dies_halfway(world):
    show_id = await world.show()
    first = await world.seats(show_id, ["A-1"])
    second = await world.seats(show_id, ["A-2", "A-3"])
    paid = await world.seats(show_id, ["B-1", "B-2"], buyer=world.other)
    await payments.record_manual_payment(world.deps, order_id=paid["id"], amount="360.00")
    assert await tickets.cancel_show(world.deps, show_id=show_id, user_id=world.seller) == 3
    ids = [
        (await timer_of(world, o["id"], TimerKind.SHOW_CANCEL)).id for o in (first, second, paid)
    ]
    claimed = await claim(world, ids)
    assert [c.order_id for c in claimed] == [first["id"], second["id"], paid["id"]]
    # The worker handles one order, then dies holding the claims of the other two.
    await world.worker.run_batch(claimed[:1])
    assert (await order_of(world, first["id"])).status == "cancelled_unpaid"
    assert (await order_of(world, second["id"])).status == "pending_payment"
    assert (await order_of(world, paid["id"])).status == "paid"
    # Claimed timers are nobody else's until the lease ends; the first cancel's notice goes out.
    assert await world.worker.drain() == 1
    assert [(r.order_id, r.reason) for r in world.notifier.sent] == [(first["id"], "show_cancel")]
    assert (await scan_once(world.worker)).claimed == 0
    world.clock.advance(world.deps.lease)
    assert (await scan_once(world.worker)).claimed == 2
    for order, status in ((first, "cancelled_unpaid"), (second, "cancelled_unpaid")):
        row = await order_of(world, order["id"])
        assert (row.status, row.cancel_reason) == (status, "show_cancel")
        assert await held(world, order["id"]) == {}
        assert await refunds_of(world, order["id"]) == []
        assert await events_of(world, order["id"]) == Counter(
            place=1, show_cancelled=1, show_cancel=1, released=1
        )
    row = await order_of(world, paid["id"])
    assert (row.status, row.cancel_reason) == ("cancelled_paid", "show_cancel")
    assert await held(world, paid["id"]) == {}
    assert await tickets_of(world, paid["id"]) == ["void", "void"]
    assert await refunds_of(world, paid["id"]) == [
        ("pending_review", "show_cancel", Decimal("360.00"))
    ]
    assert await counted(world, show_id, world.buyer) == 0
    assert await counted(world, show_id, world.other) == 0
    assert set((await seat_states(world, show_id)).values()) == {"free"}
    done = [await timer_of(world, o["id"], TimerKind.SHOW_CANCEL) for o in (first, second, paid)]
    assert [(t.state, t.attempts) for t in done] == [("done", 1), ("done", 2), ("done", 2)]
    assert await world.worker.drain() == 2  # the notices of the two resumed cancels
    assert (await scan_once(world.worker)).claimed == 0
    told = sorted((r.order_id, r.kind, r.reason) for r in world.notifier.sent)
    assert told == [(o["id"], "order_closed", "show_cancel") for o in (first, second, paid)]


class SecondTrade(PaymentProvider):
    """A provider whose trades close unpaid, or turn out paid when ``paid`` is set."""

    name = "second"

    def __init__(self, *, paid: bool) -> None:
        self.paid = paid
        self.closed: list[str] = []

    async def close_or_query(self, attempt, now):
        self.closed.append(attempt.pay_no)
        if self.paid:
            return CloseOutcome.paid(VerifiedPayment(attempt.pay_no, attempt.amount, "T2"))
        return CloseOutcome.closed()


async def paid_with_open_second_trade(world: Any, provider: SecondTrade) -> tuple[int, int]:
    """A paid ticket order of a new show that still has an open trade at ``provider``."""
    world.deps.providers = Providers([ManualProvider(), provider])
    show_id = await world.show()
    order = await world.seats(show_id, ["A-1", "A-2"])
    async with world.deps.db.write() as conn:
        await payment_store.insert_attempt(
            conn,
            pay_no="SECOND1",
            order_id=order["id"],
            provider=provider.name,
            amount=Decimal("760.00"),
            expires_at=order["pay_deadline"],
            now=world.clock.now(),
        )
    await payments.record_manual_payment(world.deps, order_id=order["id"], amount="760.00")
    leftover = await timer_of(world, order["id"], TimerKind.CLOSE_ATTEMPTS)
    assert leftover.state == "scheduled"
    return show_id, order["id"]


async def drain_with_retries(world: Any) -> None:
    """Run the show cancel and the leftover close, which share a batch: the cancel of a paid
    order does not wait for its leftover trade (its own close_attempts timer closes it), then
    the cancel's notice; nothing is left to retry."""
    assert await world.worker.drain() == 3
    world.clock.advance(timedelta(minutes=1))
    assert await world.worker.drain() == 0


async def test_a_paid_order_with_an_open_second_trade_is_refunded_once(world):
    provider = SecondTrade(paid=False)
    show_id, order_id = await paid_with_open_second_trade(world, provider)
    assert await tickets.cancel_show(world.deps, show_id=show_id, user_id=world.seller) == 1
    await drain_with_retries(world)
    row = await order_of(world, order_id)
    assert (row.status, row.cancel_reason) == ("cancelled_paid", "show_cancel")
    trades = await _all(world, select(t_payments).where(t_payments.c.order_id == order_id))
    assert sorted((p.provider, p.state) for p in trades) == [
        ("manual", "paid"),
        ("second", "closed"),
    ]
    assert "SECOND1" in provider.closed
    assert await refunds_of(world, order_id) == [
        ("pending_review", "show_cancel", Decimal("760.00"))
    ]
    assert (
        await _all(world, select(discrepancies).where(discrepancies.c.order_id == order_id)) == []
    )
    assert await tickets_of(world, order_id) == ["void", "void"]
    assert await held(world, order_id) == {}
    assert await counted(world, show_id, world.buyer) == 0


async def test_a_second_trade_found_paid_at_the_show_cancel_is_refunded_too(world):
    provider = SecondTrade(paid=True)
    show_id, order_id = await paid_with_open_second_trade(world, provider)
    assert await tickets.cancel_show(world.deps, show_id=show_id, user_id=world.seller) == 1
    await drain_with_retries(world)
    row = await order_of(world, order_id)
    assert (row.status, row.cancel_reason) == ("cancelled_paid", "show_cancel")
    trades = await _all(world, select(t_payments).where(t_payments.c.order_id == order_id))
    assert sorted((p.provider, p.state) for p in trades) == [("manual", "paid"), ("second", "paid")]
    odd = await _all(world, select(discrepancies).where(discrepancies.c.order_id == order_id))
    # paid twice, or paid after the cancel: which depends on which of the two side-by-side
    # handlers of the batch committed first.
    [kind] = [d.kind for d in odd]
    assert kind in ("paid_twice", "paid_after_cancel")
    # Each paid trade is paid back exactly once, whichever step found it first.
    assert sorted(await refunds_of(world, order_id)) == sorted(
        [
            ("pending_review", kind, Decimal("760.00")),
            ("pending_review", "show_cancel", Decimal("760.00")),
        ]
    )
    assert await tickets_of(world, order_id) == ["void", "void"]
    assert await held(world, order_id) == {}
    assert await counted(world, show_id, world.buyer) == 0


async def test_a_payment_between_the_show_cancel_and_the_worker_ends_refunded(world):
    show_id = await world.show()
    order = await world.seats(show_id, ["A-7", "B-7"])
    async with world.deps.db.write() as conn:
        await payment_store.insert_attempt(
            conn,
            pay_no="NOTIFIED1",
            order_id=order["id"],
            provider="manual",
            amount=Decimal("560.00"),
            expires_at=order["pay_deadline"],
            now=world.clock.now(),
        )
    assert await tickets.cancel_show(world.deps, show_id=show_id, user_id=world.seller) == 1
    # The provider's notification lands before any worker took the show_cancel timer up.
    outcome = await payments.confirm_payment(
        world.deps, VerifiedPayment("NOTIFIED1", Decimal("560.00"), "T1"), actor="notification"
    )
    assert outcome is PaymentOutcome.CONFIRMED
    assert (await order_of(world, order["id"])).status == "paid"
    cancel = await timer_of(world, order["id"], TimerKind.SHOW_CANCEL)
    assert cancel.state == "scheduled"  # paying cancels the order-life timers, not this one
    assert await world.worker.drain() == 2  # the show cancel, then its notice
    assert [(r.kind, r.reason) for r in world.notifier.sent] == [("order_closed", "show_cancel")]
    row = await order_of(world, order["id"])
    assert (row.status, row.cancel_reason) == ("cancelled_paid", "show_cancel")
    assert await refunds_of(world, order["id"]) == [
        ("pending_review", "show_cancel", Decimal("560.00"))
    ]
    assert await tickets_of(world, order["id"]) == ["void", "void"]
    assert await held(world, order["id"]) == {}
    assert await counted(world, show_id, world.buyer) == 0
    view = await orders.order_view(world.deps, order["id"])
    assert [r["state"] for r in view["refunds"]] == ["pending_review"]
    assert (await timer_of(world, order["id"], TimerKind.SHOW_CANCEL)).outcome == (
        "cancelled: the show was cancelled"
    )
