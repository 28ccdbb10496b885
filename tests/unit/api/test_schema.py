"""The OpenAPI schema holds: every /api operation, fed hypothesis-generated input by schemathesis
(valid and invalid), answers without a 5xx, with a documented status, the documented content type
and a body matching its documented model; and bad input to any POST route changes no row.

Schemathesis calls an ASGI app from its own event loop thread, while the ``world`` deps (database
engine, locks, trigger) belong to the test's loop. :class:`OnLoop` bridges the two: the app runs on
the test's loop, hypothesis runs in a worker thread, and the test's loop serves its calls while it
awaits that thread.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode, checks
from sqlalchemy import select
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dueflow.api.app import create_app
from dueflow.payments.base import RefundResult
from dueflow.service import events as event_service
from dueflow.service import webhook_endpoints
from dueflow.store import payments as payments_store
from dueflow.store import schema
from tests.unit.api import Api, running_api, table_snapshot

#: Generated calls per operation, caller and mode: the whole file runs in about twenty seconds
#: (200 found nothing more than 15 when the schema was written).
EXAMPLES = 15

#: No 5xx; a documented status, content type, body and headers.
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
    checks.response_headers_conformance,
]
#: Invalid input is also refused (4xx).
NEGATIVE_CHECKS = [*CHECKS, checks.negative_data_rejection]
#: What refuses invalid input: schemathesis's list, and 413 (a generated invalid body can pass
#: the 64 KiB limit, hundreds of seats, and is refused before it is read).
REFUSALS = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"]
REFUSALS += ["5xx"]  # reported by not_a_server_error, as schemathesis does
CONFIG = schemathesis.Config.from_dict(
    {"checks": {"negative_data_rejection": {"expected-statuses": REFUSALS}}}
)

#: Seconds the loader waits for /openapi.json (its default is 10).
LOAD_TIMEOUT = 120

Ids = dict[str, list[int]]


class OnLoop:
    """``app`` served on ``loop`` to callers on any other event loop (ASGI messages cross back and
    forth with run_coroutine_threadsafe). Lifespan is answered here: the deps are already up."""

    def __init__(self, app: ASGIApp, loop: asyncio.AbstractEventLoop) -> None:
        self.app = app
        self.loop = loop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        here = asyncio.get_running_loop()

        async def receive_here() -> Message:
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(receive(), here))

        async def send_here(message: Message) -> None:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(send(message), here))

        served = asyncio.run_coroutine_threadsafe(
            self.app(scope, receive_here, send_here), self.loop
        )
        await asyncio.wrap_future(served)


@dataclass
class Seeded:
    """The API's client and the ids of what it holds, by path parameter name."""

    api: Api
    ids: dict[str, list[int]]


#: Path parameters by the table their ids come from.
ID_OF = {
    "goods_id": schema.goods,
    "order_id": schema.orders,
    "timer_id": schema.timers,
    "refund_id": schema.refunds,
    "show_id": schema.shows,
    "sku_id": schema.skus,
    "template_id": schema.coupon_templates,
    "sale_id": schema.flash_sales,
    "key_id": schema.api_keys,
    "endpoint_id": schema.webhook_endpoints,
}


@pytest.fixture
async def seeded(world) -> AsyncIterator[Seeded]:
    """Tokens for a buyer, a seller, a stranger and an admin (the fake provider pays and refunds),
    and things to call on: goods, orders awaiting payment, paid, shipped, received, cancelled with
    a refund in review, and their timers; a show and a ticket order; SKUs, a coupon template and
    a coupon of the buyer's, a flash sale and a shop order with the coupon."""
    async with running_api(world.deps) as api:
        await api.goods()
        await api.order()
        await api.refund()
        await api.paid_order()
        await api.shipped()
        await api.received()
        show_id = await api.show()
        await api.ticket_order(show_id, ["A-1", "B-1"])
        await api.paid_ticket(show_id, "A-2")
        await api.shop_order({await api.sku(): 2}, coupon=await api.coupon())
        await api.flash_sale()
        await api.service_key("orders")
        await webhook_endpoints.create(api.deps, url="http://93.184.216.34/hook", actor="user:1")
        async with api.deps.db.read() as conn:
            ids = {
                name: list((await conn.execute(select(table.c.id))).scalars())
                for name, table in ID_OF.items()
            }
            ids["code"] = list((await conn.execute(select(schema.tickets.c.code))).scalars())
        yield Seeded(api, ids)


