"""``Idempotency-Key`` on every POST that changes something, on SQLite, PostgreSQL and MariaDB:
a table of the routes, checked against the OpenAPI document (every POST but the providers'
notify routes declares the header and its 409), and for each route, through the whole app: a
repeat with the same key and request answers the first answer byte for byte and changes
nothing; the key with another request (body, path or route) is a 409 that changes nothing;
requests sent at once with one key have one effect (the use case runs once, and the rows they
add are those one request adds)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update

from dueflow.api.app import create_app
from dueflow.payments.base import RefundResult
from dueflow.service import (
    accounts,
    checkin,
    events,
    keys,
    operations,
    orders,
    parties,
    payments,
    refunds,
    shop,
    tickets,
    webhook_endpoints,
)
from dueflow.store import schema
from tests.conftest import table_snapshot
from tests.unit.api import Api
from tests.unit.api.shop_world import fails, shop_api, window

KEY = "4d0c8a52-6f1e-4b7a-9c3d-2e5f8a1b0c9d"
NAMES = itertools.count(1)


@dataclass
class Request:
    """One keyed request of a case: its path parameters and body; ``other`` is the same
    route with another body (or, for a route without one, another path)."""

    path: dict[str, int]
    body: dict[str, Any] | None = None
    other_body: dict[str, Any] | None = None
    other_path: dict[str, int] | None = None


@dataclass(frozen=True)
class Case:
    """A route, who calls it, how to make what it acts on, and its use case (module, name) as
    the route calls it, to count its runs."""

    path: str
    who: str
    setup: Callable[[Api], Awaitable[Request]]
    use_case: tuple[Any, str]
    status: int = 200
    # Placing takes its key in its own transaction: racing repeats may each try to place
    # (one order is made, the others fail and answer it).
    races_into_the_use_case: bool = False
    notes: list[str] = field(default_factory=list)
    # Fields of the answer a repeat gets as null: a secret shown once is not kept.
    withheld: tuple[str, ...] = ()

    def replayed(self, content: bytes) -> Any:
        """What a repeat of an answer with ``content`` answers: the same, its withheld fields
        null."""
        return {**json.loads(content), **dict.fromkeys(self.withheld)}


def _elsewhere(path: dict[str, int]) -> dict[str, int]:
    """The same route on another resource (which need not exist: the key is checked first)."""
    return {name: value + 1000 for name, value in path.items()}


async def _goods(api: Api) -> Request:
    return Request({}, {"title": "tent", "price": "12.50"}, {"title": "tent", "price": "13.00"})


async def _place(api: Api) -> Request:
    return Request({}, {"goods_id": await api.goods()}, {"goods_id": await api.goods()})


async def _pay(api: Api) -> Request:
    return Request({"order_id": await api.order()}, {"provider": "fakepay"}, {"provider": "alipay"})


async def _unpaid(api: Api) -> Request:
    order_id = await api.order()
    return Request({"order_id": order_id}, other_path=_elsewhere({"order_id": order_id}))


async def _ship(api: Api) -> Request:
    return Request(
        {"order_id": await api.paid_order()},
        {"carrier": "SF", "tracking_no": "1"},
        {"carrier": "SF", "tracking_no": "2"},
    )


async def _shipped(api: Api) -> Request:
    order_id = await api.shipped()
    return Request({"order_id": order_id}, other_path=_elsewhere({"order_id": order_id}))


async def _review(api: Api) -> Request:
    return Request(
        {"order_id": await api.received()},
        {"rating": 5, "comment": "good"},
        {"rating": 4, "comment": "good"},
    )


async def _user(api: Api) -> Request:
    n = next(NAMES)
    return Request({}, {"name": f"host-{n}"}, {"name": f"host-{n}", "admin": True})


async def _timer(api: Api) -> Request:
    """A new order's cancel_unpaid timer, its deadline a minute past (as if missed); without
    ``Api.overdue_timer``'s UPDATE ... RETURNING, which MariaDB does not have."""
    order_id = await api.order()
    past = api.deps.clock.now() - timedelta(minutes=1)
    t = schema.timers.c
    async with api.deps.db.write() as conn:
        mine = (t.order_id == order_id) & (t.kind == "cancel_unpaid")
        await conn.execute(update(schema.timers).where(mine).values(deadline_at=past, due_at=past))
        timer_id = int(await conn.scalar(select(t.id).where(mine)))
    return Request({"timer_id": timer_id}, other_path=_elsewhere({"timer_id": timer_id}))


