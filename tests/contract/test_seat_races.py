"""Real races for seats on SQLite, PostgreSQL and MariaDB.

Contenders run as several "processes" (:func:`tests.contract.race_harness.race`): each a thread
with its own event loop and its own Deps (engine, pool, seat cache, locks), released together by
a barrier; inside a process its contenders start together with ``asyncio.gather``, each on a
pool connection of its own. The clock is a FakeClock per process set to one instant, never a
sleep. Every assertion is on the
database: who holds which seat (``seat_holds``), the per-buyer counts (``show_buyers``), the
orders, tickets, refunds and discrepancies.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from datetime import timedelta
from typing import Any

from sqlalchemy import select

from dueflow.domain.timers import TimerKind
from dueflow.exceptions import Busy, InvalidTransition, SeatLimitExceeded, SeatUnavailable
from dueflow.service import orders, payments
from dueflow.service.deps import Deps
from dueflow.service.payments import PaymentOutcome
from dueflow.store.db import MESSAGES
from dueflow.store.schema import (
    discrepancies,
    order_events,
    refunds,
    seat_holds,
    seats,
    show_buyers,
    timers,
)
from dueflow.store.schema import orders as t_orders
from dueflow.store.schema import payments as t_payments
from dueflow.store.schema import tickets as t_tickets
from dueflow.worker.runner import Worker
from tests.conftest import START
from tests.contract.race_harness import Body, Outcome, buyers, race, rows

PAY_DEADLINE = START + timedelta(minutes=15)  # a ticket order's, on the prod profile


def refused_cleanly(error: BaseException | None, *allowed: type[Exception]) -> bool:
    """A refusal of an allowed kind whose message is dueflow's own (no driver text)."""
    if isinstance(error, Busy):
        return error.message in (MESSAGES[Busy], "a payment was started meanwhile; try again")
    return isinstance(error, allowed) and "Error" not in error.message


# --- reading the database ---------------------------------------------------------------------


async def holds_by_order(deps: Deps, show_id: int) -> dict[int, dict[str, str]]:
    """order id -> {seat label: held | sold} for every hold row of the show."""
    query = (
        select(seat_holds.c.order_id, seats.c.label, seat_holds.c.state)
        .join(seats, seats.c.id == seat_holds.c.seat_id)
        .where(seat_holds.c.show_id == show_id)
    )
    found: dict[int, dict[str, str]] = {}
    for order_id, label, state in await rows(deps, query):
        found.setdefault(order_id, {})[label] = state
    return found


async def counts(deps: Deps, show_id: int) -> dict[int, int]:
    """buyer id -> seats counted for the show (rows at zero left out)."""
    query = select(show_buyers).where(show_buyers.c.show_id == show_id)
    return {r.buyer_id: r.seats for r in await rows(deps, query) if r.seats}


async def live_seats_by_buyer(deps: Deps, show_id: int) -> dict[int, int]:
    query = select(seat_holds.c.buyer_id).where(seat_holds.c.show_id == show_id)
    return dict(Counter(r.buyer_id for r in await rows(deps, query)))


async def orders_of_show(deps: Deps, show_id: int) -> list[Any]:
    query = select(t_orders).where(t_orders.c.show_id == show_id).order_by(t_orders.c.id)
    return await rows(deps, query)


def placing(buyer_id: int, show_id: int, labels: list[str]) -> Body:
    async def body(deps: Deps) -> int:
        from dueflow.service import tickets

        placed = await tickets.place_ticket_order(
            deps, buyer_id=buyer_id, show_id=show_id, labels=labels, view=False
        )
        return int(placed["id"])

    return body


# --- many buyers, the same seats --------------------------------------------------------------


async def test_fifty_buyers_for_the_same_two_seats_exactly_one_order(backend_world, backend_url):
    world = backend_world
    show_id = await world.show("A:1-10")
    people = await buyers(world, 50, "fan")
    bodies = [placing(b, show_id, ["A-1", "A-2"]) for b in people]
    outcomes = await asyncio.to_thread(race, backend_url, START, bodies, processes=5)
    won = [(b, o.value) for b, o in zip(people, outcomes, strict=True) if o.error is None]
    assert len(won) == 1, outcomes
    refused = [o.error for o in outcomes if o.error is not None]
    assert len(refused) == 49
    assert all(isinstance(e, SeatUnavailable) for e in refused), Counter(map(repr, refused))
    assert all("A-1" in e.message or "A-2" in e.message for e in refused)
    ((winner, order_id),) = won
    assert [(o.id, o.buyer_id, o.status) for o in await orders_of_show(world.deps, show_id)] == [
        (order_id, winner, "pending_payment")
    ]
    assert await holds_by_order(world.deps, show_id) == {order_id: {"A-1": "held", "A-2": "held"}}
    assert await counts(world.deps, show_id) == {winner: 2}