@pytest.fixture
def api(seeded: Seeded) -> Api:
    return seeded.api


def takes_input(operation: schemathesis.APIOperation) -> bool:
    """Anything to get wrong besides the credential (which the test sets) and the guard's
    act-as headers (any text is valid there by the schema; test_service_keys.py covers them)?"""
    guard = {"authorization", "dueflow-act-as", "dueflow-act-as-name"}
    named = [p for p in operation.iter_parameters() if p.name.lower() not in guard]
    return bool(named or operation.body)


def strategy(
    operation: schemathesis.APIOperation, mode: GenerationMode, headers: dict[str, str], ids: Ids
) -> st.SearchStrategy[schemathesis.Case]:
    """Cases for ``operation``: half with every input generated (ids then mostly lead nowhere),
    half aimed at an id that exists (valid input then mostly succeeds, showing the answer)."""
    generated = operation.as_strategy(generation_mode=mode, headers=headers)
    names = [p.name for p in operation.path_parameters]
    if not names or (mode is GenerationMode.NEGATIVE and not operation.body):
        return generated
    [name] = names
    aimed = [
        operation.as_strategy(generation_mode=mode, headers=headers, path_parameters={name: id_})
        for id_ in ids[name]
    ]
    return st.one_of(generated, *aimed)


async def fuzz(
    seeded: Seeded, who: str, mode: GenerationMode, only: Callable[[str], bool]
) -> list[str]:
    """Schemathesis over the /api operations whose path ``only`` keeps, as ``who``: a report
    per operation that failed a check (every operation runs, so one run shows every failure)."""
    app = OnLoop(create_app(seeded.api.deps), asyncio.get_running_loop())
    headers = seeded.api.auth(who)

    def run() -> list[str]:
        # The document is built on the app's loop while the other test process loads the
        # machine: the loader's own 10 s read timeout ran out once at load 13.
        loaded = schemathesis.openapi.from_asgi(
            "/openapi.json", app, config=CONFIG, timeout=LOAD_TIMEOUT
        )
        failures = []
        for result in loaded.get_all_operations():
            operation = result.ok()
            if not operation.path.startswith("/api/") or not only(operation.path):
                continue
            if mode is GenerationMode.NEGATIVE and not takes_input(operation):
                continue

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            @given(case=strategy(operation, mode, headers, seeded.ids))
            def calls(case: schemathesis.Case) -> None:
                case.call_and_validate(
                    checks=NEGATIVE_CHECKS if mode is GenerationMode.NEGATIVE else CHECKS
                )

            try:
                calls()
            except (Exception, BaseExceptionGroup) as exc:  # schemathesis's FailureGroup
                failures.append(f"{operation.label} as {who} ({mode.value}): {exc}")
        return failures

    return await asyncio.to_thread(run)


def everything(path: str) -> bool:
    return True


def users_routes(path: str) -> bool:
    return not path.startswith("/api/admin/")


MODES = [GenerationMode.POSITIVE, GenerationMode.NEGATIVE]


@pytest.mark.parametrize("mode", MODES, ids=str)
async def test_every_operation_keeps_to_the_schema_for_an_admin(seeded, mode):
    failures = await fuzz(seeded, "admin", mode, everything)
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("who", ["buyer", "seller"])
@pytest.mark.parametrize("mode", MODES, ids=str)
async def test_the_user_routes_keep_to_the_schema_for_a_user(seeded, who, mode):
    failures = await fuzz(seeded, who, mode, users_routes)
    assert not failures, "\n\n".join(failures)


async def test_the_schema_documents_every_answer(api):
    """A body model for each success, ErrorBody for every error, FastAPI's own 422 model gone."""
    spec = create_app(api.deps).openapi()
    operations = [
        (path, op)
        for path, item in spec["paths"].items()
        if path.startswith("/api/")
        for op in item.values()
    ]
    assert operations
    for path, op in operations:
        success = [code for code in op["responses"] if code.startswith("2")]
        assert len(success) == 1, path
        [body] = op["responses"][success[0]]["content"].values()
        assert body["schema"], path
        for code, answer in op["responses"].items():
            if not code.startswith("2"):
                ref = answer["content"]["application/json"]["schema"]["$ref"]
                assert ref == "#/components/schemas/ErrorBody", (path, code)
        assert {"401", "413", "503"} <= set(op["responses"]), path
    assert "HTTPValidationError" not in spec["components"]["schemas"]


