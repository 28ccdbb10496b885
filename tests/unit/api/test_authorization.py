"""Who may call what: every /api route against no token, a stranger, the buyer, the seller and
an admin; and bad input refused with 4xx without changing a row."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest

from tests.unit.api import Api, build_app, running_api, table_snapshot


@pytest.fixture
async def api(world) -> AsyncIterator[Api]:
    async with running_api(world.deps) as api:
        yield api


async def goods_body(api: Api, _: int) -> dict[str, Any]:
    return {"goods_id": await api.goods()}


async def show_body(api: Api, _: int) -> dict[str, Any]:
    now = api.deps.clock.now()
    return {
        "title": "Gala",
        "venue": "Hall 2",
        "starts_at": (now + timedelta(days=3)).isoformat(),
        "sales_close_at": (now + timedelta(days=2)).isoformat(),
        "seats": [{"label": "A-1", "price": "80.00"}],
    }


async def seats_body(api: Api, _: int) -> dict[str, Any]:
    # A show of its own per caller: each allowed caller takes two seats of a fresh show.
    return {"show_id": await api.show(), "seats": ["A-1", "B-1"]}


async def lines_body(api: Api, _: int) -> dict[str, Any]:
    return {"lines": [{"sku_id": await api.sku(), "quantity": 2}]}


async def coupon_lines_body(api: Api, coupon_id: int) -> dict[str, Any]:
    # The buyer's coupon: anyone else who names it is refused (and the seller for the SKU).
    return {"lines": [{"sku_id": await api.sku(), "quantity": 1}], "coupon_id": coupon_id}


async def flash_order_body(api: Api, sale_id: int) -> dict[str, Any]:
    return {"flash_sale_id": sale_id, "quantity": 1}


async def sku_body(api: Api, _: int) -> dict[str, Any]:
    return {"title": "mug", "price": "25.00", "stock": 3}


async def template_body(api: Api, _: int) -> dict[str, Any]:
    now = api.deps.clock.now()
    return {
        "title": "5 off",
        "amount_off": "5.00",
        "min_amount": "20.00",
        "valid_from": now.isoformat(),
        "valid_until": (now + timedelta(days=7)).isoformat(),
        "total": 5,
    }


async def issue_body(api: Api, _: int) -> dict[str, Any]:
    return {"user_id": api.ids["buyer"]}


async def new_key(api: Api) -> int:
    """A service key made by the admin, for the key routes to act on."""
    answer = await api.call(
        "POST", "/api/admin/keys", "admin", json={"name": "spare", "scopes": ["catalog"]}
    )
    assert answer.status_code == 201, answer.text
    return int(answer.json()["id"])


async def flash_sale_body(api: Api, sku_id: int) -> dict[str, Any]:
    now = api.deps.clock.now()
    return {
        "sku_id": sku_id,
        "price": "9.90",
        "stock": 2,
        "starts_at": now.isoformat(),
        "ends_at": (now + timedelta(hours=1)).isoformat(),
        "per_buyer_limit": 1,
    }


async def webhook_endpoint(api: Api) -> int:
    """An endpoint (at a public address: nothing is sent in these tests) and a numbered event
    to replay."""
    from dueflow.service import events, webhook_endpoints

    await api.order()
    await events.sequence(api.deps)
    made = await webhook_endpoints.create(api.deps, url="http://93.184.216.34/hook", actor="user:1")
    return int(made["id"])


async def paid_ticket(api: Api) -> str:
    """A paid ticket's code (its show the seller's, bought by the buyer)."""
    return await api.paid_ticket(await api.show(), "A-1")


@dataclass
class Route:
    """A route, the state it is called in, and each caller's expected status, in calling order
    (refused callers first, so the allowed one still finds the state it needs)."""

    method: str
    path: str  # "{id}" is replaced by the id ``setup`` returns
    expected: dict[str | None, int]
    setup: Callable[[Api], Awaitable[int | str]] | None = None
    body: dict[str, Any] | Callable[[Api, int], Awaitable[dict[str, Any]]] | None = None


ADMIN_ONLY_GET = {None: 401, "stranger": 403, "buyer": 403, "seller": 403, "admin": 200}
ANY_USER_GET = {None: 401, "stranger": 200, "buyer": 200, "seller": 200, "admin": 200}
PARTIES = {None: 401, "stranger": 404, "admin": 403}

ROUTES = {
    "add goods": Route(
        "POST",
        "/api/goods",
        {None: 401, "stranger": 201, "buyer": 201, "seller": 201, "admin": 201},
        body={"title": "lamp", "price": "3.10"},
    ),
    "get goods": Route(
        "GET",
        "/api/goods/{id}",
        {None: 401, "stranger": 200, "buyer": 200, "seller": 200, "admin": 200},
        setup=Api.goods,
    ),
    "place order": Route(
        "POST",
        "/api/orders",
        {None: 401, "seller": 403, "stranger": 201, "buyer": 201, "admin": 201},
        body=goods_body,
    ),
    "add show": Route(
        "POST",
        "/api/shows",
        {None: 401, "stranger": 201, "buyer": 201, "seller": 201, "admin": 201},
        body=show_body,
    ),
    "get show": Route("GET", "/api/shows/{id}", ANY_USER_GET, setup=Api.show),
    "seat map": Route("GET", "/api/shows/{id}/seats", ANY_USER_GET, setup=Api.show),
    "cancel show": Route(
        "POST",
        "/api/shows/{id}/cancel",
        {None: 401, "stranger": 403, "buyer": 403, "admin": 403, "seller": 200},
        setup=Api.show,
    ),
    # The organizer checks a ticket in; anyone else is told what an unknown code is told; an
    # admin may too (after the organizer: checked in already).
    "check in": Route(
        "POST",
        "/api/tickets/{id}/check-in",
        {None: 401, "stranger": 404, "buyer": 404, "seller": 200, "admin": 409},
        setup=paid_ticket,
        body={"gate": "North"},
    ),
    "tickets csv": Route(
        "GET",
        "/api/shows/{id}/tickets.csv",
        {None: 401, "stranger": 404, "buyer": 404, "seller": 200, "admin": 200},
        setup=Api.show,
    ),
    "hold seats": Route(
        "POST",
        "/api/orders",
        {None: 401, "seller": 403, "stranger": 201, "buyer": 201, "admin": 201},
        body=seats_body,
    ),
    # The shop: the SKUs' seller may not buy them; a coupon is its owner's alone.
    "buy sku lines": Route(
        "POST",
        "/api/orders",
        {None: 401, "seller": 403, "stranger": 201, "buyer": 201, "admin": 201},
        body=lines_body,
    ),
    "buy sku lines with a coupon": Route(
        "POST",
        "/api/orders",
        {None: 401, "seller": 403, "stranger": 403, "admin": 403, "buyer": 201},
        setup=Api.coupon,
        body=coupon_lines_body,
    ),
    "buy at a flash sale": Route(
        "POST",
        "/api/orders",
        {None: 401, "seller": 403, "stranger": 201, "buyer": 201, "admin": 201},
        setup=Api.flash_sale,
        body=flash_order_body,
    ),
    "add sku": Route(
        "POST",
        "/api/skus",
        {None: 401, "stranger": 201, "buyer": 201, "seller": 201, "admin": 201},
        body=sku_body,
    ),
    "get sku": Route("GET", "/api/skus/{id}", ANY_USER_GET, setup=Api.sku),
    "restock": Route(
        "POST",
        "/api/skus/{id}/restock",
        {None: 401, "stranger": 403, "buyer": 403, "admin": 403, "seller": 200},
        setup=Api.sku,
        body={"quantity": 5},
    ),
    "add coupon template": Route(
        "POST",
        "/api/coupon-templates",
        {None: 401, "stranger": 201, "buyer": 201, "seller": 201, "admin": 201},
        body=template_body,
    ),
    "get coupon template": Route(
        "GET", "/api/coupon-templates/{id}", ANY_USER_GET, setup=Api.coupon_template
    ),
    "issue coupon": Route(
        "POST",
        "/api/coupon-templates/{id}/issue",
        {None: 401, "stranger": 403, "buyer": 403, "seller": 201, "admin": 201},
        setup=Api.coupon_template,
        body=issue_body,
    ),
    "my coupons": Route("GET", "/api/me/coupons", ANY_USER_GET, setup=Api.coupon),
    "add flash sale": Route(
        "POST",
        "/api/flash-sales",
        {None: 401, "stranger": 403, "buyer": 403, "admin": 403, "seller": 201},
        setup=Api.sku,
        body=flash_sale_body,
    ),
    "get flash sale": Route("GET", "/api/flash-sales/{id}", ANY_USER_GET, setup=Api.flash_sale),
    "get order": Route(
        "GET",
        "/api/orders/{id}",
        {None: 401, "stranger": 404, "buyer": 200, "seller": 200, "admin": 200},
        setup=Api.order,
    ),
    "pay": Route(
        "POST",
        "/api/orders/{id}/payments",
        {**PARTIES, "seller": 403, "buyer": 201},
        setup=Api.order,
        body={"provider": "fakepay"},
    ),
    "buyer cancels unpaid": Route(
        "POST",
        "/api/orders/{id}/cancel",
        {**PARTIES, "seller": 409, "buyer": 200},
        setup=Api.order,
    ),
    "seller cancels paid": Route(
        "POST",
        "/api/orders/{id}/cancel",
        {**PARTIES, "buyer": 409, "seller": 200},
        setup=Api.paid_order,
    ),
    "ship": Route(
        "POST",
        "/api/orders/{id}/ship",
        {**PARTIES, "buyer": 403, "seller": 200},
        setup=Api.paid_order,
        body={"carrier": "SF", "tracking_no": "SF1"},
    ),
    "confirm receipt": Route(
        "POST",
        "/api/orders/{id}/confirm-receipt",
        {**PARTIES, "seller": 403, "buyer": 200},
        setup=Api.shipped,
    ),
    "review": Route(
        "POST",
        "/api/orders/{id}/reviews",
        {**PARTIES, "buyer": 201, "seller": 201},
        setup=Api.received,
        body={"rating": 4, "comment": "fine"},
    ),
    "add user": Route(
        "POST",
        "/api/admin/users",
        {**ADMIN_ONLY_GET, "admin": 201},
        body={"name": "dave", "admin": False},
    ),
    "overdue": Route("GET", "/api/admin/overdue", ADMIN_ONLY_GET),
    "stuck timers": Route("GET", "/api/admin/timers?state=stuck", ADMIN_ONLY_GET),
    "discrepancies": Route("GET", "/api/admin/discrepancies", ADMIN_ONLY_GET),
    "summary": Route("GET", "/api/admin/summary", ADMIN_ONLY_GET),
    "run timer now": Route(
        "POST", "/api/admin/timers/{id}/run-now", ADMIN_ONLY_GET, setup=Api.overdue_timer
    ),
    "refunds": Route("GET", "/api/admin/refunds?state=pending_review", ADMIN_ONLY_GET),
    "approve refund": Route(
        "POST", "/api/admin/refunds/{id}/approve", ADMIN_ONLY_GET, setup=Api.refund
    ),
    "retry refund": Route(
        "POST",
        "/api/admin/refunds/{id}/retry",
        {**ADMIN_ONLY_GET, "admin": 409},  # a refund in review is approved, not retried
        setup=Api.refund,
    ),
    "reject refund": Route(
        "POST",
        "/api/admin/refunds/{id}/reject",
        ADMIN_ONLY_GET,
        setup=Api.refund,
        body={"reason": "the buyer kept the goods"},
    ),
    "settle refund off-line": Route(
        "POST",
        "/api/admin/refunds/{id}/settle-offline",
        ADMIN_ONLY_GET,
        setup=Api.refund,
        body={"reference": "bank transfer 0042"},
    ),
    "make webhook endpoint": Route(
        "POST",
        "/api/admin/webhooks",
        {**ADMIN_ONLY_GET, "admin": 201},
        body={"url": "http://93.184.216.34/hook", "event_types": ["pay"]},
    ),
    "list webhook endpoints": Route("GET", "/api/admin/webhooks", ADMIN_ONLY_GET),
    "show webhook endpoint": Route(
        "GET", "/api/admin/webhooks/{id}", ADMIN_ONLY_GET, setup=webhook_endpoint
    ),
    "change webhook endpoint": Route(
        "PATCH",
        "/api/admin/webhooks/{id}",
        ADMIN_ONLY_GET,
        setup=webhook_endpoint,
        body={"enabled": False},
    ),
    "rotate webhook secret": Route(
        "POST", "/api/admin/webhooks/{id}/rotate", ADMIN_ONLY_GET, setup=webhook_endpoint, body={}
    ),
    "replay to webhook endpoint": Route(
        "POST",
        "/api/admin/webhooks/{id}/replay",
        ADMIN_ONLY_GET,
        setup=webhook_endpoint,
        body={"first": 1},
    ),
    "delete webhook endpoint": Route(
        "DELETE",
        "/api/admin/webhooks/{id}",
        ADMIN_ONLY_GET,
        setup=webhook_endpoint,
    ),
    # Lists answer every user, each with what they may see (test_lists.py says what that is).
    "list goods": Route("GET", "/api/goods", ANY_USER_GET, setup=Api.goods),
    "list goods of a seller": Route("GET", "/api/goods?seller_id=1", ANY_USER_GET),
    "list orders": Route("GET", "/api/orders?role=seller", ANY_USER_GET, setup=Api.order),
    "me": Route("GET", "/api/me", ANY_USER_GET),
    # The catalogue's lists answer every user, as its single reads do.
    "list skus": Route("GET", "/api/skus", ANY_USER_GET, setup=Api.sku),
    "list shows": Route("GET", "/api/shows?status=on_sale", ANY_USER_GET, setup=Api.show),
    "list flash sales": Route("GET", "/api/flash-sales", ANY_USER_GET, setup=Api.flash_sale),
    "list coupon templates": Route(
        "GET", "/api/coupon-templates?seller_id=1", ANY_USER_GET, setup=Api.coupon_template
    ),
    "list users": Route("GET", "/api/admin/users", ADMIN_ONLY_GET),
    # The feed answers every user: all events for an admin, one's own orders' otherwise
    # (test_event_feed.py says what each sees).
    "events feed": Route("GET", "/api/events", ANY_USER_GET, setup=Api.order),
    # Service keys: an admin's, or a key's with the admin scope.
    "add key": Route(
        "POST",
        "/api/admin/keys",
        {**ADMIN_ONLY_GET, "admin": 201},
        body={"name": "shop back end", "scopes": ["orders", "payments"]},
    ),
    "list keys": Route("GET", "/api/admin/keys", ADMIN_ONLY_GET, setup=new_key),
    "get key": Route("GET", "/api/admin/keys/{id}", ADMIN_ONLY_GET, setup=new_key),
    "rotate key": Route(
        "POST", "/api/admin/keys/{id}/rotate", {**ADMIN_ONLY_GET, "admin": 201}, setup=new_key
    ),
    "revoke key": Route("POST", "/api/admin/keys/{id}/revoke", ADMIN_ONLY_GET, setup=new_key),
}

#: The scope each route needs of a service key, by the start of its path (the first that fits;
#: docs/design.md, "Service keys"). The OpenAPI document declares it per operation.
SCOPES_BY_PATH = [
    ("/api/admin/", "admin"),
    ("/api/orders/{}/payments", "payments"),
    ("/api/orders", "orders"),
    ("/api/me/coupons", "catalog"),
    ("/api/me", "orders"),
    ("/api/events", "events"),
    ("/api/goods", "catalog"),
    ("/api/shows", "catalog"),
    ("/api/tickets", "catalog"),
    ("/api/skus", "catalog"),
    ("/api/coupon-templates", "catalog"),
    ("/api/flash-sales", "catalog"),
]


def scope_of(path: str) -> str:
    """The scope a route needs, by :data:`SCOPES_BY_PATH`."""
    generic = _generic(path.split("?")[0])
    return next(scope for start, scope in SCOPES_BY_PATH if generic.startswith(start))


@pytest.mark.parametrize("credential", ["token", "key"])
@pytest.mark.parametrize("name", list(ROUTES))
async def test_authorization_matrix(api, name, credential):
    """Each caller by a personal token; then again, from a fresh state, by a service key with
    the route's scope acting for the same user (every rule of roles applies to the user acted
    for). On an admin route the admin is a key with the admin scope acting for nobody."""
    route = ROUTES[name]
    expected = route.expected
    admin_route = route.path.startswith("/api/admin/")
    if credential == "key" and admin_route:
        expected = {None: 401, "admin": expected["admin"]}
    item = await route.setup(api) if route.setup else 0
    got = {}
    for who in expected:
        body = route.body
        if callable(body):
            body = await body(api, item)
        caller, headers = who, {}
        if credential == "key" and who is not None:
            acting = None if admin_route else who
            caller, headers = None, await api.as_key(scope_of(route.path), acting)
        answer = await api.call(
            route.method, route.path.format(id=item), caller, json=body, headers=headers
        )
        got[who] = answer.status_code
        if answer.status_code >= 400:
            assert set(answer.json()) == {"error"}, answer.text
    assert got == expected


def test_the_matrix_covers_every_api_route(world):
    """A new route cannot skip the matrix."""
    paths = build_app(world.deps).openapi()["paths"]
    served = {(method.upper(), _generic(path)) for path, ops in paths.items() for method in ops}
    covered = {(r.method, _generic(r.path.split("?")[0])) for r in ROUTES.values()}
    assert served == covered


async def test_every_route_refuses_a_key_without_its_scope(api, world):
    """A walk over the OpenAPI document: each operation declares the personal token and the
    service key with the one scope :data:`SCOPES_BY_PATH` gives; a key with every other scope
    is refused with 403 ``missing_scope`` naming it, and no row changes (the key acting for a
    host user never seen before: not even that user is made)."""
    spec = build_app(world.deps).openapi()
    assert spec["components"]["securitySchemes"]["ServiceKey"]["scheme"] == "bearer"
    for scope in ("orders", "catalog", "payments", "events", "admin"):
        await api.service_key(scope)
    before = await table_snapshot(api.deps)
    walked = 0
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            needed = scope_of(path)
            assert operation["security"] == [{"HTTPBearer": []}, {"ServiceKey": [needed]}], path
            for other in {"orders", "catalog", "payments", "events", "admin"} - {needed}:
                headers = {
                    "Authorization": f"Bearer {await api.service_key(other)}",
                    "Dueflow-Act-As": "someone-new",
                }
                url = re.sub(r"\{[^}]+\}", "1", path)
                answer = await api.client.request(method, url, headers=headers, json={})
                assert answer.status_code == 403, (method, path, other, answer.text)
                error = answer.json()["error"]
                assert error["code"] == "missing_scope", error
                assert repr(needed) in error["message"], error
                walked += 1
    assert walked == 4 * sum(len(operations) for operations in spec["paths"].values())
    assert await table_snapshot(api.deps) == before


def _generic(path: str) -> str:
    """``/api/orders/{order_id}/ship`` and ``/api/orders/{id}/ship`` alike."""
    return "/".join("{}" if part.startswith("{") else part for part in path.split("/"))


async def test_a_stranger_learns_nothing_about_an_order(api):
    order_id = await api.order()
    hidden = await api.call("GET", f"/api/orders/{order_id}", "stranger")
    missing = await api.call("GET", "/api/orders/999999", "stranger")
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["error"]["message"] == f"no order {order_id}"
    assert missing.json()["error"]["message"] == "no order 999999"


async def test_a_bad_token_is_unauthorized(api):
    answer = await api.client.get("/api/goods/1", headers={"Authorization": "Bearer nope"})
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "unauthorized"
    assert answer.headers["www-authenticate"] == "Bearer"


JSON = {"Content-Type": "application/json"}
BAD_INPUT = [
    ("POST", "/api/goods", {"content": b"{not json", "headers": JSON}, 400),
    ("POST", "/api/goods", {"content": b"{not json"}, 422),
    ("POST", "/api/goods", {"json": {"title": "x", "price": "1", "colour": "red"}}, 422),
    ("POST", "/api/goods", {"json": {"title": "x", "price": 1}}, 422),
    ("POST", "/api/goods", {"json": {"title": "x", "price": "-1"}}, 422),
    ("POST", "/api/goods", {"json": {"title": "x" * 70_000, "price": "1"}}, 413),
    ("POST", "/api/goods", {"json": ["title", "price"]}, 422),
    ("POST", "/api/orders", {"json": {"goods_id": "1"}}, 422),
    ("POST", "/api/orders", {"json": {"goods_id": 10**30}}, 422),
    ("POST", "/api/orders", {"json": {"goods_id": "{goods}", "order_type": "nope"}}, 422),
    ("POST", "/api/orders/{order}/payments", {"json": {"provider": "nope"}}, 422),
    ("POST", "/api/orders/{order}/payments", {"json": {}}, 422),
    ("GET", "/api/orders/abc", {}, 422),
    ("POST", "/api/orders/{order}/reviews", {"json": {"rating": 9}}, 422),
    ("POST", "/api/orders/{order}/reviews", {"json": {"rating": "5"}}, 422),
    ("POST", "/api/admin/users", {"json": {"name": "bad name!"}}, 422),
    ("POST", "/api/admin/users", {"json": {"name": "x", "admin": "yes"}}, 422),
    ("GET", "/api/admin/timers?state=weird", {}, 422),
    ("GET", "/api/admin/refunds?state=weird", {}, 422),
    ("GET", "/api/goods?limit=101", {}, 422),
    ("GET", "/api/goods?after=bogus", {}, 422),
    ("GET", "/api/orders?flow=lottery", {}, 422),
    ("GET", "/api/orders?status=lost", {}, 422),
    ("POST", "/api/admin/webhooks", {"json": {"url": "http://127.0.0.1/hook"}}, 422),
    ("POST", "/api/admin/webhooks", {"json": {"url": "http://10.0.0.1/hook"}}, 422),
    ("POST", "/api/admin/webhooks", {"json": {"url": "http://169.254.169.254/"}}, 422),
    ("POST", "/api/admin/webhooks", {"json": {"url": "gopher://93.184.216.34/"}}, 422),
    ("POST", "/api/admin/webhooks", {"json": {"url": "http://93.184.216.34/", "x": 1}}, 422),
    (
        "POST",
        "/api/admin/webhooks",
        {"json": {"url": "http://1.1.1.1/", "event_types": ["X"]}},
        422,
    ),
    (
        "POST",
        "/api/admin/webhooks",
        {"json": {"url": "http://1.1.1.1/", "event_types": ["placed"]}},
        422,
    ),
    ("GET", "/api/admin/webhooks?after=bogus", {}, 422),
    ("GET", "/api/admin/webhooks/999", {}, 404),
]


async def test_bad_input_is_refused_without_changing_a_row(api):
    goods_id = await api.goods()
    order_id = await api.order()
    before = await table_snapshot(api.deps)
    for method, path, kwargs, expected in BAD_INPUT:
        if "json" in kwargs and isinstance(kwargs["json"], dict):
            kwargs = {
                "json": {k: goods_id if v == "{goods}" else v for k, v in kwargs["json"].items()}
            }
        who = "admin" if "/admin/" in path else "buyer"
        answer = await api.call(method, path.format(order=order_id), who, **kwargs)
        assert answer.status_code == expected, (path, kwargs, answer.text)
        assert "error" in answer.json()
    assert await table_snapshot(api.deps) == before


async def test_a_huge_streamed_body_is_refused(api):
    async def chunks():
        for _ in range(100):
            yield b" " * 1024

    before = await table_snapshot(api.deps)
    answer = await api.client.post(
        "/api/goods",
        content=chunks(),
        headers={**api.auth("seller"), "Content-Type": "application/json"},
    )
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "body_too_large"
    assert await table_snapshot(api.deps) == before
