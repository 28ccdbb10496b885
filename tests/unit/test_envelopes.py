"""The envelope (docs/events.md), on every backend: each flow's moves are run and every event
type the code writes is collected from the feed, each envelope validated against the schema the
OpenAPI document publishes; each snapshot equals the order view fetched right after the move;
the buyer notices carry the envelope too; the actor grammar is parsed."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from dueflow.domain.events import EventType, actor_of
from dueflow.payments.base import RefundResult, VerifiedPayment
from dueflow.service import events, given_back, refunds, webhooks
from dueflow.service import payments as payment_service
from dueflow.store import events as event_store
from dueflow.store import payments as payment_store
from dueflow.store import schema
from tests.envelopes import DOC, invalid, seq_of, user
from tests.unit.api import Api
from tests.unit.api.shop_world import new_flash_sale, new_sku, shop_api
from tests.unit.test_docs_events import write_examples

SNAPSHOT_KEYS = ("lines", "tickets", "payments", "refunds")


@pytest.fixture
async def api(backend_world: Any):
    async with shop_api(backend_world.deps) as found:
        found.world = backend_world  # type: ignore[attr-defined]
        yield found


async def feed(api: Api) -> list[dict[str, Any]]:
    await events.sequence(api.deps)
    answer = await api.call("GET", "/api/events", "admin", params={"limit": 500})
    assert answer.status_code == 200, answer.text
    return list(answer.json()["events"])


async def same_as_view(api: Api, *order_ids: int) -> None:
    """The newest event of each order carries the order as its view shows it now."""
    fed = await feed(api)
    for order_id in order_ids:
        newest = [e for e in fed if e["order"]["id"] == order_id][-1]
        view = (await api.call("GET", f"/api/orders/{order_id}", "admin")).json()
        expected = {k: v for k, v in view.items() if k in newest["order"]}
        assert set(newest["order"]) == set(expected), set(view) - set(newest["order"])
        assert newest["order"] == expected, newest["type"]
        for key in SNAPSHOT_KEYS:
            assert key in newest["order"]


async def pay(api: Api, order_id: int) -> None:
    answer = await api.call(
        "POST", f"/api/orders/{order_id}/payments", "buyer", json={"provider": "fakepay"}
    )
    assert answer.status_code == 201, answer.text
    async with api.deps.db.read() as conn:
        attempt = await payment_store.by_pay_no(conn, answer.json()["pay_no"])
    paid = VerifiedPayment(pay_no=attempt.pay_no, amount=attempt.amount)
    await payment_service.confirm_payment(api.deps, paid, actor="fakepay")


async def test_every_type_written_is_published_and_each_snapshot_is_the_view(api):
    world = api.world  # type: ignore[attr-defined]
    # A marketplace order's whole life, each move checked against the view right after it.
    order_id = await api.order()
    await same_as_view(api, order_id)
    await pay(api, order_id)
    await same_as_view(api, order_id)
    answer = await api.call(
        "POST", f"/api/orders/{order_id}/ship", "seller", json={"carrier": "SF", "tracking_no": "1"}
    )
    assert answer.status_code == 200
    await same_as_view(api, order_id)
    assert (await api.call("POST", f"/api/orders/{order_id}/confirm-receipt", "buyer")).is_success
    await same_as_view(api, order_id)
    for who in ("buyer", "seller"):
        answer = await api.call("POST", f"/api/orders/{order_id}/reviews", who, json={"rating": 5})
        assert answer.status_code == 201, answer.text
        await same_as_view(api, order_id)

    # Cancels: the buyer's, the seller's (a refund), its refund's life; a late payment.
    unpaid = await api.order()
    assert (await api.call("POST", f"/api/orders/{unpaid}/cancel", "buyer")).is_success
    await same_as_view(api, unpaid)
    refund_ids = [await api.refund() for _ in range(3)]
    api.provider.refund_answers = [RefundResult.FAILED, RefundResult.SUCCEEDED]
    assert await refunds.approve(api.deps, refund_ids[0]) == "failed"
    assert await refunds.retry(api.deps, refund_ids[0]) == "succeeded"
    await refunds.reject(api.deps, refund_ids[1], reason="asked twice")
    await refunds.settle_offline(api.deps, refund_ids[2], reference="bank 42")
    async with api.deps.db.read() as conn:
        refunded = [(await payment_store.refund_by_id(conn, r)).order_id for r in refund_ids]
    await same_as_view(api, *refunded)
    late = await api.order()
    assert (await api.call("POST", f"/api/orders/{late}/cancel", "buyer")).is_success
    await payment_service.record_manual_payment(api.deps, order_id=late, amount="12.50")
    await same_as_view(api, late)

    # A provider's own refund of an attempt.
    given = await api.order()
    answer = await api.call(
        "POST", f"/api/orders/{given}/payments", "buyer", json={"provider": "fakepay"}
    )
    async with api.deps.db.read() as conn:
        attempt = await payment_store.by_pay_no(conn, answer.json()["pay_no"])
    await given_back.record(api.deps, [(attempt, attempt.amount)], world.clock.now())
    await same_as_view(api, given)

    # Tickets: paid, checked in at the door, then the organizer cancels the show (the worker
    # cancels each order).
    show_id = await api.show()
    ticket = await api.ticket_order(show_id, ["A-1"])
    await pay(api, ticket)
    await same_as_view(api, ticket)
    code = (await api.call("GET", f"/api/orders/{ticket}", "buyer")).json()["tickets"][0]["code"]
    answer = await api.call(
        "POST", f"/api/tickets/{code}/check-in", "seller", json={"gate": "North"}
    )
    assert answer.status_code == 200, answer.text
    await same_as_view(api, ticket)
    assert (await api.call("POST", f"/api/shows/{show_id}/cancel", "seller")).is_success
    await world.worker.drain()
    await same_as_view(api, ticket)

    # A flash sale's order: reminded to pay (a notice), then closed unpaid (another).
    flash = await flash_order(api)
    world.clock.advance(timedelta(minutes=3))
    await world.worker.drain()
    assert [r.kind for r in world.notifier.sent if r.order_id == flash] == ["pay_reminder"]

    # Deadlines: unpaid, unshipped, unreceived, unreviewed.
    timed = [await api.order(), await api.paid_order(), await api.shipped(), await api.received()]
    for _ in range(3):
        world.clock.advance(timedelta(days=30))
        await world.worker.drain()
    await same_as_view(api, *timed)

    # An operator skips an event the webhook host refuses for good.
    async with api.deps.db.write() as conn:
        await event_store.ensure_live(conn, world.clock.now())
    waiting = (await feed(api))[0]
    await webhooks.skip(api.deps, seq=seq_of(waiting), actor="operator")

    fed = await feed(api)
    if os.environ.get("DUEFLOW_TEST_WRITE_EVENT_EXAMPLES") and api.deps.db.dialect == "sqlite":
        write_examples([*fed, *(dict(r.envelope or {}) for r in world.notifier.sent)])
    problems = {e["id"]: invalid(e) for e in fed if invalid(e)}
    assert problems == {}
    written = {e["type"] for e in fed}
    notices = [r.envelope for r in world.notifier.sent]
    assert all(n is not None and invalid(dict(n)) == [] for n in notices), notices
    written |= {n["type"] for n in notices if n is not None}
    assert sorted(set(EventType) - written) == []
    by_type = {e["type"]: e for e in fed}
    assert by_type["pay"]["data"]["provider"] == "fakepay"
    assert by_type["refund_submitted"]["data"]["amount"] == "12.50"
    assert by_type["pay_timeout"]["actor"] == {"type": "system", "name": "timer"}
    assert by_type["event_skipped"]["actor"] == {"type": "operator", "name": "operator"}
    checked_in = by_type["ticket_checked_in"]
    assert checked_in["data"] == {"show_id": show_id, "seat": "A-1", "code": code, "gate": "North"}
    assert checked_in["order"]["tickets"][0]["gate"] == "North"


async def flash_order(api: Api) -> int:
    sale_id = await new_flash_sale(api, await new_sku(api, stock=5), stock=5)
    body = {"flash_sale_id": sale_id, "quantity": 1}
    answer = await api.call("POST", "/api/orders", "buyer", json=body)
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


async def test_notices_carry_the_envelope_with_the_delivery_id(api):
    world = api.world  # type: ignore[attr-defined]
    order_id = await flash_order(api)
    world.clock.advance(timedelta(minutes=3))
    await world.worker.drain()
    world.clock.advance(timedelta(minutes=3))
    await world.worker.drain()
    sent = {r.kind: r for r in world.notifier.sent if r.order_id == order_id}
    assert set(sent) == {"pay_reminder", "order_closed"}
    for kind, reminder in sent.items():
        envelope = dict(reminder.envelope or {})
        assert invalid(envelope) == []
        assert (envelope["id"], envelope["type"]) == (f"ntc_{reminder.reminder_id}", kind)
        assert envelope["order"]["id"] == order_id
    assert sent["order_closed"].envelope["data"]["reason"] == "pay_timeout"  # type: ignore[index]
    assert sent["order_closed"].envelope["order"]["status"] == "cancelled_unpaid"  # type: ignore[index]


async def test_a_keys_events_name_it_as_their_actor(api):
    """A service key on an admin route: acting for nobody its events' actor is the key; acting
    for a host user (Dueflow-Act-As) the user with the key; both valid against the schema."""
    made = await api.call(
        "POST", "/api/admin/keys", "admin", json={"name": "host", "scopes": ["admin"]}
    )
    assert made.status_code == 201, made.text
    key_id, secret = made.json()["id"], made.json()["secret"]
    order_ids = []
    for act_as in ({}, {"Dueflow-Act-As": "ops-1"}):
        refund_id = await api.refund()
        answer = await api.call(
            "POST",
            f"/api/admin/refunds/{refund_id}/reject",
            None,
            json={"reason": "kept"},
            headers={"Authorization": f"Bearer {secret}", **act_as},
        )
        assert answer.status_code == 200, answer.text
        async with api.deps.db.read() as conn:
            order_ids.append((await payment_store.refund_by_id(conn, refund_id)).order_id)
    async with api.deps.db.read() as conn:
        query = select(schema.users.c.id).where(schema.users.c.external_id == "ops-1")
        ops = (await conn.execute(query)).scalar_one()
    rejected = {e["order"]["id"]: e for e in await feed(api) if e["type"] == "refund_rejected"}
    assert [invalid(rejected[o]) for o in order_ids] == [[], []]
    assert [rejected[o]["actor"] for o in order_ids] == [
        {"type": "key", "key_id": key_id},
        user(ops, key_id),
    ]


def test_the_document_publishes_both_bodies_as_webhooks():
    """OpenAPI 3.1 ``webhooks``: the events webhook's and the notices' bodies are envelopes,
    and what the host answers is its own (no FastAPI 422 model)."""
    webhooks = json.loads(DOC.read_text())["webhooks"]
    assert set(webhooks) == {"order-event", "buyer-notice"}
    for hook in webhooks.values():
        body = hook["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": "#/components/schemas/Envelope"}
        assert "422" not in hook["post"]["responses"]


@pytest.mark.parametrize(
    ("actor", "parsed"),
    [
        ("user:5", {"type": "user", "user_id": 5, "key_id": None}),
        ("user:5@key:3", {"type": "user", "user_id": 5, "key_id": 3}),
        ("key:3", {"type": "key", "key_id": 3}),
        ("operator", {"type": "operator", "name": "operator"}),
        ("timer", {"type": "system", "name": "timer"}),
        ("alipay", {"type": "system", "name": "alipay"}),
        ("close_or_query", {"type": "system", "name": "close_or_query"}),
        ("user:x", {"type": "system", "name": "user:x"}),
        ("user:5@key:x", {"type": "system", "name": "user:5@key:x"}),
        ("key:", {"type": "system", "name": "key:"}),
    ],
)
def test_the_actor_grammar(actor, parsed):
    assert actor_of(actor) == parsed
