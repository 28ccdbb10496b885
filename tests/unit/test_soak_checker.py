"""The soak's checker (tests/soak/checker.py) on a small real history: dueflow and the payment
simulator in one process on a FakeClock, orders placed, paid through the simulator, cancelled by
the seller and refunded, left unpaid until the worker cancels them. The checker passes on that
history; then each test breaks one promise (a direct UPDATE or INSERT, or an altered
simulator state or delivery list) and the checker reports exactly that check, naming the id."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import insert, select, update

from dueflow import bootstrap
from dueflow.api.app import create_app as dueflow_app
from dueflow.clock import FakeClock
from dueflow.config import load_settings
from dueflow.notifiers import webhook
from dueflow.notifiers.base import Notifier, Reminder
from dueflow.payments.simulator import SimulatorConfig
from dueflow.payments.simulator.app import create_app as simulator_app
from dueflow.service import accounts, events, orders, payments, refunds
from dueflow.service.deps import Deps
from dueflow.store import migrate, schema
from dueflow.store.db import Database
from dueflow.worker.runner import Worker
from tests.conftest import SERVICE_URLS, _reset_server_database, require_service
from tests.soak.checker import Bounds, check
from tests.soak.run import fresh_postgres
from tests.unit.payments.test_payment_flow import Forward

BOUNDS = Bounds(scan_interval=5.0, lease=10.0, grace=2.0)
PG_URL = f"{SERVICE_URLS['postgres']}_soak_checker"


class ReceiverNotifier(Notifier):
    """Hands each reminder to a receiver as the soak's receiver records it: path, lower-cased
    headers, the webhook's JSON body, a 200 answer and the time (the FakeClock's)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.deliveries: list[dict[str, Any]] = []

    async def send(self, reminder: Reminder) -> None:
        self.deliveries.append(
            {
                "path": "/notice",
                "headers": {"x-dueflow-delivery": str(reminder.reminder_id)},
                "body": json.loads(webhook.payload(reminder)),
                "status": 200,
                "at": self.clock.now().isoformat(),
            }
        )


@dataclass
class History:
    """The database, the simulator's state and the receiver's deliveries after the history."""

    url: str
    deps: Deps
    sim: dict[str, Any]
    deliveries: list[dict[str, Any]]
    paid: int  # paid through Alipay, shipped, received and reviewed by the buyer
    unpaid: int  # cancelled at its pay deadline by the worker
    refunded: int  # paid through WeChat Pay, cancelled by the seller, refunded

    async def run(self, **changes: Any) -> dict[str, Any]:
        """The checker's result, with the simulator state or deliveries replaced (or freezes
        given)."""
        return await check(
            self.url,
            changes.get("sim", self.sim),
            changes.get("deliveries", self.deliveries),
            changes.get("bounds", BOUNDS),
            frozen=changes.get("frozen", ()),
        )

    async def execute(self, statement: Any) -> None:
        async with self.deps.db.write() as conn:
            await conn.execute(statement)


def failing(result: dict[str, Any]) -> dict[str, list[str]]:
    """The checks that found violations, with their evidence."""
    return {c["name"]: c["evidence"] for c in result["checks"] if c["violations"]}