# --- overlapping seat sets --------------------------------------------------------------------


async def test_overlapping_seat_sets_are_never_both_held(backend_world, backend_url):
    world = backend_world
    pairs = 20
    show_id = await world.show(f"A:1-{3 * pairs}")
    people = await buyers(world, 2 * pairs, "pair")
    wanted = []
    for k in range(pairs):  # against; against; ...
        base = 3 * k + 1
        wanted += [[f"A-{base}", f"A-{base + 1}"], [f"A-{base + 1}", f"A-{base + 2}"]]
    bodies = [placing(b, show_id, labels) for b, labels in zip(people, wanted, strict=True)]
    outcomes = await asyncio.to_thread(race, backend_url, START, bodies, processes=4)
    held = await holds_by_order(world.deps, show_id)
    placed = {o.buyer_id: o for o in await orders_of_show(world.deps, show_id)}
    for k in range(pairs):
        one, two = outcomes[2 * k], outcomes[2 * k + 1]
        winners = [o for o in (one, two) if o.error is None]
        assert len(winners) <= 1, (k, one, two)
        for outcome in (one, two):
            if outcome.error is not None:
                assert refused_cleanly(outcome.error, SeatUnavailable), outcome.error
        if not winners:  # both refused: only a clean Busy may have refused the one that lost
            assert any(isinstance(o.error, Busy) for o in (one, two)), (k, one, two)
    for buyer, labels, outcome in zip(people, wanted, outcomes, strict=True):
        if outcome.error is None:
            assert placed[buyer].id == outcome.value
            assert held[outcome.value] == dict.fromkeys(labels, "held")
        else:  # refused: nothing of it was written
            assert buyer not in placed
    assert sum(len(h) for h in held.values()) == 2 * sum(o.error is None for o in outcomes)
    assert await counts(world.deps, show_id) == await live_seats_by_buyer(world.deps, show_id)


# --- one buyer against the limit --------------------------------------------------------------


async def test_five_parallel_orders_of_one_buyer_against_a_limit_of_four(
    backend_world, backend_url
):
    world = backend_world
    for round_no in range(3):
        show_id = await world.show("A:1-10", limit=4)
        bodies = [placing(world.buyer, show_id, [f"A-{n}"]) for n in range(1, 6)]
        outcomes = await asyncio.to_thread(race, backend_url, START, bodies, processes=5)
        placed = [o.value for o in outcomes if o.error is None]
        assert 1 <= len(placed) <= 4, (round_no, outcomes)
        refused = [o.error for o in outcomes if o.error is not None]
        assert all(refused_cleanly(e, SeatLimitExceeded) for e in refused), refused
        if len(placed) < 4:  # fewer than four only when the database said busy
            assert any(isinstance(e, Busy) for e in refused), refused
        held = await holds_by_order(world.deps, show_id)
        assert sorted(held) == sorted(placed)
        assert await counts(world.deps, show_id) == {world.buyer: len(placed)}
        assert await live_seats_by_buyer(world.deps, show_id) == {world.buyer: len(placed)}
        # A cancel gives one back: the buyer may hold one more seat, and no more.
        await orders.cancel_by_buyer(world.deps, order_id=placed[0], user_id=world.buyer)
        assert await counts(world.deps, show_id) == {world.buyer: len(placed) - 1}
        free = sorted(set(f"A-{n}" for n in range(6, 11)))
        for label in free[: 4 - len(placed) + 1]:
            await world.seats(show_id, [label])
        assert await counts(world.deps, show_id) == {world.buyer: 4}
        assert await live_seats_by_buyer(world.deps, show_id) == {world.buyer: 4}


# --- payment, pay timeout and buyer cancel on one multi-seat order ----------------------------

LABELS = ["A-1", "A-2", "B-1"]
AMOUNT = "940.00"  # 380 + 380 + 180


async def multi_seat_order(world: Any) -> tuple[int, int]:
    show_id = await world.show()
    return show_id, (await world.seats(show_id, LABELS))["id"]


def contenders(world: Any, order_id: int, timer_id: int) -> dict[str, Body]:
    """The three ways one order can end, each as its own process would call it."""

    async def pay(deps: Deps) -> PaymentOutcome:
        _, outcome = await payments.record_manual_payment(deps, order_id=order_id, amount=AMOUNT)
        return outcome

    async def buyer_cancel(deps: Deps) -> str:
        await orders.cancel_by_buyer(deps, order_id=order_id, user_id=world.buyer)
        return "cancelled"

    async def timeout(deps: Deps) -> int:
        return await Worker(deps).deliver([timer_id])

    return {"pay": pay, "buyer_cancel": buyer_cancel, "pay_timeout": timeout}


async def cancel_timer(deps: Deps, order_id: int) -> Any:
    query = select(timers).where(
        timers.c.order_id == order_id, timers.c.kind == TimerKind.CANCEL_UNPAID
    )
    (row,) = await rows(deps, query)
    return row


