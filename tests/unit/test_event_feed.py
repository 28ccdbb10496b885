"""Order events out: every kind written in its own transaction, the sequencer that numbers them in
commit order, and the feed (``GET /api/events``): its cursor, its scoping, resuming anywhere."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import delete, select, text

from dueflow.api import events as feed_api
from dueflow.api.app import create_app
from dueflow.payments.base import Providers, RefundResult
from dueflow.payments.manual import ManualProvider
from dueflow.service import accounts, events, orders, payments, refunds, webhooks
from dueflow.store import migrate, schema
from dueflow.store.db import Database
from tests.conftest import START, eventually, table_snapshot
from tests.envelopes import seq_of, user
from tests.unit.api import Api, FakePay


@pytest.fixture
async def api(world) -> AsyncIterator[Api]:
    """The whole app (feed included) over the world's deps, with callers and a fake provider."""
    provider = FakePay()
    world.deps.providers = Providers([ManualProvider(), provider])
    transport = httpx.ASGITransport(app=create_app(world.deps))
    async with httpx.AsyncClient(transport=transport, base_url="http://dueflow") as client:
        found = Api(world.deps, client, provider)
        for role, admin in [("seller", False), ("buyer", False), ("stranger", False)]:
            user, token = await accounts.add_user(world.deps, f"api-{role}", admin=admin)
            found.tokens[role], found.ids[role] = token, user.id
        user, token = await accounts.add_user(world.deps, "api-admin", admin=True)
        found.tokens["admin"], found.ids["admin"] = token, user.id
        yield found


async def read_all(api: Api, who: str = "admin", *, after: str | None = None, limit: int = 500):
    """Every event the feed gives ``who`` from ``after`` on, page by page; the last cursor."""
    got: list[dict] = []
    while True:
        params: dict[str, str | int] = {"limit": limit}
        if after is not None:
            params["after"] = after
        answer = await api.call("GET", "/api/events", who, params=params)
        assert answer.status_code == 200, answer.text
        page = answer.json()
        got += page["events"]
        if not page["events"]:
            return got, page["next"]
        after = page["next"]


def of_order(fed: list[dict], order_id: int) -> list[str]:
    return [e["type"] for e in fed if e["order"]["id"] == order_id]


async def stored_events(deps) -> list:
    async with deps.db.read() as conn:
        query = select(schema.order_events).order_by(schema.order_events.c.id)
        return list((await conn.execute(query)).all())


# --- every event the issue lists ---------------------------------------------------------------


async def test_an_order_life_writes_each_of_its_events(api):
    order_id = await api.received()
    for who, rating in (("buyer", 5), ("seller", 4)):
        answer = await api.call(
            "POST", f"/api/orders/{order_id}/reviews", who, json={"rating": rating}
        )
        assert answer.status_code == 201, answer.text
    assert await events.sequence(api.deps) > 0
    fed, _ = await read_all(api)
    assert of_order(fed, order_id) == [
        "place",
        "payment_started",
        "pay",
        "ship",
        "confirm_receipt",
        "review",
        "review",
        "reviews_complete",
    ]
    by_event = {e["type"]: e for e in fed if e["order"]["id"] == order_id}
    assert (by_event["pay"]["data"]["from_status"], by_event["pay"]["data"]["to_status"]) == (
        "pending_payment",
        "pending_shipment",
    )
    assert by_event["reviews_complete"]["data"]["to_status"] == "completed"
    assert by_event["payment_started"]["actor"] == user(api.ids["buyer"])


