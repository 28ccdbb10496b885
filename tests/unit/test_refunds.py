"""Refunds above the provider port: approval, the refund_check timer, retries, one refund number.

The providers here are fakes of the port (this is a unit test of the layer above it); the real
Alipay and WeChat Pay clients are tested against the simulator.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy import select

from dueflow.exceptions import InvalidInput, InvalidTransition, NotFound
from dueflow.payments.base import (
    PaymentProvider,
    Providers,
    RefundOutcome,
    RefundRequest,
    RefundResult,
)
from dueflow.payments.manual import ManualProvider
from dueflow.service import orders, payments, refunds
from dueflow.store import schema


class ScriptedProvider(PaymentProvider):
    """Answers refund calls from a script, and remembers every request."""

    name = "scripted"

    def __init__(self, answers: list[RefundResult]) -> None:
        self.answers = answers
        self.requests: list[RefundRequest] = []

    async def close_or_query(self, attempt, now):  # pragma: no cover - not used here
        raise AssertionError("not used")

    async def refund(self, request: RefundRequest) -> RefundOutcome:
        self.requests.append(request)
        result = self.answers.pop(0)
        if result is RefundResult.UNKNOWN:
            raise TimeoutError("provider timed out")
        return RefundOutcome(result, f"scripted {result.value}")


async def unshipped_refund(world, provider: str = "manual") -> tuple[int, int]:
    """An order paid through ``provider`` and cancelled by its seller: (order id, refund id)."""
    goods_id = await world.goods()
    order_id = await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)
    pay_no, _ = await payments.record_manual_payment(world.deps, order_id=order_id, amount="12.50")
    if provider != "manual":
        async with world.deps.db.write() as conn:
            await conn.execute(
                schema.payments.update()
                .where(schema.payments.c.pay_no == pay_no)
                .values(provider=provider)
            )
    await orders.cancel_by_seller(world.deps, order_id=order_id, user_id=world.seller)
    [refund] = await refunds.list_refunds(world.deps, state="pending_review")
    return order_id, refund["id"]


def use(world, provider: PaymentProvider) -> None:
    world.deps.providers = Providers([ManualProvider(), provider])


async def refund_row(world, refund_id: int):
    async with world.deps.db.read() as conn:
        query = select(schema.refunds).where(schema.refunds.c.id == refund_id)
        return (await conn.execute(query)).one()


async def check_timer(world, order_id: int):
    async with world.deps.db.read() as conn:
        query = select(schema.timers).where(
            schema.timers.c.order_id == order_id, schema.timers.c.kind == "refund_check"
        )
        return (await conn.execute(query)).one_or_none()


async def test_a_manual_refund_is_paid_back_off_line_on_approval(world):
    order_id, refund_id = await unshipped_refund(world)
    assert await refunds.approve(world.deps, refund_id) == "succeeded"
    assert (await refund_row(world, refund_id)).state == "succeeded"
    assert (await check_timer(world, order_id)).state == "cancelled"  # nothing left to follow
    with pytest.raises(InvalidTransition, match="succeeded, not pending_review"):
        await refunds.approve(world.deps, refund_id)
    view = await orders.order_view(world.deps, order_id)
    assert [e["event"] for e in view["timeline"]][-2:] == ["refund_submitted", "refund_succeeded"]


async def test_a_processing_refund_is_followed_until_it_succeeds(world):
    # approve; check 1 asks; check 2 asks (a refund the provider knows is not resubmitted).
    provider = ScriptedProvider([RefundResult.PROCESSING] * 2 + [RefundResult.SUCCEEDED])
    use(world, provider)
    order_id, refund_id = await unshipped_refund(world, "scripted")
    assert await refunds.approve(world.deps, refund_id) == "processing"
    timer = await check_timer(world, order_id)
    assert timer.state == "scheduled"
    assert timer.due_at == world.clock.now() + refunds.FIRST_CHECK
    world.clock.advance(refunds.FIRST_CHECK)
    await world.worker.drain()
    timer = await check_timer(world, order_id)
    assert (timer.state, timer.attempts) == ("scheduled", 1)  # still processing: backoff
    assert "still processing" in timer.last_error
    world.clock.advance(timedelta(seconds=30))
    await world.worker.drain()
    assert (await refund_row(world, refund_id)).state == "succeeded"
    assert (await check_timer(world, order_id)).state == "done"
    assert {r.refund_no for r in provider.requests} == {
        (await refund_row(world, refund_id)).refund_no
    }


async def test_a_failed_refund_is_retried_with_the_same_number(world):
    provider = ScriptedProvider([RefundResult.FAILED, RefundResult.SUCCEEDED])
    use(world, provider)
    _, refund_id = await unshipped_refund(world, "scripted")
    assert await refunds.approve(world.deps, refund_id) == "failed"
    assert (await refund_row(world, refund_id)).last_error == "scripted failed"
    with pytest.raises(InvalidTransition):
        await refunds.approve(world.deps, refund_id)
    assert await refunds.retry(world.deps, refund_id) == "succeeded"
    first, second = provider.requests
    assert first == second  # same refund number, same amount


async def test_an_unknown_answer_never_counts_as_final(world):
    provider = ScriptedProvider([RefundResult.UNKNOWN] * 3)
    use(world, provider)
    order_id, refund_id = await unshipped_refund(world, "scripted")
    assert await refunds.approve(world.deps, refund_id) == "processing"
    world.clock.advance(refunds.FIRST_CHECK)
    await world.worker.drain()
    assert (await refund_row(world, refund_id)).state == "processing"
    assert "TimeoutError" in (await check_timer(world, order_id)).last_error


async def test_bad_requests_change_nothing(world):
    _, refund_id = await unshipped_refund(world)
    with pytest.raises(NotFound):
        await refunds.approve(world.deps, 999)
    with pytest.raises(InvalidTransition, match="not failed"):
        await refunds.retry(world.deps, refund_id)
    with pytest.raises(InvalidInput, match="unknown refund state"):
        await refunds.list_refunds(world.deps, state="lost")
    assert (await refund_row(world, refund_id)).state == "pending_review"


async def test_a_refund_is_followed_even_when_its_order_moves_on(world):
    """A second payment refunded while the order goes on: shipping must not cancel its check."""
    provider = ScriptedProvider([RefundResult.PROCESSING, RefundResult.SUCCEEDED])
    use(world, provider)
    goods_id = await world.goods()
    order_id = await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)
    await payments.record_manual_payment(world.deps, order_id=order_id, amount="12.50")
    second, outcome = await payments.record_manual_payment(
        world.deps, order_id=order_id, amount="12.50"
    )
    assert outcome is payments.PaymentOutcome.REFUND  # paid twice
    async with world.deps.db.write() as conn:
        await conn.execute(
            schema.payments.update()
            .where(schema.payments.c.pay_no == second)
            .values(provider="scripted")
        )
    [refund] = await refunds.list_refunds(world.deps, state="pending_review")
    assert refund["reason"] == "paid_twice"
    async with world.deps.db.write() as conn:
        await conn.execute(
            schema.refunds.update()
            .where(schema.refunds.c.id == refund["id"])
            .values(provider="scripted")
        )
    assert await refunds.approve(world.deps, refund["id"]) == "processing"
    await orders.ship(
        world.deps, order_id=order_id, user_id=world.seller, carrier="SF", tracking_no="1"
    )
    assert (await check_timer(world, order_id)).state == "scheduled"
    world.clock.advance(refunds.FIRST_CHECK)
    await world.worker.drain()
    assert (await refund_row(world, refund["id"])).state == "succeeded"


async def test_a_refund_is_watched_from_the_moment_it_is_processing(world):
    """The provider call blows up (a crash, say): a refund_check timer is already there."""

    class Exploding(ScriptedProvider):
        async def refund(self, request):
            raise asyncio.CancelledError  # the process stops mid-call

    use(world, Exploding([]))
    order_id, refund_id = await unshipped_refund(world, "scripted")
    with pytest.raises(asyncio.CancelledError):
        await refunds.approve(world.deps, refund_id)
    assert (await refund_row(world, refund_id)).state == "processing"
    assert (await check_timer(world, order_id)).state == "scheduled"


async def test_the_refund_list_is_bounded_newest_first(world):
    for _ in range(3):
        order_id = await orders.place_order(
            world.deps, buyer_id=world.buyer, goods_id=await world.goods()
        )
        await payments.record_manual_payment(world.deps, order_id=order_id, amount="12.50")
        await orders.cancel_by_seller(world.deps, order_id=order_id, user_id=world.seller)
    every = [r["id"] for r in await refunds.list_refunds(world.deps, state="pending_review")]
    assert len(every) == 3 and every == sorted(every, reverse=True)
    assert [r["id"] for r in await refunds.list_refunds(world.deps, limit=2)] == every[:2]


async def test_two_final_answers_at_once_write_one_event(world):
    """Found in review: a provider's notification and a refund check answering at the same
    moment both recorded refund_succeeded (two events a host cannot drop); the second answer
    now finds the refund moved and writes nothing."""
    use(world, ScriptedProvider([RefundResult.PROCESSING]))
    order_id, refund_id = await unshipped_refund(world, provider="scripted")
    assert await refunds.approve(world.deps, refund_id) == "processing"
    [row] = [r for r in await refunds.list_refunds(world.deps) if r["id"] == refund_id]
    answer = RefundOutcome(RefundResult.SUCCEEDED, "SUCCESS")
    states = await asyncio.gather(
        refunds.record_answer(world.deps, row["refund_no"], answer),
        refunds.record_answer(world.deps, row["refund_no"], answer),
    )
    assert states == ["succeeded", "succeeded"]
    async with world.deps.db.read() as conn:
        events = (
            await conn.execute(
                select(schema.order_events.c.event).where(
                    schema.order_events.c.order_id == order_id,
                    schema.order_events.c.event == "refund_succeeded",
                )
            )
        ).all()
    assert len(events) == 1