async def test_the_schema_declares_the_idempotency_key_header(api):
    spec = create_app(api.deps).openapi()
    headers = [
        p for p in spec["paths"]["/api/orders"]["post"].get("parameters", []) if p["in"] == "header"
    ]
    assert [(p["name"], p["required"]) for p in headers] == [
        ("Idempotency-Key", False),
        ("Dueflow-Act-As", False),
        ("Dueflow-Act-As-Name", False),
    ]
    assert "printable ASCII" in headers[0]["description"]


# --- bad input changes nothing ---------------------------------------------------------------

WRONG_TYPE: dict[type, Any] = {str: 7, int: "7", bool: "yes", list: {"sku_id": 1}}
HUGE = "x" * 70_000  # over the 64 KiB limit


async def streamed(body: bytes) -> AsyncIterator[bytes]:
    """``body`` in chunks, so without a Content-Length."""
    for start in range(0, len(body), 4096):
        yield body[start : start + 4096]


def bad_bodies(valid: dict[str, Any]) -> list[tuple[str, dict[str, Any], int]]:
    """Variants of a valid body, each refused: (what, httpx arguments, expected status)."""
    as_json = {"Content-Type": "application/json"}
    variants = [
        ("malformed JSON", {"content": json.dumps(valid)[:-1], "headers": as_json}, 400),
        ("not an object", {"json": [valid]}, 422),
        ("nothing", {"json": {}}, 422),
        ("an unknown field", {"json": {**valid, "colour": "red"}}, 422),
        ("a huge body", {"json": {**valid, "pad": HUGE}}, 413),
        ("a huge body without a length", {"content": streamed(HUGE.encode())}, 413),
    ]
    for name, value in valid.items():
        wrong = {**valid, name: WRONG_TYPE[type(value)]}
        variants.append((f"a wrong type for {name}", {"json": wrong}, 422))
    return variants


async def test_bad_bodies_to_any_post_route_change_no_row(api):
    goods_id = await api.goods()
    unpaid, paid, arrived = await api.order(), await api.paid_order(), await api.shipped()
    done, refund_id = await api.received(), await api.refund()
    timer_id = await api.overdue_timer()
    rejected, settled = await api.refund(), await api.refund()
    sku_id, template_id = await api.sku(), await api.coupon_template()
    coupon_id, sale_id = await api.coupon(), await api.flash_sale()
    now = api.deps.clock.now()
    window = {"valid_from": now.isoformat(), "valid_until": (now + timedelta(days=1)).isoformat()}
    template = {"title": "1 off", "amount_off": "1.00", "min_amount": "0", **window, "total": 3}
    sale = {
        "sku_id": sku_id,
        "price": "1.00",
        "stock": 1,
        "starts_at": now.isoformat(),
        "ends_at": (now + timedelta(hours=1)).isoformat(),
        "per_buyer_limit": 1,
    }
    lines = [{"sku_id": sku_id, "quantity": 1}]
    with_body = [
        ("/api/skus", "seller", {"title": "mug", "price": "2.50", "stock": 4}),
        (f"/api/skus/{sku_id}/restock", "seller", {"quantity": 2}),
        ("/api/coupon-templates", "seller", template),
        (f"/api/coupon-templates/{template_id}/issue", "seller", {"user_id": api.ids["buyer"]}),
        ("/api/flash-sales", "seller", sale),
        ("/api/orders", "buyer", {"lines": lines, "coupon_id": coupon_id}),
        ("/api/orders", "stranger", {"flash_sale_id": sale_id, "quantity": 1}),
        (f"/api/admin/refunds/{rejected}/reject", "admin", {"reason": "fraud"}),
        (f"/api/admin/refunds/{settled}/settle-offline", "admin", {"reference": "T-1"}),
        ("/api/goods", "seller", {"title": "lamp", "price": "3.10"}),
        ("/api/orders", "buyer", {"goods_id": goods_id}),
        (f"/api/orders/{unpaid}/payments", "buyer", {"provider": "fakepay"}),
        (f"/api/orders/{paid}/ship", "seller", {"carrier": "SF", "tracking_no": "SF1"}),
        (f"/api/orders/{done}/reviews", "buyer", {"rating": 4, "comment": "fine"}),
        ("/api/admin/users", "admin", {"name": "dave", "admin": False}),
    ]
    without_body = [
        (f"/api/orders/{arrived}/confirm-receipt", "buyer"),
        (f"/api/admin/timers/{timer_id}/run-now", "admin"),
        (f"/api/admin/refunds/{refund_id}/approve", "admin"),
        (f"/api/orders/{unpaid}/cancel", "buyer"),
    ]
    before = await table_snapshot(api.deps)
    for path, who, valid in with_body:
        for what, kwargs, expected in bad_bodies(valid):
            answer = await api.call("POST", path, who, **kwargs)
            assert answer.status_code == expected, (path, what, answer.text)
            assert set(answer.json()) == {"error"}, (path, what, answer.text)
    for path, who in without_body:
        answer = await api.call("POST", path, who, json={"pad": HUGE})
        assert answer.status_code == 413, (path, answer.text)
    assert await table_snapshot(api.deps) == before
    # Each call was aimed where a good one does change rows.
    for path, who, valid in with_body:
        answer = await api.call("POST", path, who, json=valid)
        assert answer.status_code in (200, 201), (path, answer.text)
    for path, who in without_body:
        answer = await api.call("POST", path, who)
        assert answer.status_code == 200, (path, answer.text)