async def test_cancels_write_their_reason_what_was_released_and_the_refund(api):
    unpaid = await api.order()
    assert (await api.call("POST", f"/api/orders/{unpaid}/cancel", "buyer")).status_code == 200
    refund_id = await api.refund()  # a paid order its seller cancelled
    [unshipped] = [o for o in await order_ids(api) if o != unpaid]
    await events.sequence(api.deps)
    fed, _ = await read_all(api)

    cancel, released = [e for e in fed if e["order"]["id"] == unpaid][-2:]
    assert (cancel["type"], cancel["data"]["to_status"]) == ("buyer_cancel", "cancelled_unpaid")
    goods_of = await goods_ids(api)
    assert cancel["data"]["reason"] == "buyer_cancel"
    assert released["type"] == "released"
    assert released["data"] == {
        "how": "released",
        "lines": [
            {
                "kind": "goods",
                "item_id": goods_of[unpaid],
                "label": released["data"]["lines"][0]["label"],
                "quantity": 1,
                "went": "back on sale",
            }
        ],
    }
    assert of_order(fed, unshipped)[-3:] == ["seller_cancel", "released", "refund_created"]
    created = fed[-1]
    assert (created["data"]["amount"], created["data"]["reason"]) == ("12.50", "seller_cancel")
    assert created["actor"] == user(api.ids["seller"])
    released = [e for e in fed if e["order"]["id"] == unshipped][-2]
    assert released["data"]["how"] == "forfeited"
    assert [(x["item_id"], x["went"]) for x in released["data"]["lines"]] == [
        (goods_of[unshipped], "taken off sale")
    ]
    assert created["order"]["refunds"][0]["state"] == "pending_review"

    # approved, failed at the provider, retried, succeeded: each an event
    api.provider.refund_answers = [RefundResult.FAILED, RefundResult.SUCCEEDED]
    assert await refunds.approve(api.deps, refund_id) == "failed"
    assert await refunds.retry(api.deps, refund_id) == "succeeded"
    await events.sequence(api.deps)
    fed, _ = await read_all(api)
    assert of_order(fed, unshipped)[-4:] == [
        "refund_submitted",
        "refund_failed",
        "refund_submitted",
        "refund_succeeded",
    ]


async def test_a_payment_after_the_cancel_is_a_discrepancy_event_and_a_refund_event(api):
    order_id = await api.order()
    assert (await api.call("POST", f"/api/orders/{order_id}/cancel", "buyer")).status_code == 200
    pay_no, outcome = await payments.record_manual_payment(
        api.deps, order_id=order_id, amount="12.50"
    )
    assert outcome is payments.PaymentOutcome.REFUND
    await events.sequence(api.deps)
    fed, _ = await read_all(api)
    assert of_order(fed, order_id)[-2:] == ["discrepancy", "refund_created"]
    discrepancy = next(e for e in fed if e["type"] == "discrepancy")
    assert discrepancy["data"] == {
        "kind": "paid_after_cancel",
        "provider": "manual",
        "pay_no": pay_no,
        "amount": "12.50",
        "order_status": "cancelled_unpaid",
        "refund_due": True,
    }


async def test_a_timeout_cancel_releases_in_the_timers_transaction(world):
    goods_id = await world.goods()
    order_id = await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=goods_id)
    world.clock.advance(timedelta(minutes=31))
    await world.worker.drain()
    rows = [r for r in await stored_events(world.deps) if r.order_id == order_id]
    assert [(r.event, r.actor, r.detail) for r in rows][-2:] == [
        ("pay_timeout", "timer", None),
        ("released", "timer", f"goods {goods_id} back on sale"),
    ]
    assert rows[-1].at == rows[-2].at  # written together, by the cancel itself


async def test_a_refused_action_writes_no_event(api):
    order_id = await api.order()
    before = await table_snapshot(api.deps)
    answer = await api.call(
        "POST", f"/api/orders/{order_id}/ship", "seller", json={"carrier": "SF", "tracking_no": "1"}
    )
    assert answer.status_code == 409
    assert await table_snapshot(api.deps) == before


async def order_ids(api: Api) -> list[int]:
    async with api.deps.db.read() as conn:
        return list((await conn.execute(select(schema.orders.c.id))).scalars())


async def goods_ids(api: Api) -> dict[int, int]:
    async with api.deps.db.read() as conn:
        query = select(schema.orders.c.id, schema.orders.c.goods_id)
        return {r.id: r.goods_id for r in (await conn.execute(query)).all()}