async def live_history(url: str) -> AsyncIterator[History]:
    """The history, played on ``url``. The clock starts 31 minutes before the real time, so that
    what the history leaves waiting is due in the future when the checker looks (it reads the
    real clock, as at the end of a soak)."""
    clock = FakeClock(datetime.now(UTC) - timedelta(minutes=31))
    forward = Forward()
    config = SimulatorConfig.generate(clock=clock, transport=forward)
    sim = simulator_app(config)
    notifier = ReceiverNotifier(clock)
    settings = load_settings(
        database_url=url,
        public_url="http://dueflow",
        profile="prod",
        **dataclasses.asdict(config.client_config("http://sim")),
    )
    async with (
        httpx.AsyncClient(transport=httpx.ASGITransport(app=sim), base_url="http://sim") as http,
        bootstrap.running(
            settings, clock=clock, http=http, notifier=notifier, migrate_sqlite=False
        ) as deps,
    ):
        if deps.db.dialect != "sqlite":
            await _reset_server_database(deps.db)
        forward.app = dueflow_app(deps)
        seller, _ = await accounts.add_user(deps, "seller")
        buyer, _ = await accounts.add_user(deps, "buyer")
        worker = Worker(deps)

        async def place(price: str) -> int:
            goods = await accounts.add_goods(deps, seller_id=seller.id, title="tent", price=price)
            return await orders.place_order(deps, buyer_id=buyer.id, goods_id=goods)

        async def pay(order_id: int, provider: str) -> None:
            pay_no, _ = await payments.start_payment(
                deps, order_id=order_id, user_id=buyer.id, provider=provider
            )
            command = {"provider": provider, "out_trade_no": pay_no}
            assert (await http.post("/control/pay", json=command)).status_code == 200
            await http.post("/control/deliver")

        paid, unpaid, refunded = await place("88.00"), await place("12.50"), await place("40.00")
        await pay(paid, "alipay")
        await orders.ship(deps, order_id=paid, user_id=seller.id, carrier="SF", tracking_no="1")
        await orders.confirm_receipt(deps, order_id=paid, user_id=buyer.id)
        await orders.review(deps, order_id=paid, user_id=buyer.id, rating=5)
        await pay(refunded, "wechatpay")
        await orders.cancel_by_seller(deps, order_id=refunded, user_id=seller.id)
        (refund,) = [r["id"] for r in (await orders.order_view(deps, refunded))["refunds"]]
        await refunds.approve(deps, refund)
        clock.advance(timedelta(minutes=5))
        await worker.drain()
        clock.advance(timedelta(minutes=25))
        await worker.drain()
        # WeChat refunds settle a while after they are made; the refund check then sees it.
        clock.advance(config.refund_settle_after + timedelta(seconds=1))
        await http.get("/control/state")
        await worker.drain()
        clock.advance(timedelta(seconds=30))
        await worker.drain()
        state = (await http.get("/control/state")).json()
        yield History(url, deps, state, notifier.deliveries, paid, unpaid, refunded)


@pytest.fixture
async def history(db_path: Path) -> AsyncIterator[History]:
    async for built in live_history(f"sqlite:///{db_path}"):
        yield built


async def test_the_history_keeps_every_promise(history):
    result = await history.run()
    assert failing(result) == {}
    checked = {c["name"]: c["checked"] for c in result["checks"]}
    assert all(n > 0 for n in checked.values()), checked
    assert "events_in_order" not in checked  # no events webhook in this history
    figures = result["figures"]
    assert figures["orders"] == {"marketplace": {
        "cancelled_unpaid": 1, "cancelled_unshipped": 1, "received": 1
    }}  # fmt: skip
    assert figures["refunds"] == {"succeeded": 1}
    assert figures["sim_refunds"] == {"success": 1}
    assert figures["deliveries"]["notices"] == 3  # a reminder and two notices
    assert figures["deliveries"]["repeats"] == 0
    kinds = {e["kind"] for e in result["lateness"]}
    assert {"pay_reminder", "cancel_unpaid", "order_closed"} <= kinds
    assert figures["lateness"]["cancel_unpaid"]["max"] == 0.0


async def test_goods_held_by_a_cancelled_order(history):
    goods = select(schema.orders.c.goods_id).where(schema.orders.c.id == history.unpaid)
    await history.execute(
        update(schema.goods)
        .where(schema.goods.c.id == goods.scalar_subquery())
        .values(reserved_order_id=history.unpaid)
    )
    found = failing(await history.run())
    assert set(found) == {"holds_released", "stock_conserved"}
    assert any("held by dead order" in e for e in found["holds_released"])
    assert any(f"held by order {history.unpaid}" in e for e in found["stock_conserved"])


async def test_goods_sold_to_an_order_never_paid(history):
    goods = select(schema.orders.c.goods_id).where(schema.orders.c.id == history.unpaid)
    await history.execute(
        update(schema.goods)
        .where(schema.goods.c.id == goods.scalar_subquery())
        .values(status="sold")
    )
    found = failing(await history.run())
    assert set(found) == {"sold_once"}
    assert "sold, paid orders []" in found["sold_once"][0]


