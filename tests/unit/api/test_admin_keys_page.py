"""The service keys page: a key made by its form shows its secret on that answer only; the list
and every other admin page never show it (nor does a log line); revoking by its button."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest

from dueflow.api import admin_pages
from dueflow.api.app import create_app
from dueflow.service import accounts, keys
from tests.conftest import table_snapshot
from tests.unit.api.test_admin_pages import BASE, csrf_of, log_in


@pytest.fixture
async def client(world) -> AsyncIterator[httpx.AsyncClient]:
    """A client logged in as an admin."""
    _, token = await accounts.add_user(world.deps, "root", admin=True)
    app = create_app(world.deps, session_secret="s" * 32, session_ttl=timedelta(hours=1))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        await log_in(c, token)
        yield c


async def make(client: httpx.AsyncClient, **fields: str) -> httpx.Response:
    csrf = csrf_of((await client.get("/admin/keys")).text)
    return await client.post("/admin/keys", data={"csrf": csrf, **fields})


async def test_a_key_made_on_the_page_shows_its_secret_once(client, world, caplog):
    with caplog.at_level(logging.DEBUG):
        answer = await make(client, name="shop", scope_orders="1", scope_events="1")
    assert answer.status_code == 201, answer.text
    [secret] = re.findall(r"dfk_live_[A-Za-z0-9_-]{43}", answer.text)
    assert answer.headers["cache-control"] == "no-store"
    acting = await keys.authenticate(world.deps, secret, "events", None)
    assert acting.scopes == {"orders", "events"}
    listed = await client.get("/admin/keys")
    assert secret[:15] in listed.text and secret not in listed.text
    assert re.search(r'<td><a href="/admin/users/\d+">root</a></td>', listed.text)  # its maker
    # every admin page a GET reaches (ids filled with the key's, 1 elsewhere): never the secret
    routes = admin_pages.router(world.deps).routes
    pages = {r.path for r in routes if "GET" in getattr(r, "methods", ())}
    assert "/admin/keys" in pages and len(pages) > 10
    for path in sorted(pages):
        page = await client.get(re.sub(r"\{[^}]+\}", "1", path))
        assert secret not in page.text and secret[15:] not in page.text, path
    assert secret not in caplog.text


async def test_the_makers_of_keys_are_named(client, world):
    alice, _ = await accounts.add_user(world.deps, "alice")
    for by in (f"user:{alice.id}@key:7", "key:7", "cli"):
        await keys.add_key(world.deps, name="k", scopes=["orders"], expires_at=None, by=by)
    listed = (await client.get("/admin/keys")).text
    assert f'<a href="/admin/users/{alice.id}">alice</a> <small>through key 7</small>' in listed
    assert "<td>key 7</td>" in listed and "<td>cli</td>" in listed
    assert "user:" not in listed


async def test_revoking_on_the_page_refuses_the_key_next(client, world):
    made, secret = await keys.add_key(
        world.deps, name="old", scopes=["orders"], expires_at=None, by="cli"
    )
    csrf = csrf_of((await client.get("/admin/keys")).text)
    answer = await client.post(
        f"/admin/keys/{made['id']}/revoke", data={"csrf": csrf, "back": "/admin/keys"}
    )
    assert answer.status_code == 303
    assert "revoked" in (await client.get("/admin/keys")).text
    with pytest.raises(Exception, match="revoked"):
        await keys.authenticate(world.deps, secret, "orders", None)


@pytest.mark.parametrize(
    ("fields", "status", "says"),
    [
        ({"name": "shop"}, 422, "at least one"),
        ({"name": "", "scope_orders": "1"}, 422, "name"),
        ({"name": "shop", "scope_orders": "1", "expires_at": "soon"}, 422, "expires_at"),
        ({"name": "a\x01", "scope_orders": "1"}, 422, "name"),
    ],
)
async def test_a_bad_key_form_is_refused_and_makes_nothing(client, world, fields, status, says):
    before = await table_snapshot(world.deps)
    answer = await make(client, **fields)
    assert answer.status_code == status, answer.text
    assert says in answer.text
    assert "dfk_live_" not in answer.text
    assert await table_snapshot(world.deps) == before


async def test_a_form_without_the_csrf_token_is_refused(client, world):
    before = await table_snapshot(world.deps)
    answer = await client.post("/admin/keys", data={"name": "x", "scope_orders": "1"})
    assert answer.status_code == 403
    assert await table_snapshot(world.deps) == before