async def _refund(api: Api) -> Request:
    refund_id = await api.refund()
    return Request({"refund_id": refund_id}, other_path=_elsewhere({"refund_id": refund_id}))


async def _failed_refund(api: Api) -> Request:
    refund_id = await api.refund()
    api.provider.refund_answers.append(RefundResult.FAILED)
    answer = await api.call("POST", f"/api/admin/refunds/{refund_id}/approve", "admin")
    assert answer.json()["state"] == "failed", answer.text
    return Request({"refund_id": refund_id}, other_path=_elsewhere({"refund_id": refund_id}))


async def _reject(api: Api) -> Request:
    return Request({"refund_id": await api.refund()}, {"reason": "kept"}, {"reason": "lost"})


async def _settle(api: Api) -> Request:
    return Request(
        {"refund_id": await api.refund()}, {"reference": "ICBC 1"}, {"reference": "ICBC 2"}
    )


def _show_body(api: Api, title: str) -> dict[str, Any]:
    now = api.deps.clock.now()
    return {
        "title": title,
        "venue": "Hall 1",
        "starts_at": (now + timedelta(days=30)).isoformat(),
        "sales_close_at": (now + timedelta(days=29)).isoformat(),
        "seat_ranges": "A:1-4",
        "prices": {"A": "380.00"},
    }


async def _show(api: Api) -> Request:
    return Request({}, _show_body(api, "Winter concert"), _show_body(api, "Spring concert"))


async def _ticket(api: Api) -> Request:
    code = await api.paid_ticket(await api.show(), "A-1")
    return Request({"code": code}, {"gate": "North"}, {"gate": "South"})  # type: ignore[dict-item]


async def _a_show(api: Api) -> Request:
    show_id = await api.show()
    return Request({"show_id": show_id}, other_path=_elsewhere({"show_id": show_id}))


async def _sku(api: Api) -> Request:
    return Request(
        {},
        {"title": "mug", "price": "25.00", "stock": 10},
        {"title": "mug", "price": "25.00", "stock": 11},
    )


async def _restock(api: Api) -> Request:
    return Request({"sku_id": await api.sku()}, {"quantity": 3}, {"quantity": 4})


def _template_body(api: Api, total: int) -> dict[str, Any]:
    valid_from, valid_until = window(api)
    return {
        "title": "5 off",
        "amount_off": "5.00",
        "min_amount": "20.00",
        "valid_from": valid_from,
        "valid_until": valid_until,
        "total": total,
    }


async def _template(api: Api) -> Request:
    return Request({}, _template_body(api, 10), _template_body(api, 11))


async def _issue(api: Api) -> Request:
    return Request(
        {"template_id": await api.coupon_template()},
        {"user_id": api.ids["buyer"]},
        {"user_id": api.ids["stranger"]},
    )


async def _flash_sale(api: Api) -> Request:
    sku_id = await api.sku()
    starts_at, ends_at = window(api, lasts=timedelta(hours=1))
    body = {"sku_id": sku_id, "price": "9.90", "stock": 5, "starts_at": starts_at}
    return Request({}, {**body, "ends_at": ends_at}, {**body, "ends_at": ends_at, "stock": 6})


async def _new_key(api: Api) -> Request:
    n = next(NAMES)
    return Request(
        {},
        {"name": f"host-{n}", "scopes": ["orders"]},
        {"name": f"host-{n}", "scopes": ["catalog"]},
    )


async def _a_key(api: Api) -> Request:
    made, _ = await keys.add_key(
        api.deps, name=f"host-{next(NAMES)}", scopes=["orders"], expires_at=None, by="cli"
    )
    return Request({"key_id": made["id"]}, other_path=_elsewhere({"key_id": made["id"]}))


def _hook_body(n: int) -> dict[str, Any]:
    return {"url": f"http://127.0.0.1:9/hook-{n}", "event_types": ["pay"]}


async def _new_endpoint(api: Api) -> Request:
    api.deps.webhook_allow_private = True
    n = next(NAMES)
    return Request({}, _hook_body(n), {**_hook_body(n), "event_types": ["ship"]})


async def _endpoint(api: Api, body: dict[str, Any], other: dict[str, Any]) -> Request:
    api.deps.webhook_allow_private = True
    made = await webhook_endpoints.create(api.deps, **_hook_body(next(NAMES)), actor="cli")
    path = {"endpoint_id": made["id"]}
    return Request(path, body, other, other_path=_elsewhere(path))


async def _rotation(api: Api) -> Request:
    return await _endpoint(api, {"keep_old_for_seconds": 0}, {"keep_old_for_seconds": 60})


