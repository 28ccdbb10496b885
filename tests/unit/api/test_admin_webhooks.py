"""The webhook endpoints' admin page (``/admin/webhooks``) through the ASGI app, on the three
databases with a FakeClock: the list with each endpoint's filter, state and deliveries (a real
receiver that refuses connections makes the failures), every action, the secret shown on the
answer to make and rotate only (never on another page, in a cookie or in the logs), and bad
input refused with a 4xx that changes nothing."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import select

from dueflow.api import admin_pages
from dueflow.api.app import create_app
from dueflow.notifiers.event_webhook import EventWebhook
from dueflow.service import accounts, events, webhook_endpoints, webhooks
from dueflow.store.schema import event_deliveries
from tests.conftest import table_snapshot
from tests.envelopes import seq_of
from tests.unit.api.test_admin_pages import BASE, csrf_of, log_in
from tests.unit.test_event_webhooks import unused_port
from tests.unit.test_webhook_endpoints import orders_and_cancels

PUBLIC = "http://93.184.216.34/hooks"  # a public address: no name to resolve, nothing sent
SECRET = re.compile(r"whsec_[A-Za-z0-9+/=]+")


@pytest.fixture
async def admin(backend_world) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """A client logged in as an admin, and the CSRF token of its session."""
    _, token = await accounts.add_user(backend_world.deps, "root", admin=True)
    app = create_app(backend_world.deps, session_secret="s" * 32, session_ttl=timedelta(hours=1))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as client:
        await log_in(client, token)
        client.headers["Authorization"] = f"Bearer {token}"  # for the JSON routes too
        yield client, csrf_of((await client.get("/admin/webhooks")).text)


def secret_on(page: httpx.Response) -> str:
    [secret] = set(SECRET.findall(page.text))
    return secret


async def everywhere(client: httpx.AsyncClient, world, endpoint_id: int) -> str:
    """Every admin page a GET reaches (ids filled with the endpoint's) and the endpoint's JSON
    answers, with their headers, as one text."""
    routes = admin_pages.router(world.deps).routes
    pages = {r.path for r in routes if "GET" in getattr(r, "methods", ())}
    assert {"/admin", "/admin/webhooks"} <= pages and len(pages) > 10
    paths = [re.sub(r"\{[^}]+\}", str(endpoint_id), path) for path in sorted(pages)]
    answers = [await client.get(path) for path in paths]
    for path in ("/admin/webhooks", "/api/admin/webhooks", f"/api/admin/webhooks/{endpoint_id}"):
        answers.append(await client.get(path))
        assert answers[-1].status_code == 200, path
    return "\n".join(a.text + str(a.headers) for a in answers)


async def test_the_list_shows_each_endpoints_filter_state_and_deliveries(admin, backend_world):
    client, _ = admin
    world = backend_world
    world.deps.webhook_allow_private = True  # the failing one is on 127.0.0.1
    down = f"http://127.0.0.1:{unused_port()}/hooks/orders"  # nobody listens: refused
    failing = await webhook_endpoints.create(
        world.deps, url=down, event_types=["place"], description="the host", actor="user:1"
    )
    quiet = await webhook_endpoints.create(world.deps, url=PUBLIC, actor="user:1")
    await webhook_endpoints.update(world.deps, quiet["id"], changes={"enabled": False}, actor="t")
    await orders_and_cancels(world, 2)
    sender = webhooks.Deliverer(world.deps, EventWebhook(timeout=2, allow_private=True))
    try:
        await sender.deliver_once()
    finally:
        await sender.webhook.close()
    status = (await webhook_endpoints.show(world.deps, failing["id"]))["status"]
    assert status["failures"] == 1 and status["retry_at"] is not None

    page = await client.get("/admin/webhooks")
    assert page.status_code == 200
    row = page.text[page.text.index(f'id="endpoint-{failing["id"]}"') :]
    row = row[: row.index("</tbody>")]  # its facts and its actions, the last (oldest) row
    assert down in row and "the host" in row and ">place<" in row
    assert "s-enabled" in row and 'class="facts stuck"' in row
    cells = re.findall(r"<td class=\"num\"[^>]*>(\d+)", row)
    assert cells == [str(status["delivered_seq"]), "2", "1"]  # position, backlog, failures
    assert status["last_error"] in row
    assert status["retry_at"].strftime("%Y-%m-%d %H:%M:%S") in row
    assert "/disable" in row and "/replay" in row and "/rotate" in row and "/delete" in row
    other = page.text[page.text.index(f'id="endpoint-{quiet["id"]}"') :]
    other = other[: other.index(f'id="endpoint-{failing["id"]}"')]
    assert PUBLIC in other and ">all<" in other and "s-disabled" in other
    assert f"/admin/webhooks/{quiet['id']}/enable" in other
    assert not SECRET.search(page.text)
    dashboard = await client.get("/admin")
    assert 'href="/admin/webhooks" id="webhook-endpoints"' in dashboard.text
    assert 'href="/admin/webhooks"' in dashboard.text.split("</header>")[0]  # the menu


async def test_the_secret_is_shown_on_the_answer_to_make_and_rotate_only(
    admin, backend_world, caplog
):
    client, csrf = admin
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="dueflow")
    made = await client.post(
        "/admin/webhooks",
        data={"csrf": csrf, "url": f" {PUBLIC} ", "types": "place, pay", "description": "shop"},
    )
    assert made.status_code == 200
    assert made.headers["cache-control"] == "no-store"
    assert "set-cookie" not in made.headers  # no flash: nothing the browser keeps
    assert "data-refresh" not in made.text  # not redrawn: the secret stays on screen
    first = secret_on(made)
    [endpoint] = (await webhook_endpoints.page(backend_world.deps, after=None, limit=5)).items
    assert (endpoint["url"], endpoint["event_types"]) == (PUBLIC, ["pay", "place"])
    assert f"#{endpoint['id']} made" in made.text and "not shown again" in made.text
    assert first.startswith("whsec_") and first not in await everywhere(
        client, backend_world, endpoint["id"]
    )

    rotated = await client.post(
        f"/admin/webhooks/{endpoint['id']}/rotate", data={"csrf": csrf, "keep_old_for": "3600"}
    )
    assert rotated.status_code == 200 and "set-cookie" not in rotated.headers
    second = secret_on(rotated)
    assert second != first
    after = await webhook_endpoints.show(backend_world.deps, endpoint["id"])
    start = backend_world.clock.now()
    assert after["previous_secret_until"] == start + timedelta(hours=1)
    seen = await everywhere(client, backend_world, endpoint["id"])
    assert first not in seen and second not in seen
    for secret in (first, second):
        assert secret not in caplog.text
        assert all(secret not in str(r.args) for r in caplog.records)
    # the secrets on the pages are the ones that sign
    keys = await webhook_endpoints_secrets(backend_world, endpoint["id"])
    assert keys == (second, first)


async def webhook_endpoints_secrets(world, endpoint_id: int) -> tuple[str, str | None]:
    from dueflow.store import webhook_endpoints as store

    async with world.deps.db.read() as conn:
        row = await store.get(conn, endpoint_id)
    return row.secret, row.previous_secret


async def test_disable_enable_replay_and_delete(admin, backend_world):
    client, csrf = admin
    world = backend_world
    made = await webhook_endpoints.create(world.deps, url=PUBLIC, actor="user:1")
    one = made["id"]
    await orders_and_cancels(world, 2)
    last = seq_of((await events.feed(world.deps, after=0, limit=500))[-1])

    async def act(action: str, **fields: str) -> str:
        answer = await client.post(
            f"/admin/webhooks/{one}/{action}",
            data={"csrf": csrf, "back": "/admin/webhooks", **fields},
        )
        assert answer.status_code == 303, answer.text
        assert answer.headers["location"] == "/admin/webhooks"
        return (await client.get("/admin/webhooks")).text

    assert "disabled." in await act("disable")
    assert (await webhook_endpoints.show(world.deps, one))["enabled"] is False
    assert "enabled." in await act("enable")
    assert (await webhook_endpoints.show(world.deps, one))["enabled"] is True
    page = await act("replay", first="1", last=str(last))
    assert "queued to be delivered again" in page
    async with world.deps.db.read() as conn:
        query = select(event_deliveries).where(event_deliveries.c.endpoint_id == one)
        replays = [r for r in (await conn.execute(query)).all() if r.until_seq is not None]
    root = await accounts.get_user(world.deps, "root")
    assert [(r.delivered_seq, r.until_seq, r.requested_by) for r in replays] == [
        (0, last, f"user:{root.id}")
    ]
    assert (await webhook_endpoints.show(world.deps, one))["status"]["replays"] == 1
    assert "deleted." in await act("delete")
    assert (await webhook_endpoints.page(world.deps, after=None, limit=5)).items == []
    async with world.deps.db.read() as conn:
        assert (await conn.execute(query)).all() == []


async def test_bad_input_is_refused_with_a_4xx_and_changes_nothing(admin, backend_world):
    client, csrf = admin
    world = backend_world
    one = (await webhook_endpoints.create(world.deps, url=PUBLIC, actor="user:1"))["id"]
    await orders_and_cancels(world, 1)
    before = await table_snapshot(world.deps)
    make = "/admin/webhooks"
    cases = [
        (make, {"url": "http://127.0.0.1:9/hooks"}, 422, "private, loopback"),
        (make, {"url": "http://10.0.0.1/"}, 422, "private, loopback"),
        (make, {"url": "http://169.254.169.254/latest"}, 422, "private, loopback"),
        (make, {"url": "gopher://93.184.216.34/"}, 422, "http:// or https://"),
        (make, {"url": ""}, 422, "http:// or https://"),
        (make, {"url": PUBLIC, "types": "place Not-A-Type"}, 422, "is not an order event type"),
        (make, {"url": PUBLIC, "types": "place, placed"}, 422, "is not an order event type"),
        (make, {"url": PUBLIC, "types": "pay_reminder"}, 422, "is a buyer notice"),
        (make, {"url": PUBLIC, "description": "x" * 201}, 422, "description"),
        (make, {"url": PUBLIC + "\x00"}, 422, "url"),  # a control character: no form takes it
        (f"/admin/webhooks/{one}/replay", {"first": "abc"}, 422, "seq of its first"),
        (f"/admin/webhooks/{one}/replay", {"first": "3", "last": "2"}, 422, "a first event"),
        (f"/admin/webhooks/{one}/replay", {"first": "1", "last": "999"}, 422, "no event"),
        (f"/admin/webhooks/{one}/rotate", {"keep_old_for": "soon"}, 422, "keep_old_for"),
        (f"/admin/webhooks/{one}/rotate", {"keep_old_for": "604801"}, 422, "keep_old_for"),
        ("/admin/webhooks/999/replay", {"first": "1"}, 404, "no webhook endpoint 999"),
        ("/admin/webhooks/999/rotate", {}, 404, "no webhook endpoint 999"),
        ("/admin/webhooks/999/disable", {}, 404, "no webhook endpoint 999"),
        ("/admin/webhooks/abc/enable", {}, 404, "no webhook endpoint abc"),
        ("/admin/webhooks/0/delete", {}, 404, "no webhook endpoint 0"),
    ]
    for path, fields, status, says in cases:
        answer = await client.post(path, data={"csrf": csrf, **fields})
        assert (answer.status_code, says in answer.text) == (status, True), (path, fields)
        assert not SECRET.search(answer.text) and "set-cookie" not in answer.headers
    # the make form comes back filled in, with the reason
    again = await client.post(make, data={"csrf": csrf, "url": "http://10.0.0.1/", "types": "pay"})
    assert 'value="http://10.0.0.1/"' in again.text and 'value="pay"' in again.text
    assert "Refused: " in again.text
    # without the session's CSRF token: 403
    for action in ("", f"/{one}/rotate", f"/{one}/disable", f"/{one}/replay", f"/{one}/delete"):
        forged = {"csrf": "0" * 64, "url": PUBLIC, "first": "1"}
        answer = await client.post(f"/admin/webhooks{action}", data=forged)
        assert answer.status_code == 403 and not SECRET.search(answer.text)
    assert await table_snapshot(world.deps) == before
    world.deps.webhook_allow_private = True  # the setting lets a private address through
    allowed = await client.post(make, data={"csrf": csrf, "url": "http://127.0.0.1:9/hooks"})
    assert allowed.status_code == 200 and secret_on(allowed)