async def test_a_review_written_twice(history):
    # The unique key forbids it; the checker must find it all the same: a copy of the table
    # without the key takes its place (the file changed by sqlite3 itself, schema and all).
    with contextlib.closing(sqlite3.connect(history.url.removeprefix("sqlite:///"))) as conn:
        conn.executescript(
            "CREATE TABLE reviews_copy AS SELECT * FROM reviews;"
            "DROP TABLE reviews;"
            "ALTER TABLE reviews_copy RENAME TO reviews;"
            "INSERT INTO reviews SELECT id + 100, order_id, role, author_id, rating, comment,"
            " is_default, created_at FROM reviews;"
        )
    found = failing(await history.run())
    assert found == {"reviews_once": [f"order {history.paid}: reviews twice"]}


async def set_time(history: History, table: Any, where: Any, column: str, moved: Any) -> None:
    """Set ``column`` of the one row of ``table`` matching ``where`` to ``moved(its value)``."""
    async with history.deps.db.read() as conn:
        row = (await conn.execute(select(table).where(where))).one()
    await history.execute(update(table).where(where).values({column: moved(row._mapping[column])}))


async def test_a_deadline_acted_on_late(history):
    late = timedelta(seconds=BOUNDS.late_limit + 1)
    t = schema.timers.c
    timer = (t.order_id == history.unpaid) & (t.kind == "cancel_unpaid")
    await set_time(history, schema.timers, timer, "done_at", lambda done: done + late)
    found = failing(await history.run())
    assert set(found) == {"timers_on_time"}
    assert f"cancel_unpaid of order {history.unpaid}" in found["timers_on_time"][0]


async def test_the_overload_bounds_judge_a_must_happen_deadline(history):
    # Late by the quiet limit and a second: within the overload's 20 s more, past it by 21 s.
    overload = dataclasses.replace(BOUNDS, overload=20.0, message_overload=60.0)
    assert overload.must_limit == BOUNDS.late_limit + 20
    assert overload.limit("pay_reminder") == BOUNDS.late_limit + 60
    assert overload.limit("cancel_unpaid") == overload.limit("pay_timeout") == overload.must_limit
    t = schema.timers.c
    timer = (t.order_id == history.unpaid) & (t.kind == "cancel_unpaid")
    late = timedelta(seconds=BOUNDS.late_limit + 1)
    await set_time(history, schema.timers, timer, "done_at", lambda done: done + late)
    assert failing(await history.run(bounds=overload)) == {}
    later = timedelta(seconds=20)
    await set_time(history, schema.timers, timer, "done_at", lambda done: done + later)
    found = failing(await history.run(bounds=overload))
    assert set(found) == {"timers_on_time"}
    assert f"cancel_unpaid of order {history.unpaid}" in found["timers_on_time"][0]


async def test_a_timeout_event_before_its_deadline(history):
    e = schema.order_events.c
    event = (e.order_id == history.unpaid) & (e.event == "pay_timeout")
    early = timedelta(seconds=1)
    await set_time(history, schema.order_events, event, "at", lambda at: at - early)
    found = failing(await history.run())
    assert set(found) == {"timeouts_on_time"}
    assert f"order {history.unpaid}: pay_timeout" in found["timeouts_on_time"][0]


async def test_an_order_left_past_its_deadline(history):
    o = schema.orders.c
    await history.execute(
        update(schema.orders)
        .where(o.id == history.paid)
        .values(review_deadline=datetime.now(UTC) - timedelta(minutes=1))
    )
    found = failing(await history.run())
    assert set(found) == {"no_order_overdue"}
    assert f"order {history.paid} (marketplace) still received" in found["no_order_overdue"][0]


async def test_a_timer_left_claimed(history):
    t = schema.timers.c
    await history.execute(
        update(schema.timers)
        .where(t.order_id == history.paid, t.kind == "auto_review")
        .values(state="claimed", claim_token="x", lease_until=datetime.now(UTC))
    )
    found = failing(await history.run())
    assert set(found) == {"timers_settled"}
    assert f"auto_review of order {history.paid}: claimed" in found["timers_settled"][0]


async def test_a_parked_timer(history):
    """A timer its handler gave up on is a broken promise, however settled the rest is."""
    t = schema.timers.c
    await history.execute(
        update(schema.timers)
        .where(t.order_id == history.paid, t.kind == "auto_review")
        .values(state="parked", last_error="RuntimeError: boom", lease_until=None)
    )
    found = failing(await history.run())
    assert set(found) == {"timers_settled"}
    assert f"auto_review of order {history.paid}: parked" in found["timers_settled"][0]