async def _replay(api: Api) -> Request:
    await api.order()
    await events.sequence(api.deps)
    return await _endpoint(api, {"first": 1}, {"first": 1, "last": 2})


#: Every POST that changes something, by path: the table the OpenAPI document is checked
#: against (a new POST fails the first test until it is here).
CASES = {
    c.path: c
    for c in [
        Case("/api/goods", "seller", _goods, (accounts, "add_goods"), 201),
        Case(
            "/api/orders",
            "buyer",
            _place,
            (orders, "place_order_view"),
            201,
            races_into_the_use_case=True,
        ),
        Case("/api/orders/{order_id}/payments", "buyer", _pay, (payments, "start_payment"), 201),
        Case("/api/orders/{order_id}/cancel", "buyer", _unpaid, (parties, "cancel")),
        Case("/api/orders/{order_id}/ship", "seller", _ship, (orders, "ship")),
        Case(
            "/api/orders/{order_id}/confirm-receipt",
            "buyer",
            _shipped,
            (orders, "confirm_receipt"),
        ),
        Case("/api/orders/{order_id}/reviews", "buyer", _review, (orders, "review"), 201),
        Case("/api/admin/users", "admin", _user, (accounts, "add_user"), 201),
        Case(
            "/api/admin/timers/{timer_id}/run-now",
            "admin",
            _timer,
            (operations, "run_timer_now"),
        ),
        Case("/api/admin/refunds/{refund_id}/approve", "admin", _refund, (refunds, "approve")),
        Case("/api/admin/refunds/{refund_id}/retry", "admin", _failed_refund, (refunds, "retry")),
        Case("/api/admin/refunds/{refund_id}/reject", "admin", _reject, (refunds, "reject")),
        Case(
            "/api/admin/refunds/{refund_id}/settle-offline",
            "admin",
            _settle,
            (refunds, "settle_offline"),
        ),
        Case("/api/shows", "seller", _show, (tickets, "create_show"), 201),
        Case("/api/shows/{show_id}/cancel", "seller", _a_show, (tickets, "cancel_show")),
        Case("/api/tickets/{code}/check-in", "seller", _ticket, (checkin, "check_in")),
        Case("/api/skus", "seller", _sku, (shop, "create_sku"), 201),
        Case("/api/skus/{sku_id}/restock", "seller", _restock, (shop, "restock")),
        Case("/api/coupon-templates", "seller", _template, (shop, "create_template"), 201),
        Case(
            "/api/coupon-templates/{template_id}/issue",
            "seller",
            _issue,
            (shop, "issue_coupon"),
            201,
        ),
        Case("/api/flash-sales", "seller", _flash_sale, (shop, "create_flash_sale"), 201),
        Case("/api/admin/keys", "admin", _new_key, (keys, "add_key"), 201, withheld=("secret",)),
        Case(
            "/api/admin/keys/{key_id}/rotate",
            "admin",
            _a_key,
            (keys, "rotate"),
            201,
            withheld=("secret",),
        ),
        Case("/api/admin/keys/{key_id}/revoke", "admin", _a_key, (keys, "revoke")),
        Case(
            "/api/admin/webhooks",
            "admin",
            _new_endpoint,
            (webhook_endpoints, "create"),
            201,
            withheld=("secret",),
        ),
        Case(
            "/api/admin/webhooks/{endpoint_id}/rotate",
            "admin",
            _rotation,
            (webhook_endpoints, "rotate"),
            withheld=("secret",),
        ),
        Case(
            "/api/admin/webhooks/{endpoint_id}/replay",
            "admin",
            _replay,
            (webhook_endpoints, "replay"),
        ),
    ]
}
#: The providers' notifications: exactly once by their own inbox, not by a key.
NOT_KEYED = ("/notify/",)


@pytest.fixture
async def api(backend_world) -> AsyncIterator[Api]:
    async with shop_api(backend_world.deps) as api:
        yield api


def _url(case: Case, path: dict[str, int]) -> str:
    return case.path.format(**path)


async def _send(
    api: Api, case: Case, path: dict[str, int], body: dict[str, Any] | None, key: str = KEY
) -> Any:
    kwargs: dict[str, Any] = {"headers": {"Idempotency-Key": key}}
    if body is not None:
        kwargs["json"] = body
    return await api.call("POST", _url(case, path), case.who, **kwargs)


