"""Confirming payments exactly once, late payments, and close-or-query before a timeout cancel."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from sqlalchemy import select

from dueflow.domain.timers import quick_backoff
from dueflow.exceptions import (
    Busy,
    InvalidInput,
    InvalidTransition,
    NotFound,
    PaymentMismatch,
    ProviderUnavailable,
)
from dueflow.locks.base import Locks
from dueflow.payments.base import (
    CloseOutcome,
    CloseResult,
    PaymentProvider,
    Providers,
    VerifiedPayment,
)
from dueflow.payments.manual import ManualProvider
from dueflow.service import orders, payments
from dueflow.service.orders import order_view
from dueflow.service.payments import PaymentOutcome
from dueflow.store import payments as payment_store
from dueflow.store import schema
from tests.conftest import START, table_snapshot


async def snapshot(world) -> dict[str, list[tuple]]:
    return await table_snapshot(world.deps)


async def rows(world, table, **where):
    query = select(table).order_by(table.c.id)
    for column, value in where.items():
        query = query.where(table.c[column] == value)
    async with world.deps.db.read() as conn:
        return list((await conn.execute(query)).all())


async def timer(world, order_id, kind):
    (row,) = await rows(world, schema.timers, order_id=order_id, kind=kind)
    return row


async def place(world, price="12.50"):
    goods_id = await world.goods(price)
    order_id = await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)
    return goods_id, order_id


async def add_attempt(world, order_id, pay_no, provider="manual", amount="12.50"):
    async with world.deps.db.write() as conn:
        await payment_store.insert_attempt(
            conn,
            pay_no=pay_no,
            order_id=order_id,
            provider=provider,
            amount=Decimal(amount),
            expires_at=START + timedelta(minutes=30),
            now=world.clock.now(),
        )
    return pay_no


class Fake(PaymentProvider):
    """A provider port stand-in: answers per pay_no as told, records every call."""

    name = "fake"

    def __init__(self) -> None:
        self.answers: dict[str, str] = {}
        self.calls: list[str] = []

    async def close_or_query(self, attempt, now):
        self.calls.append(attempt.pay_no)
        answer = self.answers.get(attempt.pay_no, "closed")
        if answer == "paid":
            return CloseOutcome.paid(
                VerifiedPayment(
                    pay_no=attempt.pay_no,
                    amount=attempt.amount,
                    provider_trade_no="T" + attempt.pay_no,
                )
            )
        if answer == "paid_other":
            return CloseOutcome.paid(
                VerifiedPayment(
                    pay_no=attempt.pay_no,
                    amount=attempt.amount + 1,
                    provider_trade_no="T" + attempt.pay_no,
                )
            )
        if answer == "unknown":
            return CloseOutcome.unknown("gateway timeout")
        if answer == "raise":
            raise RuntimeError("provider exploded")
        return CloseOutcome.closed("closed by fake")


@pytest.fixture
def fake(world):
    provider = Fake()
    world.deps.providers = Providers([ManualProvider(), provider])
    return provider


# ---------------------------------------------------------------- record_manual_payment


async def test_manual_payment_amount_mismatch_changes_nothing(world):
    _, order_id = await place(world)
    before = await snapshot(world)
    for amount in ("12.49", "12.51", "125.00", "1.25", Decimal("12.49"), 12):
        with pytest.raises(PaymentMismatch):
            await payments.record_manual_payment(world.deps, order_id=order_id, amount=amount)
    assert await snapshot(world) == before
    assert before["payments"] == []


async def test_manual_payment_malformed_amount(world):
    _, order_id = await place(world)
    before = await snapshot(world)
    for amount in ("abc", "", 12.5, "12.505", "-12.50", "0", "1e40", None, True):
        with pytest.raises(InvalidInput):
            await payments.record_manual_payment(world.deps, order_id=order_id, amount=amount)
    assert await snapshot(world) == before


async def test_manual_payment_unknown_order(world):
    await place(world)
    before = await snapshot(world)
    with pytest.raises(NotFound):
        await payments.record_manual_payment(world.deps, order_id=999, amount="12.50")
    assert await snapshot(world) == before


async def test_manual_payment_moves_order_to_pending_shipment(world):
    goods_id, order_id = await place(world, price="10.00")
    paid_at = world.clock.advance(timedelta(minutes=12, seconds=5))
    pay_no, outcome = await payments.record_manual_payment(
        world.deps, order_id=order_id, amount="10.0", reference="bank-ref-1"
    )
    assert outcome is PaymentOutcome.CONFIRMED
    assert len(pay_no) == 24 and pay_no.startswith("20260301")

    view = await order_view(world.deps, order_id)
    assert view["status"] == "pending_shipment"
    assert view["paid_at"] == paid_at
    assert view["ship_deadline"] == paid_at + timedelta(days=3)
    assert view["pay_deadline"] == START + timedelta(minutes=30)

    (item,) = await rows(world, schema.goods, id=goods_id)
    assert item.status == "sold"
    assert item.reserved_order_id == order_id

    (attempt,) = view["payments"]
    assert attempt["pay_no"] == pay_no
    assert attempt["provider"] == "manual"
    assert attempt["state"] == "paid"
    assert attempt["amount"] == Decimal("10.00")
    assert attempt["provider_trade_no"] == "bank-ref-1"
    assert attempt["handled_at"] == paid_at
    assert attempt["expires_at"] == view["pay_deadline"]

    assert (await timer(world, order_id, "cancel_unpaid")).state == "cancelled"
    assert (await timer(world, order_id, "pay_reminder")).state == "cancelled"
    unshipped = await timer(world, order_id, "cancel_unshipped")
    assert unshipped.state == "scheduled"
    assert unshipped.due_at == paid_at + timedelta(days=3)

    last = view["timeline"][-1]
    assert (last["event"], last["from_status"], last["to_status"], last["actor"]) == (
        "pay",
        "pending_payment",
        "pending_shipment",
        "operator",
    )
    assert view["refunds"] == []
    assert await rows(world, schema.discrepancies) == []

    # the pay deadline passing does nothing now
    world.clock.advance(timedelta(minutes=30))
    assert await world.worker.drain() == 0
    assert world.notifier.sent == []
    assert (await order_view(world.deps, order_id))["status"] == "pending_shipment"


async def test_manual_payment_on_paid_order_is_paid_twice(world):
    _, order_id = await place(world)
    first, _ = await payments.record_manual_payment(world.deps, order_id=order_id, amount="12.50")
    second, outcome = await payments.record_manual_payment(
        world.deps, order_id=order_id, amount="12.50"
    )
    assert outcome is PaymentOutcome.REFUND
    assert first != second
    (discrepancy,) = await rows(world, schema.discrepancies)
    assert discrepancy.kind == "paid_twice"
    (refund,) = await rows(world, schema.refunds)
    assert refund.refund_no == "R" + second


# ---------------------------------------------------------------- confirm_payment


async def test_confirm_payment_is_idempotent(world):
    _, order_id = await place(world)
    pay_no = await add_attempt(world, order_id, "20260301aaaaaaaaaaaaaaaa")
    payment = VerifiedPayment(pay_no=pay_no, amount=Decimal("12.50"), provider_trade_no="T1")
    world.clock.advance(timedelta(minutes=1))
    assert await payments.confirm_payment(world.deps, payment, actor="notify") is (
        PaymentOutcome.CONFIRMED
    )
    after_first = await snapshot(world)
    world.clock.advance(timedelta(seconds=5))
    assert await payments.confirm_payment(world.deps, payment, actor="notify") is (
        PaymentOutcome.DUPLICATE
    )
    assert await snapshot(world) == after_first

    view = await order_view(world.deps, order_id)
    assert view["status"] == "pending_shipment"
    assert view["paid_at"] == START + timedelta(minutes=1)
    assert [e["event"] for e in view["timeline"]] == ["place", "pay"]
    assert len([t for t in view["timers"] if t["kind"] == "cancel_unshipped"]) == 1
    assert view["payments"][0]["provider_trade_no"] == "T1"
    assert view["refunds"] == []


async def test_confirm_payment_unknown_pay_no_and_wrong_amount(world):
    _, order_id = await place(world)
    pay_no = await add_attempt(world, order_id, "20260301bbbbbbbbbbbbbbbb")
    before = await snapshot(world)
    with pytest.raises(NotFound):
        await payments.confirm_payment(
            world.deps, VerifiedPayment("nosuchpayno", Decimal("12.50")), actor="notify"
        )
    with pytest.raises(PaymentMismatch):
        await payments.confirm_payment(
            world.deps, VerifiedPayment(pay_no, Decimal("12.51")), actor="notify"
        )
    assert await snapshot(world) == before


async def test_payment_after_timeout_cancel_becomes_refund(world):
    goods_id, order_id = await place(world)
    pay_no = await add_attempt(world, order_id, "20260301cccccccccccccccc")
    world.clock.advance(timedelta(minutes=30))
    assert await world.worker.drain() == 3  # reminder (skipped: too late), cancel, its notice
    view = await order_view(world.deps, order_id)
    assert view["status"] == "cancelled_unpaid"
    assert [(r.kind, r.reason) for r in world.notifier.sent] == [("order_closed", "pay_timeout")]
    assert view["payments"][0]["state"] == "closed"
    (item,) = await rows(world, schema.goods, id=goods_id)
    assert item.reserved_order_id is None

    # someone else orders the released goods before the late payment arrives
    world.clock.advance(timedelta(minutes=1))
    second_order = await orders.place_order(world.deps, buyer_id=world.other, goods_id=goods_id)

    world.clock.advance(timedelta(minutes=1))
    late = VerifiedPayment(pay_no=pay_no, amount=Decimal("12.50"), provider_trade_no="T9")
    assert await payments.confirm_payment(world.deps, late, actor="notify") is (
        PaymentOutcome.REFUND
    )
    view = await order_view(world.deps, order_id)
    assert view["status"] == "cancelled_unpaid"
    assert view["paid_at"] is None
    assert view["payments"][0]["state"] == "paid"
    (discrepancy,) = await rows(world, schema.discrepancies)
    assert discrepancy.kind == "paid_after_cancel"
    assert discrepancy.order_id == order_id
    assert discrepancy.payment_id == view["payments"][0]["id"]
    (refund,) = view["refunds"]
    assert refund["state"] == "pending_review"
    assert refund["refund_no"] == "R" + pay_no
    assert refund["amount"] == Decimal("12.50")
    assert refund["reason"] == "paid_after_cancel"
    discrepancy, created = view["timeline"][-2:]
    assert (discrepancy["event"], created["event"]) == ("discrepancy", "refund_created")
    assert discrepancy["detail"].startswith("paid_after_cancel: manual")
    assert created["detail"] == f"R{pay_no} 12.50 paid_after_cancel"
    # the late payment neither sells the goods nor takes them from the new order
    (item,) = await rows(world, schema.goods, id=goods_id)
    assert item.status == "on_sale" and item.reserved_order_id == second_order
    assert (await order_view(world.deps, second_order))["status"] == "pending_payment"

    # the provider repeats its notification: nothing more happens
    before = await snapshot(world)
    assert await payments.confirm_payment(world.deps, late, actor="notify") is (
        PaymentOutcome.DUPLICATE
    )
    assert await snapshot(world) == before
    assert len(before["discrepancies"]) == 1
    assert len(before["refunds"]) == 1


async def test_second_attempt_paid_on_paid_order(world):
    _, order_id = await place(world)
    first = await add_attempt(world, order_id, "20260301dddddddddddddddd")
    second = await add_attempt(world, order_id, "20260301eeeeeeeeeeeeeeee")
    assert await payments.confirm_payment(
        world.deps, VerifiedPayment(first, Decimal("12.50")), actor="notify"
    ) is (PaymentOutcome.CONFIRMED)
    paid_at = (await order_view(world.deps, order_id))["paid_at"]
    world.clock.advance(timedelta(minutes=1))
    assert await payments.confirm_payment(
        world.deps, VerifiedPayment(second, Decimal("12.50")), actor="notify"
    ) is (PaymentOutcome.REFUND)
    view = await order_view(world.deps, order_id)
    assert view["status"] == "pending_shipment"
    assert view["paid_at"] == paid_at
    second_id = next(p["id"] for p in view["payments"] if p["pay_no"] == second)
    (discrepancy,) = await rows(world, schema.discrepancies)
    assert (discrepancy.kind, discrepancy.payment_id) == ("paid_twice", second_id)
    (refund,) = view["refunds"]
    assert (refund["refund_no"], refund["payment_id"], refund["reason"]) == (
        "R" + second,
        second_id,
        "paid_twice",
    )
    # both repeated: no more rows
    before = await snapshot(world)
    for pay_no in (first, second):
        assert await payments.confirm_payment(
            world.deps, VerifiedPayment(pay_no, Decimal("12.50")), actor="notify"
        ) is (PaymentOutcome.DUPLICATE)
    assert await snapshot(world) == before


class RecordingLocks(Locks):
    """Real locks (not :class:`NoLocks`) that record which keys were taken, and can refuse."""

    def __init__(self, busy: set[str] | None = None) -> None:
        self.taken: list[str] = []
        self.busy = busy or set()

    async def acquire(self, key, ttl):
        if key in self.busy:
            return None
        self.taken.append(key)
        return key

    async def release(self, key, token):
        return True


async def test_confirm_payment_takes_the_order_lock_when_locks_are_real(world, monkeypatch):
    _, order_id = await place(world)
    pay_no = await add_attempt(world, order_id, "20260301abababababababab")
    monkeypatch.setattr(world.deps, "locks", RecordingLocks(busy={"order:0"}))
    with pytest.raises(NotFound):
        await payments.confirm_payment(
            world.deps, VerifiedPayment("nosuchpayno", Decimal("12.50")), actor="notify"
        )
    assert world.deps.locks.taken == []  # unknown: refused before any lock
    payment = VerifiedPayment(pay_no, Decimal("12.50"))
    assert await payments.confirm_payment(world.deps, payment, actor="notify") is (
        PaymentOutcome.CONFIRMED
    )
    assert world.deps.locks.taken == [f"order:{order_id}"]
    before = await snapshot(world)
    monkeypatch.setattr(world.deps, "locks", RecordingLocks(busy={f"order:{order_id}"}))
    with pytest.raises(Busy):
        await payments.confirm_payment(world.deps, payment, actor="notify")
    assert await snapshot(world) == before


async def test_confirm_payment_check_and_also_share_its_transaction(world):
    _, order_id = await place(world)
    pay_no = await add_attempt(world, order_id, "20260301acacacacacacacac")
    payment = VerifiedPayment(pay_no, Decimal("12.50"))
    before = await snapshot(world)
    seen: list[object] = []

    def refuse(attempt):
        seen.append(attempt.pay_no)
        raise InvalidInput("not this one")

    with pytest.raises(InvalidInput):
        await payments.confirm_payment(world.deps, payment, actor="notify", check=refuse)
    assert seen == [pay_no]
    assert await snapshot(world) == before  # refused before any write

    async def fail_after(conn, outcome):
        seen.append(outcome)
        raise ProviderUnavailable("after the writes")

    with pytest.raises(ProviderUnavailable):
        await payments.confirm_payment(world.deps, payment, actor="notify", also=fail_after)
    assert seen[-1] is PaymentOutcome.CONFIRMED
    assert await snapshot(world) == before  # rolled back with what came after

    def accept(attempt):
        seen.append(attempt.order_id)

    assert await payments.confirm_payment(world.deps, payment, actor="notify", check=accept) is (
        PaymentOutcome.CONFIRMED
    )
    assert seen[-1] == order_id
    assert (await order_view(world.deps, order_id))["status"] == "pending_shipment"


# ---------------------------------------------------------------- close-or-query


async def test_timeout_confirms_a_paid_trade_instead_of_cancelling(world, fake):
    goods_id, order_id = await place(world)
    pay_no = await add_attempt(world, order_id, "20260301ffffffffffffffff", provider="fake")
    fake.answers[pay_no] = "paid"
    deadline = world.clock.advance(timedelta(minutes=30))
    await world.worker.drain()
    assert fake.calls == [pay_no]

    view = await order_view(world.deps, order_id)
    assert view["status"] == "pending_shipment"
    assert view["paid_at"] == deadline
    assert view["cancelled_at"] is None
    assert view["payments"][0]["state"] == "paid"
    assert view["payments"][0]["provider_trade_no"] == "T" + pay_no
    (item,) = await rows(world, schema.goods, id=goods_id)
    assert (item.status, item.reserved_order_id) == ("sold", order_id)
    cancel = await timer(world, order_id, "cancel_unpaid")
    assert cancel.state == "done"
    assert "pending_shipment" in cancel.outcome
    assert (await timer(world, order_id, "cancel_unshipped")).state == "scheduled"
    assert await rows(world, schema.discrepancies) == []
    assert view["refunds"] == []
    assert [e["actor"] for e in view["timeline"] if e["event"] == "pay"] == ["close_or_query"]


async def test_a_paid_trade_with_another_amount_is_a_discrepancy_and_the_order_is_cancelled(
    world, fake
):
    goods_id, order_id = await place(world)
    pay_no = await add_attempt(world, order_id, "20260301eeeeeeeeeeeeeeee", provider="fake")
    fake.answers[pay_no] = "paid_other"
    world.clock.advance(timedelta(minutes=30))
    await world.worker.drain()

    view = await order_view(world.deps, order_id)
    assert view["status"] == "cancelled_unpaid"
    assert view["payments"][0]["state"] == "paid"  # the provider holds the money
    assert view["payments"][0]["provider_trade_no"] == "T" + pay_no
    assert view["refunds"] == []  # the amounts disagree: an operator settles it
    (item,) = await rows(world, schema.goods, id=goods_id)
    assert (item.status, item.reserved_order_id) == ("on_sale", None)
    (found,) = await rows(world, schema.discrepancies)
    assert (found.kind, found.order_id) == ("amount_mismatch", order_id)
    assert "paid 13.50" in found.detail and "12.50" in found.detail
    assert [e["event"] for e in view["timeline"]][-3:] == ["discrepancy", "pay_timeout", "released"]
    assert view["timeline"][-3]["detail"].startswith("amount_mismatch: fake")
    cancel = await timer(world, order_id, "cancel_unpaid")
    assert (cancel.state, cancel.attempts) == ("done", 1)
    # nothing more happens on later passes
    world.clock.advance(timedelta(hours=1))
    assert await world.worker.drain() == 0
    assert len(await rows(world, schema.discrepancies)) == 1


@pytest.mark.parametrize(
    ("answer", "error_part"), [("unknown", "gateway timeout"), ("raise", "provider exploded")]
)
async def test_timeout_with_unknown_answer_retries(world, fake, answer, error_part):
    goods_id, order_id = await place(world)
    pay_no = await add_attempt(world, order_id, "20260301gggggggggggggggg", provider="fake")
    fake.answers[pay_no] = answer
    now = world.clock.advance(timedelta(minutes=30))
    await world.worker.drain()

    view = await order_view(world.deps, order_id)
    assert view["status"] == "pending_payment"
    assert view["cancelled_at"] is None
    assert view["payments"][0]["state"] == "open"
    (item,) = await rows(world, schema.goods, id=goods_id)
    assert item.reserved_order_id == order_id
    cancel = await timer(world, order_id, "cancel_unpaid")
    assert cancel.state == "scheduled"
    assert cancel.attempts == 1
    # A payment whose state is not known yet holds the cancel briefly: tried again in 2 s
    # (doubling), not after the 30 s backoff of other failures.
    assert cancel.due_at == now + quick_backoff(1) == now + timedelta(seconds=2)
    assert cancel.deadline_at == START + timedelta(minutes=30)
    assert cancel.stuck is False
    assert cancel.last_error and error_part in cancel.last_error
    assert cancel.claim_token is None and cancel.lease_until is None
    if answer == "raise":
        assert "RuntimeError" in cancel.last_error

    # not yet due again: nothing runs
    world.clock.advance(timedelta(seconds=1))
    assert await world.worker.drain() == 0
    assert fake.calls == [pay_no]


async def test_unknown_answers_flag_the_timer_stuck_but_keep_it(world, fake):
    _, order_id = await place(world)
    pay_no = await add_attempt(world, order_id, "20260301hhhhhhhhhhhhhhhh", provider="fake")
    fake.answers[pay_no] = "unknown"
    world.clock.advance(timedelta(minutes=30))
    for attempt in range(1, 6):
        assert await world.worker.drain() >= 1
        cancel = await timer(world, order_id, "cancel_unpaid")
        assert cancel.state == "scheduled"
        assert cancel.attempts == attempt
        assert cancel.due_at == world.clock.now() + quick_backoff(attempt)
        assert cancel.stuck is (attempt >= 5)
        world.clock.advance(quick_backoff(attempt))
    assert len(fake.calls) == 5
    assert (await order_view(world.deps, order_id))["status"] == "pending_payment"

    # still retried after being flagged; once the provider answers, the order is cancelled
    fake.answers[pay_no] = "closed"
    assert await world.worker.drain() == 2  # the cancel, then its notice
    view = await order_view(world.deps, order_id)
    assert view["status"] == "cancelled_unpaid"
    assert view["payments"][0]["state"] == "closed"
    cancel = await timer(world, order_id, "cancel_unpaid")
    assert cancel.state == "done"
    assert cancel.attempts == 6


async def test_one_batch_with_paid_unknown_raising_and_closed(world, fake):
    answers = ["paid", "unknown", "raise", "closed"]
    placed = []
    for n, answer in enumerate(answers):
        goods_id, order_id = await place(world)
        pay_no = await add_attempt(world, order_id, f"20260301batch{n:011d}", provider="fake")
        fake.answers[pay_no] = answer
        placed.append((goods_id, order_id))
    world.clock.advance(timedelta(minutes=30))
    await world.worker.drain()
    statuses = [(await order_view(world.deps, oid))["status"] for _, oid in placed]
    assert statuses == [
        "pending_shipment",
        "pending_payment",
        "pending_payment",
        "cancelled_unpaid",
    ]
    states = [(await timer(world, oid, "cancel_unpaid")).state for _, oid in placed]
    assert states == ["done", "scheduled", "scheduled", "done"]
    (closed_goods,) = await rows(world, schema.goods, id=placed[3][0])
    assert closed_goods.reserved_order_id is None


async def test_close_attempts_ranks_paid_over_unknown_over_closed(world, fake):
    cases = {
        "paid": ["unknown", "paid"],
        "unknown": ["closed", "raise"],
        "closed": ["closed", "closed"],
    }
    expected = {}
    for want, answers in cases.items():
        _, order_id = await place(world)
        for n, answer in enumerate(answers):
            pay_no = await add_attempt(
                world, order_id, f"20260301rank{order_id:04d}{n:02d}", provider="fake"
            )
            fake.answers[pay_no] = answer
        expected[order_id] = CloseResult(want if want != "closed" else "closed_unpaid")
    # an attempt with a provider nobody registered is an unknown answer, never a cancel
    _, stray = await place(world)
    await add_attempt(world, stray, "20260301strayprovider000", provider="alipay")
    expected[stray] = CloseResult.UNKNOWN

    now = world.clock.now()
    open_rows = await payments.open_attempts(world.deps, list(expected), now)
    assert len(open_rows) == 7
    outcomes = await payments.close_attempts(world.deps, open_rows, now)
    assert {oid: o.result for oid, o in outcomes.items()} == expected
    paid = next(o for o in outcomes.values() if o.result is CloseResult.PAID)
    assert paid.payment is not None and paid.payment.amount == Decimal("12.50")
    assert "InvalidInput" in outcomes[stray].reason
    # close-or-query itself changes no rows
    assert all(r.state == "open" for r in await rows(world, schema.payments))


async def test_open_attempts_only_of_pending_orders(world):
    _, live = await place(world)
    _, paid = await place(world)
    a = await add_attempt(world, live, "20260301openlive00000000")
    await add_attempt(world, paid, "20260301openpaid00000000")
    await payments.record_manual_payment(world.deps, order_id=paid, amount="12.50")
    found = await payments.open_attempts(world.deps, [live, paid], world.clock.now())
    assert [r.pay_no for r in found] == [a]
    assert await payments.open_attempts(world.deps, [], world.clock.now()) == []


async def test_buyer_cancel_with_unknown_answer_changes_nothing(world, fake):
    _, order_id = await place(world)
    pay_no = await add_attempt(world, order_id, "20260301cancelunknown000", provider="fake")
    fake.answers[pay_no] = "unknown"
    before = await snapshot(world)
    with pytest.raises(ProviderUnavailable):
        await orders.cancel_by_buyer(world.deps, order_id=order_id, user_id=world.buyer)
    assert await snapshot(world) == before
    fake.answers[pay_no] = "closed"
    await orders.cancel_by_buyer(world.deps, order_id=order_id, user_id=world.buyer)
    assert (await order_view(world.deps, order_id))["status"] == "cancelled_unpaid"


async def test_buyer_cancel_of_a_paid_trade_confirms_it(world, fake):
    goods_id, order_id = await place(world)
    pay_no = await add_attempt(world, order_id, "20260301cancelpaid000000", provider="fake")
    fake.answers[pay_no] = "paid"
    with pytest.raises(InvalidTransition) as info:
        await orders.cancel_by_buyer(world.deps, order_id=order_id, user_id=world.buyer)
    assert info.value.status == "pending_shipment"
    view = await order_view(world.deps, order_id)
    assert view["status"] == "pending_shipment"
    assert view["payments"][0]["state"] == "paid"
    (item,) = await rows(world, schema.goods, id=goods_id)
    assert item.status == "sold"
    assert await rows(world, schema.refunds) == []