async def test_a_timer_left_scheduled_in_the_past(history):
    t = schema.timers.c
    await history.execute(
        update(schema.timers)
        .where(t.order_id == history.paid, t.kind == "auto_review")
        .values(due_at=datetime.now(UTC) - timedelta(minutes=1))
    )
    found = failing(await history.run())
    assert set(found) == {"timers_settled"}
    assert "overdue" in found["timers_settled"][0]


async def test_a_payment_taken_that_is_nobodys(history):
    sim = copy.deepcopy(history.sim)
    (trade,) = [t for t in sim["trades"] if t["provider"] == "alipay"]
    stray = {**trade, "out_trade_no": "20260301stray0001", "amount": "12.50"}
    sim["trades"].append(stray)
    found = failing(await history.run(sim=sim))
    assert set(found) == {"payments_accounted"}
    assert found["payments_accounted"] == [
        f"alipay trade 20260301stray0001 paid 12.50 at {trade['paid_at']}: no payment attempt "
        "has this pay_no"
    ]


async def test_a_second_paid_attempt_without_its_refund(history):
    async with history.deps.db.read() as conn:
        first = (
            await conn.execute(
                select(schema.payments).where(schema.payments.c.order_id == history.paid)
            )
        ).one()
    values = {k: v for k, v in first._mapping.items() if k != "id"}
    await history.execute(insert(schema.payments).values({**values, "pay_no": "second0001"}))
    sim = copy.deepcopy(history.sim)
    (trade,) = [t for t in sim["trades"] if t["out_trade_no"] == first.pay_no]
    sim["trades"].append({**trade, "out_trade_no": "second0001"})
    found = failing(await history.run(sim=sim))
    assert set(found) == {"payments_accounted"}
    assert f"not the payment of order {history.paid}" in found["payments_accounted"][0]
    assert "discrepancy none, refund none" in found["payments_accounted"][0]


async def test_a_refund_paid_twice_at_the_simulator(history):
    sim = copy.deepcopy(history.sim)
    (refund,) = sim["refunds"]
    sim["refunds"].append({**refund, "refund_id": "5099"})
    found = failing(await history.run(sim=sim))
    assert set(found) == {"refunds_once"}
    trade = refund["out_trade_no"]
    assert any(f"trade {trade}: paid 40.00, refunded 80.00" in e for e in found["refunds_once"])
    assert any(f"trade {trade}: 2 refunds succeeded" in e for e in found["refunds_once"])


async def test_an_approved_refund_left_processing(history):
    r = schema.refunds.c
    await history.execute(
        update(schema.refunds).where(r.order_id == history.refunded).values(state="processing")
    )
    found = failing(await history.run())
    assert set(found) == {"refunds_final"}
    assert f"of order {history.refunded}: processing" in found["refunds_final"][0]


async def test_a_notice_received_under_two_ids(history):
    deliveries = copy.deepcopy(history.deliveries)
    notice = next(d for d in deliveries if d["body"]["type"] == "order_closed")
    other = copy.deepcopy(notice)
    other["headers"]["x-dueflow-delivery"] = "999"
    deliveries.append(other)
    found = failing(await history.run(deliveries=deliveries))
    assert set(found) == {"notices_once"}
    order_id = notice["body"]["order"]["id"]
    assert any(f"order {order_id}: order_closed received under" in e for e in found["notices_once"])


async def test_a_repeat_dueflow_did_not_count(history):
    deliveries = copy.deepcopy(history.deliveries)
    reminder = next(d for d in deliveries if d["body"]["type"] == "pay_reminder")
    deliveries.append(copy.deepcopy(reminder))
    result = await history.run(deliveries=deliveries)
    found = failing(result)
    assert set(found) == {"notices_once"}
    rid = reminder["headers"]["x-dueflow-delivery"]
    assert found["notices_once"] == [
        f"reminder {rid} pay_reminder of order {history.unpaid}: received 2 times, dueflow "
        "counted 1 deliveries (sent)"
    ]
    assert result["figures"]["deliveries"]["repeats_unexplained"] == 1


