"""The tickets life with the FakeClock: holding seats, paying, the pay deadline, the buyer's
cancel and the organizer's cancel of the show."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, insert, select, update

from dueflow import render
from dueflow.exceptions import (
    InvalidInput,
    InvalidTransition,
    NotAllowed,
    SalesClosed,
    SeatLimitExceeded,
    SeatUnavailable,
)
from dueflow.service import orders, payments, report, tickets
from dueflow.store.schema import seat_holds, seats, show_buyers
from tests.conftest import table_snapshot
from tests.unit.api import running_api


async def _states(world, show_id):
    return {s["label"]: s["state"] for s in await tickets.seat_map(world.deps, show_id)}


async def _counted(world, show_id, buyer):
    async with world.deps.db.read() as conn:
        return await conn.scalar(
            select(show_buyers.c.seats).where(
                show_buyers.c.show_id == show_id, show_buyers.c.buyer_id == buyer
            )
        )


async def test_seats_held_paid_and_ticketed(world):
    show_id = await world.show()
    view = await world.seats(show_id, ["A-1", "B-2"])
    assert view["flow"] == "tickets" and view["order_type"] == "ticket"
    assert str(view["amount"]) == "560.00"
    assert view["pay_deadline"] == world.clock.now() + timedelta(minutes=15)
    assert [line["label"] for line in view["lines"]] == ["A-1", "B-2"]
    states = await _states(world, show_id)
    assert states["A-1"] == states["B-2"] == "held" and states["A-2"] == "free"
    await payments.record_manual_payment(world.deps, order_id=view["id"], amount="560.00")
    paid = await orders.order_view(world.deps, view["id"])
    assert paid["status"] == "paid" and paid["ship_deadline"] is None
    assert [t["seat"] for t in paid["tickets"]] == ["A-1", "B-2"]
    assert len({t["code"] for t in paid["tickets"]}) == 2
    assert all(len(t["code"]) >= 22 and t["state"] == "valid" for t in paid["tickets"])
    assert (await _states(world, show_id))["A-1"] == "sold"
    # No timer is left for a paid ticket order: nothing ships, nobody reviews.
    assert all(t["state"] != "scheduled" for t in paid["timers"])


async def test_pay_deadline_releases_every_seat(world):
    show_id = await world.show()
    view = await world.seats(show_id, ["A-1", "A-2", "A-3"])
    world.clock.advance(timedelta(minutes=15))
    assert await world.worker.drain() >= 1
    cancelled = await orders.order_view(world.deps, view["id"])
    assert cancelled["status"] == "cancelled_unpaid"
    assert set((await _states(world, show_id)).values()) == {"free"}
    assert await _counted(world, show_id, world.buyer) == 0
    released = [e for e in cancelled["timeline"] if e["event"] == "released"]
    assert released[0]["detail"] == "seats A-1, A-2, A-3 back on sale"


async def test_buyer_cancel_releases_and_gives_the_count_back(world):
    show_id = await world.show()
    view = await world.seats(show_id, ["A-1", "A-2", "A-3", "A-4"])
    with pytest.raises(SeatLimitExceeded):
        await world.seats(show_id, ["B-1"])
    await orders.cancel_by_buyer(world.deps, order_id=view["id"], user_id=world.buyer)
    async with world.deps.db.read() as conn:
        assert await conn.scalar(select(func.count()).select_from(seat_holds)) == 0
    again = await world.seats(show_id, ["A-1", "B-1", "B-2", "B-3"])
    assert again["status"] == "pending_payment"


async def test_refusals_change_nothing(world):
    show_id = await world.show(limit=2)
    await world.seats(show_id, ["A-1"], buyer=world.other)
    before = await table_snapshot(world.deps)
    cases = [
        (["A-1"], SeatUnavailable, "A-1"),
        (["A-2", "A-1"], SeatUnavailable, "A-1"),
        (["Z-99"], InvalidInput, "Z-99"),
        (["A-2", "A-3", "A-4"], SeatLimitExceeded, "2"),
        ([], InvalidInput, "at least one"),
        (["A-2", "A-2"], InvalidInput, "twice"),
        (["nonsense"], InvalidInput, "nonsense"),
    ]
    for labels, error, words in cases:
        with pytest.raises(error) as info:
            await world.seats(show_id, labels)
        assert words in info.value.message, (labels, info.value.message)
    with pytest.raises(NotAllowed):
        await world.seats(show_id, ["A-5"], buyer=world.seller)
    assert await table_snapshot(world.deps) == before


async def test_sales_close_and_start(world):
    show_id = await world.show()
    world.clock.advance(timedelta(days=29))
    with pytest.raises(SalesClosed, match="closed"):
        await world.seats(show_id, ["A-1"])


async def test_organizer_cancels_the_show(world):
    show_id = await world.show()
    unpaid = await world.seats(show_id, ["A-1"])
    paid = await world.seats(show_id, ["A-2", "A-3"], buyer=world.other)
    await payments.record_manual_payment(world.deps, order_id=paid["id"], amount="760.00")
    with pytest.raises(NotAllowed):
        await tickets.cancel_show(world.deps, show_id=show_id, user_id=world.buyer)
    assert await tickets.cancel_show(world.deps, show_id=show_id, user_id=world.seller) == 2
    with pytest.raises(SalesClosed, match="cancelled"):
        await world.seats(show_id, ["B-1"])
    with pytest.raises(InvalidTransition):
        await tickets.cancel_show(world.deps, show_id=show_id, user_id=world.seller)
    assert await world.worker.drain() >= 1
    first = await orders.order_view(world.deps, unpaid["id"])
    second = await orders.order_view(world.deps, paid["id"])
    assert first["status"] == "cancelled_unpaid" and first["cancel_reason"] == "show_cancel"
    assert second["status"] == "cancelled_paid"
    assert [r["state"] for r in second["refunds"]] == ["pending_review"]
    assert {t["state"] for t in second["tickets"]} == {"void"}
    assert set((await _states(world, show_id)).values()) == {"free"}


async def test_invariants_see_the_seat_promises(world):
    show_id = await world.show()
    kept = await world.seats(show_id, ["A-1", "A-2"])
    gone = await world.seats(show_id, ["B-1"], buyer=world.other)
    await orders.cancel_by_buyer(world.deps, order_id=gone["id"], user_id=world.other)
    assert (await report.check_invariants(world.deps)).ok
    # Break them behind the engine's back: a seat held by the cancelled order, a count off.
    async with world.deps.db.write() as conn:
        seat_id = (
            await conn.execute(select(seats.c.id).where(seats.c.label == "B-1"))
        ).scalar_one()
        await conn.execute(
            insert(seat_holds).values(
                show_id=show_id,
                seat_id=seat_id,
                order_id=gone["id"],
                buyer_id=world.other,
                state="held",
                created_at=world.clock.now(),
                updated_at=world.clock.now(),
            )
        )
        await conn.execute(
            update(show_buyers).where(show_buyers.c.buyer_id == world.buyer).values(seats=5)
        )
    found = await report.check_invariants(world.deps)
    assert found.seats_held_by_dead_order == [gone["id"]]
    assert found.seat_limits_broken == [show_id]
    assert found.goods_held_twice == [] and not found.ok
    assert kept["id"] not in found.seats_held_by_dead_order


async def test_no_payment_starts_for_a_cancelled_show(world):
    async with running_api(world.deps) as api:  # its fake provider starts payments
        show_id = await api.show()
        order_id = await api.ticket_order(show_id, ["A-1"])
        answer = await api.call(
            "POST", f"/api/orders/{order_id}/payments", "buyer", json={"provider": "fakepay"}
        )
        assert answer.status_code == 201, answer.text
        assert (await api.call("POST", f"/api/shows/{show_id}/cancel", "seller")).status_code == 200
        answer = await api.call(
            "POST", f"/api/orders/{order_id}/payments", "buyer", json={"provider": "fakepay"}
        )
        assert answer.status_code == 409
        assert answer.json()["error"]["code"] == "sales_closed"


async def test_the_status_table_counts_ticket_orders(world):
    show_id = await world.show()
    view = await world.seats(show_id, ["A-1"])
    await payments.record_manual_payment(world.deps, order_id=view["id"], amount="380.00")
    table = render.snapshot_table(await report.snapshot(world.deps))
    rows = dict(zip(table.columns[0]._cells, table.columns[1]._cells, strict=True))
    assert rows["orders paid"] == "1"
    assert rows["orders pending_shipment"] == "0"
