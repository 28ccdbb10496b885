"""Service keys over the API, on every database: made, shown once, listed, rotated, revoked and
expired; acting for a host's users (made on first use, every rule of roles theirs); the events a
key's request writes naming the key; refusals that change nothing; and no secret in a log line."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from dueflow.store import schema
from tests.unit.api import Api, running_api, table_snapshot


@pytest.fixture
async def api(backend_world: Any) -> AsyncIterator[Api]:
    async with running_api(backend_world.deps) as api:
        yield api


async def make_key(api: Api, scopes: list[str], **extra: Any) -> dict[str, Any]:
    answer = await api.call(
        "POST", "/api/admin/keys", "admin", json={"name": "shop", "scopes": scopes, **extra}
    )
    assert answer.status_code == 201, answer.text
    made: dict[str, Any] = answer.json()
    return made


def by(secret: str, act_as: str | None = None, name: str | None = None) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {secret}"}
    if act_as is not None:
        headers["Dueflow-Act-As"] = act_as
    if name is not None:
        headers["Dueflow-Act-As-Name"] = name
    return headers


async def user_row(api: Api, external_id: str) -> Any:
    async with api.deps.db.read() as conn:
        query = select(schema.users).where(schema.users.c.external_id == external_id)
        return (await conn.execute(query)).first()


async def actors_of(api: Api, order_id: int) -> list[tuple[str, str]]:
    async with api.deps.db.read() as conn:
        query = (
            select(schema.order_events.c.event, schema.order_events.c.actor)
            .where(schema.order_events.c.order_id == order_id)
            .order_by(schema.order_events.c.id)
        )
        return [tuple(row) for row in (await conn.execute(query)).all()]


async def test_a_key_is_shown_once_listed_rotated_and_revoked(api):
    made = await make_key(api, ["orders", "catalog"])
    secret = made.pop("secret")
    assert secret.startswith("dfk_live_") and made["prefix"] == secret[:15]
    assert (made["scopes"], made["state"]) == (["orders", "catalog"], "active")
    assert made["created_by"] == f"user:{api.ids['admin']}"
    shown = await api.call("GET", f"/api/admin/keys/{made['id']}", "admin")
    assert shown.json() == made
    listed = await api.call("GET", "/api/admin/keys", "admin")
    assert secret not in listed.text and made in listed.json()["items"]
    async with api.deps.db.read() as conn:
        stored = (await conn.execute(select(schema.api_keys))).all()
    assert all(secret not in str(tuple(row)) for row in stored)  # only its hash

    goods_id = await api.goods()
    placed = await api.call(
        "POST", "/api/orders", None, json={"goods_id": goods_id}, headers=by(secret, "u-1")
    )
    assert placed.status_code == 201, placed.text

    rotated = await api.call("POST", f"/api/admin/keys/{made['id']}/rotate", "admin")
    assert rotated.status_code == 201, rotated.text
    new = rotated.json()
    assert (new["rotated_from"], new["name"], new["scopes"]) == (made["id"], "shop", made["scopes"])
    assert new["secret"] != secret
    for either in (secret, new["secret"]):  # both work until the old one is revoked
        answer = await api.call("GET", "/api/me", None, headers=by(either, "u-1"))
        assert answer.status_code == 200, answer.text
        assert answer.json()["orders_as_buyer"] == 1

    revoked = await api.call("POST", f"/api/admin/keys/{made['id']}/revoke", "admin")
    assert (revoked.status_code, revoked.json()["state"]) == (200, "revoked")
    refused = await api.call("GET", "/api/me", None, headers=by(secret, "u-1"))
    assert refused.status_code == 401
    assert refused.json()["error"] == {
        "code": "unauthorized",
        "message": "the service key was revoked",
        "field": None,
    }
    still = await api.call("GET", "/api/me", None, headers=by(new["secret"], "u-1"))
    assert still.status_code == 200
    before = await table_snapshot(api.deps)
    again = await api.call("POST", f"/api/admin/keys/{made['id']}/revoke", "admin")
    assert again.status_code == 409
    no_rotation = await api.call("POST", f"/api/admin/keys/{made['id']}/rotate", "admin")
    assert no_rotation.status_code == 409
    assert await table_snapshot(api.deps) == before


async def test_keys_are_listed_a_page_at_a_time(api):
    ids = [(await make_key(api, ["events"]))["id"] for _ in range(5)]
    seen, after = [], None
    while True:
        query = "?limit=2" + (f"&after={after}" if after else "")
        page = (await api.call("GET", f"/api/admin/keys{query}", "admin")).json()
        seen += [item["id"] for item in page["items"]]
        after = page["next"]
        if after is None:
            break
    assert seen == sorted(ids, reverse=True)


async def test_an_expired_key_is_refused_and_makes_nobody(api):
    now = api.deps.clock.now()
    made = await make_key(api, ["orders"], expires_at=(now + timedelta(hours=1)).isoformat())
    assert (await api.call("GET", "/api/me", None, headers=by(made["secret"], "a"))).is_success
    api.deps.clock.advance(timedelta(hours=1))
    before = await table_snapshot(api.deps)
    answer = await api.call("GET", "/api/me", None, headers=by(made["secret"], "someone-new"))
    assert answer.status_code == 401
    assert answer.json()["error"]["message"] == "the service key expired"
    assert await table_snapshot(api.deps) == before
    shown = await api.call("GET", f"/api/admin/keys/{made['id']}", "admin")
    assert shown.json()["state"] == "expired"


@pytest.mark.parametrize(
    "body",
    [
        {"name": "shop", "scopes": ["orders", "shipping"]},
        {"name": "shop", "scopes": []},
        {"name": "shop", "scopes": ["ORDERS"]},
        {"name": "", "scopes": ["orders"]},
        {"name": "a\nb", "scopes": ["orders"]},
        {"name": "shop", "scopes": ["orders"], "expires_at": "2020-01-01T00:00:00+00:00"},
        {"name": "shop", "scopes": ["orders"], "expires_at": "2030-01-01T00:00:00"},
        {"name": "shop", "scopes": "orders"},
    ],
)
async def test_a_bad_key_is_refused_with_422_and_nothing_made(api, body):
    before = await table_snapshot(api.deps)
    answer = await api.call("POST", "/api/admin/keys", "admin", json=body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "invalid_input"
    if "shipping" in body["scopes"]:
        assert "shipping" in answer.json()["error"]["message"]
    assert await table_snapshot(api.deps) == before


async def test_a_key_acts_for_host_users_made_on_first_use(api):
    made = await make_key(api, ["orders", "catalog"])
    secret = made["secret"]
    answer = await api.call("GET", "/api/me", None, headers=by(secret, "Ab-7", "Zhang Wei"))
    assert answer.status_code == 200, answer.text
    first = await user_row(api, "Ab-7")
    assert (first.display_name, first.is_admin) == ("Zhang Wei", False)
    assert answer.json()["id"] == first.id
    # the same id is the same user; case matters (another host user), on every database
    again = await api.call("GET", "/api/me", None, headers=by(secret, "Ab-7"))
    assert again.json()["id"] == first.id
    other = await api.call("GET", "/api/me", None, headers=by(secret, "ab-7"))
    assert other.json()["id"] not in (first.id, None)
    # the host renames its user: UTF-8 as sent
    renamed = by(secret, "Ab-7")
    headers = [(k.encode(), v.encode()) for k, v in renamed.items()]
    headers.append((b"Dueflow-Act-As-Name", "张伟".encode()))
    answer = await api.client.get("/api/me", headers=headers)
    assert answer.status_code == 200, answer.text
    assert (await user_row(api, "Ab-7")).display_name == "张伟"


async def test_every_rule_of_roles_applies_to_the_user_acted_for(api):
    secret = (await make_key(api, ["orders", "catalog", "payments"]))["secret"]
    sold = await api.call(
        "POST", "/api/goods", None, json={"title": "kettle", "price": "30"}, headers=by(secret, "s")
    )
    assert sold.status_code == 201, sold.text
    placed = await api.call(
        "POST", "/api/orders", None, json={"goods_id": sold.json()["id"]}, headers=by(secret, "b")
    )
    assert placed.status_code == 201, placed.text
    order_id = placed.json()["id"]
    path = f"/api/orders/{order_id}"
    # a host user who is not a party gets what a stranger gets: 404, as for a missing order
    stranger = await api.call("GET", path, None, headers=by(secret, "x"))
    token_stranger = await api.call("GET", path, "stranger")
    assert stranger.status_code == token_stranger.status_code == 404
    assert stranger.json() == token_stranger.json()
    # the buyer calling the seller's action: 403 not_your_role
    shipped = await api.call(
        "POST",
        f"{path}/ship",
        None,
        json={"carrier": "SF", "tracking_no": "1"},
        headers=by(secret, "b"),
    )
    assert (shipped.status_code, shipped.json()["error"]["code"]) == (403, "not_your_role")
    assert (await api.call("GET", path, None, headers=by(secret, "s"))).status_code == 200
    paying = await api.call(
        "POST", f"{path}/payments", None, json={"provider": "fakepay"}, headers=by(secret, "b")
    )
    assert paying.status_code == 201, paying.text
    cancelled = await api.call("POST", f"{path}/cancel", None, headers=by(secret, "b"))
    assert cancelled.status_code == 200, cancelled.text
    buyer, key_id = (await user_row(api, "b")).id, await key_id_of(api, secret)
    written = await actors_of(api, order_id)
    assert [event for event, _ in written][:3] == ["place", "payment_started", "buyer_cancel"]
    assert {actor for _, actor in written} == {f"user:{buyer}@key:{key_id}"}


async def key_id_of(api: Api, secret: str) -> int:
    listed = (await api.call("GET", "/api/admin/keys?limit=100", "admin")).json()["items"]
    [found] = [k["id"] for k in listed if secret.startswith(k["prefix"])]
    return int(found)


async def test_a_personal_tokens_events_name_its_user_alone(api):
    order_id = await api.order()
    assert await actors_of(api, order_id) == [("place", f"user:{api.ids['buyer']}")]


async def test_a_key_on_an_admin_route_needs_the_admin_scope_and_nobody_acted_for(api):
    admin = (await make_key(api, ["admin"]))["secret"]
    orders = (await make_key(api, ["orders"]))["secret"]
    assert (await api.call("GET", "/api/admin/summary", None, headers=by(admin))).is_success
    refused = await api.call("GET", "/api/admin/summary", None, headers=by(orders))
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "missing_scope")
    assert "'admin'" in refused.json()["error"]["message"]
    # a key made by a key: its maker is named
    made = await api.call(
        "POST",
        "/api/admin/keys",
        None,
        json={"name": "child", "scopes": ["events"]},
        headers=by(admin),
    )
    assert made.json()["created_by"] == f"key:{await key_id_of(api, admin)}"
    # an admin route's events name the key, and the host user when it acts for one
    key_id = await key_id_of(api, admin)
    for act_as in (None, "ops-1"):
        refund_id = await api.refund()
        rejected = await api.call(
            "POST",
            f"/api/admin/refunds/{refund_id}/reject",
            None,
            json={"reason": "kept"},
            headers=by(admin, act_as),
        )
        assert rejected.status_code == 200, rejected.text
        async with api.deps.db.read() as conn:
            query = select(schema.refunds.c.order_id).where(schema.refunds.c.id == refund_id)
            order_id = (await conn.execute(query)).scalar_one()
        [(_, actor)] = [e for e in await actors_of(api, order_id) if "key" in e[1]]
        if act_as is None:
            assert actor == f"key:{key_id}"
        else:
            assert actor == f"user:{(await user_row(api, act_as)).id}@key:{key_id}"


@pytest.mark.parametrize(
    ("headers", "status", "code", "names"),
    [
        ({"Dueflow-Act-As": ""}, 422, "invalid_input", "Dueflow-Act-As"),
        ({"Dueflow-Act-As": "x" * 256}, 422, "invalid_input", "Dueflow-Act-As"),
        ({"Dueflow-Act-As": "a\tb"}, 422, "invalid_input", "Dueflow-Act-As"),
        ({"Dueflow-Act-As": "a\x7fb"}, 422, "invalid_input", "Dueflow-Act-As"),
        ({"Dueflow-Act-As": "a", "Dueflow-Act-As-Name": ""}, 422, "invalid_input", "-Name"),
        ({"Dueflow-Act-As-Name": "Wei"}, 422, "invalid_input", "Dueflow-Act-As-Name"),
        ({}, 400, "act_as_required", "Dueflow-Act-As"),
    ],
)
async def test_a_bad_act_as_is_refused_and_changes_nothing(api, headers, status, code, names):
    secret = (await make_key(api, ["orders"]))["secret"]
    goods_id = await api.goods()
    before = await table_snapshot(api.deps)
    answer = await api.call(
        "POST", "/api/orders", None, json={"goods_id": goods_id}, headers={**by(secret), **headers}
    )
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["code"] == code and names in error["message"], error
    assert await table_snapshot(api.deps) == before


async def test_a_personal_token_cannot_act_for_anyone(api):
    goods_id = await api.goods()
    before = await table_snapshot(api.deps)
    for headers in ({"Dueflow-Act-As": "host-seller"}, {"Dueflow-Act-As-Name": "Wei"}):
        answer = await api.call(
            "POST", "/api/orders", "buyer", json={"goods_id": goods_id}, headers=headers
        )
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"]["code"] == "act_as_not_allowed"
    assert await table_snapshot(api.deps) == before


async def test_no_secret_reaches_a_log_line(api, caplog):
    with caplog.at_level(logging.DEBUG):
        made = await make_key(api, ["orders", "admin"])
        rotated = await api.call("POST", f"/api/admin/keys/{made['id']}/rotate", "admin")
        await api.call("GET", "/api/me", None, headers=by(made["secret"], "u"))
        await api.call("GET", "/api/admin/keys", None, headers=by(rotated.json()["secret"]))
        await api.call("POST", f"/api/admin/keys/{made['id']}/revoke", "admin")
        await api.call("GET", "/api/me", None, headers=by(made["secret"], "u"))
    text = caplog.text
    assert f"service key {made['id']}" in text  # key changes are logged, with who did them
    for secret in (made["secret"], rotated.json()["secret"]):
        assert secret not in text and secret[15:] not in text
