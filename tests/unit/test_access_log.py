"""The access log and the request id (issue 25, item 2): a line a request with its route, status,
duration and caller; the request id taken from ``X-Request-Id`` or made, echoed in every answer
and on every line logged while the request is served; a timer handler's lines name the timer."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import select

from dueflow import logs
from dueflow.api.app import create_app
from dueflow.domain.timers import TimerKind
from dueflow.service import accounts, keys
from dueflow.service import orders as order_service
from dueflow.service.deps import Deps
from dueflow.service.timeouts import HANDLERS
from dueflow.store.schema import orders
from dueflow.store.timers import Claimed
from dueflow.worker.runner import Worker

MADE = re.compile(r"[0-9a-f]{16}")


@pytest.fixture
def logged(caplog) -> pytest.LogCaptureFixture:
    """caplog at INFO, its records with the fields bound where they were logged."""
    caplog.handler.addFilter(logs.ContextFilter())
    caplog.set_level(logging.INFO)
    return caplog


@pytest.fixture
async def client(world) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(world.deps))
    async with httpx.AsyncClient(transport=transport, base_url="http://dueflow") as client:
        yield client


def access_lines(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    return [r for r in records if r.name == logs.ACCESS]


async def test_the_request_id_sent_is_echoed_a_bad_one_or_none_replaced(client):
    sent = "req-7f3a/edge:1"
    assert (await client.get("/healthz", headers={"X-Request-Id": sent})).headers[
        "X-Request-Id"
    ] == sent
    for bad in ("two words", "x" * 129, "tab\there", ""):
        echoed = (await client.get("/healthz", headers={"X-Request-Id": bad})).headers
        assert MADE.fullmatch(echoed["X-Request-Id"]), bad
    made = [(await client.get("/healthz")).headers["X-Request-Id"] for _ in range(2)]
    assert all(MADE.fullmatch(m) for m in made) and made[0] != made[1]


async def test_errors_and_admin_pages_carry_the_request_id_too(client):
    for path in ("/api/orders/1", "/api/orders/x", "/no/such/route", "/admin", "/admin/login"):
        answer = await client.get(path, headers={"X-Request-Id": f"id-{path}"})
        assert answer.status_code in (200, 303, 401, 404, 422), path
        assert answer.headers["X-Request-Id"] == f"id-{path}", path


async def test_an_access_line_names_method_route_status_caller_and_request(world, client, logged):
    _, token = await accounts.add_user(world.deps, "carol")
    carol = await accounts.authenticate(world.deps, token)
    assert carol is not None
    answer = await client.get(
        "/api/orders/123456",
        headers={"Authorization": f"Bearer {token}", "X-Request-Id": "abc-1"},
    )
    assert answer.status_code == 404
    [line] = access_lines(logged.records)
    assert line.levelno == logging.INFO
    fields = {key: getattr(line, key) for key in (*logs.ACCESS_KEYS, "request_id")}
    duration = fields.pop("duration_ms")
    assert isinstance(duration, float) and duration >= 0
    assert fields == {
        "method": "GET",
        "route": "/api/orders/{order_id}",
        "status": 404,
        "user_id": carol.id,
        "key_id": None,
        "request_id": "abc-1",
    }
    assert re.fullmatch(
        rf"GET /api/orders/\{{order_id\}} 404 \d+\.\d ms user:{carol.id}", line.getMessage()
    )


async def test_a_key_acting_for_a_user_is_named_with_the_user(world, client, logged):
    view, secret = await keys.add_key(
        world.deps, name="host", scopes=["orders"], expires_at=None, by="cli"
    )
    answer = await client.get(
        "/api/orders", headers={"Authorization": f"Bearer {secret}", "Dueflow-Act-As": "h-1"}
    )
    assert answer.status_code == 200, answer.text
    [line] = access_lines(logged.records)
    assert line.key_id == view["id"] and isinstance(line.user_id, int)  # type: ignore[attr-defined]
    assert line.getMessage().endswith(f"user:{line.user_id}@key:{view['id']}")  # type: ignore[attr-defined]
    assert (line.route, line.status) == ("/api/orders", 200)  # type: ignore[attr-defined]


async def test_a_line_logged_inside_a_route_carries_the_request_id(world, client, logged):
    _, token = await accounts.add_user(world.deps, "root", admin=True)
    answer = await client.post(
        "/api/admin/keys",
        json={"name": "shop", "scopes": ["orders"]},
        headers={"Authorization": f"Bearer {token}", "X-Request-Id": "make-key-1"},
    )
    assert answer.status_code == 201, answer.text
    [made] = [r for r in logged.records if r.name == "dueflow.service.keys"]
    assert made.getMessage().startswith("service key")
    assert made.request_id == "make-key-1"  # type: ignore[attr-defined]
    assert [r.request_id for r in access_lines(logged.records)] == ["make-key-1"]  # type: ignore[attr-defined]


async def test_an_unexpected_error_is_answered_500_and_logged_once_with_the_request_id(
    world, logged
):
    app = create_app(world.deps)

    @app.get("/crash")
    async def crash() -> None:
        raise RuntimeError("a bug")

    # The error is raised on after its 500, as ASGI has it: the transport answers the 500.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://dueflow") as client:
        answer = await client.get("/crash", headers={"X-Request-Id": "boom-1"})
    assert answer.status_code == 500
    assert answer.json()["error"]["code"] == "internal_error"
    assert answer.headers["X-Request-Id"] == "boom-1"
    [error] = [r for r in logged.records if r.levelno == logging.ERROR]
    assert error.exc_info is not None and error.request_id == "boom-1"  # type: ignore[attr-defined]
    [line] = access_lines(logged.records)
    assert (line.route, line.status) == ("/crash", 500)  # type: ignore[attr-defined]
    # the server's own line of that error (uvicorn's) is dropped; another error's is not
    again = logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, "x", (), error.exc_info)
    other = logging.LogRecord(
        "uvicorn.error", logging.ERROR, __file__, 1, "x", (), (ValueError, ValueError(), None)
    )
    assert [logs.NotTwice().filter(r) for r in (again, other)] == [False, True]


async def test_a_timer_handler_s_lines_carry_its_timer_and_order(world, logged):
    log = logging.getLogger("dueflow.test_access_log")

    async def cancel_saying_so(deps: Deps, batch: Sequence[Claimed]) -> None:
        log.info("cancelling %d", len(batch))
        log.info("one named", extra={"order_id": -1})  # a line's own id wins
        await HANDLERS[TimerKind.CANCEL_UNPAID](deps, batch)

    worker = Worker(world.deps, handlers={**HANDLERS, TimerKind.CANCEL_UNPAID: cancel_saying_so})
    order_id = await order_service.place_order(
        world.deps, buyer_id=world.buyer, goods_id=await world.goods()
    )
    world.clock.advance(timedelta(minutes=30))
    await worker.drain()
    said, named = [r for r in logged.records if r.name == log.name]
    assert said.getMessage() == "cancelling 1"
    assert (said.timer_kind, said.order_id, said.trace_id) == ("cancel_unpaid", order_id, None)  # type: ignore[attr-defined]
    assert isinstance(said.timer_id, int)  # type: ignore[attr-defined]
    assert (named.order_id, named.timer_id) == (-1, said.timer_id)  # type: ignore[attr-defined]
    async with world.deps.db.read() as conn:
        status = await conn.scalar(select(orders.c.status).where(orders.c.id == order_id))
    assert status == "cancelled_unpaid"  # the handler did its work under the binding