async def test_a_repeat_dueflow_counted_is_documented(history):
    deliveries = copy.deepcopy(history.deliveries)
    reminder = next(d for d in deliveries if d["body"]["type"] == "pay_reminder")
    deliveries.append(copy.deepcopy(reminder))
    rid = int(reminder["headers"]["x-dueflow-delivery"])
    await history.execute(
        update(schema.reminders).where(schema.reminders.c.id == rid).values(deliveries=2)
    )
    result = await history.run(deliveries=deliveries)
    assert failing(result) == {}
    assert result["figures"]["deliveries"]["repeats"] == 1
    assert result["figures"]["deliveries"]["repeats_unexplained"] == 0


async def test_a_cancel_whose_notice_never_arrived(history):
    deliveries = [
        d
        for d in history.deliveries
        if not (d["body"]["type"] == "order_closed" and d["body"]["order"]["id"] == history.unpaid)
    ]
    # An answer that is no 2xx is no delivery.
    dropped = next(d for d in history.deliveries if d["body"]["order"]["id"] == history.unpaid)
    deliveries.append({**dropped, "status": 503})
    found = failing(await history.run(deliveries=deliveries))
    assert set(found) == {"cancels_notified"}
    assert found["cancels_notified"][0].startswith(f"order {history.unpaid} cancelled_unpaid")


async def test_a_pay_reminder_after_the_cancel(history):
    deliveries = copy.deepcopy(history.deliveries)
    reminder = next(d for d in deliveries if d["body"]["type"] == "pay_reminder")
    reminder["at"] = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    found = failing(await history.run(deliveries=deliveries))
    assert set(found) == {"reminders_not_after_close"}
    assert f"of order {history.unpaid}: received" in found["reminders_not_after_close"][0]


async def event_deliveries(history: History) -> list[dict[str, Any]]:
    """What an events webhook would have delivered of the history: every event in seq order
    (numbered by the sequencer first)."""
    await events.sequence(history.deps)
    e = schema.order_events.c
    async with history.deps.db.read() as conn:
        rows = (await conn.execute(select(schema.order_events).order_by(e.seq))).all()
    return [
        {
            "path": "/events",
            "headers": {"x-dueflow-delivery": events.delivery_id(r.seq)},
            "body": events.event_json(r),
            "status": 200,
            "at": r.at.isoformat(),
        }
        for r in rows
    ]


async def test_events_in_order_then_one_missing_and_one_late(history):
    delivered = await event_deliveries(history)
    result = await history.run(deliveries=[*history.deliveries, *delivered])
    assert failing(result) == {}
    (events_check,) = [c for c in result["checks"] if c["name"] == "events_in_order"]
    assert events_check["checked"] == len(delivered) > 5
    broken = [*delivered[:2], *delivered[3:]]
    found = failing(await history.run(deliveries=[*history.deliveries, *broken]))
    assert found == {"events_in_order": [f"evt_3 never received before evt_{len(delivered)}"
                                         f" ({delivered[2]['body']['type']} of order "
                                         f"{delivered[2]['body']['order']['id']})"]}  # fmt: skip
    late = [*delivered[:2], *delivered[3:], delivered[2]]
    found = failing(await history.run(deliveries=[*history.deliveries, *late]))
    assert found["events_in_order"] == [
        f"evt_3 first received at {delivered[2]['at']}, after evt_{len(delivered)}"
    ]
    # A repeat of an event already delivered, after later ones: the documented at-least-once.
    repeated = [*delivered, delivered[2]]
    assert failing(await history.run(deliveries=[*history.deliveries, *repeated])) == {}


async def test_a_pay_reminder_held_through_a_freeze_is_counted_not_failed(history):
    """Checked, then frozen with its worker before the send: it lands when the worker resumes,
    after the cancel. Counted in the figures; the same landing with no freeze is a violation."""
    deliveries = copy.deepcopy(history.deliveries)
    reminder = next(d for d in deliveries if d["body"]["type"] == "pay_reminder")
    e = schema.order_events.c
    async with history.deps.db.read() as conn:
        closed = (
            await conn.execute(
                select(e.at).where(e.order_id == history.unpaid, e.event == "pay_timeout")
            )
        ).scalar_one()
    reminder["at"] = (closed + timedelta(seconds=30)).isoformat()
    freeze = [(closed - timedelta(seconds=1), closed + timedelta(seconds=28))]
    result = await history.run(deliveries=deliveries, frozen=freeze)
    assert failing(result) == {}
    assert result["figures"]["deliveries"]["reminders_sent_through_a_freeze"] == 1
    later = [(closed + timedelta(seconds=1), closed + timedelta(seconds=28))]  # after the cancel
    found = failing(await history.run(deliveries=deliveries, frozen=later))
    assert set(found) == {"reminders_not_after_close"}