# --- the sequencer -------------------------------------------------------------------------------


async def counter(deps) -> int | None:
    async with deps.db.read() as conn:
        return (await conn.execute(select(schema.event_sequence.c.last_seq))).scalar()


async def test_events_are_fed_only_once_numbered_in_id_order_in_bounded_batches(world):
    for _ in range(3):
        await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=await world.goods())
    assert [r.seq for r in await stored_events(world.deps)] == [None, None, None]
    assert await events.feed(world.deps, after=0, limit=100) == []

    assert await events.sequence(world.deps, limit=2) == 2
    assert [r.seq for r in await stored_events(world.deps)] == [1, 2, None]
    assert await counter(world.deps) == 2
    assert await events.sequence(world.deps, limit=2) == 1
    assert await events.sequence(world.deps, limit=2) == 0
    stored = await stored_events(world.deps)
    assert [r.seq for r in stored] == [1, 2, 3] and await counter(world.deps) == 3
    fed = await events.feed(world.deps, after=0, limit=100)
    assert [(e["id"], seq_of(e), e["order"]["id"]) for e in fed] == [
        (f"evt_{r.seq}", r.seq, r.order_id) for r in stored
    ]


async def test_a_missing_counter_row_is_put_back_after_the_highest_seq(world):
    await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=await world.goods())
    assert await events.sequence(world.deps) == 1
    async with world.deps.db.write() as conn:
        await conn.execute(delete(schema.event_sequence))
    await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=await world.goods())
    assert await events.sequence(world.deps) == 1
    assert [r.seq for r in await stored_events(world.deps)] == [1, 2]
    assert await counter(world.deps) == 2


async def test_the_sequencer_loop_numbers_new_events_and_survives_errors(world, monkeypatch):
    stop = asyncio.Event()
    tasks = webhooks.start(world.deps, None, stop)
    try:
        await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=await world.goods())
        world.clock.advance(1)
        assert await eventually(lambda: events.feed(world.deps, after=0, limit=10))

        # a failing pass is logged and the loop goes on
        real = events.store.number_committed
        broken = {"left": 1}

        async def flaky(conn, *, limit):
            if broken["left"]:
                broken["left"] -= 1
                raise RuntimeError("database hiccup")
            return await real(conn, limit=limit)

        monkeypatch.setattr(events.store, "number_committed", flaky)
        await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=await world.goods())

        async def both_fed() -> bool:
            world.clock.advance(1)
            return len(await events.feed(world.deps, after=0, limit=10)) == 2

        assert await eventually(both_fed)
        assert broken["left"] == 0
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=5)


async def test_a_database_down_for_long_is_retried_with_backoff_and_one_traceback(
    world, monkeypatch, caplog
):
    """Found in review: both loops retried a broken database every second with a traceback
    each time. Now the first failure in a row has its traceback, the rest one line, and the
    pauses grow (1, 2, 4 ... s of the clock)."""
    failures = {"n": 0}

    async def down(conn, *, limit):
        failures["n"] += 1
        raise RuntimeError("database down")

    monkeypatch.setattr(events.store, "number_committed", down)
    await orders.place_order(world.deps, buyer_id=world.buyer, goods_id=await world.goods())
    stop, wake = asyncio.Event(), asyncio.Event()
    loop = asyncio.create_task(events.run_sequencer(world.deps, stop, wake))
    try:
        # Each time, wait until the loop is asleep: moving the clock before it reads the time
        # for its pause would push the pause out by the move.
        assert await eventually(lambda: failures["n"] == 1 and world.clock.sleepers >= 1)
        world.clock.advance(1.5)  # past the first pause of 1 s, not the second of 2 s
        assert await eventually(lambda: failures["n"] == 2 and world.clock.sleepers >= 1)
        world.clock.advance(1.5)
        assert await eventually(lambda: world.clock.sleepers >= 1)
        assert failures["n"] == 2  # asleep again, waiting out its 2 s
        world.clock.advance(1)
        assert await eventually(lambda: failures["n"] == 3)
    finally:
        stop.set()
        wake.set()
        await asyncio.wait_for(loop, timeout=5)
    tracebacks = [r for r in caplog.records if r.exc_info and "numbering" in r.getMessage()]
    lines = [r for r in caplog.records if "failed 3 times in a row" in r.getMessage()]
    assert len(tracebacks) == 1 and len(lines) == 1