async def settled(deps: Deps, show_id: int, order_id: int, buyer: int) -> str:
    """Exactly one of payment, timeout and buyer cancel won, the seats agree with it, and a
    payment that lost is a discrepancy with a refund in review; returns the winner."""
    (order,) = await rows(deps, select(t_orders).where(t_orders.c.id == order_id))
    held = await holds_by_order(deps, show_id)
    issued = await rows(deps, select(t_tickets).where(t_tickets.c.order_id == order_id))
    paid = await rows(deps, select(t_payments).where(t_payments.c.order_id == order_id))
    back = await rows(deps, select(refunds).where(refunds.c.order_id == order_id))
    odd = await rows(deps, select(discrepancies).where(discrepancies.c.order_id == order_id))
    seen = Counter(
        r.event
        for r in await rows(deps, select(order_events).where(order_events.c.order_id == order_id))
    )
    unpaid = await cancel_timer(deps, order_id)
    assert [p.state for p in paid] == ["paid"], "the payment is recorded whoever won"
    assert unpaid.state in ("cancelled", "done"), unpaid
    if order.status == "paid":
        assert held == {order_id: dict.fromkeys(LABELS, "sold")}
        assert sorted(t.state for t in issued) == ["valid"] * len(LABELS)
        assert await counts(deps, show_id) == {buyer: len(LABELS)}
        assert back == [] and odd == []
        assert (
            unpaid.state == "cancelled"
            or unpaid.outcome == "skipped: order is paid (paid before this timer)"
        ), unpaid
        assert seen == Counter(place=1, pay=1)
        return "pay"
    assert order.status == "cancelled_unpaid", order.status
    assert held == {} and issued == []
    assert await counts(deps, show_id) == {}
    assert [(d.kind, d.payment_id) for d in odd] == [("paid_after_cancel", paid[0].id)]
    assert [(r.state, r.payment_id, r.amount) for r in back] == [
        ("pending_review", paid[0].id, paid[0].amount)
    ]
    if order.cancel_reason == "pay_timeout":
        assert (unpaid.state, unpaid.outcome, unpaid.attempts) == ("done", "cancelled", 1)
    else:
        assert order.cancel_reason == "buyer_cancel", order.cancel_reason
    assert seen == Counter(
        {"place": 1, order.cancel_reason: 1, "released": 1, "discrepancy": 1, "refund_created": 1}
    )
    return str(order.cancel_reason)


def check_losers(winner: str, results: dict[str, Outcome]) -> None:
    """What each contender saw, given the winner."""
    pay, cancel, fired = results["pay"], results["buyer_cancel"], results["pay_timeout"]
    assert pay.error is None and fired.error is None, (pay, fired)
    assert pay.value is (PaymentOutcome.CONFIRMED if winner == "pay" else PaymentOutcome.REFUND)
    if winner == "buyer_cancel":
        assert cancel.error is None
    else:
        assert refused_cleanly(cancel.error, InvalidTransition), cancel
    assert fired.value == 1 if winner == "pay_timeout" else fired.value in (0, 1)


async def test_every_order_of_arrival_has_one_winner(backend_world):
    world = backend_world
    for arrival in itertools.permutations(("pay", "buyer_cancel", "pay_timeout")):
        show_id, order_id = await multi_seat_order(world)
        world.clock.advance(PAY_DEADLINE - START)  # all three may act: due, and still unpaid
        timer = await cancel_timer(world.deps, order_id)
        bodies = contenders(world, order_id, timer.id)
        results: dict[str, Outcome] = {}
        for name in arrival:
            try:
                results[name] = Outcome(value=await bodies[name](world.deps))
            except Exception as exc:
                results[name] = Outcome(error=exc)
        winner = await settled(world.deps, show_id, order_id, world.buyer)
        assert winner == arrival[0], (arrival, results)
        check_losers(winner, results)


async def test_payment_timeout_and_buyer_cancel_at_once_one_winner(backend_world, backend_url):
    world = backend_world
    names = ("pay", "buyer_cancel", "pay_timeout")
    winners: Counter[str] = Counter()
    for round_no in range(6):  # three truly at once, then each with a head start in turn
        show_id, order_id = await multi_seat_order(world)
        timer = await cancel_timer(world.deps, order_id)
        bodies = contenders(world, order_id, timer.id)
        first = None if round_no < 3 else round_no - 3
        outcomes = await asyncio.to_thread(
            race,
            backend_url,
            PAY_DEADLINE,
            [bodies[n] for n in names],
            processes=3,
            first=first,
        )
        winner = await settled(world.deps, show_id, order_id, world.buyer)
        check_losers(winner, dict(zip(names, outcomes, strict=True)))
        winners[winner] += 1
    assert sum(winners.values()) == 6
