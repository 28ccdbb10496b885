"""The happy path of every /api route, in process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from dueflow.payments.base import RefundResult
from dueflow.store import schema, timers
from tests.unit.api import Api, running_api, table_snapshot


@pytest.fixture
async def api(world) -> AsyncIterator[Api]:
    async with running_api(world.deps) as api:
        yield api


async def test_goods_are_added_and_read_with_money_as_strings(api):
    answer = await api.call("POST", "/api/goods", "seller", json={"title": "tent", "price": "88"})
    assert answer.status_code == 201, answer.text
    goods = answer.json()
    assert goods["price"] == "88.00"
    assert goods["seller_id"] == api.ids["seller"]
    answer = await api.call("GET", f"/api/goods/{goods['id']}", "stranger")
    assert answer.status_code == 200
    assert answer.json()["title"] == "tent"


async def test_an_order_is_placed_viewed_and_paid(api):
    goods_id = await api.goods()
    answer = await api.call("POST", "/api/orders", "buyer", json={"goods_id": goods_id})
    assert answer.status_code == 201
    order = answer.json()
    assert (order["status"], order["amount"]) == ("pending_payment", "12.50")
    assert order["pay_deadline"].endswith("+00:00")
    answer = await api.call("GET", f"/api/orders/{order['id']}", "seller")
    assert answer.status_code == 200
    assert [e["event"] for e in answer.json()["timeline"]] == ["place"]
    # the 201 answer (read inside the placing transaction) is the order's view as GET shows it
    assert answer.json() == order
    assert [t["kind"] for t in order["timers"]] == ["cancel_unpaid", "pay_reminder"]
    answer = await api.call(
        "POST", f"/api/orders/{order['id']}/payments", "buyer", json={"provider": "fakepay"}
    )
    assert answer.status_code == 201
    assert answer.json()["pay_url"] == f"https://pay.example/{answer.json()['pay_no']}"


async def test_a_second_order_for_held_goods_is_a_conflict(api):
    goods_id = await api.goods()
    await api.call("POST", "/api/orders", "buyer", json={"goods_id": goods_id})
    answer = await api.call("POST", "/api/orders", "stranger", json={"goods_id": goods_id})
    assert answer.status_code == 409
    assert answer.json()["error"]["code"] == "goods_unavailable"


async def test_a_buyer_cannot_pick_the_order_type(api):
    """The order type sets the buyer's own deadlines: the server picks it from what is bought,
    and a body naming one is refused as an unknown field, changing no row."""
    show_id = await api.show()
    bodies = {
        "normal": {"goods_id": await api.goods()},
        "ticket": {"show_id": show_id, "seats": ["A-1"]},
        "shop": {"lines": [{"sku_id": await api.sku(), "quantity": 1}]},
        "flash": {"flash_sale_id": await api.flash_sale(), "quantity": 1},
    }
    before = await table_snapshot(api.deps)
    for body in bodies.values():
        for chosen in ("normal", "flash", "shop", "ticket", ""):
            answer = await api.call(
                "POST", "/api/orders", "buyer", json={**body, "order_type": chosen}
            )
            assert answer.status_code == 422, answer.text
            error = answer.json()["error"]
            assert error["code"] == "invalid_input"
            assert "order_type" in error["message"], error
    assert await table_snapshot(api.deps) == before
    for picked, body in bodies.items():
        answer = await api.call("POST", "/api/orders", "buyer", json=body)
        assert answer.status_code == 201, answer.text
        assert answer.json()["order_type"] == picked


async def test_the_buyer_cancels_before_paying(api):
    order_id = await api.order()
    answer = await api.call("POST", f"/api/orders/{order_id}/cancel", "buyer")
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"].startswith("cancel")


async def test_ship_receive_review_to_completion(api):
    order_id = await api.paid_order()
    answer = await api.call(
        "POST",
        f"/api/orders/{order_id}/ship",
        "seller",
        json={"carrier": "SF", "tracking_no": "SF123"},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "shipped"
    answer = await api.call("POST", f"/api/orders/{order_id}/confirm-receipt", "buyer")
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "received"
    for who in ("buyer", "seller"):
        answer = await api.call(
            "POST", f"/api/orders/{order_id}/reviews", who, json={"rating": 5, "comment": "ok"}
        )
        assert answer.status_code == 201, answer.text
        assert answer.json()["role"] == who
    assert answer.json()["order"]["status"] == "completed"
    answer = await api.call("POST", f"/api/orders/{order_id}/reviews", "buyer", json={"rating": 4})
    assert answer.status_code == 409


async def test_the_seller_cancels_and_an_admin_approves_the_refund(api):
    refund_id = await api.refund()
    answer = await api.call("GET", "/api/admin/refunds?state=pending_review", "admin")
    assert answer.status_code == 200
    assert [r["id"] for r in answer.json()] == [refund_id]
    assert answer.json()[0]["amount"] == "12.50"
    answer = await api.call("POST", f"/api/admin/refunds/{refund_id}/approve", "admin")
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"id": refund_id, "state": "succeeded"}


async def test_a_failed_refund_is_retried(api):
    refund_id = await api.refund()
    api.provider.refund_answers = [RefundResult.FAILED]
    answer = await api.call("POST", f"/api/admin/refunds/{refund_id}/approve", "admin")
    assert answer.json()["state"] == "failed"
    answer = await api.call("POST", f"/api/admin/refunds/{refund_id}/retry", "admin")
    assert answer.status_code == 200, answer.text
    assert answer.json()["state"] == "succeeded"
    answer = await api.call("POST", f"/api/admin/refunds/{refund_id}/retry", "admin")
    assert answer.status_code == 409


async def test_an_admin_adds_users_who_can_then_call(api):
    answer = await api.call("POST", "/api/admin/users", "admin", json={"name": "carol"})
    assert answer.status_code == 201
    created = answer.json()
    assert (created["name"], created["admin"]) == ("carol", False)
    answer = await api.client.get(
        "/api/goods/1", headers={"Authorization": f"Bearer {created['token']}"}
    )
    assert answer.status_code in (200, 404)
    answer = await api.call("POST", "/api/admin/users", "admin", json={"name": "carol"})
    assert answer.status_code == 422


async def test_admin_sees_overdue_and_stuck_timers_and_discrepancies(api, world):
    order_id = await api.order()
    answer = await api.call("GET", "/api/admin/overdue", "admin")
    assert answer.status_code == 200 and answer.json() == []
    world.clock.advance(timedelta(days=30))
    answer = await api.call("GET", "/api/admin/overdue", "admin")
    overdue = answer.json()
    assert {t["order_id"] for t in overdue} == {order_id}
    assert {t["order_status"] for t in overdue} == {"pending_payment"}
    async with api.deps.db.write() as conn:
        await conn.execute(update(schema.timers).values(stuck=True))
    answer = await api.call("GET", "/api/admin/timers?state=stuck", "admin")
    assert answer.status_code == 200
    assert {t["order_id"] for t in answer.json()} == {order_id}
    answer = await api.call("GET", "/api/admin/timers?state=done", "admin")
    assert answer.json() == []
    answer = await api.call("GET", "/api/admin/discrepancies", "admin")
    assert answer.status_code == 200 and answer.json() == []


#: What the parties see of a timer; the claim and the last error are the operators'.
PARTY_TIMER = {
    "id",
    "order_id",
    "kind",
    "deadline_at",
    "due_at",
    "state",
    "attempts",
    "stuck",
    "outcome",
    "created_at",
    "done_at",
}


async def test_the_parties_never_see_timer_internals_the_admin_api_does(api, world):
    """A claimed timer (its token and lease) and a failed one (its last error) of an order: the
    order's answers (placed, replayed, read by buyer, seller or admin, acted on) carry neither;
    /api/admin/timers keeps them."""
    goods_id = await api.goods()
    key = {"Idempotency-Key": "order-1"}
    body = {"goods_id": goods_id}
    placed = await api.call("POST", "/api/orders", "buyer", json=body, headers=key)
    assert placed.status_code == 201, placed.text
    order_id = placed.json()["id"]
    world.notifier.fail_with = OSError("the webhook at 10.0.0.7 is down")
    world.clock.advance(timedelta(minutes=5))
    await world.worker.drain()  # the reminder fails: retried later, its error kept
    world.clock.advance(timedelta(minutes=25))
    async with api.deps.db.write() as conn:
        row = (
            await conn.execute(
                select(schema.timers.c.id).where(
                    schema.timers.c.order_id == order_id,
                    schema.timers.c.kind == "cancel_unpaid",
                )
            )
        ).one()
        [claimed] = await timers.claim_ids(
            conn, [row.id], now=world.clock.now(), lease=api.deps.lease
        )
    answers = [placed]
    answers.append(await api.call("POST", "/api/orders", "buyer", json=body, headers=key))
    for who in ("buyer", "seller", "admin"):
        answers.append(await api.call("GET", f"/api/orders/{order_id}", who))
    for answer in answers:
        assert answer.status_code in (200, 201), answer.text
        views = answer.json()["timers"]
        assert {t["kind"] for t in views} == {"cancel_unpaid", "pay_reminder"}
        assert all(set(t) == PARTY_TIMER for t in views), views
        assert claimed.token not in answer.text and "10.0.0.7" not in answer.text
    shown = await api.call("GET", f"/api/orders/{order_id}", "buyer")
    states = {t["kind"]: (t["state"], t["attempts"]) for t in shown.json()["timers"]}
    assert states == {"cancel_unpaid": ("claimed", 1), "pay_reminder": ("scheduled", 1)}
    admin = await api.call("GET", "/api/admin/timers?state=claimed", "admin")
    assert [(t["order_id"], t["claim_token"]) for t in admin.json()] == [(order_id, claimed.token)]
    assert admin.json()[0]["lease_until"] is not None
    admin = await api.call("GET", "/api/admin/timers?state=scheduled", "admin")
    [reminder] = [t for t in admin.json() if t["order_id"] == order_id]
    assert "10.0.0.7" in reminder["last_error"]
    cancelled = await api.call("POST", f"/api/orders/{order_id}/cancel", "buyer")
    assert cancelled.status_code == 200, cancelled.text
    assert all(set(t) == PARTY_TIMER for t in cancelled.json()["timers"])
    assert "10.0.0.7" not in cancelled.text