async def test_a_late_timer_whose_order_had_moved_on_acted_on_nothing(history):
    """A cancel that finds its order paid had nothing to do: late, it is no late action. A
    reminder skipped because its unpaid order is past its deadline came too late: a violation."""
    t = schema.timers.c
    late = timedelta(seconds=BOUNDS.late_limit + 30)
    paid_cancel = (t.order_id == history.paid) & (t.kind == "cancel_unpaid")
    await history.execute(
        update(schema.timers)
        .where(paid_cancel)
        .values(state="done", outcome="skipped: order is pending_shipment")
    )
    async with history.deps.db.read() as conn:
        row = (await conn.execute(select(schema.timers).where(paid_cancel))).one()
    await history.execute(
        update(schema.timers).where(paid_cancel).values(done_at=row.deadline_at + late)
    )
    assert failing(await history.run()) == {}
    reminder = (t.order_id == history.unpaid) & (t.kind == "pay_reminder")
    await history.execute(
        update(schema.timers).where(reminder).values(outcome="skipped: order is pending_payment")
    )
    await set_time(history, schema.timers, reminder, "done_at", lambda done: done + late)
    found = failing(await history.run())
    assert set(found) == {"timers_on_time"}
    assert f"pay_reminder of order {history.unpaid}" in found["timers_on_time"][0]


@pytest.mark.postgres
async def test_the_history_keeps_every_promise_on_postgresql():
    require_service("postgresql", "127.0.0.1", 5432)  # fails under CI when it does not answer
    await fresh_postgres(PG_URL)
    fresh = Database.from_url(PG_URL)
    try:  # migrated here: the suite's reset migrates only the first server database it meets
        await migrate.upgrade(fresh)
    finally:
        await fresh.dispose()
    async for history in live_history(PG_URL):
        result = await history.run()
        assert failing(result) == {}
        assert all(c["checked"] > 0 for c in result["checks"])
        await history.execute(
            update(schema.refunds)
            .where(schema.refunds.c.order_id == history.refunded)
            .values(state="processing")
        )
        assert set(failing(await history.run())) == {"refunds_final"}


async def test_a_cancel_held_by_a_payment_start_never_answered(history):
    """A start whose answer never came (the API process killed mid-call) holds the unpaid
    cancel until the attempt's expiry plus 2 minutes: late by that much, a retry's step and the
    late limit is the documented hold, not a violation; later than that is one."""
    o = schema.orders.c
    async with history.deps.db.read() as conn:
        order = (await conn.execute(select(schema.orders).where(o.id == history.unpaid))).one()
    await history.execute(
        insert(schema.payments).values(
            pay_no="20260301unansweredstart01",
            order_id=history.unpaid,
            provider="alipay",
            amount=order.amount,
            expires_at=order.pay_deadline,
            state="closed",
            created_at=order.created_at,
            start_answer=None,
        )
    )
    t, e = schema.timers.c, schema.order_events.c
    timer = (t.order_id == history.unpaid) & (t.kind == "cancel_unpaid")
    event = (e.order_id == history.unpaid) & (e.event == "pay_timeout")
    held = timedelta(minutes=2, seconds=30 + BOUNDS.late_limit)
    await set_time(history, schema.timers, timer, "done_at", lambda done: done + held)
    await set_time(history, schema.order_events, event, "at", lambda at: at + held)
    assert failing(await history.run()) == {}

    past = timedelta(seconds=BOUNDS.late_limit + 5)
    await set_time(history, schema.timers, timer, "done_at", lambda done: done + past)
    await set_time(history, schema.order_events, event, "at", lambda at: at + past)
    found = failing(await history.run())
    assert set(found) == {"timers_on_time", "timeouts_on_time"}
    assert f"order {history.unpaid}" in found["timeouts_on_time"][0]
