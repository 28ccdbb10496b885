"""Real races on one SQLite file.

Every contender runs in its own thread with its own event loop and its own engine (its own
connection pool), exactly as separate API and worker processes would; a ``threading.Barrier``
releases them together. Deadlines come from FakeClocks set to the same instant, never from
sleeping. The assertions are on the database: exactly one winner, and everything the winner's
transition implies (holds, timers, refunds, timeline) is there exactly once.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select

from dueflow.domain.timers import TimerKind
from dueflow.exceptions import Busy, GoodsUnavailable, InvalidTransition
from dueflow.service import accounts, orders, payments
from dueflow.service.deps import Deps
from dueflow.service.payments import PaymentOutcome
from dueflow.service.report import check_invariants
from dueflow.store.schema import (
    discrepancies,
    goods,
    order_events,
    refunds,
    reminders,
    reviews,
    timers,
)
from dueflow.store.schema import orders as t_orders
from dueflow.store.schema import payments as t_payments
from dueflow.worker.runner import Worker
from dueflow.worker.scanner import scan_once
from tests.contract.race_harness import RoundBody, contend, rows

CANCELLED_FIRST = "skipped: order is cancelled_unpaid (cancelled before this timer)"

START = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)  # the world fixture's clock starts here
PAY_DEADLINE = START + timedelta(minutes=30)
STAGGER = 0.02  # seconds of head start in staggered rounds (ordering only, never a deadline)


# --- reading the database ---------------------------------------------------------------------


async def scalar(deps: Deps, query: Any) -> Any:
    async with deps.db.read() as conn:
        return (await conn.execute(query)).scalar_one()


async def order_row(deps: Deps, order_id: int) -> Any:
    (row,) = await rows(deps, select(t_orders).where(t_orders.c.id == order_id))
    return row


async def goods_row(deps: Deps, goods_id: int) -> Any:
    (row,) = await rows(deps, select(goods).where(goods.c.id == goods_id))
    return row


async def timers_by_kind(deps: Deps, order_id: int) -> dict[str, Any]:
    found = await rows(deps, select(timers).where(timers.c.order_id == order_id))
    by_kind = {r.kind: r for r in found}
    assert len(by_kind) == len(found), "two timers of one kind for one order"
    return by_kind


async def events(deps: Deps, order_id: int) -> Counter[str]:
    found = await rows(
        deps, select(order_events.c.event).where(order_events.c.order_id == order_id)
    )
    return Counter(r.event for r in found)


async def timer_id(deps: Deps, order_id: int, kind: TimerKind) -> int:
    return int((await timers_by_kind(deps, order_id))[kind.value].id)


async def assert_invariants(deps: Deps) -> None:
    result = await check_invariants(deps, tolerance_seconds=0)
    result.past_deadline = []  # the races below leave other orders' deadlines alone
    assert result.ok, result


# --- (a) many buyers, one goods item ------------------------------------------------------------


async def test_twenty_buyers_one_goods_exactly_one_order(world, settings):
    buyers = [(await accounts.add_user(world.deps, f"buyer{i}"))[0].id for i in range(20)]
    for _ in range(3):
        goods_id = await world.goods()

        def buyer(user_id: int, goods_id: int = goods_id) -> RoundBody:
            async def body(deps: Deps, _round: int) -> int:
                return await orders.place_order(deps, buyer_id=user_id, goods_id=goods_id)

            return body

        (outcomes,) = await asyncio.to_thread(contend, settings, START, [buyer(b) for b in buyers])
        won = [o.value for o in outcomes if o.error is None]
        refused = [o.error for o in outcomes if o.error is not None]
        assert len(won) == 1, outcomes
        assert all(isinstance(e, GoodsUnavailable | Busy) for e in refused), refused
        (order_id,) = won
        placed = await rows(world.deps, select(t_orders).where(t_orders.c.goods_id == goods_id))
        assert [r.id for r in placed] == [order_id]
        assert placed[0].status == "pending_payment"
        item = await goods_row(world.deps, goods_id)
        assert (item.status, item.reserved_order_id) == ("on_sale", order_id)
        assert sorted(await timers_by_kind(world.deps, order_id)) == [
            "cancel_unpaid",
            "pay_reminder",
        ]
        assert await events(world.deps, order_id) == Counter(place=1)
    assert await scalar(world.deps, select(func.count()).select_from(t_orders)) == 3
    await assert_invariants(world.deps)


# --- (b) payment against the pay deadline -------------------------------------------------------


async def place(world: Any) -> tuple[int, int]:
    goods_id = await world.goods()
    order_id = await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)
    return order_id, goods_id


async def settled(deps: Deps, order_id: int, goods_id: int) -> str:
    """Check that exactly one of payment, pay timeout and buyer cancel won, with everything its
    transition implies and nothing of the others'; return the winner's event."""
    order = await order_row(deps, order_id)
    item = await goods_row(deps, goods_id)
    tmrs = await timers_by_kind(deps, order_id)
    seen = await events(deps, order_id)
    paid = await rows(deps, select(t_payments).where(t_payments.c.order_id == order_id))
    back = await rows(deps, select(refunds).where(refunds.c.order_id == order_id))
    odd = await rows(deps, select(discrepancies).where(discrepancies.c.order_id == order_id))
    assert [p.state for p in paid] == ["paid"], "the payment is recorded whoever won"
    assert tmrs["pay_reminder"].state == "cancelled"
    assert not [t for t in tmrs.values() if t.state == "claimed"]
    unpaid = tmrs["cancel_unpaid"]
    if order.status == "pending_shipment":
        assert (item.status, item.reserved_order_id) == ("sold", order_id)
        assert order.paid_at is not None and order.cancelled_at is None
        assert tmrs["cancel_unshipped"].state == "scheduled"
        assert tmrs["cancel_unshipped"].due_at == order.ship_deadline
        # cancelled before a worker claimed it, or claimed and then skipped
        assert unpaid.state == "cancelled" or (
            unpaid.state == "done"
            and unpaid.outcome == "skipped: order is pending_shipment (paid before this timer)"
        ), unpaid
        assert back == [] and odd == []
        assert seen == Counter(place=1, pay=1)
        return "pay"
    assert order.status == "cancelled_unpaid", order.status
    assert order.paid_at is None
    assert (item.status, item.reserved_order_id) == ("on_sale", None)
    assert "cancel_unshipped" not in tmrs
    assert [(d.kind, d.payment_id) for d in odd] == [("paid_after_cancel", paid[0].id)]
    assert [(r.state, r.payment_id, r.amount) for r in back] == [
        ("pending_review", paid[0].id, paid[0].amount)
    ]
    if order.cancel_reason == "pay_timeout":
        assert (unpaid.state, unpaid.outcome, unpaid.attempts) == ("done", "cancelled", 1)
    else:
        assert order.cancel_reason == "buyer_cancel", order.cancel_reason
        assert unpaid.state == "cancelled" or (
            unpaid.state == "done"
            and unpaid.outcome == "skipped: order is cancelled_unpaid (cancelled before this timer)"
        ), unpaid
    assert seen == Counter(
        {"place": 1, order.cancel_reason: 1, "released": 1, "discrepancy": 1, "refund_created": 1}
    )
    return str(order.cancel_reason)


async def test_payment_then_deadline_payment_wins(world):
    order_id, goods_id = await place(world)
    cancel = await timer_id(world.deps, order_id, TimerKind.CANCEL_UNPAID)
    world.clock.set(PAY_DEADLINE)
    _, outcome = await payments.record_manual_payment(world.deps, order_id=order_id, amount="12.50")
    assert outcome is PaymentOutcome.CONFIRMED
    assert await world.worker.deliver([cancel]) == 0
    assert await world.worker.drain() == 0  # the reminder was cancelled with the payment
    assert await settled(world.deps, order_id, goods_id) == "pay"
    await assert_invariants(world.deps)


async def test_deadline_then_payment_is_refunded(world):
    order_id, goods_id = await place(world)
    cancel = await timer_id(world.deps, order_id, TimerKind.CANCEL_UNPAID)
    world.clock.set(PAY_DEADLINE)
    assert await world.worker.deliver([cancel]) == 1
    _, outcome = await payments.record_manual_payment(world.deps, order_id=order_id, amount="12.50")
    assert outcome is PaymentOutcome.REFUND
    assert await settled(world.deps, order_id, goods_id) == "pay_timeout"
    await assert_invariants(world.deps)


async def test_payment_and_deadline_at_once_exactly_one_wins(world, settings):
    rounds = 10
    placed = [await place(world) for _ in range(rounds)]
    cancels = [await timer_id(world.deps, o, TimerKind.CANCEL_UNPAID) for o, _ in placed]

    async def pay(deps: Deps, round_no: int) -> PaymentOutcome:
        _, outcome = await payments.record_manual_payment(
            deps, order_id=placed[round_no][0], amount="12.50"
        )
        return outcome

    async def timeout(deps: Deps, round_no: int) -> int:
        return await Worker(deps).deliver([cancels[round_no]])

    outcomes = await asyncio.to_thread(
        contend, settings, PAY_DEADLINE, [pay, timeout], rounds=rounds, stagger=STAGGER
    )
    winners: Counter[tuple[str, int]] = Counter()
    for (order_id, goods_id), (paid, fired) in zip(placed, outcomes, strict=True):
        assert paid.error is None and fired.error is None, (paid, fired)
        won = await settled(world.deps, order_id, goods_id)
        winners[won, fired.value] += 1
        assert won in ("pay", "pay_timeout")
        if won == "pay":
            assert paid.value is PaymentOutcome.CONFIRMED
            assert fired.value in (0, 1)
        else:
            assert paid.value is PaymentOutcome.REFUND
            assert fired.value == 1
    assert sum(winners.values()) == rounds
    await assert_invariants(world.deps)


# --- (c) one timer delivered ten times at once --------------------------------------------------


async def test_same_timer_delivered_ten_times_at_once_cancels_once(world, settings):
    placed = [await place(world) for _ in range(3)]
    cancels = [await timer_id(world.deps, o, TimerKind.CANCEL_UNPAID) for o, _ in placed]

    async def deliver(deps: Deps, round_no: int) -> int:
        return await Worker(deps).deliver([cancels[round_no]])

    now = PAY_DEADLINE + timedelta(seconds=1)
    outcomes = await asyncio.to_thread(contend, settings, now, [deliver] * 10, rounds=3)
    for (order_id, goods_id), round_outcomes in zip(placed, outcomes, strict=True):
        assert [o.error for o in round_outcomes] == [None] * 10
        assert sorted(o.value for o in round_outcomes) == [0] * 9 + [1]
        order = await order_row(world.deps, order_id)
        assert (order.status, order.cancel_reason) == ("cancelled_unpaid", "pay_timeout")
        item = await goods_row(world.deps, goods_id)
        assert (item.status, item.reserved_order_id) == ("on_sale", None)
        tmrs = await timers_by_kind(world.deps, order_id)
        unpaid = tmrs["cancel_unpaid"]
        assert (unpaid.state, unpaid.outcome, unpaid.attempts) == ("done", "cancelled", 1)
        assert unpaid.done_at == now
        assert tmrs["pay_reminder"].state == "cancelled"
        assert await events(world.deps, order_id) == Counter(place=1, pay_timeout=1, released=1)
    await assert_invariants(world.deps)


async def test_overlapping_deliveries_scans_and_drains_act_once_per_timer(world, settings):
    placed = [await place(world) for _ in range(30)]
    ids = [
        t.id
        for t in await rows(
            world.deps, select(timers).where(timers.c.order_id.in_([o for o, _ in placed]))
        )
    ]
    assert len(ids) == 60
    now = PAY_DEADLINE + timedelta(minutes=1)  # past the scanner's grace period too

    def deliverer(seed: int) -> RoundBody:
        async def body(deps: Deps, _round: int) -> int:
            mine = random.Random(seed).sample(ids, k=40) * 2  # each id twice in the batch
            return await Worker(deps).deliver(mine)

        return body

    async def scan(deps: Deps, _round: int) -> int:
        return (await scan_once(Worker(deps))).claimed

    async def drain(deps: Deps, _round: int) -> int:
        return await Worker(deps).drain()

    bodies = [deliverer(seed) for seed in range(6)] + [scan, drain]
    (outcomes,) = await asyncio.to_thread(contend, settings, now, bodies)
    assert [o.error for o in outcomes] == [None] * len(bodies)
    order_ids = sorted(o for o, _ in placed)
    mine = select(timers).where(timers.c.order_id.in_(order_ids))
    found = await rows(world.deps, mine)  # the 60, and the notice each cancel wrote
    done = [t for t in found if t.state == "done"]
    assert sum(o.value for o in outcomes) == len(done), "every timer claimed at most once"
    assert sorted(t.order_id for t in found if t.kind == "order_closed") == order_ids
    for t in found:
        if t.kind == "cancel_unpaid":
            assert (t.state, t.outcome, t.attempts) == ("done", "cancelled", 1), t
        elif t.kind == "order_closed":  # due at once: sent by the drain, or waiting for one
            sent_or_waiting = {("done", "sent", 1), ("scheduled", None, 0)}
            assert (t.state, t.outcome, t.attempts) in sent_or_waiting, t
        elif t.state == "done":  # claimed and run: too late to remind (or cancelled first)
            too_late = {"skipped: pay deadline passed", CANCELLED_FIRST}
            assert t.outcome in too_late and t.attempts == 1, t
        else:  # still scheduled when its order was cancelled
            assert (t.state, t.attempts) == ("cancelled", 0), t
    for order_id, goods_id in placed:
        assert (await order_row(world.deps, order_id)).status == "cancelled_unpaid"
        assert (await goods_row(world.deps, goods_id)).reserved_order_id is None
        assert await events(world.deps, order_id) == Counter(place=1, pay_timeout=1, released=1)
    # One more drain sends the notices no drain saw yet: every buyer told once.
    world.clock.set(now)
    await world.worker.drain()
    notices = await rows(world.deps, mine.where(timers.c.kind == "order_closed"))
    assert {(t.state, t.outcome, t.attempts) for t in notices} == {("done", "sent", 1)}
    told = select(reminders.c.order_id).where(
        reminders.c.kind == "order_closed", reminders.c.state == "sent"
    )
    assert sorted(r.order_id for r in await rows(world.deps, told)) == order_ids
    await assert_invariants(world.deps)


# --- (d) buyer cancel, payment and pay timeout at once ------------------------------------------


async def test_buyer_cancel_payment_and_timeout_at_once_exactly_one_wins(world, settings):
    rounds = 6
    placed = [await place(world) for _ in range(rounds)]
    cancels = [await timer_id(world.deps, o, TimerKind.CANCEL_UNPAID) for o, _ in placed]

    async def pay(deps: Deps, round_no: int) -> PaymentOutcome:
        _, outcome = await payments.record_manual_payment(
            deps, order_id=placed[round_no][0], amount="12.50"
        )
        return outcome

    async def buyer_cancel(deps: Deps, round_no: int) -> str:
        await orders.cancel_by_buyer(deps, order_id=placed[round_no][0], user_id=world.buyer)
        return "cancelled"

    async def timeout(deps: Deps, round_no: int) -> int:
        return await Worker(deps).deliver([cancels[round_no]])

    outcomes = await asyncio.to_thread(
        contend,
        settings,
        PAY_DEADLINE,
        [pay, buyer_cancel, timeout],
        rounds=rounds,
        stagger=STAGGER,
    )
    for (order_id, goods_id), (paid, cancel, fired) in zip(placed, outcomes, strict=True):
        assert paid.error is None and fired.error is None, (paid, fired)
        won = await settled(world.deps, order_id, goods_id)
        assert paid.value is (PaymentOutcome.CONFIRMED if won == "pay" else PaymentOutcome.REFUND)
        if won == "buyer_cancel":
            assert cancel.error is None
        else:
            assert isinstance(cancel.error, InvalidTransition), cancel
        if won == "pay_timeout":
            assert fired.value == 1
    await assert_invariants(world.deps)


# --- (e) seller ships, seller cancels and the ship deadline passes, at once ---------------------


async def paid_order(world: Any) -> tuple[int, int]:
    order_id, goods_id = await place(world)
    await payments.record_manual_payment(world.deps, order_id=order_id, amount="12.50")
    return order_id, goods_id


async def test_ship_seller_cancel_and_ship_timeout_at_once_exactly_one_wins(world, settings):
    rounds = 6
    placed = [await paid_order(world) for _ in range(rounds)]
    cancels = [await timer_id(world.deps, o, TimerKind.CANCEL_UNSHIPPED) for o, _ in placed]
    ship_deadline = START + timedelta(days=3)

    async def ship(deps: Deps, round_no: int) -> str:
        await orders.ship(
            deps, order_id=placed[round_no][0], user_id=world.seller, carrier="SF", tracking_no="1"
        )
        return "ship"

    async def seller_cancel(deps: Deps, round_no: int) -> str:
        await orders.cancel_by_seller(deps, order_id=placed[round_no][0], user_id=world.seller)
        return "seller_cancel"

    async def timeout(deps: Deps, round_no: int) -> int:
        return await Worker(deps).deliver([cancels[round_no]])

    outcomes = await asyncio.to_thread(
        contend,
        settings,
        ship_deadline,
        [ship, seller_cancel, timeout],
        rounds=rounds,
        stagger=STAGGER,
    )
    for (order_id, goods_id), (shipped, cancelled, fired) in zip(placed, outcomes, strict=True):
        assert fired.error is None, fired
        order = await order_row(world.deps, order_id)
        item = await goods_row(world.deps, goods_id)
        tmrs = await timers_by_kind(world.deps, order_id)
        back = await rows(world.deps, select(refunds).where(refunds.c.order_id == order_id))
        seen = await events(world.deps, order_id)
        unshipped = tmrs["cancel_unshipped"]
        live = sorted(k for k, t in tmrs.items() if t.state in ("claimed", "scheduled"))
        if order.status == "shipped":
            assert live == ["confirm_receipt"]
            assert shipped.error is None
            assert isinstance(cancelled.error, InvalidTransition), cancelled
            assert (item.status, item.reserved_order_id) == ("sold", order_id)
            assert tmrs["confirm_receipt"].state == "scheduled"
            assert tmrs["confirm_receipt"].due_at == order.receive_deadline
            assert unshipped.state == "cancelled" or (
                unshipped.state == "done"
                and unshipped.outcome == "skipped: order is shipped (shipped before this timer)"
            ), unshipped
            assert back == []
            assert seen == Counter(place=1, pay=1, ship=1)
            continue
        assert order.status == "cancelled_unshipped", order.status
        assert live == ["order_closed"]  # the buyer's notice, written by the one cancel
        assert isinstance(shipped.error, InvalidTransition), shipped
        assert (item.status, item.reserved_order_id) == ("off_sale", None)
        assert "confirm_receipt" not in tmrs
        assert [(r.state, r.reason) for r in back] == [("pending_review", order.cancel_reason)]
        if order.cancel_reason == "ship_timeout":
            assert isinstance(cancelled.error, InvalidTransition), cancelled
            assert (unshipped.state, unshipped.attempts) == ("done", 1)
            assert unshipped.outcome == "cancelled, refund pending review"
        else:
            assert order.cancel_reason == "seller_cancel"
            assert cancelled.error is None
            assert unshipped.state == "cancelled" or (
                unshipped.state == "done"
                and unshipped.outcome
                == "skipped: order is cancelled_unshipped (cancelled before this timer)"
            ), unshipped
        assert seen == Counter(
            {"place": 1, "pay": 1, order.cancel_reason: 1, "released": 1, "refund_created": 1}
        )
    await assert_invariants(world.deps)


# --- (f) receipt and reviews against their deadlines --------------------------------------------


async def shipped_order(world: Any) -> int:
    order_id, _ = await paid_order(world)
    await orders.ship(
        world.deps, order_id=order_id, user_id=world.seller, carrier="SF", tracking_no="1"
    )
    return order_id


async def test_confirm_receipt_against_receive_timeout_receives_once(world, settings):
    rounds = 6
    placed = [await shipped_order(world) for _ in range(rounds)]
    fires = [await timer_id(world.deps, o, TimerKind.CONFIRM_RECEIPT) for o in placed]
    receive_deadline = START + timedelta(days=10)

    async def confirm(deps: Deps, round_no: int) -> None:
        await orders.confirm_receipt(deps, order_id=placed[round_no], user_id=world.buyer)

    async def timeout(deps: Deps, round_no: int) -> int:
        return await Worker(deps).deliver([fires[round_no]])

    outcomes = await asyncio.to_thread(
        contend,
        settings,
        receive_deadline,
        [confirm, confirm, timeout],
        rounds=rounds,
        stagger=STAGGER,
    )
    for order_id, (first, second, fired) in zip(placed, outcomes, strict=True):
        assert fired.error is None, fired
        order = await order_row(world.deps, order_id)
        assert order.status == "received"
        assert order.review_deadline == order.received_at + timedelta(days=15)
        seen = await events(world.deps, order_id)
        assert seen["confirm_receipt"] + seen["receive_timeout"] == 1, seen
        succeeded = [o for o in (first, second) if o.error is None]
        assert len(succeeded) == seen["confirm_receipt"]
        assert all(
            isinstance(o.error, InvalidTransition) for o in (first, second) if o.error is not None
        )
        tmrs = await timers_by_kind(world.deps, order_id)
        assert tmrs["auto_review"].state == "scheduled"
        assert tmrs["auto_review"].due_at == order.review_deadline
        assert tmrs["confirm_receipt"].state in ("cancelled", "done")
    await assert_invariants(world.deps)


async def test_both_reviews_and_review_timeout_at_once_complete_once(world, settings):
    rounds = 6
    placed = [await shipped_order(world) for _ in range(rounds)]
    for order_id in placed:
        await orders.confirm_receipt(world.deps, order_id=order_id, user_id=world.buyer)
    fires = [await timer_id(world.deps, o, TimerKind.AUTO_REVIEW) for o in placed]
    review_deadline = START + timedelta(days=15)

    def reviewer(user_id: int) -> RoundBody:
        async def body(deps: Deps, round_no: int) -> str:
            return await orders.review(
                deps, order_id=placed[round_no], user_id=user_id, rating=4, comment="fine"
            )

        return body

    async def timeout(deps: Deps, round_no: int) -> int:
        return await Worker(deps).deliver([fires[round_no]])

    outcomes = await asyncio.to_thread(
        contend,
        settings,
        review_deadline,
        [reviewer(world.buyer), reviewer(world.seller), timeout],
        rounds=rounds,
        stagger=STAGGER,
    )
    for order_id, (by_buyer, by_seller, fired) in zip(placed, outcomes, strict=True):
        assert fired.error is None, fired
        order = await order_row(world.deps, order_id)
        assert order.status == "completed"
        seen = await events(world.deps, order_id)
        assert seen["reviews_complete"] + seen["review_timeout"] == 1, seen
        written = await rows(world.deps, select(reviews).where(reviews.c.order_id == order_id))
        assert sorted(r.role for r in written) == ["buyer", "seller"]
        by_role = {r.role: r for r in written}
        for role, outcome in (("buyer", by_buyer), ("seller", by_seller)):
            if outcome.error is None:
                assert outcome.value == role
                assert (by_role[role].is_default, by_role[role].rating) == (False, 4)
            else:
                assert isinstance(outcome.error, InvalidTransition), outcome
                assert (by_role[role].is_default, by_role[role].rating) == (True, 5)
        assert seen["review"] == sum(o.error is None for o in (by_buyer, by_seller))
        if seen["reviews_complete"]:
            assert by_buyer.error is None and by_seller.error is None
        tmrs = await timers_by_kind(world.deps, order_id)
        assert tmrs["auto_review"].state in ("cancelled", "done")
    await assert_invariants(world.deps)