# --- every answer of a whole life, checked against the schema ---------------------------------


async def test_every_answer_of_a_whole_life_matches_the_schema(api, world):
    """Every operation's success and its errors, called deterministically (fuzzing rarely finds
    a valid price or provider), each answer validated against what the schema documents."""
    answers: list[httpx.Response] = []

    async def keep(response: httpx.Response) -> None:
        await response.aread()
        answers.append(response)

    api.client.event_hooks["response"].append(keep)
    call = api.call

    goods_id = (
        await call("POST", "/api/goods", "seller", json={"title": "t", "price": "9"})
    ).json()["id"]
    await call("GET", f"/api/goods/{goods_id}", "buyer")
    order_id = (await call("POST", "/api/orders", "buyer", json={"goods_id": goods_id})).json()[
        "id"
    ]
    await call("GET", f"/api/orders/{order_id}", "seller")
    await call("POST", f"/api/orders/{order_id}/payments", "buyer", json={"provider": "fakepay"})
    done = await api.received()
    for who in ("buyer", "seller"):
        await call("POST", f"/api/orders/{done}/reviews", who, json={"rating": 5, "comment": "ok"})
    refund_id = await api.refund()
    await call("GET", "/api/admin/refunds", "admin")
    api.provider.refund_answers = [RefundResult.FAILED]
    await call("POST", f"/api/admin/refunds/{refund_id}/approve", "admin")
    await call("POST", f"/api/admin/refunds/{refund_id}/retry", "admin")
    for action, note in (("reject", {"reason": "fraud"}), ("settle-offline", {"reference": "T"})):
        await call("POST", f"/api/admin/refunds/{await api.refund()}/{action}", "admin", json=note)
    await call("POST", "/api/admin/users", "admin", json={"name": "erin", "admin": True})
    await call("GET", "/api/admin/timers?state=scheduled", "admin")
    await call("POST", f"/api/admin/timers/{await api.overdue_timer()}/run-now", "admin")
    await record_discrepancy(api, done)
    world.clock.advance(timedelta(days=2))
    assert await world.worker.run_once() > 0  # timers fire: lateness over the last hour
    await call("GET", "/api/admin/summary", "admin")
    world.clock.advance(timedelta(days=30))  # deadlines pass unattended: overdue, invariants
    await call("GET", "/api/admin/overdue", "admin")
    for state in ("stuck", "scheduled", "claimed", "done", "cancelled"):
        await call("GET", f"/api/admin/timers?state={state}", "admin")
    await call("GET", "/api/admin/discrepancies", "admin")
    await call("GET", "/api/admin/refunds?state=succeeded", "admin")
    made = await call("POST", "/api/admin/keys", "admin", json={"name": "k", "scopes": ["orders"]})
    key_id = made.json()["id"]
    await call("GET", "/api/admin/keys", "admin")
    await call("GET", f"/api/admin/keys/{key_id}", "admin")
    await call("POST", f"/api/admin/keys/{key_id}/rotate", "admin")
    await call("POST", f"/api/admin/keys/{key_id}/revoke", "admin")
    await call("GET", "/api/admin/summary", "admin")
    # the lists, over orders and goods in every status by now
    await call("GET", "/api/goods?limit=1", "buyer")
    await call("GET", f"/api/goods?seller_id={api.ids['seller']}", "seller")
    page = (await call("GET", "/api/orders?limit=1", "buyer")).json()
    await call("GET", "/api/orders", "buyer", params={"after": page["next"]})
    await call("GET", "/api/orders?role=seller", "seller")
    await call("GET", "/api/orders?flow=tickets", "buyer")
    await call("GET", "/api/me", "buyer")
    # the shows: a show, its seats, an order for two of them, the organizer's cancel
    world.clock.advance(timedelta(days=-40))
    show_id = await api.show()
    await call("GET", f"/api/shows/{show_id}", "buyer")
    await api.ticket_order(show_id, ["A-1", "B-2"])
    await call("GET", f"/api/shows/{show_id}/seats", "buyer")
    await call("POST", "/api/orders", "buyer", json={"show_id": show_id, "seats": ["A-1"]})
    code = await api.paid_ticket(show_id, "A-3")
    for _ in range(2):  # let in, then checked in already
        await call("POST", f"/api/tickets/{code}/check-in", "seller", json={"gate": "North"})
    await call("GET", f"/api/shows/{show_id}/tickets.csv", "seller")
    await call("GET", f"/api/shows/{show_id}/tickets.csv", "stranger")
    await call("POST", f"/api/shows/{show_id}/cancel", "seller")
    await call("POST", f"/api/tickets/{code}/check-in", "seller", json={})  # void
    # the shop: a SKU restocked, a coupon issued and used, a flash sale, and their refusals

    async def refused(status: int, method: str, path: str, who: str, **kwargs: Any) -> None:
        answer = await call(method, path, who, **kwargs)
        assert answer.status_code == status, (path, answer.text)

    body = {"title": "mug", "price": "25", "stock": 3}
    sku_id = (await call("POST", "/api/skus", "seller", json=body)).json()["id"]
    await call("POST", f"/api/skus/{sku_id}/restock", "seller", json={"quantity": 2})
    await refused(403, "POST", f"/api/skus/{sku_id}/restock", "buyer", json={"quantity": 2})
    await call("GET", f"/api/skus/{sku_id}", "buyer")
    template_id = await api.coupon_template(off="5.00", minimum="20.00", total=2)
    await call("GET", f"/api/coupon-templates/{template_id}", "buyer")
    issue = f"/api/coupon-templates/{template_id}/issue"
    to_buyer = {"user_id": api.ids["buyer"]}
    coupon_id = (await call("POST", issue, "seller", json=to_buyer)).json()["id"]
    await call("POST", issue, "admin", json={"user_id": api.ids["stranger"]})
    await refused(409, "POST", issue, "seller", json=to_buyer)  # all issued
    lines = {"lines": [{"sku_id": sku_id, "quantity": 2}], "coupon_id": coupon_id}
    keyed = {"Idempotency-Key": "life-1"}
    first = (await call("POST", "/api/orders", "buyer", json=lines, headers=keyed)).json()
    again = (await call("POST", "/api/orders", "buyer", json=lines, headers=keyed)).json()
    assert again == first and first["amount"] == "45.00"
    await refused(409, "POST", "/api/orders", "buyer", json=lines)  # the coupon is locked
    many = {"lines": [{"sku_id": sku_id, "quantity": 9}]}
    await refused(409, "POST", "/api/orders", "buyer", json=many, headers=keyed)  # key reused
    await refused(409, "POST", "/api/orders", "stranger", json=many)  # out of stock
    await call("GET", "/api/me/coupons", "buyer")
    now = api.deps.clock.now()
    sale = {
        "sku_id": sku_id,
        "price": "9.90",
        "stock": 2,
        "starts_at": now.isoformat(),
        "ends_at": (now + timedelta(hours=1)).isoformat(),
        "per_buyer_limit": 1,
    }
    sale_id = (await call("POST", "/api/flash-sales", "seller", json=sale)).json()["id"]
    await refused(403, "POST", "/api/flash-sales", "buyer", json=sale)
    await call("GET", f"/api/flash-sales/{sale_id}", "buyer")
    # the catalogue's lists, and the admins' list of users
    await call("GET", f"/api/skus?seller_id={api.ids['seller']}", "buyer")
    await call("GET", "/api/shows?status=cancelled", "buyer")
    await call("GET", f"/api/flash-sales?sku_id={sku_id}", "buyer")
    await call("GET", "/api/coupon-templates?limit=1", "buyer")
    await call("GET", "/api/admin/users?limit=2", "admin")
    flash = {"flash_sale_id": sale_id, "quantity": 1}
    await call("POST", "/api/orders", "stranger", json=flash)
    await refused(409, "POST", "/api/orders", "stranger", json=flash)  # the buyer's limit
    await call("POST", f"/api/orders/{first['id']}/cancel", "buyer")
    await world.worker.drain()  # the buyer is told
    closed = (await call("GET", f"/api/orders/{first['id']}", "buyer")).json()
    assert [n["kind"] for n in closed["notices"]] == ["order_closed"]
    # the events feed
    await event_service.sequence(api.deps)
    page = (await call("GET", "/api/events?limit=2", "buyer")).json()
    await call("GET", "/api/events", "admin", params={"after": page["next"]})
    await call("GET", "/api/events?after=not-a-cursor", "admin")
    # the webhook endpoints: one made (its secret in that answer), listed, shown, disabled, its
    # secret rotated, an event replayed to it, deleted
    hook = {"url": "http://93.184.216.34/hooks", "event_types": ["place"]}
    made = await call("POST", "/api/admin/webhooks", "admin", json=hook)
    endpoint = f"/api/admin/webhooks/{made.json()['id']}"
    await call("GET", "/api/admin/webhooks", "admin")
    await call("GET", endpoint, "admin")
    await call("PATCH", endpoint, "admin", json={"enabled": False})
    await call("POST", f"{endpoint}/rotate", "admin", json={})
    await call("POST", f"{endpoint}/replay", "admin", json={"first": 1})
    await call("DELETE", endpoint, "admin")
    # and the errors
    await call("GET", f"/api/orders/{order_id}", None)
    await call("GET", "/api/admin/summary", "buyer")
    await call("GET", "/api/orders/999999", "buyer")
    await call("POST", f"/api/admin/refunds/{refund_id}/retry", "admin")
    await call("POST", "/api/goods", "seller", json={"title": "t", "price": "1", "pad": HUGE})
    await call("POST", "/api/goods", "seller", json={"title": "t"})
    await call(
        "POST", "/api/goods", "seller", content="{", headers={"Content-Type": "application/json"}
    )

    loaded = schemathesis.openapi.from_dict(create_app(api.deps).openapi())
    operations = {
        (op.method.upper(), re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", op.path) + "$")): op
        for op in (result.ok() for result in loaded.get_all_operations())
        if op.path.startswith("/api/")
    }
    seen: set[tuple[str, int]] = set()
    for answer in answers:
        method, path = answer.request.method, answer.request.url.path
        [operation] = [op for (m, p), op in operations.items() if m == method and p.match(path)]
        documented = {int(code) for code in operation.responses.status_codes}
        assert answer.status_code in documented, (method, path, answer.status_code, answer.text)
        csv = path.endswith(".csv") and answer.status_code == 200  # the one non-JSON answer
        expected = "text/csv; charset=utf-8" if csv else "application/json"
        assert answer.headers["content-type"] == expected, (method, path)
        operation.validate_response(answer)
        seen.add((operation.label, answer.status_code))
    succeeded = {label for label, status in seen if status < 300}
    assert succeeded == {op.label for op in operations.values()}
    assert {status for _, status in seen} >= {200, 201, 400, 401, 403, 404, 409, 413, 422}


async def record_discrepancy(api: Api, order_id: int) -> None:
    """A discrepancy as the payment service records one (there is no route that makes one)."""
    async with api.deps.db.write() as conn:
        payment_id = (
            await conn.execute(
                select(schema.payments.c.id).where(schema.payments.c.order_id == order_id)
            )
        ).scalar_one()
        await payments_store.record_discrepancy(
            conn,
            kind="amount",
            order_id=order_id,
            payment_id=payment_id,
            detail="paid 1.00 of 12.50",
            now=api.deps.clock.now(),
        )