def _counted(monkeypatch: pytest.MonkeyPatch, case: Case) -> list[int]:
    """The case's use case, counted (the real one runs)."""
    module, name = case.use_case
    real = getattr(module, name)
    runs: list[int] = []

    async def counted(*args: Any, **kwargs: Any) -> Any:
        runs.append(1)
        return await real(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return runs


async def _row_counts(api: Api) -> dict[str, int]:
    async with api.deps.db.read() as conn:
        return {
            t.name: int(await conn.scalar(select(func.count()).select_from(t)))
            for t in schema.metadata.sorted_tables
        }


def _added(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {name: after[name] - before[name] for name in after if after[name] != before[name]}


async def test_every_post_but_the_notify_routes_takes_the_key(world):
    spec = create_app(world.deps).openapi()
    keyed = set()
    for path, operations_ in spec["paths"].items():
        post = operations_.get("post")
        if post is None or path.startswith(NOT_KEYED):
            continue
        headers = {
            p["name"]: p["required"] for p in post.get("parameters", []) if p["in"] == "header"
        }
        assert headers.get("Idempotency-Key") is False, path
        assert "409" in post["responses"], path
        keyed.add(path)
    assert keyed == set(CASES)


@pytest.mark.parametrize("path", list(CASES))
async def test_a_repeat_gets_the_first_answer_and_another_request_a_409(api, path, monkeypatch):
    case = CASES[path]
    request = await case.setup(api)
    runs = _counted(monkeypatch, case)
    first = await _send(api, case, request.path, request.body)
    assert first.status_code == case.status, first.text
    before = await table_snapshot(api.deps)
    # The answer was lost: the client sends the request again, twice.
    for _ in range(2):
        again = await _send(api, case, request.path, request.body)
        assert again.status_code == first.status_code
        if case.withheld:  # the secret was shown once, and is kept nowhere
            assert again.json() == case.replayed(first.content), again.text
            assert all(first.json()[name] for name in case.withheld)
            async with api.deps.db.read() as conn:
                kept = str((await conn.execute(select(schema.idempotency_keys))).all())
            assert not any(first.json()[name] in kept for name in case.withheld)
        else:
            assert again.content == first.content
        assert again.headers.get("Idempotent-Replayed") == "true"
    assert runs == [1]
    # The key with another body, on another resource, on another route: refused, nothing done.
    others = [(request.path, request.other_body or request.body, case)]
    if request.other_path is not None:
        others.append((request.other_path, request.body, case))
    other_route = CASES["/api/skus" if path == "/api/goods" else "/api/goods"]
    others.append(({}, (await other_route.setup(api)).body, other_route))
    assert others[0][1] != request.body or request.other_path is not None
    for other_path, body, route in others:
        if (other_path, body, route) == (request.path, request.body, case):
            continue
        refused = await api.call(
            "POST",
            _url(route, other_path),
            case.who,
            headers={"Idempotency-Key": KEY},
            **({} if body is None else {"json": body}),
        )
        fails(refused, 409, "idempotency_key_reused")
    assert await table_snapshot(api.deps) == before
    assert runs == [1]


@pytest.mark.parametrize("path", list(CASES))
async def test_requests_at_once_with_one_key_have_one_effect(api, path, monkeypatch):
    case = CASES[path]
    alone, raced = await case.setup(api), await case.setup(api)
    # What one request adds, row by row.
    counts = await _row_counts(api)
    single = await _send(api, case, alone.path, alone.body, key="alone")
    assert single.status_code == case.status, single.text
    one_adds = _added(counts, await _row_counts(api))
    runs = _counted(monkeypatch, case)
    counts = await _row_counts(api)
    answers = await asyncio.gather(*(_send(api, case, raced.path, raced.body) for _ in range(4)))
    done = [a for a in answers if a.status_code == case.status]
    assert done, [a.text for a in answers]
    assert {json.dumps(case.replayed(a.content)) for a in done} == {
        json.dumps(case.replayed(done[0].content))
    }
    for busy in answers:
        if busy.status_code != case.status:
            # Placing's repeats race into its transaction: on MariaDB the unique key's lock wait
            # can end one of them as a deadlock, answered 409 busy (try again), nothing done.
            codes = ["idempotency_key_in_use"] + (["busy"] if case.races_into_the_use_case else [])
            assert busy.status_code == 409 and busy.json()["error"]["code"] in codes, busy.text
    assert _added(counts, await _row_counts(api)) == one_adds
    if not case.races_into_the_use_case:
        assert runs == [1]
    # Whoever was told "in use" gets the first answer now.
    after = await table_snapshot(api.deps)
    again = await _send(api, case, raced.path, raced.body)
    assert again.status_code == case.status
    assert again.json() == case.replayed(done[0].content)
    assert await table_snapshot(api.deps) == after