# --- the feed -----------------------------------------------------------------------------------


async def some_events(api: Api) -> None:
    """Events of three orders: two the buyer bought from the seller, one between others."""
    await api.paid_order()
    await api.order()
    other_seller, _ = await accounts.add_user(api.deps, "other-seller")
    goods_id = await accounts.add_goods(
        api.deps, seller_id=other_seller.id, title="kite", price="3.00"
    )
    await orders.place_order(api.deps, buyer_id=api.ids["stranger"], goods_id=goods_id)
    await events.sequence(api.deps)


async def test_pages_follow_the_cursor_each_event_once_in_seq_order(api):
    await some_events(api)
    everything = await events.feed(api.deps, after=0, limit=500)
    assert len(everything) == 5
    for limit in (1, 2, 5):
        fed, last = await read_all(api, limit=limit)
        assert fed == everything
        assert last == feed_api.cursor_of(seq_of(everything[-1]))
    # an empty page hands back the cursor it was given, to poll from
    answer = await api.call("GET", "/api/events", "admin", params={"after": last})
    assert answer.json() == {"events": [], "next": last}


async def test_resuming_from_every_cursor_gives_each_later_event_exactly_once(api):
    await some_events(api)
    everything = await events.feed(api.deps, after=0, limit=500)
    for position in range(len(everything) + 1):
        fed, _ = await read_all(api, after=feed_api.cursor_of(position), limit=2)
        assert [seq_of(e) for e in fed] == [seq_of(e) for e in everything[position:]]


async def test_the_feed_answers_events_in_its_response_model(api):
    await some_events(api)
    answer = await api.call("GET", "/api/events", "admin", params={"limit": 1})
    [event] = answer.json()["events"]
    feed_api.EventPage.model_validate(answer.json())
    assert set(event) == set(feed_api.FeedEvent.model_fields)
    schema_doc = (await api.call("GET", "/openapi.json", None)).json()
    ok = schema_doc["paths"]["/api/events"]["get"]["responses"]["200"]
    assert ok["content"]["application/json"]["schema"]["$ref"].endswith("/EventPage")


async def test_a_buyer_and_a_seller_see_only_their_orders_events(api):
    await some_events(api)
    everything = await events.feed(api.deps, after=0, limit=500)
    async with api.deps.db.read() as conn:
        rows = (await conn.execute(select(schema.orders))).all()
    for who in ("buyer", "seller", "stranger"):
        user_id = api.ids[who]
        mine = {r.id for r in rows if user_id in (r.buyer_id, r.seller_id)}
        fed, _ = await read_all(api, who, limit=2)
        assert mine, who
        assert fed == [e for e in everything if e["order"]["id"] in mine], who
    admin, _ = await read_all(api, "admin")
    assert admin == everything
    assert (await api.call("GET", "/api/events", None)).status_code == 401


