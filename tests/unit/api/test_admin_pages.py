"""The /admin pages over the ASGI app: the session, cross-site protection, and each page and
action against the real services on SQLite with a FakeClock (the browser test is in e2e)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest

from dueflow.api.app import create_app
from dueflow.service import accounts, orders, payments, refunds
from tests.unit.test_refunds import unshipped_refund

BASE = "http://dueflow"


@pytest.fixture
async def admin(world) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """A client and an admin token (not yet logged in)."""
    _, token = await accounts.add_user(world.deps, "root", admin=True)
    app = create_app(world.deps, session_secret="s" * 32, session_ttl=timedelta(hours=1))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as client:
        yield client, token


async def log_in(client: httpx.AsyncClient, token: str) -> None:
    answer = await client.post("/admin/login", data={"token": token, "next": "/admin"})
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == "/admin"


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf" value="([0-9a-f]{64})"', html).group(1)


async def test_pages_need_a_session_and_send_you_to_log_in(admin):
    client, _ = admin
    for path in ("/admin", "/admin/refunds", "/admin/timers", "/admin/orders/1"):
        answer = await client.get(path)
        assert answer.status_code == 303
        assert answer.headers["location"].startswith("/admin/login?next=/admin")
    page = await client.get("/admin/login")
    assert page.status_code == 200
    assert 'name="token"' in page.text
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]


async def test_only_an_admin_token_opens_a_session(admin, world):
    client, _ = admin
    _, user_token = await accounts.add_user(world.deps, "plain")
    for token in ("", "nonsense", user_token):
        answer = await client.post("/admin/login", data={"token": token})
        assert answer.status_code == 401
        assert "not an admin token" in answer.text
        assert "dueflow_admin" not in answer.cookies
    assert (await client.get("/admin")).status_code == 303


async def test_the_session_cookie_is_http_only_same_site_and_signed(admin):
    client, token = admin
    answer = await client.post("/admin/login", data={"token": token})
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    assert token not in cookie
    value = client.cookies["dueflow_admin"]
    user_id, expires, signature = value.split(".")
    client.cookies.set("dueflow_admin", f"{user_id}.{int(expires) + 3600}.{signature}")
    assert (await client.get("/admin")).status_code == 303  # a forged expiry is refused


async def test_a_session_ends_when_it_expires_or_the_token_is_replaced(admin, world):
    client, token = admin
    await log_in(client, token)
    assert (await client.get("/admin")).status_code == 200
    world.clock.advance(timedelta(hours=1, seconds=1))
    assert (await client.get("/admin")).status_code == 303
    await log_in(client, token)
    await accounts.issue_token(world.deps, "root")
    assert (await client.get("/admin")).status_code == 303


async def test_login_redirects_only_to_admin_pages(admin):
    client, token = admin
    for target in ("https://evil.example/", "//evil.example/admin", "/api/admin/users"):
        answer = await client.post("/admin/login", data={"token": token, "next": target})
        assert answer.headers["location"] == "/admin"


async def test_the_dashboard_counts_orders_timers_and_lateness(admin, world):
    client, token = admin
    order_id = await orders.place_order(
        world.deps, buyer_id=world.buyer, goods_id=await world.goods()
    )
    world.clock.advance(timedelta(minutes=30, seconds=3))
    await world.worker.drain()
    await log_in(client, token)
    page = await client.get("/admin")
    assert page.status_code == 200
    assert "cancelled_unpaid" in page.text
    lateness = page.text[page.text.index('id="lateness"') :]
    # the cancel fired 3 s (3000 ms) after its deadline
    assert re.search(
        r"<td>cancel_unpaid</td><td class=\"num\">1</td><td class=\"num\">3000</td>", lateness
    )
    assert "<b>hold</b> invariants" in page.text
    order_page = await client.get(f"/admin/orders/{order_id}")
    assert order_page.status_code == 200
    assert "cancel_unpaid" in order_page.text and "timer" in order_page.text
    assert (await client.get("/admin/orders/999")).status_code == 404
    assert (await client.get("/admin/orders/abc")).status_code == 404


async def test_approving_a_refund_needs_the_forms_csrf_token(admin, world):
    client, token = admin
    order_id, refund_id = await unshipped_refund(world)
    await log_in(client, token)
    page = await client.get("/admin/refunds?state=pending_review")
    assert f"/admin/refunds/{refund_id}/approve" in page.text
    for forged in ({}, {"csrf": "0" * 64}):
        refused = await client.post(f"/admin/refunds/{refund_id}/approve", data=forged)
        assert refused.status_code == 403
    assert (await refunds.list_refunds(world.deps, state="pending_review"))[0]["id"] == refund_id

    done = await client.post(
        f"/admin/refunds/{refund_id}/approve",
        data={"csrf": csrf_of(page.text), "back": "/admin/refunds?state=pending_review"},
    )
    assert done.status_code == 303
    assert done.headers["location"] == "/admin/refunds?state=pending_review"
    [refund] = await refunds.list_refunds(world.deps)
    assert refund["state"] == "succeeded"  # the manual provider refunds at once
    after = await client.get(done.headers["location"])
    assert f"Refund {refund_id} approved" in after.text

    again = await client.post(
        f"/admin/refunds/{refund_id}/approve", data={"csrf": csrf_of(page.text), "back": "/admin"}
    )
    assert again.status_code == 303
    assert "Refused:" in (await client.get("/admin")).text
    assert (await orders.order_view(world.deps, order_id))["refunds"][0]["state"] == "succeeded"


async def test_a_csrf_token_from_another_session_is_refused(admin, world):
    client, token = admin
    _, refund_id = await unshipped_refund(world)
    await log_in(client, token)
    stale = csrf_of((await client.get("/admin")).text)
    await log_in(client, token)  # a new session (a later expiry): a new CSRF token
    world.clock.advance(timedelta(seconds=5))
    await log_in(client, token)
    answer = await client.post(f"/admin/refunds/{refund_id}/approve", data={"csrf": stale})
    assert answer.status_code == 403
    assert (await refunds.list_refunds(world.deps))[0]["state"] == "pending_review"


async def test_run_now_fires_a_stuck_timer(admin, world):
    client, token = admin
    order_id = await orders.place_order(
        world.deps, buyer_id=world.buyer, goods_id=await world.goods()
    )
    world.notifier.fail_with = OSError("the webhook is down")
    for _ in range(5):  # the reminder is due at 5 min; backoffs of 30 s to 4 min in between
        world.clock.advance(timedelta(minutes=5))
        await world.worker.drain()
    [reminder] = [
        t
        for t in (await orders.order_view(world.deps, order_id))["timers"]
        if t["kind"] == "pay_reminder"
    ]
    assert reminder["stuck"] and reminder["state"] == "scheduled"
    await log_in(client, token)
    order_page = (await client.get(f"/admin/orders/{order_id}")).text
    assert order_page.count("/run-now") == 1  # the cancel's deadline (30 min) is still ahead
    page = await client.get("/admin/timers?state=stuck")
    assert f"/admin/timers/{reminder['id']}/run-now" in page.text
    world.notifier.fail_with = None
    answer = await client.post(
        f"/admin/timers/{reminder['id']}/run-now",
        data={"csrf": csrf_of(page.text), "back": "/admin/timers?state=stuck"},
    )
    assert answer.status_code == 303
    await world.worker.drain()
    assert len(world.notifier.sent) == 1
    [reminder] = [
        t
        for t in (await orders.order_view(world.deps, order_id))["timers"]
        if t["kind"] == "pay_reminder"
    ]
    assert reminder["state"] == "done"
    refused = await client.post(
        f"/admin/timers/{reminder['id']}/run-now", data={"csrf": csrf_of(page.text)}
    )
    assert refused.status_code == 303
    assert "is done, not waiting" in (await client.get("/admin")).text


async def test_logout_ends_the_session(admin):
    client, token = admin
    await log_in(client, token)
    page = await client.get("/admin")
    assert (await client.post("/admin/logout")).status_code == 403
    answer = await client.post("/admin/logout", data={"csrf": csrf_of(page.text)})
    assert answer.status_code == 303
    assert (await client.get("/admin")).status_code == 303


async def test_the_json_run_now_and_summary_routes(admin, world):
    client, token = admin
    order_id = await orders.place_order(
        world.deps, buyer_id=world.buyer, goods_id=await world.goods()
    )
    await payments.record_manual_payment(world.deps, order_id=order_id, amount="12.50")
    headers = {"Authorization": f"Bearer {token}"}
    [ship] = [
        t
        for t in (await orders.order_view(world.deps, order_id))["timers"]
        if t["state"] == "scheduled"
    ]
    # Run now never fires a timer before its deadline (it would act early).
    early = await client.post(f"/api/admin/timers/{ship['id']}/run-now", headers=headers)
    assert early.status_code == 409
    assert "not due: its deadline is 2026-03-04 12:00:00 UTC" in early.json()["error"]["message"]
    world.clock.advance(timedelta(days=3, seconds=1))
    answer = await client.post(f"/api/admin/timers/{ship['id']}/run-now", headers=headers)
    assert answer.status_code == 200
    assert answer.json()["due_at"].startswith("2026-03-04T12:00:01")
    await world.worker.drain()
    assert (await orders.order_view(world.deps, order_id))["status"] == "cancelled_unshipped"
    again = await client.post(f"/api/admin/timers/{ship['id']}/run-now", headers=headers)
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "timer_not_waiting"
    missing = await client.post("/api/admin/timers/424242/run-now", headers=headers)
    assert missing.status_code == 404
    summary = (await client.get("/api/admin/summary", headers=headers)).json()
    assert summary["orders"] == {"cancelled_unshipped": 1}
    assert summary["invariants"]["ok"] is True
    assert summary["refunds"] == {"pending_review": 1}
    # the cancel fired a second late; its notice, due at the cancel, went out at once
    late = {row["kind"]: row["p50"] for row in summary["lateness_last_hour"]}
    assert late == {"cancel_unshipped": 1.0, "order_closed": 0.0}


@pytest.mark.parametrize(
    "cookie",
    [
        "4.99999999999.é",  # non-ASCII signature
        "²." + "9" * 10 + "." + "a" * 64,  # a digit int() refuses
        "9" * 5000 + ".1." + "a" * 64,  # more digits than int() takes
        "1.2",
        "",
    ],
)
async def test_a_malformed_session_cookie_is_no_session(admin, cookie):
    client, _ = admin
    raw = f"dueflow_admin={cookie}".encode()  # as bytes: a browser may send anything
    answer = await client.get("/admin", headers=[(b"cookie", raw)])
    assert answer.status_code == 303
    assert answer.headers["location"].startswith("/admin/login")


async def test_malformed_ids_forms_and_bodies_are_refused_cleanly(admin, world):
    client, token = admin
    _, refund_id = await unshipped_refund(world)
    await log_in(client, token)
    for path in ("/admin/orders/²", "/admin/orders/" + "9" * 5000):
        assert (await client.get(path)).status_code == 404
    found = await client.get("/admin/orders?id=€")
    assert found.status_code == 303  # back to the dashboard with a message
    assert "is not an order number" in (await client.get("/admin")).text
    refused = await client.post(f"/admin/refunds/{refund_id}/approve", data={"csrf": "é"})
    assert refused.status_code == 403
    many = "&".join(f"f{i}=x" for i in range(30))
    crowded = await client.post(
        "/admin/login",
        content=many.encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert crowded.status_code == 401
    huge = await client.post("/admin/login", content=b"token=" + b"x" * 2_000_000)
    assert huge.status_code == 413
    assert (await refunds.list_refunds(world.deps))[0]["state"] == "pending_review"