async def test_a_short_scoped_page_moves_the_cursor_past_others_events(api):
    """Found in review: a reader with few events got its own cursor back on an empty page and
    rescanned everyone's events on every poll; it now moves past all numbered when it read."""
    await some_events(api)
    nobody, token = await accounts.add_user(api.deps, "nobody")
    api.tokens["nobody"], api.ids["nobody"] = token, nobody.id
    await api.paid_order()  # the last events are the buyer's, none of them nobody's
    await events.sequence(api.deps)
    everything = await events.feed(api.deps, after=0, limit=500)
    answer = await api.call("GET", "/api/events", "nobody", params={"limit": 100})
    page = answer.json()
    assert page["events"] == []
    assert page["next"] == feed_api.cursor_of(seq_of(everything[-1]))
    again = await api.call("GET", "/api/events", "nobody", params={"after": page["next"]})
    assert again.json() == {"events": [], "next": page["next"]}
    # ...and still misses nothing of its own that comes later.
    goods_id = await accounts.add_goods(
        api.deps, seller_id=api.ids["seller"], title="cup", price="2.00"
    )
    order_id = await orders.place_order(api.deps, buyer_id=nobody.id, goods_id=goods_id)
    await events.sequence(api.deps)
    later = await api.call("GET", "/api/events", "nobody", params={"after": page["next"]})
    assert [e["order"]["id"] for e in later.json()["events"]] == [order_id]


@pytest.mark.parametrize(
    "params",
    [
        {"after": "not-a-cursor"},
        {"after": "ZTE"[:-1]},  # cut short
        {"after": feed_api.cursor_of(5) + "="},  # not the form this feed gives
        {"after": "ZS0x"},  # "e-1"
        {"after": "x" * 65},
        {"limit": 0},
        {"limit": 501},
        {"limit": "ten"},
    ],
)
async def test_a_malformed_cursor_or_limit_is_422_and_changes_nothing(api, params):
    await some_events(api)
    before = await table_snapshot(api.deps)
    answer = await api.call("GET", "/api/events", "admin", params=params)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "invalid_input"
    assert await table_snapshot(api.deps) == before


def test_cursors_round_trip_and_are_opaque():
    for seq in (0, 1, 42, 2**63 - 1):
        cursor = feed_api.cursor_of(seq)
        assert str(seq) not in cursor
        assert feed_api.position_of(cursor) == seq
    assert feed_api.position_of(None) == 0


async def test_the_default_limit_is_100(api):
    order_id = await api.order()
    async with api.deps.db.write() as conn:
        entries = [(order_id, str(n)) for n in range(150)]
        await events.store.record_each(conn, entries, event="x", actor="test", now=START)
    await events.sequence(api.deps)
    answer = await api.call("GET", "/api/events", "admin")
    assert len(answer.json()["events"]) == 100


async def test_the_migration_numbers_the_events_recorded_before_it(tmp_path):
    db = Database.from_url(f"sqlite:///{tmp_path / 'old.db'}")
    try:
        await migrate.upgrade(db, "0006")
        async with db.engine.begin() as conn:
            for statement in OLD_ROWS:
                await conn.execute(text(statement))
        await migrate.upgrade(db, "0007")
        async with db.read() as conn:
            seqs = (await conn.execute(text("SELECT id, seq FROM order_events"))).all()
            last = (await conn.execute(text("SELECT id, last_seq FROM event_sequence"))).all()
        assert [tuple(r) for r in seqs] == [(1, 1), (2, 2)]
        assert [tuple(r) for r in last] == [(1, 2)]
    finally:
        await db.dispose()


T = "'2026-03-01 12:00:00.000000'"
OLD_ROWS = [
    f"INSERT INTO users (id, name, token_hash, is_admin, created_at) VALUES (1, 'a', 'h', 0, {T})",
    "INSERT INTO goods (id, seller_id, title, price, status, created_at, updated_at) "
    f"VALUES (1, 1, 't', 1, 'on_sale', {T}, {T})",
    "INSERT INTO orders (id, profile, order_type, buyer_id, seller_id, goods_id, amount, status, "
    f"created_at, pay_deadline, updated_at) VALUES (1, 'marketplace', 'normal', 1, 1, 1, 1, "
    f"'pending_payment', {T}, {T}, {T})",
    f"INSERT INTO order_events (order_id, at, event, actor) VALUES (1, {T}, 'place', 'x')",
    f"INSERT INTO order_events (order_id, at, event, actor) VALUES (1, {T}, 'pay', 'x')",
]
